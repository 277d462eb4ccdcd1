//! Log compaction: keep the last record of every key.
//!
//! One pass over a partition works in two steps, both reading only segments
//! that are no longer written (the caller picks them: never the active
//! segment, never at or past the last stable offset):
//!
//! 1. **Offset map.** From the first dirty offset on, every committed record
//!    with a key puts (hash of the key → its offset) into a map of bounded
//!    size. When the map is full the pass stops there; the rest is dirty for
//!    the next pass.
//! 2. **Copy.** Every segment from the log start up to where the map ends is
//!    copied into new segments (consecutive segments are merged while their
//!    sum stays within `segment.bytes`), keeping a record unless the map
//!    holds a later offset for its key. Each new segment is written under a
//!    `.cleaned` name, synced, and handed to `install`, which swaps it in
//!    atomically (see [`crate::Log::install_cleaned`]).
//!
//! Transactions (Kafka's rules, KIP-98 and its cleaner):
//! * records of aborted transactions are removed, and never enter the map;
//! * a COMMIT or ABORT marker is kept while any batch of its transaction is
//!   kept, and until its segment is past the delete horizon;
//! * the last batch of every live producer is kept, emptied of its records
//!   if they all go, so its sequence numbers (and after a restart, its
//!   producer state) survive;
//! * offsets never change: a rewritten batch keeps its base offset and last
//!   offset delta, so a log with gaps is read as Kafka's consumers expect.
//!
//! Tombstones (null values) and records without a key: a tombstone is kept
//! until its segment is past the delete horizon; a record without a key is
//! removed (a compacted topic refuses them on produce).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher, RandomState};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::batch::{self, BatchHeader, LOG_OVERHEAD};
use crate::error::LogError;
use crate::records::{self, RecordSpan};
use crate::segment::{encode_index, file_name, IndexEntry};

/// Bytes one offset-map entry is budgeted (128-bit key hash, offset, and
/// the hash table's own overhead).
pub const MAP_ENTRY_BYTES: usize = 32;

/// A segment that is no longer written, as the cleaner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base: i64,
    /// The offset after its last batch.
    pub next: i64,
    pub size: u64,
    /// When it was last written (its file's modification time).
    pub last_modified_ms: i64,
}

/// What the cleaner must know of the partition's transactions and
/// producers (from its producer state).
#[derive(Debug, Default, Clone)]
pub struct TxnFacts {
    /// Per producer id, its aborted transactions: (first offset, marker offset).
    pub aborted: HashMap<i64, Vec<(i64, i64)>>,
    /// Per live producer id, the base offset of its last data batch.
    pub last_batch: HashMap<i64, i64>,
}

impl TxnFacts {
    fn is_aborted(&self, pid: i64, offset: i64) -> bool {
        self.aborted.get(&pid).is_some_and(|v| {
            v.iter()
                .any(|(first, last)| *first <= offset && offset <= *last)
        })
    }
}

#[derive(Debug, Clone)]
pub struct CleanOptions {
    /// Records from here on are dirty (not yet deduplicated).
    pub first_dirty: i64,
    /// Most keys the offset map may hold.
    pub map_entries: usize,
    /// Tombstones and empty transactions' markers in segments last written
    /// at or before this time are removed.
    pub delete_horizon_ms: i64,
    /// New segments are at most about this large.
    pub segment_bytes: u64,
    pub index_interval: u64,
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CleanStats {
    /// Where the offset map stopped: the next pass's first dirty offset.
    pub map_end: i64,
    pub keys_in_map: usize,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_read: u64,
    pub records_kept: u64,
    pub aborted_records_removed: u64,
    pub tombstones_removed: u64,
    pub markers_removed: u64,
    pub segments_in: usize,
    pub segments_out: usize,
}

/// A cleaned segment written under `.cleaned` names, ready to replace the
/// segments `replaces` (the first of which has its base offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanedGroup {
    pub base: i64,
    pub replaces: Vec<i64>,
    pub last_modified_ms: i64,
    /// ABORT markers this group no longer holds: (producer id, marker
    /// offset). The partition's aborted-transaction index must forget them
    /// when the group is swapped in: a read_committed reader told of an
    /// aborted transaction skips that producer's batches until it meets the
    /// marker, so an entry without its marker would hide committed records.
    pub removed_aborts: Vec<(i64, i64)>,
}

pub(crate) const CLEANED: &str = "cleaned";

pub(crate) fn cleaned_path(dir: &Path, base: i64, ext: &str) -> PathBuf {
    dir.join(format!("{}.{CLEANED}", file_name(base, ext)))
}

fn io_err(op: &'static str, path: &Path, source: std::io::Error) -> LogError {
    LogError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Keys → latest offset, by a 128-bit hash of the key (two independently
/// keyed SipHashes): a collision, which would drop a record, is as unlikely
/// as with Kafka's MD5.
struct OffsetMap {
    h1: RandomState,
    h2: RandomState,
    map: HashMap<u128, i64>,
    cap: usize,
}

impl OffsetMap {
    fn new(cap: usize) -> Self {
        Self {
            h1: RandomState::new(),
            h2: RandomState::new(),
            map: HashMap::new(),
            cap: cap.max(1),
        }
    }
    fn hash(&self, key: &[u8]) -> u128 {
        let mut a = self.h1.build_hasher();
        a.write(key);
        let mut b = self.h2.build_hasher();
        b.write(key);
        ((a.finish() as u128) << 64) | b.finish() as u128
    }
    fn put(&mut self, key: &[u8], offset: i64) {
        let h = self.hash(key);
        let e = self.map.entry(h).or_insert(offset);
        *e = (*e).max(offset);
    }
    fn get(&self, key: &[u8]) -> Option<i64> {
        self.map.get(&self.hash(key)).copied()
    }
}

/// Reads a segment file batch by batch.
struct BatchReader {
    r: BufReader<File>,
    left: u64,
    path: PathBuf,
}

impl BatchReader {
    fn open(dir: &Path, seg: &SegmentInfo) -> Result<Self, LogError> {
        let path = dir.join(file_name(seg.base, "log"));
        let f = File::open(&path).map_err(|e| io_err("open", &path, e))?;
        Ok(Self {
            r: BufReader::with_capacity(1 << 20, f),
            left: seg.size,
            path,
        })
    }

    /// The next whole batch, validated, into `buf`; false at the end.
    fn next(&mut self, buf: &mut Vec<u8>) -> Result<bool, LogError> {
        if self.left < LOG_OVERHEAD as u64 {
            return Ok(false);
        }
        buf.resize(LOG_OVERHEAD, 0);
        self.r
            .read_exact(buf)
            .map_err(|e| io_err("read", &self.path, e))?;
        let len = i32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]);
        if len < batch::MIN_LENGTH_FIELD || LOG_OVERHEAD as u64 + len as u64 > self.left {
            return Err(LogError::Batch(batch::BatchError::BadLength(len)));
        }
        buf.resize(LOG_OVERHEAD + len as usize, 0);
        self.r
            .read_exact(&mut buf[LOG_OVERHEAD..])
            .map_err(|e| io_err("read", &self.path, e))?;
        batch::validate(buf)?;
        self.left -= buf.len() as u64;
        Ok(true)
    }
}

fn records_err(path: &Path, base: i64, e: records::RecordsError) -> LogError {
    io_err(
        "decode records",
        path,
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("batch {base}: {e}"),
        ),
    )
}

/// Step 1: the offset map over the dirty segments, and where it ends.
fn build_map(
    dir: &Path,
    segs: &[SegmentInfo],
    pass: &mut Pass,
    throttle: &mut dyn FnMut(u64),
) -> Result<i64, LogError> {
    let mut buf = Vec::new();
    let first_dirty = pass.first_dirty;
    let end = segs.last().map_or(first_dirty, |s| s.next);
    for seg in segs.iter().filter(|s| s.next > first_dirty) {
        let mut r = BatchReader::open(dir, seg)?;
        while r.next(&mut buf)? {
            throttle(buf.len() as u64);
            pass.stats.bytes_read += buf.len() as u64;
            if let Some(stop) = pass.map_batch(&buf, &r.path)? {
                return Ok(stop);
            }
        }
    }
    Ok(end)
}

/// One cleaning pass's state, fed batch by batch in offset order: first
/// every dirty batch to [`Pass::map_batch`] (the offset map), then every
/// batch from the log start to where the map ended to [`Pass::copy_batch`].
/// The file cleaner ([`clean`]) drives it over segments; cluster mode over
/// the batches its index names.
pub struct Pass {
    map: OffsetMap,
    txn: TxnFacts,
    first_dirty: i64,
    tracker: TxnTracker,
    pub stats: CleanStats,
    /// ABORT markers removed so far: (producer id, marker offset).
    pub removed_aborts: Vec<(i64, i64)>,
}

impl Pass {
    pub fn new(txn: TxnFacts, first_dirty: i64, map_entries: usize) -> Self {
        Self {
            map: OffsetMap::new(map_entries),
            txn,
            first_dirty,
            tracker: TxnTracker::default(),
            stats: CleanStats::default(),
            removed_aborts: Vec::new(),
        }
    }

    /// Keys in the offset map.
    pub fn keys(&self) -> usize {
        self.map.map.len()
    }

    /// Puts a batch's keys in the offset map. `Some(offset)` when the map
    /// is full: this batch and everything after it stay dirty, and the map
    /// ends at `offset`. `origin` names where the batch was read (errors).
    pub fn map_batch(&mut self, b: &[u8], origin: &Path) -> Result<Option<i64>, LogError> {
        let h = BatchHeader::new(b)?;
        if h.last_offset() < self.first_dirty || h.is_control() {
            return Ok(None);
        }
        if h.is_transactional() && self.txn.is_aborted(h.producer_id(), h.base_offset()) {
            return Ok(None);
        }
        let n = h.records_count().max(0) as usize;
        if !self.map.map.is_empty() && self.map.map.len() + n > self.map.cap {
            return Ok(Some(h.base_offset()));
        }
        let recs =
            records::batch_records(b).map_err(|e| records_err(origin, h.base_offset(), e))?;
        for rec in &recs.records {
            let off = h.base_offset() + rec.offset_delta;
            if let (Some(k), true) = (recs.key(rec), off >= self.first_dirty) {
                self.map.put(k, off);
            }
        }
        Ok(None)
    }

    /// Decides one batch of the copy: `None` drops it, else the bytes to
    /// keep (the batch itself, or rebuilt with fewer records).
    /// `past_horizon`: its tombstones and empty transactions' markers may go.
    pub fn copy_batch(
        &mut self,
        b: &[u8],
        origin: &Path,
        past_horizon: bool,
    ) -> Result<Option<Vec<u8>>, LogError> {
        let h = BatchHeader::new(b)?;
        let pid = h.producer_id();
        if h.is_control() {
            let kept_any = self.tracker.kept.remove(&pid).unwrap_or(false);
            if kept_any || !past_horizon || pid < 0 {
                return Ok(Some(b.to_vec()));
            }
            self.stats.markers_removed += 1;
            if batch::control_record(b).map(|(ty, _)| ty) == Some(batch::CONTROL_ABORT) {
                self.removed_aborts.push((pid, h.base_offset()));
            }
            return Ok(None);
        }
        let out = clean_batch(
            b,
            origin,
            &self.map,
            &self.txn,
            past_horizon,
            &mut self.stats,
        )?;
        if h.is_transactional() {
            *self.tracker.kept.entry(pid).or_insert(false) |= out.is_some();
        }
        Ok(out)
    }
}

/// Writes one group's cleaned segment, with its indexes.
pub(crate) struct GroupWriter {
    dir: PathBuf,
    base: i64,
    w: BufWriter<File>,
    size: u64,
    since_index: u64,
    max_ts: i64,
    index: Vec<IndexEntry>,
    interval: u64,
    unsynced: u64,
}

/// A cleaned segment is synced every this many bytes while it is written,
/// so its final sync is short and never holds the disk for long against
/// the request path's syncs.
const SYNC_EVERY: u64 = 16 << 20;

impl GroupWriter {
    pub(crate) fn create(dir: &Path, base: i64, interval: u64) -> Result<Self, LogError> {
        let path = cleaned_path(dir, base, "log");
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| io_err("create", &path, e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            base,
            w: BufWriter::with_capacity(1 << 20, f),
            size: 0,
            since_index: 0,
            max_ts: -1,
            index: Vec::new(),
            interval,
            unsynced: 0,
        })
    }

    pub(crate) fn write(&mut self, b: &[u8]) -> Result<(), LogError> {
        let h = BatchHeader::new(b)?;
        if self.index.is_empty() || self.since_index >= self.interval {
            self.index.push(IndexEntry {
                rel_offset: (h.base_offset() - self.base) as u32,
                pos: self.size as u32,
                max_ts_before: self.max_ts,
            });
            self.since_index = 0;
        }
        self.w
            .write_all(b)
            .map_err(|e| io_err("write", &cleaned_path(&self.dir, self.base, "log"), e))?;
        self.size += b.len() as u64;
        self.since_index += b.len() as u64;
        self.max_ts = self.max_ts.max(h.max_timestamp());
        self.unsynced += b.len() as u64;
        if self.unsynced >= SYNC_EVERY {
            let path = cleaned_path(&self.dir, self.base, "log");
            self.w.flush().map_err(|e| io_err("write", &path, e))?;
            self.w
                .get_ref()
                .sync_data()
                .map_err(|e| io_err("fdatasync", &path, e))?;
            self.unsynced = 0;
        }
        Ok(())
    }

    /// Flushes and syncs the log and index files, and dates them like the
    /// newest segment they replace (the delete horizon reads that date).
    pub(crate) fn finish(self, last_modified_ms: i64) -> Result<u64, LogError> {
        let path = cleaned_path(&self.dir, self.base, "log");
        let f = self
            .w
            .into_inner()
            .map_err(|e| io_err("flush", &path, e.into_error()))?;
        let mtime = std::time::UNIX_EPOCH
            + std::time::Duration::from_millis(last_modified_ms.max(0) as u64);
        f.set_modified(mtime)
            .map_err(|e| io_err("set mtime", &path, e))?;
        f.sync_all().map_err(|e| io_err("fsync", &path, e))?;
        let (off, tim) = encode_index(&self.index);
        for (ext, data) in [("index", off), ("timeindex", tim)] {
            let p = cleaned_path(&self.dir, self.base, ext);
            let mut f = File::create(&p).map_err(|e| io_err("create", &p, e))?;
            f.write_all(&data).map_err(|e| io_err("write", &p, e))?;
            f.sync_all().map_err(|e| io_err("fsync", &p, e))?;
        }
        Ok(self.size)
    }
}

/// Consecutive segments merged while their sizes sum to at most
/// `segment_bytes` (and their offsets fit a relative index).
fn groups(segs: &[SegmentInfo], segment_bytes: u64) -> Vec<&[SegmentInfo]> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < segs.len() {
        let mut end = start + 1;
        let mut size = segs[start].size;
        while end < segs.len()
            && size + segs[end].size <= segment_bytes
            && segs[end].next - segs[start].base < i32::MAX as i64
        {
            size += segs[end].size;
            end += 1;
        }
        out.push(&segs[start..end]);
        start = end;
    }
    out
}

/// Per producer: does its open (not yet closed by a marker) transaction have
/// a batch that was kept?
#[derive(Default)]
struct TxnTracker {
    kept: HashMap<i64, bool>,
}

/// Decides one data batch: `None` drops it, else the bytes to write.
fn clean_batch(
    b: &[u8],
    path: &Path,
    map: &OffsetMap,
    txn: &TxnFacts,
    past_horizon: bool,
    stats: &mut CleanStats,
) -> Result<Option<Vec<u8>>, LogError> {
    let h = BatchHeader::new(b)?;
    let pid = h.producer_id();
    let last_of_producer = pid >= 0 && txn.last_batch.get(&pid) == Some(&h.base_offset());
    let n = h.records_count().max(0) as u64;
    stats.records_read += n;
    if h.is_transactional() && txn.is_aborted(pid, h.base_offset()) {
        stats.aborted_records_removed += n;
        if last_of_producer {
            let recs =
                records::batch_records(b).map_err(|e| records_err(path, h.base_offset(), e))?;
            return Ok(Some(
                records::rebuild(b, &recs, &[])
                    .map_err(|e| records_err(path, h.base_offset(), e.into()))?,
            ));
        }
        return Ok(None);
    }
    let recs = records::batch_records(b).map_err(|e| records_err(path, h.base_offset(), e))?;
    let kept: Vec<&RecordSpan> = recs
        .records
        .iter()
        .filter(|r| {
            let Some(k) = recs.key(r) else {
                return false;
            };
            let off = h.base_offset() + r.offset_delta;
            if map.get(k).is_some_and(|latest| latest > off) {
                return false;
            }
            if r.is_tombstone() && past_horizon {
                stats.tombstones_removed += 1;
                return false;
            }
            true
        })
        .collect();
    stats.records_kept += kept.len() as u64;
    if kept.len() == recs.records.len() {
        return Ok(Some(b.to_vec()));
    }
    if kept.is_empty() && !last_of_producer {
        return Ok(None);
    }
    records::rebuild(b, &recs, &kept)
        .map(Some)
        .map_err(|e| records_err(path, h.base_offset(), e.into()))
}

/// One cleaning pass over `segs` (the log's segments from its start, none
/// active, none reaching the last stable offset). Each cleaned group is
/// handed to `install` as soon as it is written; `throttle` is told every
/// byte read and written.
pub fn clean(
    dir: &Path,
    segs: &[SegmentInfo],
    txn: &TxnFacts,
    opts: &CleanOptions,
    throttle: &mut dyn FnMut(u64),
    install: &mut dyn FnMut(CleanedGroup) -> Result<bool, LogError>,
) -> Result<CleanStats, LogError> {
    let mut pass = Pass::new(txn.clone(), opts.first_dirty, opts.map_entries);
    let map_end = build_map(dir, segs, &mut pass, throttle)?;
    pass.stats.map_end = map_end;
    pass.stats.keys_in_map = pass.keys();
    let to_clean: Vec<SegmentInfo> = segs.iter().filter(|s| s.base < map_end).cloned().collect();
    let mut buf = Vec::new();
    for group in groups(&to_clean, opts.segment_bytes) {
        let base = group[0].base;
        let aborts_before = pass.removed_aborts.len();
        let mut w = GroupWriter::create(dir, base, opts.index_interval)?;
        for seg in group {
            let past_horizon = seg.last_modified_ms <= opts.delete_horizon_ms;
            let mut r = BatchReader::open(dir, seg)?;
            while r.next(&mut buf)? {
                throttle(buf.len() as u64);
                pass.stats.bytes_read += buf.len() as u64;
                if let Some(b) = pass.copy_batch(&buf, &r.path, past_horizon)? {
                    throttle(b.len() as u64);
                    w.write(&b)?;
                }
            }
        }
        let last_modified_ms = group.iter().map(|s| s.last_modified_ms).max().unwrap_or(0);
        pass.stats.bytes_written += w.finish(last_modified_ms)?;
        pass.stats.segments_in += group.len();
        let installed = install(CleanedGroup {
            base,
            replaces: group.iter().map(|s| s.base).collect(),
            last_modified_ms,
            removed_aborts: pass.removed_aborts[aborts_before..].to_vec(),
        })?;
        if installed {
            pass.stats.segments_out += 1;
        }
    }
    Ok(pass.stats)
}

/// The producers' last batches and the aborted ranges, gathered for
/// [`clean`] from a producer state.
pub fn txn_facts(
    aborted: impl IntoIterator<Item = (i64, i64, i64)>,
    last_batches: impl IntoIterator<Item = (i64, i64)>,
) -> TxnFacts {
    let mut f = TxnFacts::default();
    for (pid, first, last) in aborted {
        f.aborted.entry(pid).or_default().push((first, last));
    }
    f.last_batch = last_batches.into_iter().collect();
    f
}
