//! Producer-state snapshot loading: arbitrary bytes as a `<offset>.snapshot`
//! file next to a small real log, loaded the way a partition is at start
//! (`PartitionState::load`: newest usable snapshot, then replay of the log
//! after it). Loading must not panic; the state it gives must answer the
//! producer-state calls, survive a JSON round trip unchanged, and a snapshot
//! written from it must load back equal.
//!
//! Input: the snapshot file's bytes. Its offset is `len % 10` (the log ends
//! at 8, so 9 is beyond it and must be ignored).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use oncelog_broker::machines::producer_state::{ProducerBatch, ProducerState};
use oncelog_broker::backend::local::snapshot;
use oncelog_broker::backend::local::topics::PartitionState;
use oncelog_fuzz::scratch_dir;
use oncelog_log::batch::{self, BatchBuilder, ATTR_TRANSACTIONAL};
use oncelog_log::{Log, LogConfig};

const TS: i64 = 1_700_000_000_000;

fn data_batch(base: i64, pid: i64, epoch: i16, seq: i32, n: usize, txn: bool) -> Vec<u8> {
    let mut bb = BatchBuilder::new(TS + base);
    bb.base_offset = base;
    bb.producer_id = pid;
    bb.producer_epoch = epoch;
    bb.base_sequence = seq;
    if txn {
        bb.attributes = ATTR_TRANSACTIONAL;
    }
    for i in 0..n {
        bb = bb.record(i as i64, None, Some(b"v"));
    }
    bb.build()
}

fn marker(base: i64, pid: i64, epoch: i16, commit: bool) -> Vec<u8> {
    let mut m = batch::build_marker(pid, epoch, commit, 0, TS + base);
    batch::set_base_offset(&mut m, base);
    m
}

/// A segment with idempotent and transactional batches, a committed, an
/// aborted and an open transaction (offsets 0..8).
fn segment() -> &'static [u8] {
    static SEG: OnceLock<Vec<u8>> = OnceLock::new();
    SEG.get_or_init(|| {
        [
            data_batch(0, 1, 0, 0, 2, false),
            data_batch(2, 2, 0, 0, 1, true),
            data_batch(3, 1, 0, 2, 1, false),
            marker(4, 2, 0, true),
            data_batch(5, 3, 1, 0, 1, true),
            data_batch(6, 4, 0, 0, 1, true),
            marker(7, 4, 0, false),
        ]
        .concat()
    })
}

fn probe(pid: i64, epoch: i16, seq: i32, transactional: bool) -> ProducerBatch {
    ProducerBatch {
        producer_id: pid,
        epoch,
        first_seq: seq,
        last_seq: seq,
        transactional,
        max_timestamp: TS,
    }
}

fuzz_target!(|data: &[u8]| {
    let tmp = scratch_dir();
    let dir = tmp.path().join("t-0");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{:020}.log", 0)), segment()).unwrap();
    let off = (data.len() % 10) as i64;
    std::fs::write(dir.join(format!("{off:020}.snapshot")), data).unwrap();

    let (log, _) = Log::open(&dir, LogConfig::default()).expect("open the log");
    assert_eq!(log.next_offset(), 8);
    let mut st = PartitionState::load(log, "t-0");
    let _ = st.last_stable_offset(8);
    let _ = st.producers.ongoing().count();

    // A JSON round trip keeps the state as it is.
    let json = serde_json::to_vec(&st.producers).expect("serialize the state");
    let back: ProducerState = serde_json::from_slice(&json).expect("deserialize the state");
    assert_eq!(back, st.producers, "state changed in a JSON round trip");

    // So does writing a snapshot and loading it.
    snapshot::write(&dir, 100, &st.producers);
    let (at, loaded) = snapshot::load_latest(&dir, 100).expect("load the written snapshot");
    assert_eq!(at, 100);
    assert_eq!(
        loaded, st.producers,
        "state changed through a snapshot file"
    );

    // The producer-state calls answer on whatever was loaded.
    let p = &mut st.producers;
    let pids: Vec<(i64, i16)> = p
        .producers()
        .map(|(id, e)| (*id, e.epoch))
        .take(8)
        .collect();
    for (pid, epoch) in pids.iter().copied().chain([(1, 0), (3, 1), (9, 0)]) {
        for (seq, txn) in [(0, false), (3, true), (i32::MAX, false)] {
            let b = probe(pid, epoch, seq, txn);
            let _ = p.check(&b);
            let _ = p.check(&probe(pid, epoch.wrapping_add(1), seq, txn));
            let _ = p.check_marker(pid, epoch, 0);
            if let Some(e) = p.get(pid) {
                let _ = e.last_seq();
            }
        }
    }
    for (i, (pid, epoch)) in pids.iter().copied().enumerate() {
        let at = 8 + i as i64;
        p.apply_batch(&probe(pid, epoch, 0, i % 2 == 0), at, at);
        let _ = p.apply_marker(pid, epoch, 1, at + 100, i % 3 == 0, TS);
    }
    let _ = p.aborted_overlapping(0, i64::MAX);
    let _ = p.aborted_overlapping(5, 6);
    p.trim_aborted(3);
    let _ = p.first_unstable_offset();
    let _ = p.expire(TS);
    let _ = (p.len(), p.is_empty());
    st.rebuild_after_truncation();
});
