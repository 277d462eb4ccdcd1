//! What the load generators (`bench-load` over librdkafka, `bench-wire`
//! over the wire protocol) share: clocks, payloads, the start handshake and
//! exit codes. No client library here.

use std::io::BufRead;

use anyhow::{bail, Context, Result};

/// Wall-clock milliseconds since the epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(crate) fn monotonic_s() -> f64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9,
        Err(_) => 0.0,
    }
}

pub(crate) fn cpu_s() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => 0.0,
    }
}

/// The exit code of a load process; a failure is also printed as the JSON
/// line its parent reads.
pub(crate) fn exit_code(result: Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            println!(
                "{}",
                serde_json::json!({"ok": false, "error": format!("{e:#}")})
            );
            1
        }
    }
}

/// `size` pseudo-random bytes seeded by `seed`: incompressible, like the
/// Python generator's os.urandom payload.
pub(crate) fn payload(size: usize, seed: u64) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ seed;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Reads the parent's `go T0 WARMUP SECONDS` line from stdin.
pub(crate) fn read_go_line() -> Result<(f64, f64, f64)> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|s| s.parse::<f64>())
        .collect::<Result<_, _>>()
        .context("bad go line")?;
    let [t0, warmup, seconds] = f[..] else {
        bail!("expected `go T0 WARMUP SECONDS`, got {line:?}");
    };
    Ok((t0, warmup, seconds))
}
