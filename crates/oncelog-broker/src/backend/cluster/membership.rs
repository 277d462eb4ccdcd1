//! Each group as its coordinator last saw it (its state at every step of
//! a rebalance, its members and assignments): rows of `group_membership`,
//! so that the console of any broker shows them. The coordinator's
//! memory stays the truth (a group's new owner starts its membership
//! afresh); a row is written a moment after the change, and a queue that
//! is full drops it until the group's next change.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Cluster, ClusterError};
use crate::coordinators::groups::{GroupSnapshot, SnapshotJournal};

const QUEUE: usize = 4096;

/// Starts the writer; the journal to give [`crate::coordinators::groups::Groups::journal_to`].
pub fn start(cluster: Arc<Cluster>) -> SnapshotJournal {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, GroupSnapshot)>(QUEUE);
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            // the latest of each group in what is queued
            let mut latest: HashMap<String, GroupSnapshot> = HashMap::new();
            latest.insert(first.0, first.1);
            while let Ok((g, s)) = rx.try_recv() {
                latest.insert(g, s);
            }
            if let Err(e) = write(&cluster, &latest).await {
                crate::backend::cluster::outage::cluster_warn!(cluster.outage, e, groups = latest.len(), error = %e,
                    "cluster: group membership not written (the console shows the previous one)");
            }
        }
    });
    tx
}

async fn write(
    cluster: &Cluster,
    latest: &HashMap<String, GroupSnapshot>,
) -> Result<(), ClusterError> {
    let groups: Vec<&str> = latest.keys().map(String::as_str).collect();
    let snapshots: Vec<serde_json::Value> = latest
        .values()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()
        .map_err(|e| ClusterError::Invariant(format!("a group snapshot: {e}")))?;
    let client = cluster.pool.get().await?;
    client
        .execute(
            "INSERT INTO group_membership (group_id, broker_id, snapshot) \
             SELECT g, $3, s FROM unnest($1::text[], $2::jsonb[]) AS n(g, s) \
             ON CONFLICT (group_id) DO UPDATE SET broker_id = EXCLUDED.broker_id, \
               snapshot = EXCLUDED.snapshot, changed_at = clock_timestamp()",
            &[&groups, &snapshots, &cluster.config.broker_id],
        )
        .await?;
    Ok(())
}

/// Every group as its coordinator last wrote it.
pub async fn all(cluster: &Cluster) -> Result<HashMap<String, GroupSnapshot>, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = client
        .query("SELECT group_id, snapshot FROM group_membership", &[])
        .await?;
    rows.into_iter()
        .map(|r| {
            let g: String = r.get(0);
            serde_json::from_value::<GroupSnapshot>(r.get(1))
                .map(|s| (g, s))
                .map_err(|e| ClusterError::Invariant(format!("a group_membership row: {e}")))
        })
        .collect()
}

/// The offsets committed in open transactions of `group`: (producer id,
/// topic, partition, offset), sorted.
pub async fn pending(
    cluster: &Cluster,
    group: &str,
) -> Result<Vec<(i64, String, i32, i64)>, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "SELECT producer_id, topic, partition, offset_value FROM group_pending_offsets \
             WHERE group_id = $1 ORDER BY producer_id, topic, partition",
            &[&group],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect())
}
