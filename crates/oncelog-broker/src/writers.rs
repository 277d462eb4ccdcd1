//! Second-writer detection (seed 000, scenario S6): exactly-once holds per
//! writer, and two jobs with different transactional-id prefixes writing one
//! topic double its output without any error. The broker remembers, per
//! topic, which prefixes committed transactions recently and reports a topic
//! with more than one; a topic config `writer.transactional.id.prefix` makes
//! it refuse transactional writes from any other prefix.
//!
//! The prefix of a transactional id is the id without its trailing numeric
//! `-N` segments (`orders-sink-3-17` → `orders-sink`, `fare-writer-7` →
//! `fare-writer`), which is how Flink, Kafka Streams and most hand-written
//! jobs number their producers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// How long a prefix counts as a live writer of a topic after its last commit.
pub const WINDOW_MS: i64 = 60_000;

/// The topic config naming the only transactional-id prefix allowed to write.
pub const WRITER_PREFIX_CONFIG: &str = "writer.transactional.id.prefix";

pub fn prefix_of(transactional_id: &str) -> &str {
    let mut p = transactional_id;
    while let Some((head, tail)) = p.rsplit_once('-') {
        if !tail.is_empty() && tail.bytes().all(|c| c.is_ascii_digit()) && !head.is_empty() {
            p = head;
        } else {
            break;
        }
    }
    p
}

#[derive(Default)]
pub struct Writers {
    /// topic → prefix → last commit (ms)
    seen: Mutex<HashMap<String, HashMap<String, i64>>>,
}

impl Writers {
    /// Records a commit by `transactional_id` to `topic`; warns when another
    /// prefix committed to it within the window.
    pub fn record_commit(&self, topic: &str, transactional_id: &str, now: i64) {
        let prefix = prefix_of(transactional_id);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let t = seen.entry(topic.to_string()).or_default();
        t.retain(|_, last| now - *last <= WINDOW_MS);
        let new_prefix = !t.contains_key(prefix);
        t.insert(prefix.to_string(), now);
        if new_prefix && t.len() > 1 {
            let mut prefixes: Vec<&String> = t.keys().collect();
            prefixes.sort();
            tracing::warn!(topic, prefixes = ?prefixes,
                "more than one transactional writer commits to this topic: exactly-once holds per writer, so their outputs add up (set topic config {WRITER_PREFIX_CONFIG} to allow only one)");
        }
    }

    /// Live writer prefixes per topic (within the window).
    pub fn live(&self, now: i64) -> BTreeMap<String, Vec<String>> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter()
            .map(|(topic, m)| {
                let mut v: Vec<String> = m
                    .iter()
                    .filter(|(_, last)| now - **last <= WINDOW_MS)
                    .map(|(p, _)| p.clone())
                    .collect();
                v.sort();
                (topic.clone(), v)
            })
            .filter(|(_, v)| !v.is_empty())
            .collect()
    }
}

/// A transactional write refused by the topic's writer prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("topic allows transactional writes only from prefix {allowed:?} ({WRITER_PREFIX_CONFIG}); {transactional_id:?} has prefix {prefix:?}")]
pub struct WriterRefused {
    pub allowed: String,
    pub transactional_id: String,
    pub prefix: String,
}

/// Whether `transactional_id` may write to a topic whose configs are `configs`.
pub fn allowed(
    configs: &BTreeMap<String, String>,
    transactional_id: &str,
) -> Result<(), WriterRefused> {
    match configs.get(WRITER_PREFIX_CONFIG) {
        Some(p) if !p.is_empty() && prefix_of(transactional_id) != p => Err(WriterRefused {
            allowed: p.clone(),
            transactional_id: transactional_id.to_string(),
            prefix: prefix_of(transactional_id).to_string(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(prefix_of("orders-sink-3-17"), "orders-sink");
        assert_eq!(prefix_of("orders-sink-v2-3"), "orders-sink-v2");
        assert_eq!(prefix_of("fare-writer-7"), "fare-writer");
        assert_eq!(prefix_of("fare-writer-7-a3f9"), "fare-writer-7-a3f9");
        assert_eq!(prefix_of("plain"), "plain");
        assert_eq!(prefix_of("-1"), "-1");
    }

    #[test]
    fn two_prefixes_are_live_writers_within_the_window() {
        let w = Writers::default();
        w.record_commit("orders", "orders-sink-0", 1000);
        w.record_commit("orders", "orders-sink-1", 1500);
        assert_eq!(w.live(2000)["orders"], vec!["orders-sink"]);
        w.record_commit("orders", "orders-sink-v2-0", 2000);
        assert_eq!(
            w.live(2000)["orders"],
            vec!["orders-sink", "orders-sink-v2"]
        );
        assert_eq!(
            w.live(1500 + WINDOW_MS + 1)["orders"],
            vec!["orders-sink-v2"]
        );
    }

    #[test]
    fn single_writer_config() {
        let mut c = BTreeMap::new();
        assert!(allowed(&c, "anything-1").is_ok());
        c.insert(WRITER_PREFIX_CONFIG.to_string(), "orders-sink".to_string());
        assert!(allowed(&c, "orders-sink-4").is_ok());
        assert!(allowed(&c, "orders-sink-v2-4").is_err());
    }
}
