//! Pipeline lineage's store ([`crate::coordinators::verify_lineage`],
//! written once): the input ranges consumer groups' committed transactions
//! consumed. Local mode keeps them in memory and writes them to
//! `verify-lineage.json` in the data directory each second they changed
//! (read back at start, so the lineage fence holds across restarts); a
//! cluster keeps them in the `verify_lineage` table, so groups coordinated
//! by different brokers are held against each other.

use std::collections::BTreeSet;
use std::sync::Arc;

use oncelog_verify::lineage::{Consumed, Ranges};

use crate::backend::cluster::{lineage as pg, Cluster};
use crate::Broker;

/// Ranges kept per input partition (local mode; oldest dropped first).
pub const MAX_RANGES: usize = 1024;

/// The lineage store.
pub enum LineageStore<'a> {
    Local(&'a Broker),
    Cluster(&'a Cluster),
}

impl Broker {
    pub fn lineage_store(self: &Arc<Self>) -> LineageStore<'_> {
        match &self.mode {
            crate::Mode::Cluster(front) => LineageStore::Cluster(&front.cluster),
            crate::Mode::Local => LineageStore::Local(self),
        }
    }
}

fn warn(cluster: &Cluster, e: &crate::backend::cluster::ClusterError) {
    if !cluster.outage.absorb(e) {
        tracing::warn!(error = %e, "verify: the cluster's lineage could not be read or written");
    }
}

impl LineageStore<'_> {
    /// The ranges of `topic`'s `partition` overlapping `[from, to)`.
    pub async fn overlapping(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
    ) -> Vec<Consumed> {
        match self {
            LineageStore::Local(b) => b
                .lineage
                .ranges(topic, partition)
                .into_iter()
                .filter(|c| c.from < to && from < c.to)
                .collect(),
            LineageStore::Cluster(c) => pg::overlapping(c, topic, partition, from, to)
                .await
                .unwrap_or_else(|e| {
                    warn(c, &e);
                    Vec::new()
                }),
        }
    }

    /// Records a committed range (joined to its group's adjacent one).
    pub async fn add(&self, topic: &str, partition: i32, c: Consumed) {
        match self {
            LineageStore::Local(b) => b.lineage.add(topic, partition, c),
            LineageStore::Cluster(cl) => {
                if let Err(e) = pg::add(cl, topic, partition, &c).await {
                    warn(cl, &e);
                }
            }
        }
    }

    /// An offset reset of `group` (on `partitions`, or all of them).
    pub async fn reset(&self, group: &str, partitions: Option<&[(String, i32)]>) {
        match self {
            LineageStore::Local(b) => b.lineage.reset(group, partitions),
            LineageStore::Cluster(c) => {
                if let Err(e) = pg::reset(c, group, partitions).await {
                    warn(c, &e);
                }
            }
        }
    }

    /// Local mode: writes the ranges down when they changed since the last
    /// call. A cluster's are written as they come.
    pub fn persist(&self) {
        if let LineageStore::Local(b) = self {
            b.lineage.save(&b.config.data_dir);
        }
    }

    /// Forgets ranges committed before `cutoff_ms`.
    pub async fn expire(&self, cutoff_ms: i64) {
        match self {
            LineageStore::Local(b) => b.lineage.expire(cutoff_ms),
            LineageStore::Cluster(c) => {
                if let Err(e) = pg::expire(c, cutoff_ms).await {
                    warn(c, &e);
                }
            }
        }
    }
}

/// Local mode's file, in the data directory.
pub const FILE: &str = "verify-lineage.json";

/// Local mode's ranges, by input partition.
#[derive(Default)]
pub struct LocalLineage {
    by_input: std::sync::Mutex<std::collections::HashMap<(String, i32), Ranges>>,
    /// Changed since last written down.
    dirty: std::sync::atomic::AtomicBool,
}

/// One input partition's ranges as written down.
#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    topic: String,
    partition: i32,
    ranges: Ranges,
}

impl LocalLineage {
    /// Local mode's ranges as written down in `dir` before (none in a
    /// cluster: `None`).
    pub fn opened(dir: Option<&std::path::Path>) -> Self {
        let l = Self::default();
        if let Some(d) = dir {
            l.load(d);
        }
        l
    }

    fn load(&self, dir: &std::path::Path) {
        let saved: Vec<Saved> = crate::backend::verify_record::read_file(dir, FILE);
        let mut g = self.lock();
        for s in saved {
            g.insert((s.topic, s.partition), s.ranges);
        }
    }

    fn save(&self, dir: &std::path::Path) {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.dirty.swap(false, Relaxed) {
            return;
        }
        let saved: Vec<Saved> = self
            .lock()
            .iter()
            .map(|((t, p), r)| Saved {
                topic: t.clone(),
                partition: *p,
                ranges: r.clone(),
            })
            .collect();
        let written = serde_json::to_vec(&saved)
            .map_err(std::io::Error::other)
            .and_then(|data| crate::backend::verify_record::write_file(dir, FILE, &data));
        if let Err(e) = written {
            self.dirty.store(true, Relaxed);
            tracing::warn!(error = %e, "verify: the lineage record could not be written (tried again next second)");
        }
    }

    fn changed(&self) {
        self.dirty.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, i32), Ranges>> {
        self.by_input.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ranges(&self, topic: &str, partition: i32) -> Vec<Consumed> {
        self.lock()
            .get(&(topic.to_string(), partition))
            .map(|r| r.ranges.clone())
            .unwrap_or_default()
    }

    fn add(&self, topic: &str, partition: i32, c: Consumed) {
        self.lock()
            .entry((topic.to_string(), partition))
            .or_default()
            .add(c, MAX_RANGES);
        self.changed();
    }

    fn reset(&self, group: &str, partitions: Option<&[(String, i32)]>) {
        self.changed();
        let mut g = self.lock();
        for ((t, p), r) in g.iter_mut() {
            if partitions.is_none_or(|ps| ps.iter().any(|(pt, pp)| pt == t && pp == p)) {
                r.reset(group);
            }
        }
    }

    fn expire(&self, cutoff_ms: i64) {
        self.changed();
        let mut g = self.lock();
        for r in g.values_mut() {
            r.expire(cutoff_ms);
        }
        g.retain(|_, r| !r.ranges.is_empty());
    }
}

/// The topics of a transaction's partitions that are outputs (not the
/// offsets topic).
pub fn outputs<'a>(partitions: impl IntoIterator<Item = &'a (String, i32)>) -> BTreeSet<String> {
    partitions
        .into_iter()
        .filter(|(t, _)| t != crate::coordinators::groups::OFFSETS_TOPIC)
        .map(|(t, _)| t.clone())
        .collect()
}
