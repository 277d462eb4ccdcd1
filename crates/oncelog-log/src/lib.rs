//! oncelog's log engine.
//!
//! A partition log is a directory of segments named by their base offset
//! (`00000000000000000042.log`), each with a sparse offset index and a time
//! index. Record batches are stored exactly as they arrive on the wire, with
//! only the base offset patched; records are never decoded to store or serve
//! them.
//!
//! Invariants:
//! * offsets only grow; they are dense as written, and the cleaner leaves
//!   gaps where it removed records (a batch keeps its offsets);
//! * only the last (active) segment is written; a segment is `fdatasync`ed
//!   before the next one is created, so after an unclean stop only the active
//!   segment can hold a torn or corrupt tail, and recovery validates it batch
//!   by batch (CRC included) and cuts it back to the last valid batch;
//! * the log never knows about sockets or Kafka requests. Durability policy
//!   (when to sync, what to acknowledge) belongs to the caller, which gets the
//!   active file handle to sync outside any lock.

pub mod batch;
pub mod cleaner;
pub mod codec;
mod error;
pub mod records;
mod segment;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use error::LogError;
pub use segment::sync_dir;
use segment::Segment;

/// Settings of one partition log. Retention values ≤ 0 disable that limit.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    pub segment_bytes: u64,
    pub segment_ms: i64,
    pub index_interval_bytes: u64,
    pub retention_bytes: i64,
    pub retention_ms: i64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            index_interval_bytes: 4096,
            retention_bytes: -1,
            retention_ms: 7 * 24 * 3600 * 1000,
        }
    }
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    /// Set when this append started a new segment at its base offset.
    pub rolled: bool,
    pub base_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
}

/// What opening a log found.
#[derive(Debug, Default, Clone)]
pub struct RecoveryReport {
    pub segments: usize,
    pub bytes_dropped: u64,
    pub problem: Option<String>,
}

pub struct Log {
    dir: PathBuf,
    config: LogConfig,
    /// Ordered by base offset; never empty; the last one is active.
    segments: Vec<Segment>,
    /// A log start offset moved past the first segment's base by
    /// DeleteRecords (persisted in [`LOG_START_FILE`]); -1 when none.
    start_override: i64,
}

/// Where a log start offset moved by DeleteRecords is kept.
pub const LOG_START_FILE: &str = "log-start-offset";
/// A cleaned segment's swap manifest: `<base>.swap` lists the segments it
/// replaces. Its durable presence is the commit point of the swap.
const SWAP_EXT: &str = "swap";

/// Wall-clock milliseconds since the epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Log {
    /// Opens (or creates) the log in `dir`, recovering its active segment.
    pub fn open(dir: &Path, config: LogConfig) -> Result<(Self, RecoveryReport), LogError> {
        std::fs::create_dir_all(dir).map_err(|e| LogError::Io {
            op: "create dir",
            path: dir.to_path_buf(),
            source: e,
        })?;
        let rd = std::fs::read_dir(dir).map_err(|e| LogError::Io {
            op: "read dir",
            path: dir.to_path_buf(),
            source: e,
        })?;
        let names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        finish_swaps(dir, &names)?;
        let rd = std::fs::read_dir(dir).map_err(|e| LogError::Io {
            op: "read dir",
            path: dir.to_path_buf(),
            source: e,
        })?;
        let mut bases: Vec<i64> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_suffix(".log")?.parse::<i64>().ok()
            })
            .collect();
        bases.sort_unstable();
        let mut report = RecoveryReport::default();
        let mut segments: Vec<Segment> = Vec::with_capacity(bases.len().max(1));
        let n = bases.len();
        for (i, base) in bases.into_iter().enumerate() {
            let last = i + 1 == n;
            let (seg, dropped) = Segment::open(dir, base, config.index_interval_bytes, last)?;
            if let Some((bytes, why)) = dropped {
                report.bytes_dropped += bytes;
                report.problem = Some(why);
            }
            if let Some(prev) = segments.last() {
                if prev.next_offset > seg.base_offset {
                    tracing::warn!(dir = %dir.display(), previous_end = prev.next_offset, found = seg.base_offset,
                        "segments overlap");
                }
            }
            segments.push(seg);
        }
        if segments.is_empty() {
            segments.push(Segment::create(
                dir,
                0,
                config.index_interval_bytes,
                now_ms(),
            )?);
        }
        report.segments = segments.len();
        let start_override = read_start_override(dir);
        Ok((
            Self {
                dir: dir.to_path_buf(),
                config,
                segments,
                start_override,
            },
            report,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    pub fn set_config(&mut self, config: LogConfig) {
        self.config = config;
    }

    pub fn log_start_offset(&self) -> i64 {
        self.segments[0]
            .base_offset
            .max(self.start_override.min(self.next_offset()))
    }

    /// The log end offset: the offset the next batch gets.
    pub fn next_offset(&self) -> i64 {
        self.active().next_offset
    }

    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    fn active(&self) -> &Segment {
        &self.segments[self.segments.len() - 1]
    }

    fn active_mut(&mut self) -> &mut Segment {
        let n = self.segments.len();
        &mut self.segments[n - 1]
    }

    /// The active segment's file, to `fdatasync` without holding the log.
    /// Everything appended before this call is covered by syncing it, because
    /// a segment is synced before the next one is created.
    pub fn active_file(&self) -> Arc<File> {
        self.active().file()
    }

    /// Bytes in the active segment.
    pub fn active_size(&self) -> u64 {
        self.active().size
    }

    /// Appends one validated batch, assigning it the next offsets.
    pub fn append(&mut self, data: &mut [u8]) -> Result<AppendInfo, LogError> {
        let h = batch::BatchHeader::new(data)?;
        let size = h.total_size() as u64;
        let now = now_ms();
        let act = self.active();
        let mut rolled = false;
        if act.size > 0
            && (act.size + size > self.config.segment_bytes
                || (self.config.segment_ms > 0 && now - act.created_ms >= self.config.segment_ms))
        {
            self.roll(now)?;
            rolled = true;
        }
        let base = self.next_offset();
        batch::set_base_offset(data, base);
        let h = batch::BatchHeader::new(data)?;
        let info = AppendInfo {
            rolled,
            base_offset: base,
            last_offset: h.last_offset(),
            max_timestamp: h.max_timestamp(),
        };
        self.active_mut().append(data)?;
        Ok(info)
    }

    /// Closes the active segment (synced) and starts a new one.
    pub fn roll(&mut self, now: i64) -> Result<(), LogError> {
        self.active().sync()?;
        let base = self.next_offset();
        let seg = Segment::create(&self.dir, base, self.config.index_interval_bytes, now)?;
        tracing::debug!(dir = %self.dir.display(), base, "rolled segment");
        self.segments.push(seg);
        Ok(())
    }

    /// Syncs the active segment (the others are synced when rolled).
    pub fn sync(&self) -> Result<(), LogError> {
        self.active().sync()
    }

    /// Cuts the log back to end at `offset` (a batch boundary), e.g. to drop
    /// bytes whose sync failed. A segment starting exactly at `offset` is
    /// kept (emptied), so the end is `offset` even when recovery left a gap
    /// before that segment.
    pub fn truncate_to(&mut self, offset: i64) -> Result<(), LogError> {
        while self.segments.len() > 1 && self.active().base_offset > offset {
            if let Some(seg) = self.segments.pop() {
                seg.delete()?;
            }
        }
        self.active_mut().truncate_to(offset)
    }

    /// Reads whole batches starting at the batch that holds `offset`,
    /// at most `max_bytes` (but at least one batch when `min_one`), none whose
    /// base offset is ≥ `upper`. Offsets outside [log start, log end] are an error.
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        upper: i64,
        min_one: bool,
    ) -> Result<Vec<u8>, LogError> {
        let (start, end) = (self.log_start_offset(), self.next_offset());
        if offset < start || offset > end {
            return Err(LogError::OffsetOutOfRange { offset, start, end });
        }
        let mut i = self.segments.partition_point(|s| s.base_offset <= offset);
        i = i.saturating_sub(1);
        while i < self.segments.len() {
            let seg = &self.segments[i];
            if let Some(pos) = seg.find_position(offset)? {
                return seg.read_from(pos, max_bytes, upper, min_one);
            }
            i += 1;
        }
        Ok(Vec::new())
    }

    /// Calls `f` with every batch whose offsets reach `from` or beyond, in
    /// order: the 61 header bytes, or the whole batch for control batches
    /// (whose single record says COMMIT or ABORT). Used to rebuild state.
    pub fn replay(&self, from: i64, mut f: impl FnMut(&[u8])) -> Result<(), LogError> {
        for seg in &self.segments {
            if seg.next_offset <= from {
                continue;
            }
            let mut pos = if seg.base_offset >= from {
                0
            } else {
                match seg.find_position(from)? {
                    Some(p) => p,
                    None => continue,
                }
            };
            while let Some(h) = seg.header_bytes_at(pos)? {
                let v = batch::BatchHeader::new(&h)?;
                let size = v.total_size() as u64;
                if v.is_control() {
                    f(&seg.batch_at(pos)?);
                } else {
                    f(&h);
                }
                pos += size;
            }
        }
        Ok(())
    }

    /// The offset of the first record with timestamp ≥ `ts`, or `None`.
    /// Uncompressed batches are searched record by record; in a compressed
    /// batch the answer is its base offset.
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<(i64, i64)>, LogError> {
        for seg in &self.segments {
            if let Some((pos, base)) = seg.find_timestamp(ts)? {
                let b = seg.batch_at(pos)?;
                return Ok(Some(first_record_at_or_after(&b, ts).unwrap_or((base, ts))));
            }
        }
        Ok(None)
    }

    /// The largest timestamp in the log and the offset of its batch, for
    /// ListOffsets MAX_TIMESTAMP (-3).
    pub fn max_timestamp(&self) -> i64 {
        self.segments
            .iter()
            .map(|s| s.max_timestamp)
            .max()
            .unwrap_or(-1)
    }

    /// Deletes whole segments past the time or size limit (never the active
    /// one). Returns how many were removed.
    pub fn apply_retention(&mut self, now: i64) -> Result<usize, LogError> {
        let mut removed = 0;
        let mut total = self.size_bytes() as i64;
        while self.segments.len() > 1 {
            let seg = &self.segments[0];
            let newest = if seg.max_timestamp >= 0 {
                seg.max_timestamp
            } else {
                seg.created_ms
            };
            let by_time = self.config.retention_ms > 0 && now - newest > self.config.retention_ms;
            let by_size = self.config.retention_bytes > 0
                && total - seg.size as i64 >= self.config.retention_bytes;
            if !(by_time || by_size) {
                break;
            }
            let seg = self.segments.remove(0);
            total -= seg.size as i64;
            tracing::info!(dir = %self.dir.display(), base = seg.base_offset, by_time, by_size,
                "retention deleted segment");
            seg.delete()?;
            removed += 1;
        }
        if removed > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }

    /// The segments a cleaning pass may read: every non-active segment
    /// from the first on, up to the first that reaches `upto` (exclusive)
    /// or was written after `newest_ms` (-1: no limit).
    pub fn cleanable_segments(&self, upto: i64, newest_ms: i64) -> Vec<cleaner::SegmentInfo> {
        let n = self.segments.len() - 1;
        let mut out = Vec::new();
        for (i, seg) in self.segments[..n].iter().enumerate() {
            // A segment ends where the next begins (the cleaner leaves gaps).
            let next = self.segments[i + 1].base_offset;
            if next > upto || (newest_ms >= 0 && seg.max_timestamp > newest_ms) {
                break;
            }
            let last_modified_ms = seg
                .file()
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(seg.created_ms, |d| d.as_millis() as i64);
            out.push(cleaner::SegmentInfo {
                base: seg.base_offset,
                next,
                size: seg.size,
                last_modified_ms,
            });
        }
        out
    }

    /// Swaps a cleaned segment (written by [`cleaner::clean`] under
    /// `.cleaned` names) in for the segments it replaces. Crash-safe at every
    /// step: the swap manifest is made durable first, and [`Log::open`]
    /// finishes a swap whose manifest it finds (and deletes `.cleaned` files
    /// that have none). Returns false, dropping the cleaned files, when the
    /// segments it replaces are no longer all there (retention or
    /// DeleteRecords removed some meanwhile).
    pub fn install_cleaned(&mut self, g: &cleaner::CleanedGroup) -> Result<bool, LogError> {
        let first = self.segments.iter().position(|s| s.base_offset == g.base);
        let n = self.segments.len();
        let ok = first.is_some_and(|i| {
            i + g.replaces.len() < n
                && self.segments[i..i + g.replaces.len()]
                    .iter()
                    .zip(&g.replaces)
                    .all(|(s, b)| s.base_offset == *b)
        });
        let Some(i) = first.filter(|_| ok) else {
            for ext in ["log", "index", "timeindex"] {
                remove_if_exists(&cleaner::cleaned_path(&self.dir, g.base, ext))?;
            }
            return Ok(false);
        };
        let manifest = self.dir.join(segment::file_name(g.base, SWAP_EXT));
        let text: String = g.replaces.iter().map(|b| format!("{b}\n")).collect();
        write_durably(&self.dir, &manifest, text.as_bytes())?;
        // Files stay open until the old segments are dropped; removing a
        // file that is open is fine.
        finish_swap(&self.dir, g.base, &g.replaces)?;
        let (seg, _) = Segment::open(&self.dir, g.base, self.config.index_interval_bytes, false)?;
        self.segments
            .splice(i..i + g.replaces.len(), std::iter::once(seg));
        remove_if_exists(&manifest)?;
        sync_dir(&self.dir)?;
        Ok(true)
    }

    /// Replaces the whole log with `batches` (a state snapshot of an
    /// internal log), written as one segment at the current log end, so
    /// offsets keep growing. Crash-safe like [`Log::install_cleaned`]: until
    /// the swap manifest is durable the old log stands, after it the new one.
    pub fn rewrite_as(&mut self, batches: &mut [Vec<u8>]) -> Result<(), LogError> {
        let base = self.next_offset();
        let mut w =
            cleaner::GroupWriter::create(&self.dir, base, self.config.index_interval_bytes)?;
        let mut next = base;
        for b in batches.iter_mut() {
            batch::set_base_offset(b, next);
            next = batch::BatchHeader::new(b)?.next_offset();
            w.write(b)?;
        }
        w.finish(now_ms())?;
        let replaces: Vec<i64> = self.segments.iter().map(|s| s.base_offset).collect();
        let manifest = self.dir.join(segment::file_name(base, SWAP_EXT));
        let text: String = replaces.iter().map(|b| format!("{b}\n")).collect();
        write_durably(&self.dir, &manifest, text.as_bytes())?;
        finish_swap(&self.dir, base, &replaces)?;
        let (seg, _) = Segment::open(&self.dir, base, self.config.index_interval_bytes, true)?;
        self.segments = vec![seg];
        self.start_override = -1;
        remove_if_exists(&manifest)?;
        remove_if_exists(&self.dir.join(LOG_START_FILE))?;
        sync_dir(&self.dir)?;
        Ok(())
    }

    /// DeleteRecords: moves the log start offset to `offset` (at most the
    /// log end; never back) durably, then deletes the segments wholly below
    /// it. The active segment is rolled first when `offset` is the log end
    /// and it holds data, so that nothing below `offset` stays on disk.
    /// Returns the new log start offset.
    pub fn delete_records_before(&mut self, offset: i64) -> Result<i64, LogError> {
        let offset = offset.min(self.next_offset());
        if offset > self.log_start_offset() {
            let path = self.dir.join(LOG_START_FILE);
            write_durably(&self.dir, &path, format!("{offset}\n").as_bytes())?;
            self.start_override = offset;
            if offset == self.next_offset() && self.active().size > 0 {
                self.roll(now_ms())?;
            }
        }
        // Also when the start did not move: a crash after the start offset
        // was written and before the segments went leaves them to do now.
        let start = self.log_start_offset();
        let mut removed = false;
        while self.segments.len() > 1 && self.segments[1].base_offset <= start {
            let seg = self.segments.remove(0);
            seg.delete()?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(self.log_start_offset())
    }

    /// Removes the whole log directory.
    pub fn delete(self) -> Result<(), LogError> {
        std::fs::remove_dir_all(&self.dir).map_err(|e| LogError::Io {
            op: "remove dir",
            path: self.dir.clone(),
            source: e,
        })
    }
}

fn io_err(op: &'static str, path: &Path, source: std::io::Error) -> LogError {
    LogError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn remove_if_exists(p: &Path) -> Result<(), LogError> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove", p, e)),
    }
}

/// Writes `data` to `path` so that, after a crash, `path` holds either its
/// old content or all of `data` (temporary file, fsync, rename, fsync dir).
fn write_durably(dir: &Path, path: &Path, data: &[u8]) -> Result<(), LogError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(|e| io_err("create", &tmp, e))?;
    f.write_all(data).map_err(|e| io_err("write", &tmp, e))?;
    f.sync_all().map_err(|e| io_err("fsync", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_err("rename", path, e))?;
    sync_dir(dir)
}

fn read_start_override(dir: &Path) -> i64 {
    std::fs::read_to_string(dir.join(LOG_START_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(-1)
}

/// The swap of a cleaned segment past its commit point: the segments it
/// replaces go, the `.cleaned` files take the base segment's names (the
/// log file last). Safe to run again after a crash at any step.
fn finish_swap(dir: &Path, base: i64, replaces: &[i64]) -> Result<(), LogError> {
    for b in replaces.iter().filter(|b| **b != base) {
        for ext in ["log", "index", "timeindex"] {
            remove_if_exists(&dir.join(segment::file_name(*b, ext)))?;
        }
    }
    let log_cleaned = cleaner::cleaned_path(dir, base, "log");
    if log_cleaned.exists() {
        for ext in ["index", "timeindex", "log"] {
            let from = cleaner::cleaned_path(dir, base, ext);
            let to = dir.join(segment::file_name(base, ext));
            if ext != "log" && !from.exists() {
                // Renamed before a crash: the index now there is the new one.
                continue;
            }
            std::fs::rename(&from, &to).map_err(|e| io_err("rename", &from, e))?;
        }
    }
    sync_dir(dir)
}

/// At open: finishes every swap whose manifest is durable, and removes
/// cleaned files of passes that never reached their commit point.
fn finish_swaps(dir: &Path, names: &[String]) -> Result<(), LogError> {
    let suffix = format!(".{SWAP_EXT}");
    for name in names {
        let Some(base) = name
            .strip_suffix(&suffix)
            .and_then(|b| b.parse::<i64>().ok())
        else {
            continue;
        };
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path).map_err(|e| io_err("read", &path, e))?;
        let replaces: Vec<i64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        tracing::info!(dir = %dir.display(), base, segments = replaces.len(), "finishing an interrupted cleaner swap");
        finish_swap(dir, base, &replaces)?;
        remove_if_exists(&path)?;
    }
    let cleaned = format!(".{}", cleaner::CLEANED);
    for name in names
        .iter()
        .filter(|n| n.ends_with(&cleaned) || n.ends_with(".tmp"))
    {
        let p = dir.join(name);
        if p.exists() {
            tracing::info!(path = %p.display(), "removing a cleaner file that was never swapped in");
            remove_if_exists(&p)?;
        }
    }
    sync_dir(dir)
}

/// In an uncompressed batch, the (offset, timestamp) of the first record
/// whose timestamp is ≥ `ts`; `None` when the records cannot say (the
/// caller then answers with the batch's base offset).
pub fn first_record_at_or_after(b: &[u8], ts: i64) -> Option<(i64, i64)> {
    let h = batch::BatchHeader::new(b).ok()?;
    if h.compression() != 0 {
        return None;
    }
    let mut pos = batch::HEADER_LEN;
    for _ in 0..h.records_count() {
        let len = batch::get_varint(b, &mut pos)?;
        let end = pos.checked_add(usize::try_from(len).ok()?)?;
        let mut p = pos + 1; // record attributes
        let ts_delta = batch::get_varint(b, &mut p)?;
        let off_delta = batch::get_varint(b, &mut p)?;
        let rts = h.base_timestamp().wrapping_add(ts_delta);
        if rts >= ts {
            // The offset delta is the client's word, never checked on
            // produce: past the batch's own range it is not an answer.
            if !(0..=h.last_offset_delta() as i64).contains(&off_delta) {
                return None;
            }
            return Some((h.base_offset() + off_delta, rts));
        }
        pos = end;
    }
    None
}

#[cfg(test)]
mod cleaner_tests;
#[cfg(test)]
mod tests;
