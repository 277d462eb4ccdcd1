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
//! small producer view (producer id → transactional id, current epoch and
//! partitions of its open transaction), which is updated before markers are
//! written, so a batch either lands before its transaction's marker or is
//! refused.
//!
//! Every step is also noted in an in-memory [`TxnHistory`] (who held which
//! epoch, every fence with its cause and the client that caused it, recent
//! events) for operators; nothing here reads it back.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, RwLock};

use tokio::sync::Mutex;

use crate::durability::SyncReply;
use crate::internal_log::{InternalLog, PersistError};
use crate::partition::{Marker, MarkerError};
use crate::topics::TopicError;
use crate::txn_coordinator::{self as tc, CoordError, EndPlan, InitPlan, TxnMeta, TxnState};
use crate::txn_history::{Event, EventKind, Fence, FenceCause, Requester, TxnHistory};
use crate::{now_ms, Broker};
use oncelog_log::LogError;

/// What verification needs to know of a transactional producer id: its
/// current epoch (so a fenced producer is told so, not INVALID_TXN_STATE)
/// and the partitions of its open transaction (empty when none is open);
/// and, for log lines about refused writes, its transactional id.
#[derive(Debug, Clone)]
pub struct ProducerView {
    pub transactional_id: String,
    pub epoch: i16,
    pub partitions: BTreeSet<(String, i32)>,
}

impl ProducerView {
    fn of(m: &TxnMeta) -> Self {
        Self {
            transactional_id: m.transactional_id.clone(),
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
                transactional_id: m.transactional_id.clone(),
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

/// Counters for metrics. Fences are counted per (transactional id, cause)
/// and refused zombie writes per transactional id; past
/// [`MAX_FENCE_LABELS`] ids, new ids are counted under `_other`.
#[derive(Debug, Default, Clone)]
pub struct TxnStats {
    pub fences: std::collections::BTreeMap<(String, &'static str), u64>,
    pub zombie_writes: std::collections::BTreeMap<String, u64>,
    pub commits: u64,
    pub aborts: u64,
}

/// The label a counter keyed by transactional id uses for `id`: the id
/// itself while fewer than [`MAX_FENCE_LABELS`] ids are counted, else `_other`.
fn bounded_label<'a>(known: impl Iterator<Item = &'a String>, id: &str) -> String {
    let mut distinct = BTreeSet::new();
    for k in known {
        if k == id {
            return id.to_string();
        }
        distinct.insert(k);
    }
    if distinct.len() < MAX_FENCE_LABELS {
        id.to_string()
    } else {
        "_other".to_string()
    }
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
    /// Recent history per transactional id, for operators (in memory only).
    history: std::sync::Mutex<TxnHistory>,
}

/// What an operator's abort of a producer's transaction found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminAbort {
    /// The coordinator held it open: fenced and aborted on every partition.
    Aborted,
    /// The coordinator is completing it (markers on their way): no orphan
    /// marker may be written, it would race the transaction's own.
    Completing,
    /// The coordinator holds no transaction of this producer.
    NotKnown,
}

/// One EndTxn request: the transaction's identity and outcome; `tv2` for
/// EndTxn v5 (transaction version 2: every end bumps the epoch).
#[derive(Debug, Clone, Copy)]
pub struct EndRequest<'a> {
    pub id: &'a str,
    pub producer_id: i64,
    pub epoch: i16,
    pub commit: bool,
    pub tv2: bool,
}

/// Why a produce of a transactional batch is refused by verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The producer's epoch is older than the coordinator's.
    #[error("producer epoch is fenced")]
    StaleEpoch,
    /// No open transaction holds this partition for this producer.
    #[error("partition is not part of an ongoing transaction of this producer")]
    NotInTransaction,
}

impl TxnService {
    pub fn open(data_dir: &Path) -> Result<Self, TopicError> {
        let (log, records) = InternalLog::open(data_dir, "__transaction_state-0")?;
        let mut txns: HashMap<String, TxnMeta> = HashMap::new();
        let client_written = crate::datadir::client_written(data_dir, "__transaction_state-0");
        for (key, value) in records {
            let Some(key) = key.and_then(|k| String::from_utf8(k).ok()) else {
                continue;
            };
            match value {
                None => {
                    txns.remove(&key);
                }
                Some(v) => match serde_json::from_slice::<TxnMeta>(&v) {
                    Ok(m) => {
                        txns.insert(key, m);
                    }
                    // A client's record, from before internal names were
                    // reserved (see datadir::mark_client_written): skipped.
                    Err(e) if client_written => {
                        tracing::error!(key = %key, error = %e, "skipping a transaction log record the broker did not write");
                    }
                    Err(e) => {
                        return Err(TopicError::Storage(format!(
                            "transaction log record for {key}: {e}"
                        )))
                    }
                },
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
            history: std::sync::Mutex::new(TxnHistory::new(now_ms())),
        })
    }

    fn count_fence(&self, id: &str, cause: &'static str) {
        let mut st = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let key = bounded_label(st.fences.keys().map(|(i, _)| i), id);
        *st.fences.entry((key, cause)).or_default() += 1;
    }

    fn history(&self) -> std::sync::MutexGuard<'_, TxnHistory> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The history of one transactional id as JSON (see [`TxnHistory::to_json`]).
    pub fn history_json(&self, id: &str) -> serde_json::Value {
        self.history().to_json(id)
    }

    /// The transactional id the coordinator knows for a producer id.
    pub fn transactional_id_of(&self, pid: i64) -> Option<String> {
        let map = self.producers.read().unwrap_or_else(|p| p.into_inner());
        map.get(&pid).map(|v| v.transactional_id.clone())
    }

    /// A transactional produce was refused (a zombie's late write, or a
    /// partition outside its producer's open transaction): counts it per
    /// transactional id and notes it in that id's history. Returns the
    /// transactional id (the coordinator's, else the request's) for the log.
    /// Takes only plain locks and never awaits.
    pub fn rejected_write(
        &self,
        pid: i64,
        epoch: i16,
        partition: &(String, i32),
        request_id: Option<&str>,
        reason: &str,
        who: &Requester,
    ) -> Option<String> {
        let id = self
            .transactional_id_of(pid)
            .or_else(|| request_id.map(str::to_string));
        let label = id.clone().unwrap_or_else(|| "_unknown".to_string());
        {
            let mut st = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            let key = bounded_label(st.zombie_writes.keys(), &label);
            *st.zombie_writes.entry(key).or_default() += 1;
        }
        if let Some(id) = &id {
            let e = Event::new(now_ms(), EventKind::RejectedWrite, pid, epoch)
                .by(who)
                .partitions([partition])
                .detail(reason);
            self.history().event_if_known(id, e);
        }
        id
    }

    /// Notes a request refused because its producer is fenced.
    fn note_fenced_request(&self, id: &str, pid: i64, epoch: i16, what: &str, who: &Requester) {
        let e = Event::new(now_ms(), EventKind::FencedRequest, pid, epoch)
            .by(who)
            .detail(format!("{what} refused: producer fenced"));
        self.history().event_if_known(id, e);
    }

    /// Notes a fence (history only; the caller logs and counts it).
    fn note_fence(
        &self,
        before: &TxnMeta,
        after: &TxnMeta,
        cause: FenceCause,
        who: Option<&Requester>,
    ) {
        let open = before.state == TxnState::Ongoing;
        let f = Fence {
            time_ms: now_ms(),
            cause,
            producer_id: before.producer_id,
            old_epoch: before.epoch,
            new_epoch: after.epoch,
            client_id: who.and_then(|w| w.client_id.clone()),
            peer: who.and_then(|w| w.peer.map(|p| p.to_string())),
            open_transaction: open,
            aborted_partitions: if open {
                before
                    .partitions
                    .iter()
                    .map(|(t, p)| format!("{t}-{p}"))
                    .collect()
            } else {
                Vec::new()
            },
        };
        self.history().fence(&before.transactional_id, f);
    }

    /// Notes a completed transaction: its commit or abort event and, when
    /// the identity moved, the new epoch (`via` says how, `holder` who got it).
    fn note_end(
        &self,
        prepared: &TxnMeta,
        done: &TxnMeta,
        old_epoch: i16,
        via: &'static str,
        who: Option<&Requester>,
        holder: Option<&Requester>,
    ) {
        let now = now_ms();
        let kind = if prepared.state == TxnState::PrepareCommit {
            EventKind::Commit
        } else {
            EventKind::Abort
        };
        let mut e = Event::new(now, kind, prepared.producer_id, prepared.epoch)
            .partitions(&prepared.partitions);
        if let Some(w) = who {
            e = e.by(w);
        }
        if old_epoch != prepared.epoch {
            e = e.old_epoch(old_epoch);
        }
        let mut detail = Vec::new();
        if prepared.start_ms >= 0 {
            detail.push(format!(
                "{} ms after it began",
                (now - prepared.start_ms).max(0)
            ));
        }
        if done.producer_id != prepared.producer_id {
            detail.push(format!(
                "epoch exhausted: producer id {} at epoch 0 next",
                done.producer_id
            ));
        }
        let id = &prepared.transactional_id;
        let mut h = self.history();
        h.event(id, e.detail(detail.join("; ")));
        h.epoch(id, done.producer_id, done.epoch, now, via, holder);
    }

    /// Notes a successful InitProducerId: a new id, a retry, the producer's
    /// own bump (KIP-360), or a newer producer fencing an idle previous one.
    fn note_init(
        &self,
        before: Option<&TxnMeta>,
        after: &TxnMeta,
        expected: Option<(i64, i16)>,
        who: &Requester,
    ) {
        let now = now_ms();
        let id = &after.transactional_id;
        let init = Event::new(now, EventKind::Init, after.producer_id, after.epoch).by(who);
        let Some(b) = before else {
            let mut h = self.history();
            h.event(id, init.detail("new transactional id"));
            h.epoch(id, after.producer_id, after.epoch, now, "init", Some(who));
            return;
        };
        if (b.producer_id, b.epoch) == (after.producer_id, after.epoch) {
            self.history()
                .event(id, init.detail("retry: the same identity answered again"));
            return;
        }
        if expected == Some((b.producer_id, b.epoch)) {
            let mut h = self.history();
            h.event(
                id,
                init.old_epoch(b.epoch)
                    .detail("the producer re-initialised its own identity"),
            );
            h.epoch(id, after.producer_id, after.epoch, now, "init", Some(who));
            return;
        }
        // A new producer took the id: whoever held the old epoch is fenced.
        // Nothing was open, so nothing is aborted (a restart looks like this).
        tracing::info!(transactional_id = %id, producer_id = b.producer_id, old_epoch = b.epoch,
            new_epoch = after.epoch, client_id = who.client_id.as_deref().unwrap_or(""),
            peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(),
            "a newer producer took the transactional id; the previous epoch is fenced");
        self.note_fence(b, after, FenceCause::NewerProducer, Some(who));
        self.history().epoch(
            id,
            after.producer_id,
            after.epoch,
            now,
            "newer_producer",
            Some(who),
        );
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
    fn append_record(inner: &mut Inner, key: &str, value: Option<&[u8]>) -> Result<(), LogError> {
        inner.log.append(&[(Some(key.as_bytes()), value)])
    }

    /// Appends and fsyncs the new metadata, then makes it current.
    fn persist(&self, inner: &mut Inner, meta: TxnMeta) -> Result<(), PersistError> {
        let value = serde_json::to_vec(&meta)?;
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
        self.persist(inner, prepared.clone())
            .map_err(|e| e.to_string())?;
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
        self.persist(inner, done.clone())
            .map_err(|e| e.to_string())?;
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

    /// InitProducerId for a transactional id: (pid, epoch). `who` sent it.
    pub async fn init_producer_id(
        &self,
        b: &Arc<Broker>,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
        who: &Requester,
    ) -> Result<(i64, i16), TxnError> {
        let mut inner = self.inner.lock().await;
        let before = inner.txns.get(id).cloned();
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
        .map_err(|e| {
            if e == CoordError::ProducerFenced {
                let (pid, epoch) = expected.unwrap_or((-1, -1));
                self.note_fenced_request(id, pid, epoch, "InitProducerId", who);
            }
            TxnError::Coord(e)
        })?;
        if let Some(e) = alloc_err.take() {
            return Err(TxnError::Storage(e));
        }
        let meta = match plan {
            InitPlan::Ready(m) => {
                self.persist(&mut inner, m.clone())
                    .map_err(|e| TxnError::Storage(e.to_string()))?;
                self.note_init(before.as_ref(), &m, expected, who);
                m
            }
            InitPlan::Fence(f) => {
                tracing::warn!(
                    transactional_id = id,
                    producer_id = f.producer_id,
                    old_epoch = f.epoch - 1,
                    new_epoch = f.epoch,
                    partitions = f.partitions.len(),
                    client_id = who.client_id.as_deref().unwrap_or(""),
                    peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(),
                    "producer fenced by a new InitProducerId; aborting its open transaction"
                );
                self.count_fence(id, "newer_producer");
                if let Some(old) = &before {
                    self.note_fence(old, &f, FenceCause::NewerProducer, Some(who));
                }
                let done = self
                    .finish(b, &mut inner, f.clone())
                    .await
                    .map_err(TxnError::Storage)?;
                self.note_end(&f, &done, f.epoch, "newer_producer", None, Some(who));
                done
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

    /// Adds partitions to the open transaction (opening one if needed), for
    /// a requester the caller does not name.
    pub async fn add_partitions(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Result<(), TxnError> {
        self.add_partitions_by(id, pid, epoch, partitions, &Requester::default())
            .await
    }

    /// Adds partitions to the open transaction (opening one if needed).
    pub async fn add_partitions_by(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        partitions: &[(String, i32)],
        who: &Requester,
    ) -> Result<(), TxnError> {
        let mut inner = self.inner.lock().await;
        let before = inner.txns.get(id);
        let was_open = before.is_some_and(|m| m.state == TxnState::Ongoing);
        let had = before.map(|m| m.partitions.clone()).unwrap_or_default();
        match tc::plan_add_partitions(before, pid, epoch, partitions, now_ms()) {
            Ok(None) => Ok(()),
            Ok(Some(m)) => {
                self.persist(&mut inner, m.clone())
                    .map_err(|e| TxnError::Storage(e.to_string()))?;
                let (kind, added): (EventKind, Vec<&(String, i32)>) = if was_open {
                    let added = m.partitions.iter().filter(|p| !had.contains(p)).collect();
                    (EventKind::AddPartitions, added)
                } else {
                    (EventKind::Begin, m.partitions.iter().collect())
                };
                let e = Event::new(now_ms(), kind, pid, epoch)
                    .by(who)
                    .partitions(added);
                self.history().event(id, e);
                Ok(())
            }
            Err(e) => {
                if e == CoordError::ProducerFenced {
                    tracing::warn!(
                        transactional_id = id,
                        producer_id = pid,
                        epoch,
                        client_id = who.client_id.as_deref().unwrap_or(""),
                        peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(),
                        "AddPartitionsToTxn from a fenced producer"
                    );
                    self.note_fenced_request(id, pid, epoch, "AddPartitionsToTxn", who);
                }
                Err(TxnError::Coord(e))
            }
        }
    }

    /// EndTxn. Returns the producer id and epoch the client uses next.
    pub async fn end_txn(
        &self,
        b: &Arc<Broker>,
        req: EndRequest<'_>,
        who: &Requester,
    ) -> Result<(i64, i16), TxnError> {
        let EndRequest {
            id,
            producer_id: pid,
            epoch,
            commit,
            tv2,
        } = req;
        let mut inner = self.inner.lock().await;
        let meta = inner.txns.get(id);
        let plan = if tv2 {
            tc::plan_end_v2(meta, pid, epoch, commit, now_ms())
        } else {
            tc::plan_end(meta, pid, epoch, commit, now_ms())
        };
        match plan {
            Ok(EndPlan::AlreadyDone) => Ok(meta.map_or((pid, epoch), |m| (m.producer_id, m.epoch))),
            Ok(EndPlan::Prepare(p)) => {
                let done = self
                    .finish(b, &mut inner, p.clone())
                    .await
                    .map_err(TxnError::Storage)?;
                self.note_end(&p, &done, epoch, "end_txn", Some(who), Some(who));
                Ok((done.producer_id, done.epoch))
            }
            Err(e) => {
                if e == CoordError::ProducerFenced {
                    tracing::warn!(
                        transactional_id = id,
                        producer_id = pid,
                        epoch,
                        commit,
                        client_id = who.client_id.as_deref().unwrap_or(""),
                        peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(),
                        "EndTxn from a fenced producer"
                    );
                    let what = if commit {
                        "EndTxn(commit)"
                    } else {
                        "EndTxn(abort)"
                    };
                    self.note_fenced_request(id, pid, epoch, what, who);
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
            if let Err(e) = self.persist(&mut inner, done.clone()) {
                tracing::error!(transactional_id = %m.transactional_id, error = %e, "could not complete a recovered transaction");
                continue;
            }
            let kind = if commit {
                EventKind::Commit
            } else {
                EventKind::Abort
            };
            let e = Event::new(now_ms(), kind, m.producer_id, m.epoch)
                .partitions(&m.partitions)
                .detail("markers re-driven after a restart");
            self.history().event(&m.transactional_id, e);
        }
    }

    /// Aborts (with an epoch bump) every transaction past its timeout.
    pub async fn abort_timed_out(&self, b: &Arc<Broker>) {
        let mut inner = self.inner.lock().await;
        let now = now_ms();
        let expired: Vec<(TxnMeta, TxnMeta)> = inner
            .txns
            .values()
            .filter_map(|m| tc::plan_timeout(m, now).map(|f| (m.clone(), f)))
            .collect();
        for (m, f) in expired {
            self.count_fence(&f.transactional_id, "timeout");
            tracing::warn!(transactional_id = %f.transactional_id, producer_id = f.producer_id, old_epoch = f.epoch - 1, new_epoch = f.epoch,
                timeout_ms = f.timeout_ms, "transaction timed out; aborting it and fencing its producer");
            self.note_fence(&m, &f, FenceCause::Timeout, None);
            match self.finish(b, &mut inner, f.clone()).await {
                Ok(done) => self.note_end(&f, &done, f.epoch, "timeout", None, None),
                Err(e) => tracing::error!(error = %e, "timeout abort failed"),
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
                drop(view);
                let e = Event::new(now_ms(), EventKind::Expired, m.producer_id, m.epoch);
                self.history().event_if_known(&id, e);
            }
            tracing::info!(transactional_id = %id, "transactional id expired");
        }
    }

    /// An operator asked to abort `pid`'s transaction (WriteTxnMarkers from
    /// an admin tool). If the coordinator knows it, the abort goes through the
    /// coordinator: the producer is fenced (epoch + 1) and every partition of
    /// the transaction gets its ABORT marker, so a live transaction is never
    /// torn. `who` is the administrator's client.
    pub async fn admin_abort(
        &self,
        b: &Arc<Broker>,
        pid: i64,
        who: &Requester,
    ) -> Result<AdminAbort, String> {
        let mut inner = self.inner.lock().await;
        let Some((m, f)) = inner
            .txns
            .values()
            .filter(|m| m.producer_id == pid)
            .find_map(|m| tc::plan_fence(m, now_ms()).map(|f| (m.clone(), f)))
        else {
            let completing = inner.txns.values().any(|m| {
                m.producer_id == pid
                    && matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort)
            });
            return Ok(if completing {
                AdminAbort::Completing
            } else {
                AdminAbort::NotKnown
            });
        };
        tracing::warn!(transactional_id = %m.transactional_id, producer_id = pid, old_epoch = m.epoch,
            new_epoch = f.epoch, cause = "administrator", client_id = who.client_id.as_deref().unwrap_or(""),
            peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(),
            "transaction aborted by an administrator; its producer is fenced");
        self.count_fence(&m.transactional_id, "administrator");
        self.note_fence(&m, &f, FenceCause::Administrator, Some(who));
        let done = self.finish(b, &mut inner, f.clone()).await?;
        self.note_end(&f, &done, f.epoch, "administrator", Some(who), None);
        Ok(AdminAbort::Aborted)
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
) -> Result<Option<SyncReply>, String> {
    let Some(p) = b.topics.get(topic).and_then(|t| t.partition(index)) else {
        tracing::info!(partition = %format!("{topic}-{index}"), "marker skipped: partition no longer exists");
        return Ok(None);
    };
    let marker = Marker {
        producer_id: meta.producer_id,
        epoch: meta.epoch,
        commit,
        coordinator_epoch,
    };
    match p.write_marker(marker, b.durability()) {
        Ok(reply) => Ok(reply),
        Err(MarkerError::Closed(_)) => {
            tracing::info!(partition = %p.name(), "marker skipped: the topic was deleted");
            Ok(None)
        }
        Err(MarkerError::Refused(e)) => {
            tracing::error!(partition = %p.name(), producer_id = meta.producer_id, epoch = meta.epoch, error = %e,
                "marker refused by the partition");
            Ok(None)
        }
        Err(MarkerError::Storage(e)) => Err(e.to_string()),
    }
}
