//! Group commit: one `fdatasync` covers every append that arrived while the
//! previous one ran.
//!
//! Appenders write to the page cache under the partition lock, then queue a
//! [`SyncRequest`] and wait. Partitions are spread over a few sync threads
//! (always the same thread for a partition), so the syncs of different
//! partitions overlap in the disk and the filesystem journal instead of
//! queueing behind each other. Each thread takes every request queued to it,
//! syncs each touched partition's active segment once (outside the partition
//! lock, so appends go on meanwhile), advances the high watermark to the end
//! it observed before syncing, and answers. A sync error is never
//! acknowledged: the partition is cut back to its durable prefix, its
//! truncation generation moves, and every waiter whose bytes were not covered
//! gets the error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::backend::local::partition::Partition;
pub use crate::backend::local::partition::{
    SyncError, SyncQueue, SyncReply, SyncRequest, WriteMode,
};
use crate::observe::histogram::Histogram;

/// An fdatasync at least this slow is logged: acknowledgements of every
/// partition wait behind it.
const SLOW_SYNC: std::time::Duration = std::time::Duration::from_secs(1);

pub struct Syncer {
    /// One queue per sync thread.
    txs: Vec<mpsc::Sender<SyncRequest>>,
    pub stats: Arc<SyncStats>,
}

/// What group commit did: fdatasync calls, their latency, bytes per call.
pub struct SyncStats {
    pub syncs: AtomicU64,
    pub latency: Histogram,
    pub bytes: Histogram,
}

impl Syncer {
    /// Starts `threads` sync threads (at least one). `cache_keep`: see
    /// [`Partition::drop_cache_behind`]; None = never.
    pub fn start(data_notify: Arc<Notify>, cache_keep: Option<u64>, threads: usize) -> Self {
        let stats = Arc::new(SyncStats {
            syncs: AtomicU64::new(0),
            latency: Histogram::latency(),
            bytes: Histogram::size(),
        });
        let mut txs = Vec::new();
        for i in 0..threads.max(1) {
            let (tx, rx) = mpsc::channel::<SyncRequest>();
            let (s, n) = (stats.clone(), data_notify.clone());
            match std::thread::Builder::new()
                .name(format!("oncelog-sync-{i}"))
                .spawn(move || run(rx, n, s, cache_keep))
            {
                Ok(_) => txs.push(tx),
                Err(e) => tracing::error!(error = %e, "could not start a sync thread"),
            }
        }
        Self { txs, stats }
    }
}

impl SyncQueue for Syncer {
    /// Queues a sync; the answer comes once the bytes are durable or failed.
    fn request(&self, req: SyncRequest) {
        if self.txs.is_empty() {
            let _ = req.reply.send(Err(SyncError::NoSyncThread));
            return;
        }
        // A partition always goes to the same thread: its syncs stay in
        // order, and its group commit sees all of its waiters.
        let key = (Arc::as_ptr(&req.partition) as usize as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let i = ((key >> 32) % self.txs.len() as u64) as usize;
        if let Err(mpsc::SendError(req)) = self.txs[i].send(req) {
            let _ = req.reply.send(Err(SyncError::Stopped));
        }
    }
}

fn run(
    rx: mpsc::Receiver<SyncRequest>,
    notify: Arc<Notify>,
    stats: Arc<SyncStats>,
    cache_keep: Option<u64>,
) {
    // partition → log size at its last sync, for bytes per sync
    let mut synced_size: HashMap<usize, u64> = HashMap::new();
    while let Ok(first) = rx.recv() {
        let mut groups: HashMap<usize, (Arc<Partition>, Vec<SyncRequest>)> = HashMap::new();
        let mut add = |r: SyncRequest| {
            let key = Arc::as_ptr(&r.partition) as usize;
            groups
                .entry(key)
                .or_insert_with(|| (r.partition.clone(), Vec::new()))
                .1
                .push(r);
        };
        add(first);
        while let Ok(r) = rx.try_recv() {
            add(r);
        }
        for (key, (p, reqs)) in groups {
            let gen = &p.generation;
            let crate::backend::local::partition::Tail {
                file,
                next_offset: end,
                size_bytes: size,
                active_size,
            } = p.tail();
            let started = std::time::Instant::now();
            let res = file.sync_data();
            let took = started.elapsed();
            stats.latency.observe_duration(took);
            if took >= SLOW_SYNC {
                tracing::warn!(partition = %p.name(), took_ms = took.as_millis() as u64,
                    bytes = size.saturating_sub(synced_size.get(&key).copied().unwrap_or(size)),
                    "slow fdatasync");
            }
            stats.syncs.fetch_add(1, Ordering::Relaxed);
            match res {
                Ok(()) => {
                    if let Some(prev) = synced_size.insert(key, size) {
                        stats.bytes.observe(size.saturating_sub(prev) as f64);
                    }
                    p.advance_high_watermark(end);
                    if let Some(keep) = cache_keep {
                        p.drop_cache_behind(&file, active_size, keep);
                    }
                    let g = gen.load(Ordering::Acquire);
                    for r in reqs {
                        let ok = r.generation == g && r.end_offset <= end;
                        let _ = r.reply.send(if ok {
                            Ok(())
                        } else {
                            Err(SyncError::Truncated)
                        });
                    }
                }
                Err(e) => {
                    let durable = p.high_watermark();
                    tracing::error!(partition = %p.name(), error = %e, durable_offset = durable,
                        "fdatasync failed; dropping unacknowledged tail");
                    p.truncate_to_durable();
                    let err = SyncError::Fsync(Arc::new(e));
                    for r in reqs {
                        let _ = r.reply.send(Err(err.clone()));
                    }
                }
            }
        }
        notify.notify_waiters();
    }
}
