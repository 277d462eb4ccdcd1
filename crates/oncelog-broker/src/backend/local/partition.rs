//! One partition: its log and the producer state derived from it, its high
//! watermark, and the only write paths into it. [`Partition::append`] (a
//! client's batch) and [`Partition::write_marker`] (a transaction's COMMIT or
//! ABORT) each take the partition lock once for check, append, roll and
//! producer-state change, then hand the new end to group commit (or, in
//! interval-flush mode, to the high watermark). Handlers only translate the
//! typed errors into wire codes and messages.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use oncelog_log::{batch, cleaner, Log, LogError};
use tokio::sync::{oneshot, Notify};

use crate::backend::local::snapshot;
use crate::machines::producer_state::{
    MarkerReject, ProduceReject, ProducerBatch, ProducerEntry, ProducerState, Verdict,
};
use crate::machines::txn_coordinator::VerifyError;
use oncelog_log::now_ms;

/// A partition's log and the state derived from it, under one lock so that
/// every append and its state change happen together.
pub struct PartitionState {
    pub log: Log,
    pub producers: ProducerState,
    /// Set under the lock when the partition's topic is deleted: nothing may
    /// touch its files after that (they reach files by path, and a new topic
    /// of the same name may own those paths).
    pub closed: bool,
    /// The last markers written here since start, newest last (for the
    /// console's view of a transaction).
    pub recent_markers: std::collections::VecDeque<MarkerWritten>,
}

/// A marker this partition wrote, with where its transaction began here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MarkerWritten {
    pub producer_id: i64,
    pub epoch: i16,
    pub commit: bool,
    /// The transaction's first offset at this partition (None: it had
    /// written nothing here).
    pub first_offset: Option<i64>,
    pub marker_offset: i64,
    pub time_ms: i64,
}

/// Markers kept per partition.
pub const RECENT_MARKERS: usize = 16;

impl std::ops::Deref for PartitionState {
    type Target = Log;
    fn deref(&self) -> &Log {
        &self.log
    }
}

impl std::ops::DerefMut for PartitionState {
    fn deref_mut(&mut self) -> &mut Log {
        &mut self.log
    }
}

impl PartitionState {
    /// Builds the producer state from the newest usable snapshot plus the
    /// log after it.
    pub fn load(log: Log, name: &str) -> Self {
        let end = log.next_offset();
        let mut producers = ProducerState::new();
        let mut from = log.log_start_offset();
        if let Some((off, snap)) = snapshot::load_latest(log.dir(), end) {
            producers = snap;
            from = off;
        }
        let mut st = Self {
            log,
            producers,
            closed: false,
            recent_markers: Default::default(),
        };
        if let Err(e) = st.replay_from(from) {
            tracing::error!(partition = name, error = %e, "producer state replay failed; rebuilding from the start");
            st.producers = ProducerState::new();
            if let Err(e) = st.replay_from(0) {
                tracing::error!(partition = name, error = %e, "producer state replay failed");
            }
        }
        st
    }

    fn replay_from(&mut self, from: i64) -> Result<(), LogError> {
        let producers = &mut self.producers;
        self.log.replay(from, |b| replay_batch(producers, b))
    }

    /// The last stable offset given the high watermark.
    pub fn last_stable_offset(&self, hw: i64) -> i64 {
        self.producers.last_stable_offset(hw)
    }

    /// Rebuilds the producer state after the log was cut back.
    pub fn rebuild_after_truncation(&mut self) {
        snapshot::remove_after(self.log.dir(), self.log.next_offset());
        let mut producers = ProducerState::new();
        let mut from = 0;
        if let Some((off, snap)) = snapshot::load_latest(self.log.dir(), self.log.next_offset()) {
            producers = snap;
            from = off;
        }
        self.producers = producers;
        if let Err(e) = self.replay_from(from) {
            tracing::error!(dir = %self.log.dir().display(), error = %e, "producer state replay failed");
        }
    }
}

/// Applies one replayed batch (header bytes, or a whole control batch).
pub fn replay_batch(producers: &mut ProducerState, b: &[u8]) {
    let Ok(h) = batch::BatchHeader::new(b) else {
        return;
    };
    if h.producer_id() < 0 {
        return;
    }
    if h.is_control() {
        if let Some((ty, coordinator_epoch)) = batch::control_record(b) {
            if ty == batch::CONTROL_ABORT || ty == batch::CONTROL_COMMIT {
                producers.apply_marker(
                    h.producer_id(),
                    h.producer_epoch(),
                    coordinator_epoch,
                    h.base_offset(),
                    ty == batch::CONTROL_ABORT,
                    h.max_timestamp(),
                );
            }
        }
    } else {
        producers.apply_batch(&producer_batch(&h), h.base_offset(), h.last_offset());
    }
}

pub fn producer_batch(h: &batch::BatchHeader<'_>) -> ProducerBatch {
    ProducerBatch {
        producer_id: h.producer_id(),
        epoch: h.producer_epoch(),
        first_seq: h.base_sequence(),
        last_seq: h.last_sequence(),
        transactional: h.is_transactional(),
        max_timestamp: h.max_timestamp(),
    }
}

pub struct Partition {
    pub topic: String,
    pub index: i32,
    log: Mutex<PartitionState>,
    high_watermark: AtomicI64,
    log_start: AtomicI64,
    /// Moves whenever the log is cut back, so waiters on truncated bytes fail.
    pub generation: AtomicU64,
    /// (active segment file, bytes of it already dropped from the page cache)
    cache_dropped: Mutex<(usize, u64)>,
    /// (active segment file, bytes of it whose writeback was started)
    writeback_started: Mutex<(usize, u64)>,
    mode: WriteMode,
    /// This partition, for the sync requests it queues.
    me: Weak<Partition>,
}

impl Partition {
    /// A partition over `log`, just opened (recovered): the producer state
    /// is loaded and the high watermark starts at the log end. Its writes
    /// become durable as `mode` says.
    pub fn new(topic: String, index: i32, log: Log, mode: WriteMode) -> Arc<Self> {
        let end = log.next_offset();
        let start = log.log_start_offset();
        let name = format!("{topic}-{index}");
        let state = PartitionState::load(log, &name);
        Arc::new_cyclic(|me| Self {
            topic,
            index,
            log: Mutex::new(state),
            high_watermark: AtomicI64::new(end),
            log_start: AtomicI64::new(start),
            generation: AtomicU64::new(0),
            cache_dropped: Mutex::new((0, 0)),
            writeback_started: Mutex::new((0, 0)),
            mode,
            me: me.clone(),
        })
    }

    /// The partition's state under its lock. Only this module takes it:
    /// everything else goes through the methods below.
    fn lock(&self) -> MutexGuard<'_, PartitionState> {
        // A panic while holding the lock must not wedge the partition forever;
        // the log's own state is updated only after each step succeeds.
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a fetch from `offset` sees: the offsets that bound it and up to
    /// `max_bytes` of data (none when `max_bytes` is 0), below the last
    /// stable offset for read_committed, else below the high watermark.
    /// `min_one`: return a whole first batch even if it is larger.
    pub fn read(&self, offset: i64, max_bytes: usize, read_committed: bool, min_one: bool) -> Read {
        let hw = self.high_watermark();
        let st = self.lock();
        let start = st.log_start_offset();
        let end = st.next_offset();
        let lso = st.last_stable_offset(hw);
        debug_assert!(
            lso <= hw && hw <= end,
            "{}: LSO {lso} <= HW {hw} <= log end {end} does not hold",
            self.name()
        );
        let upper = if read_committed { lso } else { hw };
        let aborted = if read_committed {
            st.producers.aborted_overlapping(offset, upper)
        } else {
            Vec::new()
        };
        let data = if offset < start || offset > end {
            Err(ReadError::OutOfRange)
        } else if offset < upper && max_bytes > 0 {
            match st.read(offset, max_bytes, upper, min_one) {
                Ok(d) => Ok(d),
                Err(LogError::OffsetOutOfRange { .. }) => Err(ReadError::OutOfRange),
                Err(e) => Err(ReadError::Storage(e)),
            }
        } else {
            Ok(Vec::new())
        };
        Read {
            high_watermark: hw,
            last_stable_offset: lso,
            log_start_offset: start,
            aborted,
            data,
        }
    }

    /// ListOffsets for one partition: the offset (and its timestamp, or -1)
    /// for `spec` (-2/-4 earliest, -1 latest, -3 max timestamp, or a
    /// timestamp), bounded by the LSO for read_committed. `Ok(None)`: no
    /// such offset.
    pub fn offset_for(
        &self,
        spec: i64,
        read_committed: bool,
    ) -> Result<Option<(i64, i64)>, OffsetLookupError> {
        let hw = self.high_watermark();
        let st = self.lock();
        let upper = if read_committed {
            st.last_stable_offset(hw)
        } else {
            hw
        };
        let found = |r: Result<Option<(i64, i64)>, LogError>| match r {
            Ok(Some((off, ts))) if off < upper => Ok(Some((off, ts))),
            Ok(_) => Ok(None),
            Err(e) => Err(OffsetLookupError::Storage(e)),
        };
        match spec {
            -2 | -4 => Ok(Some((st.log_start_offset(), -1))),
            -1 => Ok(Some((upper, -1))),
            -3 => {
                let max = st.max_timestamp();
                if max < 0 {
                    return Ok(None);
                }
                found(st.offset_for_timestamp(max))
            }
            ts if ts >= 0 => found(st.offset_for_timestamp(ts)),
            _ => Err(OffsetLookupError::InvalidSpec),
        }
    }

    /// Whether `pid` has a transaction open here that a marker with `epoch`
    /// and `coordinator_epoch` may close (an older epoch may not).
    pub fn open_transaction_of(
        &self,
        pid: i64,
        epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<bool, MarkerReject> {
        let st = self.lock();
        match st.producers.get(pid) {
            Some(e) if e.current_txn_first_offset.is_some() => {
                st.producers.check_marker(pid, epoch, coordinator_epoch)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Closes every partition of `parts` under its lock and runs `f` while
    /// holding all of them (a topic's delete): nothing of theirs is read or
    /// written meanwhile, and nothing is written after. If `f` fails they
    /// are opened again.
    pub fn closing_all<T, E>(
        parts: &[Arc<Partition>],
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let mut guards: Vec<_> = parts.iter().map(|p| p.lock()).collect();
        for g in guards.iter_mut() {
            g.closed = true;
        }
        let res = f();
        if res.is_err() {
            for g in guards.iter_mut() {
                g.closed = false;
            }
        }
        res
    }

    pub fn set_config(&self, config: oncelog_log::LogConfig) {
        self.lock().set_config(config);
    }

    /// Retention: forgets producers idle since before `producer_cutoff` and
    /// removes segments past the log's limits at `now`. Nothing on a closed
    /// partition.
    pub fn apply_retention(&self, now: i64, producer_cutoff: i64) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        let expired = st.producers.expire(producer_cutoff);
        if expired > 0 {
            tracing::info!(partition = %self.name(), expired, "idle producer ids expired");
        }
        match st.apply_retention(now) {
            Ok(0) => {}
            Ok(n) => {
                self.refresh_log_start(&st);
                let start = st.log_start_offset();
                st.producers.trim_aborted(start);
                tracing::info!(partition = %self.name(), segments = n, log_start_offset = start, "retention");
            }
            Err(e) => tracing::error!(partition = %self.name(), error = %e, "retention failed"),
        }
    }

    /// What a cleaning pass may read now: the non-active segments below the
    /// last stable offset (so every transaction in them is decided) whose
    /// records are all older than `newest_ms` (-1: any age), and the
    /// aborted transactions and live producers' last batches it must honour.
    /// `None` on a closed partition.
    pub fn clean_plan(&self, newest_ms: i64) -> Option<CleanPlan> {
        let hw = self.high_watermark();
        let st = self.lock();
        if st.closed {
            return None;
        }
        let lso = st.last_stable_offset(hw);
        let segments = st.cleanable_segments(lso, newest_ms);
        let aborted = st
            .producers
            .aborted_overlapping(st.log_start_offset(), i64::MAX)
            .into_iter()
            .map(|a| (a.producer_id, a.first_offset, a.last_offset));
        let last = st
            .producers
            .producers()
            .filter_map(|(pid, e)| e.batches.back().map(|b| (*pid, b.first_offset)));
        let facts = cleaner::txn_facts(aborted, last);
        Some(CleanPlan {
            dir: st.dir().to_path_buf(),
            segments,
            facts,
            log_end: st.next_offset(),
            segment_bytes: st.config().segment_bytes,
            index_interval: st.config().index_interval_bytes,
            total_bytes: st.size_bytes(),
        })
    }

    /// Swaps a cleaned segment in (see [`Log::install_cleaned`]); false when
    /// the partition is closed or the segments it replaces are gone.
    ///
    /// When the group drops ABORT markers, the aborted-transaction index
    /// forgets them. The producer snapshots, which hold that index, are
    /// removed before the swap (a crash after it then rebuilds the state
    /// from the cleaned log) and one is written afresh after it.
    pub fn install_cleaned(&self, g: &cleaner::CleanedGroup) -> Result<bool, LogError> {
        let mut st = self.lock();
        if st.closed {
            return Ok(false);
        }
        if g.removed_aborts.is_empty() {
            return st.install_cleaned(g);
        }
        snapshot::remove_after(st.log.dir(), -1);
        let installed = st.install_cleaned(g)?;
        if installed {
            st.producers.forget_aborted(&g.removed_aborts);
        }
        snapshot::write(st.log.dir(), st.log.next_offset(), &st.producers);
        Ok(installed)
    }

    /// DeleteRecords: moves the log start offset to `offset` (-1: the high
    /// watermark), durably, and deletes the segments wholly below it.
    /// Refused past the high watermark. Returns the new log start offset.
    pub fn delete_records(&self, offset: i64) -> Result<i64, DeleteRecordsError> {
        let hw = self.high_watermark();
        let offset = if offset == -1 { hw } else { offset };
        if offset < 0 || offset > hw {
            return Err(DeleteRecordsError::OutOfRange { offset, hw });
        }
        let mut st = self.lock();
        if st.closed {
            return Err(DeleteRecordsError::Closed(self.topic.clone()));
        }
        let before = st.log_start_offset();
        let start = st
            .delete_records_before(offset)
            .map_err(DeleteRecordsError::Storage)?;
        self.refresh_log_start(&st);
        st.producers.trim_aborted(start);
        if start != before {
            tracing::info!(partition = %self.name(), from = before, to = start, "DeleteRecords moved the log start offset");
        }
        Ok(start)
    }

    /// After a failed fsync: the log is cut back to what is durable (the
    /// high watermark) and its producer state rebuilt; the truncation
    /// generation moves, so every waiter on the lost bytes fails. A closed
    /// partition's files are left alone (its paths may be a new topic's).
    pub fn truncate_to_durable(&self) {
        let durable = self.high_watermark();
        let mut st = self.lock();
        self.generation.fetch_add(1, Ordering::AcqRel);
        if !st.closed {
            if let Err(e) = st.truncate_to(durable) {
                tracing::error!(partition = %self.name(), error = %e, "truncation after failed sync failed");
            }
            st.rebuild_after_truncation();
        }
    }

    /// Drops the first `synced_len - keep` bytes of the active segment `file`
    /// (synced, so clean) from the page cache, in whole MiB, each byte once.
    /// Without it a long-running broker's page cache fills with data nobody
    /// reads, and every write pays for reclaiming it: on the benchmark host
    /// that made a produced GB cost 3-5x the broker CPU.
    pub fn drop_cache_behind(&self, file: &Arc<std::fs::File>, synced_len: u64, keep: u64) {
        let id = Arc::as_ptr(file) as usize;
        let mut d = self.cache_dropped.lock().unwrap_or_else(|p| p.into_inner());
        if d.0 != id {
            *d = (id, 0);
        }
        let upto = synced_len.saturating_sub(keep) & !((1u64 << 20) - 1);
        if upto <= d.1 {
            return;
        }
        let (Ok(from), Ok(len)) = (i64::try_from(d.1), i64::try_from(upto - d.1)) else {
            return;
        };
        if let Err(e) = nix::fcntl::posix_fadvise(
            &**file,
            from,
            len,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        ) {
            // only a hint: the kernel keeps the pages and reclaims them later
            tracing::debug!(partition = %self.name(), error = %e, "posix_fadvise(DONTNEED) failed");
        }
        d.1 = upto;
    }

    /// Starts writeback of `file` (the active segment) from where the last
    /// call stopped up to `len`.
    pub fn start_writeback(&self, file: &Arc<std::fs::File>, len: u64) {
        let id = Arc::as_ptr(file) as usize;
        let mut w = self
            .writeback_started
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if w.0 != id {
            *w = (id, 0);
        }
        if len <= w.1 {
            return;
        }
        if let Err(e) = crate::backend::local::writeback::start(file, w.1, len - w.1) {
            tracing::debug!(partition = %self.name(), error = %e, "sync_file_range failed");
        }
        w.1 = len;
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark.load(Ordering::Acquire)
    }

    /// Moves the high watermark forward (never back); true if it moved.
    pub fn advance_high_watermark(&self, to: i64) -> bool {
        self.high_watermark.fetch_max(to, Ordering::AcqRel) < to
    }

    /// Sets the high watermark after a truncation.
    pub fn reset_high_watermark(&self, to: i64) {
        self.high_watermark.store(to, Ordering::Release);
    }

    pub fn log_start_offset(&self) -> i64 {
        self.log_start.load(Ordering::Acquire)
    }

    pub fn refresh_log_start(&self, log: &Log) {
        self.log_start
            .store(log.log_start_offset(), Ordering::Release);
    }

    /// The high watermark and, read under the lock just after it, the last
    /// stable offset, log start and size.
    pub fn status(&self) -> PartitionStatus {
        let high_watermark = self.high_watermark();
        let st = self.lock();
        let lso = st.last_stable_offset(high_watermark);
        debug_assert!(
            lso <= high_watermark && high_watermark <= st.next_offset(),
            "{}: LSO {lso} <= HW {high_watermark} <= log end {} does not hold",
            self.name(),
            st.next_offset()
        );
        PartitionStatus {
            high_watermark,
            last_stable_offset: lso,
            log_start_offset: st.log_start_offset(),
            size_bytes: st.size_bytes(),
        }
    }

    /// The active segment's file, the log end and sizes, for syncing.
    pub fn tail(&self) -> Tail {
        let st = self.lock();
        Tail {
            file: st.active_file(),
            next_offset: st.next_offset(),
            size_bytes: st.size_bytes(),
            active_size: st.active_size(),
        }
    }

    /// Open transactions here: (first offset, producer id, producer epoch).
    pub fn open_transactions(&self) -> Vec<(i64, i64, i16)> {
        let st = self.lock();
        st.producers
            .ongoing()
            .map(|(first, pid)| {
                let epoch = st.producers.get(pid).map_or(-1, |e| e.epoch);
                (first, pid, epoch)
            })
            .collect()
    }

    /// The markers written here lately, oldest first.
    pub fn recent_markers(&self) -> Vec<MarkerWritten> {
        self.lock().recent_markers.iter().copied().collect()
    }

    /// Every producer the partition knows, with its state.
    pub fn producers(&self) -> Vec<(i64, ProducerEntry)> {
        let st = self.lock();
        st.producers
            .producers()
            .map(|(pid, e)| (*pid, e.clone()))
            .collect()
    }

    pub fn name(&self) -> String {
        format!("{}-{}", self.topic, self.index)
    }

    /// Appends a client's record batch (`producer`: its producer fields,
    /// for an idempotent or transactional batch) under the partition lock:
    /// the partition must not be closed, the producer state must accept the
    /// batch, and a transactional batch must pass `verify` (its producer's
    /// open transaction holds this partition). `verify` runs under the lock,
    /// so a batch either lands before its transaction's marker or is refused.
    /// A duplicate of a batch still in the producer state is not appended and
    /// is answered with its original offsets.
    pub fn append(
        &self,
        data: &mut [u8],
        producer: Option<&ProducerBatch>,
        verify: &dyn Fn(&ProducerBatch) -> Result<(), VerifyError>,
    ) -> Result<Appended, AppendError> {
        let (base_offset, end, duplicate, generation, log_end) = {
            let mut st = self.lock();
            if st.closed {
                return Err(AppendError::Closed(self.topic.clone()));
            }
            st.producers.settle(self.high_watermark());
            let mut duplicate = None;
            if let Some(pb) = producer {
                match st.producers.check(pb)? {
                    Verdict::Append if pb.transactional => {
                        verify(pb).map_err(AppendError::Unverified)?;
                    }
                    Verdict::Append => {}
                    Verdict::Duplicate {
                        first_offset,
                        last_offset,
                    } => duplicate = Some((first_offset, last_offset)),
                }
            }
            let generation = self.generation.load(Ordering::Acquire);
            let (first, last) = match duplicate {
                Some((first, last)) => {
                    tracing::debug!(partition = %self.name(), first, last, "duplicate batch answered with its original offsets");
                    (first, last)
                }
                None => {
                    let info = st.append(data)?;
                    if info.rolled {
                        // State as of the new segment's base, before this batch.
                        snapshot::write(st.log.dir(), info.base_offset, &st.producers);
                    }
                    if let Some(pb) = producer {
                        st.producers
                            .apply_batch(pb, info.base_offset, info.last_offset);
                    }
                    (info.base_offset, info.last_offset)
                }
            };
            (
                first,
                last + 1,
                duplicate.is_some(),
                generation,
                st.next_offset(),
            )
        };
        Ok(Appended {
            base_offset,
            duplicate,
            durable: self.hand_off(end, log_end, generation),
        })
    }

    /// Writes a COMMIT or ABORT marker for `marker`'s producer under the
    /// partition lock and applies it to the producer state. Refused by a
    /// closed partition and by the producer state (an older producer or
    /// coordinator epoch); a marker for a transaction already closed here
    /// is written and closes nothing. Returns group commit's answer, or
    /// `None` when the marker is already visible (interval flush).
    pub fn write_marker(&self, marker: Marker) -> Result<Option<SyncReply>, MarkerError> {
        let (end, generation) = {
            let mut st = self.lock();
            if st.closed {
                return Err(MarkerError::Closed(self.topic.clone()));
            }
            st.producers.settle(self.high_watermark());
            st.producers.check_marker(
                marker.producer_id,
                marker.epoch,
                marker.coordinator_epoch,
            )?;
            let mut m = batch::build_marker(
                marker.producer_id,
                marker.epoch,
                marker.commit,
                marker.coordinator_epoch,
                now_ms(),
            );
            let first_offset = st
                .producers
                .get(marker.producer_id)
                .and_then(|e| e.current_txn_first_offset);
            let info = st.append(&mut m)?;
            if info.rolled {
                snapshot::write(st.log.dir(), info.base_offset, &st.producers);
            }
            if st.recent_markers.len() >= RECENT_MARKERS {
                st.recent_markers.pop_front();
            }
            st.recent_markers.push_back(MarkerWritten {
                producer_id: marker.producer_id,
                epoch: marker.epoch,
                commit: marker.commit,
                first_offset,
                marker_offset: info.base_offset,
                time_ms: now_ms(),
            });
            st.producers.apply_marker(
                marker.producer_id,
                marker.epoch,
                marker.coordinator_epoch,
                info.base_offset,
                !marker.commit,
                now_ms(),
            );
            (
                info.last_offset + 1,
                self.generation.load(Ordering::Acquire),
            )
        };
        Ok(self.hand_off(end, end, generation))
    }

    /// After a write that ends at `end` (the log then ending at `log_end`):
    /// queues it to group commit, or in interval-flush mode moves the high
    /// watermark to the log end at once.
    fn hand_off(&self, end: i64, log_end: i64, generation: u64) -> Option<SyncReply> {
        match &self.mode {
            WriteMode::Interval(data_notify) => {
                self.advance_high_watermark(log_end);
                data_notify.notify_waiters();
                None
            }
            WriteMode::GroupCommit(syncer) => {
                let (tx, rx) = oneshot::channel();
                let Some(me) = self.me.upgrade() else {
                    // Dropped while writing: nobody can wait for it.
                    let _ = tx.send(Err(SyncError::Abandoned));
                    return Some(rx);
                };
                syncer.request(SyncRequest {
                    partition: me,
                    end_offset: end,
                    generation,
                    reply: tx,
                });
                Some(rx)
            }
        }
    }
}

/// Group commit's answer for one write: `Ok` once its bytes are durable.
pub type SyncReply = oneshot::Receiver<Result<(), SyncError>>;

/// Why a write was not made durable (it was not acknowledged).
/// What a cleaning pass of one partition reads (see [`Partition::clean_plan`]).
#[derive(Debug)]
pub struct CleanPlan {
    pub dir: std::path::PathBuf,
    pub segments: Vec<cleaner::SegmentInfo>,
    pub facts: cleaner::TxnFacts,
    pub log_end: i64,
    pub segment_bytes: u64,
    pub index_interval: u64,
    pub total_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum DeleteRecordsError {
    #[error("offset {offset} is past the high watermark {hw}")]
    OutOfRange { offset: i64, hw: i64 },
    #[error("topic {0} is being deleted")]
    Closed(String),
    #[error(transparent)]
    Storage(LogError),
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum SyncError {
    #[error("fdatasync failed: {0}")]
    Fsync(Arc<std::io::Error>),
    /// The log was cut back past the write after another write's sync failed.
    #[error("log was truncated after a storage error")]
    Truncated,
    #[error("no sync thread")]
    NoSyncThread,
    #[error("sync thread stopped")]
    Stopped,
    /// The reply was dropped before it was sent.
    #[error("sync abandoned")]
    Abandoned,
}

/// Waits for group commit's answer to a write.
pub async fn durable(reply: SyncReply) -> Result<(), SyncError> {
    reply.await.unwrap_or(Err(SyncError::Abandoned))
}

/// How a partition's writes become visible and acknowledged.
#[derive(Clone)]
pub enum WriteMode {
    /// fsync before ack: a write waits for group commit.
    GroupCommit(Arc<dyn SyncQueue>),
    /// Interval flush: acknowledged once written; the high watermark follows
    /// the log end, and the notify wakes long-poll fetches.
    Interval(Arc<Notify>),
}

pub struct SyncRequest {
    pub partition: Arc<Partition>,
    /// The offset just past the waiter's append.
    pub end_offset: i64,
    /// The partition's truncation generation when the waiter appended.
    pub generation: u64,
    pub reply: oneshot::Sender<Result<(), SyncError>>,
}

/// Where a write waiting for durability is queued (group commit).
pub trait SyncQueue: Send + Sync {
    /// Queues `req`; its reply is sent once its bytes are durable (or not).
    fn request(&self, req: SyncRequest);
}

/// What [`Partition::read`] found.
#[derive(Debug)]
pub struct Read {
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// Aborted transactions overlapping the read (read_committed only).
    pub aborted: Vec<crate::machines::producer_state::AbortedTxn>,
    pub data: Result<Vec<u8>, ReadError>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("offset out of range")]
    OutOfRange,
    #[error("read failed: {0}")]
    Storage(LogError),
}

#[derive(Debug, thiserror::Error)]
pub enum OffsetLookupError {
    #[error("not a valid offset spec")]
    InvalidSpec,
    #[error("timestamp lookup failed: {0}")]
    Storage(LogError),
}

/// See [`Partition::status`].
#[derive(Debug, Clone, Copy)]
pub struct PartitionStatus {
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    pub size_bytes: u64,
}

/// See [`Partition::tail`].
pub struct Tail {
    pub file: Arc<std::fs::File>,
    pub next_offset: i64,
    pub size_bytes: u64,
    pub active_size: u64,
}

/// A client batch the partition took.
#[derive(Debug)]
pub struct Appended {
    pub base_offset: i64,
    /// A retry of a batch already in the log, answered with its original
    /// offsets; nothing was written.
    pub duplicate: bool,
    /// Group commit's answer; `None` when already visible (interval flush).
    pub durable: Option<SyncReply>,
}

/// Why [`Partition::append`] refused a batch; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The partition's topic was deleted.
    #[error("topic {0} was deleted")]
    Closed(String),
    /// The producer state refuses the batch (fenced epoch, sequence gap...).
    #[error(transparent)]
    Rejected(#[from] ProduceReject),
    /// A transactional batch outside its producer's open transaction here.
    #[error(transparent)]
    Unverified(VerifyError),
    /// The log could not take the batch.
    #[error(transparent)]
    Storage(#[from] LogError),
}

/// A transaction marker for one producer.
#[derive(Debug, Clone, Copy)]
pub struct Marker {
    pub producer_id: i64,
    pub epoch: i16,
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// Why [`Partition::write_marker`] wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    /// The partition's topic was deleted.
    #[error("topic {0} was deleted")]
    Closed(String),
    /// The producer state refuses it (an older producer or coordinator epoch).
    #[error(transparent)]
    Refused(#[from] MarkerReject),
    /// The log could not take the marker.
    #[error(transparent)]
    Storage(#[from] LogError),
}
