//! `oncelog produce` and `oncelog consume`: the data-plane commands of the CLI.
//! Like the admin commands they speak the Kafka protocol, so they work against
//! any Kafka-compatible cluster. Requests go to each partition's leader and
//! to the transaction coordinator the cluster names.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnTopic,
};
use kafka_protocol::messages::add_partitions_to_txn_response::AddPartitionsToTxnResponse;
use kafka_protocol::messages::describe_producers_request::{
    DescribeProducersRequest, TopicRequest,
};
use kafka_protocol::messages::describe_producers_response::DescribeProducersResponse;
use kafka_protocol::messages::describe_transactions_request::DescribeTransactionsRequest;
use kafka_protocol::messages::describe_transactions_response::DescribeTransactionsResponse;
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::fetch_response::FetchResponse;
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::find_coordinator_response::FindCoordinatorResponse;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::list_transactions_request::ListTransactionsRequest;
use kafka_protocol::messages::list_transactions_response::ListTransactionsResponse;
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::metadata_response::MetadataResponse;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_commit_response::OffsetCommitResponse;
use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequest, OffsetFetchRequestTopic};
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponse;
use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::produce_response::ProduceResponse;
use kafka_protocol::messages::{ApiKey, BrokerId, GroupId, ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use oncelog_broker::now_ms;
use oncelog_client::Client;
use serde_json::{json, Value};

use crate::cli::{check, offsets};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Error codes worth retrying a request for.
fn retriable(code: i16) -> bool {
    // NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS(_AFTER_APPEND),
    // COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
    // CONCURRENT_TRANSACTIONS, LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION
    matches!(code, 6 | 7 | 19 | 20 | 14 | 15 | 16 | 51 | 5 | 3)
}

/// Connections to a cluster: the bootstrap broker plus one per node asked for.
pub struct Cluster {
    bootstrap: String,
    brokers: HashMap<i32, String>,
    conns: HashMap<i32, Client>,
    boot: Client,
}

/// Partition index → leader node id.
type Leaders = BTreeMap<i32, i32>;

impl Cluster {
    pub async fn connect(bootstrap: &str) -> Result<Self> {
        Ok(Self {
            bootstrap: bootstrap.to_string(),
            brokers: HashMap::new(),
            conns: HashMap::new(),
            boot: Client::connect(bootstrap).await?,
        })
    }

    pub fn bootstrap(&mut self) -> &mut Client {
        &mut self.boot
    }

    /// The partitions of `topic` and their leaders; `create` lets the cluster
    /// auto-create it (as producers do). Retries while leaders are unknown.
    async fn leaders(&mut self, topic: &str, create: bool) -> Result<Leaders> {
        for attempt in 0..20 {
            let req = MetadataRequest::default()
                .with_allow_auto_topic_creation(create)
                .with_topics(Some(vec![
                    MetadataRequestTopic::default().with_name(Some(TopicName(s(topic))))
                ]));
            let (md, _) = self
                .boot
                .call_max::<_, MetadataResponse>(ApiKey::Metadata, &req, 12)
                .await?;
            for b in &md.brokers {
                self.brokers
                    .insert(b.node_id.0, format!("{}:{}", b.host.as_str(), b.port));
            }
            let t = md
                .topics
                .first()
                .ok_or_else(|| anyhow!("no metadata for topic {topic}"))?;
            if t.error_code == 0 && !t.partitions.is_empty() {
                let leaders: Leaders = t
                    .partitions
                    .iter()
                    .map(|p| (p.partition_index, p.leader_id.0))
                    .collect();
                if leaders.values().all(|l| *l >= 0) {
                    return Ok(leaders);
                }
            } else if !retriable(t.error_code) || (t.error_code == 3 && !create) {
                check(t.error_code, &format!("topic {topic}"))?;
            }
            tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
        }
        bail!("topic {topic}: no leader for every partition after 20 tries")
    }

    /// The connection to node `id` (the bootstrap one when the address matches).
    async fn node(&mut self, id: i32) -> Result<&mut Client> {
        let addr = self.brokers.get(&id).cloned();
        match addr {
            None => Ok(&mut self.boot),
            Some(a) if a == self.bootstrap => Ok(&mut self.boot),
            Some(a) => {
                use std::collections::hash_map::Entry;
                match self.conns.entry(id) {
                    Entry::Occupied(e) => Ok(e.into_mut()),
                    Entry::Vacant(v) => {
                        let c = Client::connect(&a)
                            .await
                            .with_context(|| format!("node {id} of the cluster's metadata"))?;
                        Ok(v.insert(c))
                    }
                }
            }
        }
    }

    /// The node that coordinates `key` (`key_type` 0 = group, 1 = transaction).
    async fn coordinator(&mut self, key: &str, key_type: i8) -> Result<i32> {
        for attempt in 0..20 {
            let req = FindCoordinatorRequest::default()
                .with_key(s(key))
                .with_key_type(key_type);
            let (r, _) = self
                .boot
                .call_max::<_, FindCoordinatorResponse>(ApiKey::FindCoordinator, &req, 3)
                .await?;
            if r.error_code == 0 {
                self.brokers
                    .insert(r.node_id.0, format!("{}:{}", r.host.as_str(), r.port));
                return Ok(r.node_id.0);
            }
            if !retriable(r.error_code) {
                check(r.error_code, &format!("find coordinator for {key}"))?;
            }
            tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
        }
        bail!("no coordinator for {key} after 20 tries")
    }
}

/// Kafka's default partitioner hash (murmur2, seed 0x9747b28c).
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = 0x9747_b28c ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= (rest[2] as u32) << 16;
    }
    if rest.len() >= 2 {
        h ^= (rest[1] as u32) << 8;
    }
    if !rest.is_empty() {
        h ^= rest[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// Progress on stderr: once a second while running (when asked or when
/// stderr is a terminal).
struct Progress {
    on: bool,
    tty: bool,
    what: &'static str,
    start: Instant,
    last: Instant,
}

impl Progress {
    /// `auto`: whether a terminal on stderr may show it unasked (not when the
    /// same terminal shows the records or the typing).
    fn new(asked: bool, auto: bool, what: &'static str) -> Self {
        let tty = std::io::stderr().is_terminal();
        Self {
            on: asked || (tty && auto),
            tty,
            what,
            start: Instant::now(),
            last: Instant::now(),
        }
    }

    fn tick(&mut self, n: u64) {
        if !self.on || self.last.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.last = Instant::now();
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let line = format!(
            "{} {n} records ({:.0}/s, {:.0} s)",
            self.what,
            n as f64 / secs,
            secs
        );
        if self.tty {
            eprint!("\r{line}   ");
        } else {
            eprintln!("{line}");
        }
    }

    fn done(&self) {
        if self.on && self.tty {
            eprintln!();
        }
    }
}

#[derive(clap::Args)]
pub struct ProduceArgs {
    /// Topic to write to (auto-created where the cluster allows it).
    pub topic: String,
    /// Write every record to this partition (default: by key hash, or
    /// round-robin per batch without keys).
    #[arg(long)]
    pub partition: Option<i32>,
    /// Split each input line into key and value at the first SEP.
    #[arg(long, value_name = "SEP")]
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

struct Producer {
    topic: String,
    leaders: Leaders,
    acks: i16,
    compression: Compression,
    producer_id: i64,
    epoch: i16,
    sequences: HashMap<i32, i32>,
    txn: Option<(String, i32)>,
    in_txn: BTreeSet<i32>,
}

impl Producer {
    async fn init(c: &mut Cluster, a: &ProduceArgs) -> Result<Self> {
        let acks: i16 = match a.acks.as_str() {
            "all" | "-1" => -1,
            "1" => 1,
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
        if a.transactional_id.is_some() && acks != -1 {
            bail!("--transactional-id needs --acks all");
        }
        let leaders = c.leaders(&a.topic, true).await?;
        let mut p = Self {
            topic: a.topic.clone(),
            leaders,
            acks,
            compression,
            producer_id: -1,
            epoch: -1,
            sequences: HashMap::new(),
            txn: None,
            in_txn: BTreeSet::new(),
        };
        if acks == -1 {
            let (node, tid) = match &a.transactional_id {
                Some(t) => (c.coordinator(t, 1).await?, Some(t.clone())),
                None => (*p.leaders.values().next().unwrap_or(&-1), None),
            };
            let req = InitProducerIdRequest::default()
                .with_transactional_id(tid.as_ref().map(|t| TransactionalId(s(t))))
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1);
            let mut last = 0;
            for attempt in 0..30 {
                let (r, _) = c
                    .node(node)
                    .await?
                    .call_max::<_, InitProducerIdResponse>(ApiKey::InitProducerId, &req, 4)
                    .await?;
                last = r.error_code;
                if r.error_code == 0 {
                    p.producer_id = r.producer_id.0;
                    p.epoch = r.producer_epoch;
                    break;
                }
                if !retriable(r.error_code) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
            }
            check(last, "init producer id")?;
            if let Some(t) = tid {
                p.txn = Some((t, node));
            }
        }
        Ok(p)
    }

    async fn add_partitions(&mut self, c: &mut Cluster, parts: &[i32]) -> Result<()> {
        let Some((tid, node)) = self.txn.clone() else {
            return Ok(());
        };
        let new: Vec<i32> = parts
            .iter()
            .copied()
            .filter(|p| !self.in_txn.contains(p))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s(&tid)))
            .with_v3_and_below_producer_id(ProducerId(self.producer_id))
            .with_v3_and_below_producer_epoch(self.epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(s(&self.topic)))
                .with_partitions(new.clone())]);
        for attempt in 0..30 {
            let (r, _) = c
                .node(node)
                .await?
                .call_max::<_, AddPartitionsToTxnResponse>(ApiKey::AddPartitionsToTxn, &req, 3)
                .await?;
            let code = r
                .results_by_topic_v3_and_below
                .iter()
                .flat_map(|t| {
                    t.results_by_partition
                        .iter()
                        .map(|p| p.partition_error_code)
                })
                .find(|e| *e != 0)
                .unwrap_or(r.error_code);
            if code == 0 {
                self.in_txn.extend(new);
                return Ok(());
            }
            if !retriable(code) {
                check(code, "add partitions to transaction")?;
            }
            tokio::time::sleep(Duration::from_millis(20 * (attempt + 1))).await;
        }
        bail!("add partitions to transaction: still busy after 30 tries")
    }

    async fn end_txn(&mut self, c: &mut Cluster, commit: bool) -> Result<()> {
        let Some((tid, node)) = self.txn.clone() else {
            return Ok(());
        };
        if self.in_txn.is_empty() {
            return Ok(());
        }
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s(&tid)))
            .with_producer_id(ProducerId(self.producer_id))
            .with_producer_epoch(self.epoch)
            .with_committed(commit);
        for attempt in 0..30 {
            let (r, _) = c
                .node(node)
                .await?
                .call_max::<_, EndTxnResponse>(ApiKey::EndTxn, &req, 4)
                .await?;
            if r.error_code == 0 {
                self.in_txn.clear();
                return Ok(());
            }
            if !retriable(r.error_code) {
                check(
                    r.error_code,
                    if commit {
                        "commit transaction"
                    } else {
                        "abort transaction"
                    },
                )?;
            }
            tokio::time::sleep(Duration::from_millis(20 * (attempt + 1))).await;
        }
        bail!("end transaction: still busy after 30 tries")
    }

    /// Sends `pending` (partition → records) and waits for the
    /// acknowledgements; returns each record's partition, offset and timestamp.
    async fn send(
        &mut self,
        c: &mut Cluster,
        pending: BTreeMap<i32, Vec<Record>>,
    ) -> Result<Vec<Acked>> {
        let parts: Vec<i32> = pending.keys().copied().collect();
        self.add_partitions(c, &parts).await?;
        let mut by_leader: BTreeMap<i32, Vec<PartitionProduceData>> = BTreeMap::new();
        let mut stamps: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
        let mut acked = Vec::new();
        for (p, mut recs) in pending {
            stamps.insert(p, recs.iter().map(|r| r.timestamp).collect());
            let seq = self.sequences.entry(p).or_insert(0);
            for (i, r) in recs.iter_mut().enumerate() {
                r.offset = i as i64;
                if self.producer_id >= 0 {
                    r.producer_id = self.producer_id;
                    r.producer_epoch = self.epoch;
                    r.sequence = seq.wrapping_add(i as i32);
                    r.transactional = self.txn.is_some();
                } else {
                    // no producer: the batch's base sequence must be -1 (the
                    // encoder keeps records in one batch while offset - sequence
                    // stays constant)
                    r.sequence = i as i32 - 1;
                }
            }
            if self.producer_id >= 0 {
                *seq = seq.wrapping_add(recs.len() as i32);
            }
            let mut buf = BytesMut::new();
            RecordBatchEncoder::encode(
                &mut buf,
                recs.iter(),
                &RecordEncodeOptions {
                    version: 2,
                    compression: self.compression,
                },
            )
            .map_err(|e| anyhow!("encoding records: {e}"))?;
            let leader = *self.leaders.get(&p).unwrap_or(&-1);
            by_leader.entry(leader).or_default().push(
                PartitionProduceData::default()
                    .with_index(p)
                    .with_records(Some(buf.freeze())),
            );
        }
        for (leader, parts) in by_leader {
            let req = ProduceRequest::default()
                .with_transactional_id(self.txn.as_ref().map(|(t, _)| TransactionalId(s(t))))
                .with_acks(self.acks)
                .with_timeout_ms(30_000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(s(&self.topic)))
                    .with_partition_data(parts)]);
            let mut attempt = 0;
            loop {
                let (r, _) = c
                    .node(leader)
                    .await?
                    .call_max::<_, ProduceResponse>(ApiKey::Produce, &req, 11)
                    .await?;
                let err = r
                    .responses
                    .iter()
                    .flat_map(|t| t.partition_responses.iter())
                    .find(|p| p.error_code != 0)
                    .map(|p| {
                        (
                            p.index,
                            p.error_code,
                            p.error_message.as_ref().map(|m| m.to_string()),
                        )
                    });
                match err {
                    None => {
                        for pr in r
                            .responses
                            .iter()
                            .flat_map(|t| t.partition_responses.iter())
                        {
                            let Some(ts) = stamps.get(&pr.index) else {
                                continue;
                            };
                            for (i, t) in ts.iter().enumerate() {
                                acked.push(Acked {
                                    partition: pr.index,
                                    offset: pr.base_offset + i as i64,
                                    timestamp: if pr.log_append_time_ms >= 0 {
                                        pr.log_append_time_ms
                                    } else {
                                        *t
                                    },
                                });
                            }
                        }
                        break;
                    }
                    Some((_, code, _)) if retriable(code) && attempt < 5 => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                    }
                    Some((p, code, msg)) => {
                        let what = match msg {
                            Some(m) => format!("produce to {}-{p} ({m})", self.topic),
                            None => format!("produce to {}-{p}", self.topic),
                        };
                        check(code, &what)?;
                    }
                }
            }
        }
        Ok(acked)
    }
}

/// One acknowledged record.
struct Acked {
    partition: i32,
    offset: i64,
    timestamp: i64,
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
            (None, Some(k)) => (murmur2(k) & 0x7fff_ffff) % self.nparts.max(1),
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

pub async fn produce(bootstrap: &str, json_out: bool, a: ProduceArgs) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let started = Instant::now();
    if a.batch_records == 0 {
        bail!("--batch-records must be at least 1");
    }
    let mut c = Cluster::connect(bootstrap).await?;
    let mut p = Producer::init(&mut c, &a).await?;
    let nparts = p.leaders.len() as i32;
    if let Some(part) = a.partition {
        if !p.leaders.contains_key(&part) {
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
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let interactive = std::io::stdin().is_terminal();
    let mut progress = Progress::new(a.progress, !interactive && !a.verbose, "produced");
    let mut rx = spawn_line_reader();
    let txn = p.txn.is_some();
    let linger = Duration::from_millis(a.linger_ms);
    let mut n = ProduceCounts::default();
    let mut pending: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
    let mut npending = 0usize;
    let mut sticky = 0i32;
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut eof = false;
    let mut stop: Option<&'static str> = None;
    let topic = a.topic.clone();
    let result: Result<()> = async {
        // Sends what is pending and reports each acknowledgement.
        macro_rules! flush_pending {
            () => {
                n.in_flight = npending as u64;
                let acked = p.send(&mut c, std::mem::take(&mut pending)).await?;
                n.in_flight = 0;
                n.acked += acked.len() as u64;
                npending = 0;
                deadline = None;
                sticky = (sticky + 1) % nparts.max(1);
                let mut out = std::io::stdout().lock();
                for r in &acked {
                    *n.per_part.entry(r.partition).or_default() += 1;
                    if a.verbose {
                        if json_out {
                            let v = json!({"topic": topic, "partition": r.partition,
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
                progress.tick(n.acked);
            };
        }
        loop {
            let txn_full = a.transaction_records > 0 && n.open_txn >= a.transaction_records;
            let due = deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
            let send_now = eof || due || txn_full || npending >= a.batch_records;
            if npending > 0 && stop.is_none() && send_now {
                flush_pending!();
            }
            if txn && stop.is_none() && (txn_full || eof) && n.open_txn > 0 {
                p.end_txn(&mut c, !a.abort).await?;
                n.txns += 1;
                if a.abort {
                    n.aborted += n.open_txn;
                } else {
                    n.committed += n.open_txn;
                }
                n.open_txn = 0;
            }
            if stop.is_some() {
                if txn {
                    // The open transaction (sent or not) is aborted, never half-committed.
                    if n.open_txn > 0 {
                        p.end_txn(&mut c, false).await?;
                        n.aborted += n.open_txn;
                    }
                } else {
                    // Send what was read: pending records and lines already taken from stdin.
                    loop {
                        while npending < a.batch_records {
                            let Ok(Ok(line)) = rx.try_recv() else { break };
                            let (part, rec) = parser.record(line, sticky);
                            pending.entry(part).or_default().push(rec);
                            npending += 1;
                        }
                        if npending == 0 {
                            break;
                        }
                        flush_pending!();
                    }
                }
                break;
            }
            if eof {
                break;
            }
            let wait_until = deadline;
            tokio::select! {
                biased;
                _ = sigint.recv() => stop = Some("SIGINT"),
                _ = sigterm.recv() => stop = Some("SIGTERM"),
                _ = async {
                    if let Some(d) = wait_until {
                        tokio::time::sleep_until(d).await
                    }
                }, if wait_until.is_some() => {}
                msg = rx.recv() => match msg {
                    None => eof = true,
                    Some(Err(e)) => return Err(anyhow!(e).context("reading stdin")),
                    Some(Ok(line)) => {
                        let mut line = Some(line);
                        // This line and whatever else is already read, up to
                        // a request's worth or the end of the transaction.
                        while let Some(l) = line.take() {
                            let (part, rec) = parser.record(l, sticky);
                            pending.entry(part).or_default().push(rec);
                            npending += 1;
                            n.open_txn += u64::from(txn);
                            let full = npending >= a.batch_records
                                || (a.transaction_records > 0
                                    && n.open_txn >= a.transaction_records);
                            if !full {
                                line = match rx.try_recv() {
                                    Ok(Ok(l)) => Some(l),
                                    Ok(Err(e)) => return Err(anyhow!(e).context("reading stdin")),
                                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                                        eof = true;
                                        None
                                    }
                                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => None,
                                };
                            }
                        }
                        if deadline.is_none() {
                            deadline = Some(tokio::time::Instant::now() + linger);
                        }
                    }
                },
            }
        }
        Ok(())
    }
    .await;
    progress.done();
    if let Err(e) = result {
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
        let chain = format!("{e:#}");
        let fenced = txn
            && ["InvalidProducerEpoch", "ProducerFenced"]
                .iter()
                .any(|c| chain.contains(c));
        if fenced {
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
            return Err(e.context(msg));
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
        return Err(e.context(msg));
    }
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
        "interrupted": stop, "producer_id": p.producer_id, "elapsed_ms": elapsed});
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

#[derive(clap::Args)]
pub struct ConsumeArgs {
    /// Topic to read.
    pub topic: String,
    /// Only this partition (default: all).
    #[arg(long)]
    pub partition: Option<i32>,
    /// Where to start: earliest, latest, an offset (one past the end waits
    /// there), -N (N records before the end) or @TIMESTAMP_MS.
    #[arg(long, default_value = "earliest", allow_hyphen_values = true)]
    pub from: String,
    /// read_committed (the default) or read_uncommitted.
    #[arg(long, default_value = "read_committed")]
    pub isolation: String,
    /// Start at this group's committed offsets where it has them, and commit
    /// the position reached at the end, on Ctrl-C/SIGTERM and every 5 s
    /// while following (a standalone consumer, no membership).
    #[arg(long)]
    pub group: Option<String>,
    /// Stop after this many records.
    #[arg(long)]
    pub max_messages: Option<u64>,
    /// Keep waiting for new records (until Ctrl-C or SIGTERM) instead of
    /// stopping at the end (the last stable offset for read_committed) seen
    /// at the start.
    #[arg(long)]
    pub follow: bool,
    /// Stop after this many milliseconds in any case.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// value (one per line), kv (key TAB value), json (one object per line),
    /// hex or base64 (the value encoded, one per line: safe for binary data).
    #[arg(long, default_value = "value")]
    pub format: String,
    /// Report progress on stderr every second (on by default when stderr is
    /// a terminal and stdout is not).
    #[arg(long)]
    pub progress: bool,
}

/// Per partition: aborted transactions not yet reached (producer id, first
/// offset), and the producers whose aborted transaction is being skipped.
type AbortState = (VecDeque<(i64, i64)>, BTreeSet<i64>);

/// The records of fetched `data` at or after `from`, read_committed
/// filtering applied; returns them and the offset to fetch next.
fn decode_fetched(
    data: &Bytes,
    from: i64,
    committed_only: bool,
    aborted: &mut VecDeque<(i64, i64)>,
    aborted_pids: &mut BTreeSet<i64>,
) -> Result<(Vec<Record>, i64)> {
    let mut out = Vec::new();
    let mut next = from;
    let mut pos = 0usize;
    while data.len() - pos >= 61 {
        let len =
            i32::from_be_bytes([data[pos + 8], data[pos + 9], data[pos + 10], data[pos + 11]]);
        if len < 49 {
            bail!("fetched batch with length {len} at byte {pos}");
        }
        let total = 12 + len as usize;
        if data.len() - pos < total {
            break; // a partial batch at the end of a fetch
        }
        let raw = data.slice(pos..pos + total);
        pos += total;
        let base = i64::from_be_bytes(raw[0..8].try_into().unwrap_or([0; 8]));
        let last_delta = i32::from_be_bytes(raw[23..27].try_into().unwrap_or([0; 4]));
        let attrs = i16::from_be_bytes(raw[21..23].try_into().unwrap_or([0; 2]));
        let pid = i64::from_be_bytes(raw[43..51].try_into().unwrap_or([0; 8]));
        let last = base + last_delta as i64;
        if last < next {
            continue;
        }
        next = last + 1;
        let transactional = attrs & 0x10 != 0;
        let control = attrs & 0x20 != 0;
        if committed_only {
            while aborted.front().is_some_and(|(_, first)| *first <= last) {
                if let Some((p, _)) = aborted.pop_front() {
                    aborted_pids.insert(p);
                }
            }
        }
        let mut buf = raw.clone();
        let set = RecordBatchDecoder::decode(&mut buf)
            .map_err(|e| anyhow!("decoding the batch at offset {base}: {e}"))?;
        if control {
            if committed_only {
                let abort_marker = set
                    .records
                    .first()
                    .and_then(|r| r.key.as_ref())
                    .is_some_and(|k| k.len() >= 4 && i16::from_be_bytes([k[2], k[3]]) == 0);
                if abort_marker {
                    aborted_pids.remove(&pid);
                }
            }
            continue;
        }
        if committed_only && transactional && aborted_pids.contains(&pid) {
            continue;
        }
        out.extend(set.records.into_iter().filter(|r| r.offset >= from));
    }
    Ok((out, next))
}

fn text(b: &Option<Bytes>) -> Value {
    match b {
        Some(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        None => Value::Null,
    }
}

fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(b.len() * 2);
    for x in b {
        out.push(DIGITS[(x >> 4) as usize] as char);
        out.push(DIGITS[(x & 15) as usize] as char);
    }
    out
}

/// Standard base64 (RFC 4648, with padding).
fn base64(b: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = match *chunk {
            [a] => (a as u32) << 16,
            [a, b] => (a as u32) << 16 | (b as u32) << 8,
            [a, b, c] => (a as u32) << 16 | (b as u32) << 8 | c as u32,
            _ => 0,
        };
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

const FORMATS: &[&str] = &["value", "kv", "json", "hex", "base64"];

fn write_record(
    out: &mut impl Write,
    format: &str,
    topic: &str,
    p: i32,
    r: &Record,
) -> std::io::Result<()> {
    let value = r.value.as_deref().unwrap_or_default();
    match format {
        "json" => {
            let headers: serde_json::Map<String, Value> = r
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), text(v)))
                .collect();
            let v = json!({"topic": topic, "partition": p, "offset": r.offset, "timestamp": r.timestamp,
                "key": text(&r.key), "value": text(&r.value), "headers": headers});
            writeln!(out, "{v}")?;
        }
        "kv" => {
            if let Some(k) = &r.key {
                out.write_all(k)?;
            }
            out.write_all(b"\t")?;
            out.write_all(value)?;
            out.write_all(b"\n")?;
        }
        "hex" => writeln!(out, "{}", hex(value))?,
        "base64" => writeln!(out, "{}", base64(value))?,
        _ => {
            out.write_all(value)?;
            out.write_all(b"\n")?;
        }
    }
    Ok(())
}

/// The name of the signal (SIGINT or SIGTERM) that asked a run to stop, once one has.
#[derive(Clone, Default)]
struct StopFlag(std::sync::Arc<std::sync::Mutex<Option<&'static str>>>);

impl StopFlag {
    /// Watches SIGINT and SIGTERM from now on (instead of dying of them).
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let flag = Self::default();
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let f = flag.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            };
            if let Ok(mut g) = f.0.lock() {
                *g = Some(name);
            }
        });
        Ok(flag)
    }

    fn get(&self) -> Option<&'static str> {
        self.0.lock().ok().and_then(|g| *g)
    }
}

/// Commits `pos` as the group's offsets (a standalone consumer: no generation).
async fn commit_group(
    c: &mut Cluster,
    g: &str,
    topic: &str,
    pos: &BTreeMap<i32, i64>,
) -> Result<()> {
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(s(g)))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(StrBytes::default())
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(
                pos.iter()
                    .map(|(p, o)| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(*p)
                            .with_committed_offset(*o)
                    })
                    .collect(),
            )]);
    let node = c.coordinator(g, 0).await?;
    let (r, _) = c
        .node(node)
        .await?
        .call_max::<_, OffsetCommitResponse>(ApiKey::OffsetCommit, &req, 8)
        .await?;
    for t in &r.topics {
        for p in &t.partitions {
            check(p.error_code, &format!("commit offsets of group {g}"))?;
        }
    }
    Ok(())
}

/// Which open transaction holds `topic`-`p` back at the last stable offset
/// `lso`: the partition's producers (DescribeProducers), and the coordinators'
/// transactions (ListTransactions, DescribeTransactions) for its
/// transactional id. Best effort: a failure becomes part of the sentence.
async fn txn_holding(c: &mut Cluster, leader: i32, topic: &str, p: i32, lso: i64) -> String {
    match txn_holding_inner(c, leader, topic, p, lso).await {
        Ok(s) => s,
        Err(e) => format!("an open transaction (which one could not be told: {e:#})"),
    }
}

async fn txn_holding_inner(
    c: &mut Cluster,
    leader: i32,
    topic: &str,
    p: i32,
    lso: i64,
) -> Result<String> {
    let req = DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
        .with_name(TopicName(s(topic)))
        .with_partition_indexes(vec![p])]);
    let (r, _) = c
        .node(leader)
        .await?
        .call::<_, DescribeProducersResponse>(ApiKey::DescribeProducers, &req)
        .await?;
    let mut open: Vec<(i64, i16, i64)> = Vec::new();
    for t in &r.topics {
        for pr in &t.partitions {
            check(pr.error_code, &format!("producers of {topic}-{p}"))?;
            open.extend(
                pr.active_producers
                    .iter()
                    .filter(|a| a.current_txn_start_offset >= 0)
                    .map(|a| {
                        (
                            a.producer_id.0,
                            a.producer_epoch as i16,
                            a.current_txn_start_offset,
                        )
                    }),
            );
        }
    }
    open.sort_by_key(|x| (x.2 != lso, x.2));
    let Some(&(pid, epoch, first)) = open.first() else {
        return Ok("an open transaction that has ended since (read again to see its records if it committed)".into());
    };
    let mut nodes: Vec<i32> = c.brokers.keys().copied().collect();
    nodes.sort_unstable();
    if nodes.is_empty() {
        nodes.push(-1); // the bootstrap connection
    }
    for node in nodes {
        let req = ListTransactionsRequest::default().with_duration_filter(-1);
        let Ok(conn) = c.node(node).await else {
            continue;
        };
        let Ok((list, _)) = conn
            .call::<_, ListTransactionsResponse>(ApiKey::ListTransactions, &req)
            .await
        else {
            continue;
        };
        let Some(t) = list
            .transaction_states
            .iter()
            .find(|t| t.producer_id.0 == pid)
        else {
            continue;
        };
        let tid = t.transactional_id.clone();
        let mut age = String::new();
        let req = DescribeTransactionsRequest::default().with_transactional_ids(vec![tid.clone()]);
        if let Ok((d, _)) = conn
            .call::<_, DescribeTransactionsResponse>(ApiKey::DescribeTransactions, &req)
            .await
        {
            if let Some(ts) = d
                .transaction_states
                .iter()
                .find(|x| x.error_code == 0 && x.transaction_start_time_ms > 0)
            {
                age = format!(
                    ", open for {:.1} s",
                    (now_ms() - ts.transaction_start_time_ms).max(0) as f64 / 1000.0
                );
            }
        }
        return Ok(format!(
            "the open transaction of transactional id {:?} (producer id {pid}, epoch {epoch}, \
             first offset {first}{age})",
            tid.0.as_str()
        ));
    }
    Ok(format!(
        "the open transaction of producer id {pid} (epoch {epoch}, first offset {first}; \
         no coordinator names its transactional id: see `oncelog txn find-hanging`)"
    ))
}

/// Moves a start position into the log: before its start to the start,
/// past its end to the end (never back to the start). Says so on stderr.
fn clamp_position(
    topic: &str,
    p: i32,
    o: i64,
    start: i64,
    end: i64,
    follow: bool,
    why: &str,
) -> i64 {
    if o > end {
        let then = if follow {
            "waiting there for new records"
        } else {
            "nothing to read (--follow waits there)"
        };
        eprintln!("{topic}-{p}: {why} {o} is past the end of the log ({end}); {then}");
        end
    } else if o < start {
        eprintln!(
            "{topic}-{p}: {why} {o} is before the log start ({start}: older records were deleted); starting at {start}"
        );
        start
    } else {
        o
    }
}

pub async fn consume(bootstrap: &str, a: ConsumeArgs) -> Result<()> {
    if !FORMATS.contains(&a.format.as_str()) {
        bail!("--format must be one of {}", FORMATS.join(", "));
    }
    let committed_only = match a.isolation.as_str() {
        "read_committed" => true,
        "read_uncommitted" => false,
        other => bail!("--isolation must be read_committed or read_uncommitted, not {other}"),
    };
    let deadline = a
        .timeout_ms
        .map(|t| Instant::now() + Duration::from_millis(t));
    let mut c = Cluster::connect(bootstrap).await?;
    let leaders = c.leaders(&a.topic, false).await?;
    let parts: Vec<i32> = match a.partition {
        Some(p) if leaders.contains_key(&p) => vec![p],
        Some(p) => bail!("{} has no partition {p}", a.topic),
        None => leaders.keys().copied().collect(),
    };
    let topic = a.topic.clone();
    let starts = offsets(c.bootstrap(), &topic, &parts, -2, false).await?;
    let hws = offsets(c.bootstrap(), &topic, &parts, -1, false).await?;
    let start_of = |p: &i32| starts.get(p).copied().unwrap_or(0);
    let hw_of = |p: &i32| hws.get(p).copied().unwrap_or(0);
    // Start positions: the group's committed offsets, else --from.
    let mut pos: BTreeMap<i32, i64> = match a.from.as_str() {
        "earliest" => starts.clone(),
        "latest" => offsets(c.bootstrap(), &topic, &parts, -1, committed_only).await?,
        x if x.starts_with('@') => {
            let ts: i64 = x[1..].parse().context("--from @TIMESTAMP_MS")?;
            let found = offsets(c.bootstrap(), &topic, &parts, ts, false).await?;
            found
                .into_iter()
                .map(|(p, o)| (p, if o < 0 { hw_of(&p) } else { o }))
                .collect()
        }
        x => {
            let o: i64 = x.parse().map_err(|_| {
                anyhow!(
                    "--from must be earliest, latest, an offset, -N or @TIMESTAMP_MS, not {x:?}"
                )
            })?;
            parts
                .iter()
                .map(|p| {
                    let o = if o < 0 {
                        (hw_of(p) + o).max(start_of(p))
                    } else {
                        clamp_position(&topic, *p, o, start_of(p), hw_of(p), a.follow, "offset")
                    };
                    (*p, o)
                })
                .collect()
        }
    };
    if let Some(g) = &a.group {
        let req = OffsetFetchRequest::default()
            .with_group_id(GroupId(s(g)))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(s(&topic)))
                .with_partition_indexes(parts.clone())]))
            .with_require_stable(true);
        let node = c.coordinator(g, 0).await?;
        let (r, _) = c
            .node(node)
            .await?
            .call_max::<_, OffsetFetchResponse>(ApiKey::OffsetFetch, &req, 7)
            .await?;
        check(r.error_code, &format!("offsets of group {g}"))?;
        for t in &r.topics {
            for p in &t.partitions {
                check(p.error_code, &format!("offset of group {g}"))?;
                if p.committed_offset >= 0 {
                    let pi = p.partition_index;
                    let o = clamp_position(
                        &topic,
                        pi,
                        p.committed_offset,
                        start_of(&pi),
                        hw_of(&pi),
                        a.follow,
                        &format!("group {g}'s committed offset"),
                    );
                    pos.insert(pi, o);
                }
            }
        }
    }
    // The end for a run without --follow: the last stable offset (read_committed)
    // or the high watermark, as they are now.
    let ends = if committed_only {
        offsets(c.bootstrap(), &topic, &parts, -1, true).await?
    } else {
        hws.clone()
    };
    let stop = StopFlag::install()?;
    let mut done: BTreeSet<i32> = BTreeSet::new();
    let mut aborted: HashMap<i32, AbortState> = HashMap::new();
    let stdout = std::io::stdout();
    let to_terminal = stdout.is_terminal();
    // A terminal or a pipe that is followed sees every record at once;
    // otherwise records are flushed after each fetched batch (before any wait).
    let flush_each = to_terminal || a.follow;
    let mut progress = Progress::new(a.progress, !to_terminal, "consumed");
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut count = 0u64;
    let limit = a.max_messages.unwrap_or(u64::MAX);
    let mut stopped_by: Option<&'static str> = None;
    let mut stdout_closed = false;
    // --follow: per partition, the last stable offset it waits at behind a
    // higher high watermark, since when, and whether that was reported.
    let mut held: HashMap<i32, (i64, Instant, bool)> = HashMap::new();
    let mut committed_pos = pos.clone();
    let mut last_commit = Instant::now();
    let broken_pipe = |e: &std::io::Error| e.kind() == std::io::ErrorKind::BrokenPipe;
    'outer: while count < limit {
        if let Some(sig) = stop.get() {
            stopped_by = Some(sig);
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if !a.follow {
            for p in &parts {
                if pos.get(p).copied().unwrap_or(0) >= ends.get(p).copied().unwrap_or(0) {
                    done.insert(*p);
                }
            }
            if done.len() == parts.len() {
                break;
            }
        }
        if let (Some(g), true) = (&a.group, a.follow) {
            if pos != committed_pos && last_commit.elapsed() >= Duration::from_secs(5) {
                // A failed periodic commit is retried at the next one and
                // at the end; the run goes on.
                match commit_group(&mut c, g, &topic, &pos).await {
                    Ok(()) => committed_pos = pos.clone(),
                    Err(e) => eprintln!("warning: periodic commit of group {g}: {e:#}"),
                }
                last_commit = Instant::now();
            }
        }
        let mut by_leader: BTreeMap<i32, Vec<FetchPartition>> = BTreeMap::new();
        for p in parts.iter().filter(|p| !done.contains(p)) {
            by_leader
                .entry(*leaders.get(p).unwrap_or(&-1))
                .or_default()
                .push(
                    FetchPartition::default()
                        .with_partition(*p)
                        .with_current_leader_epoch(-1)
                        .with_fetch_offset(pos.get(p).copied().unwrap_or(0))
                        .with_last_fetched_epoch(-1)
                        .with_log_start_offset(-1)
                        .with_partition_max_bytes(4 << 20),
                );
        }
        for (leader, fparts) in by_leader {
            let req = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(500)
                .with_min_bytes(1)
                .with_max_bytes(16 << 20)
                .with_isolation_level(if committed_only { 1 } else { 0 })
                .with_session_id(0)
                .with_session_epoch(-1)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(TopicName(s(&topic)))
                    .with_partitions(fparts)]);
            let (r, _) = c
                .node(leader)
                .await?
                .call_max::<_, FetchResponse>(ApiKey::Fetch, &req, 12)
                .await?;
            check(r.error_code, "fetch")?;
            for t in &r.responses {
                for pd in &t.partitions {
                    let p = pd.partition_index;
                    let at = pos.get(&p).copied().unwrap_or(0);
                    if pd.error_code == 1 {
                        // OFFSET_OUT_OF_RANGE: into the log, never back to its start from past its end.
                        let s0 = offsets(c.bootstrap(), &topic, &[p], -2, false).await?;
                        let e0 = offsets(c.bootstrap(), &topic, &[p], -1, false).await?;
                        let (s0, e0) = (
                            s0.get(&p).copied().unwrap_or(0),
                            e0.get(&p).copied().unwrap_or(0),
                        );
                        let to = clamp_position(&topic, p, at, s0, e0, a.follow, "offset");
                        if to == at {
                            // in range again by now (retention or a write raced the answer)
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        pos.insert(p, to);
                        continue;
                    }
                    check(pd.error_code, &format!("fetch {topic}-{p}"))?;
                    let (queue, pids) = aborted.entry(p).or_default();
                    if let Some(list) = &pd.aborted_transactions {
                        let mut l: Vec<(i64, i64)> = list
                            .iter()
                            .map(|x| (x.producer_id.0, x.first_offset))
                            .collect();
                        l.sort_by_key(|x| x.1);
                        queue.clear();
                        queue.extend(l);
                    }
                    let (recs, next) = match &pd.records {
                        Some(data) => decode_fetched(data, at, committed_only, queue, pids)?,
                        None => (Vec::new(), at),
                    };
                    pos.insert(p, next.max(at));
                    for r in &recs {
                        if count >= limit {
                            pos.insert(p, r.offset);
                            break 'outer;
                        }
                        let written = write_record(&mut out, &a.format, &topic, p, r)
                            .and_then(|()| if flush_each { out.flush() } else { Ok(()) });
                        match written {
                            Ok(()) => {}
                            Err(e) if broken_pipe(&e) => {
                                stdout_closed = true;
                                break 'outer;
                            }
                            Err(e) => return Err(e).context("writing to stdout"),
                        }
                        count += 1;
                    }
                    match out.flush() {
                        Ok(()) => {}
                        Err(e) if broken_pipe(&e) => {
                            stdout_closed = true;
                            break 'outer;
                        }
                        Err(e) => return Err(e).context("writing to stdout"),
                    }
                    progress.tick(count);
                    // --follow behind an open transaction: say which, once it
                    // has held this partition for two seconds.
                    let lso = pd.last_stable_offset;
                    let at = pos.get(&p).copied().unwrap_or(0);
                    if a.follow
                        && committed_only
                        && lso >= 0
                        && lso < pd.high_watermark
                        && at >= lso
                    {
                        let h = held.entry(p).or_insert((lso, Instant::now(), false));
                        if h.0 != lso {
                            *h = (lso, Instant::now(), false);
                        }
                        if !h.2 && h.1.elapsed() >= Duration::from_secs(2) {
                            h.2 = true;
                            let hw = pd.high_watermark;
                            let who = txn_holding(&mut c, leader, &topic, p, lso).await;
                            eprintln!(
                                "{topic}-{p}: waiting at the last stable offset {lso} (read_committed); \
                                 the high watermark is {hw}: {} offsets are held back by {who}",
                                hw - lso
                            );
                        }
                    } else {
                        held.remove(&p);
                    }
                }
            }
        }
    }
    match out.flush() {
        Ok(()) => {}
        Err(e) if broken_pipe(&e) => stdout_closed = true,
        Err(e) => return Err(e).context("writing to stdout"),
    }
    drop(out);
    progress.done();
    // Stopped at the last stable offset with the high watermark beyond it:
    // records are held back by an open transaction; say which.
    if committed_only && !a.follow && stopped_by.is_none() && !stdout_closed {
        for p in &parts {
            let (lso, hw) = (ends.get(p).copied().unwrap_or(0), hw_of(p));
            if done.contains(p) && lso < hw && pos.get(p).copied().unwrap_or(0) >= lso {
                let who =
                    txn_holding(&mut c, *leaders.get(p).unwrap_or(&-1), &topic, *p, lso).await;
                eprintln!(
                    "{topic}-{p}: stopped at the last stable offset {lso} (read_committed); \
                     the high watermark is {hw}: {} offsets are held back by {who}",
                    hw - lso
                );
            }
        }
    }
    if let Some(sig) = stopped_by {
        eprintln!("interrupted ({sig})");
    }
    if stdout_closed {
        eprintln!(
            "stdout was closed after {count} records{}",
            if a.group.is_some() {
                "; offsets not committed"
            } else {
                ""
            }
        );
        return Ok(());
    }
    eprintln!("consumed {count} records from {topic}");
    if let Some(g) = &a.group {
        commit_group(&mut c, g, &topic, &pos).await?;
        let at: Vec<String> = pos
            .iter()
            .map(|(p, o)| format!("{topic}-{p} at {o}"))
            .collect();
        eprintln!("committed group {g}: {}", at.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_base64_encode_values() {
        assert_eq!(hex(b""), "");
        assert_eq!(hex(b"\x00\xffA"), "00ff41");
        for (raw, enc) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
            (b"\xff\xfe\xfd", "//79"),
        ] {
            assert_eq!(base64(raw), enc);
        }
    }

    #[test]
    fn start_positions_stay_in_the_log() {
        assert_eq!(clamp_position("t", 0, 10, 0, 2, true, "offset"), 2);
        assert_eq!(clamp_position("t", 0, 1, 3, 9, false, "offset"), 3);
        assert_eq!(clamp_position("t", 0, 5, 3, 9, false, "offset"), 5);
        assert_eq!(clamp_position("t", 0, 9, 3, 9, false, "offset"), 9);
    }

    #[test]
    fn murmur2_matches_kafka() {
        // Values from Kafka's UtilsTest.testMurmur2.
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58897971
        );
        assert_eq!(murmur2(b"abc"), 479470107);
    }
}
