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

/// Reads from `offset`: up to `max_bytes` of whole batches (at least one
/// when `min_one`), below the LSO for read_committed, else below the high
/// watermark. `Ok(None)`: no such partition.
pub async fn read(
    cluster: &Cluster,
    topic_id: &Uuid,
    partition: i32,
    offset: i64,
    max_bytes: usize,
    read_committed: bool,
    min_one: bool,
) -> Result<Option<ClusterRead>, ClusterError> {
    let once = || {
        read_once(
            cluster,
            topic_id,
            partition,
            offset,
            max_bytes,
            read_committed,
            min_one,
        )
    };
    match once().await {
        // Compaction, retention or DeleteRecords moved the rows read off an
        // object and the collector removed it before its GET: the rows read
        // again name where the batches are now.
        Err(ClusterError::Objects(object_store::Error::NotFound { path, .. })) => {
            tracing::debug!(%path, "cluster: an object named by the index was collected; reading the index again");
            once().await
        }
        r => r,
    }
}

async fn read_once(
    cluster: &Cluster,
    topic_id: &Uuid,
    partition: i32,
    offset: i64,
    max_bytes: usize,
    read_committed: bool,
    min_one: bool,
) -> Result<Option<ClusterRead>, ClusterError> {
    let Some(o) = offsets(cluster, topic_id, partition).await? else {
        return Ok(None);
    };
    let mut out = ClusterRead {
        high_watermark: o.high_watermark,
        last_stable_offset: o.last_stable_offset,
        log_start_offset: o.log_start_offset,
        aborted: Vec::new(),
        data: Ok(Vec::new()),
    };
    if offset < o.log_start_offset || offset > o.high_watermark {
        out.data = Err(ReadRefusal::OutOfRange);
        return Ok(Some(out));
    }
    let upper = if read_committed {
        o.last_stable_offset
    } else {
        o.high_watermark
    };
    if offset >= upper {
        return Ok(Some(out));
    }
    let mut client = cluster.pool.get().await?;
    let (chosen, total, aborted) = if read_committed {
        // The batch rows and the aborted index from one snapshot, so a
        // compaction, retention or DeleteRecords commit between the two
        // reads cannot drop an aborted transaction's index row (with its
        // marker and data) yet leave its data in what this fetch serves.
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let r = index_rows(
            &*tx, topic_id, partition, offset, upper, max_bytes, min_one, true,
        )
        .await?;
        tx.commit().await?;
        r
    } else {
        index_rows(
            &**client, topic_id, partition, offset, upper, max_bytes, min_one, false,
        )
        .await?
    };
    drop(client);
    out.aborted = aborted;
    let objects = load_objects(cluster, &chosen).await?;
    let mut data = Vec::with_capacity(total);
    for b in &chosen {
        push_patched(&mut data, b.bytes(&objects)?, b.base_offset);
    }
    out.data = Ok(data);
    Ok(Some(out))
}

/// The batch rows from `offset` below `upper` that fit `max_bytes` (at
/// least one if `min_one`), their bytes, and (`with_aborted`) the aborted
/// transactions they overlap.
#[allow(clippy::too_many_arguments)]
async fn index_rows(
    db: &impl GenericClient,
    topic_id: &Uuid,
    partition: i32,
    offset: i64,
    upper: i64,
    max_bytes: usize,
    min_one: bool,
    with_aborted: bool,
) -> Result<(Vec<Stored>, usize, Vec<AbortedTxn>), ClusterError> {
    let rows = db
        .query(
            &format!(
                "SELECT {STORED_COLUMNS} FROM batches b LEFT JOIN objects o ON o.key = b.object_key \
                 WHERE b.topic_id = $1 AND b.partition = $2 AND b.last_offset >= $3 \
                   AND b.base_offset < $4 ORDER BY b.last_offset LIMIT 1000"
            ),
            &[topic_id, &partition, &offset, &upper],
        )
        .await?;
    let mut chosen = Vec::new();
    let mut total = 0usize;
    for r in &rows {
        let length = r.get::<_, i32>(4) as usize;
        if total + length > max_bytes && !(chosen.is_empty() && min_one) {
            break;
        }
        total += length;
        chosen.push(Stored::from_row(r));
    }
    let mut aborted = Vec::new();
    if with_aborted && !chosen.is_empty() {
        let last = chosen.last().map(|c| c.last_offset).unwrap_or(offset);
        let rows = db
            .query(
                "SELECT producer_id, first_offset, last_offset FROM aborted_txns \
                 WHERE topic_id = $1 AND partition = $2 AND last_offset >= $3 \
                   AND first_offset <= $4 ORDER BY last_offset",
                &[topic_id, &partition, &offset, &last],
            )
            .await?;
        aborted = rows
            .iter()
            .map(|r| AbortedTxn {
                producer_id: r.get(0),
                first_offset: r.get(1),
                last_offset: r.get(2),
            })
            .collect();
    }
    Ok((chosen, total, aborted))
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
pub(super) async fn load_objects(
    cluster: &Cluster,
    rows: &[Stored],
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
