//! Merges a partition's batches out of small objects into larger ones of
//! that partition alone, for read locality: a flush writes one object for
//! every partition it carries, as small as its window, so a consumer that
//! reads a partition from far behind would fetch one small object per
//! flush. The merge job (one broker at a time, under its lease) copies the
//! batches of a partition that sit in unmerged objects smaller than
//! [`SMALL_BYTES`] and older than [`MIN_AGE`] into one new object per
//! [`TARGET_BYTES`], byte for byte,
//! then repoints their rows in one transaction that first checks that each
//! row is still as read (the compactor's [`super::compactor::apply`]): a
//! row that retention, DeleteRecords or compaction changed meanwhile makes
//! the chunk change nothing. Offsets, records and markers stay as they
//! were; the old objects go with the collector once no row names them.
//!
//! A merged object is marked (`objects.merged`) and never merged again. A
//! compacted topic's tombstones and markers are dated by their object's
//! commit, so a merge postpones their removal by the age they had.

use std::time::Duration;

use uuid::Uuid;

use super::catalogue::TopicRow;
use super::compactor::{apply, patched, Chunk, CHUNK_ROWS};
use super::jobs;
use super::reader::{load_objects, Stored, STORED_COLUMNS};
use super::{Cluster, ClusterError};

/// How old an object must be before its batches are merged: a tailing
/// consumer reads the fresh ones from the cache of the broker that wrote
/// them.
pub const MIN_AGE: Duration = Duration::from_secs(10);
/// The size a merged object grows to, at most.
pub const TARGET_BYTES: u64 = 8 << 20;
/// Objects this large or larger are left as they are.
pub const SMALL_BYTES: i64 = 1 << 20;
/// A partition is merged once at least this many of its batches sit in
/// small objects (or one chunk's worth of bytes).
pub const MIN_BATCHES: usize = 16;
/// How often the merge job looks for work.
pub const EVERY: Duration = Duration::from_secs(10);

/// What merging one partition did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Merged {
    pub objects_written: usize,
    pub batches_moved: usize,
    pub bytes: u64,
}

/// One run over every topic's partitions.
pub async fn run(cluster: &Cluster, held: jobs::Held) -> Result<Merged, ClusterError> {
    let mut total = Merged::default();
    for t in jobs::topics(cluster).await? {
        for p in 0..t.partitions {
            if !held.still_held(cluster).await? {
                return Ok(total);
            }
            match merge(cluster, &t, p, MIN_AGE).await {
                Ok(m) if m.batches_moved > 0 => {
                    tracing::info!(partition = %format!("{}-{p}", t.name),
                        objects_written = m.objects_written, batches_moved = m.batches_moved,
                        bytes = m.bytes, "cluster: merged small objects");
                    total.objects_written += m.objects_written;
                    total.batches_moved += m.batches_moved;
                    total.bytes += m.bytes;
                }
                Ok(_) => {}
                Err(e) => {
                    crate::backend::cluster::outage::cluster_warn!(cluster.outage, e, partition = %format!("{}-{p}", t.name), error = %e,
                        "cluster: merging a partition's objects failed; it runs again")
                }
            }
        }
    }
    Ok(total)
}

/// Merges the batches of `partition` that sit in unmerged objects older
/// than `min_age`, a chunk at a time, while there are enough of them.
pub async fn merge(
    cluster: &Cluster,
    t: &TopicRow,
    partition: i32,
    min_age: Duration,
) -> Result<Merged, ClusterError> {
    let mut done = Merged::default();
    let mut from = -1i64;
    loop {
        let rows = candidates(cluster, t.id, partition, from, min_age).await?;
        let Some(last) = rows.last() else {
            return Ok(done);
        };
        from = last.last_offset;
        // Up to the target size; a row larger than it goes alone.
        let mut take = 0;
        let mut bytes = 0u64;
        for r in &rows {
            if take > 0 && bytes + r.length > TARGET_BYTES {
                break;
            }
            bytes += r.length;
            take += 1;
        }
        let rows = &rows[..take];
        if rows.len() < MIN_BATCHES && bytes < TARGET_BYTES {
            return Ok(done);
        }
        let objects = load_objects(cluster, rows).await?;
        let mut chunk = Chunk::default();
        for r in rows {
            chunk.rebuilt.push((r, patched(r, &objects)?));
        }
        if !apply(cluster, t.id, partition, chunk, true).await? {
            // Changed under it (retention, DeleteRecords, compaction):
            // the next run starts over.
            return Ok(done);
        }
        done.objects_written += 1;
        done.batches_moved += rows.len();
        done.bytes += bytes;
        from = rows.last().map_or(from, |r| r.last_offset);
    }
}

/// The next [`CHUNK_ROWS`] batch rows of a partition after offset `after`
/// whose object is unmerged and older than `min_age` (PostgreSQL's clock),
/// in offset order.
async fn candidates(
    cluster: &Cluster,
    topic_id: Uuid,
    partition: i32,
    after: i64,
    min_age: Duration,
) -> Result<Vec<Stored>, ClusterError> {
    let client = cluster.pool.get().await?;
    let min_age_ms = min_age.as_millis() as f64;
    let rows = client
        .query(
            &format!(
                "SELECT {STORED_COLUMNS} FROM batches b JOIN objects o ON o.key = b.object_key \
                 WHERE b.topic_id = $1 AND b.partition = $2 AND b.last_offset > $3 \
                   AND NOT o.merged AND o.size < $6 \
                   AND o.created_at <= clock_timestamp() - $4 * interval '1 millisecond' \
                 ORDER BY b.base_offset LIMIT $5"
            ),
            &[
                &topic_id,
                &partition,
                &after,
                &min_age_ms,
                &CHUNK_ROWS,
                &SMALL_BYTES,
            ],
        )
        .await?;
    Ok(rows.iter().map(Stored::from_row).collect())
}
