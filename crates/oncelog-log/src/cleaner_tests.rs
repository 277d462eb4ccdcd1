//! The cleaner against real segment files: what a pass keeps, transactions,
//! the bounded offset map, and the swap after a crash at each step.

use std::collections::BTreeMap;

use super::*;
use batch::{build_marker, BatchBuilder, BatchIter, ATTR_TRANSACTIONAL};
use cleaner::{clean, txn_facts, CleanOptions, CleanStats, TxnFacts};

fn cfg() -> LogConfig {
    LogConfig {
        segment_bytes: 600,
        index_interval_bytes: 128,
        ..LogConfig::default()
    }
}

fn opts(first_dirty: i64) -> CleanOptions {
    CleanOptions {
        first_dirty,
        map_entries: 1 << 20,
        delete_horizon_ms: 0,
        segment_bytes: 1 << 20,
        index_interval: 128,
    }
}

/// A batch of `(key, value)` records; `None` value is a tombstone.
fn kv(recs: &[(&str, Option<&str>)]) -> Vec<u8> {
    let mut b = BatchBuilder::new(1000);
    for (i, (k, v)) in recs.iter().enumerate() {
        b = b.record(i as i64, Some(k.as_bytes()), v.map(str::as_bytes));
    }
    b.build()
}

fn txn_batch(pid: i64, seq: i32, recs: &[(&str, &str)]) -> Vec<u8> {
    let mut b = BatchBuilder::new(1000);
    b.attributes = ATTR_TRANSACTIONAL;
    b.producer_id = pid;
    b.producer_epoch = 0;
    b.base_sequence = seq;
    for (i, (k, v)) in recs.iter().enumerate() {
        b = b.record(i as i64, Some(k.as_bytes()), Some(v.as_bytes()));
    }
    b.build()
}

/// Every record of the log: offset → (key, value).
fn read_all(log: &Log) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = log.log_start_offset();
    while at < log.next_offset() {
        let chunk = log.read(at, 1 << 30, i64::MAX, true).unwrap();
        let Some(last) = BatchIter::new(&chunk).last() else {
            break;
        };
        at = last.unwrap().1.last_offset() + 1;
        out.extend_from_slice(&chunk);
    }
    out
}

fn contents(log: &Log) -> BTreeMap<i64, (String, Option<String>)> {
    let all = read_all(log);
    let mut out = BTreeMap::new();
    for item in BatchIter::new(&all) {
        let (pos, h) = item.unwrap();
        if h.is_control() {
            continue;
        }
        let r = records::batch_records(&all[pos..pos + h.total_size()]).unwrap();
        for rec in &r.records {
            let k = String::from_utf8(r.key(rec).unwrap().to_vec()).unwrap();
            let v = rec
                .value
                .clone()
                .map(|v| String::from_utf8(r.data[v].to_vec()).unwrap());
            out.insert(h.base_offset() + rec.offset_delta, (k, v));
        }
    }
    out
}

fn markers(log: &Log) -> Vec<i64> {
    let all = read_all(log);
    BatchIter::new(&all)
        .map(|r| r.unwrap().1)
        .filter(|h| h.is_control())
        .map(|h| h.base_offset())
        .collect()
}

/// A pass over every non-active segment; returns what it wrote, not installed.
fn written(log: &Log, facts: &TxnFacts, o: &CleanOptions) -> Vec<cleaner::CleanedGroup> {
    let segs = log.cleanable_segments(i64::MAX, -1);
    let mut groups = Vec::new();
    clean(log.dir(), &segs, facts, o, &mut |_| {}, &mut |g| {
        groups.push(g);
        Ok(true)
    })
    .unwrap();
    groups
}

/// Runs a pass over every non-active segment and installs what it writes.
fn run(log: &mut Log, facts: &TxnFacts, o: &CleanOptions) -> CleanStats {
    let segs = log.cleanable_segments(i64::MAX, -1);
    let dir = log.dir().to_path_buf();
    let mut groups = Vec::new();
    // (the stats are wanted here, so not through `written`)
    let stats = clean(&dir, &segs, facts, o, &mut |_| {}, &mut |g| {
        groups.push(g);
        Ok(true)
    })
    .unwrap();
    for g in &groups {
        assert!(log.install_cleaned(g).unwrap());
    }
    stats
}

fn value_of(c: &BTreeMap<i64, (String, Option<String>)>, key: &str) -> Vec<(i64, Option<String>)> {
    c.iter()
        .filter(|(_, (k, _))| k == key)
        .map(|(o, (_, v))| (*o, v.clone()))
        .collect()
}

#[test]
fn keeps_the_last_record_per_key_at_its_offset() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    for round in 0..10 {
        for k in 0..5 {
            let v = format!("v{round}");
            log.append(&mut kv(&[(&format!("k{k}"), Some(&v))]))
                .unwrap();
        }
    }
    log.append(&mut kv(&[("tail", Some("t"))])).unwrap();
    log.roll(now_ms()).unwrap();
    let before = contents(&log);
    assert!(log.segment_count() > 3);
    let stats = run(&mut log, &TxnFacts::default(), &opts(0));
    assert_eq!(stats.map_end, 51);
    let after = contents(&log);
    assert_eq!(after.len(), 6, "{after:?}");
    for (off, rec) in &after {
        // Every kept record is the original record at the same offset.
        assert_eq!(before.get(off), Some(rec));
    }
    for k in 0..5 {
        let v = value_of(&after, &format!("k{k}"));
        assert_eq!(v.len(), 1);
        assert!(v[0].1.as_deref().unwrap().ends_with("v9"));
    }
    // New appends go on at the old end; the cleaned log survives a reopen.
    assert_eq!(
        log.append(&mut kv(&[("k0", Some("new"))]))
            .unwrap()
            .base_offset,
        51
    );
    drop(log);
    let (log, rep) = Log::open(d.path(), cfg()).unwrap();
    assert!(rep.problem.is_none());
    assert_eq!(contents(&log).len(), 7);
    assert_eq!(log.next_offset(), 52);
    // A read from an offset in a gap starts at the next kept batch.
    let r = log.read(1, 1 << 20, i64::MAX, true).unwrap();
    let first = BatchIter::new(&r).next().unwrap().unwrap().1.base_offset();
    assert_eq!(first, *after.keys().next().unwrap());
}

#[test]
fn aborted_records_go_and_committed_ones_stay() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    // pid 1 commits a=1; pid 2 writes a=bad and aborts; pid 1 commits b=2.
    log.append(&mut txn_batch(1, 0, &[("a", "1")])).unwrap(); // 0
    log.append(&mut txn_batch(2, 0, &[("a", "bad"), ("c", "bad")]))
        .unwrap(); // 1-2
    log.append(&mut build_marker(1, 0, true, 0, 1000)).unwrap(); // 3
    log.append(&mut build_marker(2, 0, false, 0, 1000)).unwrap(); // 4
    log.append(&mut txn_batch(1, 1, &[("b", "2")])).unwrap(); // 5
    log.append(&mut build_marker(1, 0, true, 0, 1000)).unwrap(); // 6
    log.append(&mut txn_batch(3, 0, &[("a", "bad2")])).unwrap(); // 7
    log.append(&mut build_marker(3, 0, false, 0, 1000)).unwrap(); // 8
    log.append(&mut txn_batch(1, 2, &[("d", "3")])).unwrap(); // 9
    log.append(&mut build_marker(1, 0, true, 0, 1000)).unwrap(); // 10
    log.roll(now_ms()).unwrap();
    let facts = txn_facts([(2, 1, 4), (3, 7, 8)], [(1, 9), (2, 1), (3, 7)]);
    let mut o = opts(0);
    // Past the delete horizon: markers of transactions with nothing left go.
    o.delete_horizon_ms = i64::MAX;
    let stats = run(&mut log, &facts, &o);
    assert_eq!(stats.aborted_records_removed, 3);
    let c = contents(&log);
    let vals: Vec<_> = c
        .values()
        .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("")))
        .collect();
    assert!(vals.iter().all(|v| !v.contains("bad")), "{vals:?}");
    assert_eq!(value_of(&c, "a").len(), 1);
    assert_eq!(c.len(), 3);
    // pid 2's and pid 3's last batches stay, empty, so their markers stay;
    // pid 1's commits each kept a batch.
    let all = read_all(&log);
    let batches: Vec<(i64, i32)> = BatchIter::new(&all)
        .map(|r| r.unwrap().1)
        .map(|h| (h.base_offset(), h.records_count()))
        .collect();
    assert!(
        batches.contains(&(1, 0)) && batches.contains(&(7, 0)),
        "{batches:?}"
    );
    assert_eq!(markers(&log), vec![3, 4, 6, 8, 10]);
    // Offsets and the last offset of the emptied batch are unchanged.
    let h = BatchIter::new(&all)
        .find(|r| r.as_ref().unwrap().1.base_offset() == 1)
        .unwrap()
        .unwrap()
        .1;
    assert_eq!(h.last_offset(), 2);
}

#[test]
fn empty_transactions_lose_their_marker_past_the_horizon_only() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    log.append(&mut txn_batch(1, 0, &[("a", "1")])).unwrap(); // 0
    log.append(&mut build_marker(1, 0, true, 0, 1000)).unwrap(); // 1
    log.append(&mut txn_batch(1, 1, &[("a", "2")])).unwrap(); // 2
    log.append(&mut build_marker(1, 0, true, 0, 1000)).unwrap(); // 3
    log.roll(now_ms()).unwrap();
    let facts = txn_facts([], [(1, 2)]);
    run(&mut log, &facts, &opts(0));
    assert_eq!(
        markers(&log),
        vec![1, 3],
        "within the horizon every marker stays"
    );
    let mut o = opts(4);
    o.delete_horizon_ms = i64::MAX;
    run(&mut log, &facts, &o);
    assert_eq!(markers(&log), vec![3]);
    assert_eq!(contents(&log).len(), 1);
}

#[test]
fn tombstones_stay_until_the_delete_horizon() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    log.append(&mut kv(&[("a", Some("1")), ("b", Some("1"))]))
        .unwrap();
    log.append(&mut kv(&[("a", None)])).unwrap();
    log.roll(now_ms()).unwrap();
    run(&mut log, &TxnFacts::default(), &opts(0));
    let c = contents(&log);
    assert_eq!(value_of(&c, "a"), vec![(2, None)]);
    let mut o = opts(3);
    o.delete_horizon_ms = i64::MAX;
    run(&mut log, &TxnFacts::default(), &o);
    let c = contents(&log);
    assert!(value_of(&c, "a").is_empty());
    assert_eq!(value_of(&c, "b").len(), 1);
}

#[test]
fn a_small_offset_map_cleans_in_several_passes() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    for round in 0..4 {
        for k in 0..60 {
            log.append(&mut kv(&[(&format!("k{k}"), Some(&format!("{round}")))]))
                .unwrap();
        }
    }
    log.roll(now_ms()).unwrap();
    let mut o = opts(0);
    o.map_entries = 25;
    let mut dirty = 0;
    let mut passes = 0;
    while dirty < log.next_offset() {
        o.first_dirty = dirty;
        let s = run(&mut log, &TxnFacts::default(), &o);
        assert!(s.keys_in_map <= 25);
        assert!(s.map_end > dirty);
        dirty = s.map_end;
        passes += 1;
    }
    assert!(passes >= 3, "{passes}");
    let c = contents(&log);
    assert_eq!(c.len(), 60);
    assert!(c
        .values()
        .all(|(_, v)| v.as_deref().unwrap().ends_with('3')));
}

#[test]
fn compressed_batches_are_cleaned_and_stay_compressed() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    for codec in [codec::GZIP, codec::SNAPPY, codec::LZ4, codec::ZSTD] {
        let plain = kv(&[("a", Some("x")), ("b", Some("y"))]);
        let r = records::batch_records(&plain).unwrap();
        let all: Vec<_> = r.records.iter().collect();
        let mut b = plain.clone();
        b[21..23].copy_from_slice(&codec.to_be_bytes());
        let mut b = records::rebuild(&b, &r, &all).unwrap();
        log.append(&mut b).unwrap();
    }
    log.append(&mut kv(&[("a", Some("last"))])).unwrap();
    log.roll(now_ms()).unwrap();
    run(&mut log, &TxnFacts::default(), &opts(0));
    let c = contents(&log);
    assert_eq!(c.len(), 2);
    let all = read_all(&log);
    let h = BatchIter::new(&all).next().unwrap().unwrap().1;
    assert_eq!((h.compression(), h.records_count()), (codec::ZSTD, 1));
}

/// The files of a cleaning pass that was written but never swapped in, or
/// swapped in part way: what `Log::open` does with them at each step.
#[test]
fn a_crash_at_any_step_of_the_swap_loses_nothing() {
    for step in 0..4 {
        let d = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
        for round in 0..6 {
            for k in 0..4 {
                log.append(&mut kv(&[(&format!("k{k}"), Some(&format!("{round}")))]))
                    .unwrap();
            }
        }
        log.roll(now_ms()).unwrap();
        let before = contents(&log);
        let groups = written(&log, &TxnFacts::default(), &opts(0));
        let g = &groups[0];
        let manifest = d.path().join(segment::file_name(g.base, SWAP_EXT));
        let text: String = g.replaces.iter().map(|b| format!("{b}\n")).collect();
        match step {
            // written, no manifest: the pass never happened
            0 => {}
            // manifest durable, nothing swapped yet
            1 => std::fs::write(&manifest, &text).unwrap(),
            // manifest, old segments deleted, cleaned files not renamed
            2 => {
                std::fs::write(&manifest, &text).unwrap();
                for b in g.replaces.iter().skip(1) {
                    std::fs::remove_file(d.path().join(segment::file_name(*b, "log"))).unwrap();
                }
            }
            // manifest, indexes renamed, log not yet
            _ => {
                std::fs::write(&manifest, &text).unwrap();
                for ext in ["index", "timeindex"] {
                    std::fs::rename(
                        cleaner::cleaned_path(d.path(), g.base, ext),
                        d.path().join(segment::file_name(g.base, ext)),
                    )
                    .unwrap();
                }
            }
        }
        drop(log);
        let (log, rep) = Log::open(d.path(), cfg()).unwrap();
        assert!(rep.problem.is_none(), "step {step}: {:?}", rep.problem);
        let after = contents(&log);
        if step == 0 {
            assert_eq!(after, before, "step {step}");
        } else {
            assert_eq!(after.len(), 4, "step {step}: {after:?}");
            assert!(after.iter().all(|(o, r)| before.get(o) == Some(r)));
        }
        let left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".cleaned") || n.ends_with(".swap"))
            .collect();
        assert!(left.is_empty(), "step {step}: {left:?}");
    }
}

#[test]
fn install_refuses_when_a_replaced_segment_is_gone() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    for i in 0..30 {
        log.append(&mut kv(&[("k", Some(&format!("{i}")))]))
            .unwrap();
    }
    log.roll(now_ms()).unwrap();
    let segs = log.cleanable_segments(i64::MAX, -1);
    let groups = written(&log, &TxnFacts::default(), &opts(0));
    // DeleteRecords removed the first segments meanwhile.
    let second = segs[1].base;
    log.delete_records_before(second + 1).unwrap();
    assert!(!log.install_cleaned(&groups[0]).unwrap());
    assert_eq!(log.log_start_offset(), second + 1);
    assert!(contents(&log).keys().all(|o| *o >= second));
}

#[test]
fn delete_records_moves_the_start_durably() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    for i in 0..40 {
        log.append(&mut kv(&[("k", Some(&format!("{i}")))]))
            .unwrap();
    }
    let segs_before = log.segment_count();
    assert_eq!(log.delete_records_before(17).unwrap(), 17);
    assert!(log.segment_count() < segs_before);
    assert!(matches!(
        log.read(16, 100, i64::MAX, true),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    // Never back; and twice is the same as once.
    assert_eq!(log.delete_records_before(5).unwrap(), 17);
    assert_eq!(log.delete_records_before(17).unwrap(), 17);
    drop(log);
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    assert_eq!(log.log_start_offset(), 17);
    // To the end: everything below goes, the log goes on from there.
    assert_eq!(log.delete_records_before(40).unwrap(), 40);
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.size_bytes(), 0);
    assert_eq!(
        log.append(&mut kv(&[("k", Some("x"))]))
            .unwrap()
            .base_offset,
        40
    );
    assert_eq!(log.log_start_offset(), 40);
}

#[test]
fn removed_abort_markers_are_reported() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    log.append(&mut txn_batch(2, 0, &[("a", "bad")])).unwrap(); // 0
    log.append(&mut build_marker(2, 0, false, 0, 1000)).unwrap(); // 1
    log.append(&mut txn_batch(2, 1, &[("a", "good")])).unwrap(); // 2
    log.append(&mut build_marker(2, 0, true, 0, 1000)).unwrap(); // 3
    log.roll(now_ms()).unwrap();
    let facts = txn_facts([(2, 0, 1)], [(2, 2)]);
    let mut o = opts(0);
    o.delete_horizon_ms = i64::MAX;
    let groups = written(&log, &facts, &o);
    let removed: Vec<(i64, i64)> = groups
        .iter()
        .flat_map(|g| g.removed_aborts.clone())
        .collect();
    assert_eq!(removed, vec![(2, 1)]);
    for g in &groups {
        assert!(log.install_cleaned(g).unwrap());
    }
    assert_eq!(markers(&log), vec![3]);
    assert_eq!(
        value_of(&contents(&log), "a"),
        vec![(2, Some("good".into()))]
    );
}

#[test]
fn rewrite_as_replaces_everything_and_offsets_go_on() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    for i in 0..50 {
        log.append(&mut kv(&[("k", Some(&format!("{i}")))]))
            .unwrap();
    }
    assert!(log.segment_count() > 1);
    let mut batches = vec![
        kv(&[("k", Some("49")), ("j", Some("x"))]),
        kv(&[("z", None)]),
    ];
    log.rewrite_as(&mut batches).unwrap();
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.log_start_offset(), 50);
    assert_eq!(log.next_offset(), 53);
    assert_eq!(
        log.append(&mut kv(&[("n", Some("1"))]))
            .unwrap()
            .base_offset,
        53
    );
    drop(log);
    let (log, rep) = Log::open(d.path(), cfg()).unwrap();
    assert!(rep.problem.is_none());
    let c = contents(&log);
    assert_eq!(c.keys().copied().collect::<Vec<_>>(), vec![50, 51, 52, 53]);
    // An empty state is a valid rewrite too.
    let mut log = log;
    log.rewrite_as(&mut []).unwrap();
    assert_eq!((log.log_start_offset(), log.next_offset()), (54, 54));
    assert!(contents(&log).is_empty());
}

#[test]
fn delete_records_finishes_after_a_crash_between_its_steps() {
    let d = tempfile::tempdir().unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    for i in 0..40 {
        log.append(&mut kv(&[("k", Some(&format!("{i}")))]))
            .unwrap();
    }
    let segs = log.segment_count();
    drop(log);
    // The start offset is durable, the segments below it were not removed yet.
    std::fs::write(d.path().join(LOG_START_FILE), "30\n").unwrap();
    let (mut log, _) = Log::open(d.path(), cfg()).unwrap();
    assert_eq!(log.log_start_offset(), 30);
    assert_eq!(log.segment_count(), segs);
    // Asking again (Kafka Streams does, every commit) removes them.
    assert_eq!(log.delete_records_before(30).unwrap(), 30);
    assert!(log.segment_count() < segs);
    assert!(contents(&log).keys().all(|o| *o >= 20));
}
