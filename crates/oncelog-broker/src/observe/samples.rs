//! A short history of the broker's rates, for the console's sparklines: the
//! broker's running totals are read once a second ([`Samples::record`]) and
//! each sample is the rate over the second before it. The last [`KEEP`]
//! samples are kept, in memory only.
//!
//! Pure bookkeeping: the caller reads the totals and passes the time.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

/// Samples kept: two minutes at one a second.
pub const KEEP: usize = 120;

/// The broker's running totals at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub time_ms: i64,
    pub appended_bytes: u64,
    pub fsyncs: u64,
    /// Seconds spent in the fsyncs counted by `fsyncs`.
    pub fsync_seconds: f64,
    pub commits: u64,
    pub aborts: u64,
    pub requests: u64,
}

/// Rates over the interval ending at `time_ms`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Sample {
    pub time_ms: i64,
    pub appended_bytes_per_s: f64,
    pub fsyncs_per_s: f64,
    /// Mean fsync duration in the interval (0 when there was none).
    pub fsync_ms: f64,
    pub commits_per_s: f64,
    pub aborts_per_s: f64,
    pub requests_per_s: f64,
}

#[derive(Debug)]
pub struct Samples {
    started_ms: i64,
    inner: Mutex<(Option<Totals>, VecDeque<Sample>)>,
}

fn rate(now: u64, before: u64, secs: f64) -> f64 {
    now.saturating_sub(before) as f64 / secs
}

impl Samples {
    pub fn new(started_ms: i64) -> Self {
        Self {
            started_ms,
            inner: Mutex::new((None, VecDeque::with_capacity(KEEP))),
        }
    }

    /// When the broker started.
    pub fn started_ms(&self) -> i64 {
        self.started_ms
    }

    /// Takes the totals at `t.time_ms`; from the second call on, appends
    /// the rates since the previous one. A clock that did not move forward
    /// adds nothing (the totals are kept for the next call).
    pub fn record(&self, t: Totals) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (last, samples) = &mut *g;
        if let Some(prev) = *last {
            let ms = t.time_ms - prev.time_ms;
            if ms <= 0 {
                return;
            }
            let secs = ms as f64 / 1000.0;
            let syncs = t.fsyncs.saturating_sub(prev.fsyncs);
            let sync_secs = (t.fsync_seconds - prev.fsync_seconds).max(0.0);
            let s = Sample {
                time_ms: t.time_ms,
                appended_bytes_per_s: rate(t.appended_bytes, prev.appended_bytes, secs),
                fsyncs_per_s: syncs as f64 / secs,
                fsync_ms: if syncs == 0 {
                    0.0
                } else {
                    sync_secs * 1000.0 / syncs as f64
                },
                commits_per_s: rate(t.commits, prev.commits, secs),
                aborts_per_s: rate(t.aborts, prev.aborts, secs),
                requests_per_s: rate(t.requests, prev.requests, secs),
            };
            while samples.len() >= KEEP {
                samples.pop_front();
            }
            samples.push_back(s);
        }
        *last = Some(t);
    }

    /// The samples, oldest first.
    pub fn recent(&self) -> Vec<Sample> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.1.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(time_ms: i64, bytes: u64, fsyncs: u64, fsync_seconds: f64) -> Totals {
        Totals {
            time_ms,
            appended_bytes: bytes,
            fsyncs,
            fsync_seconds,
            commits: fsyncs / 2,
            aborts: 0,
            requests: fsyncs * 3,
        }
    }

    #[test]
    fn rates_are_deltas_over_the_interval() {
        let s = Samples::new(0);
        s.record(totals(1_000, 0, 0, 0.0));
        assert!(s.recent().is_empty(), "one reading is no rate");
        s.record(totals(3_000, 4_000_000, 100, 0.5));
        let r = s.recent();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].time_ms, 3_000);
        assert!((r[0].appended_bytes_per_s - 2_000_000.0).abs() < 1e-6);
        assert!((r[0].fsyncs_per_s - 50.0).abs() < 1e-9);
        assert!((r[0].fsync_ms - 5.0).abs() < 1e-9);
        assert!((r[0].commits_per_s - 25.0).abs() < 1e-9);
        assert!((r[0].requests_per_s - 150.0).abs() < 1e-9);
        // no fsync in an interval: 0 ms, not NaN
        s.record(totals(4_000, 4_000_000, 100, 0.5));
        assert_eq!(s.recent()[1].fsync_ms, 0.0);
        assert_eq!(s.recent()[1].appended_bytes_per_s, 0.0);
    }

    #[test]
    fn bounded_and_clock_safe() {
        let s = Samples::new(0);
        for i in 0..(KEEP as i64 + 30) {
            s.record(totals(i * 1000, i as u64, 0, 0.0));
        }
        let r = s.recent();
        assert_eq!(r.len(), KEEP);
        assert_eq!(r.last().map(|x| x.time_ms), Some((KEEP as i64 + 29) * 1000));
        // a clock going back adds nothing, and counters going back give 0
        s.record(totals(5, 0, 0, 0.0));
        assert_eq!(s.recent().len(), KEEP);
        s.record(totals((KEEP as i64 + 31) * 1000, 0, 0, 0.0));
        assert_eq!(s.recent().last().map(|x| x.appended_bytes_per_s), Some(0.0));
    }
}
