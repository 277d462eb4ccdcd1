//! Lock-free fixed-bucket histograms for the Prometheus exposition: request
//! latency per API, fsync latency and bytes per sync, transaction durations.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds (seconds) for latencies: 0.5 ms to 30 s.
pub const LATENCY_BOUNDS: &[f64] = &[
    0.0005, 0.001, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025,
    0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Upper bounds (bytes) for sizes: 4 KiB to 64 MiB.
pub const SIZE_BOUNDS: &[f64] = &[
    4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0,
];

pub struct Histogram {
    bounds: &'static [f64],
    /// One counter per bound, plus the +Inf bucket (not cumulative).
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    /// Sum in units of 1/`scale`, so it stays an integer.
    sum: AtomicU64,
    scale: f64,
}

impl Histogram {
    /// A histogram whose sum keeps `scale` steps per unit (1e9 for seconds
    /// kept as nanoseconds, 1 for bytes).
    pub fn new(bounds: &'static [f64], scale: f64) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            scale,
        }
    }

    pub fn latency() -> Self {
        Self::new(LATENCY_BOUNDS, 1e9)
    }

    pub fn size() -> Self {
        Self::new(SIZE_BOUNDS, 1.0)
    }

    pub fn observe(&self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum
            .fetch_add((v.max(0.0) * self.scale) as u64, Relaxed);
    }

    pub fn observe_duration(&self, d: std::time::Duration) {
        self.observe(d.as_secs_f64());
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// The sum of the observed values.
    pub fn sum(&self) -> f64 {
        self.sum.load(Relaxed) as f64 / self.scale
    }

    /// (upper bound, observations in that bucket alone), the last one's
    /// bound +Inf: what the exposition writes as cumulative `_bucket`s
    /// ([`crate::observe::exposition`]).
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        let mut v: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .enumerate()
            .map(|(i, b)| (*b, self.buckets[i].load(Relaxed)))
            .collect();
        v.push((f64::INFINITY, self.buckets[self.bounds.len()].load(Relaxed)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_what_falls_between_their_bounds() {
        let h = Histogram::latency();
        for v in [0.0001, 0.0005, 0.003, 0.2, 100.0] {
            h.observe(v);
        }
        let b = h.buckets();
        let at = |bound: f64| b.iter().find(|(x, _)| *x == bound).map(|(_, n)| *n);
        assert_eq!(at(0.0005), Some(2));
        assert_eq!(at(0.003), Some(1));
        assert_eq!(at(0.005), Some(0));
        assert_eq!(at(0.25), Some(1));
        assert_eq!(at(30.0), Some(0));
        assert_eq!(at(f64::INFINITY), Some(1));
        assert_eq!(b.iter().map(|(_, n)| n).sum::<u64>(), 5);
        assert_eq!(h.count(), 5);
    }

    #[test]
    fn sizes_sum() {
        let h = Histogram::size();
        h.observe(5000.0);
        assert_eq!(h.sum(), 5000.0);
        assert_eq!(h.buckets().iter().map(|(_, n)| n).sum::<u64>(), 1);
    }
}
