//! Segment recovery (`oncelog_log::Log::open`) on arbitrary segment files.
//! Opening must not panic or fail, reads and replays of what it kept must
//! work, and a batch appended afterwards must read back as written, also
//! after the log is opened again and cut back.
//!
//! Input: either a raw `.log` file (used as the only, active segment, base
//! offset 0; run twice: as it is, and with every batch's CRC recomputed so
//! mutations get past the CRC check), or `OLFZ` + interval u16 + segment KiB
//! u16 (0 = default) + active base u32, then sections `[tag u8][len u32
//! BE][bytes]` with tags (low 7 bits, mod 6) 0/1/2 = older segment (base 0)
//! .log/.index/.timeindex and 3/4/5 = active segment .log/.index/.timeindex;
//! the tag's high bit recomputes the CRCs of a .log section. The older
//! segment is not the last one, so its indexes are trusted when consistent,
//! as at a real restart.
#![no_main]

use std::borrow::Cow;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use oncelog_fuzz::{be_u32, fix_crcs, scratch_dir};
use oncelog_log::batch::{self, BatchBuilder};
use oncelog_log::{Log, LogConfig};

const MAGIC: &[u8] = b"OLFZ";
const EXTS: [&str; 3] = ["log", "index", "timeindex"];

struct Layout<'a> {
    config: LogConfig,
    active_base: i64,
    /// (segment 0 = older, 1 = active; ext index; bytes)
    files: Vec<(usize, usize, Cow<'a, [u8]>)>,
}

/// The layouts to try for one input.
fn parse(data: &[u8]) -> Vec<Layout<'_>> {
    let raw = |log: &[u8]| Layout {
        config: LogConfig::default(),
        active_base: 0,
        files: vec![(1, 0, Cow::Owned(log.to_vec()))],
    };
    let Some(rest) = data.strip_prefix(MAGIC) else {
        let fixed = fix_crcs(data);
        if fixed == data {
            return vec![raw(data)];
        }
        return vec![raw(data), raw(&fixed)];
    };
    if rest.len() < 8 {
        return vec![raw(rest)];
    }
    let mut config = LogConfig::default();
    config.index_interval_bytes = u16::from_be_bytes([rest[0], rest[1]]) as u64;
    let kib = u16::from_be_bytes([rest[2], rest[3]]) as u64;
    if kib > 0 {
        config.segment_bytes = kib * 1024;
    }
    let active_base = be_u32(rest, 4).unwrap() as i64;
    let mut files = Vec::new();
    let mut pos = 8;
    while pos < rest.len() {
        let tag = (rest[pos] & 0x7f) as usize % 6;
        let fix = rest[pos] & 0x80 != 0 && tag % 3 == 0;
        let len = be_u32(rest, pos + 1).unwrap_or(0) as usize;
        let start = (pos + 5).min(rest.len());
        let end = start.saturating_add(len).min(rest.len());
        let bytes = &rest[start..end];
        let bytes = if fix {
            Cow::Owned(fix_crcs(bytes))
        } else {
            Cow::Borrowed(bytes)
        };
        files.push((tag / 3, tag % 3, bytes));
        pos = end.max(pos + 5);
    }
    vec![Layout {
        config,
        active_base,
        files,
    }]
}

fn write(dir: &Path, layout: &Layout<'_>) {
    let has_older = layout.files.iter().any(|f| f.0 == 0);
    let active_base = if has_older {
        layout.active_base.max(1)
    } else {
        layout.active_base
    };
    let mut with_log = [false; 2];
    for (seg, ext, bytes) in &layout.files {
        let (seg, ext) = (*seg, *ext);
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
    for layout in parse(data) {
        run(&layout);
    }
});

fn run(layout: &Layout<'_>) {
    let tmp = scratch_dir();
    let dir = tmp.path().join("t-0");
    std::fs::create_dir_all(&dir).unwrap();
    write(&dir, layout);

    let mut log = open(&dir, &layout.config);
    // Only the last segment is validated batch by batch at open; an older
    // one is trusted up to its last index point (it was synced before the
    // next segment was created), so reading garbage there may fail, with an
    // error. With a single segment everything kept was validated.
    let validated = log.segment_count() == 1;
    let must = |what: &str, ok: bool| assert!(ok || !validated, "{what} failed");
    let (start, end) = (log.log_start_offset(), log.next_offset());
    must(
        "reading the recovered log",
        log.read(start, 1 << 20, i64::MAX, true).is_ok(),
    );
    let replayed = log.replay(start, |b| {
        let _ = batch::control_record(b);
    });
    must("replaying the recovered log", replayed.is_ok());
    for ts in [i64::MIN, 0, 1_700_000_000_000, i64::MAX] {
        must("offset_for_timestamp", log.offset_for_timestamp(ts).is_ok());
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
    assert!(
        back.starts_with(&b),
        "appended batch reads back differently"
    );
    log.sync().unwrap();
    drop(log);

    // Again after a restart, then cut the batch off.
    let mut log = open(&dir, &layout.config);
    assert_eq!(log.next_offset(), info.last_offset + 1, "reopened log end");
    let back = log
        .read(info.base_offset, 1 << 20, i64::MAX, true)
        .expect("reading the appended batch after reopening");
    assert!(
        back.starts_with(&b),
        "appended batch reads back differently after reopening"
    );
    log.truncate_to(info.base_offset).expect("truncate_to");
    assert_eq!(log.next_offset(), info.base_offset, "end after truncation");
}
