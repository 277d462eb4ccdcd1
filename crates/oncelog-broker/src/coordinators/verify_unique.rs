//! Business-key uniqueness, live: for each topic with `verify.unique.key`
//! (`record-key`, or a JSON pointer into the value such as `/order_id`),
//! every committed record's key is held with its writer for
//! `verify.unique.window.ms` ([`oncelog_verify::unique::Unique`]); a key
//! committed a second time is `duplicate_key`, naming both writers
//! (transactional id, writer prefix, producer id and epoch) and both
//! offsets. It sees what read_committed consumers see: aborted records and
//! markers never count, and a transaction committed again (Flink's
//! recovery) writes nothing new.
//!
//! Written once over [`crate::backend::Logs`]; a topic is indexed by the
//! broker that verifies its partition 0, which reads all its partitions
//! (the index is topic-wide). Memory: `verify.unique.max.keys` keys per
//! broker, shared evenly by its topics; when a topic's share is full its
//! oldest keys are forgotten first (`covered_since` in `/v1/verify`).
//! The window counts from when the broker indexed a record; after a start
//! the topic is indexed again from its log start.

use std::collections::HashMap;
use std::sync::Arc;

use oncelog_log::batch::BatchIter;
use oncelog_log::now_ms;
use oncelog_log::records::batch_records;
use oncelog_verify::scan::{Finding, Kind};
use oncelog_verify::unique::{KeySpec, Unique};

use crate::backend::topic::TopicMeta;
use crate::backend::{Budget, FetchAsk, PartitionRow, Scope};
use crate::Broker;

/// Bytes of one read.
const CHUNK: usize = 1 << 20;

/// Reads per partition per round at most (the rest waits a second).
const READS_PER_ROUND: usize = 8;

/// Where a key was committed.
#[derive(Debug, Clone, Copy)]
struct Occ {
    partition: i32,
    offset: i64,
    producer_id: i64,
    epoch: i16,
}

struct TopicIndex {
    topic_id: uuid::Uuid,
    spec: KeySpec,
    index: Unique<Occ>,
    /// Next offset to read, per partition.
    cursors: HashMap<i32, i64>,
}

/// The topics this broker indexes.
#[derive(Default)]
pub struct Uniques {
    topics: HashMap<String, TopicIndex>,
}

/// A duplicate found: (key, first, second).
type Dup = (Vec<u8>, Occ, Occ);

/// One round: indexes what each topic committed since the last.
pub async fn tail(
    b: &Arc<Broker>,
    rows: &[PartitionRow],
    topics: &HashMap<String, TopicMeta>,
    u: &mut Uniques,
) {
    let window_default = b.config.verify_unique_window_ms;
    // (topic, spec, window) this broker indexes
    let mine: Vec<(&TopicMeta, KeySpec, i64)> = rows
        .iter()
        .filter(|r| r.partition == 0)
        .filter_map(|r| {
            let meta = topics.get(&r.topic)?;
            let spec = KeySpec::parse(meta.configs.get("verify.unique.key")?).ok()?;
            let window = meta
                .configs
                .get("verify.unique.window.ms")
                .and_then(|w| w.parse().ok())
                .unwrap_or(window_default);
            Some((meta, spec, window))
        })
        .collect();
    u.topics
        .retain(|name, _| mine.iter().any(|(m, _, _)| &m.name == name));
    let share = b.config.verify_unique_max_keys / mine.len().max(1);
    for (meta, spec, window) in mine {
        let t = u
            .topics
            .entry(meta.name.clone())
            .or_insert_with(|| TopicIndex {
                topic_id: meta.id,
                spec: spec.clone(),
                index: Unique::new(window, share),
                cursors: HashMap::new(),
            });
        if t.topic_id != meta.id || t.spec != spec || t.index.window_ms() != window {
            *t = TopicIndex {
                topic_id: meta.id,
                spec,
                index: Unique::new(window, share),
                cursors: HashMap::new(),
            };
        }
        t.index.set_max_keys(share);
        let mut dups = Vec::new();
        for p in 0..meta.partitions {
            index_partition(b, &meta.name, p, t, &mut dups).await;
        }
        if !dups.is_empty() {
            report(b, &meta.name, &dups).await;
        }
        let now = now_ms();
        t.index.expire(now);
        b.verify.unique(
            &meta.name,
            t.index.len(),
            t.index.evicted,
            t.index.covered_since(now),
        );
    }
    b.verify
        .retain_unique(&u.topics.keys().cloned().collect::<Vec<_>>());
}

/// Indexes one partition from its cursor to its LSO.
async fn index_partition(
    b: &Arc<Broker>,
    topic: &str,
    partition: i32,
    t: &mut TopicIndex,
    dups: &mut Vec<Dup>,
) {
    let logs = b.logs();
    for _ in 0..READS_PER_ROUND {
        let at = t.cursors.get(&partition).copied().unwrap_or(0);
        let ask = FetchAsk {
            topic,
            partition,
            offset: at,
            max_bytes: CHUNK,
        };
        let mut budget = Budget::new(CHUNK);
        let Some(Ok(r)) = logs.read_many(&[ask], &mut budget, true).await.pop() else {
            return;
        };
        let data = match r.data {
            Ok(d) => d,
            Err(_) => {
                // Below the log start (retention) or past the end: go on
                // from the log start.
                if at < r.log_start_offset || at > r.high_watermark {
                    t.cursors.insert(partition, r.log_start_offset);
                    continue;
                }
                return;
            }
        };
        if data.is_empty() {
            return;
        }
        let now = now_ms();
        let mut next = at;
        for item in BatchIter::new(&data) {
            let Ok((pos, h)) = item else { break };
            let batch = &data[pos..pos + h.total_size()];
            next = next.max(h.last_offset() + 1);
            let (pid, base) = (h.producer_id(), h.base_offset());
            let aborted = r
                .aborted
                .iter()
                .any(|a| a.producer_id == pid && a.first_offset <= base && base <= a.last_offset);
            if h.is_control() || aborted {
                continue;
            }
            let Ok(records) = batch_records(batch) else {
                continue;
            };
            for rec in &records.records {
                let value = rec.value.clone().map(|v| &records.data[v]);
                let Some(hash) = t.spec.hash_of(records.key(rec), value) else {
                    continue;
                };
                let occ = Occ {
                    partition,
                    offset: base + rec.offset_delta,
                    producer_id: pid,
                    epoch: h.producer_epoch(),
                };
                if let Some(first) = t.index.insert(hash, now, occ) {
                    let key = t.spec.key_of(records.key(rec), value).unwrap_or_default();
                    dups.push((key, *first, occ));
                }
            }
        }
        if next <= at {
            return;
        }
        t.cursors.insert(partition, next);
        if next >= r.last_stable_offset {
            return;
        }
    }
}

/// Reports each duplicate, naming both writers.
async fn report(b: &Arc<Broker>, topic: &str, dups: &[Dup]) {
    // producer id -> transactional id, as the coordinators hold them now
    let ids: HashMap<i64, String> = match b.txns().list_in(Scope::All).await {
        Ok((metas, _)) => metas
            .into_iter()
            .map(|m| (m.producer_id, m.transactional_id))
            .collect(),
        Err(_) => HashMap::new(),
    };
    let writer = |o: &Occ| {
        let who = match ids.get(&o.producer_id) {
            Some(id) => format!(
                "transactional id {id} (writer {}, producer {} epoch {})",
                crate::machines::writers::prefix_of(id),
                o.producer_id,
                o.epoch
            ),
            None if o.producer_id >= 0 => format!("producer {} epoch {}", o.producer_id, o.epoch),
            None => "a producer without an id".to_string(),
        };
        format!("{topic}-{}@{} by {who}", o.partition, o.offset)
    };
    let now = now_ms();
    for (key, first, second) in dups {
        let f = Finding {
            kind: Kind::DuplicateKey,
            first_offset: second.offset,
            last_offset: second.offset,
            producer_id: second.producer_id,
            epoch: second.epoch,
            detail: format!(
                "key {} committed twice: first at {}, again at {}",
                String::from_utf8_lossy(key),
                writer(first),
                writer(second)
            ),
        };
        b.verify.report(topic, second.partition, &f, now);
    }
}
