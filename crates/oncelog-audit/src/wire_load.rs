//! A lean closed-loop produce load (`oncelog bench-wire`) for the benchmark
//! suite. It speaks the Kafka wire protocol over one blocking TCP connection
//! (framed by `oncelog_client::frame`, into buffers it reuses): an
//! idempotent producer id from InitProducerId, then Produce
//! requests (acks=all) carrying one record batch per partition, up to
//! `--window` requests in flight, exactly as a Kafka producer with
//! `max.in.flight.requests.per_connection` does.
//!
//! The records of a batch are encoded once; each batch only gets a new header
//! (sequence, timestamps, CRC-32C). So the generator needs about 5-8 % of a
//! core per 100 MB/s (most of it the kernel's socket copy) and never
//! busy-polls: it blocks in `write` and `read`.
//! That leaves the machine's CPU to the broker under test, which is what the
//! suite wants to measure. It works against any Kafka-compatible broker.
//!
//! The line protocol with its parent is the one of `oncelog bench-load`
//! (`ready`, `go T0 WARMUP SECONDS`, one JSON line, f32 latencies in
//! `--latency-file`). A message's latency is its request's: from writing the
//! request to reading its response; all messages of a request share it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::produce_response::ProduceResponse;
use kafka_protocol::messages::{ApiKey, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use oncelog_client::frame::{common_version, decode_response, encode_request, version_ranges};

use crate::load_common::{cpu_s, exit_code, monotonic_s, now_ms, payload, read_go_line};

/// The client id of every request.
const CLIENT_ID: &str = "oncelog-bench-wire";

/// Produce v9 is the last version that names topics (v13 uses topic ids)
/// and is flexible; every broker the suite runs serves it.
const PRODUCE_MAX_VERSION: i16 = 9;

#[derive(clap::Args, Debug, Clone)]
pub struct WireLoadArgs {
    /// host:port of the partition leader (the suite runs one broker).
    #[arg(long)]
    pub bootstrap: String,
    #[arg(long)]
    pub topic: String,
    #[arg(long, default_value_t = 1)]
    pub partitions: i32,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Record bytes per request, split evenly over the partitions (like a
    /// producer's batch.size with messages spread round-robin).
    #[arg(long, default_value_t = 1_000_000)]
    pub request_bytes: usize,
    /// Requests in flight on the connection.
    #[arg(long, default_value_t = 5)]
    pub window: usize,
    /// This producer's index (seeds its payload).
    #[arg(long, default_value_t = 0)]
    pub index: u64,
    /// Stop after this many messages (0: run for the whole window).
    #[arg(long, default_value_t = 0)]
    pub max_msgs: u64,
    /// Seconds to wait for each response.
    #[arg(long, default_value_t = 60.0)]
    pub flush_timeout: f64,
    /// Open loop: this many messages per second, one request every
    /// `--linger-ms`; a message's latency then counts from when its request
    /// was due, so a slow broker cannot hide its queueing.
    #[arg(long)]
    pub rate: Option<f64>,
    #[arg(long, default_value_t = 5.0)]
    pub linger_ms: f64,
    /// Plain acks=all produce without a producer id or sequences.
    #[arg(long)]
    pub no_idempotence: bool,
    #[arg(long)]
    pub latency_file: std::path::PathBuf,
}

pub fn run(args: WireLoadArgs) -> i32 {
    exit_code(run_inner(&args))
}

/// The writing half of the connection: frames and sends requests.
struct Writer {
    stream: TcpStream,
    correlation: i32,
    frame: BytesMut,
}

impl Writer {
    /// Writes one request; returns its correlation id.
    fn send<R: Encodable>(&mut self, key: ApiKey, version: i16, req: &R) -> Result<i32> {
        self.correlation += 1;
        let corr = self.correlation;
        self.frame.clear();
        encode_request(&mut self.frame, key, version, corr, CLIENT_ID, req)
            .with_context(|| format!("encoding a {key:?} request"))?;
        self.stream
            .write_all(&self.frame)
            .with_context(|| format!("writing a {key:?} request"))?;
        Ok(corr)
    }
}

/// The reading half: responses arrive in request order on one connection.
struct Reader {
    stream: TcpStream,
    body: Vec<u8>,
}

impl Reader {
    /// Reads the next response, which must answer `corr`.
    fn recv<R: Decodable>(&mut self, key: ApiKey, version: i16, corr: i32) -> Result<R> {
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .with_context(|| format!("reading a {key:?} response"))?;
        let n = i32::from_be_bytes(len);
        if !(0..=64 << 20).contains(&n) {
            bail!("{key:?} response of {n} bytes");
        }
        self.body.resize(n as usize, 0);
        self.stream
            .read_exact(&mut self.body)
            .with_context(|| format!("reading a {key:?} response"))?;
        decode_response(Bytes::copy_from_slice(&self.body), key, version, corr)
            .with_context(|| format!("decoding a {key:?} response"))
    }
}

fn connect(addr: &str, timeout: Duration) -> Result<(Writer, Reader)> {
    let stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let reader = Reader {
        stream: stream.try_clone()?,
        body: Vec::new(),
    };
    let writer = Writer {
        stream,
        correlation: 0,
        frame: BytesMut::with_capacity(2 << 20),
    };
    Ok((writer, reader))
}

fn call<Req: Encodable, Resp: Decodable>(
    conn: &mut (Writer, Reader),
    key: ApiKey,
    version: i16,
    req: &Req,
) -> Result<Resp> {
    let corr = conn.0.send(key, version, req)?;
    conn.1.recv(key, version, corr)
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn put_varint(buf: &mut BytesMut, v: i64) {
    let mut u = zigzag(v);
    while u >= 0x80 {
        buf.put_u8((u as u8) | 0x80);
        u >>= 7;
    }
    buf.put_u8(u as u8);
}

/// `n` records of `payload`, offset deltas 0..n, timestamp delta 0, no key,
/// no headers: the part of a v2 batch after its 61-byte header.
fn encode_records(payload: &[u8], n: usize) -> BytesMut {
    let mut out = BytesMut::with_capacity(n * (payload.len() + 16));
    let mut rec = BytesMut::with_capacity(payload.len() + 16);
    for i in 0..n {
        rec.clear();
        rec.put_i8(0); // attributes
        put_varint(&mut rec, 0); // timestamp delta
        put_varint(&mut rec, i as i64); // offset delta
        put_varint(&mut rec, -1); // null key
        put_varint(&mut rec, payload.len() as i64);
        rec.put_slice(payload);
        put_varint(&mut rec, 0); // headers
        put_varint(&mut out, rec.len() as i64);
        out.put_slice(&rec);
    }
    out
}

const BATCH_HEADER: usize = 61;

/// A v2 record batch around pre-encoded `records` (`n` of them).
fn batch(records: &[u8], n: usize, pid: i64, epoch: i16, seq: i32, ts_ms: i64) -> Bytes {
    let mut b = BytesMut::with_capacity(BATCH_HEADER + records.len());
    b.put_i64(0); // base offset, assigned by the broker
    b.put_i32((BATCH_HEADER - 12 + records.len()) as i32);
    b.put_i32(-1); // partition leader epoch
    b.put_i8(2); // magic
    b.put_u32(0); // crc, below
    b.put_i16(0); // attributes: no compression, create time, not transactional
    b.put_i32(n as i32 - 1); // last offset delta
    b.put_i64(ts_ms);
    b.put_i64(ts_ms);
    b.put_i64(pid);
    b.put_i16(epoch);
    b.put_i32(seq);
    b.put_i32(n as i32);
    b.put_slice(records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}

struct InFlight {
    corr: i32,
    /// When the request was sent, or (at a fixed rate) when it was due.
    sent_s: f64,
    msgs: u64,
}

/// The producer: its id, per-partition sequences and the pre-encoded records.
struct Producer {
    writer: Writer,
    version: i16,
    topic: TopicName,
    partitions: i32,
    pid: i64,
    epoch: i16,
    seq: Vec<i32>,
    records: Bytes,
    per_batch: usize,
}

impl Producer {
    fn msgs_per_request(&self) -> u64 {
        (self.per_batch * self.partitions as usize) as u64
    }

    /// Sends one request with a batch for every partition.
    fn send(&mut self, due_s: Option<f64>) -> Result<InFlight> {
        let ts = now_ms() as i64;
        let mut parts = Vec::with_capacity(self.partitions as usize);
        for p in 0..self.partitions {
            let s = &mut self.seq[p as usize];
            let records = batch(&self.records, self.per_batch, self.pid, self.epoch, *s, ts);
            if self.pid >= 0 {
                *s = s.wrapping_add(self.per_batch as i32) & i32::MAX;
            }
            parts.push(
                PartitionProduceData::default()
                    .with_index(p)
                    .with_records(Some(records)),
            );
        }
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(self.topic.clone())
                .with_partition_data(parts)]);
        let sent_s = due_s.unwrap_or_else(monotonic_s);
        let corr = self.writer.send(ApiKey::Produce, self.version, &req)?;
        Ok(InFlight {
            corr,
            sent_s,
            msgs: self.msgs_per_request(),
        })
    }
}

/// Reads `f`'s response; fails on any partition error.
fn recv_produce(reader: &mut Reader, version: i16, f: &InFlight) -> Result<()> {
    let resp: ProduceResponse = reader.recv(ApiKey::Produce, version, f.corr)?;
    for t in &resp.responses {
        for p in &t.partition_responses {
            if p.error_code != 0 {
                bail!(
                    "produce to partition {} failed: error code {} ({:?})",
                    p.index,
                    p.error_code,
                    p.error_message.as_deref()
                );
            }
        }
    }
    Ok(())
}

#[derive(Default)]
struct Acked {
    all: u64,
    window: u64,
    latency_ms: Vec<f32>,
}

/// The reading thread: takes in-flight requests in order, waits for each
/// response and frees a window slot.
fn read_loop(
    mut reader: Reader,
    version: i16,
    in_flight: mpsc::Receiver<InFlight>,
    slots: mpsc::SyncSender<()>,
    window: (f64, f64),
) -> Result<Acked> {
    let mut acked = Acked::default();
    for f in in_flight {
        recv_produce(&mut reader, version, &f)?;
        let lat_s = monotonic_s() - f.sent_s;
        acked.all += f.msgs;
        if window.0 <= f.sent_s && f.sent_s < window.1 {
            acked.window += f.msgs;
            let ms = (lat_s * 1e3) as f32;
            acked
                .latency_ms
                .extend(std::iter::repeat_n(ms, f.msgs as usize));
        }
        // the writer may have stopped already
        let _ = slots.try_send(());
    }
    Ok(acked)
}

/// Error codes InitProducerId answers while a broker is still starting
/// (Kafka allocates producer ids through its controller).
fn retriable(code: i16) -> bool {
    use ResponseError::*;
    matches!(
        ResponseError::try_from_code(code),
        Some(
            CoordinatorLoadInProgress
                | CoordinatorNotAvailable
                | NotCoordinator
                | ConcurrentTransactions
                | RequestTimedOut
        )
    )
}

fn run_inner(args: &WireLoadArgs) -> Result<()> {
    if args.partitions < 1 || args.window < 1 || args.size == 0 {
        bail!("--partitions, --window and --size must be at least 1");
    }
    let timeout = Duration::from_secs_f64(args.flush_timeout.max(1.0));
    let mut conn = connect(&args.bootstrap, timeout)?;
    let av: ApiVersionsResponse = call(
        &mut conn,
        ApiKey::ApiVersions,
        0,
        &ApiVersionsRequest::default(),
    )?;
    let ranges = version_ranges(&av);
    let pick = |key: ApiKey, ours: (i16, i16)| {
        common_version(&ranges, key, ours).map_err(|_| match ranges.get(&(key as i16)) {
            Some((lo, hi)) => anyhow!("no common {key:?} version (broker {lo}..={hi})"),
            None => anyhow!("the broker does not serve {key:?}"),
        })
    };
    let version = pick(ApiKey::Produce, (3, PRODUCE_MAX_VERSION))?;
    let ipv = pick(ApiKey::InitProducerId, (0, 4))?;
    let deadline = monotonic_s() + 60.0;
    let (pid, epoch) = if args.no_idempotence {
        (-1, -1)
    } else {
        loop {
            let ip: InitProducerIdResponse = call(
                &mut conn,
                ApiKey::InitProducerId,
                ipv,
                &InitProducerIdRequest::default()
                    .with_transactional_id(None)
                    .with_transaction_timeout_ms(60_000)
                    .with_producer_id((-1).into())
                    .with_producer_epoch(-1),
            )?;
            match ip.error_code {
                0 => break (ip.producer_id.0, ip.producer_epoch),
                c if retriable(c) && monotonic_s() < deadline => {
                    std::thread::sleep(Duration::from_millis(200))
                }
                c => bail!("InitProducerId failed: error code {c}"),
            }
        }
    };
    let per_batch = match args.rate {
        // a request every linger interval, carrying what arrived in it
        Some(rate) => {
            ((rate * args.linger_ms / 1e3 / args.partitions as f64).ceil() as usize).max(1)
        }
        // Each record is the payload plus at most 16 bytes of framing.
        None => (args.request_bytes / args.partitions as usize / (args.size + 16)).max(1),
    };
    let records = encode_records(&payload(args.size, args.index), per_batch).freeze();
    let (writer, mut reader) = conn;
    let mut p = Producer {
        writer,
        version,
        topic: TopicName(StrBytes::from_string(args.topic.clone())),
        partitions: args.partitions,
        pid,
        epoch,
        seq: vec![if pid >= 0 { 0 } else { -1 }; args.partitions as usize],
        records,
        per_batch,
    };
    // warm-up: one acknowledged request
    let f = p.send(None)?;
    recv_produce(&mut reader, version, &f)?;
    println!("ready");
    std::io::stdout().flush()?;

    let (t0, warmup, seconds) = read_go_line()?;
    let (w0, w1) = (t0 + warmup, t0 + warmup + seconds);
    let (slots_tx, slots_rx) = mpsc::sync_channel::<()>(args.window);
    for _ in 0..args.window {
        slots_tx.send(())?;
    }
    let (flight_tx, flight_rx) = mpsc::channel::<InFlight>();
    let reading =
        std::thread::spawn(move || read_loop(reader, version, flight_rx, slots_tx, (w0, w1)));
    while monotonic_s() < t0 {
        std::thread::sleep(Duration::from_micros(500));
    }
    let cpu0 = cpu_s();
    let per_request = p.msgs_per_request();
    let interval_s = args.rate.map(|r| per_request as f64 / r);
    let mut sent = 0u64;
    let mut due = t0;
    let send_result = loop {
        if monotonic_s() >= w1 || (args.max_msgs > 0 && sent >= args.max_msgs) {
            break Ok(());
        }
        if interval_s.is_some() {
            let wait = due - monotonic_s();
            if wait > 0.0 {
                std::thread::sleep(Duration::from_secs_f64(wait));
            }
        }
        // a free window slot; none for the whole timeout means the reader
        // has stopped or the broker does not answer
        if slots_rx.recv_timeout(timeout).is_err() {
            break Err(anyhow!("no response for {timeout:?} or the reader stopped"));
        }
        let f = match p.send(interval_s.map(|_| due)) {
            Ok(f) => f,
            Err(e) => break Err(e),
        };
        if let Some(iv) = interval_s {
            due += iv;
        }
        sent += f.msgs;
        if flight_tx.send(f).is_err() {
            break Err(anyhow!("the reader stopped"));
        }
    };
    let t_stop = monotonic_s();
    drop(flight_tx);
    let acked = reading.join().map_err(|_| anyhow!("the reader panicked"))?;
    let cpu = cpu_s() - cpu0;
    // the reader's error says why the writer stopped, so it comes first
    let acked = acked?;
    send_result?;
    let mut bytes = Vec::with_capacity(acked.latency_ms.len() * 4);
    for v in &acked.latency_ms {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&args.latency_file, bytes).context("writing the latency file")?;
    let out = serde_json::json!({
        "ok": true,
        "sent": sent,
        "acked_window": acked.window,
        "acked_all": acked.all,
        "errors": 0,
        "last_error": null,
        "unflushed": sent - acked.all,
        "t_start": t0,
        "t_stop": t_stop,
        "t_end": monotonic_s(),
        "cpu_s": cpu,
        "msgs_per_request": per_request,
    });
    println!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_zigzag_encoded() {
        let mut b = BytesMut::new();
        for v in [0, -1, 1, 63, -64, 64, 300] {
            put_varint(&mut b, v);
        }
        assert_eq!(&b[..], &[0, 1, 2, 126, 127, 128, 1, 216, 4]);
    }

    #[test]
    fn batch_header_and_crc_are_consistent() {
        let records = encode_records(b"abc", 3);
        let b = batch(&records, 3, 7, 1, 42, 1_000);
        assert_eq!(b.len(), BATCH_HEADER + records.len());
        let len = i32::from_be_bytes(b[8..12].try_into().unwrap());
        assert_eq!(len as usize, b.len() - 12);
        assert_eq!(b[16], 2);
        let crc = u32::from_be_bytes(b[17..21].try_into().unwrap());
        assert_eq!(crc, crc32c::crc32c(&b[21..]));
        assert_eq!(i32::from_be_bytes(b[23..27].try_into().unwrap()), 2);
        assert_eq!(i32::from_be_bytes(b[53..57].try_into().unwrap()), 42);
        assert_eq!(i32::from_be_bytes(b[57..61].try_into().unwrap()), 3);
        // first record: body of 9 bytes (attrs, ts, offset, key, len, 3 bytes,
        // headers), zigzag length 18; the next one starts the same way
        assert_eq!(&b[61..72], &[18, 0, 0, 0, 1, 6, b'a', b'b', b'c', 0, 18]);
    }
}
