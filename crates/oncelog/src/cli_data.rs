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
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::fetch_response::FetchResponse;
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::find_coordinator_response::FindCoordinatorResponse;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
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
use oncelog_client::Client;
use serde_json::{json, Value};

use crate::cli::{check, offsets};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
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
                            .with_context(|| format!("connecting to node {id} at {a}"))?;
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
    fn new(asked: bool, what: &'static str) -> Self {
        let tty = std::io::stderr().is_terminal();
        Self {
            on: asked || tty,
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
    /// Records per produce request.
    #[arg(long, default_value_t = 1000)]
    pub batch_records: usize,
    /// Report progress on stderr every second (always on a terminal).
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

    /// Sends `pending` (partition → records) and waits for the acknowledgements.
    async fn send(&mut self, c: &mut Cluster, pending: BTreeMap<i32, Vec<Record>>) -> Result<()> {
        let parts: Vec<i32> = pending.keys().copied().collect();
        self.add_partitions(c, &parts).await?;
        let mut by_leader: BTreeMap<i32, Vec<PartitionProduceData>> = BTreeMap::new();
        for (p, mut recs) in pending {
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
                    None => break,
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
        Ok(())
    }
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

pub async fn produce(bootstrap: &str, json_out: bool, a: ProduceArgs) -> Result<()> {
    let started = Instant::now();
    let mut c = Cluster::connect(bootstrap).await?;
    let mut p = Producer::init(&mut c, &a).await?;
    let nparts = p.leaders.len() as i32;
    if let Some(part) = a.partition {
        if !p.leaders.contains_key(&part) {
            bail!("{} has no partition {part} ({nparts} partitions)", a.topic);
        }
    }
    let headers = parse_headers(&a.headers)?;
    let sep = a.key_separator.as_deref().map(str::as_bytes);
    let mut progress = Progress::new(a.progress, "produced");
    let mut pending: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
    let mut npending = 0usize;
    let mut sticky = 0i32;
    let mut total = 0u64;
    let mut in_this_txn = 0u64;
    let mut txns = 0u64;
    let mut per_part: BTreeMap<i32, u64> = BTreeMap::new();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = input
            .read_until(b'\n', &mut line)
            .context("reading stdin")?;
        let eof = n == 0;
        if !eof {
            if line.last() == Some(&b'\n') {
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
            }
            let (key, value) = match sep {
                Some(sep) if !sep.is_empty() => {
                    match line.windows(sep.len()).position(|w| w == sep) {
                        Some(i) => (
                            Some(Bytes::copy_from_slice(&line[..i])),
                            Bytes::copy_from_slice(&line[i + sep.len()..]),
                        ),
                        None => (None, Bytes::copy_from_slice(&line)),
                    }
                }
                _ => (None, Bytes::copy_from_slice(&line)),
            };
            let part = match (a.partition, &key) {
                (Some(x), _) => x,
                (None, Some(k)) => (murmur2(k) & 0x7fff_ffff) % nparts.max(1),
                (None, None) => sticky,
            };
            pending.entry(part).or_default().push(Record {
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
                headers: headers.clone(),
                delete_horizon: false,
            });
            *per_part.entry(part).or_default() += 1;
            npending += 1;
            in_this_txn += 1;
        }
        let txn_full = a.transaction_records > 0 && in_this_txn >= a.transaction_records;
        if npending > 0 && (eof || npending >= a.batch_records || txn_full) {
            p.send(&mut c, std::mem::take(&mut pending)).await?;
            total += npending as u64;
            npending = 0;
            sticky = (sticky + 1) % nparts.max(1);
            progress.tick(total);
        }
        if p.txn.is_some() && (txn_full || eof) && in_this_txn > 0 {
            p.end_txn(&mut c, !a.abort).await?;
            txns += 1;
            in_this_txn = 0;
        }
        if eof {
            break;
        }
    }
    progress.done();
    let elapsed = started.elapsed().as_millis() as u64;
    let v = json!({"topic": a.topic, "records": total,
        "partitions": per_part.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<String, Value>>(),
        "transactions": txns, "outcome": if p.txn.is_none() { "acknowledged" } else if a.abort { "aborted" } else { "committed" },
        "producer_id": p.producer_id, "elapsed_ms": elapsed});
    if json_out {
        println!("{}", serde_json::to_string(&v)?);
    } else {
        let mut msg = format!("produced {total} records to {} in {elapsed} ms", a.topic);
        if p.txn.is_some() {
            msg += &format!(
                " ({txns} transactions {})",
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
    /// Where to start: earliest, latest, an offset, or @TIMESTAMP_MS.
    #[arg(long, default_value = "earliest")]
    pub from: String,
    /// read_committed (the default) or read_uncommitted.
    #[arg(long, default_value = "read_committed")]
    pub isolation: String,
    /// Start at this group's committed offsets where it has them, and commit
    /// the position reached at the end (a standalone consumer, no membership).
    #[arg(long)]
    pub group: Option<String>,
    /// Stop after this many records.
    #[arg(long)]
    pub max_messages: Option<u64>,
    /// Keep waiting for new records instead of stopping at the end
    /// (the last stable offset for read_committed) seen at the start.
    #[arg(long)]
    pub follow: bool,
    /// Stop after this many milliseconds in any case.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// value (one per line), kv (key TAB value) or json (one object per line).
    #[arg(long, default_value = "value")]
    pub format: String,
    /// Report progress on stderr every second (always on a terminal).
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

fn write_record(out: &mut impl Write, format: &str, topic: &str, p: i32, r: &Record) -> Result<()> {
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
            if let Some(v) = &r.value {
                out.write_all(v)?;
            }
            out.write_all(b"\n")?;
        }
        _ => {
            if let Some(v) = &r.value {
                out.write_all(v)?;
            }
            out.write_all(b"\n")?;
        }
    }
    Ok(())
}

pub async fn consume(bootstrap: &str, a: ConsumeArgs) -> Result<()> {
    if !matches!(a.format.as_str(), "value" | "kv" | "json") {
        bail!("--format must be value, kv or json");
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
    // Start positions: the group's committed offsets, else --from.
    let mut pos: BTreeMap<i32, i64> = match a.from.as_str() {
        "earliest" => offsets(c.bootstrap(), &topic, &parts, -2, false).await?,
        "latest" => offsets(c.bootstrap(), &topic, &parts, -1, committed_only).await?,
        x if x.starts_with('@') => {
            let ts: i64 = x[1..].parse().context("--from @TIMESTAMP_MS")?;
            let found = offsets(c.bootstrap(), &topic, &parts, ts, false).await?;
            let latest = offsets(c.bootstrap(), &topic, &parts, -1, false).await?;
            found
                .into_iter()
                .map(|(p, o)| {
                    (
                        p,
                        if o < 0 {
                            latest.get(&p).copied().unwrap_or(0)
                        } else {
                            o
                        },
                    )
                })
                .collect()
        }
        x => {
            let o: i64 = x.parse().map_err(|_| {
                anyhow!("--from must be earliest, latest, an offset or @TIMESTAMP_MS")
            })?;
            parts.iter().map(|p| (*p, o)).collect()
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
                    pos.insert(p.partition_index, p.committed_offset);
                }
            }
        }
    }
    let ends = offsets(c.bootstrap(), &topic, &parts, -1, committed_only).await?;
    let mut done: BTreeSet<i32> = BTreeSet::new();
    let mut aborted: HashMap<i32, AbortState> = HashMap::new();
    let mut progress = Progress::new(a.progress, "consumed");
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut count = 0u64;
    let limit = a.max_messages.unwrap_or(u64::MAX);
    'outer: while count < limit {
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
                    if pd.error_code == 1 {
                        // OFFSET_OUT_OF_RANGE: restart at the log start
                        let start = offsets(c.bootstrap(), &topic, &[p], -2, false).await?;
                        let s0 = start.get(&p).copied().unwrap_or(0);
                        eprintln!(
                            "{topic}-{p}: offset {} is out of range; starting at {s0}",
                            pos.get(&p).copied().unwrap_or(0)
                        );
                        pos.insert(p, s0);
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
                    let Some(data) = &pd.records else { continue };
                    let from = pos.get(&p).copied().unwrap_or(0);
                    let (recs, next) = decode_fetched(data, from, committed_only, queue, pids)?;
                    pos.insert(p, next.max(from));
                    for r in &recs {
                        if count >= limit {
                            pos.insert(p, r.offset);
                            break 'outer;
                        }
                        write_record(&mut out, &a.format, &topic, p, r)?;
                        count += 1;
                    }
                    progress.tick(count);
                }
            }
        }
    }
    out.flush()?;
    progress.done();
    if let Some(g) = &a.group {
        let req = OffsetCommitRequest::default()
            .with_group_id(GroupId(s(g)))
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(StrBytes::default())
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(s(&topic)))
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
    }
    eprintln!("consumed {count} records from {topic}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
