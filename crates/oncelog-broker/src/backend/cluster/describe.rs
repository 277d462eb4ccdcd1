//! Read-only views of the exactly-once state for the KIP-664 admin APIs in
//! cluster mode: producer state rows of partitions and the coordinator's
//! transactions rows, as the sequencer and the coordinator wrote them.

use std::collections::HashMap;

use uuid::Uuid;

use super::{Cluster, ClusterError};
use crate::machines::producer_state::ProducerEntry;
use crate::machines::txn_coordinator::TxnMeta;

/// The producers of each of `partitions` (a partition without any row has
/// none), read in one statement.
pub async fn producers(
    cluster: &Cluster,
    partitions: &[(Uuid, i32)],
) -> Result<HashMap<(Uuid, i32), Vec<(i64, ProducerEntry)>>, ClusterError> {
    let mut out: HashMap<(Uuid, i32), Vec<(i64, ProducerEntry)>> =
        partitions.iter().map(|k| (*k, Vec::new())).collect();
    if partitions.is_empty() {
        return Ok(out);
    }
    let topics: Vec<Uuid> = partitions.iter().map(|(t, _)| *t).collect();
    let parts: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "SELECT p.topic_id, p.partition, p.producer_id, p.entry \
             FROM producers p \
             JOIN unnest($1::uuid[], $2::int4[]) AS w(topic_id, partition) \
               ON p.topic_id = w.topic_id AND p.partition = w.partition",
            &[&topics, &parts],
        )
        .await?;
    for r in rows {
        let key: (Uuid, i32) = (r.get(0), r.get(1));
        let pid: i64 = r.get(2);
        let entry: serde_json::Value = r.get(3);
        let entry: ProducerEntry = serde_json::from_value(entry).map_err(|e| {
            ClusterError::Invariant(format!("producers row {}/{} {pid}: {e}", key.0, key.1))
        })?;
        out.entry(key).or_default().push((pid, entry));
    }
    Ok(out)
}

/// The coordinator's state of every id in `ids`, or of every id when `ids`
/// is `None`.
pub async fn transactions(
    cluster: &Cluster,
    ids: Option<&[String]>,
) -> Result<Vec<TxnMeta>, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = match ids {
        Some(ids) => {
            client
                .query(
                    "SELECT transactional_id, meta FROM transactions \
                     WHERE transactional_id = ANY($1)",
                    &[&ids],
                )
                .await?
        }
        None => {
            client
                .query("SELECT transactional_id, meta FROM transactions", &[])
                .await?
        }
    };
    rows.into_iter()
        .map(|r| {
            let id: String = r.get(0);
            serde_json::from_value(r.get(1))
                .map_err(|e| ClusterError::Invariant(format!("transactions row {id}: {e}")))
        })
        .collect()
}

/// PostgreSQL's clock in ms (the one transaction timeouts are measured by).
pub async fn now_ms(cluster: &Cluster) -> Result<i64, ClusterError> {
    let client = cluster.pool.get().await?;
    let r = client
        .query_one(
            "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await?;
    Ok(r.get(0))
}
