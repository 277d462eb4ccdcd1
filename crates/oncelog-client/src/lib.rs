//! An async Kafka-protocol client: the one the `oncelog` CLI uses. It speaks
//! the wire protocol, so it works against any Kafka-compatible cluster.
//!
//! - [`conn`]: one connection ([`Client`]), requests one at a time, each
//!   sent at the highest version both sides support (as ApiVersions tells).
//! - [`frame`]: request and response framing, the one copy of it, also for
//!   callers that do their own I/O.
//! - [`cluster`]: connections to a cluster's nodes ([`Cluster`]), routing to
//!   partition leaders and coordinators, Kafka's default partitioner.
//! - [`producer`]: an idempotent, optionally transactional [`Producer`].
//! - [`consumer`]: offsets, fetches, record batch decoding (read_committed),
//!   a standalone group's committed offsets.
//! - [`admin`]: metadata, configs, producers and transactions lookups.
//! - [`error`]: [`ClientError`], and Kafka error codes as
//!   [`ResponseError`] variants.

pub mod admin;
pub mod cluster;
pub mod conn;
pub mod consumer;
pub mod error;
pub mod frame;
pub mod producer;
pub mod sasl;
pub mod tls;

pub use cluster::{key_partition, murmur2, Cluster, CoordinatorType, Leaders};
pub use conn::{parse_bootstrap, with_default_port, Client, DEFAULT_PORT};
pub use error::{check, check_msg, retriable, ClientError};
pub use kafka_protocol::ResponseError;
pub use producer::{Acked, Acks, Producer, ProducerConfig};
