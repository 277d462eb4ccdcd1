//! Expiry in cluster mode, as local mode does it: a transactional id idle
//! (no open transaction) past `transactional.id.expiration.ms` is
//! forgotten (its `transactions` row), and a partition forgets a producer
//! idle past `producer.id.expiration.ms` (its `producers` row), never one
//! with an open transaction. Both by PostgreSQL's clock for the id (its
//! `update_ms` is that clock's), by the batches' timestamps for producers
//! (as a local partition).
//!
//! Each delete re-checks its condition on the row it deletes: a decision
//! holding an id's row (`FOR UPDATE`) makes the delete wait and then see
//! the row as the decision left it, so an id that came back to life in
//! the meantime is kept; a produce that wrote the producer's row again
//! keeps it too. Run by one broker at a time (a leased job), safe twice.

use super::history;
use super::{Cluster, ClusterError};
use crate::observe::txn_history::{Event, EventKind, Note};

/// Forgets the transactional ids idle for `expiration_ms`; returns them.
pub async fn transactional_ids(
    cluster: &Cluster,
    expiration_ms: i64,
) -> Result<Vec<String>, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "DELETE FROM transactions \
             WHERE meta->>'state' IN ('Empty', 'CompleteCommit', 'CompleteAbort') \
               AND (meta->>'update_ms')::bigint \
                   < (extract(epoch from clock_timestamp()) * 1000)::bigint - $1 \
             RETURNING transactional_id, producer_id, (meta->>'epoch')::int, \
               (extract(epoch from clock_timestamp()) * 1000)::bigint",
            &[&expiration_ms],
        )
        .await?;
    let mut notes = Vec::with_capacity(rows.len());
    let mut ids = Vec::with_capacity(rows.len());
    for r in rows {
        let (id, pid, epoch, now): (String, i64, i32, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        tracing::info!(transactional_id = %id, producer_id = pid, "transactional id expired");
        let event = Event::new(now, EventKind::Expired, pid, epoch as i16);
        notes.push((id.clone(), Note::EventIfKnown { event }));
        ids.push(id);
    }
    if !notes.is_empty() {
        if let Err(e) = history::write(cluster, &notes).await {
            tracing::debug!(error = %e, "cluster: the expiries' history notes were not written");
        }
    }
    Ok(ids)
}

/// Makes the partitions forget producers whose last batch is older than
/// `cutoff_ms` and that have no open transaction; returns how many.
pub async fn producers(cluster: &Cluster, cutoff_ms: i64) -> Result<u64, ClusterError> {
    let client = cluster.pool.get().await?;
    let n = client
        .execute(
            "DELETE FROM producers WHERE txn_first_offset IS NULL \
               AND (entry->>'current_txn_first_offset') IS NULL \
               AND (entry->>'last_timestamp')::bigint < $1",
            &[&cutoff_ms],
        )
        .await?;
    if n > 0 {
        tracing::info!(producers = n, "cluster: idle producer ids expired");
    }
    Ok(n)
}
