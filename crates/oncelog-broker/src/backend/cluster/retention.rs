//! Time and size retention in cluster mode (the `retention` job): for each
//! partition of a topic whose `cleanup.policy` has `delete`, the log start
//! moves up past the oldest batches, as Kafka deletes its oldest segments:
//!
//! * `retention.ms`: batches are dropped from the start while their newest
//!   timestamp is older than now − `retention.ms` (the first younger batch
//!   stops it; a batch without a timestamp is never expired by time);
//! * `retention.bytes`: batches are dropped from the start while the bytes
//!   left after dropping them are at least `retention.bytes`.
//!
//! The log start never passes the last stable offset: an open
//! transaction's records stay until it is decided, so its markers and the
//! aborted index stay consistent. Each partition is one PostgreSQL
//! transaction under its row lock and the fencing token, through the same
//! step as DeleteRecords ([`super::records::advance`]); the objects go with
//! the collector once no batch row names them.

use uuid::Uuid;

use super::jobs::{self, JobSettings};
use super::session::check_fence;
use super::{Cluster, ClusterError};

/// One partition's retention limits; 0 or -1 is no limit (as in local mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub retention_ms: i64,
    pub retention_bytes: i64,
}

/// What a run removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RetentionReport {
    pub partitions_checked: usize,
    pub partitions_trimmed: usize,
    pub records_removed: i64,
}

/// One run over every topic.
pub async fn run(
    cluster: &Cluster,
    settings: &JobSettings,
    held: jobs::Held,
) -> Result<RetentionReport, ClusterError> {
    let mut report = RetentionReport::default();
    let now = jobs::database_now_ms(cluster).await?;
    super::expiry::producers(cluster, now - settings.producer_id_expiration_ms).await?;
    for t in jobs::topics(cluster).await? {
        if !settings.policy(&t).delete {
            continue;
        }
        if !held.still_held(cluster).await? {
            break;
        }
        let limits = Limits {
            retention_ms: settings.config_i64(&t, "retention.ms"),
            retention_bytes: settings.config_i64(&t, "retention.bytes"),
        };
        if limits.retention_ms <= 0 && limits.retention_bytes <= 0 {
            continue;
        }
        for p in 0..t.partitions {
            report.partitions_checked += 1;
            if let Some((from, to)) = retain(cluster, t.id, p, limits, now).await? {
                report.partitions_trimmed += 1;
                report.records_removed += to - from;
                tracing::info!(
                    partition = %format!("{}-{p}", t.name),
                    log_start_offset = to,
                    removed = to - from,
                    retention_ms = limits.retention_ms,
                    retention_bytes = limits.retention_bytes,
                    "cluster: retention moved the log start"
                );
            }
        }
    }
    Ok(report)
}

/// Applies `limits` to one partition at `now_ms`: `Some((old, new))` log
/// start if it moved.
pub async fn retain(
    cluster: &Cluster,
    topic_id: Uuid,
    partition: i32,
    limits: Limits,
    now_ms: i64,
) -> Result<Option<(i64, i64)>, ClusterError> {
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    check_fence(&*tx, cluster.config.broker_id, cluster.session.session()).await?;
    let Some(row) = tx
        .query_opt(
            "SELECT next_offset, log_start_offset, \
               (SELECT min(txn_first_offset) FROM producers \
                 WHERE topic_id = $1 AND partition = $2 AND txn_first_offset IS NOT NULL) \
             FROM partitions WHERE topic_id = $1 AND partition = $2 FOR UPDATE",
            &[&topic_id, &partition],
        )
        .await?
    else {
        return Ok(None);
    };
    let (hw, start): (i64, i64) = (row.get(0), row.get(1));
    let stable = row.get::<_, Option<i64>>(2).map_or(hw, |f| f.min(hw));
    let mut wanted = start;
    if limits.retention_ms > 0 {
        let cutoff = now_ms.saturating_sub(limits.retention_ms);
        let first_kept: Option<i64> = tx
            .query_one(
                "SELECT min(base_offset) FROM batches WHERE topic_id = $1 AND partition = $2 \
                   AND (max_timestamp >= $3 OR max_timestamp < 0)",
                &[&topic_id, &partition, &cutoff],
            )
            .await?
            .get(0);
        wanted = wanted.max(first_kept.unwrap_or(hw));
    }
    if limits.retention_bytes > 0 {
        // A batch is kept when the bytes after it are under the limit.
        let first_kept: Option<i64> = tx
            .query_one(
                "SELECT min(base_offset) FROM ( \
                   SELECT base_offset, length, \
                     sum(length) OVER (ORDER BY base_offset DESC) AS from_here \
                   FROM batches WHERE topic_id = $1 AND partition = $2) s \
                 WHERE from_here - length < $3",
                &[&topic_id, &partition, &limits.retention_bytes],
            )
            .await?
            .get(0);
        wanted = wanted.max(first_kept.unwrap_or(start));
    }
    let wanted = wanted.min(stable);
    if wanted <= start {
        return Ok(None);
    }
    super::records::advance(&tx, topic_id, partition, wanted).await?;
    tx.commit().await?;
    Ok(Some((start, wanted)))
}
