//! DeleteRecords in cluster mode: a partition's log start offset moves up in
//! one PostgreSQL transaction that also drops the batch-index and aborted-
//! index rows wholly below it. The objects those rows named are removed by
//! the collector only once no batch row names them (another partition's
//! batches may share an object), so a fetch that read the index a moment
//! before still finds its bytes.

use uuid::Uuid;

use super::session::check_fence;
use super::{Cluster, ClusterError};

/// Why a DeleteRecords offset was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Beyond the high watermark (or negative other than -1).
    OutOfRange { offset: i64, high_watermark: i64 },
    /// The partition is gone (its topic was deleted).
    Unknown,
}

/// Moves the log start of `topic_id`/`partition` to `offset` (-1: the high
/// watermark); returns the new log start (never lower than before).
pub async fn delete_records(
    cluster: &Cluster,
    topic_id: Uuid,
    partition: i32,
    offset: i64,
) -> Result<Result<i64, Refused>, ClusterError> {
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    check_fence(&*tx, cluster.config.broker_id, cluster.session.session()).await?;
    let Some(row) = tx
        .query_opt(
            "SELECT next_offset, log_start_offset FROM partitions \
             WHERE topic_id = $1 AND partition = $2 FOR UPDATE",
            &[&topic_id, &partition],
        )
        .await?
    else {
        return Ok(Err(Refused::Unknown));
    };
    let (hw, start): (i64, i64) = (row.get(0), row.get(1));
    let wanted = if offset == -1 { hw } else { offset };
    if wanted < 0 || wanted > hw {
        return Ok(Err(Refused::OutOfRange {
            offset: wanted,
            high_watermark: hw,
        }));
    }
    if wanted <= start {
        return Ok(Ok(start));
    }
    advance(&tx, topic_id, partition, wanted).await?;
    tx.commit().await?;
    Ok(Ok(wanted))
}

/// Sets a partition's log start to `to` (the caller holds its row lock and
/// checked `to` is above the current start and at most the high watermark)
/// and drops the batch-index and aborted-index rows wholly below it.
pub(super) async fn advance(
    tx: &tokio_postgres::Transaction<'_>,
    topic_id: Uuid,
    partition: i32,
    to: i64,
) -> Result<(), ClusterError> {
    tx.execute(
        "UPDATE partitions SET log_start_offset = $3 WHERE topic_id = $1 AND partition = $2",
        &[&topic_id, &partition, &to],
    )
    .await?;
    tx.execute(
        "DELETE FROM batches WHERE topic_id = $1 AND partition = $2 AND last_offset < $3",
        &[&topic_id, &partition, &to],
    )
    .await?;
    tx.execute(
        "DELETE FROM aborted_txns WHERE topic_id = $1 AND partition = $2 AND last_offset < $3",
        &[&topic_id, &partition, &to],
    )
    .await?;
    Ok(())
}
