//! Simulation of the real transaction coordinator: the broker's own driver
//! (`coordinators::txn_service::TxnService`, the code every InitProducerId,
//! AddPartitionsToTxn, EndTxn, timeout and restart runs through) over
//! in-memory storage behind the same traits the broker's storage
//! implements (`StateLog` for the coordinator's log, `PartitionStore` for
//! the partitions), driven by producers that send what a Kafka client
//! sends.
//!
//! `simulation.rs` checks the coordinator's decisions with a driver of its
//! own; this one checks the driver the broker runs, with its locks, its
//! effect runner, its marker retries, its timeout reaper and its recovery.
//!
//! The storage keeps what was synced and loses the rest when the machine
//! crashes: a crash stops every task (the runtime is dropped with them),
//! truncates each partition to its synced part, keeps only the synced
//! records of the coordinator's log, builds a new coordinator from them
//! (`TxnService::replay`) and lets it recover before clients come back.
//! Everything runs on one thread: a step of the schedule lets every task
//! run until it waits (on a sync, a lock, or its next turn), so no step
//! depends on the wall clock but the 1 ms timeouts, which the reaper's
//! steps wait out.
//!
//! A seeded schedule interleaves: producers per transactional id (a new
//! instance now and then, so older ones write on as zombies until fenced),
//! lost replies answered by retries of the same request (produce retries
//! keep their sequence number), transactions with a 1 ms timeout and the
//! reaper, syncs of each partition and of the coordinator's log, and
//! crashes. Checked after every step: what a read_committed reader sees of
//! a partition only grows, across crashes. Checked once everything is
//! closed:
//!
//! * no partition has an open transaction (LSO = high watermark), no
//!   transactional id is left mid-transaction, no offsets are pending;
//! * no record is in a log twice (idempotent retries, across crashes);
//! * a transaction is all or nothing: its records and its offsets are all
//!   visible or none is;
//! * a commit a client was told of is visible, an abort never is.
//!
//! Two planted faults must each be caught, or the test fails: a
//! coordinator log and a partition that acknowledge a write before it is
//! synced.
//!
//! Transactional offsets go through the broker's group coordinator
//! (`coordinators::groups::Groups`: TxnOffsetCommit with its verification
//! under the groups' lock, completion at the transaction's end) over an
//! in-memory offsets log that a crash cuts back to its synced part too.
//!
//! Not modelled: consumer group membership, cut-overs, and cluster mode's driver (its decisions are the
//! same `decide_*`, its effects one PostgreSQL transaction; `tests/cluster.rs`
//! runs it against a real PostgreSQL). The driver walks hash maps, so a
//! replayed seed (`SIM_SEED`) takes the same path only as far as their
//! order allows; the invariants do not depend on it.
//!
//! `SIM_DRIVER_SEEDS=n` sets how many schedules run (default 300).

mod sim_support;
use sim_support::Rng;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use oncelog_broker::backend::local::internal_log::{
    CompactPolicy, OnDurable, Pending, PersistError, Record,
};
use oncelog_broker::backend::local::partition::{
    AppendError, Appended, Marker, MarkerError, OffsetLookupError, PartitionStatus, Read,
    SyncError, SyncReply,
};
use oncelog_broker::backend::storage::{PartitionStore, StateLog};
use oncelog_broker::coordinators::groups::{GroupSettings, Groups};
use oncelog_broker::coordinators::txn_service::{EndRequest, TxnError, TxnRuntime, TxnService};
use oncelog_broker::error::ErrorCode;
use oncelog_broker::error::{Gate, TopicError};
use oncelog_broker::machines::group::OffsetMeta;
use oncelog_broker::machines::names::OFFSETS_TOPIC;
use oncelog_broker::machines::producer_state::{
    MarkerReject, ProducerBatch, ProducerEntry, ProducerState, Verdict,
};
use oncelog_broker::machines::txn_coordinator::{CoordError, TwoPhase, TxnState, VerifyError};
use oncelog_broker::observe::txn_history::Requester;
use oncelog_log::LogError;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Which storage acknowledges before it syncs (a planted fault).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Lie {
    Honest,
    LogAcksEarly,
    PartitionAcksEarly,
}

// ---------------------------------------------------------------------------
// The coordinator's log.

type LogReply = oneshot::Sender<Result<(), Arc<LogError>>>;

struct Queued {
    records: Vec<Record>,
    on_durable: Option<OnDurable>,
    reply: Option<LogReply>,
}

#[derive(Default)]
struct LogInner {
    durable: Vec<Record>,
    queued: Vec<Queued>,
}

/// A state log in memory: a change is durable (its reply sent, its
/// callback run) when the schedule syncs the log, in order.
#[derive(Default)]
struct MemLog {
    inner: Mutex<LogInner>,
    lie: bool,
}

impl MemLog {
    fn sync(&self) {
        let queued = std::mem::take(&mut lock(&self.inner).queued);
        for q in queued {
            lock(&self.inner).durable.extend(q.records);
            if let Some(f) = q.on_durable {
                f();
            }
            if let Some(r) = q.reply {
                let _ = r.send(Ok(()));
            }
        }
    }

    /// The machine stops: what was not synced is gone.
    fn crash(&self) -> Vec<Record> {
        let mut g = lock(&self.inner);
        g.queued.clear();
        g.durable.clone()
    }
}

impl StateLog for MemLog {
    fn submit(
        &self,
        records: Vec<Record>,
        on_durable: Option<OnDurable>,
    ) -> Result<Pending, PersistError> {
        let (tx, rx) = oneshot::channel();
        let mut q = Queued {
            records,
            on_durable,
            reply: Some(tx),
        };
        if self.lie {
            if let Some(f) = q.on_durable.take() {
                f();
            }
            if let Some(r) = q.reply.take() {
                let _ = r.send(Ok(()));
            }
        }
        lock(&self.inner).queued.push(q);
        Ok(Pending::from_reply(
            rx,
            PathBuf::from("simulated __transaction_state"),
        ))
    }
}

// ---------------------------------------------------------------------------
// The partitions.

#[derive(Debug, Clone)]
enum Entry {
    Data {
        pid: i64,
        epoch: i16,
        seq: i32,
        value: u64,
    },
    Marker {
        pid: i64,
        epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    },
}

#[derive(Default)]
struct PartInner {
    entries: Vec<Entry>,
    synced: usize,
    state: ProducerState,
    waiters: Vec<oneshot::Sender<Result<(), SyncError>>>,
}

/// One partition of one-record batches and markers, with the producer
/// state derived from it by the broker's own rules (`ProducerState`).
struct MemPart {
    topic: String,
    index: i32,
    lie: bool,
    inner: Mutex<PartInner>,
}

fn batch(pid: i64, epoch: i16, seq: i32) -> ProducerBatch {
    ProducerBatch {
        producer_id: pid,
        epoch,
        first_seq: seq,
        last_seq: seq,
        transactional: true,
        max_timestamp: 0,
    }
}

impl MemPart {
    fn new(topic: String, index: i32, lie: bool) -> Self {
        Self {
            topic,
            index,
            lie,
            inner: Mutex::default(),
        }
    }

    fn apply(state: &mut ProducerState, e: &Entry, offset: i64) {
        match *e {
            Entry::Data {
                pid, epoch, seq, ..
            } => state.apply_batch(&batch(pid, epoch, seq), offset, offset),
            Entry::Marker {
                pid,
                epoch,
                commit,
                coordinator_epoch,
            } => {
                state.apply_marker(pid, epoch, coordinator_epoch, offset, !commit, 0);
            }
        }
    }

    fn push(&self, g: &mut PartInner, e: Entry) -> Option<SyncReply> {
        let offset = g.entries.len();
        Self::apply(&mut g.state, &e, offset as i64);
        g.entries.push(e);
        Some(self.reply(g, offset + 1))
    }

    /// Group commit's answer for a write ending at `end`.
    fn reply(&self, g: &mut PartInner, end: usize) -> SyncReply {
        let (tx, rx) = oneshot::channel();
        if self.lie || g.synced >= end {
            let _ = tx.send(Ok(()));
        } else {
            g.waiters.push(tx);
        }
        rx
    }

    fn sync(&self) {
        let mut g = lock(&self.inner);
        g.synced = g.entries.len();
        for tx in g.waiters.drain(..) {
            let _ = tx.send(Ok(()));
        }
    }

    fn crash(&self) {
        let mut g = lock(&self.inner);
        let synced = g.synced;
        g.entries.truncate(synced);
        g.waiters.clear();
        let mut state = ProducerState::new();
        for (o, e) in g.entries.iter().enumerate() {
            Self::apply(&mut state, e, o as i64);
        }
        g.state = state;
    }

    /// What a read_committed fetch returns: data below the LSO outside
    /// every aborted transaction's range.
    fn read_committed(&self) -> Vec<u64> {
        let g = lock(&self.inner);
        sim_support::read_committed(&g.entries, &g.state, g.synced, |e| match e {
            Entry::Data { pid, value, .. } => Some((*pid, *value)),
            Entry::Marker { .. } => None,
        })
    }

    fn values(&self) -> Vec<u64> {
        lock(&self.inner)
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::Data { value, .. } => Some(*value),
                Entry::Marker { .. } => None,
            })
            .collect()
    }
}

impl PartitionStore for MemPart {
    fn topic(&self) -> &str {
        &self.topic
    }
    fn index(&self) -> i32 {
        self.index
    }
    fn status(&self) -> PartitionStatus {
        let g = lock(&self.inner);
        PartitionStatus {
            high_watermark: g.synced as i64,
            last_stable_offset: g.state.last_stable_offset(g.synced as i64),
            log_start_offset: 0,
            size_bytes: g.entries.len() as u64,
        }
    }
    fn log_start_offset(&self) -> i64 {
        0
    }
    fn append(
        &self,
        data: &mut [u8],
        producer: Option<&ProducerBatch>,
        verify: &dyn Fn(&ProducerBatch) -> Result<(), VerifyError>,
    ) -> Result<Appended, AppendError> {
        let value = u64::from_le_bytes(data[..8].try_into().expect("8-byte record"));
        let pb = producer.expect("the simulation's batches are transactional");
        let mut g = lock(&self.inner);
        let hw = g.synced as i64;
        g.state.settle(hw);
        match g.state.check(pb)? {
            Verdict::Duplicate {
                first_offset,
                last_offset,
            } => {
                let durable = Some(self.reply(&mut g, last_offset as usize + 1));
                return Ok(Appended {
                    base_offset: first_offset,
                    duplicate: true,
                    durable,
                });
            }
            Verdict::Append => verify(pb).map_err(AppendError::Unverified)?,
        }
        let base_offset = g.entries.len() as i64;
        let durable = self.push(
            &mut g,
            Entry::Data {
                pid: pb.producer_id,
                epoch: pb.epoch,
                seq: pb.first_seq,
                value,
            },
        );
        Ok(Appended {
            base_offset,
            duplicate: false,
            durable,
        })
    }
    fn write_marker(&self, m: Marker) -> Result<Option<SyncReply>, MarkerError> {
        let mut g = lock(&self.inner);
        let hw = g.synced as i64;
        g.state.settle(hw);
        g.state
            .check_marker(m.producer_id, m.epoch, m.coordinator_epoch)?;
        let e = Entry::Marker {
            pid: m.producer_id,
            epoch: m.epoch,
            commit: m.commit,
            coordinator_epoch: m.coordinator_epoch,
        };
        Ok(self.push(&mut g, e))
    }
    fn read(&self, _offset: i64, _max: usize, _committed: bool, _min_one: bool) -> Read {
        let s = self.status();
        Read {
            high_watermark: s.high_watermark,
            last_stable_offset: s.last_stable_offset,
            log_start_offset: 0,
            aborted: Vec::new(),
            data: Ok(Vec::new()),
        }
    }
    fn offset_for(
        &self,
        _spec: i64,
        _committed: bool,
    ) -> Result<Option<(i64, i64)>, OffsetLookupError> {
        Ok(None)
    }
    fn open_transactions(&self) -> Vec<(i64, i64, i16)> {
        lock(&self.inner)
            .state
            .producers()
            .filter_map(|(pid, e)| e.current_txn_first_offset.map(|f| (f, *pid, e.epoch)))
            .collect()
    }
    fn producers(&self) -> Vec<(i64, ProducerEntry)> {
        lock(&self.inner)
            .state
            .producers()
            .map(|(pid, e)| (*pid, e.clone()))
            .collect()
    }
    fn open_transaction_of(
        &self,
        pid: i64,
        epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<bool, MarkerReject> {
        let g = lock(&self.inner);
        match g.state.get(pid) {
            Some(e) if e.current_txn_first_offset.is_some() => {
                g.state.check_marker(pid, epoch, coordinator_epoch)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

// ---------------------------------------------------------------------------
// The group coordinator's side of transactional offsets, and the node.

/// What the driver reaches of the broker (`TxnRuntime`).
struct Node {
    txn: TxnService,
    parts: Vec<Arc<MemPart>>,
    groups: Groups,
    next_pid: Arc<AtomicI64>,
}

impl TxnRuntime for Node {
    fn txn(&self) -> &TxnService {
        &self.txn
    }
    fn partition(&self, topic: &str, index: i32) -> Option<Arc<dyn PartitionStore>> {
        self.parts
            .iter()
            .find(|p| p.topic == topic && p.index == index)
            .map(|p| p.clone() as Arc<dyn PartitionStore>)
    }
    fn complete_offsets(
        &self,
        producer_id: i64,
        commit: bool,
    ) -> impl std::future::Future<Output = Result<(), PersistError>> + Send {
        self.groups.complete_txn(producer_id, commit)
    }
    fn next_producer_id(&self) -> Result<i64, TopicError> {
        Ok(self.next_pid.fetch_add(1, Ordering::Relaxed))
    }
    fn record_commit(&self, _topic: &str, _id: &str, _now_ms: i64) {}
    fn commit_gate(&self, _topic: &str, _id: &str) -> Result<(), Gate> {
        Ok(())
    }
    fn protects(&self, _topic: &str, _id: &str) -> bool {
        false
    }
}

// ---------------------------------------------------------------------------
// Producers.

/// What the schedule learned, kept across crashes.
#[derive(Default)]
struct Book {
    next_value: u64,
    next_tag: u32,
    /// Each record's transaction (a client's tag for it).
    tag_of: HashMap<u64, u32>,
    /// Records whose produce was acknowledged, per transaction.
    acked: BTreeMap<u32, Vec<(usize, u64)>>,
    /// Transactions whose offsets were acknowledged.
    offsets_acked: BTreeSet<u32>,
    /// EndTxn answered: true = committed, false = aborted.
    outcome: BTreeMap<u32, bool>,
    /// How often each thing the schedule is about happened.
    seen: Counts,
    trace: Vec<String>,
}

#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    crashes: usize,
    fenced: usize,
    lost_replies: usize,
    duplicates: usize,
    timeouts: usize,
    offsets: usize,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.crashes += o.crashes;
        self.fenced += o.fenced;
        self.lost_replies += o.lost_replies;
        self.duplicates += o.duplicates;
        self.timeouts += o.timeouts;
        self.offsets += o.offsets;
    }
}

impl Book {
    fn note(&mut self, s: String) {
        self.trace.push(s);
    }
}

#[derive(Debug, Clone)]
enum Req {
    Init,
    Add { tag: u32, parts: Vec<usize> },
    Produce { part: usize, seq: i32, value: u64 },
    Offsets,
    End(bool),
}

/// A transactional producer instance.
struct Client {
    id: String,
    name: String,
    timeout_ms: i32,
    rng: Rng,
    ident: Option<(i64, i16)>,
    seqs: HashMap<usize, i32>,
    txn: Option<(u32, BTreeSet<usize>)>,
    offsets_sent: bool,
    /// The request whose answer has not come (sent again until it does).
    inflight: Option<Req>,
    /// Gave up after a fence (its application stopped).
    stopped: bool,
}

impl Client {
    fn new(id: &str, n: usize, rng: &mut Rng) -> Self {
        Self {
            id: id.to_string(),
            name: format!("{id}#{n}"),
            timeout_ms: if rng.chance(30) { 1 } else { 60_000 },
            rng: Rng(rng.next()),
            ident: None,
            seqs: HashMap::new(),
            txn: None,
            offsets_sent: false,
            inflight: None,
            stopped: false,
        }
    }

    /// Fenced or refused: the application starts over with a new init
    /// (or, now and then, stops).
    fn reset(&mut self) {
        self.ident = None;
        self.txn = None;
        self.inflight = None;
        self.seqs.clear();
        self.offsets_sent = false;
        if self.rng.chance(30) {
            self.stopped = true;
        }
    }

    fn next_request(&mut self, book: &mut Book, nparts: usize) -> Option<Req> {
        if self.stopped {
            return None;
        }
        if let Some(r) = &self.inflight {
            return Some(r.clone());
        }
        let req = match (&self.ident, &self.txn) {
            (None, _) => Req::Init,
            (Some(_), None) => {
                book.next_tag += 1;
                let mut parts = vec![self.rng.below(nparts)];
                if self.rng.chance(50) {
                    parts.push(self.rng.below(nparts));
                }
                parts.dedup();
                Req::Add {
                    tag: book.next_tag,
                    parts,
                }
            }
            (Some(_), Some((tag, parts))) => {
                let r = self.rng.below(100);
                if r < 50 {
                    let parts: Vec<usize> = parts.iter().copied().collect();
                    let part = parts[self.rng.below(parts.len())];
                    book.next_value += 1;
                    let value = book.next_value;
                    book.tag_of.insert(value, *tag);
                    Req::Produce {
                        part,
                        seq: *self.seqs.get(&part).unwrap_or(&0),
                        value,
                    }
                } else if r < 60 {
                    Req::Add {
                        tag: *tag,
                        parts: vec![self.rng.below(nparts)],
                    }
                } else if r < 68 && !self.offsets_sent {
                    Req::Offsets
                } else if r < 80 {
                    return None;
                } else {
                    Req::End(self.rng.chance(75))
                }
            }
        };
        self.inflight = Some(req.clone());
        Some(req)
    }
}

/// What a request came to.
enum Answer {
    Done,
    /// Not done: send it again (a retriable error, a lost reply).
    Again,
    /// Fenced or refused for good.
    Reset,
}

fn txn_answer(e: &TxnError) -> Answer {
    match e {
        TxnError::Coord(CoordError::ConcurrentTransactions) | TxnError::Persist(_) => Answer::Again,
        _ => Answer::Reset,
    }
}

async fn send(
    node: &Arc<Node>,
    c: &Arc<Mutex<Client>>,
    book: &Arc<Mutex<Book>>,
    req: &Req,
) -> Answer {
    let (id, ident, timeout_ms, tag) = {
        let c = lock(c);
        (
            c.id.clone(),
            c.ident,
            c.timeout_ms,
            c.txn.as_ref().map(|t| t.0),
        )
    };
    let who = Requester::default();
    let txn = node.txn();
    match req {
        Req::Init => {
            match txn
                .init_producer_id(node, &id, timeout_ms, None, TwoPhase::default(), &who)
                .await
            {
                Ok(init) => {
                    let mut c = lock(c);
                    c.ident = Some((init.producer_id, init.epoch));
                    c.seqs.clear();
                    c.txn = None;
                    c.offsets_sent = false;
                    Answer::Done
                }
                Err(e) => txn_answer(&e),
            }
        }
        Req::Add { tag, parts } => {
            let Some((pid, epoch)) = ident else {
                return Answer::Reset;
            };
            let tps: Vec<(String, i32)> = parts
                .iter()
                .map(|&p| (node.parts[p].topic.clone(), node.parts[p].index))
                .collect();
            match txn.add_partitions(&id, pid, epoch, &tps).await {
                Ok(()) => {
                    let mut c = lock(c);
                    let t = c.txn.get_or_insert_with(|| (*tag, BTreeSet::new()));
                    t.1.extend(parts.iter().copied());
                    Answer::Done
                }
                Err(e) => txn_answer(&e),
            }
        }
        Req::Produce { part, seq, value } => {
            let (Some((pid, epoch)), Some(tag)) = (ident, tag) else {
                return Answer::Reset;
            };
            let p = &node.parts[*part];
            let mut data = value.to_le_bytes();
            let verify = |b: &ProducerBatch| txn.verify(b.producer_id, b.epoch, &p.topic, p.index);
            let appended = p.append(&mut data, Some(&batch(pid, epoch, *seq)), &verify);
            match appended {
                Ok(a) => {
                    let durable = match a.durable {
                        Some(rx) => rx.await.unwrap_or(Err(SyncError::Abandoned)),
                        None => Ok(()),
                    };
                    if durable.is_err() {
                        return Answer::Again;
                    }
                    lock(book).seen.duplicates += usize::from(a.duplicate);
                    lock(book)
                        .acked
                        .entry(tag)
                        .or_default()
                        .push((*part, *value));
                    lock(c).seqs.insert(*part, seq + 1);
                    Answer::Done
                }
                Err(_) => Answer::Reset,
            }
        }
        Req::Offsets => {
            let (Some((pid, epoch)), Some(tag)) = (ident, tag) else {
                return Answer::Reset;
            };
            let tps = [(OFFSETS_TOPIC.to_string(), 0)];
            if let Err(e) = txn.add_partitions(&id, pid, epoch, &tps).await {
                return txn_answer(&e);
            }
            // TxnOffsetCommit: one offset per transaction (partition = its
            // tag), held pending until the transaction ends.
            let meta = OffsetMeta {
                offset: i64::from(tag),
                leader_epoch: -1,
                metadata: None,
                commit_ms: 0,
            };
            let offsets = vec![(OFFSET_TOPIC.to_string(), tag as i32, meta)];
            let verify = || match txn.verify(pid, epoch, OFFSETS_TOPIC, 0) {
                Ok(()) => ErrorCode::None,
                Err(_) => ErrorCode::InvalidTxnState,
            };
            match node
                .groups
                .txn_commit(GROUP, pid, -1, "", None, offsets, verify)
                .await
            {
                ErrorCode::None => {
                    lock(book).offsets_acked.insert(tag);
                    lock(c).offsets_sent = true;
                    Answer::Done
                }
                ErrorCode::CoordinatorNotAvailable => Answer::Again,
                _ => Answer::Reset,
            }
        }
        Req::End(commit) => {
            let (Some((pid, epoch)), Some(tag)) = (ident, tag) else {
                return Answer::Reset;
            };
            let end = EndRequest {
                id: &id,
                producer_id: pid,
                epoch,
                commit: *commit,
                tv2: false,
            };
            match txn.end_txn(node, end, &who).await {
                Ok(_) => {
                    lock(book).outcome.insert(tag, *commit);
                    let mut c = lock(c);
                    c.txn = None;
                    c.offsets_sent = false;
                    Answer::Done
                }
                Err(e) => txn_answer(&e),
            }
        }
    }
}

/// A producer's life: requests one after another, each sent again until
/// it is answered; some replies are lost on the way back.
async fn client_loop(node: Arc<Node>, c: Arc<Mutex<Client>>, book: Arc<Mutex<Book>>) {
    loop {
        let req = {
            let mut b = lock(&book);
            lock(&c).next_request(&mut b, node.parts.len())
        };
        if let Some(req) = req {
            let answer = send(&node, &c, &book, &req).await;
            let mut c = lock(&c);
            let lost = c.rng.chance(10);
            let said = match answer {
                Answer::Done if lost => "reply lost",
                Answer::Done => {
                    c.inflight = None;
                    "done"
                }
                Answer::Again => "again",
                Answer::Reset => {
                    c.reset();
                    "reset"
                }
            };
            let line = format!("{} {:?} {req:?}: {said}", c.name, c.ident);
            drop(c);
            let mut b = lock(&book);
            b.seen.lost_replies += usize::from(said == "reply lost");
            b.seen.fenced += usize::from(said == "reset");
            b.note(line);
        } else if lock(&c).stopped {
            return;
        }
        let pause = 1 + lock(&c).rng.below(8);
        for _ in 0..pause {
            tokio::task::yield_now().await;
        }
    }
}

// ---------------------------------------------------------------------------
// The machine and the schedule.

const IDS: usize = 3;
/// The consumer group whose offsets the transactions commit.
const GROUP: &str = "sim-group";
/// The topic those offsets are for (one partition per transaction).
const OFFSET_TOPIC: &str = "consumed";

fn group_settings() -> GroupSettings {
    GroupSettings {
        initial_rebalance_delay: Duration::ZERO,
        min_session_timeout_ms: 6_000,
        max_session_timeout_ms: 300_000,
        offsets_retention_ms: 7 * 24 * 3_600_000,
        compact: CompactPolicy { min_records: 1_000 },
    }
}
const STEPS: usize = 400;
/// How often a step yields to the other tasks (more than a client's pause).
const SETTLE_YIELDS: usize = 16;

/// One run of the broker process: its runtime (every task dies with it)
/// and its coordinator.
struct Life {
    rt: tokio::runtime::Runtime,
    node: Arc<Node>,
}

impl Life {
    fn start(node: Node) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        Self {
            rt,
            node: Arc::new(node),
        }
    }

    /// One step of the schedule: every task runs until it waits.
    fn settle(&self) {
        self.rt.block_on(async {
            for _ in 0..SETTLE_YIELDS {
                tokio::task::yield_now().await;
            }
        });
    }

    fn spawn(&self, c: &Arc<Mutex<Client>>, book: &Arc<Mutex<Book>>) {
        let _guard = self.rt.enter();
        tokio::spawn(client_loop(self.node.clone(), c.clone(), book.clone()));
    }
}

struct Sim {
    rng: Rng,
    parts: Vec<Arc<MemPart>>,
    log: Arc<MemLog>,
    offsets_log: Arc<MemLog>,
    next_pid: Arc<AtomicI64>,
    book: Arc<Mutex<Book>>,
    clients: Vec<Arc<Mutex<Client>>>,
    instances: usize,
    seen: Vec<Vec<u64>>,
}

impl Sim {
    fn new(seed: u64, lie: Lie) -> Self {
        let parts = (0..3)
            .map(|i| {
                Arc::new(MemPart::new(
                    format!("t{}", i / 2),
                    i % 2,
                    lie == Lie::PartitionAcksEarly,
                ))
            })
            .collect();
        Self {
            rng: Rng(seed),
            parts,
            log: Arc::new(MemLog {
                lie: lie == Lie::LogAcksEarly,
                ..Default::default()
            }),
            offsets_log: Arc::default(),
            next_pid: Arc::new(AtomicI64::new(1000)),
            book: Arc::default(),
            clients: Vec::new(),
            instances: 0,
            seen: vec![Vec::new(); 3],
        }
    }

    /// A process's coordinators, from what their logs hold.
    fn node(&self, txn_records: Vec<Record>, offsets_records: Vec<Record>) -> Result<Node, String> {
        let txn = TxnService::replay(self.log.clone(), txn_records)
            .map_err(|e| format!("replay of the transaction log: {e}"))?;
        let groups = Groups::replay(self.offsets_log.clone(), offsets_records, group_settings())
            .map_err(|e| format!("replay of the offsets log: {e}"))?;
        Ok(Node {
            txn,
            parts: self.parts.clone(),
            groups,
            next_pid: self.next_pid.clone(),
        })
    }

    fn sync_all(&self) {
        for p in &self.parts {
            p.sync();
        }
        self.log.sync();
        self.offsets_log.sync();
    }

    fn new_client(&mut self, life: &Life, id: usize) {
        self.instances += 1;
        let c = Client::new(&format!("tx-{id}"), self.instances, &mut self.rng);
        let c = Arc::new(Mutex::new(c));
        life.spawn(&c, &self.book);
        self.clients.push(c);
    }

    /// The machine stops at once; a new process replays the synced log,
    /// recovers (syncing as it goes) and clients come back.
    fn crash(&mut self, life: Life) -> Result<Life, String> {
        drop(life);
        lock(&self.book).seen.crashes += 1;
        let records = self.log.crash();
        let offsets = self.offsets_log.crash();
        for p in &self.parts {
            p.crash();
        }
        let life = Life::start(self.node(records, offsets)?);
        let recovery = {
            let _guard = life.rt.enter();
            let node = life.node.clone();
            tokio::spawn(async move { node.txn().recover(&node).await })
        };
        for _ in 0..1000 {
            if recovery.is_finished() {
                break;
            }
            life.settle();
            self.sync_all();
        }
        if !recovery.is_finished() {
            return Err("recovery after a crash never finished".into());
        }
        for c in &self.clients {
            if !lock(c).stopped {
                life.spawn(c, &self.book);
            }
        }
        Ok(life)
    }

    /// What read_committed readers see only grows.
    fn check_growth(&mut self) -> Result<(), String> {
        for (i, p) in self.parts.iter().enumerate() {
            let now = p.read_committed();
            let before = &self.seen[i];
            if now.len() < before.len() || now[..before.len()] != before[..] {
                return Err(format!(
                    "partition {i}: read_committed went from {before:?} to {now:?}"
                ));
            }
            self.seen[i] = now;
        }
        Ok(())
    }

    fn run(&mut self) -> Result<(), String> {
        let crash_per_mille = 2 + self.rng.below(8);
        let mut life = Life::start(self.node(Vec::new(), Vec::new())?);
        for id in 0..IDS {
            self.new_client(&life, id);
        }
        for step in 0..STEPS {
            let r = self.rng.below(1000);
            let what = if r < crash_per_mille {
                life = self.crash(life)?;
                "crash".to_string()
            } else if r < 380 {
                let i = self.rng.below(self.parts.len());
                self.parts[i].sync();
                format!("sync partition {i}")
            } else if r < 520 {
                self.log.sync();
                "sync the transaction log".into()
            } else if r < 600 {
                self.offsets_log.sync();
                "sync the offsets log".into()
            } else if r < 640 {
                // Past every 1 ms timeout, never near the others.
                std::thread::sleep(Duration::from_millis(2));
                let _guard = life.rt.enter();
                life.node.txn().abort_timed_out(&life.node);
                lock(&self.book).seen.timeouts += 1;
                "timeout reaper".into()
            } else if r < 665 {
                let id = self.rng.below(IDS);
                self.new_client(&life, id);
                format!("a new producer for tx-{id}")
            } else {
                String::new()
            };
            if !what.is_empty() {
                lock(&self.book).note(format!("-- step {step}: {what}"));
            }
            life.settle();
            self.check_growth()?;
        }
        self.finish(life)
    }

    /// Every producer stops; a new producer per id takes the id over
    /// (aborting what the old ones left open), everything is synced, and
    /// the end state is checked.
    fn finish(&mut self, life: Life) -> Result<(), String> {
        for c in &self.clients {
            lock(c).stopped = true;
        }
        for _ in 0..50 {
            life.settle();
            self.sync_all();
        }
        let mut closers = Vec::new();
        for id in 0..IDS {
            let node = life.node.clone();
            let _guard = life.rt.enter();
            closers.push(tokio::spawn(async move {
                let id = format!("tx-{id}");
                for _ in 0..100 {
                    let init = node
                        .txn()
                        .init_producer_id(
                            &node,
                            &id,
                            60_000,
                            None,
                            TwoPhase::default(),
                            &Requester::default(),
                        )
                        .await;
                    match init {
                        Ok(_) => return Ok(()),
                        Err(e) if matches!(txn_answer(&e), Answer::Again) => {
                            tokio::task::yield_now().await
                        }
                        Err(e) => return Err(format!("closing {id}: {e}")),
                    }
                }
                Err(format!("closing {id}: still busy"))
            }));
        }
        for _ in 0..5000 {
            if closers.iter().all(|h| h.is_finished()) {
                break;
            }
            life.settle();
            self.sync_all();
        }
        for h in closers {
            if !h.is_finished() {
                return Err("a transactional id could not be taken over at the end".into());
            }
            life.rt.block_on(h).map_err(|e| format!("closer: {e}"))??;
        }
        for _ in 0..20 {
            life.settle();
            self.sync_all();
        }
        self.check_growth()?;
        let groups = &life.node.groups;
        let (states, fetched, pending) = life.rt.block_on(async {
            (
                life.node.txn().list().await,
                groups.fetch_offsets(GROUP, None, false).await,
                groups.pending_offsets(GROUP).await,
            )
        });
        if !pending.is_empty() {
            return Err(format!("offsets left pending: {pending:?}"));
        }
        let committed = fetched
            .iter()
            .filter(|f| f.offset >= 0)
            .map(|f| f.partition as u32)
            .collect();
        self.check_end(&states, &committed)
    }

    fn check_end(
        &self,
        states: &[oncelog_broker::machines::txn_coordinator::TxnMeta],
        committed: &BTreeSet<u32>,
    ) -> Result<(), String> {
        for m in states {
            if !matches!(
                m.state,
                TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
            ) {
                return Err(format!("{} is left {:?}", m.transactional_id, m.state));
            }
        }
        for (i, p) in self.parts.iter().enumerate() {
            let s = p.status();
            if s.last_stable_offset != s.high_watermark {
                return Err(format!(
                    "partition {i} hangs: LSO {} < high watermark {} (open: {:?})",
                    s.last_stable_offset,
                    s.high_watermark,
                    p.open_transactions()
                ));
            }
        }
        let book = lock(&self.book);
        let mut logged: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
        let mut visible: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
        let mut once = BTreeSet::new();
        for p in &self.parts {
            for v in p.values() {
                if !once.insert(v) {
                    return Err(format!("record {v} is in the logs twice"));
                }
                logged.entry(book.tag_of[&v]).or_default().insert(v);
            }
            for v in p.read_committed() {
                visible.entry(book.tag_of[&v]).or_default().insert(v);
            }
        }
        for (tag, all) in &logged {
            let seen = visible.get(tag);
            if seen.is_some_and(|s| s != all) {
                return Err(format!(
                    "transaction {tag} is half visible: {seen:?} of {all:?}"
                ));
            }
            let data_visible = seen.is_some();
            let offsets_committed = committed.contains(tag);
            if book.offsets_acked.contains(tag) && data_visible != offsets_committed {
                return Err(format!(
                    "transaction {tag}: records visible {data_visible}, offsets committed {offsets_committed}"
                ));
            }
        }
        for (tag, commit) in &book.outcome {
            let acked = book.acked.get(tag).map_or(&[][..], |v| &v[..]);
            let seen = visible.get(tag);
            if *commit {
                for (part, v) in acked {
                    if !seen.is_some_and(|s| s.contains(v)) {
                        return Err(format!(
                            "transaction {tag} was committed, its record {v} on partition {part} is not visible"
                        ));
                    }
                }
                if book.offsets_acked.contains(tag) && !committed.contains(tag) {
                    return Err(format!(
                        "transaction {tag} was committed, its offsets were not"
                    ));
                }
            } else {
                if seen.is_some() {
                    return Err(format!(
                        "transaction {tag} was aborted, yet {seen:?} are visible"
                    ));
                }
                if committed.contains(tag) {
                    return Err(format!(
                        "transaction {tag} was aborted, its offsets committed"
                    ));
                }
            }
        }
        Ok(())
    }
}

type Ran = (usize, usize, Counts);

fn run_seed(seed: u64, lie: Lie) -> Result<Ran, (String, Vec<String>)> {
    let mut sim = Sim::new(seed, lie);
    match sim.run() {
        Ok(()) => {
            let book = lock(&sim.book);
            let commits = book.outcome.values().filter(|c| **c).count();
            let mut seen = book.seen;
            seen.offsets = book.offsets_acked.len();
            Ok((commits, book.outcome.len() - commits, seen))
        }
        Err(e) => Err((e, lock(&sim.book).trace.clone())),
    }
}

#[test]
fn the_real_driver_keeps_exactly_once_through_crashes_and_zombies() {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        let seed: u64 = seed.parse().expect("SIM_SEED is a number");
        match run_seed(seed, Lie::Honest) {
            Ok((c, a, n)) => println!("seed {seed}: ok, {c} commits, {a} aborts, {n:?}"),
            Err((e, trace)) => {
                for l in &trace {
                    println!("{l}");
                }
                panic!("seed {seed}: {e}");
            }
        }
        return;
    }
    let seeds: u64 = std::env::var("SIM_DRIVER_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let (mut commits, mut aborts, mut seen) = (0, 0, Counts::default());
    for seed in 0..seeds {
        match run_seed(seed, Lie::Honest) {
            Ok((c, a, n)) => {
                commits += c;
                aborts += a;
                seen.add(n);
            }
            Err((e, trace)) => {
                let tail = trace.len().saturating_sub(60);
                for l in &trace[tail..] {
                    eprintln!("{l}");
                }
                panic!("seed {seed}: {e} (SIM_SEED={seed} prints the whole trace)");
            }
        }
    }
    println!(
        "{seeds} schedules: {commits} acknowledged commits, {aborts} acknowledged aborts, {seen:?}"
    );
    assert!(
        commits > seeds as usize,
        "the schedules commit too little to test anything"
    );
    assert!(aborts > 0, "no schedule aborted a transaction");
    if seeds >= 100 {
        let Counts {
            crashes,
            fenced,
            lost_replies,
            duplicates,
            timeouts,
            offsets,
        } = seen;
        let all = [crashes, fenced, lost_replies, duplicates, timeouts, offsets];
        assert!(
            all.iter().all(|n| *n > 0),
            "a fault the schedule is about never happened: {seen:?}"
        );
    }
}

#[test]
fn storage_that_acknowledges_before_syncing_is_caught() {
    for lie in [Lie::LogAcksEarly, Lie::PartitionAcksEarly] {
        let found = (0..400).find_map(|seed| run_seed(seed, lie).err().map(|e| (seed, e.0)));
        match found {
            Some((seed, e)) => println!("{lie:?}: caught at seed {seed}: {e}"),
            None => panic!("{lie:?}: 400 schedules found nothing"),
        }
    }
}
