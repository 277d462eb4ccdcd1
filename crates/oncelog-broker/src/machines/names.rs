//! The broker's own topic names, alike in both modes.

/// Topic names that belong to the broker (Kafka's internal topics). Clients
/// cannot create, delete, alter or write to them.
pub const INTERNAL_TOPICS: &[&str] = &[
    "__consumer_offsets",
    "__transaction_state",
    "__cluster_metadata",
    "__share_group_state",
];

/// The pseudo-partition that stands for a group's offsets in a transaction.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

pub fn is_internal_topic(name: &str) -> bool {
    INTERNAL_TOPICS.contains(&name)
}
