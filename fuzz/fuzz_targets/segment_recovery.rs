//! Segment recovery (`oncelog_log::Log::open`) on arbitrary segment files.
//! Opening must not panic or fail, reads and replays of what it kept must
//! work, and a batch appended afterwards must read back as written, also
//! after the log is opened again and cut back.
//!
//! Input: either a raw `.log` file (used as the only, active segment, base
//! offset 0), or `OLFZ` + interval u16 + segment KiB u16 (0 = default) +
//! active base u32, then sections `[tag u8][len u32 BE][bytes]` with tags
//! 0/1/2 = older segment (base 0) .log/.index/.timeindex and 3/4/5 = active
//! segment .log/.index/.timeindex. The older segment is not the last one, so
//! its indexes are trusted when consistent, as at a real restart.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use oncelog_fuzz::{be_u32, scratch_dir};
use oncelog_log::batch::{self, BatchBuilder};
use oncelog_log::{Log, LogConfig};

const MAGIC: &[u8] = b"OLFZ";
const EXTS: [&str; 3] = ["log", "index", "timeindex"];

struct Layout<'a> {
    config: LogConfig,
    active_base: i64,
    /// (segment 0 = older, 1 = active; ext index; bytes)
    files: Vec<(usize, usize, &'a [u8])>,
}

fn parse(data: &[u8]) -> Layout<'_> {
    let mut config = LogConfig::default();
    let Some(rest) = data.strip_prefix(MAGIC) else {
        return Layout {
            config,
            active_base: 0,
            files: vec![(1, 0, data)],
        };
    };
    if rest.len() < 8 {
        return Layout {
            config,
            active_base: 0,
            files: vec![(1, 0, rest)],
        };
    }
    config.index_interval_bytes = u16::from_be_bytes([rest[0], rest[1]]) as u64;
    let kib = u16::from_be_bytes([rest[2], rest[3]]) as u64;
    if kib > 0 {
        config.segment_bytes = kib * 1024;
    }
    let active_base = be_u32(rest, 4).unwrap() as i64;
    let mut files = Vec::new();
    let mut pos = 8;
    while pos < rest.len() {
        let tag = rest[pos] as usize % 6;
        let len = be_u32(rest, pos + 1).unwrap_or(0) as usize;
        let start = (pos + 5).min(rest.len());
        let end = start.saturating_add(len).min(rest.len());
        files.push((tag / 3, tag % 3, &rest[start..end]));
        pos = end.max(pos + 5);
    }
    Layout {
        config,
        active_base,
        files,
    }
}

fn write(dir: &Path, layout: &Layout<'_>) {
    let has_older = layout.files.iter().any(|f| f.0 == 0);
    let active_base = if has_older {
        layout.active_base.max(1)
    } else {
        layout.active_base
    };
    let mut with_log = [false; 2];
    for &(seg, ext, bytes) in &layout.files {
        let base = if seg == 0 { 0 } else { active_base };
        with_log[seg] |= ext == 0;
        std::fs::write(dir.join(format!("{base:020}.{}", EXTS[ext])), bytes).unwrap();
    }
    // An index without its .log is not a segment; give it an empty one.
    for (seg, has) in with_log.iter().enumerate() {
        let base = if seg == 0 { 0 } else { active_base };
        if !has && layout.files.iter().any(|f| f.0 == seg) {
            std::fs::write(dir.join(format!("{base:020}.log")), b"").unwrap();
        }
    }
}

fn open(dir: &Path, config: &LogConfig) -> Log {
    match Log::open(dir, config.clone()) {
        Ok((log, _report)) => log,
        Err(e) => panic!("Log::open failed: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let layout = parse(data);
    let tmp = scratch_dir();
    let dir = tmp.path().join("t-0");
    std::fs::create_dir_all(&dir).unwrap();
    write(&dir, &layout);

    let mut log = open(&dir, &layout.config);
    let (start, end) = (log.log_start_offset(), log.next_offset());
    log.read(start, 1 << 20, i64::MAX, true)
        .expect("reading the recovered log");
    log.replay(start, |b| {
        let _ = batch::control_record(b);
    })
    .expect("replaying the recovered log");
    for ts in [i64::MIN, 0, 1_700_000_000_000, i64::MAX] {
        log.offset_for_timestamp(ts).expect("offset_for_timestamp");
    }
    let _ = log.max_timestamp();

    // Append a valid batch and read it back.
    let mut bb = BatchBuilder::new(1_700_000_000_000);
    bb.producer_id = 1;
    bb.producer_epoch = 0;
    bb.base_sequence = 0;
    let mut b = bb
        .record(0, Some(b"k"), Some(b"v1"))
        .record(1, None, Some(b"v2"))
        .record(2, Some(b"k"), None)
        .build();
    let info = log.append(&mut b).expect("append after recovery");
    assert_eq!(info.base_offset, end, "append did not continue the log");
    let back = log
        .read(info.base_offset, 1 << 20, i64::MAX, true)
        .expect("reading the appended batch");
    assert!(back.starts_with(&b), "appended batch reads back differently");
    log.sync().unwrap();
    drop(log);

    // Again after a restart, then cut the batch off.
    let mut log = open(&dir, &layout.config);
    assert_eq!(log.next_offset(), info.last_offset + 1, "reopened log end");
    let back = log
        .read(info.base_offset, 1 << 20, i64::MAX, true)
        .expect("reading the appended batch after reopening");
    assert!(back.starts_with(&b), "appended batch reads back differently after reopening");
    log.truncate_to(info.base_offset).expect("truncate_to");
    assert_eq!(log.next_offset(), info.base_offset, "end after truncation");
});
