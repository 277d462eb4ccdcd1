//! `oncelog audit`: runs a workload of worker processes against a cluster,
//! injects faults on a schedule, heals, reads everything back and checks the
//! history.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;

use crate::worker::{now_ms, Event, Rng};
use crate::{
    check, FinalRead, History, LivenessCheck, Op, Outcome, PartitionRead, Pause, ProducerInit,
    Read, Recommit, Txn,
};

#[derive(clap::Args, Debug, Clone)]
pub struct AuditArgs {
    /// copier (Kafka's transactional copier), queue (mixed send/poll
    /// transactions), zombie (paused producers must be fenced), compacted
    /// (transactional writers of a small key space into a compacted topic
    /// the broker cleans meanwhile: the final read must hold every key's
    /// latest committed value and no aborted value) or recommit (every
    /// other transaction's end is sent again with the producer id and epoch
    /// it was ended under, as a restored committer does: the same outcome
    /// must succeed, the other one and any end after a newer producer's
    /// InitProducerId must be refused).
    #[arg(long, default_value = "copier")]
    pub workload: String,
    /// Seconds of workload under faults (healing and checking come after).
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// The cluster to audit (with --broker-cmd: where that broker listens).
    #[arg(
        long,
        short = 'b',
        visible_alias = "bootstrap-server",
        alias = "brokers",
        default_value = "127.0.0.1:9092"
    )]
    pub bootstrap: String,
    /// Start and own the broker with this shell command, so broker faults
    /// (kill -9 + restart, SIGSTOP/SIGCONT) can be injected.
    #[arg(long)]
    pub broker_cmd: Option<String>,
    /// Faults to inject, comma separated: broker-kill, broker-pause,
    /// client-kill, zombie, disk-full (default: all that apply; "none" for none).
    #[arg(long)]
    pub faults: Option<String>,
    /// Quiet period between faults, milliseconds (min,max).
    #[arg(long, default_value = "3000,6000")]
    pub quiet_ms: String,
    /// Worker processes (each with its own transactional id).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Partitions of every topic of the workload.
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Copier: input records, written during the first 60% of the run.
    #[arg(long, default_value_t = 20_000)]
    pub records: u64,
    /// Records per transaction (copier: at most; others: up to).
    #[arg(long, default_value_t = 200)]
    pub txn_records: usize,
    /// Abort one transaction in this many on purpose.
    #[arg(long, default_value_t = 3)]
    pub abort_every: u64,
    #[arg(long, default_value_t = 10_000)]
    pub transaction_timeout_ms: u64,
    /// Data directory of the owned broker, for the disk-full fault (it must
    /// be a mount point this process may fill).
    #[arg(long)]
    pub disk_full_dir: Option<PathBuf>,
    /// Working directory for histories and logs (default: a new temp dir).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Prefix of topic names and transactional ids (default: unique per run).
    #[arg(long)]
    pub prefix: Option<String>,
}

/// The broker process the auditor owns.
struct OwnedBroker {
    cmd: String,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl OwnedBroker {
    fn start(&mut self, bootstrap: &str) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {}", self.cmd))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting the broker: {}", self.cmd))?;
        self.child = Some(child);
        wait_port(bootstrap, Duration::from_secs(60))
    }

    fn pid(&self) -> Option<Pid> {
        self.child.as_ref().map(|c| Pid::from_raw(c.id() as i32))
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.paused = false;
    }

    fn signal(&mut self, s: Signal) {
        if let Some(p) = self.pid() {
            let _ = kill(p, s);
            self.paused = s == Signal::SIGSTOP;
        }
    }

    /// Restarts the broker if it died on its own.
    fn ensure_running(&mut self, bootstrap: &str) -> Result<()> {
        if self.paused {
            self.signal(Signal::SIGCONT);
        }
        let dead = match self.child.as_mut() {
            None => true,
            Some(c) => c.try_wait().ok().flatten().is_some(),
        };
        if dead {
            eprintln!("audit: the broker is not running; starting it");
            self.child = None;
            self.start(bootstrap)?;
        }
        Ok(())
    }
}

fn wait_port(bootstrap: &str, limit: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        if let Ok(addrs) = std::net::ToSocketAddrs::to_socket_addrs(bootstrap) {
            for a in addrs {
                if TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok() {
                    return Ok(());
                }
            }
        }
        if start.elapsed() > limit {
            bail!("{bootstrap} did not accept connections within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Worker {
    process: u32,
    child: Child,
    history: PathBuf,
}

struct Slot {
    tid: String,
    partitions: Vec<i32>,
    current: Option<Worker>,
}

struct Run {
    a: AuditArgs,
    dir: PathBuf,
    stop_file: PathBuf,
    input: String,
    output: String,
    group: String,
    next_process: u32,
    slots: Vec<Slot>,
    /// Every worker history file, in process order.
    histories: Vec<(u32, PathBuf)>,
    /// Workers no longer current (killed, fenced, zombies) still to reap.
    retired: Vec<Worker>,
    broker: Option<OwnedBroker>,
    faults: BTreeMap<String, u64>,
    pauses: Vec<Pause>,
    rng: Rng,
    notes: Vec<String>,
    /// Copier: the input records whose delivery was confirmed.
    expected: Option<Vec<u64>>,
}

/// Delivery outcomes of the seed records: (record number, delivered).
#[derive(Default)]
struct SeedAcks {
    done: std::sync::Mutex<Vec<(u64, bool)>>,
}

impl rdkafka::ClientContext for SeedAcks {}

impl rdkafka::producer::ProducerContext for SeedAcks {
    type DeliveryOpaque = usize;
    fn delivery(&self, r: &rdkafka::producer::DeliveryResult<'_>, n: usize) {
        if let Ok(mut d) = self.done.lock() {
            d.push((n as u64, r.is_ok()));
        }
    }
}

pub fn run(a: AuditArgs) -> i32 {
    match run_inner(a) {
        Ok(clean) => {
            if clean {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("audit: {e:#}");
            2
        }
    }
}

fn run_inner(a: AuditArgs) -> Result<bool> {
    if !matches!(
        a.workload.as_str(),
        "copier" | "queue" | "zombie" | "compacted" | "recommit"
    ) {
        bail!("--workload must be copier, queue, zombie, compacted or recommit");
    }
    let dir = match &a.workdir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("oncelog-audit-{}", now_ms())),
    };
    std::fs::create_dir_all(&dir)?;
    let prefix = a
        .prefix
        .clone()
        .unwrap_or_else(|| format!("audit-{}-{}", a.workload, now_ms() % 1_000_000));
    let (input, output) = match a.workload.as_str() {
        "copier" => (format!("{prefix}-in"), format!("{prefix}-out")),
        "queue" => (format!("{prefix}-q"), format!("{prefix}-q")),
        "compacted" => (String::new(), format!("{prefix}-c")),
        "recommit" => (String::new(), format!("{prefix}-r")),
        _ => (String::new(), format!("{prefix}-z")),
    };
    let stop_file = dir.join("stop");
    let _ = std::fs::remove_file(&stop_file);
    let mut r = Run {
        rng: Rng::new(a.seed),
        dir: dir.clone(),
        stop_file,
        input,
        output,
        group: format!("{prefix}-group"),
        next_process: 1,
        slots: Vec::new(),
        histories: Vec::new(),
        retired: Vec::new(),
        broker: a.broker_cmd.as_ref().map(|cmd| OwnedBroker {
            cmd: cmd.clone(),
            log: dir.join("broker.log"),
            child: None,
            paused: false,
        }),
        faults: BTreeMap::new(),
        pauses: Vec::new(),
        notes: Vec::new(),
        expected: None,
        a,
    };
    eprintln!(
        "audit: workload {} on {} for {} s; histories in {}",
        r.a.workload,
        r.a.bootstrap,
        r.a.duration,
        dir.display()
    );
    r.fault_kinds()?;
    parse_range(&r.a.quiet_ms)?;
    let bootstrap = r.a.bootstrap.clone();
    if let Some(b) = r.broker.as_mut() {
        b.start(&bootstrap)?;
    }
    let result = r.execute(&prefix);
    // Whatever happened: no process of ours is left behind.
    let _ = std::fs::write(&r.stop_file, b"stop");
    for s in &mut r.slots {
        if let Some(w) = s.current.take() {
            r.retired.push(w);
        }
    }
    for w in &mut r.retired {
        let _ = kill(Pid::from_raw(w.child.id() as i32), Signal::SIGCONT);
        let _ = w.child.kill();
        let _ = w.child.wait();
    }
    if let Some(b) = r.broker.as_mut() {
        b.signal(Signal::SIGCONT);
        if let Some(c) = b.child.as_mut() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(20);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        b.kill9();
    }
    result
}

impl Run {
    fn kafka_config(&self) -> ClientConfig {
        let mut c = crate::rdkafka_config();
        c.set("bootstrap.servers", &self.a.bootstrap);
        c
    }

    fn create_topics(&self) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = self
            .kafka_config()
            .create()
            .context("creating the admin client")?;
        let mut names = vec![self.output.clone()];
        if !self.input.is_empty() && self.input != self.output {
            names.push(self.input.clone());
        }
        // The compacted workload's topic: small segments, cleaned whenever
        // anything is dirty, markers and tombstones removed at once, so the
        // cleaner works all through the run.
        let compacted = self.a.workload == "compacted";
        let topics: Vec<NewTopic> = names
            .iter()
            .map(|n| {
                let t = NewTopic::new(n, self.a.partitions, TopicReplication::Fixed(1));
                if compacted {
                    t.set("cleanup.policy", "compact")
                        .set("segment.bytes", "16384")
                        .set("min.cleanable.dirty.ratio", "0.01")
                        .set("delete.retention.ms", "0")
                } else {
                    t
                }
            })
            .collect();
        let res = futures_executor::block_on(admin.create_topics(
            topics.iter(),
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        ))
        .context("creating topics")?;
        for r in res {
            match r {
                Ok(_) => {}
                Err((t, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {
                    bail!("topic {t} already exists: use a fresh --prefix")
                }
                Err((t, e)) => bail!("creating topic {t}: {e}"),
            }
        }
        Ok(())
    }

    /// Copier: writes the input records with an idempotent producer, spread
    /// over the first part of the run so the copiers always have work while
    /// faults happen. Returns the thread; it yields the numbers of the
    /// records whose delivery was confirmed.
    fn start_seeder(&mut self) -> Result<std::thread::JoinHandle<Result<Vec<u64>>>> {
        let path = self.dir.join("p0-seed.jsonl");
        self.histories.push((0, path.clone()));
        let records = self.a.records;
        let partitions = self.a.partitions.max(1) as u64;
        let topic = self.input.clone();
        let spread = Duration::from_millis(self.a.duration * 600);
        let p: ThreadedProducer<SeedAcks> = self
            .kafka_config()
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "300000")
            .create_with_context(SeedAcks::default())
            .context("creating the seed producer")?;
        Ok(std::thread::spawn(move || {
            let mut out = std::io::BufWriter::new(File::create(&path)?);
            let start = Instant::now();
            for n in 0..records {
                let due = spread.mul_f64(n as f64 / records.max(1) as f64);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    out.flush()?;
                    std::thread::sleep(wait);
                }
                let part = (n % partitions) as i32;
                let value = format!("i{n}");
                let key = format!("in-{n}");
                for ev in [
                    Event::Begin {
                        txn: n + 1,
                        ms: now_ms(),
                    },
                    Event::Send {
                        txn: n + 1,
                        topic: topic.clone(),
                        partition: part,
                        key: key.clone(),
                        value: value.clone(),
                    },
                ] {
                    serde_json::to_writer(&mut out, &ev)?;
                    out.write_all(b"\n")?;
                }
                out.flush()?;
                let mut rec = BaseRecord::with_opaque_to(&topic, n as usize)
                    .partition(part)
                    .key(key.as_bytes())
                    .payload(value.as_bytes());
                loop {
                    match p.send(rec) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(_), r)) => {
                            std::thread::sleep(Duration::from_millis(5));
                            rec = r;
                        }
                        Err((e, _)) => bail!("seeding: {e}"),
                    }
                }
            }
            if let Err(e) = p.flush(Duration::from_secs(300)) {
                eprintln!("audit: seeding: flush: {e}");
            }
            let done = p
                .context()
                .done
                .lock()
                .map(|d| d.clone())
                .unwrap_or_default();
            let mut ok = Vec::new();
            for (n, delivered) in done {
                serde_json::to_writer(
                    &mut out,
                    &Event::End {
                        txn: n + 1,
                        ms: now_ms(),
                        outcome: if delivered {
                            Outcome::Committed
                        } else {
                            Outcome::Indeterminate
                        },
                    },
                )?;
                out.write_all(b"\n")?;
                if delivered {
                    ok.push(n);
                }
            }
            out.flush()?;
            Ok(ok)
        }))
    }

    fn spawn(&mut self, slot: usize) -> Result<()> {
        let process = self.next_process;
        self.next_process += 1;
        let history = self.dir.join(format!("p{process}.jsonl"));
        let log = File::create(self.dir.join(format!("p{process}.log")))?;
        let s = &self.slots[slot];
        let parts: Vec<String> = s.partitions.iter().map(|p| p.to_string()).collect();
        let exe = std::env::current_exe().context("locating this executable")?;
        let child = Command::new(exe)
            .arg("audit-worker")
            .args(["--bootstrap", &self.a.bootstrap])
            .args(["--workload", &self.a.workload])
            .args(["--transactional-id", &s.tid])
            .arg("--history")
            .arg(&history)
            .arg("--stop-file")
            .arg(&self.stop_file)
            .args(["--input", &self.input])
            .args(["--output", &self.output])
            .args(["--partitions", &parts.join(",")])
            .args(["--output-partitions", &self.a.partitions.to_string()])
            .args(["--group", &self.group])
            .args(["--txn-records", &self.a.txn_records.to_string()])
            .args(["--abort-every", &self.a.abort_every.to_string()])
            .args([
                "--transaction-timeout-ms",
                &self.a.transaction_timeout_ms.to_string(),
            ])
            .args(["--process", &process.to_string()])
            .args(["--seed", &self.a.seed.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting a worker")?;
        self.histories.push((process, history.clone()));
        self.slots[slot].current = Some(Worker {
            process,
            child,
            history,
        });
        Ok(())
    }

    fn execute(&mut self, prefix: &str) -> Result<bool> {
        self.create_topics()?;
        let seeder = if self.a.workload == "copier" {
            Some(self.start_seeder()?)
        } else {
            None
        };
        let workers = self.a.workers.max(1);
        for i in 0..workers {
            let partitions = (0..self.a.partitions)
                .filter(|p| (*p as usize) % workers == i)
                .collect();
            self.slots.push(Slot {
                tid: format!("{prefix}-tx-{i}"),
                partitions,
                current: None,
            });
            self.spawn(i)?;
        }
        let kinds = self.fault_kinds()?;
        let (qmin, qmax) = parse_range(&self.a.quiet_ms)?;
        let start = Instant::now();
        let end = start + Duration::from_secs(self.a.duration);
        let mut next_fault = start + Duration::from_millis(qmin + self.rng.below(qmax - qmin + 1));
        let mut next_progress = start + Duration::from_secs(5);
        let mut k = 0usize;
        while Instant::now() < end {
            self.reap()?;
            let now = Instant::now();
            if now >= next_progress {
                self.progress(start);
                next_progress = now + Duration::from_secs(5);
            }
            if !kinds.is_empty() && now >= next_fault {
                let kind = kinds[k % kinds.len()].clone();
                k += 1;
                if let Err(e) = self.inject(&kind) {
                    self.notes.push(format!("fault {kind} failed: {e:#}"));
                    eprintln!("audit: fault {kind} failed: {e:#}");
                }
                next_fault =
                    Instant::now() + Duration::from_millis(qmin + self.rng.below(qmax - qmin + 1));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.progress(start);
        eprintln!("audit: stopping the workload and healing");
        self.heal()?;
        if let Some(s) = seeder {
            let ok = s.join().map_err(|_| anyhow!("the seeder panicked"))??;
            if ok.len() as u64 != self.a.records {
                self.notes.push(format!(
                    "seeding: {} of {} input records confirmed; only those are expected",
                    ok.len(),
                    self.a.records
                ));
            }
            self.expected = Some(ok);
        }
        let _ = std::fs::write(&self.stop_file, b"stop");
        self.stop_workers(Duration::from_secs(60));
        let history = self.history()?;
        let report = check(&history);
        let counts = report.anomaly_counts();
        let json = json!({
            "workload": self.a.workload,
            "bootstrap": self.a.bootstrap,
            "duration_s": self.a.duration,
            "records": report.records,
            "txns_committed": report.txns_committed,
            "txns_aborted": report.txns_aborted,
            "txns_indeterminate": report.txns_indeterminate,
            "plain_writes": report.plain_writes,
            "poll_reads": report.poll_reads,
            "final_reads": report.final_reads,
            "recommits_checked": report.recommits_checked,
            "recommits_must_succeed": report.recommits_must_succeed,
            "recommits_must_refuse": report.recommits_must_refuse,
            "recommits_after_reconnect": report.recommits_after_reconnect,
            "recommits_skipped": report.recommits_skipped,
            "faults": self.faults,
            "anomalies": counts,
            "anomaly_examples": report.anomalies.iter().map(|(k, v)| (k.clone(),
                v.iter().take(5).map(|a| a.detail.clone()).collect::<Vec<_>>())).collect::<BTreeMap<_, _>>(),
            "liveness": history.liveness.iter().map(|l| json!({"topic": l.topic, "partition": l.partition,
                "waited_ms": l.waited_ms, "limit_ms": l.limit_ms, "reached": l.reached,
                "stalled_ms": l.stalled_ms})).collect::<Vec<_>>(),
            "notes": self.notes,
            "workdir": self.dir,
        });
        // The summary on stdout, which may have been closed (`| head`):
        // then it is dropped, and the report file is still written.
        let mut text = format!("{}\n", report.summary());
        if !self.notes.is_empty() {
            text.push_str("notes:\n");
            for n in &self.notes {
                text.push_str(&format!("  {n}\n"));
            }
        }
        {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        }
        if let Some(path) = &self.a.report {
            std::fs::write(path, serde_json::to_string_pretty(&json)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        std::fs::write(
            self.dir.join("history.json"),
            serde_json::to_string(&history)?,
        )?;
        Ok(report.is_clean())
    }

    fn fault_kinds(&self) -> Result<Vec<String>> {
        let all = ["broker-kill", "zombie", "client-kill", "broker-pause"];
        let owned = self.broker.is_some();
        let wanted: Vec<String> = match &self.a.faults {
            Some(f) if f == "none" => vec![],
            Some(f) => f.split(',').map(|s| s.trim().to_string()).collect(),
            None => all
                .iter()
                .filter(|k| owned || !k.starts_with("broker"))
                .map(|s| s.to_string())
                .chain(self.a.disk_full_dir.iter().map(|_| "disk-full".to_string()))
                .collect(),
        };
        for k in &wanted {
            match k.as_str() {
                "broker-kill" | "broker-pause" if !owned => {
                    bail!("fault {k} needs --broker-cmd (the auditor must own the broker)")
                }
                "disk-full" if self.a.disk_full_dir.is_none() || !owned => {
                    bail!("fault disk-full needs --broker-cmd and --disk-full-dir")
                }
                "broker-kill" | "broker-pause" | "client-kill" | "zombie" | "disk-full" => {}
                other => bail!("unknown fault {other}"),
            }
        }
        Ok(wanted)
    }

    fn count(&mut self, kind: &str) {
        *self.faults.entry(kind.to_string()).or_default() += 1;
    }

    fn inject(&mut self, kind: &str) -> Result<()> {
        let bootstrap = self.a.bootstrap.clone();
        match kind {
            "broker-kill" => {
                let b = self.broker.as_mut().ok_or_else(|| anyhow!("no broker"))?;
                b.kill9();
                eprintln!("audit: fault: broker kill -9");
                std::thread::sleep(Duration::from_millis(500 + self.rng.below(1500)));
                let b = self.broker.as_mut().ok_or_else(|| anyhow!("no broker"))?;
                b.start(&bootstrap)?;
                self.count(kind);
            }
            "broker-pause" => {
                let ms = 1500 + self.rng.below(2500);
                let b = self.broker.as_mut().ok_or_else(|| anyhow!("no broker"))?;
                b.signal(Signal::SIGSTOP);
                eprintln!("audit: fault: broker SIGSTOP for {ms} ms");
                std::thread::sleep(Duration::from_millis(ms));
                let b = self.broker.as_mut().ok_or_else(|| anyhow!("no broker"))?;
                b.signal(Signal::SIGCONT);
                self.count(kind);
            }
            "client-kill" => {
                let slot = self.rng.below(self.slots.len() as u64) as usize;
                if let Some(mut w) = self.slots[slot].current.take() {
                    let _ = w.child.kill();
                    let _ = w.child.wait();
                    eprintln!("audit: fault: worker {} kill -9", w.process);
                    self.retired.push(w);
                }
                self.spawn(slot)?;
                self.count(kind);
            }
            "zombie" => {
                let slot = self.rng.below(self.slots.len() as u64) as usize;
                let Some(old) = self.slots[slot].current.take() else {
                    return self.spawn(slot);
                };
                let pid = Pid::from_raw(old.child.id() as i32);
                kill(pid, Signal::SIGSTOP).context("SIGSTOP of a worker")?;
                let paused_ms = now_ms();
                // Stopped: its history holds everything it did before.
                let initialised = wait_ready(&old.history, Duration::ZERO);
                eprintln!(
                    "audit: fault: worker {} paused; its successor takes its transactional id",
                    old.process
                );
                self.spawn(slot)?;
                let new_hist = self.slots[slot]
                    .current
                    .as_ref()
                    .map(|w| w.history.clone())
                    .ok_or_else(|| anyhow!("no successor"))?;
                let ready = wait_ready(&new_hist, Duration::from_secs(60));
                let fenced_ms = now_ms();
                if !ready {
                    self.notes.push(format!(
                        "zombie: the successor of worker {} was not ready within 60 s",
                        old.process
                    ));
                }
                std::thread::sleep(Duration::from_millis(1000 + self.rng.below(1000)));
                kill(pid, Signal::SIGCONT).context("SIGCONT of a worker")?;
                let resumed_ms = now_ms();
                self.pauses.push(Pause {
                    process: old.process,
                    paused_ms,
                    fenced_ms,
                    resumed_ms,
                    initialised,
                });
                self.retired.push(old);
                self.count(kind);
            }
            "disk-full" => {
                let dir = self
                    .a
                    .disk_full_dir
                    .clone()
                    .ok_or_else(|| anyhow!("no --disk-full-dir"))?;
                let filler = dir.join("audit-filler");
                eprintln!("audit: fault: filling {}", dir.display());
                fill(&filler)?;
                std::thread::sleep(Duration::from_millis(2000 + self.rng.below(2000)));
                std::fs::remove_file(&filler)?;
                self.count(kind);
            }
            other => bail!("unknown fault {other}"),
        }
        Ok(())
    }

    /// Respawns the worker of a slot that exited on its own; reaps retired ones.
    fn reap(&mut self) -> Result<()> {
        self.retired
            .retain_mut(|w| w.child.try_wait().ok().flatten().is_none());
        for i in 0..self.slots.len() {
            let exited = match self.slots[i].current.as_mut() {
                Some(w) => w.child.try_wait().ok().flatten(),
                None => None,
            };
            if let Some(status) = exited {
                let p = self.slots[i].current.as_ref().map(|w| w.process);
                let msg = format!(
                    "worker {} exited on its own ({status}); restarted",
                    p.unwrap_or(0)
                );
                eprintln!("audit: {msg}");
                self.notes.push(msg);
                self.slots[i].current = None;
                self.spawn(i)?;
            }
        }
        Ok(())
    }

    fn progress(&self, start: Instant) {
        let mut committed = 0u64;
        let mut aborted = 0u64;
        for (process, path) in &self.histories {
            if *process == 0 {
                continue; // the copier's input writes are not transactions
            }
            if let Ok(f) = File::open(path) {
                for line in BufReader::new(f).lines().map_while(Result::ok) {
                    if line.contains("\"ev\":\"end\"") {
                        if line.contains("\"committed\"") {
                            committed += 1;
                        } else if line.contains("\"aborted\"") {
                            aborted += 1;
                        }
                    }
                }
            }
        }
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        eprintln!(
            "audit: {:>4} s  txns committed {committed} aborted {aborted}  faults: {}",
            start.elapsed().as_secs(),
            if faults.is_empty() {
                "none".to_string()
            } else {
                faults.join(", ")
            }
        );
    }

    fn heal(&mut self) -> Result<()> {
        for w in &self.retired {
            let _ = kill(Pid::from_raw(w.child.id() as i32), Signal::SIGCONT);
        }
        let bootstrap = self.a.bootstrap.clone();
        if let Some(b) = self.broker.as_mut() {
            b.ensure_running(&bootstrap)?;
        }
        Ok(())
    }

    fn stop_workers(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut all: Vec<Worker> = self.retired.drain(..).collect();
        for s in &mut self.slots {
            if let Some(w) = s.current.take() {
                all.push(w);
            }
        }
        for w in &mut all {
            loop {
                if w.child.try_wait().ok().flatten().is_some() {
                    break;
                }
                if Instant::now() >= deadline {
                    self.notes.push(format!(
                        "worker {} did not stop within {limit:?}: killed",
                        w.process
                    ));
                    let _ = w.child.kill();
                    let _ = w.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Merges the worker histories and reads every partition back.
    fn history(&mut self) -> Result<History> {
        let mut txns = Vec::new();
        let mut producer_inits = Vec::new();
        let mut recommits = Vec::new();
        for (process, path) in &self.histories {
            txns.extend(parse_history(*process, path)?);
            let (inits, ends) = parse_recommits(*process, path)?;
            producer_inits.extend(inits);
            recommits.extend(ends);
        }
        let mut topics = vec![self.output.clone()];
        if !self.input.is_empty() && self.input != self.output {
            topics.push(self.input.clone());
        }
        let limit = self.a.transaction_timeout_ms + 30_000;
        let (final_read, liveness) =
            final_read(&self.a.bootstrap, &topics, self.a.partitions, limit)?;
        let expected_keys = self
            .expected
            .as_ref()
            .map(|ns| ns.iter().map(|n| format!("out-{n}")).collect());
        Ok(History {
            txns,
            final_read: Some(final_read),
            liveness,
            expected_keys,
            faults: self.faults.clone(),
            pauses: self.pauses.clone(),
            compacted: self.a.workload == "compacted",
            producer_inits,
            recommits,
        })
    }
}

fn parse_range(s: &str) -> Result<(u64, u64)> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| anyhow!("expected MIN,MAX, got {s}"))?;
    let (a, b): (u64, u64) = (a.trim().parse()?, b.trim().parse()?);
    Ok((a.min(b), a.max(b)))
}

/// Whether a worker's history says its producer is initialised, looking
/// for up to `limit` (at least once).
fn wait_ready(history: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    loop {
        if std::fs::read_to_string(history)
            .map(|s| s.contains("\"ev\":\"ready\""))
            .unwrap_or(false)
        {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes zeros until the filesystem refuses.
fn fill(path: &Path) -> Result<()> {
    let mut f = File::create(path)?;
    let chunk = vec![0u8; 1 << 20];
    loop {
        if f.write_all(&chunk).is_err() {
            return Ok(());
        }
    }
}

/// Reads one worker's history file into transactions.
pub fn parse_history(process: u32, path: &Path) -> Result<Vec<Txn>> {
    let f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut txns: BTreeMap<u64, Txn> = BTreeMap::new();
    let mut last_ms = 0u64;
    let transactional = process != 0;
    for line in BufReader::new(f).lines() {
        let line = line?;
        // A kill -9 can cut the last line short.
        let Ok(ev) = serde_json::from_str::<Event>(&line) else {
            continue;
        };
        let id = |t: u64| ((process as u64) << 32) | t;
        match ev {
            Event::Ready { ms } | Event::Exit { ms, .. } | Event::Init { ms, .. } => {
                last_ms = last_ms.max(ms)
            }
            Event::Recommit { answered_ms, .. } => last_ms = last_ms.max(answered_ms),
            Event::Begin { txn, ms } => {
                last_ms = last_ms.max(ms);
                txns.insert(
                    txn,
                    Txn {
                        id: id(txn),
                        process,
                        transactional,
                        ops: Vec::new(),
                        outcome: Outcome::Indeterminate,
                        start_ms: ms,
                        commit_ms: None,
                        end_ms: ms,
                    },
                );
            }
            Event::Send {
                txn,
                topic,
                partition,
                key,
                value,
            } => {
                if let Some(t) = txns.get_mut(&txn) {
                    t.ops.push(Op::Send {
                        topic,
                        partition,
                        key,
                        value,
                        offset: None,
                    });
                }
            }
            Event::Poll { txn, ms, reads } => {
                last_ms = last_ms.max(ms);
                if let Some(t) = txns.get_mut(&txn) {
                    t.ops.push(Op::Poll {
                        at_ms: ms,
                        reads: reads
                            .into_iter()
                            .map(|(topic, partition, offset, value)| Read {
                                topic,
                                partition,
                                offset,
                                value,
                            })
                            .collect(),
                    });
                }
            }
            Event::Ack { txn, value, offset } => {
                if let Some(t) = txns.get_mut(&txn) {
                    for op in &mut t.ops {
                        if let Op::Send {
                            value: v,
                            offset: o,
                            ..
                        } = op
                        {
                            if *v == value {
                                *o = Some(offset);
                            }
                        }
                    }
                }
            }
            Event::Commit { txn, ms } => {
                last_ms = last_ms.max(ms);
                if let Some(t) = txns.get_mut(&txn) {
                    t.commit_ms = Some(ms);
                }
            }
            Event::End { txn, ms, outcome } => {
                last_ms = last_ms.max(ms);
                if let Some(t) = txns.get_mut(&txn) {
                    t.outcome = outcome;
                    t.end_ms = ms;
                }
            }
        }
    }
    Ok(txns
        .into_values()
        .map(|mut t| {
            if t.outcome == Outcome::Indeterminate {
                t.end_ms = t.end_ms.max(last_ms);
            }
            t
        })
        .collect())
}

/// Reads the InitProducerId requests and re-sent EndTxn requests of one
/// worker's history file (the `recommit` workload logs them).
pub fn parse_recommits(process: u32, path: &Path) -> Result<(Vec<ProducerInit>, Vec<Recommit>)> {
    let f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut inits: Vec<ProducerInit> = Vec::new();
    let mut recommits = Vec::new();
    for line in BufReader::new(f).lines() {
        let line = line?;
        let Ok(ev) = serde_json::from_str::<Event>(&line) else {
            continue;
        };
        match ev {
            Event::Init {
                ms,
                transactional_id,
            } => inits.push(ProducerInit {
                process,
                transactional_id,
                started_ms: ms,
                ready_ms: None,
            }),
            Event::Ready { ms } => {
                if let Some(i) = inits.last_mut().filter(|i| i.ready_ms.is_none()) {
                    i.ready_ms = Some(ms);
                }
            }
            Event::Recommit {
                txn,
                transactional_id,
                commit,
                version,
                producer_id,
                epoch,
                sent_ms,
                answered_ms,
                error_code,
                reconnected,
            } => recommits.push(Recommit {
                txn: ((process as u64) << 32) | txn,
                process,
                transactional_id,
                commit,
                version,
                producer_id,
                epoch,
                sent_ms,
                answered_ms,
                error_code,
                reconnected,
            }),
            _ => {}
        }
    }
    Ok((inits, recommits))
}

/// Reads every partition of `topics` with a read_committed consumer until
/// it reaches the high watermark (liveness), within `limit_ms`.
fn final_read(
    bootstrap: &str,
    topics: &[String],
    partitions: i32,
    limit_ms: u64,
) -> Result<(FinalRead, Vec<LivenessCheck>)> {
    let c: BaseConsumer = crate::rdkafka_config()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "oncelog-audit-final-read")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .context("creating the final reader")?;
    let mut tpl = TopicPartitionList::new();
    for t in topics {
        for p in 0..partitions {
            tpl.add_partition_offset(t, p, Offset::Beginning)
                .map_err(|e| anyhow!("{e}"))?;
        }
    }
    c.assign(&tpl).context("assigning the final reader")?;
    // High watermarks come from a client of their own: a broker answers a
    // connection's requests in order, so on the reader's connections each
    // ListOffsets would wait behind a long-poll Fetch (fetch.wait.max.ms) once
    // the reader's fetchers are at the end of the log.
    let marks: BaseConsumer = crate::rdkafka_config()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "oncelog-audit-final-read")
        .set("enable.auto.commit", "false")
        .create()
        .context("creating the final reader's watermark client")?;
    // It reads until every partition reached its high watermark, or until
    // it went `limit_ms` without progress (a record read, or a read
    // position moved): a consumer stuck that long fails the liveness check,
    // one working through a long backlog does not. Ten limits at most.
    let start = Instant::now();
    let limit = Duration::from_millis(limit_ms);
    let mut reads: BTreeMap<(String, i32), Vec<Read>> = BTreeMap::new();
    // (ms to reach, high watermark, position, longest stall while pending)
    let mut done: BTreeMap<(String, i32), (u64, i64, i64, u64)> = BTreeMap::new();
    let mut positions: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let total = topics.len() * partitions as usize;
    let mut last_check: Option<Instant> = None;
    let mut progress = Instant::now();
    let mut longest_stall = Duration::ZERO;
    while done.len() < total && progress.elapsed() < limit && start.elapsed() < limit * 10 {
        longest_stall = longest_stall.max(progress.elapsed());
        // Every partition whose read position reached its high watermark is
        // done; check on end-of-partition events and twice a second.
        if last_check.is_none_or(|t| t.elapsed() > Duration::from_millis(500)) {
            if let Ok(pos) = c.position() {
                for e in pos.elements() {
                    let key = (e.topic().to_string(), e.partition());
                    if done.contains_key(&key) {
                        continue;
                    }
                    let Offset::Offset(at) = e.offset() else {
                        continue;
                    };
                    if positions
                        .insert(key.clone(), at)
                        .is_some_and(|was| was < at)
                    {
                        progress = Instant::now();
                    }
                    if let Ok((_, hw)) =
                        marks.fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(10))
                    {
                        if at >= hw {
                            let stall = longest_stall.as_millis() as u64;
                            done.insert(key, (start.elapsed().as_millis() as u64, hw, at, stall));
                        }
                    }
                }
            }
            // From the check's end: a slow check must not leave the reader
            // one message per check.
            last_check = Some(Instant::now());
        }
        match c.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => {
                progress = Instant::now();
                let v = m
                    .payload()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                reads
                    .entry((m.topic().to_string(), m.partition()))
                    .or_default()
                    .push(Read {
                        topic: m.topic().to_string(),
                        partition: m.partition(),
                        offset: m.offset(),
                        value: v,
                    });
            }
            Some(Err(e)) => eprintln!("audit: final read: {e}"),
        }
    }
    let mut fr = FinalRead::default();
    let mut liveness = Vec::new();
    for t in topics {
        for p in 0..partitions {
            let key = (t.clone(), p);
            let rs = reads.remove(&key).unwrap_or_default();
            let (waited, hw, lso, reached, stalled) = match done.get(&key) {
                Some((w, hw, at, stall)) => (*w, *hw, *at, true, *stall),
                None => {
                    let hw = marks
                        .fetch_watermarks(t, p, Duration::from_secs(10))
                        .map(|x| x.1)
                        .unwrap_or(-1);
                    let stall = longest_stall.max(progress.elapsed()).as_millis() as u64;
                    (start.elapsed().as_millis() as u64, hw, -1, false, stall)
                }
            };
            liveness.push(LivenessCheck {
                topic: t.clone(),
                partition: p,
                waited_ms: waited,
                limit_ms,
                reached,
                stalled_ms: Some(stalled),
            });
            fr.partitions.push(PartitionRead {
                topic: t.clone(),
                partition: p,
                high_watermark: hw,
                lso,
                reads: rs,
            });
        }
    }
    Ok((fr, liveness))
}
