//! The log cleaner service: which compacted partition to clean and when,
//! on a bounded number of threads with bounded memory and a shared I/O cap.
//!
//! The pass itself is `oncelog_log::cleaner` (offset map, transaction-safe
//! copy, crash-safe swap). This module adds Kafka's scheduling rules:
//! a partition of a topic whose `cleanup.policy` has `compact` is cleaned
//! when the dirty share of its cleanable log reaches
//! `min.cleanable.dirty.ratio`, or when dirty records are older than
//! `max.compaction.lag.ms`; records younger than `min.compaction.lag.ms`
//! are not cleanable. Where the last pass stopped (the first dirty offset)
//! is kept in `cleaner-offset` in the partition's directory, so a restart
//! does not clean everything again; losing it only costs a longer pass.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oncelog_log::cleaner::{self, CleanOptions, CleanStats};
use oncelog_log::now_ms;
use serde::Serialize;

use crate::backend::local::partition::{CleanPlan, Partition};
use crate::backend::local::topics::Topics;
use crate::files::write_atomically;

/// The cleaner threads' nice value.
pub const CLEANER_NICE: i32 = 10;

/// Where a partition's first dirty offset is kept.
pub const CLEANER_OFFSET_FILE: &str = "cleaner-offset";

/// The broker-wide cleaner settings.
#[derive(Debug, Clone)]
pub struct CleanerSettings {
    pub threads: usize,
    pub dedupe_buffer_size: u64,
    pub io_max_bytes_per_second: Option<f64>,
    pub backoff: Duration,
}

/// A compacted topic's cleaning settings.
#[derive(Debug, Clone, Copy)]
pub struct CompactSettings {
    pub min_cleanable_ratio: f64,
    pub delete_retention_ms: i64,
    pub min_compaction_lag_ms: i64,
    pub max_compaction_lag_ms: i64,
}

/// One partition's cleaning, as `oncelog topic describe` and `/metrics` show it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CleanerStatus {
    pub first_dirty_offset: i64,
    pub cleanable_bytes: u64,
    pub dirty_bytes: u64,
    pub dirty_ratio: f64,
    pub passes: u64,
    pub last_clean_ms: i64,
    pub last_pass_ms: u64,
    pub last_bytes_read: u64,
    pub last_bytes_written: u64,
    pub last_records_kept: u64,
    pub last_records_read: u64,
    pub last_aborted_records_removed: u64,
    pub last_error: Option<String>,
}

/// Totals since start, for `/metrics`.
#[derive(Debug, Default)]
pub struct CleanerTotals {
    pub passes: AtomicU64,
    pub errors: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub records_removed: AtomicU64,
    pub aborted_records_removed: AtomicU64,
    /// Milliseconds spent cleaning (throughput = bytes read / this).
    pub busy_ms: AtomicU64,
    /// Milliseconds spent asleep for `log.cleaner.io.max.bytes.per.second`.
    pub throttled_ms: AtomicU64,
}

/// A byte budget per second shared by every cleaner thread.
struct Throttle {
    limit: Option<f64>,
    window: Mutex<(Instant, f64)>,
}

impl Throttle {
    fn new(limit: Option<f64>) -> Self {
        Self {
            limit,
            window: Mutex::new((Instant::now(), 0.0)),
        }
    }

    /// Counts `bytes`; sleeps as long as the budget is overdrawn.
    fn charge(&self, bytes: u64, totals: &CleanerTotals) {
        let Some(limit) = self.limit else {
            return;
        };
        let wait = {
            let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
            let elapsed = w.0.elapsed().as_secs_f64();
            if elapsed > 1.0 {
                *w = (Instant::now(), 0.0);
            }
            w.1 += bytes as f64;
            let due = w.1 / limit;
            let elapsed = w.0.elapsed().as_secs_f64();
            (due > elapsed).then(|| Duration::from_secs_f64(due - elapsed))
        };
        if let Some(d) = wait {
            std::thread::sleep(d);
            totals
                .throttled_ms
                .fetch_add(d.as_millis() as u64, Ordering::Relaxed);
        }
    }
}

pub struct LogCleaner {
    settings: CleanerSettings,
    throttle: Throttle,
    pub totals: CleanerTotals,
    status: Mutex<HashMap<String, CleanerStatus>>,
    busy: Mutex<HashSet<String>>,
    stop: AtomicBool,
}

fn read_first_dirty(dir: &Path) -> Option<i64> {
    std::fs::read_to_string(dir.join(CLEANER_OFFSET_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// What cleaning `plan` from `first_dirty` would cover: (cleanable bytes,
/// dirty bytes, the oldest dirty segment's last write).
fn dirt(plan: &CleanPlan, first_dirty: i64) -> (u64, u64, Option<i64>) {
    let total: u64 = plan.segments.iter().map(|s| s.size).sum();
    let dirty: Vec<_> = plan
        .segments
        .iter()
        .filter(|s| s.next > first_dirty)
        .collect();
    let dirty_bytes = dirty.iter().map(|s| s.size).sum();
    (
        total,
        dirty_bytes,
        dirty.first().map(|s| s.last_modified_ms),
    )
}

impl LogCleaner {
    pub fn new(settings: CleanerSettings) -> Self {
        Self {
            throttle: Throttle::new(settings.io_max_bytes_per_second),
            settings,
            totals: CleanerTotals::default(),
            status: Mutex::new(HashMap::new()),
            busy: Mutex::new(HashSet::new()),
            stop: AtomicBool::new(false),
        }
    }

    /// The cleaning status of partition `name` (`topic-index`), if it is compacted.
    pub fn status_of(&self, name: &str) -> Option<CleanerStatus> {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Every compacted partition's status.
    pub fn statuses(&self) -> Vec<(String, CleanerStatus)> {
        let st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = st.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    fn update(&self, name: &str, f: impl FnOnce(&mut CleanerStatus)) {
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        f(st.entry(name.to_string()).or_default());
    }

    /// Starts the cleaner threads; they stop when [`Self::shutdown`] is called.
    pub fn start(self: &Arc<Self>, topics: Arc<dyn Fn() -> Vec<Candidate> + Send + Sync>) {
        for i in 0..self.settings.threads {
            let me = self.clone();
            let topics = topics.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("log-cleaner-{i}"))
                .spawn(move || {
                    // Cleaning is background work: under load the request
                    // path gets the CPU first, idle CPU still cleans at full speed.
                    if let Err(e) = crate::nice::lower_current_thread(CLEANER_NICE) {
                        tracing::warn!(error = %e, "could not lower the log cleaner's CPU priority");
                    }
                    while !me.stop.load(Ordering::Relaxed) {
                        if !me.clean_one(&topics()) {
                            me.sleep(me.settings.backoff);
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "could not start a log cleaner thread");
            }
        }
    }

    fn sleep(&self, d: Duration) {
        let until = Instant::now() + d;
        while !self.stop.load(Ordering::Relaxed) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
        }
    }

    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Looks at every compacted partition, records its dirt, and cleans the
    /// dirtiest one that is due. True if it cleaned one (false also when
    /// that pass failed).
    pub fn clean_one(&self, candidates: &[Candidate]) -> bool {
        let now = now_ms();
        // Forget partitions no longer compacted (deleted, or policy changed).
        let names: HashSet<String> = candidates.iter().map(|c| c.partition.name()).collect();
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| names.contains(k));
        let mut best: Option<(f64, &Candidate, CleanPlan, i64)> = None;
        for c in candidates {
            let name = c.partition.name();
            if self
                .busy
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&name)
            {
                continue;
            }
            let newest = if c.settings.min_compaction_lag_ms > 0 {
                now - c.settings.min_compaction_lag_ms
            } else {
                -1
            };
            let Some(plan) = c.partition.clean_plan(newest) else {
                continue;
            };
            let first_base = plan.segments.first().map_or(plan.log_end, |s| s.base);
            let mut first_dirty = read_first_dirty(&plan.dir).unwrap_or(first_base);
            if first_dirty > plan.log_end {
                // The log is not the one the offset was written for.
                first_dirty = first_base;
            }
            let first_dirty = first_dirty.max(first_base);
            let (total, dirty, oldest_dirty) = dirt(&plan, first_dirty);
            let ratio = if total == 0 {
                0.0
            } else {
                dirty as f64 / total as f64
            };
            self.update(&name, |s| {
                s.first_dirty_offset = first_dirty;
                s.cleanable_bytes = total;
                s.dirty_bytes = dirty;
                s.dirty_ratio = ratio;
            });
            let overdue = oldest_dirty.is_some_and(|t| {
                c.settings.max_compaction_lag_ms > 0
                    && now.saturating_sub(t) > c.settings.max_compaction_lag_ms
            });
            if dirty == 0 || !(ratio >= c.settings.min_cleanable_ratio || overdue) {
                continue;
            }
            let score = if overdue { 2.0 } else { ratio };
            if best.as_ref().is_none_or(|b| score > b.0) {
                best = Some((score, c, plan, first_dirty));
            }
        }
        let Some((_, c, plan, first_dirty)) = best else {
            return false;
        };
        let name = c.partition.name();
        if !self
            .busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone())
        {
            return false;
        }
        self.clean_partition(&c.partition, &c.settings, plan, first_dirty);
        self.busy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&name);
        true
    }

    fn clean_partition(
        &self,
        p: &Arc<Partition>,
        settings: &CompactSettings,
        plan: CleanPlan,
        first_dirty: i64,
    ) -> bool {
        let name = p.name();
        let started = Instant::now();
        // The delete horizon: records cleaned at least delete.retention.ms
        // ago (their segment was last written that long before the newest
        // already-clean segment) lose their tombstones and empty markers.
        let delete_horizon_ms = plan
            .segments
            .iter()
            .filter(|s| s.next <= first_dirty)
            .map(|s| s.last_modified_ms)
            .max()
            .map_or(0, |t| t.saturating_sub(settings.delete_retention_ms));
        let map_entries = (self.settings.dedupe_buffer_size as usize
            / cleaner::MAP_ENTRY_BYTES
            / self.settings.threads.max(1))
        .max(1024);
        let opts = CleanOptions {
            first_dirty,
            map_entries,
            delete_horizon_ms,
            segment_bytes: plan.segment_bytes,
            index_interval: plan.index_interval,
        };
        let mut throttle = |n: u64| self.throttle.charge(n, &self.totals);
        let mut install = |g: cleaner::CleanedGroup| {
            crate::faults::fail_point("cleaner-before-swap");
            let r = p.install_cleaned(&g);
            crate::faults::fail_point("cleaner-after-swap");
            r
        };
        let result = cleaner::clean(
            &plan.dir,
            &plan.segments,
            &plan.facts,
            &opts,
            &mut throttle,
            &mut install,
        );
        let elapsed = started.elapsed();
        match result {
            Ok(stats) => {
                if let Err(e) = write_atomically(
                    &plan.dir,
                    CLEANER_OFFSET_FILE,
                    format!("{}\n", stats.map_end).as_bytes(),
                ) {
                    tracing::warn!(partition = %name, error = %e, "could not record where cleaning stopped; the next pass starts earlier");
                }
                self.record(&name, &stats, elapsed);
                tracing::info!(partition = %name, first_dirty, map_end = stats.map_end,
                    read = stats.bytes_read, written = stats.bytes_written,
                    records_read = stats.records_read, records_kept = stats.records_kept,
                    aborted_removed = stats.aborted_records_removed, ms = elapsed.as_millis() as u64,
                    "cleaned");
                true
            }
            Err(e) => {
                self.totals.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(partition = %name, error = %e, "log cleaning failed; the partition is left as it was");
                self.update(&name, |s| s.last_error = Some(e.to_string()));
                false
            }
        }
    }

    fn record(&self, name: &str, stats: &CleanStats, elapsed: Duration) {
        let t = &self.totals;
        t.passes.fetch_add(1, Ordering::Relaxed);
        t.bytes_read.fetch_add(stats.bytes_read, Ordering::Relaxed);
        t.bytes_written
            .fetch_add(stats.bytes_written, Ordering::Relaxed);
        t.records_removed.fetch_add(
            stats.records_read.saturating_sub(stats.records_kept),
            Ordering::Relaxed,
        );
        t.aborted_records_removed
            .fetch_add(stats.aborted_records_removed, Ordering::Relaxed);
        t.busy_ms
            .fetch_add(elapsed.as_millis() as u64, Ordering::Relaxed);
        self.update(name, |s| {
            s.first_dirty_offset = stats.map_end;
            s.passes += 1;
            s.last_clean_ms = now_ms();
            s.last_pass_ms = elapsed.as_millis() as u64;
            s.last_bytes_read = stats.bytes_read;
            s.last_bytes_written = stats.bytes_written;
            s.last_records_read = stats.records_read;
            s.last_records_kept = stats.records_kept;
            s.last_aborted_records_removed = stats.aborted_records_removed;
            s.last_error = None;
        });
    }
}

/// A partition of a compacted topic, with its topic's settings.
pub struct Candidate {
    pub partition: Arc<Partition>,
    pub settings: CompactSettings,
}

/// Every partition whose topic's cleanup.policy has `compact`.
pub fn candidates(topics: &Topics) -> Vec<Candidate> {
    let mut out = Vec::new();
    for t in topics.all() {
        let meta = t.meta();
        if !topics.cleanup_policy(&meta).compact {
            continue;
        }
        let num = |k: &str, d: f64| -> f64 {
            topics
                .topic_config(&meta, k)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(d)
        };
        let settings = CompactSettings {
            min_cleanable_ratio: num("min.cleanable.dirty.ratio", 0.5),
            delete_retention_ms: num("delete.retention.ms", 86_400_000.0) as i64,
            min_compaction_lag_ms: num("min.compaction.lag.ms", 0.0) as i64,
            max_compaction_lag_ms: num("max.compaction.lag.ms", i64::MAX as f64) as i64,
        };
        for p in t
            .partitions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            out.push(Candidate {
                partition: p.clone(),
                settings,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncelog_log::cleaner::SegmentInfo;

    fn plan(segs: &[(i64, i64, u64)]) -> CleanPlan {
        CleanPlan {
            dir: std::path::PathBuf::new(),
            segments: segs
                .iter()
                .map(|&(base, next, size)| SegmentInfo {
                    base,
                    next,
                    size,
                    last_modified_ms: base,
                })
                .collect(),
            facts: Default::default(),
            log_end: segs.last().map_or(0, |s| s.1),
            segment_bytes: 1 << 20,
            index_interval: 4096,
            total_bytes: 0,
        }
    }

    #[test]
    fn dirt_counts_the_segments_past_the_first_dirty_offset() {
        let p = plan(&[(0, 100, 10), (100, 200, 30), (200, 300, 60)]);
        assert_eq!(dirt(&p, 0), (100, 100, Some(0)));
        assert_eq!(dirt(&p, 150), (100, 90, Some(100)));
        assert_eq!(dirt(&p, 300), (100, 0, None));
    }

    #[test]
    fn the_throttle_holds_the_byte_rate() {
        let totals = CleanerTotals::default();
        let t = Throttle::new(Some(10.0 * 1024.0 * 1024.0));
        let started = Instant::now();
        for _ in 0..4 {
            t.charge(512 * 1024, &totals);
        }
        // 2 MiB at 10 MiB/s: about 200 ms.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(150), "{took:?}");
        assert!(totals.throttled_ms.load(Ordering::Relaxed) >= 150);
        let free = Throttle::new(None);
        let started = Instant::now();
        free.charge(1 << 30, &totals);
        assert!(started.elapsed() < Duration::from_millis(50));
    }
}
