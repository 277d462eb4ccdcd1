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
use tokio_postgres::{AsyncMessage, GenericClient};
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

/// Reads the partitions of one Fetch together: one query for all their
/// offsets, one for the batch rows of those with something to read and,
/// for read_committed, one for the aborted transactions those rows overlap
/// (rows and aborted transactions in one REPEATABLE READ snapshot, so a
/// compaction, retention or DeleteRecords commit between the two reads
/// cannot drop an aborted transaction's index row yet leave its data in
/// what is served); then every object needed, several at once. `budget`
/// hands out bytes in the order asked, as reading one partition after
/// another would. `Err`: nothing could be read.
pub async fn read_many(
    cluster: &Cluster,
    asks: &[Ask],
    budget: &mut crate::backend::Budget,
    read_committed: bool,
) -> Result<Vec<Answer>, ClusterError> {
    let start = budget.clone();
    match read_many_once(cluster, asks, budget, read_committed).await {
        // Compaction, retention or DeleteRecords moved the rows read off an
        // object and the collector removed it before its GET: the rows read
        // again name where the batches are now.
        Err(ClusterError::Objects(object_store::Error::NotFound { path, .. })) => {
            tracing::debug!(%path, "cluster: an object named by the index was collected; reading the index again");
            *budget = start;
            read_many_once(cluster, asks, budget, read_committed).await
        }
        r => r,
    }
}

async fn read_many_once(
    cluster: &Cluster,
    asks: &[Ask],
    budget: &mut crate::backend::Budget,
    read_committed: bool,
) -> Result<Vec<Answer>, ClusterError> {
    let mut answers = offsets_many(cluster, asks).await?;
    // (ask, from, upper) of every partition with something to read
    let mut wanted = Vec::new();
    for (i, (a, answer)) in asks.iter().zip(answers.iter_mut()).enumerate() {
        let Ok(Some(out)) = answer else { continue };
        if a.offset < out.log_start_offset || a.offset > out.high_watermark {
            out.data = Err(ReadRefusal::OutOfRange);
            continue;
        }
        let upper = if read_committed {
            out.last_stable_offset
        } else {
            out.high_watermark
        };
        if a.offset < upper {
            wanted.push((i, a.offset, upper));
        }
    }
    if wanted.is_empty() {
        return Ok(answers);
    }
    let mut client = cluster.pool.get().await?;
    let (mut rows, aborted) = if read_committed {
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let rows = choose(index_rows_many(&*tx, asks, &wanted).await?, asks, budget);
        let aborted = aborted_many(&*tx, asks, &rows).await?;
        tx.commit().await?;
        (rows, aborted)
    } else {
        let rows = index_rows_many(&**client, asks, &wanted).await?;
        (choose(rows, asks, budget), HashMap::new())
    };
    drop(client);
    let all: Vec<&Stored> = rows.values().flatten().collect();
    let objects = load_objects(cluster, all.into_iter()).await?;
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
        out.aborted = aborted.get(&i).cloned().unwrap_or_default();
    }
    Ok(answers)
}

/// Every asked partition's offsets in one query, each checked against what
/// this broker saw before the read ([`Cluster::check_next_since`]).
async fn offsets_many(cluster: &Cluster, asks: &[Ask]) -> Result<Vec<Answer>, ClusterError> {
    let seen: Vec<i64> = asks
        .iter()
        .map(|a| cluster.known_next_offset(&a.topic_id, a.partition))
        .collect();
    let (ids, parts): (Vec<Uuid>, Vec<i32>) =
        asks.iter().map(|a| (a.topic_id, a.partition)).unzip();
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "SELECT q.i, p.next_offset, p.log_start_offset, \
               (SELECT min(txn_first_offset) FROM producers r \
                 WHERE r.topic_id = p.topic_id AND r.partition = p.partition \
                   AND r.txn_first_offset IS NOT NULL) \
             FROM unnest($1::uuid[], $2::int4[]) WITH ORDINALITY AS q(topic_id, partition, i) \
             JOIN partitions p ON p.topic_id = q.topic_id AND p.partition = q.partition",
            &[&ids, &parts],
        )
        .await?;
    drop(client);
    let mut answers: Vec<Answer> = asks.iter().map(|_| Ok(None)).collect();
    for r in rows {
        let i = r.get::<_, i64>(0) as usize - 1;
        let (a, hw) = (&asks[i], r.get::<_, i64>(1));
        if let Err(e) = cluster.check_next_since(&a.topic_id, a.partition, hw, seen[i]) {
            answers[i] = Err(e);
            continue;
        }
        cluster.saw_next(&a.topic_id, a.partition, hw);
        let open: Option<i64> = r.get(3);
        answers[i] = Ok(Some(ClusterRead {
            high_watermark: hw,
            last_stable_offset: open.map_or(hw, |o| o.min(hw)),
            log_start_offset: r.get(2),
            aborted: Vec::new(),
            data: Ok(Vec::new()),
        }));
    }
    Ok(answers)
}

/// Rows per partition the index query returns at most (before the bytes
/// limit, which the query applies too).
const ROWS_PER_PARTITION: i64 = 1000;

/// The batch rows of each `wanted` partition (index into `asks`, from,
/// upper): from `from` below `upper`, in offset order, those starting
/// within the partition's own byte limit (the first always), in one query.
async fn index_rows_many(
    db: &impl GenericClient,
    asks: &[Ask],
    wanted: &[(usize, i64, i64)],
) -> Result<HashMap<usize, Vec<Stored>>, ClusterError> {
    let mut cols: (Vec<Uuid>, Vec<i32>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>) =
        Default::default();
    for &(i, from, upper) in wanted {
        let a = &asks[i];
        cols.0.push(a.topic_id);
        cols.1.push(a.partition);
        cols.2.push(from);
        cols.3.push(upper);
        cols.4.push(a.max_bytes.min(i64::MAX as usize) as i64);
        cols.5.push(i as i64);
    }
    let rows = db
        .query(
            &format!(
                "SELECT s.base_offset, s.last_offset, s.object_key, s.position, s.length, \
                   s.inline_data, s.size, q.i \
                 FROM unnest($1::uuid[], $2::int4[], $3::int8[], $4::int8[], $5::int8[], $6::int8[]) \
                   AS q(topic_id, partition, from_offset, upper, max_bytes, i) \
                 CROSS JOIN LATERAL ( \
                   SELECT * FROM ( \
                     SELECT {STORED_COLUMNS}, \
                       sum(b.length) OVER (ORDER BY b.last_offset) - b.length AS before \
                     FROM batches b LEFT JOIN objects o ON o.key = b.object_key \
                     WHERE b.topic_id = q.topic_id AND b.partition = q.partition \
                       AND b.last_offset >= q.from_offset AND b.base_offset < q.upper \
                     ORDER BY b.last_offset LIMIT {ROWS_PER_PARTITION}) w \
                   WHERE w.before = 0 OR w.before < q.max_bytes) s \
                 ORDER BY q.i, s.last_offset"
            ),
            &[&cols.0, &cols.1, &cols.2, &cols.3, &cols.4, &cols.5],
        )
        .await?;
    let mut out: HashMap<usize, Vec<Stored>> = HashMap::new();
    for r in &rows {
        out.entry(r.get::<_, i64>(7) as usize)
            .or_default()
            .push(Stored::from_row(r));
    }
    Ok(out)
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

/// The aborted transactions overlapping each partition's chosen rows, in
/// one query.
async fn aborted_many(
    db: &impl GenericClient,
    asks: &[Ask],
    chosen: &HashMap<usize, Vec<Stored>>,
) -> Result<HashMap<usize, Vec<AbortedTxn>>, ClusterError> {
    let mut cols: (Vec<Uuid>, Vec<i32>, Vec<i64>, Vec<i64>, Vec<i64>) = Default::default();
    for (&i, rows) in chosen {
        let Some(last) = rows.last() else { continue };
        cols.0.push(asks[i].topic_id);
        cols.1.push(asks[i].partition);
        cols.2.push(asks[i].offset);
        cols.3.push(last.last_offset);
        cols.4.push(i as i64);
    }
    let mut out: HashMap<usize, Vec<AbortedTxn>> = HashMap::new();
    if cols.0.is_empty() {
        return Ok(out);
    }
    let rows = db
        .query(
            "SELECT q.i, a.producer_id, a.first_offset, a.last_offset \
             FROM unnest($1::uuid[], $2::int4[], $3::int8[], $4::int8[], $5::int8[]) \
               AS q(topic_id, partition, from_offset, last, i) \
             JOIN aborted_txns a ON a.topic_id = q.topic_id AND a.partition = q.partition \
               AND a.last_offset >= q.from_offset AND a.first_offset <= q.last \
             ORDER BY q.i, a.last_offset",
            &[&cols.0, &cols.1, &cols.2, &cols.3, &cols.4],
        )
        .await?;
    for r in &rows {
        out.entry(r.get::<_, i64>(0) as usize)
            .or_default()
            .push(AbortedTxn {
                producer_id: r.get(1),
                first_offset: r.get(2),
                last_offset: r.get(3),
            });
    }
    Ok(out)
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
        Self {
            base_offset: r.get(0),
            last_offset: r.get(1),
            key: r.get(2),
            position: r.get::<_, i64>(3) as u64,
            length: r.get::<_, i32>(4) as u64,
            inline: r.get(5),
            object_size: r.get::<_, Option<i64>>(6).unwrap_or(0) as u64,
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
