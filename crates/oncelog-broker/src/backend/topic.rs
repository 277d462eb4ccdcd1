//! What a topic is in either backend: its catalogue entry, its cleanup
//! policy, and the checks every backend makes before it creates one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::TopicError;
use crate::machines::names::is_internal_topic;

/// What every backend checks before it creates a topic: a valid name that
/// is not one of the broker's own, 1 to `max_partitions` partitions, and
/// topic configs it knows with values it accepts.
pub fn check_new_topic(
    name: &str,
    partitions: i32,
    configs: &BTreeMap<String, String>,
    max_partitions: i32,
) -> Result<(), TopicError> {
    validate_topic_name(name)?;
    // The broker's own names: `__consumer_offsets` stands for a group's
    // offsets inside a transaction, so no client topic may take it.
    if is_internal_topic(name) {
        return Err(TopicError::Internal {
            topic: name.into(),
            action: "create",
        });
    }
    if partitions <= 0 || partitions > max_partitions {
        return Err(TopicError::InvalidPartitions(format!(
            "number of partitions must be between 1 and max.partitions.per.topic ({max_partitions}), got {partitions}"
        )));
    }
    for (k, v) in configs {
        crate::config::validate_topic_config(k, v).map_err(|e| TopicError::InvalidConfig(e.0))?;
    }
    Ok(())
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopicMeta {
    pub name: String,
    pub id: Uuid,
    pub partitions: i32,
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
}

/// What `cleanup.policy` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CleanupPolicy {
    pub delete: bool,
    pub compact: bool,
}

impl CleanupPolicy {
    pub fn parse(text: &str) -> Self {
        let mut p = Self::default();
        for part in text.split(',') {
            match part.trim() {
                "delete" => p.delete = true,
                "compact" => p.compact = true,
                _ => {}
            }
        }
        p
    }
}

pub fn validate_topic_name(name: &str) -> Result<(), TopicError> {
    let bad = |why| Err(TopicError::InvalidName(name.to_string(), why));
    if name.is_empty() {
        return bad("empty");
    }
    if name == "." || name == ".." {
        return bad("'.' and '..' are not allowed");
    }
    if name.len() > 249 {
        return bad("longer than 249 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return bad("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}
