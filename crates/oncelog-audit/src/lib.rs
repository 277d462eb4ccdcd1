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

/// The environment variable in which the `oncelog` command passes its
/// resolved client security settings (security.protocol, sasl.*, ssl.*
/// locations, as librdkafka names them; a JSON object) to every client of
/// the audit, the worker processes' included.
pub const CLIENT_SECURITY_ENV: &str = "ONCELOG_CLIENT_SECURITY";

/// A librdkafka configuration with this process's security settings.
#[cfg(feature = "librdkafka")]
pub(crate) fn rdkafka_config() -> rdkafka::ClientConfig {
    let mut c = rdkafka::ClientConfig::new();
    if let Ok(json) = std::env::var(CLIENT_SECURITY_ENV) {
        let props: std::collections::BTreeMap<String, String> =
            serde_json::from_str(&json).unwrap_or_default();
        for (k, v) in props {
            c.set(k, v);
        }
    }
    c
}
pub use history::{
    FinalRead, History, LivenessCheck, Op, Outcome, PartitionRead, Pause, ProducerInit, Read,
    Recommit, Txn,
};
