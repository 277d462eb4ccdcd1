//! The offsets of partitions as this broker last read them, kept in memory
//! so that a fetch with nothing to read (a caught-up consumer's long poll,
//! the most frequent fetch of all) asks PostgreSQL nothing.
//!
//! A partition's high watermark and LSO move only when a batch is appended
//! to it (data, or a marker that ends a transaction), and every append of
//! this broker's, and every other broker's through its announcement, raises
//! [`super::Cluster::known_next_offset`]. So a remembered read stays true
//! while the known next offset is still its high watermark. Announcements
//! can be lost: the LISTEN connection fails (then nothing remembered is
//! trusted until it is back, [`Ends::listening`]), a broker that believed itself alone did
//! not send one, or the NOTIFY after a commit failed. For those, a
//! remembered read is used for `cluster.fetch.end.fresh.ms` at most
//! ([`FRESH_FOR`] by default). The log start offset
//! moves without an append (retention, DeleteRecords); a fetch at the end
//! does not depend on it, and a fetch of data reads PostgreSQL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::reader::PartitionOffsets;

/// How long a remembered read answers without an announcement to say it
/// is still the end, by default (`cluster.fetch.end.fresh.ms`): the
/// longest a lost announcement delays a caught-up consumer (beyond a long
/// poll's own wait).
pub const FRESH_FOR: Duration = Duration::from_secs(2);

/// Partitions kept before those read longer ago than half the freshness
/// are dropped.
const CAPACITY: usize = 100_000;

pub struct Ends {
    fresh_for: Duration,
    read: Mutex<HashMap<(Uuid, i32), (PartitionOffsets, Instant)>>,
    /// Whether the LISTEN connection is up: without it no announcement
    /// arrives, and nothing remembered is trusted.
    listening: AtomicBool,
    /// Fetched partitions answered from memory.
    pub answered: AtomicU64,
    /// Fetched partitions read from PostgreSQL.
    pub read_through: AtomicU64,
}

impl Ends {
    pub fn new(fresh_for: Duration) -> Self {
        Self {
            fresh_for,
            read: Mutex::default(),
            listening: AtomicBool::new(false),
            answered: AtomicU64::new(0),
            read_through: AtomicU64::new(0),
        }
    }

    /// A partition's offsets as read from PostgreSQL (a read of its own
    /// snapshot: a later one replaces an earlier, never the reverse).
    pub fn remember(&self, topic_id: &Uuid, partition: i32, offsets: PartitionOffsets) {
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        if self.fresh_for.is_zero() {
            return;
        }
        if read.len() >= CAPACITY {
            let now = Instant::now();
            let keep = self.fresh_for / 2;
            read.retain(|_, (_, at)| now.duration_since(*at) < keep);
        }
        let e = read
            .entry((*topic_id, partition))
            .or_insert((offsets, Instant::now()));
        if offsets.high_watermark >= e.0.high_watermark {
            *e = (offsets, Instant::now());
        }
    }

    /// The remembered offsets of a partition if they are still its end:
    /// read less than the freshness ago, and `known_next` (every commit
    /// this broker saw since) not past their high watermark.
    pub fn fresh(
        &self,
        topic_id: &Uuid,
        partition: i32,
        known_next: i64,
    ) -> Option<PartitionOffsets> {
        if !self.listening.load(Ordering::Acquire) || self.fresh_for.is_zero() {
            return None;
        }
        let read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        let (offsets, at) = read.get(&(*topic_id, partition))?;
        (offsets.high_watermark >= known_next && at.elapsed() < self.fresh_for).then_some(*offsets)
    }

    /// The LISTEN connection is up (`true`, every announcement from now
    /// on arrives) or lost (`false`). Either way what was remembered before
    /// may have missed announcements, and is forgotten.
    pub fn listening(&self, up: bool) {
        self.listening.store(up, Ordering::Release);
        self.read.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(hw: i64) -> PartitionOffsets {
        PartitionOffsets {
            high_watermark: hw,
            last_stable_offset: hw - 1,
            log_start_offset: 0,
        }
    }

    #[test]
    fn a_read_is_the_end_until_a_commit_passes_it() {
        let ends = Ends::new(FRESH_FOR);
        let t = Uuid::new_v4();
        ends.remember(&t, 0, at(10));
        // not listening yet: announcements may be missed
        assert_eq!(ends.fresh(&t, 0, 10), None);
        ends.listening(true);
        assert_eq!(ends.fresh(&t, 0, 0), None);
        ends.remember(&t, 0, at(10));
        assert_eq!(ends.fresh(&t, 0, 10), Some(at(10)));
        assert_eq!(ends.fresh(&t, 1, 0), None);
        // a commit seen since
        assert_eq!(ends.fresh(&t, 0, 11), None);
        // an older snapshot answering late does not replace a newer one
        ends.remember(&t, 0, at(12));
        ends.remember(&t, 0, at(11));
        assert_eq!(ends.fresh(&t, 0, 12), Some(at(12)));
        ends.listening(true);
        assert_eq!(ends.fresh(&t, 0, 12), None);
        ends.remember(&t, 0, at(12));
        ends.listening(false);
        ends.remember(&t, 0, at(12));
        assert_eq!(ends.fresh(&t, 0, 12), None);
    }
}
