//! Removes objects that no committed row can ever name:
//!
//! * an object whose intent is older than the grace period and was never
//!   committed: the collector deletes the intent first (in PostgreSQL), so
//!   a late commit of that object finds no intent and fails;
//! * an object with neither an intent nor an `objects` row (its intent was
//!   collected before and the delete did not happen);
//! * a committed object that no batch row names any more (its topic was
//!   deleted, retention or compaction removed its batches), once it has
//!   been so for the grace period: the first pass that finds it marks it
//!   (`unreferenced_since`), a pass after the grace removes its `objects`
//!   row, and only when no batch row names it (the foreign key refuses
//!   otherwise). A fetch that read the index just before the commit that
//!   dropped the object's batches still finds the object.
//!
//! Every decision is taken from one snapshot read after the listing, so an
//! object listed is either still an intent (left alone inside the grace
//! period) or committed: the collector is safe to run on several brokers at
//! once, and twice.

use std::time::Duration;

use super::{Cluster, ClusterError};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CollectReport {
    pub listed: usize,
    pub kept: usize,
    /// Intents, and objects no batch names, still inside the grace period.
    pub waiting: usize,
    pub removed_uncommitted: usize,
    pub removed_unreferenced: usize,
}

/// One pass over the object store.
pub async fn collect(cluster: &Cluster, grace: Duration) -> Result<CollectReport, ClusterError> {
    let keys = cluster.objects.list_data().await?;
    let mut report = CollectReport {
        listed: keys.len(),
        ..CollectReport::default()
    };
    if keys.is_empty() {
        return Ok(report);
    }
    let grace_ms = grace.as_millis() as f64;
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "SELECT k, \
               EXISTS (SELECT 1 FROM objects o WHERE o.key = k), \
               EXISTS (SELECT 1 FROM batches b WHERE b.object_key = k), \
               (SELECT i.created_at < clock_timestamp() - $2 * interval '1 millisecond' \
                  FROM object_intents i WHERE i.key = k) \
             FROM unnest($1::text[]) AS k",
            &[&keys, &grace_ms],
        )
        .await?;
    for r in rows {
        let key: String = r.get(0);
        let committed: bool = r.get(1);
        let referenced: bool = r.get(2);
        let intent_old: Option<bool> = r.get(3);
        let remove = match (committed, referenced, intent_old) {
            (true, true, _) => {
                report.kept += 1;
                false
            }
            (true, false, _) => {
                client
                    .execute(
                        "UPDATE objects SET unreferenced_since = clock_timestamp() \
                         WHERE key = $1 AND unreferenced_since IS NULL AND NOT EXISTS \
                           (SELECT 1 FROM batches WHERE object_key = $1)",
                        &[&key],
                    )
                    .await?;
                let n = client
                    .execute(
                        "DELETE FROM objects WHERE key = $1 \
                           AND unreferenced_since <= clock_timestamp() - $2 * interval '1 millisecond' \
                           AND NOT EXISTS (SELECT 1 FROM batches WHERE object_key = $1)",
                        &[&key, &grace_ms],
                    )
                    .await?;
                if n == 1 {
                    report.removed_unreferenced += 1;
                } else {
                    report.waiting += 1;
                }
                n == 1
            }
            (false, _, Some(false)) => {
                report.waiting += 1;
                false
            }
            (false, _, Some(true)) => {
                let n = client
                    .execute(
                        "DELETE FROM object_intents WHERE key = $1 \
                           AND created_at < clock_timestamp() - $2 * interval '1 millisecond'",
                        &[&key, &grace_ms],
                    )
                    .await?;
                if n == 1 {
                    report.removed_uncommitted += 1;
                }
                n == 1
            }
            (false, _, None) => {
                report.removed_uncommitted += 1;
                true
            }
        };
        if remove {
            cluster.objects.delete(&key).await?;
        }
    }
    Ok(report)
}
