//! Gathers produce requests across partitions for up to `cluster.flush.ms`
//! (or `cluster.flush.bytes`), writes them as one object, then commits them
//! in one PostgreSQL transaction ([`super::sequencer::commit_flush`]); each
//! request is answered after that commit.
//!
//! The PUT of a flush may overlap the commit of the one before, but commits
//! run one at a time in flush order: batches of one producer that arrive in
//! order are sequenced in order, as the idempotence rules need.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use oncelog_log::batch::BatchHeader;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::keys::ObjectKey;
use super::sequencer::{self, BatchOutcome, FlushBatch};
use super::{Cluster, ClusterError};
use crate::backend::local::partition::producer_batch;
use crate::observe::histogram::Histogram;

/// What a produce request gets back: the commit's outcome for its batch,
/// or why nothing was committed (always retriable but for bad input).
pub type ProduceResult = Result<BatchOutcome, Arc<ClusterError>>;

struct Submit {
    topic_id: Uuid,
    topic: Arc<str>,
    partition: i32,
    data: Bytes,
    reply: oneshot::Sender<ProduceResult>,
    at: Instant,
}

/// A flush whose object is being written.
struct Flight {
    size: u64,
    data: Bytes,
    batches: Vec<FlushBatch>,
    replies: Vec<(oneshot::Sender<ProduceResult>, Instant)>,
    /// The PUT, and the key it wrote.
    put: tokio::task::JoinHandle<Result<ObjectKey, ClusterError>>,
}

/// Figures for /metrics and the benchmark.
pub struct FlushStats {
    pub flushes: AtomicU64,
    pub failed_flushes: AtomicU64,
    pub batches: AtomicU64,
    pub bytes: AtomicU64,
    /// The produce commit's PostgreSQL transaction, begin to commit.
    pub commit_latency: Histogram,
    /// A batch's wait from arrival to its answer.
    pub ack_latency: Histogram,
}

impl Default for FlushStats {
    fn default() -> Self {
        Self {
            flushes: AtomicU64::new(0),
            failed_flushes: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            commit_latency: Histogram::latency(),
            ack_latency: Histogram::latency(),
        }
    }
}

/// The produce side of a cluster broker.
pub struct Flusher {
    tx: mpsc::Sender<Submit>,
    pub stats: Arc<FlushStats>,
}

impl Flusher {
    /// Starts the gathering and committing tasks on the current runtime.
    pub fn start(cluster: Arc<Cluster>) -> Self {
        let (tx, rx) = mpsc::channel(8192);
        let (ftx, frx) = mpsc::channel(4);
        let stats = Arc::new(FlushStats::default());
        tokio::spawn(gather(cluster.clone(), rx, ftx));
        tokio::spawn(commit_in_order(cluster, frx, stats.clone()));
        Self { tx, stats }
    }

    /// Queues one client batch (already validated) for a partition, in
    /// call order; the receiver gets the answer once its flush committed.
    pub async fn submit(
        &self,
        topic_id: Uuid,
        topic: &str,
        partition: i32,
        data: Bytes,
    ) -> Result<oneshot::Receiver<ProduceResult>, Arc<ClusterError>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Submit {
                topic_id,
                topic: Arc::from(topic),
                partition,
                data,
                reply,
                at: Instant::now(),
            })
            .await
            .map_err(|_| stopped())?;
        Ok(rx)
    }

    /// [`Self::submit`] and wait for the answer.
    pub async fn produce(
        &self,
        topic_id: Uuid,
        topic: &str,
        partition: i32,
        data: Bytes,
    ) -> ProduceResult {
        let rx = self.submit(topic_id, topic, partition, data).await?;
        rx.await.map_err(|_| stopped())?
    }
}

fn stopped() -> Arc<ClusterError> {
    Arc::new(ClusterError::Invariant("the flusher stopped".into()))
}

async fn gather(
    cluster: Arc<Cluster>,
    mut rx: mpsc::Receiver<Submit>,
    flights: mpsc::Sender<Flight>,
) {
    while let Some(first) = rx.recv().await {
        let deadline = tokio::time::Instant::now() + cluster.config.flush_interval;
        // The object's key is settled as the window opens, so the round trip
        // that reserves a new slab of keys (one flush in [`super::keys::SLAB_KEYS`])
        // overlaps the gathering instead of delaying the PUT.
        let key = {
            let cluster = cluster.clone();
            tokio::spawn(async move {
                cluster.session.check_live()?;
                let session = cluster.session.session();
                cluster.keys.next(&cluster.pool, session).await
            })
        };
        let mut subs = vec![first];
        let mut bytes = subs[0].data.len();
        while bytes < cluster.config.flush_bytes {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(s)) => {
                    bytes += s.data.len();
                    subs.push(s);
                }
                Ok(None) | Err(_) => break,
            }
        }
        let flight = assemble(&cluster, key, subs);
        if flights.send(flight).await.is_err() {
            return;
        }
    }
}

/// Lays the batches out in one object and starts its PUT once its `key` is
/// reserved.
fn assemble(
    cluster: &Arc<Cluster>,
    key: tokio::task::JoinHandle<Result<ObjectKey, ClusterError>>,
    subs: Vec<Submit>,
) -> Flight {
    let total: usize = subs.iter().map(|s| s.data.len()).sum();
    let mut buf = BytesMut::with_capacity(total);
    let mut batches = Vec::with_capacity(subs.len());
    let mut replies = Vec::with_capacity(subs.len());
    for s in subs {
        let position = buf.len() as u64;
        let Ok(h) = BatchHeader::new(&s.data) else {
            let _ = s.reply.send(Err(Arc::new(ClusterError::Invariant(
                "a batch reached the flusher without a valid header".into(),
            ))));
            continue;
        };
        let producer = (h.producer_id() >= 0).then(|| producer_batch(&h));
        batches.push(FlushBatch {
            topic_id: s.topic_id,
            topic: s.topic.clone(),
            partition: s.partition,
            position,
            length: s.data.len() as u32,
            last_offset_delta: h.last_offset_delta(),
            max_timestamp: h.max_timestamp(),
            producer,
        });
        buf.extend_from_slice(&s.data);
        replies.push((s.reply, s.at));
    }
    let data = buf.freeze();
    let size = data.len() as u64;
    let put = {
        let cluster = cluster.clone();
        let data = data.clone();
        tokio::spawn(async move {
            let key = key
                .await
                .map_err(|e| ClusterError::Invariant(format!("the key task failed: {e}")))??;
            cluster.objects.put(&key.key, data).await?;
            Ok(key)
        })
    };
    Flight {
        size,
        data,
        batches,
        replies,
        put,
    }
}

async fn commit_in_order(
    cluster: Arc<Cluster>,
    mut flights: mpsc::Receiver<Flight>,
    stats: Arc<FlushStats>,
) {
    while let Some(f) = flights.recv().await {
        let put = match f.put.await {
            Ok(r) => r,
            Err(e) => Err(ClusterError::Invariant(format!("the PUT task failed: {e}"))),
        };
        let t = Instant::now();
        let key = put.as_ref().map(|k| k.key.clone()).unwrap_or_default();
        let result = match put {
            Ok(key) => {
                sequencer::commit_flush(
                    &cluster.pool,
                    &|t, p, n| cluster.check_next(t, p, n),
                    cluster.has_peers(),
                    &key,
                    f.size,
                    &f.batches,
                )
                .await
            }
            Err(e) => Err(e),
        };
        stats.flushes.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok((outcomes, advanced)) => {
                stats.commit_latency.observe_duration(t.elapsed());
                cluster.cache.insert(&key, f.data.clone());
                for ((b, o), (reply, at)) in f.batches.iter().zip(outcomes).zip(f.replies) {
                    if matches!(o, BatchOutcome::Appended { .. }) {
                        stats.batches.fetch_add(1, Ordering::Relaxed);
                        stats
                            .bytes
                            .fetch_add(u64::from(b.length), Ordering::Relaxed);
                    }
                    stats.ack_latency.observe_duration(at.elapsed());
                    let _ = reply.send(Ok(o));
                }
                // The commit announced them to the other brokers.
                cluster.advanced(&advanced);
            }
            Err(e) => {
                stats.failed_flushes.fetch_add(1, Ordering::Relaxed);
                crate::backend::cluster::outage::cluster_warn!(cluster.outage, e, object = %key, error = %e, "cluster: a flush was not committed; its batches get a retriable error");
                let e = Arc::new(e);
                for (reply, _) in f.replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// How long a produce may wait for its flush before the broker answers
/// REQUEST_TIMED_OUT (the batch may still commit: a retry is then answered
/// as a duplicate, for idempotent producers).
pub const PRODUCE_TIMEOUT: Duration = Duration::from_secs(30);
