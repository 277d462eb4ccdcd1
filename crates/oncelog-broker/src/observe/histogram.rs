//! Lock-free fixed-bucket histograms for the Prometheus exposition: request
//! latency per API, fsync latency and bytes per sync, transaction durations.

use std::fmt::Write as _;
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

    /// Writes the `_bucket`, `_sum` and `_count` samples; `labels` is either
    /// empty or `key="value",…` without braces.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cum = 0u64;
        for (i, b) in self.bounds.iter().enumerate() {
            cum += self.buckets[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cum}");
        }
        cum += self.buckets[self.bounds.len()].load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cum}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let sum = self.sum.load(Relaxed) as f64 / self.scale;
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        // the count of the cumulative buckets, so the two always agree
        let _ = writeln!(out, "{name}_count{braces} {cum}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_agree_with_count() {
        let h = Histogram::latency();
        for v in [0.0001, 0.0005, 0.003, 0.2, 100.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "api=\"Produce\"");
        assert!(
            out.contains("x_bucket{api=\"Produce\",le=\"0.0005\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("x_bucket{api=\"Produce\",le=\"0.005\"} 3\n"));
        assert!(out.contains("x_bucket{api=\"Produce\",le=\"0.25\"} 4\n"));
        assert!(out.contains("x_bucket{api=\"Produce\",le=\"30\"} 4\n"));
        assert!(out.contains("x_bucket{api=\"Produce\",le=\"+Inf\"} 5\n"));
        assert!(out.contains("x_count{api=\"Produce\"} 5\n"));
        assert_eq!(h.count(), 5);
    }

    #[test]
    fn sizes_without_labels() {
        let h = Histogram::size();
        h.observe(5000.0);
        let mut out = String::new();
        h.render(&mut out, "s", "");
        assert!(out.contains("s_bucket{le=\"4096\"} 0\n"), "{out}");
        assert!(out.contains("s_bucket{le=\"16384\"} 1\n"));
        assert!(out.contains("s_sum 5000\n"));
        assert!(out.contains("s_count 1\n"));
    }
}
