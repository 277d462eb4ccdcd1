//! Deterministic simulation of exactly-once: the transaction coordinator's
//! decisions (`txn_coordinator::decide_*`, the effect lists the broker's
//! driver runs) and the partitions' producer state machine
//! (`producer_state`), over an in-memory storage that loses every write not
//! yet synced when the "machine" crashes, and a simulated clock.
//!
//! A seeded schedule interleaves transactional producers (several instances
//! per transactional id, so zombies write on), effect steps of the
//! coordinator, syncs, lost replies with idempotent retries, timeouts, and
//! crashes with recovery. Invariants are checked after every step and once
//! everything has settled:
//!
//! * what a read_committed reader sees of a partition only ever grows (no
//!   record appears below one already seen, none disappears, across crashes);
//! * an id's epoch never goes back for the same producer id;
//! * a transaction is all or nothing across its partitions and its offsets;
//! * a commit the client was told of is visible, an abort never is;
//! * no record is in the log twice (idempotent retries across crashes);
//! * committed offsets come only from committed transactions;
//! * in the end nothing hangs: LSO = high watermark, no pending offsets.
//!
//! `SIM_SEEDS=n` sets how many schedules run (default 3000); a failure
//! prints its seed and the step trace, and `SIM_SEED=<seed>` runs that one
//! schedule again, printing its trace.

mod sim_support;
use sim_support::Rng;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use oncelog_broker::coordinators::groups::OFFSETS_TOPIC;
use oncelog_broker::machines::producer_state::{ProducerBatch, ProducerState, Verdict};
use oncelog_broker::machines::txn_coordinator::{
    self as tc, update_view, verify_write, CoordError, Effect, ProducerView, TxnMeta, TxnState,
};

type Tp = (String, i32);

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
    },
}

/// One partition: a log of one-record batches and markers, the part of it
/// that is synced (the high watermark), and the producer state derived
/// from it exactly as the broker derives it.
struct Part {
    tp: Tp,
    entries: Vec<Entry>,
    synced: usize,
    state: ProducerState,
}

impl Part {
    fn batch(pid: i64, epoch: i16, seq: i32, now: i64) -> ProducerBatch {
        ProducerBatch {
            producer_id: pid,
            epoch,
            first_seq: seq,
            last_seq: seq,
            transactional: true,
            max_timestamp: now,
        }
    }

    fn apply(state: &mut ProducerState, e: &Entry, offset: i64) {
        match *e {
            Entry::Data {
                pid, epoch, seq, ..
            } => state.apply_batch(&Self::batch(pid, epoch, seq, 0), offset, offset),
            Entry::Marker { pid, epoch, commit } => {
                state.apply_marker(pid, epoch, 0, offset, !commit, 0);
            }
        }
    }

    fn append(&mut self, e: Entry) -> usize {
        self.state.settle(self.synced as i64);
        let offset = self.entries.len();
        Self::apply(&mut self.state, &e, offset as i64);
        self.entries.push(e);
        offset
    }

    /// A crash: what is not synced is gone; the state is replayed.
    fn crash(&mut self) {
        self.entries.truncate(self.synced);
        self.state = ProducerState::new();
        for (o, e) in self.entries.iter().enumerate() {
            Self::apply(&mut self.state, e, o as i64);
        }
    }

    fn lso(&self) -> usize {
        self.state.last_stable_offset(self.synced as i64) as usize
    }

    /// What a read_committed fetch returns: data below the LSO outside
    /// every aborted transaction's range.
    fn read_committed(&self) -> Vec<u64> {
        sim_support::read_committed(&self.entries, &self.state, self.synced, |e| match e {
            Entry::Data { pid, value, .. } => Some((*pid, *value)),
            Entry::Marker { .. } => None,
        })
    }
}

#[derive(Debug, Clone)]
enum OffRec {
    Pending { pid: i64, tag: u32 },
    End { pid: i64, commit: bool },
}

/// The group coordinator's transactional offsets, as a log.
#[derive(Default)]
struct Offsets {
    log: Vec<OffRec>,
    synced: usize,
}

impl Offsets {
    fn replay(&self) -> (HashMap<i64, Vec<u32>>, Vec<u32>) {
        let mut pending: HashMap<i64, Vec<u32>> = HashMap::new();
        let mut committed = Vec::new();
        for r in &self.log {
            match r {
                OffRec::Pending { pid, tag } => pending.entry(*pid).or_default().push(*tag),
                OffRec::End { pid, commit } => {
                    let tags = pending.remove(pid).unwrap_or_default();
                    if *commit {
                        committed.extend(tags);
                    }
                }
            }
        }
        (pending, committed)
    }
}

/// The transaction log: records, the synced part, and the current state.
#[derive(Default)]
struct Coord {
    log: Vec<TxnMeta>,
    synced: usize,
    txns: HashMap<String, TxnMeta>,
    view: HashMap<i64, ProducerView>,
    next_pid: i64,
}

impl Coord {
    fn make_current(&mut self, m: TxnMeta) {
        update_view(&mut self.view, &m);
        self.txns.insert(m.transactional_id.clone(), m);
    }

    fn crash(&mut self) {
        self.log.truncate(self.synced);
        self.txns.clear();
        self.view.clear();
        for m in self.log.clone() {
            self.make_current(m);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Wait {
    Ready,
    Coord(usize),
    Offsets(usize),
}

/// A decision being carried out for one transactional id (its lock).
struct Job {
    effects: VecDeque<Effect>,
    client: Option<usize>,
    wait: Wait,
    parts: Vec<(usize, usize)>,
    current: Option<TxnMeta>,
}

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Init(Option<(i64, i16)>),
    Add(Vec<Tp>),
    Produce { part: usize, seq: i32, value: u64 },
    Offsets,
    End(bool),
}

#[derive(Debug, Clone)]
struct Txn {
    tag: u32,
    parts: BTreeSet<Tp>,
    acked: Vec<u64>,
}

/// A transactional producer instance. Several may share an id: the older
/// ones are zombies once a newer one initialises.
struct Client {
    id: String,
    tv2: bool,
    ident: Option<(i64, i16)>,
    seqs: HashMap<usize, i32>,
    txn: Option<Txn>,
    /// A request to send (again) when it is this client's turn.
    todo: Option<Req>,
    /// A request in flight and what completes it.
    inflight: Option<(Req, Inflight)>,
}

#[derive(Debug, Clone, Copy)]
enum Inflight {
    Job,
    Part(usize, usize),
    Offsets(usize),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Committed,
    Aborted,
}

struct Sim {
    rng: Rng,
    now: i64,
    parts: Vec<Part>,
    coord: Coord,
    offsets: Offsets,
    clients: Vec<Client>,
    jobs: BTreeMap<String, Job>,
    mutate: fn(Vec<Effect>) -> Vec<Effect>,
    /// Cluster mode's model: every request and every decision is one
    /// PostgreSQL transaction, all of it durable at once or none of it
    /// (a decision's effects run in one step; nothing is left unsynced
    /// between steps, so a crash loses only what was in flight).
    cluster: bool,
    crash_per_mille: u64,
    next_value: u64,
    next_tag: u32,
    tag_of: HashMap<u64, u32>,
    outcome: HashMap<u32, Outcome>,
    acked: HashMap<u32, Vec<u64>>,
    offsets_acked: HashSet<u32>,
    seen: Vec<Vec<u64>>,
    trace: Vec<String>,
}

const IDS: usize = 3;
const TIMEOUT_MS: i32 = 1000;

impl Sim {
    fn new(seed: u64, mutate: fn(Vec<Effect>) -> Vec<Effect>) -> Self {
        let mut rng = Rng(seed);
        let parts: Vec<Part> = (0..3)
            .map(|i| Part {
                tp: (format!("t{}", i / 2), i % 2),
                entries: Vec::new(),
                synced: 0,
                state: ProducerState::new(),
            })
            .collect();
        let clients = (0..IDS)
            .map(|i| Client::new(format!("tx-{i}"), rng.chance(50)))
            .collect();
        Sim {
            crash_per_mille: 1 + rng.next() % 5,
            rng,
            now: 1_000,
            seen: vec![Vec::new(); parts.len()],
            parts,
            coord: Coord {
                next_pid: 1000,
                ..Default::default()
            },
            offsets: Offsets::default(),
            clients,
            jobs: BTreeMap::new(),
            mutate,
            cluster: false,
            next_value: 1,
            next_tag: 1,
            tag_of: HashMap::new(),
            outcome: HashMap::new(),
            acked: HashMap::new(),
            offsets_acked: HashSet::new(),
            trace: Vec::new(),
        }
    }

    fn log(&mut self, s: String) {
        self.trace.push(format!("t={} {s}", self.now));
    }

    fn new_pid(next: &mut i64) -> impl FnMut() -> i64 + use<'_> {
        move || {
            *next += 1;
            *next
        }
    }

    // --- the coordinator's side ------------------------------------------

    /// A client request to the coordinator: decided at once, carried out
    /// by a job holding the id. An id busy with a job answers
    /// CONCURRENT_TRANSACTIONS, as the broker does after its lock wait.
    fn coordinator(&mut self, c: usize, req: &Req) -> Result<(), CoordError> {
        let id = self.clients[c].id.clone();
        if self.jobs.contains_key(&id) {
            return Err(CoordError::ConcurrentTransactions);
        }
        let m = self.coord.txns.get(&id).cloned();
        let now = self.now;
        let mut new_pid = Self::new_pid(&mut self.coord.next_pid);
        let (pid, epoch) = self.clients[c].ident.unwrap_or((-1, -1));
        let effects = match req {
            Req::Init(expected) => {
                tc::decide_init(m.as_ref(), &id, TIMEOUT_MS, *expected, now, &mut new_pid)?
            }
            Req::Add(parts) => tc::decide_add_partitions(m.as_ref(), pid, epoch, parts, now)?,
            Req::End(commit) => {
                let tv2 = self.clients[c].tv2;
                tc::decide_end(m.as_ref(), pid, epoch, *commit, tv2, now, &mut new_pid)?
            }
            _ => unreachable!("not a coordinator request"),
        };
        drop(new_pid);
        self.start_job(id, effects, Some(c));
        Ok(())
    }

    fn start_job(&mut self, id: String, effects: Vec<Effect>, client: Option<usize>) {
        let effects = (self.mutate)(effects);
        self.log(format!(
            "job {id}: {} effects for {client:?}",
            effects.len()
        ));
        self.jobs.insert(
            id,
            Job {
                effects: effects.into(),
                client,
                wait: Wait::Ready,
                parts: Vec::new(),
                current: None,
            },
        );
    }

    /// One step of `id`'s job: finish what it waits for once it is
    /// durable, or start its next effect.
    fn step_job(&mut self, id: &str) {
        let Some(mut job) = self.jobs.remove(id) else {
            return;
        };
        let durable = match job.wait {
            Wait::Ready => true,
            Wait::Coord(i) => self.coord.synced > i,
            Wait::Offsets(i) => self.offsets.synced > i,
        } && job.parts.iter().all(|&(p, o)| self.parts[p].synced > o);
        if !durable {
            self.jobs.insert(id.to_string(), job);
            return;
        }
        job.wait = Wait::Ready;
        job.parts.clear();
        if let Some(m) = job.current.take() {
            self.coord.make_current(m);
        }
        let Some(effect) = job.effects.pop_front() else {
            return; // done, no answer (timeout, recovery)
        };
        self.log(format!("{id}: {effect:?}"));
        match effect {
            Effect::Persist(m) | Effect::PersistLater(m) if self.epoch_went_back(&m) => {
                panic!("invariant: the epoch of {id} went back: {m:?}");
            }
            Effect::Persist(m) => {
                self.coord.log.push(m.clone());
                job.wait = Wait::Coord(self.coord.log.len() - 1);
                job.current = Some(m);
            }
            Effect::PersistLater(m) => {
                self.coord.log.push(m.clone());
                self.coord.make_current(m);
            }
            Effect::WriteMarkers {
                producer_id,
                epoch,
                commit,
                partitions,
            } => {
                for tp in partitions {
                    let p = self.parts.iter().position(|p| p.tp == tp).expect("known");
                    if self.parts[p]
                        .state
                        .check_marker(producer_id, epoch, 0)
                        .is_err()
                    {
                        continue; // refused: a newer epoch wrote there
                    }
                    let o = self.parts[p].append(Entry::Marker {
                        pid: producer_id,
                        epoch,
                        commit,
                    });
                    job.parts.push((p, o));
                }
            }
            Effect::CompleteOffsets {
                producer_id,
                commit,
            } => {
                if self.offsets.replay().0.contains_key(&producer_id) {
                    self.offsets.log.push(OffRec::End {
                        pid: producer_id,
                        commit,
                    });
                    job.wait = Wait::Offsets(self.offsets.log.len() - 1);
                }
            }
            Effect::Reply { producer_id, epoch } => {
                if let Some(c) = job.client.take() {
                    self.answer(c, Ok(Some((producer_id, epoch))));
                }
            }
        }
        if !job.effects.is_empty()
            || job.wait != Wait::Ready
            || !job.parts.is_empty()
            || job.current.is_some()
        {
            self.jobs.insert(id.to_string(), job);
        }
    }

    /// Cluster mode: a decision runs whole, each effect durable as it is
    /// made (one PostgreSQL transaction).
    fn run_whole_job(&mut self, id: &str) {
        for _ in 0..64 {
            if !self.jobs.contains_key(id) {
                return;
            }
            self.sync_everything();
            self.step_job(id);
        }
        panic!("the decision of {id} never ended");
    }

    fn sync_everything(&mut self) {
        for what in 0..2 + self.parts.len() {
            self.sync(what);
        }
    }

    fn epoch_went_back(&self, m: &TxnMeta) -> bool {
        self.coord
            .txns
            .get(&m.transactional_id)
            .is_some_and(|o| o.producer_id == m.producer_id && m.epoch < o.epoch)
    }

    /// The reaper: every expired open transaction not being changed.
    fn reap(&mut self) {
        let ids: Vec<String> = self.coord.txns.keys().cloned().collect();
        for id in ids {
            if self.jobs.contains_key(&id) {
                continue;
            }
            let m = self.coord.txns[&id].clone();
            let now = self.now;
            let effects = tc::decide_timeout(
                &m,
                now,
                tc::OnTimeout::Abort,
                &mut Self::new_pid(&mut self.coord.next_pid),
            );
            if !effects.is_empty() {
                self.start_job(id, effects, None);
            }
        }
    }

    fn crash(&mut self) {
        self.log("CRASH".into());
        for p in &mut self.parts {
            p.crash();
        }
        self.coord.crash();
        self.offsets.log.truncate(self.offsets.synced);
        self.jobs.clear();
        for c in 0..self.clients.len() {
            if self.clients[c].inflight.is_some() {
                self.answer(c, Err(Failure::Disconnected));
            }
        }
        // Recovery: every Prepare* id is driven to completion again.
        let pending: Vec<TxnMeta> = self.coord.txns.values().cloned().collect();
        for m in pending {
            let effects = tc::decide_recovery(&m, self.now);
            if !effects.is_empty() {
                self.start_job(m.transactional_id.clone(), effects, None);
            }
        }
    }

    fn sync(&mut self, what: usize) {
        match what {
            0 => self.coord.synced = self.coord.log.len(),
            1 => self.offsets.synced = self.offsets.log.len(),
            n => {
                let p = &mut self.parts[n - 2];
                p.synced = p.entries.len();
            }
        }
        self.deliver_acks();
    }

    /// Acks of produces and offset commits that are durable now.
    fn deliver_acks(&mut self) {
        for c in 0..self.clients.len() {
            let done = match self.clients[c].inflight {
                Some((_, Inflight::Part(p, o))) => self.parts[p].synced > o,
                Some((_, Inflight::Offsets(i))) => self.offsets.synced > i,
                _ => false,
            };
            if done {
                self.answer(c, Ok(None));
            }
        }
    }

    // --- clients ---------------------------------------------------------

    /// The answer to client `c`'s request in flight.
    fn answer(&mut self, c: usize, res: Result<Option<(i64, i16)>, Failure>) {
        let Some((req, _)) = self.clients[c].inflight.take() else {
            return;
        };
        // A reply lost on the way: the client sends the same again.
        if res.is_ok() && self.rng.chance(8) {
            self.log(format!("client {c}: reply to {req:?} lost"));
            self.clients[c].todo = Some(req);
            return;
        }
        self.log(format!("client {c}: {req:?} -> {res:?}"));
        let cl = &mut self.clients[c];
        match (req, res) {
            (
                req,
                Err(Failure::Disconnected | Failure::Coord(CoordError::ConcurrentTransactions)),
            ) => {
                cl.todo = Some(req); // retried as clients do
            }
            (Req::Init(_), Ok(ident)) => {
                if cl.ident.map(|i| i.1) != ident.map(|i| i.1) {
                    cl.seqs.clear();
                }
                cl.ident = ident;
                cl.txn = None;
            }
            (Req::Add(_), Ok(_)) => {}
            (Req::Produce { part, value, .. }, Ok(_)) => {
                *cl.seqs.entry(part).or_insert(0) += 1;
                if let Some(t) = &mut cl.txn {
                    t.acked.push(value);
                }
            }
            (Req::Offsets, Ok(_)) => {
                if let Some(t) = &cl.txn {
                    self.offsets_acked.insert(t.tag);
                }
            }
            (Req::End(commit), Ok(ident)) => {
                if let Some(t) = cl.txn.take() {
                    let o = if commit {
                        Outcome::Committed
                    } else {
                        Outcome::Aborted
                    };
                    self.outcome.insert(t.tag, o);
                    self.acked.insert(t.tag, t.acked);
                }
                if cl.ident.map(|i| i.1) != ident.map(|i| i.1) {
                    cl.seqs.clear();
                }
                cl.ident = ident;
            }
            (Req::Produce { .. } | Req::Offsets, Err(_)) => {
                // Refused (fenced, or not in the transaction): abort it.
                cl.todo = Some(Req::End(false));
            }
            (_, Err(_)) => {
                // Fatal for this instance: the application starts a new one.
                cl.ident = None;
                cl.txn = None;
                cl.seqs.clear();
            }
        }
    }

    fn send(&mut self, c: usize, req: Req) {
        self.log(format!("client {c} ({}): {req:?}", self.clients[c].id));
        let (pid, epoch) = self.clients[c].ident.unwrap_or((-1, -1));
        let res = match &req {
            Req::Init(_) | Req::Add(_) | Req::End(_) => match self.coordinator(c, &req) {
                Ok(()) => {
                    self.clients[c].inflight = Some((req, Inflight::Job));
                    return;
                }
                Err(e) => Err(Failure::Coord(e)),
            },
            Req::Produce { part, seq, value } => {
                let (part, seq, value) = (*part, *seq, *value);
                let p = &self.parts[part];
                let view = self.coord.view.get(&pid);
                match verify_write(view, epoch, &p.tp.0, p.tp.1) {
                    Err(_) => Err(Failure::Refused),
                    Ok(()) => match p.state.check(&Part::batch(pid, epoch, seq, self.now)) {
                        Err(_) => Err(Failure::Refused),
                        Ok(Verdict::Duplicate { first_offset, .. }) => {
                            let o = first_offset as usize;
                            self.clients[c].inflight = Some((req, Inflight::Part(part, o)));
                            self.deliver_acks();
                            return;
                        }
                        Ok(Verdict::Append) => {
                            let o = self.parts[part].append(Entry::Data {
                                pid,
                                epoch,
                                seq,
                                value,
                            });
                            self.clients[c].inflight = Some((req, Inflight::Part(part, o)));
                            return;
                        }
                    },
                }
            }
            Req::Offsets => {
                match verify_write(self.coord.view.get(&pid), epoch, OFFSETS_TOPIC, 0) {
                    Err(_) => Err(Failure::Refused),
                    Ok(()) => {
                        let tag = self.clients[c].txn.as_ref().map_or(0, |t| t.tag);
                        self.offsets.log.push(OffRec::Pending { pid, tag });
                        let i = self.offsets.log.len() - 1;
                        self.clients[c].inflight = Some((req, Inflight::Offsets(i)));
                        return;
                    }
                }
            }
        };
        self.clients[c].inflight = Some((req, Inflight::Job));
        self.answer(c, res.map(|_: ()| None));
    }

    /// Client `c` takes its next step.
    fn act(&mut self, c: usize) {
        if self.clients[c].inflight.is_some() {
            return;
        }
        if let Some(req) = self.clients[c].todo.take() {
            return self.send(c, req);
        }
        if self.clients[c].ident.is_none() {
            return self.send(c, Req::Init(None));
        }
        let txn = self.clients[c].txn.clone();
        match txn {
            None => {
                let n = 1 + self.rng.below(2);
                let mut parts = BTreeSet::new();
                for _ in 0..n {
                    parts.insert(self.parts[self.rng.below(self.parts.len())].tp.clone());
                }
                if self.rng.chance(30) {
                    parts.insert((OFFSETS_TOPIC.to_string(), 0));
                }
                let tag = self.next_tag;
                self.next_tag += 1;
                self.clients[c].txn = Some(Txn {
                    tag,
                    parts: parts.clone(),
                    acked: Vec::new(),
                });
                self.send(c, Req::Add(parts.into_iter().collect()));
            }
            Some(t) => {
                let r = self.rng.below(100);
                let data: Vec<&Tp> = t.parts.iter().filter(|(n, _)| n != OFFSETS_TOPIC).collect();
                if r < 55 && !data.is_empty() {
                    let tp = data[self.rng.below(data.len())].clone();
                    let part = self.parts.iter().position(|p| p.tp == tp).expect("known");
                    let seq = *self.clients[c].seqs.get(&part).unwrap_or(&0);
                    let value = self.next_value;
                    self.next_value += 1;
                    self.tag_of.insert(value, t.tag);
                    self.send(c, Req::Produce { part, seq, value });
                } else if r < 65 && t.parts.contains(&(OFFSETS_TOPIC.to_string(), 0)) {
                    self.send(c, Req::Offsets);
                } else {
                    let commit = self.rng.chance(75);
                    self.send(c, Req::End(commit));
                }
            }
        }
    }

    // --- the schedule ----------------------------------------------------

    fn step(&mut self) {
        let r = self.rng.below(1000);
        if r < 400 {
            let c = self.rng.below(self.clients.len());
            self.act(c);
        } else if r < 650 {
            let ids: Vec<String> = self.jobs.keys().cloned().collect();
            if !ids.is_empty() {
                let id = ids[self.rng.below(ids.len())].clone();
                if self.cluster {
                    self.run_whole_job(&id);
                } else {
                    self.step_job(&id);
                }
            }
        } else if r < 930 {
            // The coordinator's log, the offsets log, or one partition.
            let what = match self.rng.below(5) {
                0 | 1 => 0,
                2 => 1,
                _ => 2 + self.rng.below(self.parts.len()),
            };
            self.sync(what);
        } else if r < 990 {
            self.now += self.rng.below(400) as i64;
            self.reap();
        } else if r < 990 + self.crash_per_mille as usize {
            self.crash();
        } else if r >= 995 && self.clients.len() < 5 {
            // A new instance of an id: the older one writes on as a zombie.
            let old = self.rng.below(IDS);
            let tv2 = self.clients[old].tv2;
            let id = self.clients[old].id.clone();
            self.log(format!("new instance of {id}"));
            self.clients.push(Client::new(id, tv2));
        }
    }

    fn check_reads(&mut self) {
        for (i, p) in self.parts.iter().enumerate() {
            let now = p.read_committed();
            assert!(
                now.starts_with(&self.seen[i]),
                "invariant: read_committed view of {:?} changed: was {:?}, now {:?}",
                p.tp,
                self.seen[i],
                now
            );
            self.seen[i] = now;
        }
    }

    /// Lets everything in flight finish, then every open transaction time out.
    fn settle(&mut self) {
        for c in &mut self.clients {
            c.todo = None;
        }
        for _ in 0..200 {
            for what in 0..2 + self.parts.len() {
                self.sync(what);
            }
            for id in self.jobs.keys().cloned().collect::<Vec<_>>() {
                self.step_job(&id);
            }
            self.check_reads();
            for c in &mut self.clients {
                c.todo = None;
            }
            if self.jobs.is_empty() {
                self.now += 10 * TIMEOUT_MS as i64;
                self.reap();
                if self.jobs.is_empty() {
                    break;
                }
            }
        }
        assert!(
            self.jobs.is_empty(),
            "jobs never finished: {:?}",
            self.jobs.keys()
        );
    }

    fn check_end(&self) {
        // Nothing hangs.
        for p in &self.parts {
            assert_eq!(
                p.lso(),
                p.entries.len(),
                "invariant: {:?} hangs (LSO < HW)",
                p.tp
            );
        }
        for m in self.coord.txns.values() {
            assert!(
                matches!(
                    m.state,
                    TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
                ),
                "invariant: {} ends in {:?}",
                m.transactional_id,
                m.state
            );
        }
        let (pending, committed_offsets) = self.offsets.replay();
        assert!(
            pending.is_empty(),
            "invariant: offsets left pending: {pending:?}"
        );
        // No record twice in any log.
        let mut in_log: HashMap<u32, usize> = HashMap::new();
        let mut values = HashSet::new();
        for p in &self.parts {
            for e in &p.entries {
                if let Entry::Data { value, .. } = e {
                    assert!(
                        values.insert(*value),
                        "invariant: value {value} is in the log twice"
                    );
                    *in_log.entry(self.tag_of[value]).or_default() += 1;
                }
            }
        }
        let mut visible: HashMap<u32, usize> = HashMap::new();
        let mut visible_values = HashSet::new();
        for p in &self.parts {
            for v in p.read_committed() {
                *visible.entry(self.tag_of[&v]).or_default() += 1;
                visible_values.insert(v);
            }
        }
        let offsets: HashSet<u32> = committed_offsets.into_iter().collect();
        for (&tag, &n) in &in_log {
            let seen = visible.get(&tag).copied().unwrap_or(0);
            assert!(
                seen == 0 || seen == n,
                "invariant: transaction {tag} is torn: {seen} of its {n} records are visible"
            );
        }
        for (&tag, o) in &self.outcome {
            let acked = &self.acked[&tag];
            match o {
                Outcome::Committed => {
                    for v in acked {
                        assert!(
                            visible_values.contains(v),
                            "invariant: committed transaction {tag} lost record {v}"
                        );
                    }
                    if self.offsets_acked.contains(&tag) {
                        assert!(
                            offsets.contains(&tag),
                            "invariant: committed transaction {tag} lost its offsets"
                        );
                    }
                }
                Outcome::Aborted => {
                    assert!(
                        !visible.contains_key(&tag),
                        "invariant: aborted transaction {tag} is visible"
                    );
                    assert!(
                        !offsets.contains(&tag),
                        "invariant: aborted transaction {tag} committed offsets"
                    );
                }
            }
        }
        // Offsets and records of one transaction go together.
        for &tag in &offsets {
            if in_log.contains_key(&tag) {
                assert!(
                    visible.contains_key(&tag),
                    "invariant: offsets of {tag} committed, its records aborted"
                );
            }
        }
        for &tag in visible.keys() {
            if self.offsets_acked.contains(&tag) {
                assert!(
                    offsets.contains(&tag),
                    "invariant: records of {tag} committed, its offsets not"
                );
            }
        }
    }

    /// Runs one schedule; returns how many transactions ended.
    fn run(&mut self, steps: usize) -> usize {
        for _ in 0..steps {
            self.step();
            if self.cluster {
                self.sync_everything();
            }
            self.check_reads();
        }
        self.settle();
        self.check_end();
        self.outcome.len()
    }
}

#[derive(Debug, Clone, Copy)]
enum Failure {
    Disconnected,
    Refused,
    Coord(CoordError),
}

impl Client {
    fn new(id: String, tv2: bool) -> Self {
        Client {
            id,
            tv2,
            ident: None,
            seqs: HashMap::new(),
            txn: None,
            todo: None,
            inflight: None,
        }
    }
}

/// Runs `seed`; on a failed invariant, the seed, how to run it again and
/// the last steps of its trace.
fn run_seed(
    seed: u64,
    mutate: fn(Vec<Effect>) -> Vec<Effect>,
    steps: usize,
) -> Result<usize, String> {
    run_seed_in(seed, mutate, steps, false)
}

fn run_seed_in(
    seed: u64,
    mutate: fn(Vec<Effect>) -> Vec<Effect>,
    steps: usize,
    cluster: bool,
) -> Result<usize, String> {
    let mut sim = Sim::new(seed, mutate);
    sim.cluster = cluster;
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run(steps)));
    res.map_err(|e| {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        let tail = sim.trace.len().saturating_sub(40);
        format!(
            "seed {seed}: {msg}\nrun it again: SIM_SEED={seed} cargo test -p oncelog-broker --test simulation -- --nocapture\nlast steps:\n{}",
            sim.trace[tail..].join("\n")
        )
    })
}

fn unchanged(e: Vec<Effect>) -> Vec<Effect> {
    e
}

const STEPS: usize = 600;

#[test]
fn exactly_once_holds_in_every_schedule() {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        let seed: u64 = seed.parse().expect("SIM_SEED is a number");
        let mut sim = Sim::new(seed, unchanged);
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.run(STEPS)));
        println!("{}", sim.trace.join("\n"));
        if let Err(e) = res {
            std::panic::resume_unwind(e);
        }
        return;
    }
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mut ended = 0;
    for seed in 0..seeds {
        match run_seed(seed, unchanged, STEPS) {
            Ok(n) => ended += n,
            Err(report) => panic!("{report}"),
        }
    }
    println!("{seeds} schedules, {ended} transactions ended, every invariant held");
    assert!(
        ended > seeds as usize,
        "the schedules end too few transactions to mean anything"
    );
}

/// The planted bug: the Prepare record is not waited for (markers may be
/// durable while the decision is not). A crash then loses the decision and
/// the timeout aborts what some partitions already committed. The
/// simulation must find a schedule that shows it.
fn prepare_not_waited(effects: Vec<Effect>) -> Vec<Effect> {
    effects
        .into_iter()
        .map(|e| match e {
            Effect::Persist(m)
                if matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort) =>
            {
                Effect::PersistLater(m)
            }
            e => e,
        })
        .collect()
}

/// The Complete record before the markers: once it is durable, nothing
/// re-drives markers that a crash lost.
fn complete_before_markers(mut effects: Vec<Effect>) -> Vec<Effect> {
    let done = effects.iter().rposition(|e| {
        matches!(e,
        Effect::Persist(m) | Effect::PersistLater(m)
            if matches!(m.state, TxnState::CompleteCommit | TxnState::CompleteAbort))
    });
    let markers = effects
        .iter()
        .position(|e| matches!(e, Effect::WriteMarkers { .. }));
    if let (Some(d), Some(m)) = (done, markers) {
        let e = match effects.remove(d) {
            Effect::PersistLater(x) | Effect::Persist(x) => Effect::Persist(x),
            e => e,
        };
        effects.insert(m, e);
    }
    effects
}

#[test]
fn the_simulation_catches_planted_ordering_bugs() {
    for (name, bug) in [
        (
            "prepare not waited for",
            prepare_not_waited as fn(Vec<Effect>) -> Vec<Effect>,
        ),
        ("Complete before the markers", complete_before_markers),
    ] {
        let found = (0..3000u64).find_map(|seed| run_seed(seed, bug, STEPS).err());
        let report = found.unwrap_or_else(|| panic!("no schedule found the planted bug '{name}'"));
        println!(
            "planted bug '{name}' found: {}",
            report.lines().next().unwrap_or("")
        );
    }
}

/// Cluster mode's commit model: each request and each decision all or
/// nothing (`Sim::cluster`), over the same schedules.
#[test]
fn exactly_once_holds_with_cluster_modes_all_or_nothing_decisions() {
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000)
        / 3;
    let mut ended = 0;
    for seed in 0..seeds {
        match run_seed_in(seed, unchanged, STEPS, true) {
            Ok(n) => ended += n,
            Err(report) => panic!("cluster model: {report}"),
        }
    }
    println!("cluster model: {seeds} schedules, {ended} transactions ended, every invariant held");
    assert!(
        ended > seeds as usize,
        "the schedules end too few transactions to mean anything"
    );
}
