//! Live verification's record ([`crate::coordinators::verify`], written
//! once): how far each partition is verified and the anomalies found, kept
//! across restarts. What `/v1/verify`, `oncelog verify status` and the
//! console show comes from here.
//!
//! Local mode saves [`Saved`] to `verify.json` in the data directory
//! (through a temporary file and a rename); a cluster keeps the
//! `verify_progress` and `verify_anomalies` tables, so any broker answers
//! for every partition and an anomaly another broker reported (a
//! partition's earlier leader) is not reported again.
//!
//! The record is the report, not the log: losing it (a failed write, a
//! deleted file) loses no data; the partitions are verified again from
//! their log start.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::backend::cluster::{verify_record as pg, Cluster};
use crate::observe::verify::{Progress, Reported, Saved, MAX_RECENT};
use crate::Broker;

/// Local mode's file, in the data directory.
pub const FILE: &str = "verify.json";

/// How often local mode writes its progress down at most.
const LOCAL_PROGRESS_EVERY_MS: i64 = 5_000;

/// The record.
pub enum VerifyRecord<'a> {
    Local(&'a Broker),
    Cluster(&'a Cluster),
}

impl Broker {
    pub fn verify_record(self: &Arc<Self>) -> VerifyRecord<'_> {
        match &self.mode {
            crate::Mode::Cluster(front) => VerifyRecord::Cluster(&front.cluster),
            crate::Mode::Local => VerifyRecord::Local(self),
        }
    }
}

impl VerifyRecord<'_> {
    /// What was recorded before this broker started: its progress by
    /// partition, and the anomalies already reported (they are not
    /// reported again). Local mode also takes back its latest anomalies
    /// and counts.
    pub async fn restore(&self, b: &Broker) -> Vec<Progress> {
        match self {
            VerifyRecord::Local(_) => {
                let saved: Saved = read_file(&b.config.data_dir, FILE);
                let progress = saved.progress.clone();
                b.verify.restore(saved);
                progress
            }
            VerifyRecord::Cluster(c) => {
                match pg::reported_since(c, i64::MIN).await {
                    Ok(all) => b.verify.already_reported(all.iter().map(Reported::key)),
                    Err(e) => warn(c, &e),
                }
                pg::load(c, 0)
                    .await
                    .map(|s| s.progress)
                    .unwrap_or_else(|e| {
                        warn(c, &e);
                        Vec::new()
                    })
            }
        }
    }

    /// Records the anomalies reported since the last call and, when given,
    /// this broker's progress. What could not be written is given back.
    pub async fn save(&self, b: &Broker, progress: Option<Vec<Progress>>) {
        let new = b.verify.take_unsaved();
        match self {
            VerifyRecord::Local(b) => {
                // progress at most every few seconds (a file and two
                // fsyncs each time); what was found at once
                let now = oncelog_log::now_ms();
                if progress.is_some() {
                    b.verify.unsaved_progress.store(true, Relaxed);
                }
                let moved = b.verify.unsaved_progress.load(Relaxed)
                    && now - b.verify.saved_ms.load(Relaxed) >= LOCAL_PROGRESS_EVERY_MS;
                if new.is_empty() && !moved {
                    return;
                }
                b.verify.saved_ms.store(now, Relaxed);
                b.verify.unsaved_progress.store(false, Relaxed);
                let data = match serde_json::to_vec(&b.verify.saved()) {
                    Ok(d) => d,
                    Err(e) => {
                        tracing::warn!(error = %e, "verify: the record does not serialize");
                        return;
                    }
                };
                if let Err(e) = write_file(&b.config.data_dir, FILE, &data) {
                    tracing::warn!(error = %e, "verify: the record could not be saved (it is saved again next round)");
                }
            }
            VerifyRecord::Cluster(c) => {
                if !new.is_empty() {
                    if let Err(e) = pg::add_anomalies(c, &new).await {
                        warn(c, &e);
                        b.verify.untake(new);
                    }
                }
                if let Some(p) = progress {
                    if let Err(e) = pg::save_progress(c, &p).await {
                        warn(c, &e);
                    }
                }
            }
        }
    }

    /// The record as `/v1/verify` shows it: every partition's progress (in
    /// a cluster, every broker's), the latest anomalies and the counts.
    pub async fn load(&self) -> Result<Saved, String> {
        match self {
            VerifyRecord::Local(b) => Ok(b.verify.saved()),
            VerifyRecord::Cluster(c) => pg::load(c, MAX_RECENT as i64)
                .await
                .map_err(|e| e.to_string()),
        }
    }

    /// Anomalies other brokers reported since `after_ms` (their keys), so
    /// a partition whose leader moved here is not reported again. Local
    /// mode: none.
    pub async fn reported_since(&self, after_ms: i64) -> Vec<Reported> {
        match self {
            VerifyRecord::Local(_) => Vec::new(),
            VerifyRecord::Cluster(c) => pg::reported_since(c, after_ms).await.unwrap_or_else(|e| {
                warn(c, &e);
                Vec::new()
            }),
        }
    }

    /// Forgets the progress of partitions of topics not in `topics` (in a
    /// cluster; local mode's record holds only what this broker verifies).
    pub async fn forget_topics_but(&self, topics: &[String]) {
        if let VerifyRecord::Cluster(c) = self {
            if let Err(e) = pg::forget_topics_but(c, topics).await {
                warn(c, &e);
            }
        }
    }
}

/// `/v1/verify` and the console's view of it: the record (every broker's
/// in a cluster) with this broker's business-key indexes.
pub async fn report(b: &Arc<Broker>, topic: Option<&str>) -> Result<serde_json::Value, String> {
    let record = b.verify_record();
    let cluster_wide = matches!(record, VerifyRecord::Cluster(_));
    let saved = record.load().await?;
    Ok(saved.to_json(topic, b.config.verify_enable, &b.verify, cluster_wide))
}

fn warn(cluster: &Cluster, e: &crate::backend::cluster::ClusterError) {
    if !cluster.outage.absorb(e) {
        tracing::warn!(error = %e, "verify: the cluster's verification record could not be read or written");
    }
}

/// A record file (`name` in `dir`) as written; the default when it is
/// missing, unreadable or does not parse (said in a warning: the record is
/// rebuilt, nothing else is lost).
pub fn read_file<T: serde::de::DeserializeOwned + Default>(dir: &std::path::Path, name: &str) -> T {
    let path = dir.join(name);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return T::default(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "verify: a record cannot be read; it is built again");
            return T::default();
        }
    };
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        tracing::warn!(path = %path.display(), error = %e, "verify: a record does not parse; it is built again");
        T::default()
    })
}

/// Replaces a record file (`name` in `dir`): a temporary file, fsync,
/// rename, fsync of the directory. A failure leaves the old record (or the
/// new one) whole; unlike the broker's own state, a record that may not
/// have reached the disk is only written again.
pub fn write_file(dir: &std::path::Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}
