//! Removes objects that no committed row can ever name, going by
//! PostgreSQL's rows alone (the bucket is never listed):
//!
//! * objects written and never committed: every key is reserved in an
//!   `object_slabs` row before its PUT; a slab no commit can use any more is
//!   collected with its uncommitted keys ([`super::keys::collect_slabs`]);
//! * a committed object that no batch row names any more (its topic was
//!   deleted, retention or compaction removed its batches), once it has
//!   been so for the grace period: the first pass that finds it marks it
//!   (`unreferenced_since`); a pass after the grace deletes it from the
//!   store, then its `objects` row (only when still no batch row names it:
//!   a crash between the two leaves the row, and the next pass deletes
//!   again). A fetch that read the index just before the commit that
//!   dropped the object's batches still finds the object;
//! * the per-object intents of earlier versions, left from before an
//!   upgrade: an intent older than the grace period is deleted (a late
//!   commit of it then fails), then its object if it was never committed.
//!
//! Every step may run on several brokers at once, and twice.

use std::time::Duration;

use super::keys::collect_slabs;
use super::{Cluster, ClusterError};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CollectReport {
    /// Key slabs still in use or inside the grace period, and objects no
    /// batch names still inside it.
    pub waiting: usize,
    /// Key slabs collected.
    pub slabs: usize,
    /// Keys of collected slabs (and earlier versions' intents) that no
    /// commit named, deleted from the store.
    pub removed_uncommitted: usize,
    pub removed_unreferenced: usize,
}

/// One pass.
pub async fn collect(cluster: &Cluster, grace: Duration) -> Result<CollectReport, ClusterError> {
    let slabs = collect_slabs(&cluster.pool, &cluster.objects, grace).await?;
    let mut report = CollectReport {
        waiting: slabs.waiting,
        slabs: slabs.collected,
        removed_uncommitted: slabs.uncommitted_keys,
        ..CollectReport::default()
    };
    let grace_ms = grace.as_millis() as f64;
    let client = cluster.pool.get().await?;

    // Earlier versions' intents.
    let old = client
        .query(
            "DELETE FROM object_intents \
             WHERE created_at < clock_timestamp() - $1 * interval '1 millisecond' \
             RETURNING key, EXISTS (SELECT 1 FROM objects o WHERE o.key = object_intents.key)",
            &[&grace_ms],
        )
        .await?;
    for r in old {
        if !r.get::<_, bool>(1) {
            cluster.objects.delete(r.get::<_, &str>(0)).await?;
            report.removed_uncommitted += 1;
        }
    }

    // Committed objects no batch names: marked on the first pass that finds
    // them, removed on one after the grace.
    client
        .execute(
            "UPDATE objects o SET unreferenced_since = clock_timestamp() \
             WHERE unreferenced_since IS NULL \
               AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.object_key = o.key)",
            &[],
        )
        .await?;
    let due = client
        .query(
            "SELECT key, unreferenced_since <= clock_timestamp() - $1 * interval '1 millisecond' \
             FROM objects o WHERE unreferenced_since IS NOT NULL \
               AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.object_key = o.key)",
            &[&grace_ms],
        )
        .await?;
    let mut gone: Vec<String> = Vec::new();
    for r in due {
        let key: String = r.get(0);
        if r.get::<_, bool>(1) {
            cluster.objects.delete(&key).await?;
            gone.push(key);
        } else {
            report.waiting += 1;
        }
    }
    if !gone.is_empty() {
        let n = client
            .execute(
                "DELETE FROM objects o WHERE key = ANY($1::text[]) \
                   AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.object_key = o.key)",
                &[&gone],
            )
            .await?;
        report.removed_unreferenced += n as usize;
    }
    Ok(report)
}
