//! Compaction in cluster mode (the `compaction` job): the same pass as
//! local mode's cleaner ([`oncelog_log::cleaner::Pass`], Kafka's rules for
//! keys, tombstones, aborted transactions and markers), fed from the batch
//! index and the objects instead of segment files.
//!
//! A partition of a topic whose `cleanup.policy` has `compact` is cleanable
//! up to its last stable offset, and up to the first batch younger than
//! `min.compaction.lag.ms`; `compaction_state.first_dirty` is where the
//! last pass ended. A pass runs when the dirty share of the cleanable bytes
//! reaches `min.cleanable.dirty.ratio`, or when dirty batches are older
//! than `max.compaction.lag.ms`.
//!
//! 1. **Map**: every dirty batch's keys go into the offset map, in offset
//!    order, until it is full (the rest stays dirty).
//! 2. **Copy**, chunk by chunk from the log start to where the map ended:
//!    each batch is kept as it is (its row is untouched), dropped (its row
//!    goes), or rebuilt with fewer records. Rebuilt batches are written to
//!    one new object per chunk (under a reserved key, as the flusher's), then
//!    one PostgreSQL transaction, under the fencing token and the
//!    partition's row lock, checks that every row it changes is still the
//!    row it read (same object, same position), points the rebuilt rows at
//!    the new object, deletes the dropped rows and the aborted-index rows
//!    of removed ABORT markers, and claims the object's key slab. If any row
//!    changed (DeleteRecords, retention, another pass) the chunk commits
//!    nothing and the pass ends; the next one starts over.
//!
//! Offsets never change: a rebuilt batch keeps its base offset and last
//! offset delta, so consumers read a log with gaps, as from Kafka. Old
//! objects go with the collector once no row names them. A batch is past
//! the tombstone and marker horizon when its object was committed more than
//! `delete.retention.ms` ago (local mode uses its segment's modification
//! time; never the client's timestamps, which may be anything). The last batch of a producer
//! is not kept for its sequence numbers as local mode does: producer state
//! lives in the `producers` rows, not in the log.

use std::collections::HashMap;
use std::path::Path;

use bytes::{Bytes, BytesMut};
use oncelog_log::batch;
use oncelog_log::cleaner::{CleanStats, Pass, TxnFacts};
use uuid::Uuid;

use super::catalogue::TopicRow;
use super::jobs::{self, JobSettings};
use super::reader::{load_objects, Stored, STORED_COLUMNS};
use super::session::check_fence;
use super::{Cluster, ClusterError};

/// Batch rows read (and objects loaded) at a time.
pub(super) const CHUNK_ROWS: i64 = 500;

/// A compacted topic's settings.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub min_cleanable_ratio: f64,
    pub delete_retention_ms: i64,
    pub min_compaction_lag_ms: i64,
    pub max_compaction_lag_ms: i64,
    pub map_entries: usize,
}

/// One run over every compacted topic.
pub async fn run(
    cluster: &Cluster,
    settings: &JobSettings,
    held: jobs::Held,
) -> Result<usize, ClusterError> {
    let mut passes = 0;
    for t in jobs::topics(cluster).await? {
        if !settings.policy(&t).compact {
            continue;
        }
        if !held.still_held(cluster).await? {
            break;
        }
        let s = Settings {
            min_cleanable_ratio: settings.config_f64(&t, "min.cleanable.dirty.ratio"),
            delete_retention_ms: settings.config_i64(&t, "delete.retention.ms").max(0),
            min_compaction_lag_ms: settings.config_i64(&t, "min.compaction.lag.ms").max(0),
            max_compaction_lag_ms: settings.config_i64(&t, "max.compaction.lag.ms"),
            map_entries: settings.map_entries,
        };
        for p in 0..t.partitions {
            let now = super::jobs::database_now_ms(cluster).await?;
            match compact(cluster, &t, p, s, now).await {
                Ok(Some(stats)) => {
                    passes += 1;
                    tracing::info!(
                        partition = %format!("{}-{p}", t.name),
                        records_read = stats.records_read,
                        records_kept = stats.records_kept,
                        aborted_records_removed = stats.aborted_records_removed,
                        tombstones_removed = stats.tombstones_removed,
                        markers_removed = stats.markers_removed,
                        first_dirty = stats.map_end,
                        "cluster: compacted"
                    );
                }
                Ok(None) => {}
                Err(e) => {
                    crate::backend::cluster::outage::cluster_warn!(cluster.outage, e, partition = %format!("{}-{p}", t.name), error = %e,
                    "cluster: a compaction pass failed; it runs again")
                }
            }
        }
    }
    Ok(passes)
}

/// Where a partition stands for compaction.
struct Extent {
    log_start: i64,
    first_dirty: i64,
    /// The cleanable end (exclusive): batches ending below it are cleanable.
    end: i64,
}

async fn extent(
    cluster: &Cluster,
    topic_id: Uuid,
    partition: i32,
    s: Settings,
    now_ms: i64,
) -> Result<Option<(Extent, i64, i64, Option<i64>)>, ClusterError> {
    let client = cluster.pool.get().await?;
    let Some(row) = client
        .query_opt(
            "SELECT p.log_start_offset, p.next_offset, \
               (SELECT min(txn_first_offset) FROM producers r \
                 WHERE r.topic_id = $1 AND r.partition = $2 AND r.txn_first_offset IS NOT NULL), \
               c.first_dirty \
             FROM partitions p LEFT JOIN compaction_state c USING (topic_id, partition) \
             WHERE p.topic_id = $1 AND p.partition = $2",
            &[&topic_id, &partition],
        )
        .await?
    else {
        return Ok(None);
    };
    let (log_start, hw): (i64, i64) = (row.get(0), row.get(1));
    let stable = row.get::<_, Option<i64>>(2).map_or(hw, |f| f.min(hw));
    let first_dirty = row.get::<_, Option<i64>>(3).unwrap_or(0).max(log_start);
    // Not younger than the compaction lag.
    let young: Option<i64> = client
        .query_one(
            "SELECT min(base_offset) FROM batches WHERE topic_id = $1 AND partition = $2 \
               AND last_offset >= $3 AND max_timestamp > $4",
            &[
                &topic_id,
                &partition,
                &first_dirty,
                &now_ms.saturating_sub(s.min_compaction_lag_ms),
            ],
        )
        .await?
        .get(0);
    let end = young.map_or(stable, |y| y.min(stable));
    let sizes = client
        .query_one(
            "SELECT coalesce(sum(length) FILTER (WHERE base_offset < $3), 0)::bigint, \
               coalesce(sum(length) FILTER (WHERE last_offset >= $3), 0)::bigint, \
               min(max_timestamp) FILTER (WHERE last_offset >= $3 AND max_timestamp >= 0) \
             FROM batches WHERE topic_id = $1 AND partition = $2 AND last_offset < $4",
            &[&topic_id, &partition, &first_dirty, &end],
        )
        .await?;
    Ok(Some((
        Extent {
            log_start,
            first_dirty,
            end,
        },
        sizes.get(0),
        sizes.get(1),
        sizes.get(2),
    )))
}

/// One pass over a partition, if it is due: what it did.
pub async fn compact(
    cluster: &Cluster,
    t: &TopicRow,
    partition: i32,
    s: Settings,
    now_ms: i64,
) -> Result<Option<CleanStats>, ClusterError> {
    let Some((ext, clean_bytes, dirty_bytes, oldest_dirty)) =
        extent(cluster, t.id, partition, s, now_ms).await?
    else {
        return Ok(None);
    };
    if dirty_bytes == 0 {
        return Ok(None);
    }
    let ratio = dirty_bytes as f64 / (clean_bytes + dirty_bytes) as f64;
    let overdue = s.max_compaction_lag_ms > 0
        && oldest_dirty.is_some_and(|ts| ts <= now_ms.saturating_sub(s.max_compaction_lag_ms));
    if ratio < s.min_cleanable_ratio && !overdue {
        return Ok(None);
    }
    let txn = txn_facts(cluster, t.id, partition, ext.end).await?;
    let mut pass = Pass::new(txn, ext.first_dirty, s.map_entries);
    let origin = format!("{}-{partition}", t.name);
    let origin = Path::new(&origin);

    // 1. The offset map over the dirty batches.
    let horizon = Horizon {
        delete_retention_ms: s.delete_retention_ms,
        horizon_ms: now_ms.saturating_sub(s.delete_retention_ms),
    };
    let mut map_end = ext.end;
    let mut from = ext.first_dirty;
    'map: loop {
        let rows = page(cluster, t.id, partition, from, ext.end, horizon).await?;
        let Some(last) = rows.last() else { break };
        from = last.0.last_offset + 1;
        let objects = load_objects(cluster, &stored(&rows)).await?;
        for (row, _) in &rows {
            let b = patched(row, &objects)?;
            pass.stats.bytes_read += b.len() as u64;
            if let Some(stop) = pass.map_batch(&b, origin).map_err(log_err)? {
                map_end = stop;
                break 'map;
            }
        }
    }
    pass.stats.map_end = map_end;
    pass.stats.keys_in_map = pass.keys();

    // 2. The copy, from the log start to where the map ended.
    let mut from = ext.log_start;
    loop {
        let rows = page(cluster, t.id, partition, from, map_end, horizon).await?;
        let rows: Vec<_> = rows
            .into_iter()
            .filter(|(r, _)| r.base_offset < map_end)
            .collect();
        let Some(last) = rows.last() else { break };
        from = last.0.last_offset + 1;
        let objects = load_objects(cluster, &stored(&rows)).await?;
        let mut changes = Chunk::default();
        let aborts_before = pass.removed_aborts.len();
        for (row, past_horizon) in &rows {
            let b = patched(row, &objects)?;
            pass.stats.bytes_read += b.len() as u64;
            match pass
                .copy_batch(&b, origin, *past_horizon)
                .map_err(log_err)?
            {
                Some(out) if out == b => {}
                Some(out) => changes.rebuilt.push((row, out)),
                None => changes.dropped.push(row),
            }
        }
        changes.removed_aborts = pass.removed_aborts[aborts_before..].to_vec();
        if changes.is_empty() {
            continue;
        }
        pass.stats.bytes_written += changes
            .rebuilt
            .iter()
            .map(|(_, b)| b.len() as u64)
            .sum::<u64>();
        if !apply(cluster, t.id, partition, changes, false).await? {
            tracing::info!(partition = %origin.display(),
                "cluster: compaction stopped: batches changed under it (retention, DeleteRecords or another pass); the next pass starts over");
            return Ok(None);
        }
    }
    record_pass(cluster, t.id, partition, &pass.stats).await?;
    Ok(Some(pass.stats))
}

/// The aborted transactions below `end` (the producers' last batches are
/// not needed: see the module's note).
async fn txn_facts(
    cluster: &Cluster,
    topic_id: Uuid,
    partition: i32,
    end: i64,
) -> Result<TxnFacts, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "SELECT producer_id, first_offset, last_offset FROM aborted_txns \
             WHERE topic_id = $1 AND partition = $2 AND first_offset < $3",
            &[&topic_id, &partition, &end],
        )
        .await?;
    Ok(oncelog_log::cleaner::txn_facts(
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))),
        std::iter::empty(),
    ))
}

/// Up to [`CHUNK_ROWS`] batch rows ending at or after `from` and before
/// `end`, in offset order, each with whether it is past the delete
/// horizon: its object was committed more than `delete_retention_ms` ago
/// by PostgreSQL's clock (a rebuilt batch dates from its new object, as
/// Kafka dates the horizon from a cleaning), or, for a marker (inline, no
/// object), its timestamp, which the coordinator set, is older than `horizon_ms`.
async fn page(
    cluster: &Cluster,
    topic_id: Uuid,
    partition: i32,
    from: i64,
    end: i64,
    horizon: Horizon,
) -> Result<Vec<(Stored, bool)>, ClusterError> {
    let client = cluster.pool.get().await?;
    let retention_ms = horizon.delete_retention_ms as f64;
    let rows = client
        .query(
            &format!(
                "SELECT {STORED_COLUMNS}, CASE WHEN o.created_at IS NULL \
                   THEN b.max_timestamp <= $6 \
                   ELSE o.created_at <= clock_timestamp() - $7 * interval '1 millisecond' END \
                 FROM batches b LEFT JOIN objects o ON o.key = b.object_key \
                 WHERE b.topic_id = $1 AND b.partition = $2 AND b.last_offset >= $3 \
                   AND b.last_offset < $4 ORDER BY b.base_offset LIMIT $5"
            ),
            &[
                &topic_id,
                &partition,
                &from,
                &end,
                &CHUNK_ROWS,
                &horizon.horizon_ms,
                &retention_ms,
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (Stored::from_row(r), r.get(7)))
        .collect())
}

#[derive(Debug, Clone, Copy)]
struct Horizon {
    delete_retention_ms: i64,
    /// now − `delete.retention.ms` by this broker's clock (for markers).
    horizon_ms: i64,
}

fn stored(rows: &[(Stored, bool)]) -> Vec<Stored> {
    rows.iter()
        .map(|(r, _)| Stored {
            base_offset: r.base_offset,
            last_offset: r.last_offset,
            key: r.key.clone(),
            position: r.position,
            length: r.length,
            inline: None,
            object_size: r.object_size,
        })
        .collect()
}

/// A batch's bytes with its base offset written in (the cleaner reads
/// offsets from the batch).
pub(super) fn patched(
    row: &Stored,
    objects: &HashMap<String, Bytes>,
) -> Result<Vec<u8>, ClusterError> {
    let mut b = row.bytes(objects)?.to_vec();
    batch::validate(&b).map_err(|e| {
        ClusterError::Invariant(format!(
            "stored batch at offset {} does not validate: {e}",
            row.base_offset
        ))
    })?;
    batch::set_base_offset(&mut b, row.base_offset);
    Ok(b)
}

fn log_err(e: oncelog_log::LogError) -> ClusterError {
    ClusterError::Invariant(format!("compaction: {e}"))
}

#[derive(Default)]
pub(super) struct Chunk<'a> {
    pub rebuilt: Vec<(&'a Stored, Vec<u8>)>,
    pub dropped: Vec<&'a Stored>,
    pub removed_aborts: Vec<(i64, i64)>,
}

impl Chunk<'_> {
    fn is_empty(&self) -> bool {
        self.rebuilt.is_empty() && self.dropped.is_empty()
    }
}

/// Writes a chunk's rebuilt batches to a new object and swaps the rows in
/// one transaction; false (nothing changed) if any row is not as read.
/// `merged`: the object is a merge of small ones ([`super::merger`]).
pub(super) async fn apply(
    cluster: &Cluster,
    topic_id: Uuid,
    partition: i32,
    c: Chunk<'_>,
    merged: bool,
) -> Result<bool, ClusterError> {
    let session = cluster.session.session();
    let broker = cluster.config.broker_id;
    let mut object = None;
    if !c.rebuilt.is_empty() {
        let key = cluster.keys.next(&cluster.pool, session).await?;
        let mut buf = BytesMut::new();
        let mut at = Vec::with_capacity(c.rebuilt.len());
        for (_, b) in &c.rebuilt {
            at.push((buf.len() as i64, b.len() as i32));
            buf.extend_from_slice(b);
        }
        let data = buf.freeze();
        let size = data.len() as i64;
        cluster.objects.put(&key.key, data).await?;
        object = Some((key, size, at));
    }
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    check_fence(&*tx, broker, session).await?;
    if tx
        .query_opt(
            "SELECT 1 FROM partitions WHERE topic_id = $1 AND partition = $2 FOR UPDATE",
            &[&topic_id, &partition],
        )
        .await?
        .is_none()
    {
        return Ok(false);
    }
    let changed: Vec<&Stored> = c
        .rebuilt
        .iter()
        .map(|(r, _)| *r)
        .chain(c.dropped.iter().copied())
        .collect();
    let bases: Vec<i64> = changed.iter().map(|r| r.base_offset).collect();
    let keys: Vec<Option<String>> = changed.iter().map(|r| r.key.clone()).collect();
    let positions: Vec<i64> = changed.iter().map(|r| r.position as i64).collect();
    let same: i64 = tx
        .query_one(
            "SELECT count(*) FROM batches b \
               JOIN unnest($3::bigint[], $4::text[], $5::bigint[]) AS u(base, key, pos) \
                 ON b.base_offset = u.base AND b.object_key IS NOT DISTINCT FROM u.key \
                AND b.position = u.pos \
             WHERE b.topic_id = $1 AND b.partition = $2",
            &[&topic_id, &partition, &bases, &keys, &positions],
        )
        .await?
        .get(0);
    if same != changed.len() as i64 {
        return Ok(false);
    }
    if let Some((object, size, at)) = &object {
        let key = &object.key;
        let claimed = tx
            .query_opt(
                super::keys::CLAIM_SQL,
                &[&object.broker_id, &object.session, &object.seq],
            )
            .await?;
        if claimed.is_none() {
            return Err(ClusterError::IntentGone(key.clone()));
        }
        tx.execute(
            "INSERT INTO objects (key, size, broker_id, merged) VALUES ($1, $2, $3, $4)",
            &[key, size, &broker, &merged],
        )
        .await?;
        let rb: Vec<i64> = c.rebuilt.iter().map(|(r, _)| r.base_offset).collect();
        let (pos, len): (Vec<i64>, Vec<i32>) = at.iter().copied().unzip();
        tx.execute(
            "UPDATE batches b SET object_key = $3, position = u.pos, length = u.len, \
               inline_data = NULL \
             FROM unnest($4::bigint[], $5::bigint[], $6::int[]) AS u(base, pos, len) \
             WHERE b.topic_id = $1 AND b.partition = $2 AND b.base_offset = u.base",
            &[&topic_id, &partition, key, &rb, &pos, &len],
        )
        .await?;
    }
    if !c.dropped.is_empty() {
        let db: Vec<i64> = c.dropped.iter().map(|r| r.base_offset).collect();
        tx.execute(
            "DELETE FROM batches WHERE topic_id = $1 AND partition = $2 \
               AND base_offset = ANY($3::bigint[])",
            &[&topic_id, &partition, &db],
        )
        .await?;
    }
    if !c.removed_aborts.is_empty() {
        let (pids, markers): (Vec<i64>, Vec<i64>) = c.removed_aborts.iter().copied().unzip();
        tx.execute(
            "DELETE FROM aborted_txns a USING unnest($3::bigint[], $4::bigint[]) AS u(pid, marker) \
             WHERE a.topic_id = $1 AND a.partition = $2 AND a.producer_id = u.pid \
               AND a.last_offset = u.marker",
            &[&topic_id, &partition, &pids, &markers],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(true)
}

async fn record_pass(
    cluster: &Cluster,
    topic_id: Uuid,
    partition: i32,
    st: &CleanStats,
) -> Result<(), ClusterError> {
    let client = cluster.pool.get().await?;
    client
        .execute(
            "INSERT INTO compaction_state (topic_id, partition, first_dirty, passes, last_pass_at, \
               records_read, records_kept, aborted_records_removed, bytes_read, bytes_written) \
             SELECT $1, $2, $3, 1, clock_timestamp(), $4, $5, $6, $7, $8 \
             WHERE EXISTS (SELECT 1 FROM partitions WHERE topic_id = $1 AND partition = $2) \
             ON CONFLICT (topic_id, partition) DO UPDATE SET \
               first_dirty = greatest(compaction_state.first_dirty, EXCLUDED.first_dirty), \
               passes = compaction_state.passes + 1, last_pass_at = EXCLUDED.last_pass_at, \
               records_read = compaction_state.records_read + EXCLUDED.records_read, \
               records_kept = compaction_state.records_kept + EXCLUDED.records_kept, \
               aborted_records_removed = compaction_state.aborted_records_removed \
                 + EXCLUDED.aborted_records_removed, \
               bytes_read = compaction_state.bytes_read + EXCLUDED.bytes_read, \
               bytes_written = compaction_state.bytes_written + EXCLUDED.bytes_written",
            &[
                &topic_id,
                &partition,
                &st.map_end,
                &(st.records_read as i64),
                &(st.records_kept as i64),
                &(st.aborted_records_removed as i64),
                &(st.bytes_read as i64),
                &(st.bytes_written as i64),
            ],
        )
        .await?;
    Ok(())
}
