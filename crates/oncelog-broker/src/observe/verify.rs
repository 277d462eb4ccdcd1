//! What live verification found and how far it got
//! ([`crate::coordinators::verify`]): per partition the offset verified
//! through, anomalies counted by kind, and the latest ones kept for
//! `/metrics`. What `/v1/verify`, the CLI and the console show is the
//! record kept across restarts ([`crate::backend::verify_record`]), fed
//! from here.
//!
//! Bounded: one row per partition this broker verifies (rows of partitions
//! it no longer verifies are dropped each round) and at most
//! [`MAX_RECENT`] anomalies (oldest dropped first). Each anomaly is reported
//! once (logged at `error!`), however many passes find it again, and
//! across restarts as far as the record remembers it.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use oncelog_verify::scan::{Finding, Kind};
use serde::{Deserialize, Serialize};

/// Anomalies kept for `/v1/verify`.
pub const MAX_RECENT: usize = 256;

/// Anomaly keys remembered so each is reported once (beyond this, the
/// oldest are forgotten and may be reported again).
const MAX_KEYS: usize = 100_000;

/// One anomaly as reported.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reported {
    pub kind: Kind,
    pub topic: String,
    pub partition: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub producer_id: i64,
    pub epoch: i16,
    pub detail: String,
    pub found_ms: i64,
}

/// How far one partition is verified.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Progress {
    pub topic: String,
    pub partition: i32,
    /// The topic's id (a topic deleted and created again under its name
    /// is verified afresh).
    #[serde(default)]
    pub topic_id: String,
    /// Every offset below this was checked (by the scan from the log
    /// start) and found sound, or reported.
    pub verified_through: i64,
    pub log_start_offset: i64,
    pub last_stable_offset: i64,
    /// Whole passes from the log start that compared every batch with what
    /// the first pass saw.
    pub passes: u64,
    /// Batches whose committed content is remembered for those passes.
    pub remembered_batches: usize,
    /// The topic is compacted: gaps are explained and content is not
    /// compared between passes.
    pub compacted: bool,
}

pub type Key = (Kind, String, i32, i64, i64);

impl Reported {
    /// What makes two reports the same anomaly.
    pub fn key(&self) -> Key {
        (
            self.kind,
            self.topic.clone(),
            self.partition,
            self.first_offset,
            self.last_offset,
        )
    }
}

/// One topic's business-key index (`verify.unique.key`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct UniqueIndex {
    pub topic: String,
    /// Keys held.
    pub keys: usize,
    /// Keys forgotten because the index was full.
    pub evicted: u64,
    /// Keys committed since then are checked (the window's start, or later
    /// when the index was full).
    pub covered_since_ms: i64,
}

#[derive(Default)]
struct Inner {
    recent: VecDeque<Reported>,
    progress: BTreeMap<(String, i32), Progress>,
    unique: BTreeMap<String, UniqueIndex>,
    seen: HashSet<Key>,
    seen_order: VecDeque<Key>,
    /// Reported since the record last took them.
    unsaved: Vec<Reported>,
}

impl Inner {
    /// Remembers `key` as reported; false when it already was.
    fn remember(&mut self, key: Key) -> bool {
        if !self.seen.insert(key.clone()) {
            return false;
        }
        self.seen_order.push_back(key);
        while self.seen_order.len() > MAX_KEYS {
            if let Some(k) = self.seen_order.pop_front() {
                self.seen.remove(&k);
            }
        }
        true
    }
}

fn keep_recent(recent: &mut VecDeque<Reported>, r: Reported) {
    while recent.len() >= MAX_RECENT {
        recent.pop_front();
    }
    recent.push_back(r);
}

/// What the record holds: progress by partition, the latest anomalies
/// (oldest first) and the anomalies counted by kind.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Saved {
    pub progress: Vec<Progress>,
    pub anomalies: Vec<Reported>,
    pub totals: BTreeMap<String, u64>,
}

impl Saved {
    /// `/v1/verify`: progress, counts and the latest anomalies (of `topic`
    /// only, if given), with this broker's business-key indexes.
    pub fn to_json(
        mut self,
        topic: Option<&str>,
        enabled: bool,
        local: &Verify,
        cluster_wide: bool,
    ) -> serde_json::Value {
        if let Some(t) = topic {
            self.progress.retain(|p| p.topic == t);
            self.anomalies.retain(|a| a.topic == t);
        }
        let totals: serde_json::Map<String, serde_json::Value> = Kind::ALL
            .iter()
            .map(|k| {
                let n = self.totals.get(k.name()).copied().unwrap_or(0);
                (k.name().to_string(), n.into())
            })
            .collect();
        serde_json::json!({
            "enabled": enabled,
            "cluster_wide": cluster_wide,
            "scrubbed_bytes": local.scrubbed_bytes.load(Relaxed),
            "anomalies_total": totals,
            "partitions": self.progress,
            "unique": local.uniques(topic),
            "anomalies": self.anomalies,
        })
    }
}

/// The verification's report (a field of the broker).
#[derive(Default)]
pub struct Verify {
    inner: Mutex<Inner>,
    counts: [AtomicU64; Kind::ALL.len()],
    /// Bytes the scrubber read back from storage.
    pub scrubbed_bytes: AtomicU64,
    /// Time the scrubber waited for its byte budget.
    pub throttled_ms: AtomicU64,
    /// When local mode's record was last written.
    pub saved_ms: std::sync::atomic::AtomicI64,
    /// Progress moved since local mode's record was last written.
    pub unsaved_progress: std::sync::atomic::AtomicBool,
}

impl Verify {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reports `f`, found at `topic`'s `partition`, unless it was already:
    /// logged, counted and kept. Returns whether it was new.
    pub fn report(&self, topic: &str, partition: i32, f: &Finding, now_ms: i64) -> bool {
        let key = (
            f.kind,
            topic.to_string(),
            partition,
            f.first_offset,
            f.last_offset,
        );
        let mut g = self.lock();
        if !g.remember(key) {
            return false;
        }
        tracing::error!(
            kind = f.kind.name(),
            topic,
            partition,
            first_offset = f.first_offset,
            last_offset = f.last_offset,
            producer_id = f.producer_id,
            epoch = f.epoch,
            "verify: {}",
            f.detail
        );
        if let Some(i) = Kind::ALL.iter().position(|k| *k == f.kind) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        let r = Reported {
            kind: f.kind,
            topic: topic.to_string(),
            partition,
            first_offset: f.first_offset,
            last_offset: f.last_offset,
            producer_id: f.producer_id,
            epoch: f.epoch,
            detail: f.detail.clone(),
            found_ms: now_ms,
        };
        g.unsaved.push(r.clone());
        keep_recent(&mut g.recent, r);
        true
    }

    /// Anomalies reported (here or by another broker) before: they are not
    /// reported again.
    pub fn already_reported(&self, keys: impl IntoIterator<Item = Key>) {
        let mut g = self.lock();
        for k in keys {
            g.remember(k);
        }
    }

    /// Takes what was reported since the last call (for the record).
    pub fn take_unsaved(&self) -> Vec<Reported> {
        std::mem::take(&mut self.lock().unsaved)
    }

    /// Gives back what the record could not take, to be taken again.
    pub fn untake(&self, mut back: Vec<Reported>) {
        let mut g = self.lock();
        back.append(&mut g.unsaved);
        g.unsaved = back;
    }

    /// Local mode's record as it was saved: the latest anomalies and the
    /// counts by kind come back, and are not reported again.
    pub fn restore(&self, saved: Saved) {
        let mut g = self.lock();
        for p in saved.progress {
            g.progress.insert((p.topic.clone(), p.partition), p);
        }
        for r in saved.anomalies {
            g.remember(r.key());
            keep_recent(&mut g.recent, r);
        }
        drop(g);
        for (name, n) in saved.totals {
            if let Some(i) = Kind::parse(&name).and_then(|k| Kind::ALL.iter().position(|x| *x == k))
            {
                self.counts[i].fetch_add(n, Relaxed);
            }
        }
    }

    /// Local mode's record: every partition's progress, the latest
    /// anomalies and the counts by kind.
    pub fn saved(&self) -> Saved {
        let g = self.lock();
        Saved {
            progress: g.progress.values().cloned().collect(),
            anomalies: g.recent.iter().cloned().collect(),
            totals: self
                .counts()
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .map(|(k, n)| (k.name().to_string(), n))
                .collect(),
        }
    }

    /// Records one partition's progress.
    pub fn progress(&self, p: Progress) {
        self.lock()
            .progress
            .insert((p.topic.clone(), p.partition), p);
    }

    /// Drops the progress of partitions not in `keep`.
    pub fn retain(&self, keep: &HashSet<(String, i32)>) {
        self.lock().progress.retain(|k, _| keep.contains(k));
    }

    /// Records one topic's business-key index.
    pub fn unique(&self, topic: &str, keys: usize, evicted: u64, covered_since_ms: i64) {
        self.lock().unique.insert(
            topic.to_string(),
            UniqueIndex {
                topic: topic.to_string(),
                keys,
                evicted,
                covered_since_ms,
            },
        );
    }

    /// Drops the indexes of topics not in `keep`.
    pub fn retain_unique(&self, keep: &[String]) {
        self.lock().unique.retain(|t, _| keep.contains(t));
    }

    fn uniques(&self, topic: Option<&str>) -> Vec<UniqueIndex> {
        self.lock()
            .unique
            .values()
            .filter(|u| topic.is_none_or(|t| u.topic == t))
            .cloned()
            .collect()
    }

    /// Anomalies found so far, by kind.
    pub fn counts(&self) -> Vec<(Kind, u64)> {
        Kind::ALL
            .iter()
            .zip(&self.counts)
            .map(|(k, n)| (*k, n.load(Relaxed)))
            .collect()
    }

    /// Every partition's progress (of `topic` only, if given).
    pub fn partitions(&self, topic: Option<&str>) -> Vec<Progress> {
        self.lock()
            .progress
            .values()
            .filter(|p| topic.is_none_or(|t| p.topic == t))
            .cloned()
            .collect()
    }

    /// The verification's metrics.
    pub fn render(&self, out: &mut crate::observe::exposition::Scrape) {
        let mut verified = out.gauge(
            "oncelog_verified_offset",
            "Offset below which the partition's log was verified from its bytes (live verification).",
        );
        for p in self.partitions(None) {
            verified.int(
                &[("topic", &p.topic), ("partition", &p.partition.to_string())],
                p.verified_through,
            );
        }
        let mut anomalies = out.counter(
            "oncelog_verify_anomalies_total",
            "Anomalies live verification found, by kind.",
        );
        for (k, n) in self.counts() {
            anomalies.int(&[("kind", k.name())], n as i64);
        }
        let uniques = self.uniques(None);
        let now = oncelog_log::now_ms();
        let mut keys = out.gauge(
            "oncelog_verify_unique_keys",
            "Business keys held for verify.unique.key, by topic.",
        );
        for u in &uniques {
            keys.int(&[("topic", &u.topic)], u.keys as i64);
        }
        let mut evicted = out.counter(
            "oncelog_verify_unique_evicted_total",
            "Business keys forgotten before their window ended because verify.unique.max.keys was reached, by topic.",
        );
        for u in &uniques {
            evicted.int(&[("topic", &u.topic)], u.evicted as i64);
        }
        let mut covered = out.gauge(
            "oncelog_verify_unique_covered_seconds",
            "How far back business keys are checked for a second commit, by topic: the window, or less when the index is full.",
        );
        for u in &uniques {
            covered.float(
                &[("topic", &u.topic)],
                (now - u.covered_since_ms).max(0) as f64 / 1000.0,
            );
        }
        out.counter(
            "oncelog_verify_scrubbed_bytes_total",
            "Bytes live verification read back from storage.",
        )
        .int(&[], self.scrubbed_bytes.load(Relaxed) as i64);
        out.counter(
            "oncelog_verify_throttled_seconds_total",
            "Time live verification waited for its byte budget (verify.scrub.bytes.per.second).",
        )
        .float(&[], self.throttled_ms.load(Relaxed) as f64 / 1000.0);
    }
}
