//! The transaction history in cluster mode: each broker's notes
//! ([`Note`]) are rows of `txn_history`, written in batches by one task per
//! broker, and an id's history is those rows replayed in the order of
//! their times, so every broker answers alike and a restart loses nothing. The rows are bounded:
//! an id keeps its latest [`KEEP_PER_ID`] notes, and none older than
//! [`KEEP_FOR`].
//!
//! The history is for operators: a note is written after the decision it
//! describes commits, and one that cannot be written (PostgreSQL away, the
//! queue full) is dropped with a log line, never retried into a decision's
//! way.

use std::sync::Arc;
use std::time::Duration;

use super::{Cluster, ClusterError};
use crate::coordinators::txn_service::HistoryJournal;
use crate::observe::txn_history::{Note, TxnHistory};

/// Notes waiting to be written, at most.
const QUEUE: usize = 8192;
/// Notes written in one statement, at most.
const BATCH: usize = 512;
/// Notes kept per transactional id (more than a replay shows: the history
/// folds repeats and bounds each list).
pub const KEEP_PER_ID: i64 = 256;
/// How long a note is kept.
pub const KEEP_FOR: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often the rows are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Starts this broker's writer; returns where its notes go.
pub fn start(cluster: Arc<Cluster>) -> HistoryJournal {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, Note)>(QUEUE);
    tokio::spawn(async move {
        let mut pruned = tokio::time::Instant::now();
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(n) => batch.push(n),
                    Err(_) => break,
                }
            }
            if let Err(e) = write(&cluster, &batch).await {
                crate::backend::cluster::outage::cluster_warn!(cluster.outage, e, notes = batch.len(), error = %e,
                    "cluster: transaction history notes not written (dropped)");
            }
            if pruned.elapsed() >= PRUNE_EVERY {
                pruned = tokio::time::Instant::now();
                if let Err(e) = prune(&cluster).await {
                    tracing::debug!(error = %e, "cluster: pruning the transaction history failed; it runs again");
                }
            }
        }
    });
    tx
}

/// Writes notes now (in order).
pub async fn write(cluster: &Cluster, batch: &[(String, Note)]) -> Result<(), ClusterError> {
    let ids: Vec<&str> = batch.iter().map(|(id, _)| id.as_str()).collect();
    let notes: Vec<serde_json::Value> = batch
        .iter()
        .map(|(_, n)| serde_json::to_value(n))
        .collect::<Result<_, _>>()
        .map_err(|e| ClusterError::Invariant(format!("a history note: {e}")))?;
    let client = cluster.pool.get().await?;
    client
        .execute(
            "INSERT INTO txn_history (transactional_id, note, broker_id) \
             SELECT id, note, $3 FROM unnest($1::text[], $2::jsonb[]) WITH ORDINALITY \
               AS n(id, note, i) ORDER BY i",
            &[&ids, &notes, &cluster.config.broker_id],
        )
        .await?;
    Ok(())
}

/// Removes notes past [`KEEP_FOR`], and each id's beyond its latest
/// [`KEEP_PER_ID`]. Any broker may run it at any time.
async fn prune(cluster: &Cluster) -> Result<(), ClusterError> {
    let client = cluster.pool.get().await?;
    let secs = KEEP_FOR.as_secs() as f64;
    client
        .execute(
            "DELETE FROM txn_history WHERE noted_at < clock_timestamp() - make_interval(secs => $1)",
            &[&secs],
        )
        .await?;
    client
        .execute(
            "DELETE FROM txn_history t USING ( \
               SELECT transactional_id, max(seq) AS top FROM txn_history \
               GROUP BY transactional_id HAVING count(*) > $1) x \
             WHERE t.transactional_id = x.transactional_id AND t.seq <= x.top - $1",
            &[&KEEP_PER_ID],
        )
        .await?;
    Ok(())
}

/// What the cluster's history covers: since its oldest note kept (the
/// same answer through every broker), or now when there is none.
async fn oldest_ms(client: &deadpool_postgres::Client) -> Result<i64, ClusterError> {
    Ok(client
        .query_one(
            "SELECT coalesce((SELECT (extract(epoch from noted_at) * 1000)::bigint \
               FROM txn_history ORDER BY seq LIMIT 1), \
               (extract(epoch from clock_timestamp()) * 1000)::bigint)",
            &[],
        )
        .await?
        .get(0))
}

/// `id`'s history, replayed from its notes (the answer of
/// `GET /v1/transactions/<id>/history`).
pub async fn read(cluster: &Cluster, id: &str) -> Result<serde_json::Value, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "SELECT note FROM txn_history WHERE transactional_id = $1 ORDER BY seq",
            &[&id],
        )
        .await?;
    let since = oldest_ms(&client).await?;
    let mut notes = rows
        .into_iter()
        .map(|r| {
            serde_json::from_value::<Note>(r.get(0))
                .map_err(|e| ClusterError::Invariant(format!("a txn_history row of {id}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // In the order they happened: brokers write their notes each on its
    // own, a moment after the event (a refused write noted by one broker
    // may reach the table before the fence another broker noted first).
    // The sort is stable, so notes of one instant keep the table's order.
    notes.sort_by_key(Note::time_ms);
    let mut h = TxnHistory::with_capacity(since, 1);
    for note in notes {
        h.apply(id, note);
    }
    let mut v = h.to_json(id);
    if let Some(o) = v.as_object_mut() {
        o.insert("persisted".into(), serde_json::Value::Bool(true));
    }
    Ok(v)
}

/// Every id's notes since `since_ms` replayed in time order (the console's
/// timeline: at most a day of them), and since when the cluster's history
/// covers (its oldest note kept, as [`read`]).
pub async fn read_since(cluster: &Cluster, since_ms: i64) -> Result<TxnHistory, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "SELECT transactional_id, note FROM txn_history \
             WHERE noted_at >= to_timestamp($1::float8 / 1000) ORDER BY seq",
            &[&(since_ms as f64)],
        )
        .await?;
    let oldest = oldest_ms(&client).await?;
    let mut notes = rows
        .into_iter()
        .map(|r| {
            let id: String = r.get(0);
            serde_json::from_value::<Note>(r.get(1))
                .map(|n| (id, n))
                .map_err(|e| ClusterError::Invariant(format!("a txn_history row: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    notes.sort_by_key(|(_, n)| n.time_ms());
    let ids = notes
        .iter()
        .map(|(id, _)| id.as_str())
        .collect::<std::collections::HashSet<_>>()
        .len();
    let mut h = TxnHistory::with_capacity(oldest, ids.max(1));
    for (id, note) in notes {
        h.apply(&id, note);
    }
    Ok(h)
}
