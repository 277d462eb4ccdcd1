//! The `recommit` workload's worker: transactions whose end is sent again
//! afterwards, as a committer restored from a checkpoint does (Flink's
//! `KafkaCommitter`). It runs the project's own client, which tells the
//! producer id and epoch of every transaction (librdkafka does not).
//!
//! Per transaction: a few sends to the output topic, then an end (a commit,
//! or an abort one time in `--abort-every`) by EndTxn v4, the classic
//! protocol, or, every other time when the broker offers it, by its highest
//! version (v5, transaction version 2: the end bumps the epoch). After an
//! end whose answer arrived, every other time, a re-commit round: EndTxn
//! with the producer id and epoch the transaction was ended under, for its
//! own outcome and for the other one, each at v1 and at the highest version
//! of the protocol it was ended with (v4 after a classic end, the broker's
//! highest after a v5 one), in random order. A third of the rounds wait up
//! to 2 s first, so broker restarts land between end and re-end; one in six
//! has a second instance call InitProducerId on the same transactional id
//! somewhere in between (a newer producer: the first one's re-ends after it
//! must be refused), and the worker goes on with that instance. Every answer
//! is logged ([`crate::Recommit`]) and the checker judges it.
//!
//! As the librdkafka workers do, it logs each event before the action it
//! announces can take effect. A lost connection (a broker kill) is retried
//! on a new one, as clients do: an end sent again is a re-commit itself,
//! answered success if the first try took effect, so a lost answer leaves
//! the outcome unknown only if the retries fail too.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::{ApiKey, ProducerId, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, TimestampType};
use oncelog_client::{
    retriable, Acks, ClientError, Cluster, CoordinatorType, Producer, ProducerConfig, ResponseError,
};

use crate::history::Outcome;
use crate::worker::{now_ms, parent_alive, Event, Log, Rng, WorkerArgs};

/// How long one step (connecting, an InitProducerId, an end, a re-end)
/// keeps retrying.
const STEP_LIMIT: Duration = Duration::from_secs(60);
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The `recommit` worker process: exit codes as [`crate::worker::run`]'s
/// (0 stopped, 3 fenced, 4 other fatal).
pub fn main(a: WorkerArgs) -> i32 {
    match run(&a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("audit worker {}: {e:#}", a.process);
            4
        }
    }
}

fn run(a: &WorkerArgs) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let w = Worker {
        log: Log::open(&a.history)?,
        rng: Rng::new(a.seed ^ ((a.process as u64) << 32) ^ 0x5EC0_3317),
        a,
        cluster: None,
        lost: 0,
    };
    rt.block_on(w.run())
}

/// A failure the client reports without an answer from the broker (or
/// with only retriable ones): worth trying again on a new connection.
fn connection_lost(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Connect { .. }
            | ClientError::ConnectTimeout { .. }
            | ClientError::Closed { .. }
            | ClientError::ClosedBeforeAuthentication { .. }
            | ClientError::Io { .. }
            | ClientError::Timeout(_)
            | ClientError::NoAnswer { .. }
            | ClientError::Node { .. }
    )
}

/// A newer producer took the transactional id: this one is a zombie.
fn fenced(e: &ClientError) -> bool {
    matches!(
        e.kafka_error(),
        Some(ResponseError::ProducerFenced | ResponseError::InvalidProducerEpoch)
    )
}

/// How an end ended.
enum End {
    /// Answered success, at this EndTxn version.
    Done(i16),
    /// Answered with this (non-retriable) error.
    Refused(ClientError),
    /// No answer within [`STEP_LIMIT`].
    NoAnswer(String),
}

struct Worker<'a> {
    a: &'a WorkerArgs,
    log: Log,
    rng: Rng,
    cluster: Option<Cluster>,
    /// Connections lost so far.
    lost: u64,
}

impl Worker<'_> {
    /// The current connection, or a new one.
    async fn cluster(&mut self) -> Result<&mut Cluster> {
        let start = Instant::now();
        while self.cluster.is_none() {
            if !parent_alive() {
                bail!("the auditor is gone");
            }
            match Cluster::connect(&self.a.bootstrap).await {
                Ok(c) => self.cluster = Some(c),
                Err(e) if start.elapsed() >= STEP_LIMIT => {
                    return Err(e).context("connecting to the cluster")
                }
                Err(_) => tokio::time::sleep(RETRY_PAUSE).await,
            }
        }
        self.cluster
            .as_mut()
            .ok_or_else(|| anyhow!("no connection"))
    }

    /// After `e`: drops the connection if `e` says it is gone.
    fn note(&mut self, what: &str, e: &ClientError) {
        if connection_lost(e) {
            self.cluster = None;
            self.lost += 1;
        }
        eprintln!("audit worker {}: {what}: {e}", self.a.process);
    }

    fn exit(&mut self, reason: &str, code: i32) -> Result<i32> {
        self.log.ev(&Event::Exit {
            ms: now_ms(),
            reason: reason.to_string(),
        })?;
        self.log.flush()?;
        Ok(code)
    }

    fn end_event(&mut self, txn: u64, outcome: Outcome) -> Result<()> {
        self.log.ev(&Event::End {
            txn,
            ms: now_ms(),
            outcome,
        })?;
        self.log.flush()
    }

    /// A new instance: InitProducerId of the transactional id (every older
    /// producer of the id is fenced), logged before it is sent and once it
    /// is answered. Both events get a millisecond of their own, so the
    /// checker can order them against this worker's other events by time.
    async fn init(&mut self) -> Result<Producer> {
        next_ms().await;
        self.log.ev(&Event::Init {
            ms: now_ms(),
            transactional_id: self.a.transactional_id.clone(),
        })?;
        self.log.flush()?;
        let start = Instant::now();
        loop {
            let config = ProducerConfig {
                topic: self.a.output.clone(),
                acks: Acks::All,
                compression: Compression::None,
                transactional_id: Some(self.a.transactional_id.clone()),
            };
            let r = Producer::init(self.cluster().await?, config).await;
            match r {
                Ok(p) => {
                    self.log.ev(&Event::Ready { ms: now_ms() })?;
                    self.log.flush()?;
                    next_ms().await;
                    return Ok(p);
                }
                Err(e) if start.elapsed() >= STEP_LIMIT => return Err(e).context("InitProducerId"),
                Err(e) => {
                    self.note("InitProducerId", &e);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }

    /// Ends the open transaction at EndTxn version `max_version` at most,
    /// sending the same end again after a lost connection.
    async fn end(&mut self, p: &mut Producer, commit: bool, max_version: i16) -> Result<End> {
        let start = Instant::now();
        loop {
            if !parent_alive() {
                bail!("the auditor is gone");
            }
            let r = p
                .end_txn_at(self.cluster().await?, commit, max_version)
                .await;
            match r {
                Ok(Some(v)) => return Ok(End::Done(v)),
                Ok(None) => return Ok(End::NoAnswer("no transaction was open".into())),
                Err(e @ ClientError::Kafka { .. }) => return Ok(End::Refused(e)),
                Err(e) if start.elapsed() >= STEP_LIMIT => return Ok(End::NoAnswer(e.to_string())),
                Err(e) => {
                    self.note("EndTxn", &e);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }

    async fn run(mut self) -> Result<i32> {
        let mut p = self.init().await?;
        let max_end = self
            .cluster()
            .await?
            .bootstrap()
            .version(ApiKey::EndTxn, (0, 5))
            .unwrap_or(4);
        let tid = self.a.transactional_id.clone();
        let topic = self.a.output.clone();
        let mut seq = 0u64;
        let mut txn = 0u64;
        loop {
            if self.a.stop_file.exists() || !parent_alive() {
                return self.exit("stopped", 0);
            }
            txn += 1;
            self.log.ev(&Event::Begin { txn, ms: now_ms() })?;
            let k = 1 + self.rng.below(self.a.txn_records.max(1) as u64);
            let mut records: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
            let mut values: BTreeMap<i32, Vec<String>> = BTreeMap::new();
            for _ in 0..k {
                seq += 1;
                let value = format!("v{}.{seq}", self.a.process);
                let partition = self.rng.below(self.a.output_partitions.max(1) as u64) as i32;
                self.log.ev(&Event::Send {
                    txn,
                    topic: topic.clone(),
                    partition,
                    key: value.clone(),
                    value: value.clone(),
                })?;
                records.entry(partition).or_default().push(record(&value));
                values.entry(partition).or_default().push(value);
            }
            // The sends are logged before any of them can become visible.
            self.log.flush()?;
            let sent = p.send(self.cluster().await?, records).await;
            let acked = match sent {
                Ok(acked) => acked,
                Err(e) => {
                    // Never asked to commit, so it cannot commit: the next
                    // instance's InitProducerId (or a successor's) aborts it.
                    self.end_event(txn, Outcome::Aborted)?;
                    if fenced(&e) {
                        return self.exit(&format!("produce: {e}"), 3);
                    }
                    self.note("produce", &e);
                    p = self.init().await?;
                    continue;
                }
            };
            let mut offsets: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
            for a in &acked {
                offsets.entry(a.partition).or_default().push(a.offset);
            }
            let identity = (p.producer_id(), p.epoch());
            let commit = !(self.a.abort_every > 0 && self.rng.below(self.a.abort_every) == 0);
            let max_version = if max_end >= 5 && self.rng.below(2) == 0 {
                max_end
            } else {
                max_end.min(4)
            };
            if commit {
                self.log.ev(&Event::Commit { txn, ms: now_ms() })?;
                self.log.flush()?;
            }
            let end = self.end(&mut p, commit, max_version).await?;
            for (partition, vals) in values {
                let offs = offsets.remove(&partition).unwrap_or_default();
                for (value, offset) in vals.into_iter().zip(offs) {
                    self.log.ev(&Event::Ack { txn, value, offset })?;
                }
            }
            let lost_at_end = self.lost;
            let ended_with = match end {
                End::Done(v) => v,
                End::Refused(e) => {
                    // A refused commit may still have taken effect by an
                    // earlier try whose answer was lost: unknown.
                    let outcome = if commit {
                        Outcome::Indeterminate
                    } else {
                        Outcome::Aborted
                    };
                    self.end_event(txn, outcome)?;
                    let code = if fenced(&e) { 3 } else { 4 };
                    return self.exit(&format!("EndTxn: {e}"), code);
                }
                End::NoAnswer(why) => {
                    let outcome = if commit {
                        Outcome::Indeterminate
                    } else {
                        Outcome::Aborted
                    };
                    self.end_event(txn, outcome)?;
                    return self.exit(&format!("EndTxn: {why}"), 4);
                }
            };
            let outcome = if commit {
                Outcome::Committed
            } else {
                Outcome::Aborted
            };
            self.end_event(txn, outcome)?;
            if self.rng.below(2) == 0 {
                let hi = if ended_with >= 5 {
                    max_end
                } else {
                    max_end.min(4)
                };
                let mut checks = [(commit, 1), (commit, hi), (!commit, 1), (!commit, hi)];
                for i in (1..checks.len()).rev() {
                    checks.swap(i, self.rng.below(i as u64 + 1) as usize);
                }
                let fence_at = if self.rng.below(6) == 0 {
                    Some(self.rng.below(checks.len() as u64 + 1) as usize)
                } else {
                    None
                };
                if self.rng.below(3) == 0 {
                    let ms = self.rng.below(2000);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                for (i, (c, v)) in checks.into_iter().enumerate() {
                    if fence_at == Some(i) {
                        p = self.init().await?;
                    }
                    self.re_end(&tid, txn, identity, c, v, lost_at_end).await?;
                }
                if fence_at == Some(checks.len()) {
                    p = self.init().await?;
                }
            }
        }
    }

    /// A restored committer's EndTxn for transaction `txn`, ended under
    /// `(pid, epoch)`: asks for `commit` at version `version` (at most),
    /// retries lost connections and retriable answers, logs the answer.
    async fn re_end(
        &mut self,
        tid: &str,
        txn: u64,
        (pid, epoch): (i64, i16),
        commit: bool,
        version: i16,
        lost_at_end: u64,
    ) -> Result<()> {
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(tid.to_string())))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_committed(commit);
        let sent_ms = now_ms();
        let start = Instant::now();
        let mut sent_version = version;
        let answer = loop {
            if !parent_alive() {
                bail!("the auditor is gone");
            }
            let r = send_end(self.cluster().await?, tid, &req, version).await;
            match r {
                Ok((code, v)) => {
                    sent_version = v;
                    if !retriable(code) || start.elapsed() >= STEP_LIMIT {
                        break Some(code);
                    }
                }
                Err(e) => {
                    self.note("re-sent EndTxn", &e);
                    if start.elapsed() >= STEP_LIMIT {
                        break None;
                    }
                }
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        };
        self.log.ev(&Event::Recommit {
            txn,
            transactional_id: tid.to_string(),
            commit,
            version: sent_version,
            producer_id: pid,
            epoch,
            sent_ms,
            answered_ms: now_ms(),
            error_code: answer,
            reconnected: self.lost > lost_at_end,
        })?;
        self.log.flush()
    }
}

/// Waits until the clock has moved past the current millisecond.
async fn next_ms() {
    let now = now_ms();
    while now_ms() <= now {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// One EndTxn to the transaction coordinator of `tid`, at `version` at
/// most: its error code and the version sent.
async fn send_end(
    c: &mut Cluster,
    tid: &str,
    req: &EndTxnRequest,
    version: i16,
) -> Result<(i16, i16), ClientError> {
    let node = c.coordinator(tid, CoordinatorType::Transaction).await?;
    let (r, v) = c
        .node(node)
        .await?
        .call_max::<_, EndTxnResponse>(ApiKey::EndTxn, req, version)
        .await?;
    Ok((r.error_code, v))
}

fn record(value: &str) -> Record {
    let v = Bytes::copy_from_slice(value.as_bytes());
    Record {
        transactional: false,
        control: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: now_ms() as i64,
        key: Some(v.clone()),
        value: Some(v),
        headers: Default::default(),
        delete_horizon: false,
    }
}
