//! Fetch in cluster mode: the batch index in PostgreSQL names object byte
//! ranges; ranges found in the cache are not read again; contiguous ranges
//! of one object are read with one ranged GET. Base offsets are written into
//! the served copy (the stored bytes keep the client's; the CRC does not
//! cover the offset). Long polls wait on [`listen`]'s wake-ups.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio_postgres::AsyncMessage;
use uuid::Uuid;

use super::catalogue::CATALOGUE_CHANNEL;
use super::sequencer::{parse_notify, DATA_CHANNEL};
use super::{Cluster, ClusterError};
use crate::machines::producer_state::AbortedTxn;

/// What a fetch found.
#[derive(Debug)]
pub struct ClusterRead {
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    pub aborted: Vec<AbortedTxn>,
    pub data: Result<Vec<u8>, ReadRefusal>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRefusal {
    OutOfRange,
}

/// The offsets of a partition, from its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
}

/// ListOffsets' answer for one partition as (offset, timestamp): `spec`
/// -1 the high watermark (the LSO for read_committed), -2 the log start, -3
/// the record with the largest timestamp (as Kafka, control batches count),
/// a timestamp the first record at or after it (each an answer only below
/// that bound), read from its batch as a local log does. The outer `None`:
/// no such partition; the inner: no such offset.
pub async fn offset_for(
    cluster: &Cluster,
    topic_id: &Uuid,
    partition: i32,
    spec: i64,
    read_committed: bool,
) -> Result<Option<Option<(i64, i64)>>, ClusterError> {
    let Some(o) = offsets(cluster, topic_id, partition).await? else {
        return Ok(None);
    };
    let upper = if read_committed {
        o.last_stable_offset
    } else {
        o.high_watermark
    };
    match spec {
        -1 => return Ok(Some(Some((upper, -1)))),
        -2 => return Ok(Some(Some((o.log_start_offset, -1)))),
        _ => {}
    }
    let client = cluster.pool.get().await?;
    let row = if spec == -3 {
        client
            .query_opt(
                &format!(
                    "SELECT {STORED_COLUMNS}, b.max_timestamp FROM batches b \
                     LEFT JOIN objects o ON o.key = b.object_key \
                     WHERE b.topic_id = $1 AND b.partition = $2 \
                     ORDER BY b.max_timestamp DESC, b.base_offset LIMIT 1"
                ),
                &[topic_id, &partition],
            )
            .await?
    } else {
        client
            .query_opt(
                &format!(
                    "SELECT {STORED_COLUMNS}, b.max_timestamp FROM batches b \
                     LEFT JOIN objects o ON o.key = b.object_key \
                     WHERE b.topic_id = $1 AND b.partition = $2 AND b.base_offset < $3 \
                       AND b.max_timestamp >= $4 ORDER BY b.base_offset LIMIT 1"
                ),
                &[topic_id, &partition, &upper, &spec],
            )
            .await?
    };
    let Some(row) = row else {
        return Ok(Some(None));
    };
    let max_timestamp: i64 = row.get(7);
    let target = if spec == -3 { max_timestamp } else { spec };
    // As a local log: the first record of the batch at or after the
    // timestamp (the batch's base offset when its records cannot say).
    let stored = Stored::from_row(&row);
    let objects = load_objects(cluster, std::slice::from_ref(&stored)).await?;
    let mut bytes = stored.bytes(&objects)?.to_vec();
    oncelog_log::batch::set_base_offset(&mut bytes, stored.base_offset);
    let found = oncelog_log::first_record_at_or_after(&bytes, target)
        .unwrap_or((stored.base_offset, target));
    // as Kafka: found beyond the bound (the largest timestamp above the
    // LSO, for read_committed) is no answer
    Ok(Some(Some(found).filter(|(offset, _)| *offset < upper)))
}

/// A partition's high watermark, LSO and log start; `None` if it does not exist.
pub async fn offsets(
    cluster: &Cluster,
    topic_id: &Uuid,
    partition: i32,
) -> Result<Option<PartitionOffsets>, ClusterError> {
    // before the read: a commit announced during it may be newer than its snapshot
    let seen = cluster.known_next_offset(topic_id, partition);
    let client = cluster.pool.get().await?;
    let row = client
        .query_opt(
            "SELECT p.next_offset, p.log_start_offset, \
               (SELECT min(txn_first_offset) FROM producers r \
                 WHERE r.topic_id = p.topic_id AND r.partition = p.partition \
                   AND r.txn_first_offset IS NOT NULL) \
             FROM partitions p WHERE p.topic_id = $1 AND p.partition = $2",
            &[topic_id, &partition],
        )
        .await?;
    if let Some(r) = &row {
        cluster.check_next_since(topic_id, partition, r.get(0), seen)?;
        cluster.saw_next(topic_id, partition, r.get(0));
    }
    Ok(row.map(|r| {
        let hw: i64 = r.get(0);
        let open: Option<i64> = r.get(2);
        PartitionOffsets {
            high_watermark: hw,
            last_stable_offset: open.map_or(hw, |o| o.min(hw)),
            log_start_offset: r.get(1),
        }
    }))
}

/// Every partition's offsets, as (topic id, topic, partition, offsets).
pub async fn all_offsets(
    cluster: &Cluster,
) -> Result<Vec<(Uuid, String, i32, PartitionOffsets)>, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "SELECT t.id, t.name, p.partition, p.next_offset, p.log_start_offset, \
               (SELECT min(txn_first_offset) FROM producers r \
                 WHERE r.topic_id = p.topic_id AND r.partition = p.partition \
                   AND r.txn_first_offset IS NOT NULL) \
             FROM partitions p JOIN topics t ON t.id = p.topic_id \
             ORDER BY t.name, p.partition",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let hw: i64 = r.get(3);
            let open: Option<i64> = r.get(5);
            (
                r.get(0),
                r.get(1),
                r.get(2),
                PartitionOffsets {
                    high_watermark: hw,
                    last_stable_offset: open.map_or(hw, |o| o.min(hw)),
                    log_start_offset: r.get(4),
                },
            )
        })
        .collect())
}

/// Every partition's size: the bytes of its batches (the console's view;
/// a scan of the batch index, so not for every `/metrics` scrape).
pub async fn sizes(cluster: &Cluster) -> Result<HashMap<(Uuid, i32), u64>, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "SELECT topic_id, partition, sum(length)::bigint FROM batches \
             GROUP BY topic_id, partition",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let bytes: i64 = r.get(2);
            ((r.get(0), r.get(1)), bytes.max(0) as u64)
        })
        .collect())
}

/// The last [`crate::backend::local::partition::RECENT_MARKERS`] markers
/// of a partition, oldest first, each with the first offset its
/// transaction wrote there (the producer's first data batch after its
/// marker before). Read from the batch index and the markers' own bytes.
pub async fn recent_markers(
    cluster: &Cluster,
    topic: &str,
    partition: i32,
) -> Result<Vec<crate::backend::local::partition::MarkerWritten>, ClusterError> {
    let client = cluster.pool.get().await?;
    let limit = crate::backend::local::partition::RECENT_MARKERS as i64;
    let rows = client
        .query(
            "SELECT m.base_offset, m.max_timestamp, m.producer_id, m.inline_data, \
               (SELECT min(d.base_offset) FROM batches d \
                 WHERE d.topic_id = m.topic_id AND d.partition = m.partition \
                   AND d.producer_id = m.producer_id AND NOT d.control \
                   AND d.base_offset < m.base_offset \
                   AND d.base_offset > coalesce( \
                     (SELECT max(p.base_offset) FROM batches p \
                       WHERE p.topic_id = m.topic_id AND p.partition = m.partition \
                         AND p.producer_id = m.producer_id AND p.control \
                         AND p.base_offset < m.base_offset), -1)) \
             FROM batches m JOIN topics t ON t.id = m.topic_id \
             WHERE t.name = $1 AND m.partition = $2 AND m.control \
             ORDER BY m.base_offset DESC LIMIT $3",
            &[&topic, &partition, &limit],
        )
        .await?;
    let mut markers: Vec<_> = rows
        .iter()
        .filter_map(|r| {
            let data: Option<Vec<u8>> = r.get(3);
            let data = data?;
            let (kind, _) = oncelog_log::batch::control_record(&data)?;
            let epoch = oncelog_log::batch::BatchHeader::new(&data)
                .ok()?
                .producer_epoch();
            Some(crate::backend::local::partition::MarkerWritten {
                producer_id: r.get(2),
                epoch,
                commit: kind == oncelog_log::batch::CONTROL_COMMIT,
                first_offset: r.get(4),
                marker_offset: r.get(0),
                time_ms: r.get(1),
            })
        })
        .collect();
    markers.reverse();
    Ok(markers)
}

/// One partition of a Fetch, for [`read_many`].
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    pub topic_id: Uuid,
    pub partition: i32,
    pub offset: i64,
    /// The partition's own limit (Fetch's `partition_max_bytes`).
    pub max_bytes: usize,
}

/// One partition's answer in [`read_many`]: `Ok(None)` no such partition.
pub type Answer = Result<Option<ClusterRead>, ClusterError>;

/// Reads the partitions of one Fetch together. A partition at its end as
/// this broker last read it ([`super::ends`]) is answered from memory.
/// The others take one statement, so one snapshot and one round trip:
/// their offsets, the batch rows of those with something to read, and for
/// read_committed the aborted transactions those rows overlap (in one
/// snapshot, so a compaction, retention or DeleteRecords commit cannot
/// drop an aborted transaction's index row yet leave its data in what is
/// served); then every object needed, several at once. `budget` hands out
/// bytes in the order asked, as reading one partition after another would.
/// `Err`: nothing could be read.
pub async fn read_many(
    cluster: &Cluster,
    asks: &[Ask],
    budget: &mut crate::backend::Budget,
    read_committed: bool,
    source: Source,
) -> Result<Vec<Answer>, ClusterError> {
    let start = budget.clone();
    match read_many_once(cluster, asks, budget, read_committed, source).await {
        // Compaction, retention or DeleteRecords moved the rows read off an
        // object and the collector removed it before its GET: the rows read
        // again name where the batches are now.
        Err(ClusterError::Objects(object_store::Error::NotFound { path, .. })) => {
            tracing::debug!(%path, "cluster: an object named by the index was collected; reading the index again");
            *budget = start;
            read_many_once(cluster, asks, budget, read_committed, source).await
        }
        r => r,
    }
}

/// Where [`read_many`] takes the batches' bytes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The broker's cache of whole objects, filled from the store.
    Cache,
    /// The store, each object's range that holds the batches read; the
    /// cache is neither read nor filled (live verification).
    AtRest,
}

/// The end of a partition for a reader: the LSO for read_committed.
fn upper(o: &PartitionOffsets, read_committed: bool) -> i64 {
    if read_committed {
        o.last_stable_offset
    } else {
        o.high_watermark
    }
}

fn answer(o: PartitionOffsets) -> ClusterRead {
    ClusterRead {
        high_watermark: o.high_watermark,
        last_stable_offset: o.last_stable_offset,
        log_start_offset: o.log_start_offset,
        aborted: Vec::new(),
        data: Ok(Vec::new()),
    }
}

async fn read_many_once(
    cluster: &Cluster,
    asks: &[Ask],
    budget: &mut crate::backend::Budget,
    read_committed: bool,
    source: Source,
) -> Result<Vec<Answer>, ClusterError> {
    let mut answers: Vec<Answer> = asks.iter().map(|_| Ok(None)).collect();
    // the asks PostgreSQL must answer, by index into `asks`
    let mut reads = Vec::with_capacity(asks.len());
    for (i, a) in asks.iter().enumerate() {
        let known = cluster.known_next_offset(&a.topic_id, a.partition);
        match cluster.ends.fresh(&a.topic_id, a.partition, known) {
            Some(o)
                if a.offset >= upper(&o, read_committed)
                    && a.offset <= o.high_watermark
                    && a.offset >= o.log_start_offset =>
            {
                answers[i] = Ok(Some(answer(o)));
            }
            _ => reads.push(i),
        }
    }
    let ends = &cluster.ends;
    let from_memory = (asks.len() - reads.len()) as u64;
    ends.answered
        .fetch_add(from_memory, std::sync::atomic::Ordering::Relaxed);
    ends.read_through
        .fetch_add(reads.len() as u64, std::sync::atomic::Ordering::Relaxed);
    if reads.is_empty() {
        return Ok(answers);
    }
    let found = read_index(cluster, asks, &reads, read_committed).await?;
    let Found {
        offsets,
        mut rows,
        mut aborted,
    } = found;
    for (i, o) in offsets {
        let a = &asks[i];
        let o = match o {
            Ok(o) => o,
            Err(e) => {
                rows.remove(&i);
                answers[i] = Err(e);
                continue;
            }
        };
        let mut read = answer(o);
        if a.offset < o.log_start_offset || a.offset > o.high_watermark {
            read.data = Err(ReadRefusal::OutOfRange);
            rows.remove(&i);
        }
        answers[i] = Ok(Some(read));
    }
    let mut rows = choose(rows, asks, budget);
    let all: Vec<&Stored> = rows.values().flatten().collect();
    let objects = match source {
        Source::Cache => load_objects(cluster, all).await?,
        Source::AtRest => {
            let (objects, starts) = load_ranges(cluster, all).await?;
            // each row's position within the range read
            for b in rows.values_mut().flatten() {
                if let Some(s) = b.key.as_ref().and_then(|k| starts.get(k)) {
                    b.position -= s;
                }
            }
            objects
        }
    };
    for (i, answer) in answers.iter_mut().enumerate() {
        let Ok(Some(out)) = answer else { continue };
        let Some(chosen) = rows.remove(&i) else {
            continue;
        };
        let mut data = Vec::with_capacity(chosen.iter().map(|b| b.length as usize).sum());
        for b in &chosen {
            push_patched(&mut data, b.bytes(&objects)?, b.base_offset);
        }
        out.data = Ok(data);
        let last = chosen.last().map_or(i64::MIN, |b| b.last_offset);
        out.aborted = aborted.remove(&i).unwrap_or_default();
        // read for every candidate row; these for the rows chosen
        out.aborted.retain(|t| t.first_offset <= last);
    }
    Ok(answers)
}

/// Rows per partition the index query returns at most (before the bytes
/// limit, which the query applies too).
const ROWS_PER_PARTITION: i64 = 1000;

/// What [`read_index`] found, keyed by index into the asks.
struct Found {
    /// Each existing partition's offsets, or the finding that the
    /// database lost commits of it ([`Cluster::check_next_since`]).
    offsets: Vec<(usize, Result<PartitionOffsets, ClusterError>)>,
    /// Candidate batch rows, in offset order, from the offset asked below
    /// the reader's end, those starting within the partition's own byte
    /// limit (the first always).
    rows: HashMap<usize, Vec<Stored>>,
    /// For read_committed, the aborted transactions overlapping the
    /// candidate rows, by last offset.
    aborted: HashMap<usize, Vec<AbortedTxn>>,
}

/// One statement for the `reads` (indexes into `asks`): each partition's
/// offsets (kind 0), its candidate rows (kind 1) and the aborted
/// transactions they overlap (kind 2, read_committed only). Each
/// partition's offsets are checked against what this broker saw before the
/// read began and remembered ([`super::ends`]).
async fn read_index(
    cluster: &Cluster,
    asks: &[Ask],
    reads: &[usize],
    read_committed: bool,
) -> Result<Found, ClusterError> {
    let seen: Vec<i64> = reads
        .iter()
        .map(|&i| cluster.known_next_offset(&asks[i].topic_id, asks[i].partition))
        .collect();
    let mut cols: (Vec<Uuid>, Vec<i32>, Vec<i64>, Vec<i64>, Vec<i64>) = Default::default();
    for &i in reads {
        let a = &asks[i];
        cols.0.push(a.topic_id);
        cols.1.push(a.partition);
        cols.2.push(a.offset);
        cols.3.push(a.max_bytes.min(i64::MAX as usize) as i64);
        cols.4.push(i as i64);
    }
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            &format!(
                "WITH q AS MATERIALIZED ( \
                   SELECT q.*, p.next_offset, p.log_start_offset, \
                     (SELECT min(r.txn_first_offset) FROM producers r \
                       WHERE r.topic_id = p.topic_id AND r.partition = p.partition \
                         AND r.txn_first_offset IS NOT NULL) AS open \
                   FROM unnest($1::uuid[], $2::int4[], $3::int8[], $4::int8[], $5::int8[]) \
                     AS q(topic_id, partition, from_offset, max_bytes, i) \
                   JOIN partitions p ON p.topic_id = q.topic_id AND p.partition = q.partition), \
                 s AS MATERIALIZED ( \
                   SELECT q.i, w.* FROM q CROSS JOIN LATERAL ( \
                     SELECT * FROM ( \
                       SELECT {STORED_COLUMNS}, \
                         sum(b.length) OVER (ORDER BY b.last_offset) - b.length AS before \
                       FROM batches b LEFT JOIN objects o ON o.key = b.object_key \
                       WHERE b.topic_id = q.topic_id AND b.partition = q.partition \
                         AND b.last_offset >= q.from_offset \
                         AND b.base_offset < CASE WHEN $6 \
                           THEN least(q.next_offset, coalesce(q.open, q.next_offset)) \
                           ELSE q.next_offset END \
                       ORDER BY b.last_offset LIMIT {ROWS_PER_PARTITION}) c \
                     WHERE (c.before = 0 OR c.before < q.max_bytes) \
                       AND q.from_offset BETWEEN q.log_start_offset AND q.next_offset) w) \
                 SELECT 0, i, next_offset, log_start_offset, \
                   NULL::text, NULL::int8, NULL::int4, NULL::bytea, NULL::int8, open FROM q \
                 UNION ALL \
                 SELECT 1, i, base_offset, last_offset, \
                   object_key, position, length, inline_data, size, NULL::int8 FROM s \
                 UNION ALL \
                 SELECT 2, q.i, a.first_offset, a.last_offset, \
                   NULL, NULL, NULL, NULL, NULL, a.producer_id \
                 FROM (SELECT i, max(last_offset) AS last FROM s GROUP BY i) e \
                 JOIN q ON q.i = e.i \
                 JOIN aborted_txns a ON a.topic_id = q.topic_id AND a.partition = q.partition \
                   AND a.last_offset >= q.from_offset AND a.first_offset <= e.last \
                 WHERE $6 \
                 ORDER BY 1, 2, 4"
            ),
            &[&cols.0, &cols.1, &cols.2, &cols.3, &cols.4, &read_committed],
        )
        .await?;
    drop(client);
    let mut found = Found {
        offsets: Vec::with_capacity(reads.len()),
        rows: HashMap::new(),
        aborted: HashMap::new(),
    };
    // index into `reads` by index into `asks`, for `seen`
    let at: HashMap<usize, usize> = reads.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    for r in &rows {
        let i = r.get::<_, i64>(1) as usize;
        match r.get::<_, i32>(0) {
            0 => {
                let a = &asks[i];
                let hw: i64 = r.get(2);
                if let Err(e) = cluster.check_next_since(&a.topic_id, a.partition, hw, seen[at[&i]])
                {
                    found.offsets.push((i, Err(e)));
                    continue;
                }
                cluster.saw_next(&a.topic_id, a.partition, hw);
                let open: Option<i64> = r.get(9);
                let o = PartitionOffsets {
                    high_watermark: hw,
                    last_stable_offset: open.map_or(hw, |o| o.min(hw)),
                    log_start_offset: r.get(3),
                };
                cluster.ends.remember(&a.topic_id, a.partition, o);
                found.offsets.push((i, Ok(o)));
            }
            1 => found
                .rows
                .entry(i)
                .or_default()
                .push(Stored::from_row_at(r, 2)),
            _ => found.aborted.entry(i).or_default().push(AbortedTxn {
                producer_id: r.get(9),
                first_offset: r.get(2),
                last_offset: r.get(3),
            }),
        }
    }
    Ok(found)
}

/// Whole batches of each partition, in the order asked, within its own
/// limit and what the Fetch has left ([`crate::backend::Budget`]).
fn choose(
    mut rows: HashMap<usize, Vec<Stored>>,
    asks: &[Ask],
    budget: &mut crate::backend::Budget,
) -> HashMap<usize, Vec<Stored>> {
    let mut chosen = HashMap::new();
    for (i, a) in asks.iter().enumerate() {
        let Some(candidates) = rows.remove(&i) else {
            continue;
        };
        let (limit, min_one) = budget.limit(a.max_bytes);
        let mut taken = Vec::new();
        let mut total = 0usize;
        for b in candidates {
            let length = b.length as usize;
            if total + length > limit && !(taken.is_empty() && min_one) {
                break;
            }
            total += length;
            taken.push(b);
        }
        budget.spend(total);
        if !taken.is_empty() {
            chosen.insert(i, taken);
        }
    }
    chosen
}

/// A batch row: where its bytes are.
pub(super) struct Stored {
    pub base_offset: i64,
    pub last_offset: i64,
    pub key: Option<String>,
    pub position: u64,
    pub length: u64,
    pub inline: Option<Vec<u8>>,
    pub object_size: u64,
}

/// The columns [`Stored::from_row`] reads, first in a query over
/// `batches b LEFT JOIN objects o ON o.key = b.object_key`.
pub(super) const STORED_COLUMNS: &str =
    "b.base_offset, b.last_offset, b.object_key, b.position, b.length, b.inline_data, o.size";

impl Stored {
    pub fn from_row(r: &tokio_postgres::Row) -> Self {
        Self::from_row_at(r, 0)
    }

    /// [`Self::from_row`] with the columns from `at` on.
    pub fn from_row_at(r: &tokio_postgres::Row, at: usize) -> Self {
        Self {
            base_offset: r.get(at),
            last_offset: r.get(at + 1),
            key: r.get(at + 2),
            position: r.get::<_, i64>(at + 3) as u64,
            length: r.get::<_, i32>(at + 4) as u64,
            inline: r.get(at + 5),
            object_size: r.get::<_, Option<i64>>(at + 6).unwrap_or(0) as u64,
        }
    }

    /// The batch's stored bytes (base offset as the client sent it), from
    /// its row or from `objects` ([`load_objects`]).
    pub fn bytes<'a>(
        &'a self,
        objects: &'a HashMap<String, Bytes>,
    ) -> Result<&'a [u8], ClusterError> {
        match (&self.inline, &self.key) {
            (Some(inline), _) => Ok(inline),
            (None, Some(key)) => {
                let obj = objects
                    .get(key)
                    .ok_or_else(|| ClusterError::Invariant(format!("object {key} was not read")))?;
                let (s, e) = (
                    self.position as usize,
                    (self.position + self.length) as usize,
                );
                obj.get(s..e).ok_or_else(|| {
                    ClusterError::Invariant(format!(
                        "batch at {s}..{e} is outside object {key} of {} bytes",
                        obj.len()
                    ))
                })
            }
            (None, None) => Err(ClusterError::Invariant(
                "a batch row names neither an object nor inline bytes".into(),
            )),
        }
    }
}

/// The objects `rows` are in: from the cache, else read whole, several at
/// once; each is cached for the next batches (of any partition) in it.
pub(super) async fn load_objects<'a>(
    cluster: &Cluster,
    rows: impl IntoIterator<Item = &'a Stored>,
) -> Result<HashMap<String, Bytes>, ClusterError> {
    let mut objects: HashMap<String, Bytes> = HashMap::new();
    let mut missing: Vec<(String, u64)> = Vec::new();
    for b in rows {
        let Some(key) = &b.key else { continue };
        if objects.contains_key(key) || missing.iter().any(|(k, _)| k == key) {
            continue;
        }
        match cluster.cache.get(key) {
            Some(bytes) => {
                objects.insert(key.clone(), bytes);
            }
            None => missing.push((key.clone(), b.object_size)),
        }
    }
    let fetched: Vec<Result<(String, Bytes), ClusterError>> =
        futures_util::stream::iter(missing.into_iter().map(|(key, size)| async move {
            let bytes = cluster.objects.get_range(&key, 0, size).await?;
            if bytes.len() as u64 != size {
                return Err(ClusterError::Invariant(format!(
                    "object {key} returned {} bytes, its row says {size}",
                    bytes.len()
                )));
            }
            Ok((key, bytes))
        }))
        .buffered(PARALLEL_GETS)
        .collect()
        .await;
    for f in fetched {
        let (key, bytes) = f?;
        cluster.cache.insert(&key, bytes.clone());
        objects.insert(key, bytes);
    }
    Ok(objects)
}

/// [`load_objects`] at rest: of each object, the range that holds `rows`,
/// from the store, with where each range starts in its object; the cache is
/// neither read nor filled.
async fn load_ranges<'a>(
    cluster: &Cluster,
    rows: impl IntoIterator<Item = &'a Stored>,
) -> Result<(HashMap<String, Bytes>, HashMap<String, u64>), ClusterError> {
    // key -> (object size, first byte, end)
    let mut ranges: HashMap<String, (u64, u64, u64)> = HashMap::new();
    for b in rows {
        let Some(key) = &b.key else { continue };
        let r =
            ranges
                .entry(key.clone())
                .or_insert((b.object_size, b.position, b.position + b.length));
        r.1 = r.1.min(b.position);
        r.2 = r.2.max(b.position + b.length);
    }
    let starts: HashMap<String, u64> = ranges.iter().map(|(k, r)| (k.clone(), r.1)).collect();
    let fetched: Vec<Result<(String, Bytes), ClusterError>> =
        futures_util::stream::iter(ranges.into_iter().map(|(key, (size, s, e))| async move {
            let bytes = cluster.objects.get_range(&key, s, e).await?;
            if bytes.len() as u64 != e - s || e > size {
                return Err(ClusterError::Invariant(format!(
                    "object {key} returned {} bytes for {s}..{e}, its row says it holds {size}",
                    bytes.len()
                )));
            }
            Ok((key, bytes))
        }))
        .buffered(PARALLEL_GETS)
        .collect()
        .await;
    Ok((fetched.into_iter().collect::<Result<_, _>>()?, starts))
}

/// Objects one fetch reads from the store at once.
const PARALLEL_GETS: usize = 16;

fn push_patched(out: &mut Vec<u8>, batch: &[u8], base_offset: i64) {
    let at = out.len();
    out.extend_from_slice(batch);
    oncelog_log::batch::set_base_offset(&mut out[at..], base_offset);
}

/// Listens for other brokers' commits (`LISTEN oncelog_data`) and wakes this
/// broker's long polls; reconnects after a lost connection, waking every
/// poll then (a NOTIFY may have been missed). Runs until dropped.
pub async fn listen(cluster: Arc<Cluster>) {
    loop {
        if let Err(e) = listen_once(&cluster).await {
            crate::backend::cluster::outage::cluster_warn!(cluster.outage, e, error = %e, "cluster: the LISTEN connection failed; reconnecting");
        }
        cluster.ends.listening(false);
        cluster.data_notify.notify_waiters();
        cluster.catalogue_notify.notify_one();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn listen_once(cluster: &Cluster) -> Result<(), ClusterError> {
    let (client, mut conn) = cluster.pg.config.connect(cluster.pg.tls.clone()).await?;
    let (ntx, mut nrx) = tokio::sync::mpsc::unbounded_channel::<Option<(bool, String)>>();
    let drive = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    let catalogue = n.channel() == CATALOGUE_CHANNEL;
                    if ntx
                        .send(Some((catalogue, n.payload().to_string())))
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cluster: LISTEN connection error");
                    break;
                }
            }
        }
        let _ = ntx.send(None);
    });
    client
        .batch_execute(&format!(
            "LISTEN {DATA_CHANNEL}; LISTEN {CATALOGUE_CHANNEL}"
        ))
        .await?;
    // Anything committed before LISTEN took effect was not announced to us.
    cluster.ends.listening(true);
    cluster.data_notify.notify_waiters();
    cluster.catalogue_notify.notify_one();
    while let Some(Some((catalogue, payload))) = nrx.recv().await {
        if catalogue {
            cluster.catalogue_notify.notify_one();
            continue;
        }
        match parse_notify(&payload) {
            Some(moved) => cluster.advanced(&moved),
            None => cluster.data_notify.notify_waiters(),
        }
    }
    drive.abort();
    drop(client);
    Err(ClusterError::Invariant(
        "the LISTEN connection closed".into(),
    ))
}
