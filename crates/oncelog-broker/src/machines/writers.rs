//! Second-writer detection (seed 000, scenario S6): exactly-once holds per
//! writer, and two jobs with different transactional-id prefixes writing one
//! topic double its output without any error. The broker remembers, per
//! topic, which writers committed transactions recently and reports a topic
//! with more than one; a topic config `writer.transactional.id.prefix` makes
//! it refuse transactional writes from any other writer.
//!
//! A writer is a job, not a producer: its identity comes from the naming
//! scheme of the framework that made the transactional id ([`prefix_of`]):
//!
//! | scheme | transactional id | writer |
//! |---|---|---|
//! | Kafka Streams exactly_once_v2 | `wordcount-8d1c3c59-5a43-4e0a-9d2e-7c8a9e1f0b21-1` (`<application.id>-<process UUID>-<thread>`) | `wordcount` |
//! | Kafka Streams exactly_once (per task) | `wordcount-0_3` (`<application.id>-<subtopology>_<partition>`) | `wordcount` |
//! | Flink `KafkaSink` | `orders-sink-3-17` (`<prefix>-<subtask>-<checkpoint or pool index>`) | `orders-sink` |
//! | numbered producers | `fare-writer-7` (`<name>-<N>`) | `fare-writer` |
//! | anything else | `billing` | `billing` |
//!
//! A Flink id ends in exactly two number groups, so a job named
//! `orders-sink-2` (ids `orders-sink-2-0-17`) is a writer of its own, not
//! `orders-sink`'s. A configured prefix the rules would read as a longer id
//! (one ending in `-N`, a task id or a UUID) is refused ([`check_prefix`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// How long a prefix counts as a live writer of a topic after its last commit.
pub const WINDOW_MS: i64 = 60_000;

/// The topic config naming the only transactional-id prefix allowed to write.
pub const WRITER_PREFIX_CONFIG: &str = "writer.transactional.id.prefix";

/// The writer a transactional id belongs to (the module doc's table).
pub fn prefix_of(transactional_id: &str) -> &str {
    let id = transactional_id;
    // Kafka Streams v2: `<app>-<uuid>-<thread>`.
    if let Some((head, thread)) = id.rsplit_once('-') {
        if is_number(thread) && head.len() > UUID_LEN + 1 {
            let (app, uuid) = head.split_at(head.len() - UUID_LEN);
            if let Some(app) = app.strip_suffix('-') {
                if is_uuid(uuid) && !app.is_empty() {
                    return app;
                }
            }
        }
    }
    // Flink: exactly two trailing number groups.
    if let Some((head, last)) = id.rsplit_once('-') {
        if is_number(last) {
            if let Some((job, subtask)) = head.rsplit_once('-') {
                if is_number(subtask) && !job.is_empty() {
                    return job;
                }
            }
            if !head.is_empty() {
                return head;
            }
        } else if is_task_id(last) && !head.is_empty() {
            // Kafka Streams per-task producers: `<app>-<subtopology>_<partition>`.
            return head;
        }
    }
    id
}

const UUID_LEN: usize = 36;

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())
}

fn is_task_id(s: &str) -> bool {
    s.split_once('_')
        .is_some_and(|(a, b)| is_number(a) && is_number(b))
}

fn is_uuid(s: &str) -> bool {
    s.len() == UUID_LEN
        && s.split('-').map(str::len).eq([8, 4, 4, 4, 12])
        && s.bytes().all(|c| c == b'-' || c.is_ascii_hexdigit())
}

/// Why a configured writer prefix is refused: the rules would read it as a
/// producer of another writer, so its own jobs could never match it.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Ok(());
    }
    if prefix_of(prefix) != prefix {
        return Err(format!(
            "{WRITER_PREFIX_CONFIG}={prefix:?} is ambiguous: a transactional id {prefix:?} is read as writer {:?} \
             (a trailing -N, task id or UUID names a producer of a job, not the job); \
             name the writer without it, e.g. {:?}",
            prefix_of(prefix),
            format!("{}-v2", prefix_of(prefix))
        ));
    }
    Ok(())
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
        self.observe(topic, prefix_of(transactional_id), now, now);
    }

    /// Records that `prefix` committed to `topic` at `at` (ms; `now` is the
    /// clock the window is measured by); warns when another prefix committed
    /// to it within the window. Cluster mode feeds it every broker's commits.
    pub fn observe(&self, topic: &str, prefix: &str, at: i64, now: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let t = seen.entry(topic.to_string()).or_default();
        t.retain(|_, last| now - *last <= WINDOW_MS);
        if now - at > WINDOW_MS {
            return;
        }
        let new_prefix = !t.contains_key(prefix);
        let last = t.entry(prefix.to_string()).or_insert(at);
        *last = (*last).max(at);
        if new_prefix && t.len() > 1 {
            let mut prefixes: Vec<&String> = t.keys().collect();
            prefixes.sort();
            tracing::warn!(topic, prefixes = ?prefixes,
                "more than one transactional writer commits to this topic: exactly-once holds per writer, so their outputs add up (set topic config {WRITER_PREFIX_CONFIG} to allow only one)");
        }
    }

    /// Forgets `writer`'s commits to `topic` (it handed the topic over).
    pub fn forget(&self, topic: &str, writer: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = seen.get_mut(topic) {
            t.remove(writer);
        }
    }

    /// Live writer prefixes per topic (within the window), each with its
    /// last commit (ms).
    pub fn live_detail(&self, now: i64) -> BTreeMap<String, Vec<(String, i64)>> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter()
            .map(|(topic, m)| {
                let mut v: Vec<(String, i64)> = m
                    .iter()
                    .filter(|(_, last)| now - **last <= WINDOW_MS)
                    .map(|(p, last)| (p.clone(), *last))
                    .collect();
                v.sort();
                (topic.clone(), v)
            })
            .filter(|(_, v)| !v.is_empty())
            .collect()
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
        assert_eq!(prefix_of("-1-2"), "-1");
    }

    #[test]
    fn flink_jobs_that_end_in_a_number_are_their_own_writers() {
        // The hole a real Flink blue/green run found: a green job named
        // orders-sink-2 was read as orders-sink.
        assert_eq!(prefix_of("orders-sink-2-0-17"), "orders-sink-2");
        assert_eq!(prefix_of("orders-sink-0-17"), "orders-sink");
        assert_ne!(
            prefix_of("orders-sink-2-0-17"),
            prefix_of("orders-sink-1-5")
        );
    }

    #[test]
    fn kafka_streams_ids_name_the_application() {
        let v2 = "wordcount-8d1c3c59-5a43-4e0a-9d2e-7c8a9e1f0b21-1";
        assert_eq!(prefix_of(v2), "wordcount");
        assert_eq!(
            prefix_of("my-app-2-8D1C3C59-5A43-4E0A-9D2E-7C8A9E1F0B21-12"),
            "my-app-2"
        );
        assert_eq!(prefix_of("wordcount-0_3"), "wordcount");
        assert_eq!(prefix_of("word-count-12_104"), "word-count");
        // Not a UUID (a group too short): the generic rules apply.
        assert_eq!(
            prefix_of("app-8d1c3c5-5a43-4e0a-9d2e-7c8a9e1f0b21-1"),
            "app-8d1c3c5-5a43-4e0a-9d2e-7c8a9e1f0b21"
        );
        assert_eq!(prefix_of("app-0_x"), "app-0_x");
    }

    #[test]
    fn ambiguous_prefixes_are_refused() {
        assert!(check_prefix("orders-sink").is_ok());
        assert!(check_prefix("orders-sink-v2").is_ok());
        assert!(check_prefix("").is_ok());
        for bad in [
            "orders-sink-2",
            "job-1-2",
            "app-0_1",
            "app-8d1c3c59-5a43-4e0a-9d2e-7c8a9e1f0b21-1",
        ] {
            let e = check_prefix(bad).unwrap_err();
            assert!(e.contains("ambiguous"), "{e}");
        }
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
        assert!(allowed(&c, "orders-sink-2-0-4").is_err());
        assert!(allowed(&c, "orders-sink-1-4").is_ok());
    }
}
