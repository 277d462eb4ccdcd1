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
//! Concurrency is per transactional id: a state change of an id (its
//! persist, markers, completion) holds that id's async lock, and nothing
//! else. Different ids change state at once; their records share fsyncs
//! through the internal log's group commit ([`LogWriter`]). A request that
//! waits longer than [`ID_LOCK_WAIT`] for its id (the id is completing a
//! transaction whose markers cannot be written) is answered
//! CONCURRENT_TRANSACTIONS, which clients retry. Readers (describe, list,
//! metrics, the orphan check) read the durable state without that lock.
//!
//! A produce only reads the small producer view (producer id →
//! transactional id, current epoch and partitions of its open transaction),
//! which is updated before markers are written, so a batch either lands
//! before its transaction's marker or is refused.
//!
//! Markers that cannot be written are retried with a capped backoff for as
//! long as it takes (a prepared outcome is never given up); after
//! [`STUCK_AFTER`] failed tries the transaction is listed as stuck (metrics,
//! the id's history) until its markers are durable.
//!
//! Every step is also noted in an in-memory [`TxnHistory`] (who held which
//! epoch, every fence with its cause and the client that caused it, recent
//! events) for operators; nothing here reads it back.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::backend::local::internal_log::CompactPolicy;
use crate::backend::local::internal_log::{InternalLog, PersistError, Record};
use crate::backend::local::partition::{durable, SyncError, SyncReply};
use crate::backend::local::partition::{Marker, MarkerError};
use crate::backend::storage::{PartitionStore, SharedStateLog};
use crate::error::{ErrorCode, Gate, TopicError};
use crate::machines::txn_coordinator::{
    self as tc, update_view, CoordError, Effect, TxnMeta, TxnState,
};
pub use crate::machines::txn_coordinator::{ParkPolicy, ProducerView, VerifyError};
use crate::observe::txn_history::{
    Event, EventKind, Fence, FenceCause, Note, Requester, TxnHistory,
};
use oncelog_log::now_ms;
use oncelog_log::LogError;

/// What the coordinator's driver needs from the rest of the broker: the
/// partitions markers go to, the group
/// coordinator's side of transactional offsets, fresh producer ids, and the
/// per-topic commit bookkeeping. The broker implements it; the coordinator
/// reaches nothing else of it.
pub trait TxnRuntime: Send + Sync + 'static {
    fn txn(&self) -> &TxnService;
    fn partition(&self, topic: &str, index: i32) -> Option<Arc<dyn PartitionStore>>;
    /// The producer's pending transactional offsets become committed (or go).
    fn complete_offsets(
        &self,
        producer_id: i64,
        commit: bool,
    ) -> impl std::future::Future<Output = Result<(), PersistError>> + Send;
    fn next_producer_id(&self) -> Result<i64, TopicError>;
    /// A transaction of `transactional_id` committed to `topic`.
    fn record_commit(&self, topic: &str, transactional_id: &str, now_ms: i64);
    /// May `transactional_id` commit a transaction holding `topic`
    /// (writer fence and cut-over, [`crate::coordinators::cutover`])? Asked under the id's
    /// lock, in the step that persists the PrepareCommit.
    fn commit_gate(&self, topic: &str, transactional_id: &str) -> Result<(), Gate>;
    /// Must `transactional_id`'s open transaction holding `topic` be kept
    /// from an abort by a new InitProducerId (a cut-over's drain)?
    fn protects(&self, topic: &str, transactional_id: &str) -> bool;
}

/// The topic being cut over that `m`'s open transaction holds as the old
/// writer's ([`TxnRuntime::protects`]), if any. While the cut-over drains,
/// such a transaction ends only by its own EndTxn or at the drain deadline:
/// neither a new InitProducerId nor its timeout aborts it, so the
/// transaction a savepoint handed to the new job is still there for the
/// new job's committer.
fn drain_holds<'m, R: TxnRuntime + ?Sized>(b: &R, m: &'m TxnMeta) -> Option<&'m str> {
    if m.state != TxnState::Ongoing {
        return None;
    }
    m.partitions
        .iter()
        .map(|(t, _)| t.as_str())
        .find(|t| b.protects(t, &m.transactional_id))
}

/// May a transaction add a partition of `topic` (`true`: its open
/// transaction already holds one)? Asked under the id's lock, in the step
/// that persists the add.
pub type WriteGate<'a> = &'a (dyn Fn(&str, bool) -> Result<(), Gate> + Send + Sync);

/// Whether `m`'s transaction (open or completing) holds a partition of `topic`.
pub fn holds_topic(m: &TxnMeta, topic: &str) -> bool {
    matches!(
        m.state,
        TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
    ) && m.partitions.iter().any(|(t, _)| t == topic)
}

/// How long a request waits for its transactional id before it is answered
/// CONCURRENT_TRANSACTIONS.
pub const ID_LOCK_WAIT: Duration = Duration::from_secs(5);

/// Failed marker writes after which a transaction is listed as stuck.
pub const STUCK_AFTER: u32 = 3;

/// The wait before retry `tries` of a marker: doubling from 100 ms, at most 5 s.
fn backoff(tries: u32) -> Duration {
    Duration::from_millis((100u64 << tries.min(6)).min(5_000))
}

/// A transaction whose markers keep failing at a partition.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stuck {
    pub producer_id: i64,
    pub epoch: i16,
    pub commit: bool,
    pub partition: String,
    pub tries: u32,
    pub since_ms: i64,
    pub error: String,
}

/// The lock of one transactional id, held across its state change.
pub struct IdLock {
    id: String,
    _guard: OwnedMutexGuard<()>,
}

/// The transaction log record of `m`: key = transactional id, value = JSON.
fn record_of(
    m: &TxnMeta,
) -> Result<Vec<crate::backend::local::internal_log::Record>, PersistError> {
    Ok(vec![(
        Some(m.transactional_id.as_bytes().to_vec()),
        Some(serde_json::to_vec(m)?),
    )])
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
    /// The durable state of every transactional id (what the log holds);
    /// changed only by [`Self::persist`], under the id's lock.
    txns: RwLock<HashMap<String, TxnMeta>>,
    /// One lock per transactional id (see the module comment).
    locks: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
    log: SharedStateLog,
    /// Transactions whose markers keep failing, by transactional id.
    stuck: std::sync::Mutex<BTreeMap<String, Stuck>>,
    stats: std::sync::Mutex<TxnStats>,
    /// Transaction durations, first partition added to completion: [commit, abort].
    pub durations: [crate::observe::histogram::Histogram; 2],
    producers: RwLock<HashMap<i64, ProducerView>>,
    /// Stamped into every marker; partitions refuse markers from an older one.
    pub coordinator_epoch: i32,
    /// Recent history per transactional id, for operators (in memory only).
    history: std::sync::Mutex<TxnHistory>,
    /// Where the history's notes go instead of `history` (cluster mode:
    /// rows in PostgreSQL every broker reads).
    journal: std::sync::OnceLock<HistoryJournal>,
    /// What a transaction past its timeout becomes (abort, or park).
    park: ParkPolicy,
    /// When each parked transaction was last reported in the log.
    parked_reported: std::sync::Mutex<HashMap<String, i64>>,
}

/// Where a shared history's notes are sent: (transactional id, note).
pub type HistoryJournal = tokio::sync::mpsc::Sender<(String, Note)>;

/// How often a parked transaction is reported in the log.
pub const PARKED_REPORT_INTERVAL_MS: i64 = 60_000;

/// A transaction kept open past its timeout under the park policy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Parked {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub start_ms: i64,
    pub timeout_ms: i32,
    /// When its timeout passed.
    pub parked_since_ms: i64,
    pub partitions: Vec<String>,
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

/// InitProducerId's answer: the identity to use, and the identity of the
/// prepared transaction it kept (KIP-939), if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Init {
    pub producer_id: i64,
    pub epoch: i16,
    pub kept: Option<(i64, i16)>,
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

impl TxnService {
    /// Opens the transaction log in `data_dir` and loads every id's state;
    /// the log compacts itself as `compact` says (the last record per id).
    pub fn open(data_dir: &Path, compact: CompactPolicy) -> Result<Self, TopicError> {
        let (log, records) = InternalLog::open(data_dir, "__transaction_state-0")?;
        let log = log.with_compactor(
            Box::new(crate::backend::local::internal_log::compact_keyed),
            compact,
        );
        let client_written =
            crate::backend::local::datadir::client_written(data_dir, "__transaction_state-0");
        let txns = load(records, client_written)?;
        let log = log
            .into_writer("__transaction_state-0")
            .map_err(|e| TopicError::Storage(format!("transaction log writer: {e}")))?;
        Ok(Self::loaded(Arc::new(log), txns))
    }

    /// A coordinator over `log`, whose durable records so far are
    /// `records` (a log of another kind than the data directory's: the
    /// simulation's in-memory log, replayed after a crash).
    pub fn replay(log: SharedStateLog, records: Vec<Record>) -> Result<Self, TopicError> {
        Ok(Self::loaded(log, load(records, false)?))
    }

    fn loaded(log: SharedStateLog, txns: HashMap<String, TxnMeta>) -> Self {
        let mut producers = HashMap::new();
        for m in txns.values() {
            update_view(&mut producers, m);
        }
        tracing::info!(
            transactional_ids = txns.len(),
            "transaction coordinator loaded"
        );
        Self::with_log(log, txns, producers)
    }

    /// A coordinator whose log keeps nothing ([`crate::backend::local::internal_log::MemoryLog`]):
    /// cluster mode's, whose transactions are PostgreSQL's rows.
    pub fn in_memory() -> std::io::Result<Self> {
        Ok(Self::with_log(
            Arc::new(crate::backend::local::internal_log::MemoryLog::start(
                "__transaction_state",
            )?),
            HashMap::new(),
            HashMap::new(),
        ))
    }

    fn with_log(
        log: SharedStateLog,
        txns: HashMap<String, TxnMeta>,
        producers: HashMap<i64, ProducerView>,
    ) -> Self {
        Self {
            txns: RwLock::new(txns),
            locks: Default::default(),
            log,
            stuck: Default::default(),
            stats: Default::default(),
            durations: [
                crate::observe::histogram::Histogram::latency(),
                crate::observe::histogram::Histogram::latency(),
            ],
            producers: RwLock::new(producers),
            coordinator_epoch: 0,
            history: std::sync::Mutex::new(TxnHistory::new(now_ms())),
            journal: std::sync::OnceLock::new(),
            park: ParkPolicy::default(),
            parked_reported: Default::default(),
        }
    }

    /// Sets the two-phase-commit policy (which transactions park at their
    /// timeout instead of aborting).
    pub fn with_park_policy(mut self, park: ParkPolicy) -> Self {
        self.park = park;
        self
    }

    /// Runs `switch` while holding the lock of every transactional id of
    /// `writer`, if none of them has a transaction holding `topic` (the
    /// cut-over's drain is over). `Ok(false)`: not yet (or an id is busy).
    pub fn switch_when_drained(
        &self,
        writer: &str,
        topic: &str,
        switch: impl FnOnce() -> Result<(), String>,
    ) -> Result<bool, String> {
        let ids: Vec<String> = self
            .snapshot()
            .values()
            .filter(|m| crate::machines::writers::prefix_of(&m.transactional_id) == writer)
            .map(|m| m.transactional_id.clone())
            .collect();
        let mut held = Vec::with_capacity(ids.len());
        for id in ids {
            match self.try_lock_id(&id) {
                Some(h) => held.push(h),
                None => return Ok(false),
            }
        }
        if held
            .iter()
            .any(|h| self.meta(&h.id).is_some_and(|m| holds_topic(&m, topic)))
        {
            return Ok(false);
        }
        switch()?;
        Ok(true)
    }

    /// The transactional ids of `writer` whose transaction holds `topic`.
    pub fn holding(&self, writer: &str, topic: &str) -> Vec<TxnMeta> {
        let mut v: Vec<TxnMeta> = self
            .snapshot()
            .values()
            .filter(|m| {
                crate::machines::writers::prefix_of(&m.transactional_id) == writer
                    && holds_topic(m, topic)
            })
            .cloned()
            .collect();
        v.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        v
    }

    /// Fences every transactional id of `writer` (only those whose
    /// transaction holds `holding`, when given): an open transaction is
    /// aborted with a bumped epoch, an idle id gets a bumped epoch. `Ok(n)`:
    /// all fenced (n of them); `Err`: some were busy or failed, call again.
    pub async fn fence_writer<R: TxnRuntime>(
        &self,
        b: &Arc<R>,
        writer: &str,
        holding: Option<&str>,
        why: &str,
    ) -> Result<usize, String> {
        let ids: Vec<String> = self
            .snapshot()
            .values()
            .filter(|m| crate::machines::writers::prefix_of(&m.transactional_id) == writer)
            .filter(|m| holding.is_none_or(|t| holds_topic(m, t)))
            .map(|m| m.transactional_id.clone())
            .collect();
        let mut left = 0;
        for id in &ids {
            let held = match self.lock_id(id).await {
                Ok(h) => h,
                Err(_) => {
                    left += 1;
                    continue;
                }
            };
            let Some(m) = self.meta(id) else { continue };
            if holding.is_some_and(|t| !holds_topic(&m, t)) {
                continue;
            }
            let now = now_ms();
            let mut alloc_err = None;
            let effects = match m.state {
                TxnState::Ongoing => {
                    tc::decide_admin_abort(&m, now, &mut pid_source(b.as_ref(), &mut alloc_err))
                }
                TxnState::PrepareCommit | TxnState::PrepareAbort => {
                    left += 1;
                    continue;
                }
                _ => tc::fence_idle(&m, now, &mut pid_source(b.as_ref(), &mut alloc_err))
                    .map(|n| vec![Effect::Persist(n)])
                    .unwrap_or_default(),
            };
            if alloc_err.is_some() || effects.is_empty() {
                left += 1;
                continue;
            }
            let f = effects.iter().find_map(|e| match e {
                Effect::Persist(n) => Some(n.clone()),
                _ => None,
            });
            if let Some(f) = &f {
                self.count_fence(id, "cutover");
                self.note_fence(&m, f, FenceCause::Cutover, None);
                tracing::info!(transactional_id = %id, producer_id = f.producer_id, old_epoch = m.epoch, new_epoch = f.epoch, reason = why, "transactional id fenced");
            }
            if let Err(e) = self.run(b, &held, effects).await {
                tracing::error!(transactional_id = %id, error = %e, "fencing failed; retried");
                left += 1;
            }
        }
        if left > 0 {
            Err(format!(
                "{left} of {} transactional ids of {writer:?} still to fence",
                ids.len()
            ))
        } else {
            Ok(ids.len())
        }
    }

    /// What `m`'s transaction becomes at its timeout: a two-phase-commit
    /// producer's (KIP-939) and a policy writer's park, others abort. The
    /// one rule of both modes.
    pub fn on_timeout(&self, m: &TxnMeta) -> tc::OnTimeout {
        if m.two_phase {
            tc::OnTimeout::Park {
                max_park_ms: self.park.max_park_ms,
            }
        } else {
            self.park.on_timeout(&m.transactional_id)
        }
    }

    /// Those of `metas` parked at `now`, oldest first.
    pub fn parked_among<'m>(
        &self,
        metas: impl IntoIterator<Item = &'m TxnMeta>,
        now: i64,
    ) -> Vec<Parked> {
        let mut out: Vec<Parked> = metas
            .into_iter()
            .filter_map(|m| {
                let since = tc::parked_since(m, now, self.on_timeout(m))?;
                Some(Parked {
                    transactional_id: m.transactional_id.clone(),
                    producer_id: m.producer_id,
                    producer_epoch: m.epoch,
                    start_ms: m.start_ms,
                    timeout_ms: m.timeout_ms,
                    parked_since_ms: since,
                    partitions: m
                        .partitions
                        .iter()
                        .map(|(t, p)| format!("{t}-{p}"))
                        .collect(),
                })
            })
            .collect();
        out.sort_by_key(|p| (p.parked_since_ms, p.transactional_id.clone()));
        out
    }

    /// Transactions parked now in this coordinator (local mode), oldest
    /// first.
    pub fn parked(&self) -> Vec<Parked> {
        self.parked_among(self.snapshot().values(), now_ms())
    }

    /// Reports `parked` (those parked at `now`) in the log, each at most
    /// once per interval.
    pub fn report_parked(&self, parked: &[Parked], now: i64) {
        let mut reported = self
            .parked_reported
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        reported.retain(|id, _| parked.iter().any(|p| &p.transactional_id == id));
        for p in parked {
            let last = reported.get(&p.transactional_id).copied();
            if last.is_some_and(|t| now - t < PARKED_REPORT_INTERVAL_MS) {
                continue;
            }
            reported.insert(p.transactional_id.clone(), now);
            tracing::warn!(transactional_id = %p.transactional_id, producer_id = p.producer_id,
                producer_epoch = p.producer_epoch, parked_for_ms = now - p.parked_since_ms,
                partitions = ?p.partitions, max_park_ms = self.park.max_park_ms,
                "transaction parked past its timeout (two-phase commit policy): it pins the last stable offset of its partitions until its producer commits or aborts it, or an operator does (oncelog txn commit|abort ID --producer-id P --producer-epoch E)");
        }
    }

    /// Counts a fence of `id` (cause: newer_producer, timeout, …) for /metrics.
    pub fn count_fence(&self, id: &str, cause: &'static str) {
        let mut st = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let key = bounded_label(st.fences.keys().map(|(i, _)| i), id);
        *st.fences.entry((key, cause)).or_default() += 1;
    }

    fn history(&self) -> std::sync::MutexGuard<'_, TxnHistory> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends the history's notes to `journal` from now on instead of
    /// keeping them in this broker's memory (cluster mode).
    pub fn journal_to(&self, journal: HistoryJournal) {
        let _ = self.journal.set(journal);
    }

    /// Whether the history is kept elsewhere ([`Self::journal_to`]).
    pub fn journaled(&self) -> bool {
        self.journal.get().is_some()
    }

    /// Records one change to `id`'s history: in memory, or in the journal.
    /// Never waits: a journal that is full drops the note (the history is
    /// for operators; nothing reads it to decide).
    fn record(&self, id: &str, note: Note) {
        match self.journal.get() {
            Some(j) => {
                if j.try_send((id.to_string(), note)).is_err() {
                    tracing::debug!(
                        transactional_id = id,
                        "transaction history note dropped: its journal is full or closed"
                    );
                }
            }
            None => self.history().apply(id, note),
        }
    }

    /// Reads the transaction history under its lock (the console's views).
    pub fn with_history<T>(&self, f: impl FnOnce(&TxnHistory) -> T) -> T {
        f(&self.history())
    }

    /// The history of one transactional id as JSON (see [`TxnHistory::to_json`]).
    pub fn history_json(&self, id: &str) -> serde_json::Value {
        let mut v = self.history().to_json(id);
        if let (Some(o), Some(st)) = (v.as_object_mut(), self.stuck_of(id)) {
            o.insert(
                "stuck".to_string(),
                serde_json::to_value(st).unwrap_or_default(),
            );
        }
        v
    }

    /// Whether `id`'s transaction is stuck, and where.
    pub fn stuck_of(&self, id: &str) -> Option<Stuck> {
        self.stuck
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// How many transactions are stuck.
    pub fn stuck_count(&self) -> usize {
        self.stuck.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn snapshot(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, TxnMeta>> {
        self.txns.read().unwrap_or_else(|p| p.into_inner())
    }

    fn meta(&self, id: &str) -> Option<TxnMeta> {
        self.snapshot().get(id).cloned()
    }

    fn id_mutex(&self, id: &str) -> Arc<Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(id.to_string()).or_default().clone()
    }

    /// Takes `id`'s lock, waiting at most [`ID_LOCK_WAIT`].
    async fn lock_id(&self, id: &str) -> Result<IdLock, TxnError> {
        let m = self.id_mutex(id);
        match tokio::time::timeout(ID_LOCK_WAIT, m.lock_owned()).await {
            Ok(guard) => Ok(IdLock {
                id: id.to_string(),
                _guard: guard,
            }),
            Err(_) => Err(TxnError::Coord(CoordError::ConcurrentTransactions)),
        }
    }

    /// Takes `id`'s lock if nobody holds it.
    fn try_lock_id(&self, id: &str) -> Option<IdLock> {
        let m = self.id_mutex(id);
        m.try_lock_owned().ok().map(|guard| IdLock {
            id: id.to_string(),
            _guard: guard,
        })
    }

    /// Forgets the locks of ids that have no state and that nobody holds.
    fn prune_locks(&self) {
        let txns = self.snapshot();
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // A count of 1 is the map's own reference: nobody holds or waits for it,
        // and nobody can take it while the map is locked.
        locks.retain(|id, m| txns.contains_key(id) || Arc::strong_count(m) > 1);
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
            self.record(id, Note::EventIfKnown { event: e });
        }
        id
    }

    /// A newer producer's InitProducerId fenced `old` and is aborting its
    /// open transaction (`prepared`: the abort): logged, counted, noted.
    pub fn fenced_by_init(&self, old: &TxnMeta, prepared: &TxnMeta, who: &Requester) {
        tracing::warn!(
            transactional_id = %old.transactional_id,
            producer_id = prepared.producer_id,
            old_epoch = old.epoch,
            new_epoch = prepared.epoch,
            partitions = prepared.partitions.len(),
            client_id = who.client_id.as_deref().unwrap_or(""),
            peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(),
            "producer fenced by a new InitProducerId; aborting its open transaction"
        );
        self.count_fence(&old.transactional_id, "newer_producer");
        self.note_fence(old, prepared, FenceCause::NewerProducer, Some(who));
    }

    /// An operator's abort fenced `old` (`prepared`: the abort): logged,
    /// counted, noted.
    pub fn fenced_by_admin(&self, old: &TxnMeta, prepared: &TxnMeta, who: &Requester) {
        tracing::warn!(transactional_id = %old.transactional_id, producer_id = old.producer_id, old_epoch = old.epoch,
            new_epoch = prepared.epoch, cause = "administrator", client_id = who.client_id.as_deref().unwrap_or(""),
            peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(),
            "transaction aborted by an administrator; its producer is fenced");
        self.count_fence(&old.transactional_id, "administrator");
        self.note_fence(old, prepared, FenceCause::Administrator, Some(who));
    }

    /// Notes partitions added to a transaction: its begin, or more
    /// partitions (`before`: the id's state before the add).
    pub fn note_added(&self, before: Option<&TxnMeta>, after: &TxnMeta, who: &Requester) {
        let was_open = before.is_some_and(|m| m.state == TxnState::Ongoing);
        let (kind, added): (EventKind, Vec<&(String, i32)>) = match before {
            Some(b) if was_open => {
                let added = after
                    .partitions
                    .iter()
                    .filter(|p| !b.partitions.contains(p))
                    .collect();
                (EventKind::AddPartitions, added)
            }
            _ => (EventKind::Begin, after.partitions.iter().collect()),
        };
        let e = Event::new(now_ms(), kind, after.producer_id, after.epoch)
            .by(who)
            .partitions(added);
        self.record(&after.transactional_id, Note::Event { event: e });
    }

    /// Notes a request refused because its producer is fenced.
    pub fn note_fenced_request(&self, id: &str, pid: i64, epoch: i16, what: &str, who: &Requester) {
        let e = Event::new(now_ms(), EventKind::FencedRequest, pid, epoch)
            .by(who)
            .detail(format!("{what} refused: producer fenced"));
        self.record(id, Note::EventIfKnown { event: e });
    }

    /// Notes a fence (history only; the caller logs and counts it).
    pub fn note_fence(
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
        self.record(&before.transactional_id, Note::Fence { fence: f });
    }

    /// Notes a completed transaction: its commit or abort event and, when
    /// the identity moved, the new epoch (`via` says how, `holder` who got it).
    pub fn note_end(
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
            let took = (now - prepared.start_ms).max(0);
            e.duration_ms = Some(took);
            detail.push(format!("{took} ms after it began"));
        }
        if done.producer_id != prepared.producer_id {
            detail.push(format!(
                "epoch exhausted: producer id {} at epoch 0 next",
                done.producer_id
            ));
        }
        let id = &prepared.transactional_id;
        self.record(
            id,
            Note::Event {
                event: e.detail(detail.join("; ")),
            },
        );
        self.record(
            id,
            Note::epoch(done.producer_id, done.epoch, now, via, holder),
        );
    }

    /// Notes a successful InitProducerId: a new id, a retry, the producer's
    /// own bump (KIP-360), or a newer producer fencing an idle previous one.
    pub fn note_init(
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
            let event = init.detail("new transactional id");
            self.record(id, Note::Event { event });
            self.record(
                id,
                Note::epoch(after.producer_id, after.epoch, now, "init", Some(who)),
            );
            return;
        };
        if (b.producer_id, b.epoch) == (after.producer_id, after.epoch) {
            let event = init.detail("retry: the same identity answered again");
            self.record(id, Note::Event { event });
            return;
        }
        if expected == Some((b.producer_id, b.epoch)) {
            let event = init
                .old_epoch(b.epoch)
                .detail("the producer re-initialised its own identity");
            self.record(id, Note::Event { event });
            self.record(
                id,
                Note::epoch(after.producer_id, after.epoch, now, "init", Some(who)),
            );
            return;
        }
        // A new producer took the id: whoever held the old epoch is fenced.
        // Nothing was open, so nothing is aborted (a restart looks like this).
        tracing::info!(transactional_id = %id, producer_id = b.producer_id, old_epoch = b.epoch,
            new_epoch = after.epoch, client_id = who.client_id.as_deref().unwrap_or(""),
            peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(),
            "a newer producer took the transactional id; the previous epoch is fenced");
        self.note_fence(b, after, FenceCause::NewerProducer, Some(who));
        self.record(
            id,
            Note::epoch(
                after.producer_id,
                after.epoch,
                now,
                "newer_producer",
                Some(who),
            ),
        );
    }

    /// Counts a transaction a cluster-mode decision completed (its
    /// commits and aborts are counted by the broker that ran it).
    pub fn count_completed(&self, commit: bool, start_ms: i64) {
        {
            let mut st = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            if commit {
                st.commits += 1;
            } else {
                st.aborts += 1;
            }
        }
        if start_ms >= 0 {
            let secs = (now_ms() - start_ms).max(0) as f64 / 1000.0;
            self.durations[usize::from(!commit)].observe(secs);
        }
    }

    pub fn stats(&self) -> TxnStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// (open transactions, start time of the oldest in ms).
    pub async fn open_transactions(&self) -> (usize, Option<i64>) {
        let txns = self.snapshot();
        let open: Vec<i64> = txns
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
        tc::verify_write(map.get(&pid), epoch, topic, partition)
    }

    /// Appends and fsyncs the new metadata (with other ids' changes, in
    /// one group), then makes it current. The caller holds the id's lock.
    async fn persist(&self, held: &IdLock, meta: TxnMeta) -> Result<(), PersistError> {
        debug_assert_eq!(
            held.id, meta.transactional_id,
            "persist without the id's lock"
        );
        if let Some(old) = self.snapshot().get(&meta.transactional_id) {
            // Invariant: an id's epoch never goes back for the same producer id.
            debug_assert!(
                old.producer_id != meta.producer_id || meta.epoch >= old.epoch,
                "epoch went back for {}: {} -> {}",
                meta.transactional_id,
                old.epoch,
                meta.epoch
            );
        }
        self.log.append(record_of(&meta)?).await?;
        self.make_current(meta);
        Ok(())
    }

    /// The change is in the log (or on its way): the verification view and
    /// the map say so.
    fn make_current(&self, meta: TxnMeta) {
        update_view(
            &mut self.producers.write().unwrap_or_else(|p| p.into_inner()),
            &meta,
        );
        self.txns
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(meta.transactional_id.clone(), meta);
    }

    /// Like [`Self::persist`], but makes the change current at once and
    /// lets it reach the disk with the next group commit (see `finish`).
    fn persist_detached(&self, held: &IdLock, meta: TxnMeta) -> Result<(), PersistError> {
        debug_assert_eq!(
            held.id, meta.transactional_id,
            "persist without the id's lock"
        );
        self.log.append_detached(record_of(&meta)?)?;
        self.make_current(meta);
        Ok(())
    }

    /// Runs a decision's effects in order (see [`Effect`]) and returns the
    /// identity of its Reply, if it has one. A step starts only when the one
    /// before it is done; a failed persist ends the list. The caller holds
    /// the id's lock.
    async fn run<R: TxnRuntime>(
        &self,
        b: &Arc<R>,
        held: &IdLock,
        effects: Vec<Effect>,
    ) -> Result<Option<(i64, i16)>, TxnError> {
        let mut prepared: Option<TxnMeta> = None;
        let mut reply = None;
        for effect in effects {
            match effect {
                Effect::Persist(m) => {
                    self.before_persist(&m);
                    self.persist(held, m.clone()).await?;
                    self.after_persist(b, m, &mut prepared);
                }
                Effect::PersistLater(m) => {
                    self.before_persist(&m);
                    self.persist_detached(held, m.clone())?;
                    self.after_persist(b, m, &mut prepared);
                }
                Effect::WriteMarkers {
                    producer_id,
                    epoch,
                    commit,
                    partitions,
                } => {
                    let marker = Marker {
                        producer_id,
                        epoch,
                        commit,
                        coordinator_epoch: self.coordinator_epoch,
                    };
                    let partitions = crate::faults::marker_partitions(&held.id, commit, partitions);
                    self.write_markers(b, &held.id, marker, &partitions).await;
                }
                Effect::CompleteOffsets {
                    producer_id,
                    commit,
                } => {
                    let mut tries = 0u32;
                    while let Err(e) = b.complete_offsets(producer_id, commit).await {
                        tries += 1;
                        let marker = Marker {
                            producer_id,
                            epoch: -1,
                            commit,
                            coordinator_epoch: self.coordinator_epoch,
                        };
                        let at = crate::coordinators::groups::OFFSETS_TOPIC;
                        self.marker_failed(&held.id, marker, at, tries, &e.to_string());
                        tokio::time::sleep(backoff(tries)).await;
                    }
                    self.unstick(&held.id);
                }
                Effect::Reply { producer_id, epoch } => reply = Some((producer_id, epoch)),
            }
        }
        Ok(reply)
    }

    /// Fail points for the crash tests, at the same places as always: a
    /// Complete is about to be persisted (its markers are durable).
    fn before_persist(&self, m: &TxnMeta) {
        if matches!(m.state, TxnState::CompleteCommit | TxnState::CompleteAbort) {
            crate::faults::fail_point("txn-after-markers");
        }
    }

    /// After a persist: fail points once a Prepare is durable; counters once
    /// a transaction this decision prepared is complete.
    fn after_persist<R: TxnRuntime>(&self, b: &Arc<R>, m: TxnMeta, prepared: &mut Option<TxnMeta>) {
        match m.state {
            TxnState::PrepareCommit => {
                crate::faults::fail_point("txn-after-prepare-commit");
                *prepared = Some(m);
            }
            TxnState::PrepareAbort => {
                crate::faults::fail_point("txn-after-prepare-abort");
                *prepared = Some(m);
            }
            TxnState::CompleteCommit | TxnState::CompleteAbort => {
                if let Some(p) = prepared.take() {
                    self.account(b, &p);
                }
            }
            _ => {}
        }
    }

    /// Counters, writer prefixes and the debug line of a completed transaction.
    fn account<R: TxnRuntime>(&self, b: &Arc<R>, prepared: &TxnMeta) {
        let commit = prepared.state == TxnState::PrepareCommit;
        if commit {
            let now = now_ms();
            let mut topics: Vec<&String> = prepared
                .partitions
                .iter()
                .map(|(t, _)| t)
                .filter(|t| t.as_str() != crate::coordinators::groups::OFFSETS_TOPIC)
                .collect();
            topics.dedup();
            for t in topics {
                b.record_commit(t, &prepared.transactional_id, now);
            }
        }
        self.count_completed(commit, prepared.start_ms);
        // Per transaction, so at debug: thousands a second are normal. The
        // id's history (metrics port) and the counters keep them for operators.
        tracing::debug!(transactional_id = %prepared.transactional_id, producer_id = prepared.producer_id,
            epoch = prepared.epoch, commit, partitions = prepared.partitions.len(), "transaction completed");
    }

    /// InitProducerId for a transactional id: (pid, epoch). `who` sent it.
    pub async fn init_producer_id<R: TxnRuntime>(
        &self,
        b: &Arc<R>,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
        two_phase: tc::TwoPhase,
        who: &Requester,
    ) -> Result<Init, TxnError> {
        let held = self.lock_id(id).await?;
        let before = self.meta(id);
        if let Some((m, t)) = before
            .as_ref()
            .filter(|_| !two_phase.keep_prepared)
            .and_then(|m| drain_holds(b.as_ref(), m).map(|t| (m, t)))
        {
            let why = format!(
                "transactional id {id:?} has an open transaction holding topic {t:?}, which is being cut over (oncelog cutover): \
                 it ends only by its own EndTxn (the new writer's restored committer) or at the drain deadline, \
                 so a new producer may not take the id and abort it"
            );
            tracing::warn!(transactional_id = id, topic = t, producer_id = m.producer_id, epoch = m.epoch,
                "InitProducerId refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): it would abort a transaction holding a topic being cut over");
            return Err(TxnError::Refused(why));
        }
        let mut alloc_err = None;
        let decided = tc::decide_init_2pc(
            before.as_ref(),
            id,
            timeout_ms,
            expected,
            two_phase,
            now_ms(),
            &mut pid_source(b.as_ref(), &mut alloc_err),
        );
        let (effects, kept) = decided.map_err(|e| {
            if e == CoordError::ProducerFenced {
                let (pid, epoch) = expected.unwrap_or((-1, -1));
                self.note_fenced_request(id, pid, epoch, "InitProducerId", who);
            }
            TxnError::Coord(e)
        })?;
        if let Some(e) = alloc_err {
            return Err(TxnError::ProducerIds(e));
        }
        let ends = tc::transition(&effects).map(|(p, d)| (p.clone(), d.clone()));
        if let (Some((f, _)), Some(old)) = (&ends, &before) {
            self.fenced_by_init(old, f, who);
        }
        let answer = self.run(b, &held, effects).await?;
        match &ends {
            Some((f, done)) => self.note_end(f, done, f.epoch, "newer_producer", None, Some(who)),
            None => {
                if let Some(m) = self.meta(id) {
                    self.note_init(before.as_ref(), &m, expected, who);
                }
            }
        }
        let (pid, epoch) = answer.ok_or(TxnError::NoAnswer)?;
        tracing::debug!(
            transactional_id = id,
            producer_id = pid,
            epoch,
            "InitProducerId"
        );
        if let Some((kpid, kepoch)) = kept {
            tracing::info!(transactional_id = id, producer_id = pid, epoch, prepared_producer_id = kpid, prepared_epoch = kepoch,
                "InitProducerId kept the prepared transaction (KIP-939 keepPreparedTxn); the new producer commits or aborts it");
        }
        Ok(Init {
            producer_id: pid,
            epoch,
            kept,
        })
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
        self.add_partitions_by(
            id,
            pid,
            epoch,
            partitions,
            &Requester::default(),
            &|_, _| Ok(()),
        )
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
        gate: WriteGate<'_>,
    ) -> Result<(), TxnError> {
        let held = self.lock_id(id).await?;
        let meta = self.meta(id);
        let before = meta.as_ref();
        let was_open = before.is_some_and(|m| m.state == TxnState::Ongoing);
        let had = before.map(|m| m.partitions.clone()).unwrap_or_default();
        match tc::decide_add_partitions(before, pid, epoch, partitions, now_ms()) {
            Ok(effects) => {
                let topics: BTreeSet<&str> = partitions
                    .iter()
                    .map(|(t, _)| t.as_str())
                    .filter(|t| *t != crate::machines::names::OFFSETS_TOPIC)
                    .collect();
                for t in topics {
                    let holds = was_open && had.iter().any(|(h, _)| h == t);
                    if let Err(g) = gate(t, holds) {
                        tracing::warn!(transactional_id = id, topic = t, reason = %g, "transactional write refused");
                        return Err(TxnError::Refused(g.to_string()));
                    }
                }
                // Effects: a Persist when the set changes, then the Reply.
                let mut changed = None;
                for e in effects {
                    if let Effect::Persist(m) = e {
                        self.persist(&held, m.clone()).await?;
                        changed = Some(m);
                    }
                }
                let Some(m) = changed else { return Ok(()) };
                self.note_added(before, &m, who);
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
    pub async fn end_txn<R: TxnRuntime>(
        &self,
        b: &Arc<R>,
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
        let held = self.lock_id(id).await?;
        let meta = self.meta(id);
        let meta = meta.as_ref();
        let mut alloc_err = None;
        let decided = tc::decide_end(
            meta,
            pid,
            epoch,
            commit,
            tv2,
            now_ms(),
            &mut pid_source(b.as_ref(), &mut alloc_err),
        );
        tracing::debug!(transactional_id = id, producer_id = pid, epoch, commit, tv2,
            state = ?meta.map(|m| (m.state, m.producer_id, m.epoch, m.partitions.len())), decided = ?decided.as_ref().map(|e| e.len()), "EndTxn");
        match decided {
            Ok(effects) => {
                if let Some(e) = alloc_err {
                    return Err(TxnError::ProducerIds(e));
                }
                let ends = tc::transition(&effects).map(|(p, d)| (p.clone(), d.clone()));
                if let Some((p, _)) = ends
                    .as_ref()
                    .filter(|(p, _)| p.state == TxnState::PrepareCommit)
                {
                    let topics: BTreeSet<&str> = p
                        .partitions
                        .iter()
                        .map(|(t, _)| t.as_str())
                        .filter(|t| *t != crate::machines::names::OFFSETS_TOPIC)
                        .collect();
                    for t in topics {
                        match b.commit_gate(t, id) {
                            Ok(()) => {}
                            Err(Gate::Held(why)) => {
                                tracing::debug!(transactional_id = id, topic = t, reason = %why, "commit held");
                                return Err(TxnError::Coord(CoordError::ConcurrentTransactions));
                            }
                            Err(Gate::Refused(why)) => {
                                tracing::warn!(transactional_id = id, topic = t, reason = %why, "commit refused");
                                return Err(TxnError::Refused(why));
                            }
                        }
                    }
                }
                let answer = self.run(b, &held, effects).await?;
                if let Some((p, done)) = &ends {
                    self.note_end(p, done, epoch, "end_txn", Some(who), Some(who));
                }
                answer.ok_or(TxnError::NoAnswer)
            }
            Err(e) => {
                let what = if commit {
                    "EndTxn(commit)"
                } else {
                    "EndTxn(abort)"
                };
                if e == CoordError::ProducerFenced {
                    tracing::warn!(
                        transactional_id = id,
                        producer_id = pid,
                        epoch,
                        client_id = who.client_id.as_deref().unwrap_or(""),
                        peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(),
                        "{what} from a fenced producer"
                    );
                    self.note_fenced_request(id, pid, epoch, what, who);
                } else {
                    log_refused(what, id, (pid, epoch), e, meta.map(|m| m.state), who);
                }
                Err(TxnError::Coord(e))
            }
        }
    }

    /// Drives every Prepare* transaction found at start to completion, each
    /// id on its own (one whose markers cannot be written holds up no other).
    pub async fn recover<R: TxnRuntime>(&self, b: &Arc<R>) {
        let pending: Vec<String> = self
            .snapshot()
            .values()
            .filter(|m| matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort))
            .map(|m| m.transactional_id.clone())
            .collect();
        let mut tasks = tokio::task::JoinSet::new();
        for id in pending {
            let b = b.clone();
            tasks.spawn(async move { b.txn().recover_one(&b, &id).await });
        }
        while tasks.join_next().await.is_some() {}
    }

    async fn recover_one<R: TxnRuntime>(&self, b: &Arc<R>, id: &str) {
        let held = match self.lock_id(id).await {
            Ok(h) => h,
            Err(_) => return,
        };
        let Some(m) = self.meta(id) else { return };
        let effects = tc::decide_recovery(&m, now_ms());
        if effects.is_empty() {
            return;
        }
        tracing::info!(transactional_id = %m.transactional_id, state = m.state.name(), "re-driving transaction markers after restart");
        if let Err(e) = self.run(b, &held, effects).await {
            tracing::error!(transactional_id = %m.transactional_id, error = %e, "could not complete a recovered transaction");
            return;
        }
        let kind = if m.state == TxnState::PrepareCommit {
            EventKind::Commit
        } else {
            EventKind::Abort
        };
        let e = Event::new(now_ms(), kind, m.producer_id, m.epoch)
            .partitions(&m.partitions)
            .detail("markers re-driven after a restart");
        self.record(&m.transactional_id, Note::Event { event: e });
    }

    /// Starts the abort (with an epoch bump) of every transaction past its
    /// timeout, each in a task of its own; an id busy with another change
    /// is looked at again on the next call.
    pub fn abort_timed_out<R: TxnRuntime>(&self, b: &Arc<R>) {
        let now = now_ms();
        self.report_parked(&self.parked(), now);
        let expired: Vec<String> = self
            .snapshot()
            .values()
            .filter(|m| tc::plan_timeout(m, now, self.on_timeout(m)).is_some())
            .filter(|m| drain_holds(b.as_ref(), m).is_none())
            .map(|m| m.transactional_id.clone())
            .collect();
        for id in expired {
            let Some(held) = self.try_lock_id(&id) else {
                continue;
            };
            let b = b.clone();
            tokio::spawn(async move { b.txn().abort_one_timed_out(&b, held).await });
        }
    }

    async fn abort_one_timed_out<R: TxnRuntime>(&self, b: &Arc<R>, held: IdLock) {
        let Some(m) = self.meta(&held.id) else { return };
        if drain_holds(b.as_ref(), &m).is_some() {
            return;
        }
        // Re-decided under the lock: the producer may have ended it meanwhile.
        let mut alloc_err = None;
        let on = self.on_timeout(&m);
        let effects = tc::decide_timeout(
            &m,
            now_ms(),
            on,
            &mut pid_source(b.as_ref(), &mut alloc_err),
        );
        let Some((f, done)) = tc::transition(&effects).map(|(p, d)| (p.clone(), d.clone())) else {
            return;
        };
        if let Some(e) = alloc_err {
            tracing::error!(transactional_id = %f.transactional_id, error = %e, "timeout abort failed");
            return;
        }
        self.count_fence(&f.transactional_id, "timeout");
        if let tc::OnTimeout::Park { max_park_ms } = on {
            tracing::warn!(transactional_id = %f.transactional_id, producer_id = f.producer_id, old_epoch = f.epoch - 1, new_epoch = f.epoch,
                timeout_ms = f.timeout_ms, max_park_ms, "parked transaction reached the maximum park time (transaction.two.phase.commit.max.park.ms); aborting it and fencing its producer");
        } else {
            tracing::warn!(transactional_id = %f.transactional_id, producer_id = f.producer_id, old_epoch = f.epoch - 1, new_epoch = f.epoch,
                timeout_ms = f.timeout_ms, "transaction timed out; aborting it and fencing its producer");
        }
        self.note_fence(&m, &f, FenceCause::Timeout, None);
        match self.run(b, &held, effects).await {
            Ok(_) => self.note_end(&f, &done, f.epoch, "timeout", None, None),
            Err(e) => {
                tracing::error!(transactional_id = %f.transactional_id, error = %e, "timeout abort failed")
            }
        }
    }

    /// Forgets transactional ids idle (no open transaction) since before
    /// `cutoff`, writing a tombstone for each. Busy ids are left for later.
    pub async fn expire_ids(&self, cutoff: i64) {
        let idle = |m: &TxnMeta| {
            matches!(
                m.state,
                TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
            ) && m.update_ms < cutoff
        };
        let candidates: Vec<String> = self
            .snapshot()
            .values()
            .filter(|m| idle(m))
            .map(|m| m.transactional_id.clone())
            .collect();
        for id in candidates {
            let Some(held) = self.try_lock_id(&id) else {
                continue;
            };
            if !self.meta(&id).is_some_and(|m| idle(&m)) {
                continue;
            }
            if let Err(e) = self
                .log
                .append(vec![(Some(id.as_bytes().to_vec()), None)])
                .await
            {
                tracing::error!(transactional_id = %id, error = %e, "could not expire a transactional id");
                return;
            }
            let removed = self
                .txns
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            drop(held);
            if let Some(m) = removed {
                let mut view = self.producers.write().unwrap_or_else(|p| p.into_inner());
                view.remove(&m.producer_id);
                drop(view);
                let e = Event::new(now_ms(), EventKind::Expired, m.producer_id, m.epoch);
                self.record(&id, Note::EventIfKnown { event: e });
            }
            tracing::info!(transactional_id = %id, "transactional id expired");
        }
        self.prune_locks();
    }

    /// An operator asked to abort `pid`'s transaction (WriteTxnMarkers from
    /// an admin tool). If the coordinator knows it, the abort goes through the
    /// coordinator: the producer is fenced (epoch + 1) and every partition of
    /// the transaction gets its ABORT marker, so a live transaction is never
    /// torn. `who` is the administrator's client.
    pub async fn admin_abort<R: TxnRuntime>(
        &self,
        b: &Arc<R>,
        pid: i64,
        who: &Requester,
    ) -> Result<AdminAbort, TxnError> {
        let ids: Vec<String> = self
            .snapshot()
            .values()
            .filter(|m| m.producer_id == pid)
            .map(|m| m.transactional_id.clone())
            .collect();
        let mut completing = false;
        for id in ids {
            let held = self.lock_id(&id).await?;
            let Some(m) = self.meta(&id).filter(|m| m.producer_id == pid) else {
                continue;
            };
            let mut alloc_err = None;
            let effects =
                tc::decide_admin_abort(&m, now_ms(), &mut pid_source(b.as_ref(), &mut alloc_err));
            let Some((f, done)) = tc::transition(&effects).map(|(p, d)| (p.clone(), d.clone()))
            else {
                completing |= matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort);
                continue;
            };
            if let Some(e) = alloc_err {
                return Err(TxnError::ProducerIds(e));
            }
            self.fenced_by_admin(&m, &f, who);
            self.run(b, &held, effects).await?;
            self.note_end(&f, &done, f.epoch, "administrator", Some(who), None);
            return Ok(AdminAbort::Aborted);
        }
        Ok(if completing {
            AdminAbort::Completing
        } else {
            AdminAbort::NotKnown
        })
    }

    /// Whether the coordinator holds a transaction of `pid` that is open or
    /// being completed (its markers may still be on their way).
    pub async fn holds(&self, pid: i64) -> bool {
        self.snapshot().values().any(|m| {
            m.producer_id == pid
                && matches!(
                    m.state,
                    TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
                )
        })
    }

    /// Every known transactional id's metadata.
    pub async fn list(&self) -> Vec<TxnMeta> {
        self.snapshot().values().cloned().collect()
    }

    pub async fn describe(&self, id: &str) -> Option<TxnMeta> {
        self.meta(id)
    }

    /// Notes that `marker`'s write failed at `partition` for the `tries`th
    /// time; from [`STUCK_AFTER`] on, the transaction is listed as stuck.
    fn marker_failed(&self, id: &str, marker: Marker, partition: &str, tries: u32, error: &str) {
        tracing::error!(partition = %partition, transactional_id = %id,
            error = %error, tries, "transaction marker not written; retrying");
        if tries < STUCK_AFTER {
            return;
        }
        let mut stuck = self.stuck.lock().unwrap_or_else(|p| p.into_inner());
        let since_ms = stuck.get(id).map_or_else(now_ms, |s| s.since_ms);
        stuck.insert(
            id.to_string(),
            Stuck {
                producer_id: marker.producer_id,
                epoch: marker.epoch,
                commit: marker.commit,
                partition: partition.to_string(),
                tries,
                since_ms,
                error: error.to_string(),
            },
        );
    }

    /// `id`'s markers are durable: it is no longer stuck.
    fn unstick(&self, id: &str) {
        let was_stuck = self
            .stuck
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(s) = was_stuck {
            tracing::info!(transactional_id = %id, tries = s.tries,
                stuck_ms = now_ms() - s.since_ms, "stuck transaction's markers are durable now");
        }
    }

    /// Writes `marker` to every partition and waits until all are durable,
    /// retrying a partition whose write or sync fails (with a capped
    /// backoff, for as long as it takes: the outcome is decided).
    async fn write_markers<R: TxnRuntime>(
        &self,
        b: &Arc<R>,
        id: &str,
        marker: Marker,
        partitions: &[(String, i32)],
    ) {
        let waits: Vec<_> = partitions
            .iter()
            .map(|(topic, index)| (topic, *index, write_marker(b, topic, *index, marker)))
            .collect();
        for (topic, index, first) in waits {
            let mut attempt = first;
            let mut tries = 0u32;
            loop {
                let res = match attempt {
                    Ok(Some(rx)) => durable(rx).await.map_err(MarkerWriteError::from),
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                };
                match res {
                    Ok(()) => break,
                    Err(e) => {
                        tries += 1;
                        let at = format!("{topic}-{index}");
                        self.marker_failed(id, marker, &at, tries, &e.to_string());
                        tokio::time::sleep(backoff(tries)).await;
                        attempt = write_marker(b, topic, index, marker);
                    }
                }
            }
        }
        self.unstick(id);
    }
}

/// Every id's state from the transaction log's records (a tombstone forgets
/// the id). `client_written`: records a client wrote there before internal
/// names were reserved may be in it, and are skipped.
fn load(
    records: Vec<Record>,
    client_written: bool,
) -> Result<HashMap<String, TxnMeta>, TopicError> {
    let mut txns: HashMap<String, TxnMeta> = HashMap::new();
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
    Ok(txns)
}

/// A source of fresh producer ids for the planners; an allocation failure
/// is kept in `err` (the planner gets -1 and the caller gives up).
fn pid_source<'a, R: TxnRuntime>(
    b: &'a R,
    err: &'a mut Option<TopicError>,
) -> impl FnMut() -> i64 + 'a {
    move || match b.next_producer_id() {
        Ok(p) => p,
        Err(e) => {
            *err = Some(e);
            -1
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    #[error("{0}")]
    Coord(CoordError),
    /// The transaction log could not take the change; none of it was made.
    #[error("transaction log: {0}")]
    Persist(#[from] PersistError),
    /// No producer id could be allocated.
    #[error("producer id allocation: {0}")]
    ProducerIds(TopicError),
    /// A decision ran without an answer (its effect list has no Reply).
    #[error("the coordinator's decision had no answer")]
    NoAnswer,
    /// The topic's writer fence or cut-over refuses this writer.
    #[error("{0}")]
    Refused(String),
}

/// Why a marker was not written.
#[derive(Debug, thiserror::Error)]
pub enum MarkerWriteError {
    /// `ONCELOG_FAULTS` asked for this failure.
    #[error("injected storage fault")]
    Injected,
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Sync(#[from] SyncError),
}

/// Aborts an orphan: a transaction open at one partition that the
/// coordinator does not know (e.g. its id expired or its state was lost).
/// Writes one ABORT marker there and waits until it is durable.
pub async fn abort_orphan<R: TxnRuntime>(
    b: &Arc<R>,
    topic: &str,
    index: i32,
    pid: i64,
    epoch: i16,
    coordinator_epoch: i32,
) -> Result<(), MarkerWriteError> {
    tracing::warn!(partition = %format!("{topic}-{index}"), producer_id = pid, epoch,
        "aborting an orphaned transaction the coordinator does not know");
    let marker = Marker {
        producer_id: pid,
        epoch,
        commit: false,
        coordinator_epoch,
    };
    match write_marker(b, topic, index, marker)? {
        Some(rx) => Ok(durable(rx).await?),
        None => Ok(()),
    }
}

/// An operator's abort of a hanging transaction at one partition
/// (WriteTxnMarkers from an admin tool, or the console): an ABORT marker
/// for `pid` at `epoch`, if that producer has a transaction open there that
/// such a marker may close. The Kafka error code of the outcome.
pub async fn abort_hanging<R: TxnRuntime>(
    b: &Arc<R>,
    topic: &str,
    index: i32,
    pid: i64,
    epoch: i16,
    coordinator_epoch: i32,
) -> ErrorCode {
    let Some(p) = b.partition(topic, index) else {
        return ErrorCode::UnknownTopicOrPartition;
    };
    match p.open_transaction_of(pid, epoch, coordinator_epoch) {
        Ok(true) => {}
        Ok(false) => return ErrorCode::None,
        Err(_) => return ErrorCode::InvalidProducerEpoch,
    }
    match abort_orphan(b, topic, index, pid, epoch, coordinator_epoch).await {
        Ok(()) => ErrorCode::None,
        Err(e) => {
            tracing::error!(partition = %format!("{topic}-{index}"), error = %e, "orphan abort failed");
            ErrorCode::KafkaStorageError
        }
    }
}

/// Appends one marker; `Ok(None)` when there is nothing to write there.
fn write_marker<R: TxnRuntime>(
    b: &Arc<R>,
    topic: &str,
    index: i32,
    marker: Marker,
) -> Result<Option<SyncReply>, MarkerWriteError> {
    let Some(p) = b.partition(topic, index) else {
        tracing::info!(partition = %format!("{topic}-{index}"), "marker skipped: partition no longer exists");
        return Ok(None);
    };
    if crate::faults::injected_marker_error(topic) {
        tracing::warn!(partition = %p.name(), "injected fault (ONCELOG_FAULTS): marker write fails");
        return Err(MarkerWriteError::Injected);
    }
    match p.write_marker(marker) {
        Ok(reply) => Ok(reply),
        Err(MarkerError::Closed(_)) => {
            tracing::info!(partition = %p.name(), "marker skipped: the topic was deleted");
            Ok(None)
        }
        Err(MarkerError::Refused(e)) => {
            tracing::error!(partition = %p.name(), producer_id = marker.producer_id, epoch = marker.epoch, error = %e,
                "marker refused by the partition");
            Ok(None)
        }
        Err(MarkerError::Storage(e)) => Err(MarkerWriteError::Log(e)),
    }
}

/// A coordinator refusal other than a fence, logged where it is decided (in
/// either mode): a retriable one at debug, a client's invalid request at warn
/// (the producer fails with it), naming the id's state when it is known.
pub(crate) fn log_refused(
    what: &str,
    id: &str,
    (pid, epoch): (i64, i16),
    e: CoordError,
    state: Option<TxnState>,
    who: &Requester,
) {
    let state = state.map(|s| format!("{s:?}")).unwrap_or_default();
    let client = who.client_id.as_deref().unwrap_or("");
    if e == CoordError::ConcurrentTransactions {
        tracing::debug!(
            transactional_id = id,
            producer_id = pid,
            epoch,
            state,
            client_id = client,
            "{what}: retriable, the transaction is changing"
        );
    } else {
        tracing::warn!(transactional_id = id, producer_id = pid, epoch, state, error = %e, client_id = client,
            peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(), "{what} refused");
    }
}
