//! `oncelog produce`: stdin lines as records (keys, headers, optionally in
//! transactions), sent by the client crate's [`Producer`].

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, TimestampType};
use oncelog_broker::now_ms;
use oncelog_client::{
    key_partition, Acks, ClientError, Cluster, Producer, ProducerConfig, ResponseError,
};
use serde_json::{json, Value};

use super::progress::Progress;
use super::s;

#[derive(clap::Args)]
pub struct ProduceArgs {
    /// Topic to write to (auto-created where the cluster allows it).
    pub topic: String,
    /// Write every record to this partition (default: by key hash, or
    /// round-robin per batch without keys).
    #[arg(long, short = 'p')]
    pub partition: Option<i32>,
    /// Split each input line into key and value at the first SEP (`-K` as kcat's).
    #[arg(long, short = 'K', value_name = "SEP")]
    pub key_separator: Option<String>,
    /// A header on every record, repeatable: --header source=cli
    #[arg(long = "header", value_name = "KEY=VALUE")]
    pub headers: Vec<String>,
    /// Write inside transactions of this transactional id.
    #[arg(long)]
    pub transactional_id: Option<String>,
    /// Records per transaction with --transactional-id (0: one for all input).
    #[arg(long, default_value_t = 0)]
    pub transaction_records: u64,
    /// End the transactions with an abort instead of a commit.
    #[arg(long)]
    pub abort: bool,
    /// Acknowledgement: all (idempotent, the default) or 1.
    #[arg(long, default_value = "all")]
    pub acks: String,
    /// none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "none")]
    pub compression: String,
    /// Records per produce request (at most).
    #[arg(long, default_value_t = 1000)]
    pub batch_records: usize,
    /// Send a line at most this many milliseconds after it was read (records
    /// read meanwhile go in the same request), as Kafka's `linger.ms`.
    #[arg(long, default_value_t = 5)]
    pub linger_ms: u64,
    /// Print each acknowledged record's partition and offset on stdout
    /// (`Produced to partition 0 at offset 3 ...`, or a JSON object per record with --json).
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Report progress on stderr every second (on by default when stderr is a
    /// terminal and stdin is not).
    #[arg(long)]
    pub progress: bool,
}

/// The producer the arguments ask for.
fn producer_config(a: &ProduceArgs) -> Result<ProducerConfig> {
    let acks = match a.acks.as_str() {
        "all" | "-1" => Acks::All,
        "1" => Acks::Leader,
        other => bail!("--acks must be all or 1, not {other}"),
    };
    let compression = match a.compression.as_str() {
        "none" => Compression::None,
        "gzip" => Compression::Gzip,
        "snappy" => Compression::Snappy,
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        other => bail!("unknown --compression {other}"),
    };
    if a.transactional_id.is_some() && acks != Acks::All {
        bail!("--transactional-id needs --acks all");
    }
    Ok(ProducerConfig {
        topic: a.topic.clone(),
        acks,
        compression,
        transactional_id: a.transactional_id.clone(),
    })
}

/// Whether `e` says that a newer producer fenced this one.
fn fenced(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<ClientError>()
                .and_then(ClientError::kafka_error),
            Some(ResponseError::InvalidProducerEpoch | ResponseError::ProducerFenced)
        )
    })
}

fn parse_headers(hs: &[String]) -> Result<indexmap::IndexMap<StrBytes, Option<Bytes>>> {
    let mut m = indexmap::IndexMap::new();
    for h in hs {
        let (k, v) = h
            .split_once('=')
            .ok_or_else(|| anyhow!("--header expects KEY=VALUE, got {h}"))?;
        m.insert(s(k), Some(Bytes::from(v.to_string())));
    }
    Ok(m)
}

/// Reads stdin lines on a thread of its own, so that the producer can wait
/// for a line, its linger deadline and a signal at once.
fn spawn_line_reader() -> tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        loop {
            let mut line = Vec::new();
            match input.read_until(b'\n', &mut line) {
                Ok(0) => break, // EOF: dropping the sender says so
                Ok(_) => {
                    if tx.blocking_send(Ok(line)).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    break;
                }
            }
        }
    });
    rx
}

/// One input line as a record, and the partition it goes to.
struct LineParser {
    sep: Option<Vec<u8>>,
    headers: indexmap::IndexMap<StrBytes, Option<Bytes>>,
    partition: Option<i32>,
    nparts: i32,
}

impl LineParser {
    fn record(&self, mut line: Vec<u8>, sticky: i32) -> (i32, Record) {
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        let (key, value) = match self.sep.as_deref() {
            Some(sep) if !sep.is_empty() => match line.windows(sep.len()).position(|w| w == sep) {
                Some(i) => (
                    Some(Bytes::copy_from_slice(&line[..i])),
                    Bytes::copy_from_slice(&line[i + sep.len()..]),
                ),
                None => (None, Bytes::from(line)),
            },
            _ => (None, Bytes::from(line)),
        };
        let part = match (self.partition, &key) {
            (Some(x), _) => x,
            (None, Some(k)) => key_partition(k, self.nparts),
            (None, None) => sticky,
        };
        let rec = Record {
            transactional: false,
            control: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp: now_ms(),
            key,
            value: Some(value),
            headers: self.headers.clone(),
            delete_horizon: false,
        };
        (part, rec)
    }
}

/// What a produce run has done so far (also what its failure message reports).
#[derive(Default)]
struct ProduceCounts {
    /// Records the cluster acknowledged.
    acked: u64,
    /// Of those, records in committed transactions.
    committed: u64,
    /// Records in ended-by-abort transactions (--abort or an interrupt).
    aborted: u64,
    /// Records sent and not yet answered.
    in_flight: u64,
    /// Records read into the transaction still open (sent or not).
    open_txn: u64,
    /// Transactions ended.
    txns: u64,
    per_part: BTreeMap<i32, u64>,
}

/// The error a failed run ends with: what was done, and what a fence or
/// an unanswered request leaves.
fn stopped(e: anyhow::Error, a: &ProduceArgs, txn: bool, n: &ProduceCounts) -> anyhow::Error {
    let mut msg = if txn {
        format!(
            "produce stopped after {} records were committed in {} transactions",
            n.committed, n.txns
        )
    } else {
        format!(
            "produce stopped after {} records were acknowledged",
            n.acked
        )
    };
    if txn && fenced(&e) {
        // A fence aborts the open transaction at the broker, and every
        // later write of this producer is refused: nothing of it is left
        // for a read_committed reader, whatever was in flight.
        msg += &format!(
            concat!(
                "; this producer was fenced: a newer producer took transactional id {:?}, ",
                "the broker aborted this one's open transaction and refuses its writes ",
                "({} uncommitted records will never be read by read_committed consumers)"
            ),
            a.transactional_id.as_deref().unwrap_or(""),
            n.open_txn
        );
        return e.context(msg);
    }
    if n.in_flight > 0 {
        msg += &format!(
            " ({} more were sent without an answer: they may or may not have been written)",
            n.in_flight
        );
    }
    if txn && n.open_txn > 0 {
        msg += &format!(
            "; the open transaction ({} records) stays open until the broker aborts it \
             at its timeout (60 s)",
            n.open_txn
        );
    }
    e.context(msg)
}

/// The run's summary: JSON with `--json`, a line on stderr otherwise,
/// and an interrupt said either way.
fn report(
    a: &ProduceArgs,
    json_out: bool,
    txn: bool,
    n: &ProduceCounts,
    stop: Option<&'static str>,
    producer_id: i64,
    started: Instant,
) -> Result<()> {
    let elapsed = started.elapsed().as_millis() as u64;
    let records = if txn {
        n.committed + n.aborted
    } else {
        n.acked
    };
    let v = json!({"topic": a.topic, "records": records, "acknowledged": if txn { n.committed } else { n.acked },
        "partitions": n.per_part.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<String, Value>>(),
        "transactions": n.txns, "aborted_records": n.aborted,
        "outcome": if !txn { "acknowledged" } else if a.abort || stop.is_some() { "aborted" } else { "committed" },
        "interrupted": stop, "producer_id": producer_id, "elapsed_ms": elapsed});
    if json_out {
        println!("{}", serde_json::to_string(&v)?);
    }
    if let Some(sig) = stop {
        // An interrupt is reported even with --json: a person pressed Ctrl-C.
        let msg = if txn {
            let mut m = format!(
                "interrupted ({sig}): {} records acknowledged in {} committed transactions",
                n.committed, n.txns
            );
            if n.open_txn > 0 {
                m += &format!("; aborted the open transaction ({} records)", n.open_txn);
            }
            m
        } else {
            format!(
                "interrupted ({sig}): {} records acknowledged, nothing left pending",
                n.acked
            )
        };
        eprintln!("{msg}");
    } else if !json_out {
        let mut msg = format!("produced {records} records to {} in {elapsed} ms", a.topic);
        if txn {
            msg += &format!(
                " ({} transactions {})",
                n.txns,
                if a.abort { "aborted" } else { "committed" }
            );
        }
        eprintln!("{msg}");
    }
    Ok(())
}

pub async fn produce(bootstrap: &str, json_out: bool, a: ProduceArgs) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let started = Instant::now();
    if a.batch_records == 0 {
        bail!("--batch-records must be at least 1");
    }
    let mut c = Cluster::connect(bootstrap).await?;
    let p = Producer::init(&mut c, producer_config(&a)?).await?;
    let nparts = p.leaders().len() as i32;
    if let Some(part) = a.partition {
        if !p.leaders().contains_key(&part) {
            bail!("{} has no partition {part} ({nparts} partitions)", a.topic);
        }
    }
    let parser = LineParser {
        sep: a.key_separator.as_ref().map(|x| x.as_bytes().to_vec()),
        headers: parse_headers(&a.headers)?,
        partition: a.partition,
        nparts,
    };
    // From here on an interrupt is handled: what is pending is sent (or the
    // open transaction aborted) and the count of acknowledged records printed.
    let sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let interactive = std::io::stdin().is_terminal();
    let progress = Progress::new(a.progress, !interactive && !a.verbose, "produced");
    let rx = spawn_line_reader();
    let mut r = Run {
        a: &a,
        json_out,
        txn: p.is_transactional(),
        c,
        p,
        nparts,
        parser,
        progress,
        rx,
        sigint,
        sigterm,
        linger: Duration::from_millis(a.linger_ms),
        n: ProduceCounts::default(),
        pending: BTreeMap::new(),
        npending: 0,
        sticky: 0,
        deadline: None,
        eof: false,
        stop: None,
    };
    let result = r.run().await;
    r.progress.done();
    if let Err(e) = result {
        return Err(stopped(e, &a, r.txn, &r.n));
    }
    report(
        &a,
        json_out,
        r.txn,
        &r.n,
        r.stop,
        r.p.producer_id(),
        started,
    )
}

/// A produce run: stdin's lines batched into requests (and transactions).
struct Run<'a> {
    a: &'a ProduceArgs,
    json_out: bool,
    /// Writing inside transactions.
    txn: bool,
    c: Cluster,
    p: Producer,
    /// The topic's partition count.
    nparts: i32,
    parser: LineParser,
    progress: Progress,
    /// stdin's lines.
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    sigint: tokio::signal::unix::Signal,
    sigterm: tokio::signal::unix::Signal,
    linger: Duration,
    n: ProduceCounts,
    /// Records read and not sent yet, by partition, and how many.
    pending: BTreeMap<i32, Vec<Record>>,
    npending: usize,
    /// The partition of records without a key (the next one after each request).
    sticky: i32,
    /// When what is pending must be sent (`--linger-ms` after its first line).
    deadline: Option<tokio::time::Instant>,
    /// stdin is at its end.
    eof: bool,
    /// The signal that interrupted the run, if one did.
    stop: Option<&'static str>,
}

impl Run<'_> {
    /// Reads, sends and ends transactions until stdin ends or a signal
    /// comes (then winds up).
    async fn run(&mut self) -> Result<()> {
        let a = self.a;
        loop {
            let txn_full = a.transaction_records > 0 && self.n.open_txn >= a.transaction_records;
            let due = self
                .deadline
                .is_some_and(|d| tokio::time::Instant::now() >= d);
            let send_now = self.eof || due || txn_full || self.npending >= a.batch_records;
            if self.npending > 0 && self.stop.is_none() && send_now {
                self.flush_pending().await?;
            }
            if self.txn && self.stop.is_none() && (txn_full || self.eof) && self.n.open_txn > 0 {
                self.end_txn().await?;
            }
            if self.stop.is_some() {
                return self.wind_up().await;
            }
            if self.eof {
                return Ok(());
            }
            self.wait().await?;
        }
    }

    /// Sends what is pending and reports each acknowledgement.
    async fn flush_pending(&mut self) -> Result<()> {
        let a = self.a;
        let n = &mut self.n;
        n.in_flight = self.npending as u64;
        let acked = self
            .p
            .send(&mut self.c, std::mem::take(&mut self.pending))
            .await?;
        n.in_flight = 0;
        n.acked += acked.len() as u64;
        self.npending = 0;
        self.deadline = None;
        self.sticky = (self.sticky + 1) % self.nparts.max(1);
        let mut out = std::io::stdout().lock();
        for r in &acked {
            *n.per_part.entry(r.partition).or_default() += 1;
            if a.verbose {
                if self.json_out {
                    let v = json!({"topic": a.topic, "partition": r.partition,
                        "offset": r.offset, "timestamp": r.timestamp});
                    writeln!(out, "{v}")?;
                } else {
                    writeln!(
                        out,
                        "Produced to partition {} at offset {} with timestamp {}.",
                        r.partition, r.offset, r.timestamp
                    )?;
                }
            }
        }
        out.flush()?;
        self.progress.tick(n.acked);
        Ok(())
    }

    /// Ends the open transaction: a commit, or an abort with --abort.
    async fn end_txn(&mut self) -> Result<()> {
        let a = self.a;
        self.p.end_txn(&mut self.c, !a.abort).await?;
        let n = &mut self.n;
        n.txns += 1;
        if a.abort {
            n.aborted += n.open_txn;
        } else {
            n.committed += n.open_txn;
        }
        n.open_txn = 0;
        Ok(())
    }

    /// After a signal: aborts the open transaction, or without transactions
    /// sends what was read.
    async fn wind_up(&mut self) -> Result<()> {
        if self.txn {
            // The open transaction (sent or not) is aborted, never half-committed.
            if self.n.open_txn > 0 {
                self.p.end_txn(&mut self.c, false).await?;
                self.n.aborted += self.n.open_txn;
            }
        } else {
            // Send what was read: pending records and lines already taken from stdin.
            loop {
                while self.npending < self.a.batch_records {
                    let Ok(Ok(line)) = self.rx.try_recv() else {
                        break;
                    };
                    self.add(line);
                }
                if self.npending == 0 {
                    break;
                }
                self.flush_pending().await?;
            }
        }
        Ok(())
    }

    /// Waits for a signal, the linger deadline or a line of stdin (taking
    /// it and whatever else is already read).
    async fn wait(&mut self) -> Result<()> {
        let wait_until = self.deadline;
        tokio::select! {
            biased;
            _ = self.sigint.recv() => self.stop = Some("SIGINT"),
            _ = self.sigterm.recv() => self.stop = Some("SIGTERM"),
            _ = async {
                if let Some(d) = wait_until {
                    tokio::time::sleep_until(d).await
                }
            }, if wait_until.is_some() => {}
            msg = self.rx.recv() => match msg {
                None => self.eof = true,
                Some(Err(e)) => return Err(anyhow!(e).context("reading stdin")),
                Some(Ok(line)) => self.take_lines(line)?,
            },
        }
        Ok(())
    }

    /// Adds `line` and whatever else is already read, up to a request's
    /// worth or the end of the transaction, then starts the linger wait.
    fn take_lines(&mut self, line: Vec<u8>) -> Result<()> {
        let a = self.a;
        let mut line = Some(line);
        while let Some(l) = line.take() {
            self.add(l);
            self.n.open_txn += u64::from(self.txn);
            let full = self.npending >= a.batch_records
                || (a.transaction_records > 0 && self.n.open_txn >= a.transaction_records);
            if !full {
                line = match self.rx.try_recv() {
                    Ok(Ok(l)) => Some(l),
                    Ok(Err(e)) => return Err(anyhow!(e).context("reading stdin")),
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                        self.eof = true;
                        None
                    }
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => None,
                };
            }
        }
        if self.deadline.is_none() {
            self.deadline = Some(tokio::time::Instant::now() + self.linger);
        }
        Ok(())
    }

    /// Makes `line` a pending record.
    fn add(&mut self, line: Vec<u8>) {
        let (part, rec) = self.parser.record(line, self.sticky);
        self.pending.entry(part).or_default().push(rec);
        self.npending += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_into_key_and_value_and_find_their_partition() {
        let p = LineParser {
            sep: Some(b"|".to_vec()),
            headers: Default::default(),
            partition: None,
            nparts: 3,
        };
        let (part, r) = p.record(b"key-1|a|b\r\n".to_vec(), 2);
        assert_eq!(r.key.as_deref(), Some(&b"key-1"[..]));
        assert_eq!(r.value.as_deref(), Some(&b"a|b"[..]));
        assert_eq!(part, key_partition(b"key-1", 3));
        // no key: the batch's sticky partition
        let (part, r) = p.record(b"no separator\n".to_vec(), 2);
        assert_eq!(part, 2);
        assert_eq!(r.key, None);
        assert_eq!(r.value.as_deref(), Some(&b"no separator"[..]));
        let fixed = LineParser {
            partition: Some(1),
            ..p
        };
        assert_eq!(fixed.record(b"key-1|x".to_vec(), 2).0, 1);
    }

    #[test]
    fn a_fence_is_told_by_its_error_code() {
        let kafka = |code| {
            anyhow::Error::from(oncelog_client::check(code, "commit transaction").unwrap_err())
                .context("produce stopped")
        };
        assert!(fenced(&kafka(90)));
        assert!(fenced(&kafka(47)));
        assert!(!fenced(&kafka(53)));
        assert!(!fenced(&anyhow!("ProducerFenced")));
    }
}
