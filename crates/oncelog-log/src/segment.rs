//! One segment of a partition log: `<base offset>.log` plus its sparse
//! `.index` (relative offset → file position) and `.timeindex` (largest
//! timestamp seen before a position → position).
//!
//! Both indexes get an entry at the same points (every `index.interval.bytes`
//! of log), so they can be loaded in lockstep. They are hints: the log file is
//! the truth, and a missing or inconsistent index is rebuilt by scanning.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::batch::{self, BatchHeader, HEADER_LEN, LOG_OVERHEAD};
use crate::error::LogError;

/// One index point: the batch starting at `pos` has base offset
/// `base + rel_offset`; every batch before `pos` has a max timestamp ≤ `max_ts_before`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    pub rel_offset: u32,
    pub pos: u32,
    pub max_ts_before: i64,
}

const OFFSET_ENTRY: usize = 8;
const TIME_ENTRY: usize = 12;

pub(crate) fn file_name(base: i64, ext: &str) -> String {
    format!("{base:020}.{ext}")
}

fn io_err(op: &'static str, path: &Path, source: io::Error) -> LogError {
    LogError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// What a scan of a segment file found.
#[derive(Debug, Default)]
pub(crate) struct ScanResult {
    /// Byte length of the valid prefix.
    pub valid_len: u64,
    /// The first problem met, if the scan stopped before the end of the file.
    pub problem: Option<String>,
}

pub(crate) struct Segment {
    pub base_offset: i64,
    dir: PathBuf,
    file: Arc<File>,
    pub size: u64,
    pub next_offset: i64,
    pub max_timestamp: i64,
    pub created_ms: i64,
    index: Vec<IndexEntry>,
    index_file: File,
    time_file: File,
    bytes_since_index: u64,
    index_interval: u64,
}

impl Segment {
    fn open_files(dir: &Path, base: i64, create: bool) -> Result<(File, File, File), LogError> {
        let open = |ext: &str| -> Result<File, LogError> {
            let p = dir.join(file_name(base, ext));
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(create || ext != "log")
                .truncate(false)
                .open(&p)
                .map_err(|e| io_err("open", &p, e))
        };
        Ok((open("log")?, open("index")?, open("timeindex")?))
    }

    /// Creates a new, empty segment (and makes its directory entry durable).
    pub fn create(
        dir: &Path,
        base: i64,
        index_interval: u64,
        now_ms: i64,
    ) -> Result<Self, LogError> {
        let (file, index_file, time_file) = Self::open_files(dir, base, true)?;
        for f in [&file, &index_file, &time_file] {
            f.set_len(0).map_err(|e| io_err("truncate", dir, e))?;
        }
        sync_dir(dir)?;
        Ok(Self {
            base_offset: base,
            dir: dir.to_path_buf(),
            file: Arc::new(file),
            size: 0,
            next_offset: base,
            max_timestamp: -1,
            created_ms: now_ms,
            index: Vec::new(),
            index_file,
            time_file,
            bytes_since_index: 0,
            index_interval,
        })
    }

    /// Opens an existing segment. With `full_scan`, every batch is validated
    /// (CRC included) and the file is cut back to the last valid batch; the
    /// number of bytes dropped is returned. Without it, the indexes are
    /// trusted when consistent and only the tail after the last index point is read.
    pub fn open(
        dir: &Path,
        base: i64,
        index_interval: u64,
        full_scan: bool,
    ) -> Result<(Self, Option<(u64, String)>), LogError> {
        let (file, index_file, time_file) = Self::open_files(dir, base, false)?;
        let path = dir.join(file_name(base, "log"));
        let meta = file.metadata().map_err(|e| io_err("stat", &path, e))?;
        let created_ms = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let mut seg = Self {
            base_offset: base,
            dir: dir.to_path_buf(),
            file: Arc::new(file),
            size: meta.len(),
            next_offset: base,
            max_timestamp: -1,
            created_ms,
            index: Vec::new(),
            index_file,
            time_file,
            bytes_since_index: 0,
            index_interval,
        };
        let loaded = !full_scan && seg.load_index()?;
        let start = if loaded {
            seg.index.last().copied()
        } else {
            seg.index.clear();
            None
        };
        let (from_pos, from_offset, ts) = match start {
            Some(e) => (e.pos as u64, base + e.rel_offset as i64, e.max_ts_before),
            None => (0, base, -1),
        };
        seg.max_timestamp = ts;
        seg.next_offset = from_offset;
        let scan = seg.scan_from(from_pos, !loaded)?;
        let mut dropped = None;
        if scan.valid_len < seg.size {
            let n = seg.size - scan.valid_len;
            let why = scan.problem.unwrap_or_else(|| "unknown".into());
            seg.file
                .set_len(scan.valid_len)
                .map_err(|e| io_err("truncate", &path, e))?;
            seg.file.sync_all().map_err(|e| io_err("fsync", &path, e))?;
            seg.size = scan.valid_len;
            dropped = Some((n, why));
        }
        if !loaded {
            seg.rewrite_index_files()?;
        }
        Ok((seg, dropped))
    }

    /// Loads the index files; false when they are missing or inconsistent.
    fn load_index(&mut self) -> Result<bool, LogError> {
        let read_all = |f: &File| -> io::Result<Vec<u8>> {
            let len = f.metadata()?.len() as usize;
            let mut v = vec![0u8; len];
            f.read_exact_at(&mut v, 0)?;
            Ok(v)
        };
        let p = self.dir.join(file_name(self.base_offset, "index"));
        let (Ok(off), Ok(tim)) = (read_all(&self.index_file), read_all(&self.time_file)) else {
            return Ok(false);
        };
        if off.len() % OFFSET_ENTRY != 0
            || tim.len() % TIME_ENTRY != 0
            || off.len() / OFFSET_ENTRY != tim.len() / TIME_ENTRY
        {
            tracing::info!(path = %p.display(), "index files inconsistent, rebuilding");
            return Ok(false);
        }
        let mut entries = Vec::with_capacity(off.len() / OFFSET_ENTRY);
        for (o, t) in off
            .chunks_exact(OFFSET_ENTRY)
            .zip(tim.chunks_exact(TIME_ENTRY))
        {
            let rel = u32::from_be_bytes([o[0], o[1], o[2], o[3]]);
            let pos = u32::from_be_bytes([o[4], o[5], o[6], o[7]]);
            let mut ts = [0u8; 8];
            ts.copy_from_slice(&t[..8]);
            let trel = u32::from_be_bytes([t[8], t[9], t[10], t[11]]);
            let e = IndexEntry {
                rel_offset: rel,
                pos,
                max_ts_before: i64::from_be_bytes(ts),
            };
            let monotonic = entries
                .last()
                .is_none_or(|p: &IndexEntry| p.rel_offset < rel && p.pos < pos);
            if trel != rel || pos as u64 >= self.size || !monotonic {
                return Ok(false);
            }
            entries.push(e);
        }
        // The entry must point at a batch that starts where it says. A
        // non-empty segment always has an entry at position 0, so no entries
        // means the index files were lost: rebuild them.
        match entries.last() {
            Some(last) => match self.header_at(last.pos as u64) {
                Ok(Some(h)) if h.0 == self.base_offset + last.rel_offset as i64 => {}
                _ => return Ok(false),
            },
            None if self.size > 0 => return Ok(false),
            None => {}
        }
        self.index = entries;
        Ok(true)
    }

    fn rewrite_index_files(&mut self) -> Result<(), LogError> {
        let (off, tim) = encode_index(&self.index);
        let p = self.dir.join(file_name(self.base_offset, "index"));
        for (f, data) in [(&self.index_file, &off), (&self.time_file, &tim)] {
            f.set_len(0).map_err(|e| io_err("truncate", &p, e))?;
            f.write_all_at(data, 0)
                .map_err(|e| io_err("write", &p, e))?;
        }
        Ok(())
    }

    /// The raw header bytes of the batch at `pos`, if a whole header is there.
    pub fn header_bytes_at(&self, pos: u64) -> Result<Option<[u8; HEADER_LEN]>, LogError> {
        if pos + HEADER_LEN as u64 > self.size {
            return Ok(None);
        }
        let mut h = [0u8; HEADER_LEN];
        self.file
            .read_exact_at(&mut h, pos)
            .map_err(|e| io_err("read", &self.log_path(), e))?;
        Ok(Some(h))
    }

    /// Reads the header at `pos`: (base offset, last offset, total size, max timestamp).
    pub fn header_at(&self, pos: u64) -> Result<Option<(i64, i64, u64, i64)>, LogError> {
        if pos + HEADER_LEN as u64 > self.size {
            return Ok(None);
        }
        let mut h = [0u8; HEADER_LEN];
        self.file
            .read_exact_at(&mut h, pos)
            .map_err(|e| io_err("read", &self.log_path(), e))?;
        let v = BatchHeader::new(&h).map_err(LogError::Batch)?;
        Ok(Some((
            v.base_offset(),
            v.last_offset(),
            v.total_size() as u64,
            v.max_timestamp(),
        )))
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join(file_name(self.base_offset, "log"))
    }

    /// Walks batches from `pos` to the end of the file, validating each
    /// fully (length, magic, CRC, growing offsets). Updates `next_offset`,
    /// `max_timestamp` and, when `build_index`, the in-memory index.
    fn scan_from(&mut self, mut pos: u64, build_index: bool) -> Result<ScanResult, LogError> {
        let path = self.log_path();
        let mut buf = Vec::new();
        let mut since_index = 0u64;
        loop {
            if pos == self.size {
                self.bytes_since_index = since_index;
                return Ok(ScanResult {
                    valid_len: pos,
                    problem: None,
                });
            }
            let stop = |why: String| ScanResult {
                valid_len: pos,
                problem: Some(why),
            };
            if pos + LOG_OVERHEAD as u64 > self.size {
                return Ok(stop(format!(
                    "partial batch header at position {pos} ({} bytes left)",
                    self.size - pos
                )));
            }
            let mut head = [0u8; LOG_OVERHEAD];
            self.file
                .read_exact_at(&mut head, pos)
                .map_err(|e| io_err("read", &path, e))?;
            let len = i32::from_be_bytes([head[8], head[9], head[10], head[11]]);
            if len < batch::MIN_LENGTH_FIELD {
                return Ok(stop(format!("bad batch length {len} at position {pos}")));
            }
            let total = LOG_OVERHEAD as u64 + len as u64;
            if pos + total > self.size {
                return Ok(stop(format!(
                    "batch at position {pos} needs {total} bytes, {} left",
                    self.size - pos
                )));
            }
            buf.resize(total as usize, 0);
            self.file
                .read_exact_at(&mut buf, pos)
                .map_err(|e| io_err("read", &path, e))?;
            let h = match batch::validate(&buf) {
                Ok(h) => h,
                Err(e) => return Ok(stop(format!("batch at position {pos}: {e}"))),
            };
            // Offsets only grow; compaction leaves gaps between batches.
            if h.base_offset() < self.next_offset {
                return Ok(stop(format!(
                    "batch at position {pos} has base offset {}, expected at least {}",
                    h.base_offset(),
                    self.next_offset
                )));
            }
            // A segment's offsets stay within i32 of its base (its index
            // holds relative offsets; the cleaner's groups keep to that),
            // so a batch far past it is garbage, not a gap.
            let in_range = h.last_offset_delta() >= 0
                && h.base_offset()
                    .checked_add(h.last_offset_delta() as i64 + 1)
                    .is_some_and(|next| next - self.base_offset <= i32::MAX as i64);
            if !in_range {
                return Ok(stop(format!(
                    "batch at position {pos} has offsets {}+{} out of range for segment {}",
                    h.base_offset(),
                    h.last_offset_delta(),
                    self.base_offset
                )));
            }
            if build_index
                && (self.index.is_empty() && pos == 0 || since_index >= self.index_interval)
            {
                self.index.push(IndexEntry {
                    rel_offset: (h.base_offset() - self.base_offset) as u32,
                    pos: pos as u32,
                    max_ts_before: self.max_timestamp,
                });
                since_index = 0;
            }
            since_index += total;
            self.next_offset = h.next_offset();
            self.max_timestamp = self.max_timestamp.max(h.max_timestamp());
            pos += total;
        }
    }

    pub fn file(&self) -> Arc<File> {
        self.file.clone()
    }

    /// Appends one batch whose base offset is already set. On a write error
    /// the file is cut back to its previous size and nothing changes.
    pub fn append(&mut self, data: &[u8]) -> Result<(), LogError> {
        let h = BatchHeader::new(data).map_err(LogError::Batch)?;
        let pos = self.size;
        if let Err(e) = self.file.write_all_at(data, pos) {
            let path = self.log_path();
            if let Err(te) = self.file.set_len(pos) {
                tracing::error!(path = %path.display(), error = %te, "could not cut back a failed write");
            }
            return Err(io_err("write", &path, e));
        }
        if self.index.is_empty() || self.bytes_since_index >= self.index_interval {
            let e = IndexEntry {
                rel_offset: (h.base_offset() - self.base_offset) as u32,
                pos: pos as u32,
                max_ts_before: self.max_timestamp,
            };
            self.push_index(e);
            self.bytes_since_index = 0;
        }
        self.bytes_since_index += data.len() as u64;
        self.size += data.len() as u64;
        self.next_offset = h.next_offset();
        self.max_timestamp = self.max_timestamp.max(h.max_timestamp());
        Ok(())
    }

    fn push_index(&mut self, e: IndexEntry) {
        // The index is a rebuildable hint: a failed write is logged, and the
        // next open rebuilds it from the log.
        let n = self.index.len() as u64;
        let mut o = [0u8; OFFSET_ENTRY];
        o[..4].copy_from_slice(&e.rel_offset.to_be_bytes());
        o[4..].copy_from_slice(&e.pos.to_be_bytes());
        let mut t = [0u8; TIME_ENTRY];
        t[..8].copy_from_slice(&e.max_ts_before.to_be_bytes());
        t[8..].copy_from_slice(&e.rel_offset.to_be_bytes());
        let r1 = self.index_file.write_all_at(&o, n * OFFSET_ENTRY as u64);
        let r2 = self.time_file.write_all_at(&t, n * TIME_ENTRY as u64);
        if let Err(err) = r1.and(r2) {
            tracing::warn!(segment = %self.log_path().display(), error = %err, "index write failed; it will be rebuilt at next start");
        }
        self.index.push(e);
    }

    /// Position of the batch containing `offset`, or of the first batch after it.
    /// `None` when `offset` is at or past the end of this segment.
    pub fn find_position(&self, offset: i64) -> Result<Option<u64>, LogError> {
        if offset >= self.next_offset {
            return Ok(None);
        }
        let rel = (offset - self.base_offset).max(0);
        let i = self.index.partition_point(|e| (e.rel_offset as i64) <= rel);
        let mut pos = if i == 0 {
            0
        } else {
            self.index[i - 1].pos as u64
        };
        while let Some((_, last, size, _)) = self.header_at(pos)? {
            if last >= offset {
                return Ok(Some(pos));
            }
            pos += size;
        }
        Ok(None)
    }

    /// Reads whole batches from `pos`: at most `max_bytes` (but always the
    /// first batch when `min_one`), stopping before any batch whose base
    /// offset is ≥ `upper`.
    pub fn read_from(
        &self,
        pos: u64,
        max_bytes: usize,
        upper: i64,
        min_one: bool,
    ) -> Result<Vec<u8>, LogError> {
        let avail = (self.size - pos) as usize;
        let mut want = avail.min(max_bytes.max(HEADER_LEN));
        let mut buf = vec![0u8; want];
        self.file
            .read_exact_at(&mut buf, pos)
            .map_err(|e| io_err("read", &self.log_path(), e))?;
        let mut end = 0usize;
        loop {
            if end + HEADER_LEN > buf.len() {
                break;
            }
            let h = BatchHeader::new(&buf[end..]).map_err(LogError::Batch)?;
            if h.base_offset() >= upper {
                break;
            }
            let size = h.total_size();
            if end + size > buf.len() {
                if end == 0 && min_one && size <= avail {
                    // The first batch is larger than max_bytes: serve it whole.
                    want = size;
                    buf.resize(want, 0);
                    self.file
                        .read_exact_at(&mut buf, pos)
                        .map_err(|e| io_err("read", &self.log_path(), e))?;
                    end = size;
                }
                break;
            }
            if end > 0 && end + size > max_bytes {
                break;
            }
            end += size;
            if end >= max_bytes {
                break;
            }
        }
        buf.truncate(end);
        Ok(buf)
    }

    /// The first offset whose batch may hold a timestamp ≥ `ts`, with the
    /// batch's position. Scans from the last index point that is wholly older.
    pub fn find_timestamp(&self, ts: i64) -> Result<Option<(u64, i64)>, LogError> {
        if self.max_timestamp < ts {
            return Ok(None);
        }
        let i = self.index.partition_point(|e| e.max_ts_before < ts);
        let mut pos = if i == 0 {
            0
        } else {
            self.index[i - 1].pos as u64
        };
        while let Some((base, _, size, max_ts)) = self.header_at(pos)? {
            if max_ts >= ts {
                return Ok(Some((pos, base)));
            }
            pos += size;
        }
        Ok(None)
    }

    /// Reads the whole batch at `pos`.
    pub fn batch_at(&self, pos: u64) -> Result<Vec<u8>, LogError> {
        let Some((_, _, size, _)) = self.header_at(pos)? else {
            return Ok(Vec::new());
        };
        let mut buf = vec![0u8; size as usize];
        self.file
            .read_exact_at(&mut buf, pos)
            .map_err(|e| io_err("read", &self.log_path(), e))?;
        Ok(buf)
    }

    /// Cuts the segment back so that `offset` (a batch boundary) becomes its end.
    pub fn truncate_to(&mut self, offset: i64) -> Result<(), LogError> {
        let pos = self.find_position(offset)?.unwrap_or(self.size);
        let path = self.log_path();
        self.file
            .set_len(pos)
            .map_err(|e| io_err("truncate", &path, e))?;
        self.size = pos;
        self.index.retain(|e| (e.pos as u64) < pos);
        self.rewrite_index_files()?;
        // Recompute the end state from the last index point.
        let (from, next, ts) = match self.index.last() {
            Some(e) => (
                e.pos as u64,
                self.base_offset + e.rel_offset as i64,
                e.max_ts_before,
            ),
            None => (0, self.base_offset, -1),
        };
        self.next_offset = next;
        self.max_timestamp = ts;
        let scan = self.scan_from(from, false)?;
        if let Some(p) = scan.problem {
            tracing::error!(segment = %path.display(), problem = %p, "segment invalid after truncation");
        }
        Ok(())
    }

    pub fn sync(&self) -> Result<(), LogError> {
        self.file
            .sync_data()
            .map_err(|e| io_err("fdatasync", &self.log_path(), e))
    }

    /// Removes the segment's files.
    pub fn delete(self) -> Result<(), LogError> {
        for ext in ["log", "index", "timeindex"] {
            let p = self.dir.join(file_name(self.base_offset, ext));
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &p, e)),
            }
        }
        Ok(())
    }
}

/// The bytes of the `.index` and `.timeindex` files for `entries`.
pub(crate) fn encode_index(entries: &[IndexEntry]) -> (Vec<u8>, Vec<u8>) {
    let mut off = Vec::with_capacity(entries.len() * OFFSET_ENTRY);
    let mut tim = Vec::with_capacity(entries.len() * TIME_ENTRY);
    for e in entries {
        off.extend_from_slice(&e.rel_offset.to_be_bytes());
        off.extend_from_slice(&e.pos.to_be_bytes());
        tim.extend_from_slice(&e.max_ts_before.to_be_bytes());
        tim.extend_from_slice(&e.rel_offset.to_be_bytes());
    }
    (off, tim)
}

/// Makes a directory's entries (new or removed files) durable.
pub fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("fsync dir", dir, e))
}
