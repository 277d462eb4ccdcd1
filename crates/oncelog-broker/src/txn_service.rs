//! The transaction coordinator's I/O: its internal log
//! (`__transaction_state-0` in the data directory, one record per state
//! change, key = transactional id, value = the metadata as JSON), marker
//! delivery to partitions, the timeout reaper, and recovery at start.
//!
//! Ordering, for every state change: the new metadata is appended and
//! fsynced to the internal log before anything that depends on it happens
//! (a Prepare record before any marker; markers durable before Complete;
//! Complete before the answer). A Prepare* state found at start is driven
//! to completion again; markers are idempotent for a partition's producer
//! state (a second marker for a closed transaction closes nothing).
//!
//! All coordinator operations take one async lock; a produce only reads the
//! small producer view (producer id → current epoch and partitions of its open
//! transaction), which is updated before markers are written, so a batch
//! either lands before its transaction's marker or is refused.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, RwLock};

use oncelog_log::batch;
use tokio::sync::{oneshot, Mutex};

use crate::durability::SyncRequest;
use crate::internal_log::InternalLog;
use crate::snapshot;
use crate::topics::TopicError;
use crate::txn_coordinator::{self as tc, CoordError, EndPlan, InitPlan, TxnMeta, TxnState};
use crate::{now_ms, Broker};

/// What verification needs to know of a transactional producer id: its
/// current epoch (so a fenced producer is told so, not INVALID_TXN_STATE)
/// and the partitions of its open transaction (empty when none is open).
#[derive(Debug, Clone)]
pub struct ProducerView {
    pub epoch: i16,
    pub partitions: BTreeSet<(String, i32)>,
}

impl ProducerView {
    fn of(m: &TxnMeta) -> Self {
        Self {
            epoch: m.epoch,
            partitions: if m.state == TxnState::Ongoing {
                m.partitions.clone()
            } else {
                BTreeSet::new()
            },
        }
    }
}

/// Records `m` in the verification view; a producer id the transactional
/// id moved away from (epoch exhausted) is fenced for good.
fn update_view(map: &mut HashMap<i64, ProducerView>, m: &TxnMeta) {
    if m.prev_producer_id >= 0 && m.prev_producer_id != m.producer_id {
        map.insert(
            m.prev_producer_id,
            ProducerView {
                epoch: i16::MAX,
                partitions: BTreeSet::new(),
            },
        );
    }
    map.insert(m.producer_id, ProducerView::of(m));
}

struct Inner {
    txns: HashMap<String, TxnMeta>,
    log: InternalLog,
}

/// Counters for metrics. Fences are counted per (transactional id, cause);
/// past [`MAX_FENCE_LABELS`] ids, new ids are counted under `_other`.
#[derive(Debug, Default, Clone)]
pub struct TxnStats {
    pub fences: std::collections::BTreeMap<(String, &'static str), u64>,
    pub commits: u64,
    pub aborts: u64,
}

pub const MAX_FENCE_LABELS: usize = 1000;

pub struct TxnService {
    inner: Mutex<Inner>,
    stats: std::sync::Mutex<TxnStats>,
    /// Transaction durations, first partition added to completion: [commit, abort].
    pub durations: [crate::histogram::Histogram; 2],
    producers: RwLock<HashMap<i64, ProducerView>>,
    /// Stamped into every marker; partitions refuse markers from an older one.
    pub coordinator_epoch: i32,
}

/// Why a produce of a transactional batch is refused by verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyError {
    /// The producer's epoch is older than the coordinator's.
    StaleEpoch,
    /// No open transaction holds this partition for this producer.
    NotInTransaction,
}

impl TxnService {
    pub fn open(data_dir: &Path) -> Result<Self, TopicError> {
        let (log, records) = InternalLog::open(data_dir, "__transaction_state-0")?;
        let mut txns: HashMap<String, TxnMeta> = HashMap::new();
        for (key, value) in records {
            let Some(key) = key.and_then(|k| String::from_utf8(k).ok()) else {
                continue;
            };
            match value {
                None => {
                    txns.remove(&key);
                }
                Some(v) => {
                    let m = serde_json::from_slice::<TxnMeta>(&v).map_err(|e| {
                        TopicError::Storage(format!("transaction log record for {key}: {e}"))
                    })?;
                    txns.insert(key, m);
                }
            }
        }
        let mut producers = HashMap::new();
        for m in txns.values() {
            update_view(&mut producers, m);
        }
        tracing::info!(
            transactional_ids = txns.len(),
            "transaction coordinator loaded"
        );
        Ok(Self {
            inner: Mutex::new(Inner { txns, log }),
            stats: Default::default(),
            durations: [
                crate::histogram::Histogram::latency(),
                crate::histogram::Histogram::latency(),
            ],
            producers: RwLock::new(producers),
            coordinator_epoch: 0,
        })
    }

    fn count_fence(&self, id: &str, cause: &'static str) {
        let mut st = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let known = st.fences.keys().any(|(i, _)| i == id);
        let distinct = st
            .fences
            .keys()
            .map(|(i, _)| i)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let key = if known || distinct < MAX_FENCE_LABELS {
            id.to_string()
        } else {
            "_other".to_string()
        };
        *st.fences.entry((key, cause)).or_default() += 1;
    }

    pub fn stats(&self) -> TxnStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// (open transactions, start time of the oldest in ms).
    pub async fn open_transactions(&self) -> (usize, Option<i64>) {
        let inner = self.inner.lock().await;
        let open: Vec<i64> = inner
            .txns
            .values()
            .filter(|m| m.state == TxnState::Ongoing)
            .map(|m| m.start_ms)
            .collect();
        (open.len(), open.into_iter().filter(|t| *t >= 0).min())
    }

    /// Checks that a transactional batch belongs to an open transaction.
    pub fn verify(
        &self,
        pid: i64,
        epoch: i16,
        topic: &str,
        partition: i32,
    ) -> Result<(), VerifyError> {
        let map = self.producers.read().unwrap_or_else(|p| p.into_inner());
        match map.get(&pid) {
            Some(o) if epoch < o.epoch => Err(VerifyError::StaleEpoch),
            Some(o)
                if epoch == o.epoch && o.partitions.contains(&(topic.to_string(), partition)) =>
            {
                Ok(())
            }
            _ => Err(VerifyError::NotInTransaction),
        }
    }

    /// Appends one record (a tombstone when `value` is `None`) and fsyncs it.
    fn append_record(inner: &mut Inner, key: &str, value: Option<&[u8]>) -> Result<(), String> {
        inner.log.append(&[(Some(key.as_bytes()), value)])
    }

    /// Appends and fsyncs the new metadata, then makes it current.
    fn persist(&self, inner: &mut Inner, meta: TxnMeta) -> Result<(), String> {
        let value = serde_json::to_vec(&meta).map_err(|e| e.to_string())?;
        Self::append_record(inner, &meta.transactional_id, Some(&value))?;
        update_view(
            &mut self.producers.write().unwrap_or_else(|p| p.into_inner()),
            &meta,
        );
        inner.txns.insert(meta.transactional_id.clone(), meta);
        Ok(())
    }

    /// Persists a Prepare* state, writes its markers, persists the Complete state.
    async fn finish(
        &self,
        b: &Arc<Broker>,
        inner: &mut Inner,
        prepared: TxnMeta,
    ) -> Result<TxnMeta, String> {
        self.persist(inner, prepared.clone())?;
        let commit = prepared.state == TxnState::PrepareCommit;
        crate::fail_point(if commit {
            "txn-after-prepare-commit"
        } else {
            "txn-after-prepare-abort"
        });
        write_markers(b, &prepared, commit, self.coordinator_epoch).await;
        crate::fail_point("txn-after-markers");
        // Complete; an exhausted epoch moves the id to a fresh producer id.
        let mut alloc_err = None;
        let mut new_pid = || match b.producer_ids.next() {
            Ok(p) => p,
            Err(e) => {
                alloc_err = Some(e.to_string());
                -1
            }
        };
        let done = tc::complete_fence(&prepared, now_ms(), &mut new_pid);
        if let Some(e) = alloc_err {
            return Err(e);
        }
        self.persist(inner, done.clone())?;
        if commit {
            let now = now_ms();
            let mut topics: Vec<&String> = prepared
                .partitions
                .iter()
                .map(|(t, _)| t)
                .filter(|t| t.as_str() != crate::groups::OFFSETS_TOPIC)
                .collect();
            topics.dedup();
            for t in topics {
                b.writers.record_commit(t, &prepared.transactional_id, now);
            }
        }
        {
            let mut st = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            if commit {
                st.commits += 1;
            } else {
                st.aborts += 1;
            }
        }
        if prepared.start_ms >= 0 {
            let secs = (now_ms() - prepared.start_ms).max(0) as f64 / 1000.0;
            self.durations[usize::from(!commit)].observe(secs);
        }
        tracing::info!(transactional_id = %prepared.transactional_id, producer_id = prepared.producer_id,
            epoch = prepared.epoch, commit, partitions = prepared.partitions.len(), "transaction completed");
        Ok(done)
    }

    /// InitProducerId for a transactional id: (pid, epoch).
    pub async fn init_producer_id(
        &self,
        b: &Arc<Broker>,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> Result<(i64, i16), TxnError> {
        let mut inner = self.inner.lock().await;
        let mut alloc_err = None;
        let mut new_pid = || match b.producer_ids.next() {
            Ok(p) => p,
            Err(e) => {
                alloc_err = Some(e.to_string());
                -1
            }
        };
        let plan = tc::plan_init(
            inner.txns.get(id),
            id,
            timeout_ms,
            expected,
            now_ms(),
            &mut new_pid,
        )
        .map_err(TxnError::Coord)?;
        if let Some(e) = alloc_err.take() {
            return Err(TxnError::Storage(e));
        }
        let meta = match plan {
            InitPlan::Ready(m) => {
                self.persist(&mut inner, m.clone())
                    .map_err(TxnError::Storage)?;
                m
            }
            InitPlan::Fence(f) => {
                tracing::warn!(
                    transactional_id = id,
                    producer_id = f.producer_id,
                    old_epoch = f.epoch - 1,
                    new_epoch = f.epoch,
                    partitions = f.partitions.len(),
                    "producer fenced by a new InitProducerId; aborting its open transaction"
                );
                self.count_fence(id, "newer_producer");
                self.finish(b, &mut inner, f)
                    .await
                    .map_err(TxnError::Storage)?
            }
        };
        tracing::debug!(
            transactional_id = id,
            producer_id = meta.producer_id,
            epoch = meta.epoch,
            "InitProducerId"
        );
        Ok((meta.producer_id, meta.epoch))
    }

    pub async fn add_partitions(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Result<(), TxnError> {
        let mut inner = self.inner.lock().await;
        match tc::plan_add_partitions(inner.txns.get(id), pid, epoch, partitions, now_ms()) {
            Ok(None) => Ok(()),
            Ok(Some(m)) => self.persist(&mut inner, m).map_err(TxnError::Storage),
            Err(e) => {
                if e == CoordError::ProducerFenced {
                    tracing::warn!(
                        transactional_id = id,
                        producer_id = pid,
                        epoch,
                        "AddPartitionsToTxn from a fenced producer"
                    );
                }
                Err(TxnError::Coord(e))
            }
        }
    }

    /// EndTxn; `tv2` for EndTxn v5 (every end bumps the epoch). Returns the
    /// producer id and epoch the client uses next.
    pub async fn end_txn(
        &self,
        b: &Arc<Broker>,
        id: &str,
        pid: i64,
        epoch: i16,
        commit: bool,
        tv2: bool,
    ) -> Result<(i64, i16), TxnError> {
        let mut inner = self.inner.lock().await;
        let meta = inner.txns.get(id);
        let plan = if tv2 {
            tc::plan_end_v2(meta, pid, epoch, commit, now_ms())
        } else {
            tc::plan_end(meta, pid, epoch, commit, now_ms())
        };
        match plan {
            Ok(EndPlan::AlreadyDone) => Ok(meta.map_or((pid, epoch), |m| (m.producer_id, m.epoch))),
            Ok(EndPlan::Prepare(p)) => self
                .finish(b, &mut inner, p)
                .await
                .map(|m| (m.producer_id, m.epoch))
                .map_err(TxnError::Storage),
            Err(e) => {
                if e == CoordError::ProducerFenced {
                    tracing::warn!(
                        transactional_id = id,
                        producer_id = pid,
                        epoch,
                        commit,
                        "EndTxn from a fenced producer"
                    );
                }
                Err(TxnError::Coord(e))
            }
        }
    }

    /// Drives every Prepare* transaction found at start to completion.
    pub async fn recover(&self, b: &Arc<Broker>) {
        let mut inner = self.inner.lock().await;
        let pending: Vec<TxnMeta> = inner
            .txns
            .values()
            .filter(|m| matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort))
            .cloned()
            .collect();
        for m in pending {
            tracing::info!(transactional_id = %m.transactional_id, state = m.state.name(), "re-driving transaction markers after restart");
            let commit = m.state == TxnState::PrepareCommit;
            write_markers(b, &m, commit, self.coordinator_epoch).await;
            let done = tc::complete(&m, now_ms());
            if let Err(e) = self.persist(&mut inner, done) {
                tracing::error!(transactional_id = %m.transactional_id, error = %e, "could not complete a recovered transaction");
            }
        }
    }

    /// Aborts (with an epoch bump) every transaction past its timeout.
    pub async fn abort_timed_out(&self, b: &Arc<Broker>) {
        let mut inner = self.inner.lock().await;
        let now = now_ms();
        let expired: Vec<TxnMeta> = inner
            .txns
            .values()
            .filter_map(|m| tc::plan_timeout(m, now))
            .collect();
        for f in expired {
            self.count_fence(&f.transactional_id, "timeout");
            tracing::warn!(transactional_id = %f.transactional_id, producer_id = f.producer_id, old_epoch = f.epoch - 1, new_epoch = f.epoch,
                timeout_ms = f.timeout_ms, "transaction timed out; aborting it and fencing its producer");
            if let Err(e) = self.finish(b, &mut inner, f).await {
                tracing::error!(error = %e, "timeout abort failed");
            }
        }
    }

    /// Forgets transactional ids idle (no open transaction) since before
    /// `cutoff`, writing a tombstone for each.
    pub async fn expire_ids(&self, cutoff: i64) {
        let mut inner = self.inner.lock().await;
        let idle: Vec<String> = inner
            .txns
            .values()
            .filter(|m| {
                matches!(
                    m.state,
                    TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
                ) && m.update_ms < cutoff
            })
            .map(|m| m.transactional_id.clone())
            .collect();
        for id in idle {
            if Self::append_record(&mut inner, &id, None).is_err() {
                return;
            }
            if let Some(m) = inner.txns.remove(&id) {
                let mut view = self.producers.write().unwrap_or_else(|p| p.into_inner());
                view.remove(&m.producer_id);
            }
            tracing::info!(transactional_id = %id, "transactional id expired");
        }
    }

    /// An operator asked to abort `pid`'s transaction (WriteTxnMarkers from
    /// an admin tool). If the coordinator knows it, the abort goes through the
    /// coordinator: the producer is fenced (epoch + 1) and every partition of
    /// the transaction gets its ABORT marker, so a live transaction is never
    /// torn. Returns false when no open transaction of `pid` is known here.
    pub async fn admin_abort(&self, b: &Arc<Broker>, pid: i64) -> Result<bool, String> {
        let mut inner = self.inner.lock().await;
        let Some((m, f)) = inner
            .txns
            .values()
            .filter(|m| m.producer_id == pid)
            .find_map(|m| tc::plan_fence(m, now_ms()).map(|f| (m.clone(), f)))
        else {
            return Ok(false);
        };
        tracing::warn!(transactional_id = %m.transactional_id, producer_id = pid, old_epoch = m.epoch,
            new_epoch = f.epoch, cause = "administrator", "transaction aborted by an administrator; its producer is fenced");
        self.count_fence(&m.transactional_id, "administrator");
        self.finish(b, &mut inner, f).await?;
        Ok(true)
    }

    /// Whether the coordinator holds a transaction of `pid` that is open or
    /// being completed (its markers may still be on their way).
    pub async fn holds(&self, pid: i64) -> bool {
        self.inner.lock().await.txns.values().any(|m| {
            m.producer_id == pid
                && matches!(
                    m.state,
                    TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
                )
        })
    }

    /// Every known transactional id's metadata.
    pub async fn list(&self) -> Vec<TxnMeta> {
        self.inner.lock().await.txns.values().cloned().collect()
    }

    pub async fn describe(&self, id: &str) -> Option<TxnMeta> {
        self.inner.lock().await.txns.get(id).cloned()
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum TxnError {
    #[error("{0}")]
    Coord(CoordError),
    #[error("storage: {0}")]
    Storage(String),
}

/// Writes one marker per partition of `meta` and waits until all are
/// durable, retrying a partition whose write or sync fails.
async fn write_markers(b: &Arc<Broker>, meta: &TxnMeta, commit: bool, coordinator_epoch: i32) {
    let mut waits = Vec::new();
    for (topic, index) in &meta.partitions {
        if topic == crate::groups::OFFSETS_TOPIC {
            // The group coordinator's side: pending offsets become committed or go.
            let mut tries = 0u32;
            while let Err(e) = b.groups.complete_txn(meta.producer_id, commit).await {
                tries += 1;
                tracing::error!(transactional_id = %meta.transactional_id, error = %e, tries,
                    "offsets marker not written; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(200 * tries.min(10) as u64))
                    .await;
            }
            continue;
        }
        waits.push((
            topic.clone(),
            *index,
            write_marker(b, topic, *index, meta, commit, coordinator_epoch),
        ));
    }
    for (topic, index, first) in waits {
        let mut attempt = first;
        let mut tries = 0u32;
        loop {
            let res = match attempt {
                Ok(Some(rx)) => match rx.await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err("sync abandoned".to_string()),
                },
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            match res {
                Ok(()) => break,
                Err(e) => {
                    tries += 1;
                    tracing::error!(partition = %format!("{topic}-{index}"), transactional_id = %meta.transactional_id,
                        error = %e, tries, "transaction marker not written; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(
                        200 * tries.min(10) as u64,
                    ))
                    .await;
                    attempt = write_marker(b, &topic, index, meta, commit, coordinator_epoch);
                }
            }
        }
    }
}

/// Aborts an orphan: a transaction open at one partition that the
/// coordinator does not know (e.g. its id expired or its state was lost).
/// Writes one ABORT marker there and waits until it is durable.
pub async fn abort_orphan(
    b: &Arc<Broker>,
    topic: &str,
    index: i32,
    pid: i64,
    epoch: i16,
    coordinator_epoch: i32,
) -> Result<(), String> {
    let meta = TxnMeta {
        transactional_id: format!("(orphan of producer {pid})"),
        producer_id: pid,
        prev_producer_id: -1,
        epoch,
        last_epoch: -1,
        timeout_ms: 0,
        state: TxnState::PrepareAbort,
        partitions: Default::default(),
        start_ms: -1,
        update_ms: now_ms(),
    };
    tracing::warn!(partition = %format!("{topic}-{index}"), producer_id = pid, epoch,
        "aborting an orphaned transaction the coordinator does not know");
    match write_marker(b, topic, index, &meta, false, coordinator_epoch)? {
        Some(rx) => rx.await.map_err(|_| "sync abandoned".to_string())?,
        None => Ok(()),
    }
}

/// Appends one marker; `Ok(None)` when there is nothing to write there.
fn write_marker(
    b: &Arc<Broker>,
    topic: &str,
    index: i32,
    meta: &TxnMeta,
    commit: bool,
    coordinator_epoch: i32,
) -> Result<Option<oneshot::Receiver<Result<(), String>>>, String> {
    let Some(p) = b.topics.get(topic).and_then(|t| t.partition(index)) else {
        tracing::info!(partition = %format!("{topic}-{index}"), "marker skipped: partition no longer exists");
        return Ok(None);
    };
    let (end, generation) = {
        let mut st = p.lock();
        if let Err(e) = st
            .producers
            .check_marker(meta.producer_id, meta.epoch, coordinator_epoch)
        {
            tracing::error!(partition = %p.name(), producer_id = meta.producer_id, epoch = meta.epoch, error = %e,
                "marker refused by the partition");
            return Ok(None);
        }
        let mut m = batch::build_marker(
            meta.producer_id,
            meta.epoch,
            commit,
            coordinator_epoch,
            now_ms(),
        );
        let info = st.append(&mut m).map_err(|e| e.to_string())?;
        if info.rolled {
            snapshot::write(st.log.dir(), info.base_offset, &st.producers);
        }
        st.producers.apply_marker(
            meta.producer_id,
            meta.epoch,
            coordinator_epoch,
            info.base_offset,
            !commit,
            now_ms(),
        );
        (
            info.last_offset + 1,
            p.generation.load(std::sync::atomic::Ordering::Acquire),
        )
    };
    if b.interval_flush() {
        p.advance_high_watermark(end);
        b.data_notify.notify_waiters();
        return Ok(None);
    }
    let (tx, rx) = oneshot::channel();
    b.syncer.request(SyncRequest {
        partition: p,
        end_offset: end,
        generation,
        reply: tx,
    });
    Ok(Some(rx))
}
