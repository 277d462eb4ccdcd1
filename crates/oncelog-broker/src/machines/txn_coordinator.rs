//! The transaction coordinator's state machine: transactional id → producer
//! identity, epoch and transaction state. Pure: each `plan_*` function takes
//! the current metadata and a request and returns the metadata to persist
//! (or an error); the caller persists it, writes markers, and answers.
//!
//! States and transitions follow Kafka's (PROTOCOL-BRIEF §2.1–2.5), with one
//! deliberate difference: InitProducerId on an id with an open transaction
//! fences it (epoch + 1), aborts it with that epoch, and answers the new
//! producer with that same epoch once the abort is durable, instead of
//! answering CONCURRENT_TRANSACTIONS and bumping a second time on the retry.
//! Epoch `i16::MAX` is never handed to a client; an exhausted epoch moves the
//! id to a fresh producer id at epoch 0.
//!
//! Two more, for frameworks that commit after a restart (Flink's
//! `KafkaCommitter`, PROTOCOL-BRIEF §6):
//! - **Idempotent re-commit** ([`plan_end`]): an EndTxn(commit) of a
//!   transaction already committed, from the producer id and epoch it was
//!   committed under — the epoch its own TV2 commit bumped from included —
//!   answers success, in either protocol version; so does an EndTxn(abort) of
//!   one already aborted. A fence by another producer clears `last_epoch`,
//!   so a zombie never matches, and a commit of an aborted transaction stays
//!   refused.
//! - **Parked transactions** ([`OnTimeout::Park`]): under the operator's
//!   two-phase-commit policy a transaction that outlives its timeout is kept
//!   open instead of aborted, until its producer or an operator ends it.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl TxnState {
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnMeta {
    pub transactional_id: String,
    pub producer_id: i64,
    pub prev_producer_id: i64,
    pub epoch: i16,
    /// The epoch before the last client-requested bump (KIP-360 retries).
    pub last_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<(String, i32)>,
    pub start_ms: i64,
    pub update_ms: i64,
    /// The producer declared two-phase commit (KIP-939 InitProducerId
    /// `enable2Pc`): its transactions park at their timeout.
    #[serde(default, skip_serializing_if = "is_false")]
    pub two_phase: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CoordError {
    #[error("a transition of this transactional id is in progress")]
    ConcurrentTransactions,
    #[error("producer fenced: a newer producer with the same transactional id exists")]
    ProducerFenced,
    #[error("producer id does not match the transactional id")]
    InvalidProducerIdMapping,
    #[error("the request is not valid in the transaction's current state")]
    InvalidTxnState,
}

/// An epoch at or past this must not be bumped for a client again.
pub fn exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitPlan {
    /// Persist this (state Empty) and answer with its producer id and epoch.
    Ready(TxnMeta),
    /// The id has an open transaction: persist this (PrepareAbort, epoch
    /// bumped), write ABORT markers with that epoch to its partitions,
    /// complete it, then answer with [`complete_fence`]'s identity.
    Fence(TxnMeta),
}

/// Plans InitProducerId for a transactional id.
pub fn plan_init(
    existing: Option<&TxnMeta>,
    id: &str,
    timeout_ms: i32,
    expected: Option<(i64, i16)>,
    now: i64,
    new_pid: &mut dyn FnMut() -> i64,
) -> Result<InitPlan, CoordError> {
    let Some(m) = existing else {
        return Ok(InitPlan::Ready(TxnMeta {
            transactional_id: id.to_string(),
            producer_id: new_pid(),
            prev_producer_id: -1,
            epoch: 0,
            last_epoch: -1,
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            start_ms: -1,
            update_ms: now,
            two_phase: false,
        }));
    };
    if matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
        return Err(CoordError::ConcurrentTransactions);
    }
    if let Some((pid, epoch)) = expected {
        // KIP-360: a producer re-initialising its own identity must name
        // the current epoch (or the one just replaced, when retrying). A
        // zombie naming an older epoch is fenced; it must never fence the
        // current producer or take its epoch.
        let current = m.producer_id == pid && epoch == m.epoch;
        let retry = m.producer_id == pid && epoch == m.last_epoch && epoch >= 0;
        let rotated = m.prev_producer_id == pid && exhausted(epoch);
        if !(current || retry || rotated) {
            return Err(CoordError::ProducerFenced);
        }
        if retry {
            return Ok(InitPlan::Ready(m.clone()));
        }
    }
    let mut n = m.clone();
    n.timeout_ms = timeout_ms;
    n.update_ms = now;
    if m.state == TxnState::Ongoing {
        // Fence the current producer: every marker of the abort carries the
        // bumped epoch, so its in-flight writes are refused everywhere.
        n.epoch = m.epoch.saturating_add(1);
        n.last_epoch = -1;
        n.state = TxnState::PrepareAbort;
        return Ok(InitPlan::Fence(n));
    }
    if exhausted(m.epoch) {
        n.prev_producer_id = m.producer_id;
        n.producer_id = new_pid();
        n.epoch = 0;
        n.last_epoch = -1;
    } else {
        match expected {
            None => {
                n.epoch = m.epoch + 1;
                n.last_epoch = -1;
            }
            Some((pid, epoch)) if pid == m.producer_id && epoch == m.epoch => {
                n.epoch = m.epoch + 1;
                n.last_epoch = m.epoch;
            }
            // A retry of a bump that already happened: answer it again.
            Some((pid, epoch)) if pid == m.producer_id && epoch == m.last_epoch && epoch >= 0 => {
                return Ok(InitPlan::Ready(m.clone()));
            }
            Some((pid, _)) if pid == m.prev_producer_id => {
                // Retry after a rotation: the current identity is the answer.
                return Ok(InitPlan::Ready(m.clone()));
            }
            Some(_) => return Err(CoordError::ProducerFenced),
        }
    }
    n.state = TxnState::Empty;
    n.partitions.clear();
    n.start_ms = -1;
    Ok(InitPlan::Ready(n))
}

/// After a fencing abort completed: the identity handed to the new producer
/// (the fencing epoch, or a fresh producer id when that epoch is exhausted).
pub fn complete_fence(fenced: &TxnMeta, now: i64, new_pid: &mut dyn FnMut() -> i64) -> TxnMeta {
    let mut n = complete(fenced, now);
    if exhausted(n.epoch) {
        n.prev_producer_id = n.producer_id;
        n.producer_id = new_pid();
        n.epoch = 0;
    }
    n
}

/// Plans AddPartitionsToTxn. `Ok(None)`: nothing to persist.
pub fn plan_add_partitions(
    m: Option<&TxnMeta>,
    pid: i64,
    epoch: i16,
    partitions: &[(String, i32)],
    now: i64,
) -> Result<Option<TxnMeta>, CoordError> {
    let m = check_identity(m, pid, epoch)?;
    match m.state {
        TxnState::PrepareCommit | TxnState::PrepareAbort => {
            return Err(CoordError::ConcurrentTransactions)
        }
        TxnState::Ongoing if partitions.iter().all(|p| m.partitions.contains(p)) => {
            return Ok(None)
        }
        _ => {}
    }
    let mut n = m.clone();
    if n.state != TxnState::Ongoing {
        n.start_ms = now;
        n.partitions.clear();
    }
    n.partitions.extend(partitions.iter().cloned());
    n.state = TxnState::Ongoing;
    n.update_ms = now;
    Ok(Some(n))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndPlan {
    /// A retry of an end that already completed: answer NONE.
    AlreadyDone,
    /// Persist this (PrepareCommit / PrepareAbort), write the markers, complete.
    Prepare(TxnMeta),
}

/// Plans EndTxn (transaction version 1: the epoch stays the same).
pub fn plan_end(
    m: Option<&TxnMeta>,
    pid: i64,
    epoch: i16,
    commit: bool,
    now: i64,
) -> Result<EndPlan, CoordError> {
    if m.is_some_and(|m| ended_by(m, pid, epoch, commit)) {
        return Ok(EndPlan::AlreadyDone);
    }
    let m = check_identity(m, pid, epoch)?;
    use TxnState::*;
    match (m.state, commit) {
        (Ongoing, _) => {
            let mut n = m.clone();
            n.state = if commit { PrepareCommit } else { PrepareAbort };
            n.update_ms = now;
            Ok(EndPlan::Prepare(n))
        }
        (PrepareCommit, true) | (PrepareAbort, false) => Err(CoordError::ConcurrentTransactions),
        (CompleteCommit, true) | (CompleteAbort, false) => Ok(EndPlan::AlreadyDone),
        _ => Err(CoordError::InvalidTxnState),
    }
}

/// Whether `m` is the end, with outcome `commit`, of the transaction
/// producer `pid` held at `epoch`, and nobody took the identity since: the
/// same epoch (a classic end), or the epoch its own TV2 end or its timeout
/// bumped from (`last_epoch`; a fence by a new producer clears it), or the
/// last epoch of a producer id that end rotated away from.
fn ended_by(m: &TxnMeta, pid: i64, epoch: i16, commit: bool) -> bool {
    let outcome = match m.state {
        TxnState::CompleteCommit => true,
        TxnState::CompleteAbort => false,
        _ => return false,
    };
    if outcome != commit || epoch < 0 {
        return false;
    }
    let same = m.producer_id == pid && m.epoch == epoch;
    let bumped =
        m.producer_id == pid && m.last_epoch == epoch && m.epoch as i32 == epoch as i32 + 1;
    let rotated =
        m.prev_producer_id == pid && pid >= 0 && exhausted(epoch.saturating_add(1)) && m.epoch == 0;
    same || bumped || rotated
}

/// Plans EndTxn v5 (KIP-890 transaction version 2): every end bumps the
/// epoch; markers carry the bumped epoch and the answer hands it (or, when it
/// is exhausted, a fresh producer id at epoch 0) to the client for its next
/// transaction. A retry is recognised by the stored epoch being one past the
/// request's. An abort with nothing open still bumps the epoch (no markers).
pub fn plan_end_v2(
    m: Option<&TxnMeta>,
    pid: i64,
    epoch: i16,
    commit: bool,
    now: i64,
) -> Result<EndPlan, CoordError> {
    use TxnState::*;
    let m = m.ok_or(CoordError::InvalidProducerIdMapping)?;
    // A retry across a producer id rotation: the old identity at the last epoch.
    let rotated_retry =
        m.prev_producer_id == pid && pid >= 0 && exhausted(epoch.saturating_add(1)) && m.epoch == 0;
    if m.producer_id != pid && !rotated_retry {
        return Err(CoordError::InvalidProducerIdMapping);
    }
    let current = m.producer_id == pid && epoch == m.epoch;
    // A retry: this producer's own end bumped the epoch (`last_epoch` names
    // the epoch it bumped from). A fence by a new producer clears
    // `last_epoch`, so a zombie one epoch behind is not taken for a retry
    // and handed the new producer's identity.
    let retry = rotated_retry
        || (m.producer_id == pid && m.epoch as i32 == epoch as i32 + 1 && m.last_epoch == epoch);
    let bump = |state: TxnState| {
        let mut n = m.clone();
        n.epoch = m.epoch.saturating_add(1);
        n.last_epoch = m.epoch;
        n.state = state;
        n.update_ms = now;
        Ok(EndPlan::Prepare(n))
    };
    match (m.state, commit) {
        (PrepareCommit | PrepareAbort, _) if retry => Err(CoordError::ConcurrentTransactions),
        (PrepareCommit | PrepareAbort, _) => Err(CoordError::ProducerFenced),
        (Ongoing, _) if current => bump(if commit { PrepareCommit } else { PrepareAbort }),
        (Ongoing, _) => Err(CoordError::ProducerFenced),
        (CompleteCommit, true) | (CompleteAbort, false) if retry => Ok(EndPlan::AlreadyDone),
        // A commit racing a timeout abort: fenced, not a fatal state error (KAFKA-20785).
        (CompleteAbort, true) if retry => Err(CoordError::ProducerFenced),
        (Empty | CompleteCommit | CompleteAbort, false) if current => bump(PrepareAbort),
        // A commit of a transaction that has not begun here. Under TV2 its
        // first produce begins it, and a Java producer can send EndTxn just
        // before the batches it flushed (its sender reads "no incomplete
        // batches" before taking the EndTxn off its queue). Retriable while
        // that transaction could still be open, so the retry commits the
        // records once they arrive; past its timeout, a client error.
        (Empty | CompleteCommit | CompleteAbort, true)
            if current && now.saturating_sub(m.update_ms) < i64::from(m.timeout_ms.max(0)) =>
        {
            Err(CoordError::ConcurrentTransactions)
        }
        (Empty | CompleteCommit | CompleteAbort, true) if current => {
            Err(CoordError::InvalidTxnState)
        }
        (CompleteCommit, false) if retry => Err(CoordError::InvalidTxnState),
        _ => Err(CoordError::ProducerFenced),
    }
}

/// After a TV2 end completed: the identity for the next transaction.
pub fn complete_v2(prepared: &TxnMeta, now: i64, new_pid: &mut dyn FnMut() -> i64) -> TxnMeta {
    complete_fence(prepared, now, new_pid)
}

/// The metadata once all markers of a Prepare* state are written.
pub fn complete(m: &TxnMeta, now: i64) -> TxnMeta {
    let mut n = m.clone();
    n.state = match m.state {
        TxnState::PrepareCommit => TxnState::CompleteCommit,
        _ => TxnState::CompleteAbort,
    };
    n.partitions.clear();
    n.update_ms = now;
    n
}

/// What becomes of a transaction that outlives its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    /// Abort it and fence its producer (Kafka's rule).
    Abort,
    /// Park it: it stays open, pinning the last stable offset, until its
    /// producer or an operator ends it, or it has been parked `max_park_ms`
    /// (negative: no limit).
    Park { max_park_ms: i64 },
}

/// The operator's two-phase-commit policy: which transactional ids park
/// instead of aborting at their timeout, and for how long at most.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParkPolicy {
    /// Writers (as [`crate::machines::writers::prefix_of`] names them), or string
    /// prefixes when written with a trailing `*`.
    pub prefixes: Vec<String>,
    /// Negative: parked until resolved.
    pub max_park_ms: i64,
}

impl ParkPolicy {
    /// Parses `transaction.two.phase.commit.prefixes` (comma-separated).
    pub fn new(list: &str, max_park_ms: i64) -> Self {
        Self {
            prefixes: list
                .split(',')
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect(),
            max_park_ms,
        }
    }

    pub fn on_timeout(&self, transactional_id: &str) -> OnTimeout {
        let writer = crate::machines::writers::prefix_of(transactional_id);
        let parks = self.prefixes.iter().any(|p| match p.strip_suffix('*') {
            Some(start) => transactional_id.starts_with(start),
            None => p == writer || p == transactional_id,
        });
        if parks {
            OnTimeout::Park {
                max_park_ms: self.max_park_ms,
            }
        } else {
            OnTimeout::Abort
        }
    }
}

/// When `m` outlived (or will outlive) its timeout; `None` when nothing is open.
pub fn expires_at(m: &TxnMeta) -> Option<i64> {
    (m.state == TxnState::Ongoing && m.start_ms >= 0)
        .then(|| m.start_ms.saturating_add(m.timeout_ms as i64))
}

/// Since when `m` is parked under `on`: open past its timeout and kept.
pub fn parked_since(m: &TxnMeta, now: i64, on: OnTimeout) -> Option<i64> {
    let at = expires_at(m).filter(|at| now > *at)?;
    matches!(on, OnTimeout::Park { .. }).then_some(at)
}

/// If this transaction has outlived its timeout (and, when parked, its
/// maximum park time), the fencing abort to run. Nobody else holds the
/// bumped epoch, so the timed-out producer's own abort (TV2) or KIP-360
/// re-init is answered with it (`last_epoch`).
pub fn plan_timeout(m: &TxnMeta, now: i64, on: OnTimeout) -> Option<TxnMeta> {
    let at = expires_at(m).filter(|at| now > *at)?;
    if let OnTimeout::Park { max_park_ms } = on {
        if max_park_ms < 0 || now - at <= max_park_ms {
            return None;
        }
    }
    plan_fence(m, now).map(|mut f| {
        f.last_epoch = m.epoch;
        f
    })
}

/// The fencing abort of an open transaction (timeout or operator): epoch + 1,
/// PrepareAbort. `None` when nothing is open.
pub fn plan_fence(m: &TxnMeta, now: i64) -> Option<TxnMeta> {
    if m.state != TxnState::Ongoing {
        return None;
    }
    let mut n = m.clone();
    n.epoch = m.epoch.saturating_add(1);
    n.last_epoch = -1;
    n.state = TxnState::PrepareAbort;
    n.update_ms = now;
    Some(n)
}

/// Fences an idle transactional id (no open transaction): epoch + 1, or a
/// fresh producer id when the epoch is exhausted. `None` while a
/// transaction is open or completing (fence it with [`plan_fence`]).
pub fn fence_idle(m: &TxnMeta, now: i64, new_pid: &mut dyn FnMut() -> i64) -> Option<TxnMeta> {
    if !matches!(
        m.state,
        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
    ) {
        return None;
    }
    let mut n = m.clone();
    if exhausted(m.epoch.saturating_add(1)) {
        n.prev_producer_id = m.producer_id;
        n.producer_id = new_pid();
        n.epoch = 0;
    } else {
        n.epoch = m.epoch + 1;
    }
    n.last_epoch = -1;
    n.update_ms = now;
    Some(n)
}

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
    pub fn of(m: &TxnMeta) -> Self {
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
pub fn update_view(map: &mut HashMap<i64, ProducerView>, m: &TxnMeta) {
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

/// KIP-890 verification: may producer `view` (at `epoch`) write a
/// transactional batch to `topic`-`partition`?
pub fn verify_write(
    view: Option<&ProducerView>,
    epoch: i16,
    topic: &str,
    partition: i32,
) -> Result<(), VerifyError> {
    match view {
        Some(o) if epoch < o.epoch => Err(VerifyError::StaleEpoch),
        Some(o) if epoch == o.epoch && o.partitions.contains(&(topic.to_string(), partition)) => {
            Ok(())
        }
        _ => Err(VerifyError::NotInTransaction),
    }
}

/// One step the driver takes for a decision. A decision is a list of
/// these, run in order; a step starts only when the one before it is done,
/// and a failed step ends the list (what is durable stays decided).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Append to the transaction log and wait until it is durable; then it
    /// is current.
    Persist(TxnMeta),
    /// Current at once; it reaches the disk with the next group commit. Only
    /// for a change that recovery re-creates if it is lost (a Complete whose
    /// Prepare and markers are durable).
    PersistLater(TxnMeta),
    /// Write a marker to each partition and wait until all are durable,
    /// retrying for as long as it takes.
    WriteMarkers {
        producer_id: i64,
        epoch: i16,
        commit: bool,
        partitions: Vec<(String, i32)>,
    },
    /// The group coordinator's side: the producer's pending transactional
    /// offsets become committed, or are dropped.
    CompleteOffsets { producer_id: i64, commit: bool },
    /// Answer the client with the identity it uses next.
    Reply { producer_id: i64, epoch: i16 },
}

/// The steps that take a Prepare* transaction to `done`: markers (data
/// partitions, then offsets), then the Complete record. Without `prepared`
/// persisted first (recovery: it already is).
fn drive(prepared: &TxnMeta, done: &TxnMeta) -> Vec<Effect> {
    let commit = prepared.state == TxnState::PrepareCommit;
    let mut out = Vec::new();
    let data: Vec<(String, i32)> = prepared
        .partitions
        .iter()
        .filter(|(t, _)| t != crate::machines::names::OFFSETS_TOPIC)
        .cloned()
        .collect();
    if !data.is_empty() {
        out.push(Effect::WriteMarkers {
            producer_id: prepared.producer_id,
            epoch: prepared.epoch,
            commit,
            partitions: data,
        });
    }
    if prepared
        .partitions
        .iter()
        .any(|(t, _)| t == crate::machines::names::OFFSETS_TOPIC)
    {
        out.push(Effect::CompleteOffsets {
            producer_id: prepared.producer_id,
            commit,
        });
    }
    if done.producer_id == prepared.producer_id {
        // The outcome is durable in the Prepare record and the markers: a
        // lost Complete record is re-driven from the Prepare at start.
        out.push(Effect::PersistLater(done.clone()));
    } else {
        // A new producer id: the client is about to use it, and recovery
        // would not hand it out again.
        out.push(Effect::Persist(done.clone()));
    }
    out
}

/// Ends a transaction: persist its Prepare* state, then [`drive`] it to the
/// state [`complete_fence`] gives.
pub fn finish(prepared: &TxnMeta, now: i64, new_pid: &mut dyn FnMut() -> i64) -> Vec<Effect> {
    let done = complete_fence(prepared, now, new_pid);
    let mut out = vec![Effect::Persist(prepared.clone())];
    out.extend(drive(prepared, &done));
    out
}

/// If a decision ends a transaction: the Prepare* state it persists and
/// the state it completes in.
pub fn transition(effects: &[Effect]) -> Option<(&TxnMeta, &TxnMeta)> {
    let prepared = effects.iter().find_map(|e| match e {
        Effect::Persist(m)
            if matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort) =>
        {
            Some(m)
        }
        _ => None,
    })?;
    let done = effects.iter().rev().find_map(|e| match e {
        Effect::Persist(m) | Effect::PersistLater(m)
            if matches!(m.state, TxnState::CompleteCommit | TxnState::CompleteAbort) =>
        {
            Some(m)
        }
        _ => None,
    })?;
    Some((prepared, done))
}

fn reply_with(mut effects: Vec<Effect>) -> Vec<Effect> {
    let last = effects.iter().rev().find_map(|e| match e {
        Effect::Persist(m) | Effect::PersistLater(m) => Some((m.producer_id, m.epoch)),
        _ => None,
    });
    if let Some((producer_id, epoch)) = last {
        effects.push(Effect::Reply { producer_id, epoch });
    }
    effects
}

/// InitProducerId as effects. `existing` is the current metadata.
pub fn decide_init(
    existing: Option<&TxnMeta>,
    id: &str,
    timeout_ms: i32,
    expected: Option<(i64, i16)>,
    now: i64,
    new_pid: &mut dyn FnMut() -> i64,
) -> Result<Vec<Effect>, CoordError> {
    Ok(
        match plan_init(existing, id, timeout_ms, expected, now, new_pid)? {
            InitPlan::Ready(m) if existing == Some(&m) => vec![Effect::Reply {
                producer_id: m.producer_id,
                epoch: m.epoch,
            }],
            InitPlan::Ready(m) => reply_with(vec![Effect::Persist(m)]),
            InitPlan::Fence(f) => reply_with(finish(&f, now, new_pid)),
        },
    )
}

/// KIP-939's InitProducerId fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TwoPhase {
    /// The producer takes part in two-phase commit: its transactions park
    /// at their timeout instead of aborting.
    pub enable: bool,
    /// Keep the open (prepared) transaction instead of aborting it: the new
    /// producer gets the next epoch (so the old one is fenced) and then
    /// commits or aborts the kept transaction with it.
    pub keep_prepared: bool,
}

/// A decision, and the identity a kept prepared transaction was prepared
/// under (`None` when none was kept).
pub type InitDecision = (Vec<Effect>, Option<(i64, i16)>);

/// InitProducerId with KIP-939's fields.
pub fn decide_init_2pc(
    existing: Option<&TxnMeta>,
    id: &str,
    timeout_ms: i32,
    expected: Option<(i64, i16)>,
    two_phase: TwoPhase,
    now: i64,
    new_pid: &mut dyn FnMut() -> i64,
) -> Result<InitDecision, CoordError> {
    if two_phase.keep_prepared {
        if let Some(m) = existing.filter(|m| m.state == TxnState::Ongoing) {
            if !exhausted(m.epoch.saturating_add(1)) {
                let mut n = m.clone();
                n.epoch = m.epoch + 1;
                n.last_epoch = -1;
                n.timeout_ms = timeout_ms;
                n.two_phase = two_phase.enable;
                n.update_ms = now;
                return Ok((
                    reply_with(vec![Effect::Persist(n)]),
                    Some((m.producer_id, m.epoch)),
                ));
            }
        }
    }
    let mut effects = decide_init(existing, id, timeout_ms, expected, now, new_pid)?;
    for e in &mut effects {
        if let Effect::Persist(m) | Effect::PersistLater(m) = e {
            m.two_phase = two_phase.enable;
        }
    }
    Ok((effects, None))
}

/// AddPartitionsToTxn (and AddOffsetsToTxn) as effects.
pub fn decide_add_partitions(
    m: Option<&TxnMeta>,
    pid: i64,
    epoch: i16,
    partitions: &[(String, i32)],
    now: i64,
) -> Result<Vec<Effect>, CoordError> {
    let reply = Effect::Reply {
        producer_id: pid,
        epoch,
    };
    Ok(match plan_add_partitions(m, pid, epoch, partitions, now)? {
        None => vec![reply],
        Some(n) => vec![Effect::Persist(n), reply],
    })
}

/// EndTxn as effects; `tv2` picks KIP-890's rules ([`plan_end_v2`]).
pub fn decide_end(
    m: Option<&TxnMeta>,
    pid: i64,
    epoch: i16,
    commit: bool,
    tv2: bool,
    now: i64,
    new_pid: &mut dyn FnMut() -> i64,
) -> Result<Vec<Effect>, CoordError> {
    let plan = if tv2 {
        plan_end_v2(m, pid, epoch, commit, now)?
    } else {
        plan_end(m, pid, epoch, commit, now)?
    };
    Ok(match plan {
        EndPlan::AlreadyDone => vec![Effect::Reply {
            producer_id: m.map_or(pid, |m| m.producer_id),
            epoch: m.map_or(epoch, |m| m.epoch),
        }],
        EndPlan::Prepare(p) => reply_with(finish(&p, now, new_pid)),
    })
}

/// The timeout reaper's abort of `m`, if it has outlived its timeout.
pub fn decide_timeout(
    m: &TxnMeta,
    now: i64,
    on: OnTimeout,
    new_pid: &mut dyn FnMut() -> i64,
) -> Vec<Effect> {
    plan_timeout(m, now, on).map_or_else(Vec::new, |f| finish(&f, now, new_pid))
}

/// An operator's abort of `m`'s open transaction (fencing its producer).
pub fn decide_admin_abort(m: &TxnMeta, now: i64, new_pid: &mut dyn FnMut() -> i64) -> Vec<Effect> {
    plan_fence(m, now).map_or_else(Vec::new, |f| finish(&f, now, new_pid))
}

/// At start: a Prepare* state found in the log is driven to completion
/// again (markers are idempotent). The Complete record is waited for.
pub fn decide_recovery(m: &TxnMeta, now: i64) -> Vec<Effect> {
    if !matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
        return Vec::new();
    }
    let done = complete(m, now);
    drive(m, &done)
        .into_iter()
        .map(|e| match e {
            Effect::PersistLater(d) => Effect::Persist(d),
            e => e,
        })
        .collect()
}

fn check_identity(m: Option<&TxnMeta>, pid: i64, epoch: i16) -> Result<&TxnMeta, CoordError> {
    let m = m.ok_or(CoordError::InvalidProducerIdMapping)?;
    if m.producer_id != pid {
        return Err(CoordError::InvalidProducerIdMapping);
    }
    if m.epoch != epoch {
        return Err(CoordError::ProducerFenced);
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pids() -> impl FnMut() -> i64 {
        let mut n = 100;
        move || {
            n += 1;
            n
        }
    }

    fn ready(p: InitPlan) -> TxnMeta {
        match p {
            InitPlan::Ready(m) => m,
            other => panic!("expected Ready, got {other:?}"),
        }
    }

    fn tp(t: &str, p: i32) -> (String, i32) {
        (t.to_string(), p)
    }

    #[test]
    fn first_init_then_bumps() {
        let mut next = pids();
        let m = ready(plan_init(None, "t", 60000, None, 1, &mut next).unwrap());
        assert_eq!((m.producer_id, m.epoch, m.state), (101, 0, TxnState::Empty));
        let m2 = ready(plan_init(Some(&m), "t", 60000, None, 2, &mut next).unwrap());
        assert_eq!((m2.producer_id, m2.epoch), (101, 1));
    }

    #[test]
    fn zombie_reinit_with_an_old_epoch_is_fenced_and_fences_nobody() {
        // Found by `oncelog audit` (queue workload): a paused producer at
        // epoch 0 resumed and re-initialised with KIP-360 (naming its own
        // id and old epoch) while its successor (epoch 1) had a transaction
        // open. The coordinator fenced the successor and gave the zombie
        // epoch 2. It must refuse the zombie instead.
        let mut next = pids();
        let m = ready(plan_init(None, "q-1", 60000, None, 1, &mut next).unwrap());
        let m = ready(plan_init(Some(&m), "q-1", 60000, None, 2, &mut next).unwrap());
        assert_eq!(m.epoch, 1);
        let open = plan_add_partitions(Some(&m), 101, 1, &[tp("q", 1)], 3)
            .unwrap()
            .unwrap();
        assert_eq!(open.state, TxnState::Ongoing);
        assert_eq!(
            plan_init(Some(&open), "q-1", 60000, Some((101, 0)), 4, &mut next).err(),
            Some(CoordError::ProducerFenced)
        );
        // The current producer re-initialising itself (epoch 1) still works:
        // its open transaction is aborted with the bumped epoch.
        let InitPlan::Fence(f) =
            plan_init(Some(&open), "q-1", 60000, Some((101, 1)), 5, &mut next).unwrap()
        else {
            panic!("expected a fence");
        };
        assert_eq!(f.epoch, 2);
    }

    #[test]
    fn init_on_open_transaction_fences_and_answers_the_fencing_epoch() {
        let mut next = pids();
        let m = ready(plan_init(None, "fare-writer-7", 60000, None, 1, &mut next).unwrap());
        let m = plan_add_partitions(Some(&m), 101, 0, &[tp("fares", 2)], 5)
            .unwrap()
            .unwrap();
        assert_eq!(m.state, TxnState::Ongoing);
        let InitPlan::Fence(f) =
            plan_init(Some(&m), "fare-writer-7", 60000, None, 9, &mut next).unwrap()
        else {
            panic!("expected a fence");
        };
        assert_eq!(
            (f.producer_id, f.epoch, f.state),
            (101, 1, TxnState::PrepareAbort)
        );
        assert_eq!(
            f.partitions.len(),
            1,
            "the abort goes to the open partitions"
        );
        let done = complete_fence(&f, 10, &mut next);
        assert_eq!(
            (done.producer_id, done.epoch, done.state),
            (101, 1, TxnState::CompleteAbort)
        );
        // The zombie (epoch 0) is fenced at the coordinator.
        assert_eq!(
            plan_end(Some(&done), 101, 0, true, 11),
            Err(CoordError::ProducerFenced)
        );
        assert_eq!(
            plan_add_partitions(Some(&done), 101, 0, &[tp("fares", 2)], 11),
            Err(CoordError::ProducerFenced)
        );
        // The new producer (epoch 1) goes on.
        let o = plan_add_partitions(Some(&done), 101, 1, &[tp("fares", 2)], 12)
            .unwrap()
            .unwrap();
        assert_eq!(o.start_ms, 12);
        let EndPlan::Prepare(p) = plan_end(Some(&o), 101, 1, true, 13).unwrap() else {
            panic!()
        };
        assert_eq!(p.state, TxnState::PrepareCommit);
        let c = complete(&p, 14);
        assert_eq!(c.state, TxnState::CompleteCommit);
        assert_eq!(
            plan_end(Some(&c), 101, 1, true, 15),
            Ok(EndPlan::AlreadyDone)
        );
        assert_eq!(
            plan_end(Some(&c), 101, 1, false, 15),
            Err(CoordError::InvalidTxnState)
        );
    }

    #[test]
    fn end_state_table() {
        let mut next = pids();
        let m = ready(plan_init(None, "t", 1000, None, 1, &mut next).unwrap());
        assert_eq!(
            plan_end(Some(&m), 101, 0, true, 2),
            Err(CoordError::InvalidTxnState)
        );
        assert_eq!(
            plan_end(Some(&m), 999, 0, true, 2),
            Err(CoordError::InvalidProducerIdMapping)
        );
        assert_eq!(
            plan_end(None, 101, 0, true, 2),
            Err(CoordError::InvalidProducerIdMapping)
        );
        let o = plan_add_partitions(Some(&m), 101, 0, &[tp("a", 0)], 3)
            .unwrap()
            .unwrap();
        // Adding a partition already in the set writes nothing.
        assert_eq!(
            plan_add_partitions(Some(&o), 101, 0, &[tp("a", 0)], 4),
            Ok(None)
        );
        let EndPlan::Prepare(pa) = plan_end(Some(&o), 101, 0, false, 5).unwrap() else {
            panic!()
        };
        assert_eq!(
            plan_end(Some(&pa), 101, 0, false, 6),
            Err(CoordError::ConcurrentTransactions)
        );
        assert_eq!(
            plan_end(Some(&pa), 101, 0, true, 6),
            Err(CoordError::InvalidTxnState)
        );
        assert_eq!(
            plan_add_partitions(Some(&pa), 101, 0, &[tp("a", 1)], 6),
            Err(CoordError::ConcurrentTransactions)
        );
        assert_eq!(
            plan_init(Some(&pa), "t", 1000, None, 6, &mut next),
            Err(CoordError::ConcurrentTransactions)
        );
    }

    #[test]
    fn tv2_end_bumps_every_time_and_recognises_retries() {
        let mut next = pids();
        let m = ready(plan_init(None, "t", 1000, None, 1, &mut next).unwrap());
        // Empty + commit: the records may be on their way (retriable) until
        // the transaction's timeout, then a client bug; Empty + abort bumps
        // (no markers).
        assert_eq!(
            plan_end_v2(Some(&m), 101, 0, true, 2),
            Err(CoordError::ConcurrentTransactions)
        );
        assert_eq!(
            plan_end_v2(Some(&m), 101, 0, true, 1 + 1000),
            Err(CoordError::InvalidTxnState)
        );
        let EndPlan::Prepare(ea) = plan_end_v2(Some(&m), 101, 0, false, 2).unwrap() else {
            panic!()
        };
        assert_eq!((ea.epoch, ea.state), (1, TxnState::PrepareAbort));
        let ea = complete_v2(&ea, 3, &mut next);
        assert_eq!((ea.epoch, ea.state), (1, TxnState::CompleteAbort));
        // A retry of that abort (request epoch 0, stored 1) is answered NONE.
        assert_eq!(
            plan_end_v2(Some(&ea), 101, 0, false, 4),
            Ok(EndPlan::AlreadyDone)
        );
        // A commit retry racing a timeout abort is fenced, not INVALID_TXN_STATE.
        assert_eq!(
            plan_end_v2(Some(&ea), 101, 0, true, 4),
            Err(CoordError::ProducerFenced)
        );
        let o = plan_add_partitions(Some(&ea), 101, 1, &[tp("a", 0)], 5)
            .unwrap()
            .unwrap();
        let EndPlan::Prepare(pc) = plan_end_v2(Some(&o), 101, 1, true, 6).unwrap() else {
            panic!()
        };
        assert_eq!((pc.epoch, pc.state), (2, TxnState::PrepareCommit));
        assert_eq!(
            plan_end_v2(Some(&pc), 101, 1, true, 6),
            Err(CoordError::ConcurrentTransactions)
        );
        let c = complete_v2(&pc, 7, &mut next);
        assert_eq!(
            plan_end_v2(Some(&c), 101, 1, true, 8),
            Ok(EndPlan::AlreadyDone)
        );
        // The next transaction's commit ahead of its first produce: retried
        // (its records begin it), a client error only past the timeout.
        assert_eq!(
            plan_end_v2(Some(&c), 101, 2, true, 8),
            Err(CoordError::ConcurrentTransactions)
        );
        assert_eq!(
            plan_end_v2(Some(&c), 101, 2, true, 7 + 1000),
            Err(CoordError::InvalidTxnState)
        );
        let next_txn = plan_add_partitions(Some(&c), 101, 2, &[tp("a", 0)], 9)
            .unwrap()
            .unwrap();
        let EndPlan::Prepare(p3) = plan_end_v2(Some(&next_txn), 101, 2, true, 10).unwrap() else {
            panic!()
        };
        assert_eq!((p3.epoch, p3.state), (3, TxnState::PrepareCommit));
        assert_eq!(
            plan_end_v2(Some(&c), 101, 1, false, 8),
            Err(CoordError::InvalidTxnState)
        );
        assert_eq!(
            plan_end_v2(Some(&c), 101, 0, true, 8),
            Err(CoordError::ProducerFenced)
        );
        assert_eq!(
            plan_end_v2(Some(&c), 7, 2, true, 8),
            Err(CoordError::InvalidProducerIdMapping)
        );
    }

    #[test]
    fn tv2_zombie_abort_after_a_fence_is_not_a_retry() {
        // Found by the simulation test: a producer fenced by a new instance
        // (InitProducerId bumped the epoch to N+1 for it) sent EndTxn(abort)
        // with epoch N. It was taken for a retry and answered with N+1, the
        // new instance's identity: two producers then wrote as one.
        let mut next = pids();
        let m = ready(plan_init(None, "t", 1000, None, 1, &mut next).unwrap());
        let o = plan_add_partitions(Some(&m), 101, 0, &[tp("a", 0)], 2)
            .unwrap()
            .unwrap();
        let InitPlan::Fence(f) = plan_init(Some(&o), "t", 1000, None, 3, &mut next).unwrap() else {
            panic!("expected a fence")
        };
        let fenced = complete_fence(&f, 4, &mut next);
        assert_eq!(fenced.epoch, 1);
        assert_eq!(
            plan_end_v2(Some(&fenced), 101, 0, false, 5),
            Err(CoordError::ProducerFenced)
        );
        // After a timeout nobody else holds the new epoch: the timed-out
        // producer's own abort is answered with it, as before.
        let t = plan_timeout(&o, 5000, OnTimeout::Abort).unwrap();
        let timed_out = complete_fence(&t, 5001, &mut next);
        assert_eq!(
            plan_end_v2(Some(&timed_out), 101, 0, false, 5002),
            Ok(EndPlan::AlreadyDone)
        );
    }

    #[test]
    fn tv2_end_at_the_last_epoch_rotates_the_producer_id() {
        let mut next = pids();
        let mut m = ready(plan_init(None, "t", 1000, None, 1, &mut next).unwrap());
        m.epoch = i16::MAX - 2;
        let o = plan_add_partitions(Some(&m), 101, i16::MAX - 2, &[tp("a", 0)], 2)
            .unwrap()
            .unwrap();
        let EndPlan::Prepare(p) = plan_end_v2(Some(&o), 101, i16::MAX - 2, true, 3).unwrap() else {
            panic!()
        };
        assert_eq!(p.epoch, i16::MAX - 1);
        let c = complete_v2(&p, 4, &mut next);
        assert_eq!((c.producer_id, c.prev_producer_id, c.epoch), (102, 101, 0));
        // The retry with the old identity is recognised.
        assert_eq!(
            plan_end_v2(Some(&c), 101, i16::MAX - 2, true, 5),
            Ok(EndPlan::AlreadyDone)
        );
        assert_eq!(
            plan_end_v2(Some(&c), 101, 7, true, 5),
            Err(CoordError::InvalidProducerIdMapping)
        );
    }

    #[test]
    fn kip360_bump_and_retry() {
        let mut next = pids();
        let m = ready(plan_init(None, "t", 1000, None, 1, &mut next).unwrap());
        let b = ready(plan_init(Some(&m), "t", 1000, Some((101, 0)), 2, &mut next).unwrap());
        assert_eq!((b.epoch, b.last_epoch), (1, 0));
        // The same request again (its answer was lost): same identity, no second bump.
        let r = ready(plan_init(Some(&b), "t", 1000, Some((101, 0)), 3, &mut next).unwrap());
        assert_eq!(r.epoch, 1);
        // Someone with a stale epoch is fenced.
        let b2 = ready(plan_init(Some(&r), "t", 1000, Some((101, 1)), 4, &mut next).unwrap());
        assert_eq!(b2.epoch, 2);
        assert_eq!(
            plan_init(Some(&b2), "t", 1000, Some((101, 0)), 5, &mut next),
            Err(CoordError::ProducerFenced)
        );
        assert_eq!(
            plan_init(Some(&b2), "t", 1000, Some((555, 0)), 5, &mut next),
            Err(CoordError::ProducerFenced)
        );
    }

    #[test]
    fn exhausted_epoch_rotates_the_producer_id() {
        let mut next = pids();
        let mut m = ready(plan_init(None, "t", 1000, None, 1, &mut next).unwrap());
        m.epoch = i16::MAX - 1;
        let r = ready(plan_init(Some(&m), "t", 1000, None, 2, &mut next).unwrap());
        assert_eq!((r.producer_id, r.prev_producer_id, r.epoch), (102, 101, 0));
        // A fence at the edge uses i16::MAX for the markers, then rotates.
        let mut o = plan_add_partitions(Some(&r), 102, 0, &[tp("a", 0)], 3)
            .unwrap()
            .unwrap();
        o.epoch = i16::MAX - 1;
        let InitPlan::Fence(f) = plan_init(Some(&o), "t", 1000, None, 4, &mut next).unwrap() else {
            panic!()
        };
        assert_eq!(f.epoch, i16::MAX);
        let done = complete_fence(&f, 5, &mut next);
        assert_eq!((done.producer_id, done.epoch), (103, 0));
    }

    #[test]
    fn timeout_fences_only_expired_ongoing() {
        let mut next = pids();
        let m = ready(plan_init(None, "t", 1000, None, 1, &mut next).unwrap());
        assert_eq!(plan_timeout(&m, 1_000_000, OnTimeout::Abort), None);
        let o = plan_add_partitions(Some(&m), 101, 0, &[tp("a", 0)], 100)
            .unwrap()
            .unwrap();
        assert_eq!(plan_timeout(&o, 1100, OnTimeout::Abort), None);
        let f = plan_timeout(&o, 1101, OnTimeout::Abort).unwrap();
        assert_eq!((f.epoch, f.state), (1, TxnState::PrepareAbort));
    }

    #[test]
    fn keep_prepared_hands_the_next_epoch_and_keeps_the_transaction() {
        let mut next = pids();
        let m = ready(plan_init(None, "t", 1000, None, 1, &mut next).unwrap());
        let o = plan_add_partitions(Some(&m), 101, 0, &[tp("a", 0)], 100)
            .unwrap()
            .unwrap();
        let keep = TwoPhase {
            enable: true,
            keep_prepared: true,
        };
        let (effects, kept) =
            decide_init_2pc(Some(&o), "t", 5000, None, keep, 200, &mut next).unwrap();
        assert_eq!(kept, Some((101, 0)));
        let Effect::Persist(n) = &effects[0] else {
            panic!("{effects:?}")
        };
        assert_eq!(
            (n.state, n.epoch, n.two_phase),
            (TxnState::Ongoing, 1, true)
        );
        assert_eq!(n.partitions, o.partitions);
        assert_eq!(
            effects.last(),
            Some(&Effect::Reply {
                producer_id: 101,
                epoch: 1
            })
        );
        // The old producer is fenced; the new one commits the kept transaction.
        assert_eq!(
            plan_end(Some(n), 101, 0, true, 300),
            Err(CoordError::ProducerFenced)
        );
        assert!(matches!(
            plan_end(Some(n), 101, 1, true, 300),
            Ok(EndPlan::Prepare(_))
        ));
        // A 2PC producer's transaction parks whatever the prefix policy says.
        assert!(n.two_phase);
        // Without keep, the open transaction is aborted as always, and the
        // flag follows the request.
        let (effects, kept) = decide_init_2pc(
            Some(&o),
            "t",
            5000,
            None,
            TwoPhase::default(),
            200,
            &mut next,
        )
        .unwrap();
        assert_eq!(kept, None);
        assert!(effects
            .iter()
            .any(|e| matches!(e, Effect::WriteMarkers { commit: false, .. })));
        assert!(effects
            .iter()
            .all(|e| !matches!(e, Effect::Persist(m) | Effect::PersistLater(m) if m.two_phase)));
        // Nothing open: keep is an ordinary init.
        let (effects, kept) =
            decide_init_2pc(Some(&m), "t", 5000, None, keep, 200, &mut next).unwrap();
        assert_eq!(kept, None);
        assert!(effects
            .iter()
            .any(|e| matches!(e, Effect::Persist(m) if m.two_phase && m.epoch == 1)));
    }

    #[test]
    fn park_policy_names_writers() {
        let p = ParkPolicy::new(" orders-sink, flink-* ,", 60_000);
        assert_eq!(p.prefixes, vec!["orders-sink", "flink-*"]);
        let park = OnTimeout::Park {
            max_park_ms: 60_000,
        };
        assert_eq!(p.on_timeout("orders-sink-0-17"), park);
        assert_eq!(p.on_timeout("orders-sink"), park);
        assert_eq!(p.on_timeout("orders-sink-2-0-17"), OnTimeout::Abort);
        assert_eq!(p.on_timeout("flink-anything"), park);
        assert_eq!(p.on_timeout("fare-writer-7"), OnTimeout::Abort);
        assert_eq!(ParkPolicy::default().on_timeout("x"), OnTimeout::Abort);
    }

    #[test]
    fn a_parked_transaction_stays_open_until_its_maximum_park_time() {
        let mut next = pids();
        let m = ready(plan_init(None, "t", 1000, None, 1, &mut next).unwrap());
        let o = plan_add_partitions(Some(&m), 101, 0, &[tp("a", 0)], 100)
            .unwrap()
            .unwrap();
        let forever = OnTimeout::Park { max_park_ms: -1 };
        assert_eq!(parked_since(&o, 1100, forever), None);
        assert_eq!(parked_since(&o, 1101, forever), Some(1100));
        assert_eq!(parked_since(&o, 1101, OnTimeout::Abort), None);
        assert_eq!(plan_timeout(&o, i64::MAX / 2, forever), None);
        let bounded = OnTimeout::Park { max_park_ms: 500 };
        assert_eq!(plan_timeout(&o, 1600, bounded), None);
        let f = plan_timeout(&o, 1601, bounded).unwrap();
        assert_eq!((f.epoch, f.state), (1, TxnState::PrepareAbort));
        // Its producer commits it after the timeout, with the epoch it holds.
        let EndPlan::Prepare(p) = plan_end(Some(&o), 101, 0, true, 5000).unwrap() else {
            panic!()
        };
        assert_eq!(p.state, TxnState::PrepareCommit);
        let EndPlan::Prepare(p) = plan_end_v2(Some(&o), 101, 0, true, 5000).unwrap() else {
            panic!()
        };
        assert_eq!((p.state, p.epoch), (TxnState::PrepareCommit, 1));
    }

    /// The re-commit rule against every coordinator state: success without
    /// a change only for an end with the outcome the state already has,
    /// from the identity that ended it (same epoch under the classic
    /// protocol, the epoch bumped from under either); never for a producer
    /// a new one fenced.
    #[test]
    fn recommit_rule_in_every_state() {
        use TxnState::*;
        for state in [
            Empty,
            Ongoing,
            PrepareCommit,
            PrepareAbort,
            CompleteCommit,
            CompleteAbort,
        ] {
            for fenced_by_new_producer in [false, true] {
                let mut m = at(state, 5);
                if fenced_by_new_producer {
                    m.last_epoch = -1;
                }
                for (epoch, commit, tv2) in [4, 5]
                    .into_iter()
                    .flat_map(|e| [(e, true), (e, false)])
                    .flat_map(|(e, c)| [(e, c, false), (e, c, true)])
                {
                    let got = if tv2 {
                        plan_end_v2(Some(&m), 101, epoch, commit, 9)
                    } else {
                        plan_end(Some(&m), 101, epoch, commit, 9)
                    };
                    let outcome_matches = (state, commit) == (CompleteCommit, true)
                        || (state, commit) == (CompleteAbort, false);
                    let own = (epoch == 5 && !tv2) || (epoch == 4 && !fenced_by_new_producer);
                    let row = format!("{state:?} fenced={fenced_by_new_producer} epoch={epoch} commit={commit} tv2={tv2}: {got:?}");
                    assert_eq!(
                        got == Ok(EndPlan::AlreadyDone),
                        outcome_matches && own,
                        "{row}"
                    );
                    if epoch == 4 && state != Ongoing {
                        // An older epoch never opens a transaction again.
                        assert!(!matches!(got, Ok(EndPlan::Prepare(_))), "{row}");
                    }
                }
            }
        }
        // A commit of an aborted transaction fails whoever asks.
        let m = at(CompleteAbort, 5);
        for (epoch, tv2) in [(4, false), (4, true), (5, false)] {
            let got = if tv2 {
                plan_end_v2(Some(&m), 101, epoch, true, 9)
            } else {
                plan_end(Some(&m), 101, epoch, true, 9)
            };
            assert!(
                got.is_err(),
                "commit of an aborted transaction at {epoch} tv2={tv2}: {got:?}"
            );
        }
        // A producer id rotation at the end: the old identity's re-commit.
        let mut m = at(CompleteCommit, 0);
        m.producer_id = 102;
        m.prev_producer_id = 101;
        assert_eq!(
            plan_end(Some(&m), 101, i16::MAX - 1, true, 9),
            Ok(EndPlan::AlreadyDone)
        );
        assert!(plan_end(Some(&m), 101, i16::MAX - 1, false, 9).is_err());
    }

    /// Fresh producer ids for the effect tables: 201, 202, …
    fn fresh() -> impl FnMut() -> i64 {
        let mut n = 200;
        move || {
            n += 1;
            n
        }
    }

    /// An effect list in a line each, for tables: `P` = Persist (waited),
    /// `L` = PersistLater, `M` = markers, `O` = offsets, `R` = reply.
    fn shape(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .map(|e| match e {
                Effect::Persist(m) => format!("P {} {}/{}", m.state.name(), m.producer_id, m.epoch),
                Effect::PersistLater(m) => {
                    format!("L {} {}/{}", m.state.name(), m.producer_id, m.epoch)
                }
                Effect::WriteMarkers {
                    producer_id,
                    epoch,
                    commit,
                    partitions,
                } => {
                    let ps: Vec<String> =
                        partitions.iter().map(|(t, p)| format!("{t}-{p}")).collect();
                    let kind = if *commit { "commit" } else { "abort" };
                    format!("M {kind} {producer_id}/{epoch} {}", ps.join(","))
                }
                Effect::CompleteOffsets {
                    producer_id,
                    commit,
                } => format!(
                    "O {} {producer_id}",
                    if *commit { "commit" } else { "abort" }
                ),
                Effect::Reply { producer_id, epoch } => format!("R {producer_id}/{epoch}"),
            })
            .collect()
    }

    /// Metadata of id "t" (producer 101) in `state` at `epoch`, with two data
    /// partitions and the offsets partition when a transaction is open.
    fn at(state: TxnState, epoch: i16) -> TxnMeta {
        let open = matches!(
            state,
            TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
        );
        TxnMeta {
            transactional_id: "t".into(),
            producer_id: 101,
            prev_producer_id: -1,
            epoch,
            last_epoch: epoch - 1,
            timeout_ms: 1000,
            state,
            partitions: if open {
                [
                    tp("a", 0),
                    tp("b", 1),
                    tp(crate::machines::names::OFFSETS_TOPIC, 0),
                ]
                .into_iter()
                .collect()
            } else {
                BTreeSet::new()
            },
            start_ms: if open { 10 } else { -1 },
            update_ms: 10,
            two_phase: false,
        }
    }

    type Row<'a> = (&'a str, Result<Vec<String>, CoordError>);

    fn check(rows: Vec<(Row, Result<Vec<Effect>, CoordError>)>) {
        for ((what, want), got) in rows {
            assert_eq!(got.map(|e| shape(&e)), want, "{what}");
        }
    }

    fn ok(lines: &[&str]) -> Result<Vec<String>, CoordError> {
        Ok(lines.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn end_txn_effects_v1() {
        use TxnState::*;
        let e = |m: Option<&TxnMeta>, pid, epoch, commit| {
            decide_end(m, pid, epoch, commit, false, 50, &mut fresh())
        };
        let full = |kind: &str, prep: &str, done: &str| {
            ok(&[
                &format!("P {prep} 101/3"),
                &format!("M {kind} 101/3 a-0,b-1"),
                &format!("O {kind} 101"),
                &format!("L {done} 101/3"),
                "R 101/3",
            ])
        };
        check(vec![
            (
                (
                    "ongoing, commit",
                    full("commit", "PrepareCommit", "CompleteCommit"),
                ),
                e(Some(&at(Ongoing, 3)), 101, 3, true),
            ),
            (
                (
                    "ongoing, abort",
                    full("abort", "PrepareAbort", "CompleteAbort"),
                ),
                e(Some(&at(Ongoing, 3)), 101, 3, false),
            ),
            (
                (
                    "commit being prepared",
                    Err(CoordError::ConcurrentTransactions),
                ),
                e(Some(&at(PrepareCommit, 3)), 101, 3, true),
            ),
            (
                (
                    "abort while a commit is prepared",
                    Err(CoordError::InvalidTxnState),
                ),
                e(Some(&at(PrepareCommit, 3)), 101, 3, false),
            ),
            (
                (
                    "abort being prepared",
                    Err(CoordError::ConcurrentTransactions),
                ),
                e(Some(&at(PrepareAbort, 3)), 101, 3, false),
            ),
            (
                ("commit retried after it completed", ok(&["R 101/3"])),
                e(Some(&at(CompleteCommit, 3)), 101, 3, true),
            ),
            (
                ("abort retried after it completed", ok(&["R 101/3"])),
                e(Some(&at(CompleteAbort, 3)), 101, 3, false),
            ),
            (
                ("commit after an abort", Err(CoordError::InvalidTxnState)),
                e(Some(&at(CompleteAbort, 3)), 101, 3, true),
            ),
            (
                ("commit with nothing open", Err(CoordError::InvalidTxnState)),
                e(Some(&at(Empty, 3)), 101, 3, true),
            ),
            (
                ("stale epoch", Err(CoordError::ProducerFenced)),
                e(Some(&at(Ongoing, 3)), 101, 2, true),
            ),
            (
                (
                    "other producer id",
                    Err(CoordError::InvalidProducerIdMapping),
                ),
                e(Some(&at(Ongoing, 3)), 7, 3, true),
            ),
            (
                ("unknown id", Err(CoordError::InvalidProducerIdMapping)),
                e(None, 101, 3, true),
            ),
        ]);
    }

    #[test]
    fn end_txn_effects_v2() {
        use TxnState::*;
        // last changed longer than its timeout before `now` (50)
        let idle = |mut m: TxnMeta| {
            m.update_ms = 50 - i64::from(m.timeout_ms);
            m
        };
        let e = |m: &TxnMeta, pid, epoch, commit| {
            decide_end(Some(m), pid, epoch, commit, true, 50, &mut fresh())
        };
        let mut last = at(Ongoing, i16::MAX - 2);
        last.last_epoch = -1;
        check(vec![
            (
                (
                    "ongoing, commit: markers and answer carry the bumped epoch",
                    ok(&[
                        "P PrepareCommit 101/4",
                        "M commit 101/4 a-0,b-1",
                        "O commit 101",
                        "L CompleteCommit 101/4",
                        "R 101/4",
                    ]),
                ),
                e(&at(Ongoing, 3), 101, 3, true),
            ),
            (
                (
                    "ongoing, abort",
                    ok(&[
                        "P PrepareAbort 101/4",
                        "M abort 101/4 a-0,b-1",
                        "O abort 101",
                        "L CompleteAbort 101/4",
                        "R 101/4",
                    ]),
                ),
                e(&at(Ongoing, 3), 101, 3, false),
            ),
            (
                (
                    "abort with nothing open: a bump, no markers",
                    ok(&["P PrepareAbort 101/4", "L CompleteAbort 101/4", "R 101/4"]),
                ),
                e(&at(Empty, 3), 101, 3, false),
            ),
            (
                (
                    "commit ahead of its first record: retried",
                    Err(CoordError::ConcurrentTransactions),
                ),
                e(&at(Empty, 3), 101, 3, true),
            ),
            (
                (
                    "commit with nothing open past the timeout",
                    Err(CoordError::InvalidTxnState),
                ),
                e(&idle(at(CompleteCommit, 3)), 101, 3, true),
            ),
            (
                ("retry of a completed commit", ok(&["R 101/3"])),
                e(&at(CompleteCommit, 3), 101, 2, true),
            ),
            (
                (
                    "commit retry racing a timeout abort",
                    Err(CoordError::ProducerFenced),
                ),
                e(&at(CompleteAbort, 3), 101, 2, true),
            ),
            (
                (
                    "retry while prepared",
                    Err(CoordError::ConcurrentTransactions),
                ),
                e(&at(PrepareCommit, 3), 101, 2, true),
            ),
            (
                ("zombie while prepared", Err(CoordError::ProducerFenced)),
                e(&at(PrepareCommit, 3), 101, 1, true),
            ),
            (
                (
                    "zombie on an open transaction",
                    Err(CoordError::ProducerFenced),
                ),
                e(&at(Ongoing, 3), 101, 1, true),
            ),
            (
                (
                    "the last epoch: a new producer id, waited for",
                    ok(&[
                        &format!("P PrepareCommit 101/{}", i16::MAX - 1),
                        &format!("M commit 101/{} a-0,b-1", i16::MAX - 1),
                        "O commit 101",
                        "P CompleteCommit 201/0",
                        "R 201/0",
                    ]),
                ),
                e(&last, 101, i16::MAX - 2, true),
            ),
        ]);
    }

    #[test]
    fn init_and_add_effects() {
        use TxnState::*;
        let i =
            |m: Option<&TxnMeta>, expected| decide_init(m, "t", 1000, expected, 50, &mut fresh());
        let mut retried = at(Empty, 3);
        retried.last_epoch = 2;
        check(vec![
            (
                ("a new id", ok(&["P Empty 201/0", "R 201/0"])),
                i(None, None),
            ),
            (
                (
                    "a known id: the epoch is bumped",
                    ok(&["P Empty 101/4", "R 101/4"]),
                ),
                i(Some(&at(Empty, 3)), None),
            ),
            (
                (
                    "an open transaction is fenced and aborted first",
                    ok(&[
                        "P PrepareAbort 101/4",
                        "M abort 101/4 a-0,b-1",
                        "O abort 101",
                        "L CompleteAbort 101/4",
                        "R 101/4",
                    ]),
                ),
                i(Some(&at(Ongoing, 3)), None),
            ),
            (
                (
                    "KIP-360 retry: answered again, nothing written",
                    ok(&["R 101/3"]),
                ),
                i(Some(&retried), Some((101, 2))),
            ),
            (
                ("KIP-360 from a zombie", Err(CoordError::ProducerFenced)),
                i(Some(&at(Empty, 3)), Some((101, 1))),
            ),
            (
                (
                    "while markers are written",
                    Err(CoordError::ConcurrentTransactions),
                ),
                i(Some(&at(PrepareAbort, 3)), None),
            ),
        ]);
        let a = |m: &TxnMeta, epoch, parts: &[(String, i32)]| {
            decide_add_partitions(Some(m), 101, epoch, parts, 50)
        };
        check(vec![
            (
                ("begins a transaction", ok(&["P Ongoing 101/3", "R 101/3"])),
                a(&at(CompleteCommit, 3), 3, &[tp("a", 0)]),
            ),
            (
                (
                    "a partition already in it: nothing written",
                    ok(&["R 101/3"]),
                ),
                a(&at(Ongoing, 3), 3, &[tp("a", 0)]),
            ),
            (
                ("a new partition", ok(&["P Ongoing 101/3", "R 101/3"])),
                a(&at(Ongoing, 3), 3, &[tp("c", 0)]),
            ),
            (
                ("fenced", Err(CoordError::ProducerFenced)),
                a(&at(Ongoing, 3), 2, &[tp("c", 0)]),
            ),
            (
                (
                    "while a commit is written",
                    Err(CoordError::ConcurrentTransactions),
                ),
                a(&at(PrepareCommit, 3), 3, &[tp("c", 0)]),
            ),
        ]);
    }

    #[test]
    fn timeout_admin_and_recovery_effects() {
        use TxnState::*;
        let abort = [
            "P PrepareAbort 101/4",
            "M abort 101/4 a-0,b-1",
            "O abort 101",
            "L CompleteAbort 101/4",
        ];
        let t = |m: &TxnMeta, now| Ok(decide_timeout(m, now, OnTimeout::Abort, &mut fresh()));
        check(vec![
            (("not yet expired", ok(&[])), t(&at(Ongoing, 3), 1010)),
            (
                ("expired: fenced and aborted, nobody to answer", ok(&abort)),
                t(&at(Ongoing, 3), 1011),
            ),
            (("nothing open", ok(&[])), t(&at(CompleteCommit, 3), 99_999)),
            (
                ("being committed", ok(&[])),
                t(&at(PrepareCommit, 3), 99_999),
            ),
        ]);
        let adm = |m: &TxnMeta| Ok(decide_admin_abort(m, 50, &mut fresh()));
        check(vec![
            (
                ("admin abort of an open transaction", ok(&abort)),
                adm(&at(Ongoing, 3)),
            ),
            (
                ("admin abort with nothing open", ok(&[])),
                adm(&at(Empty, 3)),
            ),
        ]);
        let r = |m: &TxnMeta| Ok(decide_recovery(m, 50));
        check(vec![
            (
                (
                    "recovery of a prepared commit: markers, then a waited Complete",
                    ok(&[
                        "M commit 101/3 a-0,b-1",
                        "O commit 101",
                        "P CompleteCommit 101/3",
                    ]),
                ),
                r(&at(PrepareCommit, 3)),
            ),
            (
                (
                    "recovery of a prepared abort",
                    ok(&[
                        "M abort 101/3 a-0,b-1",
                        "O abort 101",
                        "P CompleteAbort 101/3",
                    ]),
                ),
                r(&at(PrepareAbort, 3)),
            ),
            (
                ("nothing to recover when open", ok(&[])),
                r(&at(Ongoing, 3)),
            ),
            (
                ("nothing to recover when complete", ok(&[])),
                r(&at(CompleteAbort, 3)),
            ),
        ]);
    }

    proptest::proptest! {
        /// Whatever is decided, the order the crash tests rely on holds: a
        /// marker only after its Prepare is durable, the answer last, and
        /// only a Complete that recovery can re-create is left unwaited.
        #[test]
        fn effect_order_invariants(
            state in 0usize..6, epoch in 0i16..i16::MAX, req_epoch_delta in -2i16..2,
            commit: bool, tv2: bool, op in 0usize..4,
        ) {
            let states = [TxnState::Empty, TxnState::Ongoing, TxnState::PrepareCommit,
                TxnState::PrepareAbort, TxnState::CompleteCommit, TxnState::CompleteAbort];
            let m = at(states[state], epoch);
            let req = epoch.saturating_add(req_epoch_delta).max(0);
            let effects = match op {
                0 => decide_end(Some(&m), 101, req, commit, tv2, 5000, &mut fresh()).unwrap_or_default(),
                1 => decide_init(Some(&m), "t", 1000, Some((101, req)), 5000, &mut fresh()).unwrap_or_default(),
                2 => decide_timeout(&m, 5000, OnTimeout::Abort, &mut fresh()),
                _ => decide_recovery(&m, 5000),
            };
            let prepared_at = effects.iter().position(|e| matches!(e,
                Effect::Persist(p) if matches!(p.state, TxnState::PrepareCommit | TxnState::PrepareAbort)));
            for (i, e) in effects.iter().enumerate() {
                match e {
                    Effect::WriteMarkers { epoch: me, .. } => {
                        // Recovery's Prepare is already durable.
                        proptest::prop_assert!(op == 3 || prepared_at.is_some_and(|p| p < i));
                        proptest::prop_assert!(*me >= m.epoch);
                    }
                    Effect::CompleteOffsets { .. } => {
                        proptest::prop_assert!(op == 3 || prepared_at.is_some_and(|p| p < i));
                    }
                    Effect::PersistLater(d) => {
                        proptest::prop_assert!(matches!(d.state, TxnState::CompleteCommit | TxnState::CompleteAbort));
                        proptest::prop_assert_eq!(d.producer_id, m.producer_id);
                    }
                    Effect::Reply { .. } => proptest::prop_assert_eq!(i, effects.len() - 1),
                    Effect::Persist(p) => {
                        proptest::prop_assert!(p.producer_id != m.producer_id || p.epoch >= m.epoch);
                    }
                }
            }
        }
    }
}
