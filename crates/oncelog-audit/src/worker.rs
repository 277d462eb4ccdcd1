//! One workload process (`oncelog audit-worker`): a transactional librdkafka
//! producer, and for the copier and queue workloads a read_committed consumer
//! with a fixed assignment (the `recommit` workload's worker is
//! [`crate::recommit`], on the project's own client). It appends its history as JSON lines to a file,
//! each event written before the action it announces can take effect, so a
//! `kill -9` leaves a history the checker can judge.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

/// What a worker writes, one JSON object per line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The producer is initialised (any older producer of its id is fenced).
    Ready {
        ms: u64,
    },
    Begin {
        txn: u64,
        ms: u64,
    },
    Send {
        txn: u64,
        topic: String,
        partition: i32,
        key: String,
        value: String,
    },
    Poll {
        txn: u64,
        ms: u64,
        reads: Vec<(String, i32, i64, String)>,
    },
    /// An acknowledged offset of a sent value.
    Ack {
        txn: u64,
        value: String,
        offset: i64,
    },
    Commit {
        txn: u64,
        ms: u64,
    },
    End {
        txn: u64,
        ms: u64,
        outcome: crate::Outcome,
    },
    /// The worker stops: why.
    Exit {
        ms: u64,
        reason: String,
    },
    /// `recommit`: an InitProducerId of `transactional_id` is about to be
    /// sent (a `Ready` follows once it is answered).
    Init {
        ms: u64,
        transactional_id: String,
    },
    /// `recommit`: a re-sent EndTxn of the ended transaction `txn`, under the
    /// identity it was ended with, and its answer (see [`crate::Recommit`]).
    Recommit {
        txn: u64,
        transactional_id: String,
        commit: bool,
        version: i16,
        producer_id: i64,
        epoch: i16,
        sent_ms: u64,
        answered_ms: u64,
        error_code: Option<i16>,
        reconnected: bool,
    },
}

pub use crate::load_common::now_ms;

/// Keys of the compacted workload (per partition).
pub const COMPACTED_KEYS: u64 = 40;

#[derive(clap::Args, Debug, Clone)]
pub struct WorkerArgs {
    #[arg(long)]
    pub bootstrap: String,
    /// copier, queue, zombie, compacted or recommit.
    #[arg(long)]
    pub workload: String,
    #[arg(long)]
    pub transactional_id: String,
    /// History file (JSON lines, appended).
    #[arg(long)]
    pub history: PathBuf,
    /// The worker stops cleanly once this file exists.
    #[arg(long)]
    pub stop_file: PathBuf,
    /// Topic read (copier, queue).
    #[arg(long, default_value = "")]
    pub input: String,
    /// Topic written.
    #[arg(long)]
    pub output: String,
    /// Partitions of the input this worker reads (comma separated).
    #[arg(long, default_value = "")]
    pub partitions: String,
    /// Partition count of the output topic.
    #[arg(long, default_value_t = 1)]
    pub output_partitions: i32,
    #[arg(long, default_value = "audit")]
    pub group: String,
    /// Records per transaction (copier: at most; queue, zombie: sends).
    #[arg(long, default_value_t = 200)]
    pub txn_records: usize,
    /// Abort one transaction in this many on purpose (0: never).
    #[arg(long, default_value_t = 3)]
    pub abort_every: u64,
    #[arg(long, default_value_t = 10_000)]
    pub transaction_timeout_ms: u64,
    /// This process's number (unique in a run).
    #[arg(long)]
    pub process: u32,
    /// Seed for the worker's choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// A tiny deterministic generator (xorshift*), for reproducible choices.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

pub(crate) struct Log {
    out: BufWriter<File>,
}

impl Log {
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(Self {
            out: BufWriter::new(f),
        })
    }
    pub(crate) fn ev(&mut self, e: &Event) -> Result<()> {
        serde_json::to_writer(&mut self.out, e)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }
    /// Makes everything logged so far survive a kill -9 of this process.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

/// Collects delivery reports: (value, offset) of acknowledged sends.
#[derive(Default)]
struct Acks {
    acked: Mutex<Vec<(String, i64)>>,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = Box<String>;
    fn delivery(&self, r: &DeliveryResult<'_>, value: Self::DeliveryOpaque) {
        if let Ok(m) = r {
            if let Ok(mut a) = self.acked.lock() {
                a.push((*value, m.offset()));
            }
        }
    }
}

/// A producer with its own polling thread, so delivery reports are served
/// while the main thread blocks in commit or abort.
type TxnProducer = ThreadedProducer<Acks>;

fn producer(a: &WorkerArgs) -> Result<TxnProducer> {
    let p: TxnProducer = crate::rdkafka_config()
        .set("bootstrap.servers", &a.bootstrap)
        .set("transactional.id", &a.transactional_id)
        .set(
            "transaction.timeout.ms",
            a.transaction_timeout_ms.to_string(),
        )
        .set("message.timeout.ms", a.transaction_timeout_ms.to_string())
        .set("socket.timeout.ms", "10000")
        .set("linger.ms", "5")
        .set("client.id", format!("audit-{}", a.process))
        .create_with_context(Acks::default())
        .context("creating the producer")?;
    Ok(p)
}

fn consumer(a: &WorkerArgs) -> Result<BaseConsumer> {
    crate::rdkafka_config()
        .set("bootstrap.servers", &a.bootstrap)
        .set("group.id", &a.group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("client.id", format!("audit-{}-c", a.process))
        .create()
        .context("creating the consumer")
}

/// How an error leaves the current transaction.
enum Failure {
    /// The transaction must be aborted; the producer lives on.
    Abortable(String),
    /// This producer is done (fenced, fatal): the outcome is unknown unless
    /// the commit was never requested.
    Fatal(String),
}

fn classify(e: KafkaError) -> Failure {
    if let KafkaError::Transaction(t) = &e {
        if t.is_fatal() {
            return Failure::Fatal(e.to_string());
        }
        if t.txn_requires_abort() {
            return Failure::Abortable(e.to_string());
        }
    }
    if let Some(code) = e.rdkafka_error_code() {
        if matches!(
            code,
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
        ) {
            return Failure::Fatal(e.to_string());
        }
    }
    Failure::Abortable(e.to_string())
}

fn retriable(e: &KafkaError) -> bool {
    matches!(e, KafkaError::Transaction(t) if t.is_retriable())
}

/// Runs `f` until it succeeds, fails for good, or `limit` passes.
fn retry<T>(
    limit: Duration,
    mut f: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, KafkaError> {
    let start = Instant::now();
    loop {
        match f() {
            Err(e) if retriable(&e) && start.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

pub(crate) fn parent_alive() -> bool {
    std::os::unix::process::parent_id() != 1
}

/// The worker's main loop. Exit codes: 0 stopped, 3 fenced, 4 other fatal.
pub fn run(a: WorkerArgs) -> i32 {
    match run_inner(&a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("audit worker {}: {e:#}", a.process);
            4
        }
    }
}

fn run_inner(a: &WorkerArgs) -> Result<i32> {
    let mut w = Worker::new(a)?;
    if let Some(code) = w.start()? {
        return Ok(code);
    }
    let mut n: u64 = 0;
    loop {
        if a.stop_file.exists() || !parent_alive() {
            return exit(&mut w.log, "stopped", 0);
        }
        n += 1;
        if let Some(code) = w.one_transaction(n)? {
            return Ok(code);
        }
    }
}

/// A record to send: (partition, key, value).
type Outgoing = (i32, String, String);

/// How a transaction ended, and whether the worker goes on.
enum TxnEnd {
    /// The transaction has this outcome and the worker carries on.
    Outcome(crate::Outcome),
    /// The transaction's end and the worker's exit are logged: stop with
    /// this exit code.
    Exit(i32),
}

/// The state of one workload process between transactions (the clients are
/// dropped before the history, consumer first).
struct Worker<'a> {
    a: &'a WorkerArgs,
    /// The read_committed consumer of the input (copier, queue).
    c: Option<BaseConsumer>,
    p: TxnProducer,
    log: Log,
    rng: Rng,
    /// Committed positions of the input (where an abort rewinds to).
    committed: BTreeMap<i32, i64>,
    /// Read positions of the input.
    positions: BTreeMap<i32, i64>,
    /// Values generated so far (workloads that do not copy).
    sent_seq: u64,
}

impl<'a> Worker<'a> {
    /// Opens the history and creates the (not yet initialised) producer.
    fn new(a: &'a WorkerArgs) -> Result<Self> {
        let log = Log::open(&a.history)?;
        let rng = Rng::new(a.seed ^ ((a.process as u64) << 32));
        let p = producer(a)?;
        Ok(Self {
            a,
            c: None,
            p,
            log,
            rng,
            committed: BTreeMap::new(),
            positions: BTreeMap::new(),
            sent_seq: 0,
        })
    }

    /// Initialises the transactional producer (logging `Ready`), then opens
    /// the input. `Some(code)`: the producer could not be initialised, the
    /// exit is logged and the worker stops with that code.
    fn start(&mut self) -> Result<Option<i32>> {
        let init = retry(Duration::from_secs(60), || {
            self.p.init_transactions(Duration::from_secs(15))
        });
        if let Err(e) = init {
            let reason = format!("init_transactions: {e}");
            return exit(&mut self.log, &reason, exit_code(e)).map(Some);
        }
        self.log.ev(&Event::Ready { ms: now_ms() })?;
        self.log.flush()?;
        self.open_input()?;
        Ok(None)
    }

    /// For the workloads that read (copier, queue): creates the consumer and
    /// assigns it the worker's input partitions at the group's committed
    /// offsets, which are also the starting read positions.
    fn open_input(&mut self) -> Result<()> {
        let a = self.a;
        let reads_input = a.workload == "copier" || a.workload == "queue";
        let parts: Vec<i32> = a
            .partitions
            .split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.parse().map_err(|_| anyhow!("bad partition {x}")))
            .collect::<Result<_>>()?;
        if reads_input {
            let c = consumer(a)?;
            let mut tpl = TopicPartitionList::new();
            for p in &parts {
                tpl.add_partition(&a.input, *p);
            }
            let got = c
                .committed_offsets(tpl, Duration::from_secs(30))
                .context("fetching committed offsets")?;
            for e in got.elements() {
                let o = match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                };
                self.committed.insert(e.partition(), o);
            }
            assign(&c, &a.input, &self.committed)?;
            self.c = Some(c);
        }
        self.positions = self.committed.clone();
        Ok(())
    }

    /// Runs transaction `txn` from `Begin` to `End`. `Some(code)`: the
    /// worker must stop with that exit code (its exit is logged).
    fn one_transaction(&mut self, txn: u64) -> Result<Option<i32>> {
        self.log.ev(&Event::Begin { txn, ms: now_ms() })?;
        if let Err(e) = self.p.begin_transaction() {
            self.log.ev(&Event::End {
                txn,
                ms: now_ms(),
                outcome: crate::Outcome::Aborted,
            })?;
            return exit(&mut self.log, &format!("begin_transaction: {e}"), 3).map(Some);
        }
        let mut to_send = self.read_input(txn)?;
        self.generate(&mut to_send);
        let mut failure = self.send_records(txn, to_send)?;
        let abort_on_purpose = self.a.abort_every > 0 && self.rng.below(self.a.abort_every) == 0;
        if abort_on_purpose && failure.is_none() {
            // Let the records reach the log before the abort, so readers
            // must skip them (an abort of unsent records tests nothing).
            if let Err(e) = self.p.flush(Duration::from_secs(20)) {
                failure = Some(classify(e));
            }
        }
        if failure.is_none() && !abort_on_purpose {
            failure = self.send_offsets()?;
        }
        let outcome = match self.end_transaction(txn, failure, abort_on_purpose)? {
            TxnEnd::Outcome(outcome) => outcome,
            TxnEnd::Exit(code) => return Ok(Some(code)),
        };
        self.log_acks(txn)?;
        log_end(&mut self.log, txn, outcome)?;
        if outcome != crate::Outcome::Committed {
            self.positions = self.committed.clone();
            if let Some(c) = &self.c {
                assign(c, &self.a.input, &self.committed)?;
            }
        }
        Ok(None)
    }

    /// For the workloads that read: polls the input for a while (logging a
    /// `Poll` of what was read) and returns the copier's records to send.
    fn read_input(&mut self, txn: u64) -> Result<Vec<Outgoing>> {
        let a = self.a;
        let mut to_send: Vec<Outgoing> = Vec::new();
        let Some(c) = &self.c else {
            return Ok(to_send);
        };
        let deadline = Instant::now() + Duration::from_millis(300);
        let want = if a.workload == "copier" {
            a.txn_records
        } else {
            1 + self.rng.below(a.txn_records as u64) as usize
        };
        let mut reads = Vec::new();
        while reads.len() < want && Instant::now() < deadline {
            match c.poll(Duration::from_millis(50)) {
                None => {}
                Some(Err(e)) => {
                    eprintln!("audit worker {}: consumer: {e}", a.process);
                }
                Some(Ok(m)) => {
                    let v = m
                        .payload()
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                        .unwrap_or_default();
                    self.positions.insert(m.partition(), m.offset() + 1);
                    reads.push((m.topic().to_string(), m.partition(), m.offset(), v));
                }
            }
        }
        if !reads.is_empty() {
            for (_, part, _, v) in &reads {
                if a.workload == "copier" {
                    // input value "i{n}" → output key "out-{n}"
                    let id = v.strip_prefix('i').unwrap_or(v);
                    to_send.push((
                        *part % a.output_partitions.max(1),
                        format!("out-{id}"),
                        format!("o{id}.{}.{txn}", a.process),
                    ));
                }
            }
            self.log.ev(&Event::Poll {
                txn,
                ms: now_ms(),
                reads,
            })?;
        }
        Ok(to_send)
    }

    /// For every workload but the copier: adds fresh records to `to_send`.
    fn generate(&mut self, to_send: &mut Vec<Outgoing>) {
        let a = self.a;
        if a.workload == "copier" {
            return;
        }
        let k = 1 + self.rng.below(a.txn_records.max(1) as u64) as usize;
        for _ in 0..k {
            self.sent_seq += 1;
            let v = format!("v{}.{}", a.process, self.sent_seq);
            let part = self.rng.below(a.output_partitions.max(1) as u64) as i32;
            // compacted: a small key space, written by every worker, so
            // the cleaner has superseded, aborted and live records.
            let key = if a.workload == "compacted" {
                format!("k{}", self.rng.below(COMPACTED_KEYS))
            } else {
                v.clone()
            };
            to_send.push((part, key, v));
        }
    }

    /// Logs a `Send` of every record, flushes the history, then produces
    /// the records (waiting while the producer queue is full). Returns how
    /// the first failed send leaves the transaction, if one fails.
    fn send_records(&mut self, txn: u64, to_send: Vec<Outgoing>) -> Result<Option<Failure>> {
        let a = self.a;
        for (part, key, value) in &to_send {
            self.log.ev(&Event::Send {
                txn,
                topic: a.output.clone(),
                partition: *part,
                key: key.clone(),
                value: value.clone(),
            })?;
        }
        // The sends are logged before any of them can become visible.
        self.log.flush()?;
        for (part, key, value) in to_send {
            let mut rec = BaseRecord::with_opaque_to(&a.output, Box::new(value.clone()))
                .partition(part)
                .key(key.as_bytes())
                .payload(value.as_bytes());
            loop {
                match self.p.send(rec) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        std::thread::sleep(Duration::from_millis(5));
                        rec = r;
                    }
                    Err((e, _)) => return Ok(Some(classify(e))),
                }
            }
        }
        Ok(None)
    }

    /// For the workloads that read: adds the read positions, when they moved
    /// since the last commit, to the transaction. Returns how a failure
    /// leaves the transaction, if it fails.
    fn send_offsets(&mut self) -> Result<Option<Failure>> {
        let Some(c) = &self.c else {
            return Ok(None);
        };
        if self.positions == self.committed {
            return Ok(None);
        }
        let mut tpl = TopicPartitionList::new();
        for (part, o) in &self.positions {
            tpl.add_partition_offset(&self.a.input, *part, Offset::Offset(*o))
                .map_err(|e| anyhow!("{e}"))?;
        }
        let meta = c
            .group_metadata()
            .ok_or_else(|| anyhow!("no consumer group metadata"))?;
        let sent = retry(Duration::from_secs(30), || {
            self.p
                .send_offsets_to_transaction(&tpl, &meta, Duration::from_secs(15))
        });
        Ok(sent.err().map(classify))
    }

    /// Commits the transaction (logging `Commit` first) when nothing failed
    /// and no abort is wanted, and aborts it otherwise.
    fn end_transaction(
        &mut self,
        txn: u64,
        failure: Option<Failure>,
        abort_on_purpose: bool,
    ) -> Result<TxnEnd> {
        if failure.is_none() && !abort_on_purpose {
            self.commit(txn)
        } else {
            self.abort(txn, failure)
        }
    }

    /// Logs `Commit`, then commits the transaction; on success the read
    /// positions become the committed ones.
    fn commit(&mut self, txn: u64) -> Result<TxnEnd> {
        self.log.ev(&Event::Commit { txn, ms: now_ms() })?;
        self.log.flush()?;
        let e = match retry(Duration::from_secs(60), || {
            self.p.commit_transaction(Duration::from_secs(20))
        }) {
            Ok(()) => {
                self.committed = self.positions.clone();
                return Ok(TxnEnd::Outcome(crate::Outcome::Committed));
            }
            Err(e) => e,
        };
        // The commit was requested: unless the client says the
        // transaction must be aborted, we cannot know.
        match classify(e) {
            Failure::Abortable(why) => match self.p.abort_transaction(Duration::from_secs(30)) {
                Ok(()) => {
                    eprintln!(
                        "audit worker {}: commit failed ({why}), aborted",
                        self.a.process
                    );
                    Ok(TxnEnd::Outcome(crate::Outcome::Aborted))
                }
                Err(e2) => {
                    log_end(&mut self.log, txn, crate::Outcome::Indeterminate)?;
                    let reason = format!("commit: {why}; abort: {e2}");
                    exit(&mut self.log, &reason, 4).map(TxnEnd::Exit)
                }
            },
            Failure::Fatal(why) => {
                log_end(&mut self.log, txn, crate::Outcome::Indeterminate)?;
                exit(&mut self.log, &format!("commit: {why}"), 3).map(TxnEnd::Exit)
            }
        }
    }

    /// Aborts the transaction, which never asked to commit; a fatal
    /// `failure` stops the worker without trying.
    fn abort(&mut self, txn: u64, failure: Option<Failure>) -> Result<TxnEnd> {
        if let Some(Failure::Fatal(why)) = failure {
            // Never asked to commit: the transaction cannot commit.
            log_end(&mut self.log, txn, crate::Outcome::Aborted)?;
            return exit(&mut self.log, &why, 3).map(TxnEnd::Exit);
        }
        match self.p.abort_transaction(Duration::from_secs(30)) {
            Ok(()) => Ok(TxnEnd::Outcome(crate::Outcome::Aborted)),
            Err(e) => {
                log_end(&mut self.log, txn, crate::Outcome::Aborted)?;
                let code = exit_code(e);
                exit(&mut self.log, "abort_transaction failed", code).map(TxnEnd::Exit)
            }
        }
    }

    /// Logs an `Ack` of every delivery report that arrived since the last
    /// call (those of transaction `txn`).
    fn log_acks(&mut self, txn: u64) -> Result<()> {
        let acked: Vec<(String, i64)> = self
            .p
            .context()
            .acked
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        for (value, offset) in acked {
            self.log.ev(&Event::Ack { txn, value, offset })?;
        }
        Ok(())
    }
}

/// The exit code of a worker stopped by `e`: 3 when the producer is fenced
/// or failed fatally, 4 otherwise.
fn exit_code(e: KafkaError) -> i32 {
    match classify(e) {
        Failure::Fatal(_) => 3,
        Failure::Abortable(_) => 4,
    }
}

fn log_end(log: &mut Log, txn: u64, outcome: crate::Outcome) -> Result<()> {
    log.ev(&Event::End {
        txn,
        ms: now_ms(),
        outcome,
    })?;
    log.flush()
}

fn exit(log: &mut Log, reason: &str, code: i32) -> Result<i32> {
    log.ev(&Event::Exit {
        ms: now_ms(),
        reason: reason.to_string(),
    })?;
    log.flush()?;
    Ok(code)
}

fn assign(c: &BaseConsumer, topic: &str, at: &BTreeMap<i32, i64>) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    for (p, o) in at {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))
            .map_err(|e| anyhow!("{e}"))?;
    }
    c.assign(&tpl).context("assigning partitions")
}
