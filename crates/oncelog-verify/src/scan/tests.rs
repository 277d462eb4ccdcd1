use super::*;
use oncelog_log::batch::{build_marker, set_base_offset, BatchBuilder, ATTR_TRANSACTIONAL};

const RULES: Rules = Rules {
    compacted: false,
    producer_expiry_ms: 60_000,
};

/// A data batch of `n` records at `offset` by (pid, epoch) from `seq`.
fn data(offset: i64, pid: i64, epoch: i16, seq: i32, n: i32, txn: bool) -> Vec<u8> {
    let mut b = BatchBuilder::new(1_000 + offset);
    for i in 0..n {
        b = b.record(0, Some(format!("k{i}").as_bytes()), Some(b"v"));
    }
    b.base_offset = offset;
    b.producer_id = pid;
    b.producer_epoch = epoch;
    b.base_sequence = seq;
    if txn {
        b.attributes = ATTR_TRANSACTIONAL;
    }
    b.build()
}

fn marker(offset: i64, pid: i64, epoch: i16, commit: bool) -> Vec<u8> {
    let mut m = build_marker(pid, epoch, commit, 0, 1_000 + offset);
    set_base_offset(&mut m, offset);
    m
}

fn scan(chunks: &[(Vec<Vec<u8>>, Vec<Aborted>)]) -> Vec<Finding> {
    let mut s = Scanner::starting_at(RULES, 0);
    let mut out = Vec::new();
    for (batches, aborted) in chunks {
        s.feed(&batches.concat(), aborted, &mut out);
    }
    out
}

fn kinds(f: &[Finding]) -> Vec<(Kind, i64, i64)> {
    f.iter()
        .map(|f| (f.kind, f.first_offset, f.last_offset))
        .collect()
}

#[test]
fn a_sound_log_has_nothing_to_report() {
    let log = vec![
        data(0, 7, 0, 0, 3, true),  // 0..=2
        data(3, 8, 0, 0, 2, false), // idempotent 3..=4
        data(5, 7, 0, 3, 1, true),  // 5
        marker(6, 7, 0, true),      // 6
        data(7, 7, 0, 4, 2, true),  // 7..=8 (TV1: same epoch, next sequences)
        marker(9, 7, 0, false),     // 9 abort
        data(10, 7, 1, 0, 1, true), // a bumped epoch starts at 0
        marker(11, 7, 1, true),
        data(12, -1, -1, -1, 2, false), // no producer id
    ];
    let aborted = vec![Aborted {
        producer_id: 7,
        first_offset: 7,
        last_offset: 9,
    }];
    let mut s = Scanner::starting_at(RULES, 0);
    let mut out = Vec::new();
    let fed = s.feed(&log.concat(), &aborted, &mut out);
    assert_eq!(kinds(&out), vec![]);
    assert_eq!(s.next_offset(), Some(14));
    assert_eq!(fed.crcs.len(), log.len());
    assert_eq!(fed.markers.len(), 3);
    assert!(fed.markers[0].commit && !fed.markers[1].commit);
    assert_eq!(s.earliest_open(), None);
}

#[test]
fn chunks_carry_state_across() {
    let out = scan(&[
        (vec![data(0, 7, 0, 0, 2, true)], vec![]),
        (
            vec![data(2, 7, 0, 2, 2, true), marker(4, 7, 0, false)],
            vec![Aborted {
                producer_id: 7,
                first_offset: 0,
                last_offset: 4,
            }],
        ),
        (vec![data(5, 7, 0, 4, 1, false)], vec![]),
    ]);
    assert_eq!(kinds(&out), vec![]);
}

#[test]
fn a_changed_byte_is_a_crc_finding_and_the_scan_goes_on() {
    let mut bad = data(2, 7, 0, 2, 2, false);
    let n = bad.len();
    bad[n - 3] ^= 0x40;
    let out = scan(&[(
        vec![data(0, 7, 0, 0, 2, false), bad, data(4, 7, 0, 4, 1, false)],
        vec![],
    )]);
    assert_eq!(kinds(&out), vec![(Kind::Crc, 2, 3)]);
}

#[test]
fn an_unframable_tail_is_reported_and_not_consumed() {
    let good = data(0, 7, 0, 0, 2, false);
    let mut bytes = good.clone();
    bytes.extend_from_slice(&[0u8; 20]);
    let mut s = Scanner::starting_at(RULES, 0);
    let mut out = Vec::new();
    let fed = s.feed(&bytes, &[], &mut out);
    assert_eq!(fed.consumed, good.len());
    assert_eq!(kinds(&out), vec![(Kind::Crc, 2, 2)]);
}

#[test]
fn a_removed_batch_is_a_gap_unless_compacted() {
    let log = vec![
        data(0, 7, 0, 0, 2, true),
        data(3, 7, 0, 3, 1, true),
        marker(4, 7, 0, true),
    ];
    // offset 2 (and sequence 2) removed
    let out = scan(&[(log.clone(), vec![])]);
    assert_eq!(
        kinds(&out),
        vec![(Kind::OffsetGap, 2, 2), (Kind::SequenceGap, 3, 3)]
    );
    let mut s = Scanner::starting_at(
        Rules {
            compacted: true,
            ..RULES
        },
        0,
    );
    let mut out = Vec::new();
    s.feed(&log.concat(), &[], &mut out);
    assert_eq!(kinds(&out), vec![]);
}

#[test]
fn a_removed_commit_marker_leaves_a_gap_at_its_offset() {
    // 0..=1 txn, COMMIT at 2 removed, a next transaction 3..=4, COMMIT at 5
    let log = vec![
        data(0, 7, 0, 0, 2, true),
        data(3, 7, 0, 2, 2, true),
        marker(5, 7, 0, true),
    ];
    let out = scan(&[(log, vec![])]);
    assert_eq!(kinds(&out), vec![(Kind::OffsetGap, 2, 2)]);
}

#[test]
fn offsets_going_back_are_reported() {
    let out = scan(&[(
        vec![data(0, -1, -1, -1, 3, false), data(1, -1, -1, -1, 1, false)],
        vec![],
    )]);
    assert_eq!(kinds(&out), vec![(Kind::OffsetOrder, 1, 1)]);
}

#[test]
fn epochs_never_go_back() {
    let out = scan(&[(
        vec![
            data(0, 7, 3, 0, 1, false),
            data(1, 7, 2, 1, 1, false),
            marker(2, 7, 1, false),
        ],
        vec![],
    )]);
    assert_eq!(
        kinds(&out),
        vec![(Kind::EpochRegression, 1, 1), (Kind::EpochRegression, 2, 2)]
    );
}

#[test]
fn sequences_continue_within_an_epoch_and_a_new_one_starts_at_zero() {
    let out = scan(&[(
        vec![
            data(0, 7, 0, 0, 2, false),
            data(2, 7, 0, 5, 1, false),
            data(3, 7, 1, 4, 1, false),
        ],
        vec![],
    )]);
    assert_eq!(
        kinds(&out),
        vec![(Kind::SequenceGap, 2, 2), (Kind::SequenceGap, 3, 3)]
    );
}

#[test]
fn an_abort_with_a_bumped_epoch_leaves_the_next_sequence_open() {
    // A fence: the coordinator aborts with epoch 1, the producer (KIP-360)
    // goes on in epoch 1 from any sequence it is given.
    let out = scan(&[(
        vec![
            data(0, 7, 0, 0, 2, true),
            marker(2, 7, 1, false),
            data(3, 7, 1, 0, 1, true),
            marker(4, 7, 1, true),
        ],
        vec![Aborted {
            producer_id: 7,
            first_offset: 0,
            last_offset: 2,
        }],
    )]);
    assert_eq!(kinds(&out), vec![]);
}

#[test]
fn a_producer_unseen_past_the_expiry_may_start_over() {
    let mut late = BatchBuilder::new(1_000 + 120_000).record(0, None, Some(b"v"));
    late.base_offset = 1;
    late.producer_id = 7;
    late.producer_epoch = 0;
    late.base_sequence = 40;
    let out = scan(&[(vec![data(0, 7, 0, 0, 1, false), late.build()], vec![])]);
    assert_eq!(kinds(&out), vec![]);
}

#[test]
fn a_newer_epoch_over_an_open_transaction_is_unclosed() {
    let out = scan(&[(
        vec![
            data(0, 7, 0, 0, 2, true),
            data(2, 7, 1, 0, 1, true),
            marker(3, 7, 1, true),
        ],
        vec![],
    )]);
    assert_eq!(kinds(&out), vec![(Kind::UnclosedTxn, 0, 1)]);
}

#[test]
fn a_transaction_the_partition_called_closed_needs_its_marker_below_the_hw_of_then() {
    // 0..=1 open by 7; 2 by 8 open; the partition says LSO 2 (7 closed),
    // HW 4: 7's marker must be at 2 or 3.
    let mut s = Scanner::starting_at(RULES, 0);
    let mut out = Vec::new();
    s.feed(&[data(0, 7, 0, 0, 2, true)].concat(), &[], &mut out);
    s.reached_stable(2, 4);
    assert_eq!(s.earliest_open(), Some(0));
    s.feed(&[data(2, 8, 0, 0, 1, true)].concat(), &[], &mut out);
    assert_eq!(kinds(&out), vec![], "the marker may still come at 3");
    s.feed(&[marker(3, 8, 0, true)].concat(), &[], &mut out);
    assert_eq!(kinds(&out), vec![(Kind::UnclosedTxn, 0, 3)]);
    assert_eq!(s.earliest_open(), None);

    // the same with the marker where it belongs: nothing
    let mut s = Scanner::starting_at(RULES, 0);
    let mut out = Vec::new();
    s.feed(&[data(0, 7, 0, 0, 2, true)].concat(), &[], &mut out);
    s.reached_stable(2, 4);
    s.feed(
        &[data(2, 8, 0, 0, 1, true), marker(3, 7, 0, true)].concat(),
        &[],
        &mut out,
    );
    assert_eq!(kinds(&out), vec![]);
    // a transaction that began at the LSO is not called closed
    s.reached_stable(2, 4);
    s.feed(&[data(4, 9, 0, 0, 1, false)].concat(), &[], &mut out);
    assert_eq!(kinds(&out), vec![]);
    assert_eq!(s.earliest_open(), Some(2));
}

#[test]
fn the_aborted_index_must_match_the_abort_markers() {
    let log = vec![
        data(0, 7, 0, 0, 2, true),
        marker(2, 7, 0, false),
        data(3, 8, 0, 0, 1, true),
        marker(4, 8, 0, true),
    ];
    // missing entry
    assert_eq!(
        kinds(&scan(&[(log.clone(), vec![])])),
        vec![(Kind::AbortedIndex, 0, 2)]
    );
    // wrong first offset
    let wrong = vec![Aborted {
        producer_id: 7,
        first_offset: 1,
        last_offset: 2,
    }];
    assert_eq!(
        kinds(&scan(&[(log.clone(), wrong)])),
        vec![(Kind::AbortedIndex, 0, 2)]
    );
    // an entry for a COMMIT
    let extra = vec![
        Aborted {
            producer_id: 7,
            first_offset: 0,
            last_offset: 2,
        },
        Aborted {
            producer_id: 8,
            first_offset: 3,
            last_offset: 4,
        },
    ];
    assert_eq!(
        kinds(&scan(&[(log.clone(), extra)])),
        vec![(Kind::AbortedIndex, 3, 4)]
    );
    // entries outside the chunk are not this chunk's to judge
    let outside = vec![
        Aborted {
            producer_id: 7,
            first_offset: 0,
            last_offset: 2,
        },
        Aborted {
            producer_id: 9,
            first_offset: 3,
            last_offset: 40,
        },
    ];
    assert_eq!(kinds(&scan(&[(log, outside)])), vec![]);
}

#[test]
fn an_abort_of_a_transaction_with_no_data_here_needs_no_entry() {
    assert_eq!(
        kinds(&scan(&[(vec![marker(0, 7, 0, false)], vec![])])),
        vec![]
    );
}
