//! Exactly-once auditor for Kafka-compatible brokers, in the style of Jepsen.
//!
//! Workloads run real Kafka clients against a broker under faults and record
//! a [`History`]: every transaction (sends with their acked offsets, polls
//! with what they read), a final `read_committed` read of every partition
//! after healing, and liveness probes. [`check`] then looks for anomalies
//! (lost writes, duplicates, reads of aborted data, torn transactions, ...)
//! and returns a [`Report`].
//!
//! Values are unique strings: every write attempt writes a fresh value, so a
//! read identifies exactly one attempt. Attempts of the same logical record
//! (e.g. a copier retrying an input record after an abort) share a `key`.

mod checker;
mod history;
#[cfg(feature = "librdkafka")]
pub mod load;
mod load_common;
#[cfg(feature = "librdkafka")]
pub mod recommit;
#[cfg(feature = "librdkafka")]
pub mod runner;
pub mod wire_load;
#[cfg(feature = "librdkafka")]
pub mod worker;

pub use checker::{check, Anomaly, AnomalyKind, Report};
pub use history::{
    FinalRead, History, LivenessCheck, Op, Outcome, PartitionRead, Pause, ProducerInit, Read,
    Recommit, Txn,
};
