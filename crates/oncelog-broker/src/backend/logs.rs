//! The partitions' logs: reads with their bounds, offsets by spec and time,
//! and appends, over a data directory or PostgreSQL and the object store.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::BytesMut;
use oncelog_log::LogError;

use super::Scope;
use crate::backend::cluster::front::Front;
use crate::backend::cluster::sequencer::BatchOutcome;
use crate::backend::cluster::ClusterError;
use crate::backend::local::partition::AppendError;
use crate::backend::topic::TopicMeta;
use crate::error::ErrorCode;
use crate::machines::producer_state::{ProduceReject, ProducerBatch};
use crate::machines::txn_coordinator::VerifyError;
use crate::observe::txn_history::Requester;
use crate::Broker;

/// Why a partition's batch is refused: the code, the message, and
/// (KIP-467) each refused record's index and reason. Nothing of it is
/// stored.
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
    pub record_errors: Vec<(i32, String)>,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            record_errors: Vec::new(),
        }
    }
}

/// A batch acknowledged: its first offset, and the partition's log start.
#[derive(Debug, Clone, Copy)]
pub struct Acked {
    pub base_offset: i64,
    pub log_start_offset: i64,
}

/// An append's acknowledgement, once it is durable.
pub type Durable = Pin<Box<dyn Future<Output = Result<Acked, Refusal>> + Send>>;

/// What an append returned.
pub enum Appending {
    /// Acknowledged now (visible already, or a retry of a stored batch).
    Now(Acked),
    /// Acknowledged when this resolves; the append's place in its
    /// partition is already taken, in the order appends were made.
    Later(Durable),
}

fn reject_code(r: &ProduceReject) -> ErrorCode {
    match r {
        ProduceReject::InvalidProducerEpoch { .. } => ErrorCode::InvalidProducerEpoch,
        ProduceReject::OutOfOrderSequence { .. } | ProduceReject::NewEpochNotAtZero { .. } => {
            ErrorCode::OutOfOrderSequenceNumber
        }
        ProduceReject::InvalidTxnState => ErrorCode::InvalidTxnState,
    }
}

// as Kafka: a fenced epoch is INVALID_PRODUCER_EPOCH in a produce answer, a
// partition outside the transaction INVALID_TXN_STATE
fn unverified_code(e: &VerifyError) -> ErrorCode {
    match e {
        VerifyError::StaleEpoch => ErrorCode::InvalidProducerEpoch,
        VerifyError::NotInTransaction => ErrorCode::InvalidTxnState,
    }
}

/// Why a partition could not be read or its offsets looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionError {
    /// No such topic or partition.
    Unknown,
    /// The storage failed (logged where it failed).
    Storage,
}

/// One partition as `/metrics` reports it.
pub struct PartitionRow {
    pub topic: String,
    pub partition: i32,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// Bytes of its log segments (local mode; cluster mode's objects are
    /// shared between partitions).
    pub size_bytes: Option<u64>,
}

/// Why DeleteRecords refused a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteError {
    /// No such partition (or its topic was deleted).
    Unknown,
    /// Past the high watermark.
    OutOfRange,
    /// The storage failed (logged where it failed).
    Storage,
}

/// The partitions' logs.
pub enum Logs<'a> {
    Local(&'a Broker),
    Cluster(&'a Arc<Broker>, &'a Front),
}

impl Broker {
    /// This broker's partition logs.
    pub fn logs(self: &Arc<Self>) -> Logs<'_> {
        match &self.mode {
            crate::Mode::Cluster(front) => Logs::Cluster(self, front),
            crate::Mode::Local => Logs::Local(self),
        }
    }
}

impl Logs<'_> {
    /// Reads the partitions of one Fetch, in the order asked: from each
    /// one's offset, whole batches within its own limit and what `budget`
    /// has left, below the LSO for read_committed, else below the high
    /// watermark. Local logs are read one after another; a cluster reads
    /// them together ([`crate::backend::cluster::reader::read_many`]: one
    /// PostgreSQL query for all their offsets, one for all their batch
    /// rows).
    pub async fn read_many(
        &self,
        asks: &[FetchAsk<'_>],
        budget: &mut Budget,
        read_committed: bool,
    ) -> Vec<Result<crate::backend::local::partition::Read, PartitionError>> {
        self.read_from(asks, budget, read_committed, false).await
    }

    /// What live verification reads: [`Self::read_many`] read_committed,
    /// from storage itself. A cluster's cache of objects is neither used
    /// nor filled (a cached copy would hide what changed at rest, and the
    /// tail's readers keep theirs), and only the bytes of the batches read
    /// are fetched.
    pub async fn read_at_rest(
        &self,
        asks: &[FetchAsk<'_>],
        budget: &mut Budget,
    ) -> Vec<Result<crate::backend::local::partition::Read, PartitionError>> {
        self.read_from(asks, budget, true, true).await
    }

    async fn read_from(
        &self,
        asks: &[FetchAsk<'_>],
        budget: &mut Budget,
        read_committed: bool,
        at_rest: bool,
    ) -> Vec<Result<crate::backend::local::partition::Read, PartitionError>> {
        use crate::backend::local::partition::ReadError;
        match self {
            Logs::Local(b) => asks
                .iter()
                .map(|a| {
                    let Some(p) = b.topics.get(a.topic).and_then(|t| t.store(a.partition)) else {
                        return Err(PartitionError::Unknown);
                    };
                    let (limit, min_one) = budget.limit(a.max_bytes);
                    let read = p.read(a.offset, limit, read_committed, min_one);
                    match &read.data {
                        Err(ReadError::Storage(e)) => {
                            tracing::error!(partition = %p.name(), error = %e, "read failed");
                            return Err(PartitionError::Storage);
                        }
                        Ok(data) => budget.spend(data.len()),
                        Err(_) => {}
                    }
                    Ok(read)
                })
                .collect(),
            Logs::Cluster(_, front) => {
                read_cluster(front, asks, budget, read_committed, at_rest).await
            }
        }
    }

    /// The end of `topic`'s `partition` as this broker knows it without
    /// reading storage: its high watermark (local), the highest next offset
    /// it saw committed, by its own commits and the others' announcements
    /// (cluster). A long poll reads again only when this passed what its
    /// last read returned. `None`: no such partition here.
    pub async fn known_end(&self, topic: &str, partition: i32) -> Option<i64> {
        match self {
            Logs::Local(b) => b
                .topics
                .get(topic)
                .and_then(|t| t.partition(partition))
                .map(|p| p.high_watermark()),
            Logs::Cluster(_, front) => {
                let t = front.topic(topic).await.ok().flatten()?;
                Some(front.cluster.known_next_offset(&t.id, partition))
            }
        }
    }

    /// Appends `data`, a client batch already checked (its producer's
    /// batch `producer` when it has a producer id), to `topic`'s
    /// `partition`. The batch takes its place now, in the order of calls;
    /// it is acknowledged when it is durable. A zombie's or a late
    /// transactional write is refused (and kept in the transaction
    /// history), as are idempotence violations.
    pub async fn append(
        &self,
        topic: &TopicMeta,
        partition: i32,
        mut data: BytesMut,
        producer: Option<&ProducerBatch>,
        transactional_id: Option<&str>,
        who: &Requester,
    ) -> Result<Appending, Refusal> {
        let unknown = || {
            Refusal::new(
                ErrorCode::UnknownTopicOrPartition,
                format!("unknown partition {}-{partition}", topic.name),
            )
        };
        match self {
            Logs::Local(b) => {
                let name = topic.name.as_str();
                let p = b
                    .topics
                    .get(name)
                    .and_then(|t| t.store(partition))
                    .ok_or_else(unknown)?;
                // The batch must belong to its producer's open transaction
                // holding this partition (zombies and late writes are refused).
                let verify =
                    |pb: &ProducerBatch| b.txn.verify(pb.producer_id, pb.epoch, name, partition);
                let refused = match p.append(&mut data, producer, &verify) {
                    Ok(a) => {
                        if !a.duplicate {
                            b.appended_bytes
                                .fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
                        }
                        let base_offset = a.base_offset;
                        return Ok(match a.durable {
                            None => Appending::Now(Acked {
                                base_offset,
                                log_start_offset: p.log_start_offset(),
                            }),
                            Some(rx) => Appending::Later(Box::pin(async move {
                                match crate::backend::local::partition::durable(rx).await {
                                    Ok(()) => Ok(Acked {
                                        base_offset,
                                        log_start_offset: p.log_start_offset(),
                                    }),
                                    Err(e) => Err(Refusal::new(
                                        ErrorCode::KafkaStorageError,
                                        e.to_string(),
                                    )),
                                }
                            })),
                        });
                    }
                    Err(e) => e,
                };
                let tp = (name.to_string(), partition);
                Err(match refused {
                    AppendError::Closed(_) => Refusal::new(
                        ErrorCode::UnknownTopicOrPartition,
                        format!("topic {name} was deleted"),
                    ),
                    AppendError::Unverified(e) => match producer {
                        Some(pb) => unverified(b, &tp, pb, transactional_id, &e, who),
                        // checked only for a batch with a producer id
                        None => Refusal::new(ErrorCode::InvalidTxnState, e.to_string()),
                    },
                    AppendError::Rejected(r) => match producer {
                        Some(pb) => rejected(b, &tp, pb, transactional_id, &r, who),
                        // refused only for a batch with a producer id
                        None => Refusal::new(ErrorCode::InvalidRecord, r.to_string()),
                    },
                    AppendError::Storage(LogError::Io { op, path, source }) => {
                        tracing::error!(partition = %p.name(), op, path = %path.display(), error = %source,
                            "append failed; not acknowledged");
                        Refusal::new(
                            ErrorCode::KafkaStorageError,
                            format!("{op} failed: {source}"),
                        )
                    }
                    AppendError::Storage(e) => {
                        tracing::error!(partition = %p.name(), error = %e, "append failed; not acknowledged");
                        Refusal::new(ErrorCode::KafkaStorageError, e.to_string())
                    }
                })
            }
            Logs::Cluster(b, front) => {
                if !(0..topic.partitions).contains(&partition) {
                    return Err(unknown());
                }
                // The stored bytes are the client's (offsets are patched
                // when served); the flusher commits them with the batch's
                // idempotence and transaction checks, in submission order.
                let rx = front
                    .flusher
                    .submit(topic.id, &topic.name, partition, data.freeze())
                    .await
                    .map_err(|e| Refusal::new(ErrorCode::KafkaStorageError, e.to_string()))?;
                // What a refusal is noted with (a zombie's late write).
                let (b, pb) = ((*b).clone(), producer.copied());
                let (tp, tid) = (
                    (topic.name.clone(), partition),
                    transactional_id.map(str::to_string),
                );
                let who = who.clone();
                Ok(Appending::Later(Box::pin(async move {
                    use crate::backend::cluster::flusher::PRODUCE_TIMEOUT;
                    match tokio::time::timeout(PRODUCE_TIMEOUT, rx).await {
                        Ok(Ok(o)) => match (o, pb) {
                            (Ok(BatchOutcome::Unverified(e)), Some(pb)) => {
                                Err(unverified(&b, &tp, &pb, tid.as_deref(), &e, &who))
                            }
                            (Ok(BatchOutcome::Rejected(r)), Some(pb)) => {
                                Err(rejected(&b, &tp, &pb, tid.as_deref(), &r, &who))
                            }
                            (o, _) => committed(o),
                        },
                        Ok(Err(_)) => Err(Refusal::new(
                            ErrorCode::KafkaStorageError,
                            "the flusher stopped",
                        )),
                        Err(_) => Err(Refusal::new(
                            ErrorCode::RequestTimedOut,
                            "the commit did not finish in time; it may still",
                        )),
                    }
                })))
            }
        }
    }

    /// The producers a partition keeps state for (DescribeProducers).
    pub async fn producers(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<Vec<(i64, crate::machines::producer_state::ProducerEntry)>, PartitionError> {
        match self {
            Logs::Local(b) => b
                .topics
                .get(topic)
                .and_then(|t| t.store(partition))
                .map(|p| p.producers())
                .ok_or(PartitionError::Unknown),
            Logs::Cluster(_, front) => {
                let warn = |e: ClusterError| {
                    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, topic, partition, error = %e, "cluster: reading producer state failed");
                    PartitionError::Storage
                };
                let t = cluster_topic(front, topic, partition).await?;
                let key = (t.id, partition);
                let mut rows = crate::backend::cluster::describe::producers(&front.cluster, &[key])
                    .await
                    .map_err(warn)?;
                Ok(rows.remove(&key).unwrap_or_default())
            }
        }
    }

    /// DeleteRecords of one partition of `topic`: its log start moves to
    /// `offset` (-1: the high watermark). Returns the new log start.
    pub async fn delete_records(
        &self,
        topic: &TopicMeta,
        partition: i32,
        offset: i64,
    ) -> Result<i64, DeleteError> {
        match self {
            Logs::Local(b) => {
                use crate::backend::local::partition::DeleteRecordsError;
                let p = b
                    .topics
                    .get(&topic.name)
                    .and_then(|t| t.partition(partition))
                    .ok_or(DeleteError::Unknown)?;
                super::blocking(|| p.delete_records(offset)).map_err(|e| match e {
                    DeleteRecordsError::OutOfRange { .. } => DeleteError::OutOfRange,
                    DeleteRecordsError::Closed(_) => DeleteError::Unknown,
                    DeleteRecordsError::Storage(e) => {
                        tracing::error!(partition = %p.name(), error = %e, "DeleteRecords failed");
                        DeleteError::Storage
                    }
                })
            }
            Logs::Cluster(_, front) => {
                use crate::backend::cluster::records::{self, Refused};
                if !(0..topic.partitions).contains(&partition) {
                    return Err(DeleteError::Unknown);
                }
                match records::delete_records(&front.cluster, topic.id, partition, offset).await {
                    Ok(Ok(start)) => Ok(start),
                    Ok(Err(Refused::OutOfRange { .. })) => Err(DeleteError::OutOfRange),
                    Ok(Err(Refused::Unknown)) => Err(DeleteError::Unknown),
                    Err(e) => {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, topic = %topic.name, partition, error = %e,
                            "cluster: DeleteRecords not committed");
                        Err(DeleteError::Storage)
                    }
                }
            }
        }
    }

    /// The offsets bounding one partition: (high watermark, last stable
    /// offset).
    pub async fn bounds(&self, topic: &str, partition: i32) -> Result<(i64, i64), PartitionError> {
        match self {
            Logs::Local(b) => {
                let p = b
                    .topics
                    .get(topic)
                    .and_then(|t| t.partition(partition))
                    .ok_or(PartitionError::Unknown)?;
                let s = p.status();
                Ok((s.high_watermark, s.last_stable_offset))
            }
            Logs::Cluster(_, front) => {
                let warn = |e: ClusterError| {
                    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, topic, partition, error = %e, "cluster: reading a partition's offsets failed");
                    PartitionError::Storage
                };
                let t = cluster_topic(front, topic, partition).await?;
                let o = crate::backend::cluster::reader::offsets(&front.cluster, &t.id, partition)
                    .await
                    .map_err(warn)?
                    .ok_or(PartitionError::Unknown)?;
                Ok((o.high_watermark, o.last_stable_offset))
            }
        }
    }

    /// Partitions with their offsets: every one in local mode; in cluster
    /// mode with [`Scope::Mine`] those Metadata names this broker the
    /// leader of (`/metrics`: each partition is reported once across the
    /// cluster), with [`Scope::All`] every one (the console).
    pub async fn statuses(&self, scope: Scope) -> Vec<PartitionRow> {
        match self {
            Logs::Local(b) => b
                .topics
                .all_partitions()
                .iter()
                .map(|p| {
                    let s = p.status();
                    PartitionRow {
                        topic: p.topic.clone(),
                        partition: p.index,
                        high_watermark: s.high_watermark,
                        last_stable_offset: s.last_stable_offset,
                        log_start_offset: s.log_start_offset,
                        size_bytes: Some(s.size_bytes),
                    }
                })
                .collect(),
            Logs::Cluster(_, front) => {
                let me = front.cluster.config.broker_id;
                let live: Vec<i32> = front.live().iter().map(|x| x.id).collect();
                let sizes = match scope {
                    Scope::All => crate::backend::cluster::reader::sizes(&front.cluster)
                        .await
                        .map(Some),
                    Scope::Mine => Ok(None),
                };
                let offsets = crate::backend::cluster::reader::all_offsets(&front.cluster).await;
                match offsets.and_then(|o| sizes.map(|s| (o, s))) {
                    Ok((rows, sizes)) => rows
                        .into_iter()
                        .filter(|(id, _, p, _)| {
                            scope == Scope::All
                                || crate::machines::placement::preferred_broker(id, *p, &live)
                                    == Some(me)
                        })
                        .map(|(id, topic, partition, o)| PartitionRow {
                            topic,
                            partition,
                            high_watermark: o.high_watermark,
                            last_stable_offset: o.last_stable_offset,
                            log_start_offset: o.log_start_offset,
                            size_bytes: sizes
                                .as_ref()
                                .map(|s| s.get(&(id, partition)).copied().unwrap_or(0)),
                        })
                        .collect(),
                    Err(e) => {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: reading the partitions' offsets (or sizes) failed");
                        Vec::new()
                    }
                }
            }
        }
    }

    /// The markers written at a partition lately, oldest first (where a
    /// transaction's commit or abort went): the partition's own record in
    /// local mode, the batch index in cluster mode.
    pub async fn recent_markers(
        &self,
        topic: &str,
        partition: i32,
    ) -> Vec<crate::backend::local::partition::MarkerWritten> {
        match self {
            Logs::Local(b) => b
                .topics
                .get(topic)
                .and_then(|t| t.partition(partition))
                .map(|p| p.recent_markers())
                .unwrap_or_default(),
            Logs::Cluster(_, front) => {
                crate::backend::cluster::reader::recent_markers(&front.cluster, topic, partition)
                    .await
                    .unwrap_or_else(|e| {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: reading a partition's markers failed");
                        Vec::new()
                    })
            }
        }
    }

    /// Woken whenever data becomes readable (a long poll waits on it).
    pub fn data_notify(&self) -> &tokio::sync::Notify {
        match self {
            Logs::Local(b) => &b.data_notify,
            Logs::Cluster(_, front) => &front.cluster.data_notify,
        }
    }

    /// ListOffsets' answer for one partition as (offset, timestamp), or
    /// `None` when there is no such offset. `spec`: -1 the high watermark
    /// (the LSO for read_committed), -2 the log start, -3 the batch with the
    /// largest timestamp, else a timestamp (≥ 0): the first batch whose
    /// largest timestamp reaches it, below that bound.
    pub async fn offset_for(
        &self,
        topic: &str,
        partition: i32,
        spec: i64,
        read_committed: bool,
    ) -> Result<Option<(i64, i64)>, PartitionError> {
        match self {
            Logs::Local(b) => {
                let Some(p) = b.topics.get(topic).and_then(|t| t.store(partition)) else {
                    return Err(PartitionError::Unknown);
                };
                p.offset_for(spec, read_committed).map_err(|e| {
                    tracing::error!(partition = %p.name(), error = %e, "offset lookup failed");
                    PartitionError::Storage
                })
            }
            Logs::Cluster(_, front) => {
                let warn = |e: crate::backend::cluster::ClusterError| {
                    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, topic, partition, error = %e, "cluster: offset lookup failed");
                    PartitionError::Storage
                };
                let t = cluster_topic(front, topic, partition).await?;
                crate::backend::cluster::reader::offset_for(
                    &front.cluster,
                    &t.id,
                    partition,
                    spec,
                    read_committed,
                )
                .await
                .map_err(warn)?
                .ok_or(PartitionError::Unknown)
            }
        }
    }
}

/// A batch refused because its producer has no open transaction holding
/// the partition at its epoch (a zombie's or a late write): noted in the
/// id's history, counted, logged.
fn unverified(
    b: &Broker,
    tp: &(String, i32),
    pb: &ProducerBatch,
    transactional_id: Option<&str>,
    e: &VerifyError,
    who: &Requester,
) -> Refusal {
    let why = e.to_string();
    let tid = b
        .txn
        .rejected_write(pb.producer_id, pb.epoch, tp, transactional_id, &why, who);
    tracing::warn!(partition = %format!("{}-{}", tp.0, tp.1), transactional_id = tid.as_deref().unwrap_or("-"),
        producer_id = pb.producer_id, epoch = pb.epoch, reason = why.as_str(), "transactional produce refused");
    Refusal::new(unverified_code(e), why)
}

/// A batch its producer's state refused (idempotence, or a stale epoch:
/// a transactional one is a zombie's late write, noted in the id's history
/// and counted); logged.
fn rejected(
    b: &Broker,
    tp: &(String, i32),
    pb: &ProducerBatch,
    transactional_id: Option<&str>,
    r: &ProduceReject,
    who: &Requester,
) -> Refusal {
    let tid = match r {
        ProduceReject::InvalidProducerEpoch { .. } if pb.transactional => {
            let why = r.to_string();
            b.txn
                .rejected_write(pb.producer_id, pb.epoch, tp, transactional_id, &why, who)
        }
        _ => b
            .txn
            .transactional_id_of(pb.producer_id)
            .or_else(|| transactional_id.map(str::to_string)),
    };
    tracing::warn!(partition = %format!("{}-{}", tp.0, tp.1), transactional_id = tid.as_deref().unwrap_or("-"),
        producer_id = pb.producer_id, epoch = pb.epoch, first_seq = pb.first_seq, reason = %r, "produce rejected");
    Refusal::new(reject_code(r), r.to_string())
}

/// A cluster-mode batch's answer from its commit's outcome.
fn committed(o: crate::backend::cluster::flusher::ProduceResult) -> Result<Acked, Refusal> {
    match o {
        Ok(BatchOutcome::Appended {
            base_offset,
            log_start_offset,
        })
        | Ok(BatchOutcome::Duplicate {
            base_offset,
            log_start_offset,
        }) => Ok(Acked {
            base_offset,
            log_start_offset,
        }),
        Ok(BatchOutcome::Rejected(r)) => Err(Refusal::new(reject_code(&r), r.to_string())),
        Ok(BatchOutcome::UnknownPartition) => Err(Refusal::new(
            ErrorCode::UnknownTopicOrPartition,
            "the partition does not exist",
        )),
        Ok(BatchOutcome::Unverified(v)) => Err(Refusal::new(unverified_code(&v), v.to_string())),
        Ok(BatchOutcome::Behind(why)) => Err(Refusal::new(ErrorCode::KafkaStorageError, why)),
        // Fenced: this broker's session ended; NOT_LEADER makes the client
        // refresh its metadata and retry (elsewhere, or here once re-registered).
        Err(e) if matches!(*e, ClusterError::Fenced { .. }) => {
            Err(Refusal::new(ErrorCode::NotLeaderOrFollower, e.to_string()))
        }
        Err(e) => Err(Refusal::new(ErrorCode::KafkaStorageError, e.to_string())),
    }
}

/// `topic`'s row when it has `partition` (cluster mode); a failed lookup
/// is logged here.
async fn cluster_topic(
    front: &Front,
    topic: &str,
    partition: i32,
) -> Result<crate::backend::cluster::catalogue::TopicRow, PartitionError> {
    match front.topic(topic).await {
        Ok(Some(t)) if (0..t.partitions).contains(&partition) => Ok(t),
        Ok(_) => Err(PartitionError::Unknown),
        Err(e) => {
            crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, topic, partition, error = %e, "cluster: topic lookup failed");
            Err(PartitionError::Storage)
        }
    }
}

/// One partition of a Fetch ([`Logs::read_many`]).
#[derive(Debug, Clone, Copy)]
pub struct FetchAsk<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// The partition's own limit (`partition_max_bytes`).
    pub max_bytes: usize,
}

/// The bytes a Fetch may still take, handed out partition by partition in
/// the order asked: each gets at most its own limit and what is left, and
/// until some partition returned data a partition gets at least one whole
/// batch (so a batch larger than the limits still moves a consumer on).
#[derive(Debug, Clone)]
pub struct Budget {
    remaining: usize,
    total: usize,
}

impl Budget {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            remaining: max_bytes,
            total: 0,
        }
    }

    /// (this partition's limit, whether it must take one batch anyway).
    pub fn limit(&self, partition_max: usize) -> (usize, bool) {
        (partition_max.min(self.remaining), self.total == 0)
    }

    pub fn spend(&mut self, bytes: usize) {
        self.total += bytes;
        self.remaining = self.remaining.saturating_sub(bytes);
    }

    /// Bytes handed out so far.
    pub fn total(&self) -> usize {
        self.total
    }
}

/// [`Logs::read_many`] in a cluster.
async fn read_cluster(
    front: &Front,
    asks: &[FetchAsk<'_>],
    budget: &mut Budget,
    read_committed: bool,
    at_rest: bool,
) -> Vec<Result<crate::backend::local::partition::Read, PartitionError>> {
    use crate::backend::cluster::reader::{self, ReadRefusal};
    use crate::backend::local::partition::{Read, ReadError};
    let warn = |e: &ClusterError, topic: &str, partition: i32| {
        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, topic, partition, error = %e, "cluster: read failed");
        PartitionError::Storage
    };
    let mut out = Vec::with_capacity(asks.len());
    // (index into `out`, the ask) of the partitions that exist
    let mut known = Vec::with_capacity(asks.len());
    for (i, a) in asks.iter().enumerate() {
        match cluster_topic(front, a.topic, a.partition).await {
            Ok(t) => {
                known.push((
                    i,
                    reader::Ask {
                        topic_id: t.id,
                        partition: a.partition,
                        offset: a.offset,
                        max_bytes: a.max_bytes,
                    },
                ));
                out.push(Err(PartitionError::Unknown));
            }
            Err(e) => out.push(Err(e)),
        }
    }
    let ids: Vec<reader::Ask> = known.iter().map(|(_, a)| *a).collect();
    let source = if at_rest {
        reader::Source::AtRest
    } else {
        reader::Source::Cache
    };
    match reader::read_many(&front.cluster, &ids, budget, read_committed, source).await {
        Ok(answers) => {
            for ((i, _), answer) in known.iter().zip(answers) {
                let a = &asks[*i];
                out[*i] = match answer {
                    Ok(Some(r)) => Ok(Read {
                        high_watermark: r.high_watermark,
                        last_stable_offset: r.last_stable_offset,
                        log_start_offset: r.log_start_offset,
                        aborted: r.aborted,
                        data: r
                            .data
                            .map_err(|ReadRefusal::OutOfRange| ReadError::OutOfRange),
                    }),
                    Ok(None) => Err(PartitionError::Unknown),
                    Err(e) => Err(warn(&e, a.topic, a.partition)),
                };
            }
        }
        Err(e) => {
            for (i, _) in &known {
                let a = &asks[*i];
                out[*i] = Err(warn(&e, a.topic, a.partition));
            }
        }
    }
    out
}
