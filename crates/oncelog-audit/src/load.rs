//! A native closed-loop produce load (`oncelog bench-load`) for the benchmark
//! suite: librdkafka without an interpreter in front of it, so a load
//! generator on a 2-core machine leaves CPU to the broker under test.
//!
//! The process speaks a line protocol with its parent:
//! - it warms up (metadata, connections, producer id, one acknowledged
//!   message per partition) and prints `ready`;
//! - it reads one line `go T0 WARMUP SECONDS` (T0 on CLOCK_MONOTONIC, in
//!   seconds, the clock Python's `time.monotonic()` reads), sends as fast as
//!   the client queue allows from T0 until T0 + WARMUP + SECONDS, flushes;
//! - it prints one JSON object with its counts and writes the ack latency (ms,
//!   f32 little-endian) of every message sent inside the measured window to
//!   `--latency-file`.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use crate::load_common::{cpu_s, exit_code, monotonic_s, payload, read_go_line};

#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    #[arg(long)]
    pub topic: String,
    #[arg(long, default_value_t = 1)]
    pub partitions: i32,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Consecutive messages sent to one partition before moving on.
    #[arg(long, default_value_t = 1)]
    pub chunk: u64,
    /// This producer's index: where in the partition rotation it starts.
    #[arg(long, default_value_t = 0)]
    pub index: u64,
    /// Stop after this many messages (0: run for the whole window).
    #[arg(long, default_value_t = 0)]
    pub max_msgs: u64,
    #[arg(long, default_value_t = 60.0)]
    pub flush_timeout: f64,
    #[arg(long)]
    pub latency_file: std::path::PathBuf,
    /// librdkafka properties, KEY=VALUE, repeatable.
    #[arg(long = "conf", value_name = "KEY=VALUE")]
    pub conf: Vec<String>,
}

/// Nanoseconds on CLOCK_MONOTONIC; a message's opaque is its send time.
fn now_ns() -> usize {
    (monotonic_s() * 1e9) as usize
}

#[derive(Default)]
struct Counts {
    window_ns: Mutex<(usize, usize)>,
    acked_window: AtomicU64,
    acked_all: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
    latency_ms: Mutex<Vec<f32>>,
}

struct LoadContext(Counts);

impl ClientContext for LoadContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        eprintln!("librdkafka {level:?} {fac}: {log_message}");
    }
}

impl ProducerContext for LoadContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_ns: usize) {
        let c = &self.0;
        match result {
            Ok(_) => {
                c.acked_all.fetch_add(1, Ordering::Relaxed);
                let (w0, w1) = *c.window_ns.lock().unwrap_or_else(|e| e.into_inner());
                if w0 <= sent_ns && sent_ns < w1 {
                    c.acked_window.fetch_add(1, Ordering::Relaxed);
                    let ms = now_ns().saturating_sub(sent_ns) as f64 / 1e6;
                    c.latency_ms
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(ms as f32);
                }
            }
            Err((e, _)) => {
                c.errors.fetch_add(1, Ordering::Relaxed);
                *c.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
            }
        }
    }
}

pub fn run(args: LoadArgs) -> i32 {
    exit_code(run_inner(&args))
}

fn run_inner(args: &LoadArgs) -> Result<()> {
    if args.partitions < 1 || args.chunk < 1 {
        bail!("--partitions and --chunk must be at least 1");
    }
    let mut cfg = crate::rdkafka_config();
    for kv in &args.conf {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("--conf {kv:?} is not KEY=VALUE"))?;
        cfg.set(k, v);
    }
    let producer: BaseProducer<LoadContext> = cfg
        .create_with_context(LoadContext(Counts::default()))
        .context("creating the producer")?;
    let counts = &producer.context().0;
    let payload = payload(args.size, args.index);
    for p in 0..args.partitions {
        send(&producer, &args.topic, p, &payload)?;
    }
    producer
        .flush(Duration::from_secs(60))
        .context("warm-up messages not acknowledged within 60 s")?;
    if counts.errors.load(Ordering::Relaxed) > 0 {
        bail!(
            "warm-up failed: {}",
            counts
                .last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_default()
        );
    }
    counts.acked_all.store(0, Ordering::Relaxed);
    println!("ready");
    std::io::stdout().flush()?;

    let (t0, warmup, seconds) = read_go_line()?;
    let (w0, w1) = (t0 + warmup, t0 + warmup + seconds);
    *counts.window_ns.lock().unwrap_or_else(|e| e.into_inner()) =
        ((w0 * 1e9) as usize, (w1 * 1e9) as usize);
    while monotonic_s() < t0 {
        std::thread::sleep(Duration::from_micros(500));
    }
    let cpu0 = cpu_s();
    let parts = args.partitions as u64;
    let offset = args.index * args.chunk;
    let mut k: u64 = 0;
    loop {
        let part = (((k + offset) / args.chunk) % parts) as i32;
        let rec = BaseRecord::with_opaque_to(&args.topic, now_ns())
            .payload(&payload[..])
            .partition(part);
        match producer.send::<(), [u8]>(rec) {
            Ok(()) => k += 1,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                // Sleep rather than poll with a timeout: the crate's poll
                // re-checks its deadline in a loop and keeps a core busy.
                std::thread::sleep(Duration::from_micros(200));
                producer.poll(Duration::ZERO);
            }
            Err((e, _)) => return Err(e).context("produce"),
        }
        if k & 127 == 0 {
            producer.poll(Duration::ZERO);
            if monotonic_s() >= w1 || (args.max_msgs > 0 && k >= args.max_msgs) {
                break;
            }
        }
    }
    let t_stop = monotonic_s();
    let unflushed = match producer.flush(Duration::from_secs_f64(args.flush_timeout)) {
        Ok(()) => 0,
        Err(_) => producer.in_flight_count(),
    };
    let cpu = cpu_s() - cpu0;
    let lat = std::mem::take(&mut *counts.latency_ms.lock().unwrap_or_else(|e| e.into_inner()));
    let mut bytes = Vec::with_capacity(lat.len() * 4);
    for v in lat {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&args.latency_file, bytes).context("writing the latency file")?;
    let out = serde_json::json!({
        "ok": true,
        "sent": k,
        "acked_window": counts.acked_window.load(Ordering::Relaxed),
        "acked_all": counts.acked_all.load(Ordering::Relaxed),
        "errors": counts.errors.load(Ordering::Relaxed),
        "last_error": counts.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        "unflushed": unflushed,
        "t_start": t0,
        "t_stop": t_stop,
        "t_end": monotonic_s(),
        "cpu_s": cpu,
    });
    println!("{out}");
    Ok(())
}

fn send(
    producer: &BaseProducer<LoadContext>,
    topic: &str,
    part: i32,
    payload: &[u8],
) -> Result<()> {
    loop {
        let rec = BaseRecord::with_opaque_to(topic, now_ns())
            .payload(payload)
            .partition(part);
        match producer.send::<(), [u8]>(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                producer.poll(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(e).context("produce"),
        }
    }
}
