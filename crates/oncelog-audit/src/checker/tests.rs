use std::collections::BTreeMap;
use std::time::Instant;

use super::*;
use crate::history::{FinalRead, LivenessCheck, PartitionRead, Pause, ProducerInit, Recommit};

fn send(topic: &str, partition: i32, key: &str, value: &str, offset: Option<i64>) -> Op {
    Op::Send {
        topic: topic.into(),
        partition,
        key: key.into(),
        value: value.into(),
        offset,
    }
}

fn rd(topic: &str, partition: i32, offset: i64, value: &str) -> Read {
    Read {
        topic: topic.into(),
        partition,
        offset,
        value: value.into(),
    }
}

fn poll(at_ms: u64, reads: &[(&str, i32, i64, &str)]) -> Op {
    Op::Poll {
        at_ms,
        reads: reads.iter().map(|&(t, p, o, v)| rd(t, p, o, v)).collect(),
    }
}

fn txn(
    id: u64,
    process: u32,
    outcome: Outcome,
    start_ms: u64,
    commit_ms: Option<u64>,
    ops: Vec<Op>,
) -> Txn {
    Txn {
        id,
        process,
        transactional: true,
        ops,
        outcome,
        start_ms,
        commit_ms,
        end_ms: start_ms + 10,
    }
}

/// Final read of one partition; high watermark and LSO just past the last read.
fn part(topic: &str, partition: i32, reads: &[(i64, &str)]) -> PartitionRead {
    let end = reads.last().map_or(0, |r| r.0 + 1);
    PartitionRead {
        topic: topic.into(),
        partition,
        high_watermark: end,
        lso: end,
        reads: reads
            .iter()
            .map(|&(o, v)| rd(topic, partition, o, v))
            .collect(),
    }
}

fn history(txns: Vec<Txn>, final_read: Option<Vec<PartitionRead>>) -> History {
    History {
        txns,
        final_read: final_read.map(|partitions| FinalRead { partitions }),
        ..History::default()
    }
}

/// Asserts the report holds anomalies of `kind` and of no other kind.
fn assert_only(report: &Report, kind: AnomalyKind) {
    assert!(
        !report.of(kind).is_empty(),
        "expected {kind}, got:\n{}",
        report.summary()
    );
    let others: Vec<&String> = report
        .anomalies
        .keys()
        .filter(|k| k.as_str() != kind.as_str())
        .collect();
    assert!(
        others.is_empty(),
        "unexpected kinds {others:?}:\n{}",
        report.summary()
    );
    assert!(!report.is_clean());
}

/// A copier run: producer, copier with a commit, an abort and an
/// indeterminate-but-committed retry, a verifier, a multi-partition txn.
fn clean_history() -> History {
    let mut txns = Vec::new();
    // Process 0: non-transactional idempotent input producer.
    for i in 0..7u64 {
        let outcome = if i == 6 {
            Outcome::Indeterminate
        } else {
            Outcome::Committed
        };
        let offset = if i == 6 { None } else { Some(i as i64) };
        let mut t = txn(
            1 + i,
            0,
            outcome,
            10 + i,
            None,
            vec![send(
                "in",
                0,
                &format!("in-{i}"),
                &format!("in-v{i}"),
                offset,
            )],
        );
        t.transactional = false;
        txns.push(t);
    }
    // Process 1: copier.
    txns.push(txn(
        10,
        1,
        Outcome::Committed,
        100,
        Some(105),
        vec![
            poll(
                101,
                &[
                    ("in", 0, 0, "in-v0"),
                    ("in", 0, 1, "in-v1"),
                    ("in", 0, 2, "in-v2"),
                ],
            ),
            send("out", 0, "k0", "out-a0", Some(0)),
            send("out", 0, "k1", "out-a1", Some(1)),
            send("out", 0, "k2", "out-a2", Some(2)),
        ],
    ));
    txns.push(txn(
        11,
        1,
        Outcome::Aborted,
        110,
        None,
        vec![
            poll(111, &[("in", 0, 3, "in-v3"), ("in", 0, 4, "in-v4")]),
            send("out", 0, "k3", "out-b3", Some(4)),
            send("out", 0, "k4", "out-b4", Some(5)),
        ],
    ));
    txns.push(txn(
        12,
        1,
        Outcome::Indeterminate,
        120,
        Some(125),
        vec![
            poll(
                121,
                &[
                    ("in", 0, 3, "in-v3"),
                    ("in", 0, 4, "in-v4"),
                    ("in", 0, 5, "in-v5"),
                ],
            ),
            send("out", 0, "k3", "out-c3", Some(7)),
            send("out", 0, "k4", "out-c4", Some(8)),
            send("out", 0, "k5", "out-c5", Some(9)),
        ],
    ));
    // Process 2: read_committed verifier over the output; skips only the
    // aborted records and markers (offsets 3..=6).
    let mut verifier = txn(
        20,
        2,
        Outcome::Committed,
        200,
        None,
        vec![
            poll(
                201,
                &[
                    ("out", 0, 0, "out-a0"),
                    ("out", 0, 1, "out-a1"),
                    ("out", 0, 2, "out-a2"),
                ],
            ),
            poll(
                202,
                &[
                    ("out", 0, 7, "out-c3"),
                    ("out", 0, 8, "out-c4"),
                    ("out", 0, 9, "out-c5"),
                ],
            ),
        ],
    );
    verifier.transactional = false;
    txns.push(verifier);
    // Process 3: a txn over two partitions, read back by process 2 later.
    txns.push(txn(
        30,
        3,
        Outcome::Committed,
        40,
        Some(50),
        vec![
            send("other", 0, "x-0", "x0", Some(0)),
            send("other", 1, "x-1", "x1", Some(0)),
        ],
    ));
    txns.push(txn(
        21,
        2,
        Outcome::Committed,
        300,
        None,
        vec![
            poll(301, &[("other", 0, 0, "x0"), ("other", 1, 0, "x1")]),
            poll(302, &[("out", 0, 10, "out-d")]),
        ],
    ));
    // Process 4 writes "out-d" at offset 10 after the copier.
    txns.push(txn(
        40,
        4,
        Outcome::Committed,
        250,
        Some(260),
        vec![send("out", 0, "d", "out-d", Some(10))],
    ));

    let mut h = history(
        txns,
        Some(vec![
            part(
                "in",
                0,
                &[
                    (0, "in-v0"),
                    (1, "in-v1"),
                    (2, "in-v2"),
                    (3, "in-v3"),
                    (4, "in-v4"),
                    (5, "in-v5"),
                ],
            ),
            PartitionRead {
                high_watermark: 12,
                lso: 12,
                ..part(
                    "out",
                    0,
                    &[
                        (0, "out-a0"),
                        (1, "out-a1"),
                        (2, "out-a2"),
                        (7, "out-c3"),
                        (8, "out-c4"),
                        (9, "out-c5"),
                        (10, "out-d"),
                    ],
                )
            },
            part("other", 0, &[(0, "x0")]),
            part("other", 1, &[(0, "x1")]),
        ]),
    );
    h.expected_keys = Some((0..6).map(|i| format!("k{i}")).collect());
    h.liveness = vec![LivenessCheck {
        topic: "out".into(),
        partition: 0,
        waited_ms: 300,
        limit_ms: 10_000,
        reached: true,
        stalled_ms: None,
    }];
    h.faults = BTreeMap::from([("kill".to_string(), 2), ("partition".to_string(), 1)]);
    h
}

#[test]
fn clean_history_is_clean() {
    let r = check(&clean_history());
    assert!(r.is_clean(), "{}", r.summary());
    // 7 input writes and the verifier's polls are not transactional.
    assert_eq!(r.plain_writes, 8);
    assert_eq!(r.txns_committed, 4);
    assert_eq!(r.txns_aborted, 1);
    assert_eq!(r.txns_indeterminate, 1);
    assert_eq!(r.records, 6 + 3 + 2 + 1);
    assert_eq!(r.poll_reads, 3 + 2 + 3 + 6 + 3);
    assert_eq!(r.final_reads, Some(6 + 7 + 2));
    assert_eq!(r.anomaly_counts().len(), AnomalyKind::ALL.len());
    assert!(r.anomaly_counts().values().all(|&n| n == 0));
    let s = r.summary();
    assert!(s.starts_with("result: clean\n"), "{s}");
    assert!(s.contains("faults: kill=2, partition=1"), "{s}");
}

#[test]
fn history_json_round_trip() {
    let h = clean_history();
    let json = serde_json::to_string_pretty(&h).unwrap();
    assert!(json.contains("\"op\": \"send\""), "{json}");
    assert!(json.contains("\"outcome\": \"indeterminate\""), "{json}");
    let back: History = serde_json::from_str(&json).unwrap();
    assert_eq!(back, h);
    // Optional fields may be omitted.
    let minimal: History = serde_json::from_str(
        r#"{"txns":[{"id":1,"process":0,"ops":[{"op":"poll","at_ms":3,"reads":[]}],
            "outcome":"aborted","start_ms":1,"end_ms":2}]}"#,
    )
    .unwrap();
    assert!(minimal.txns[0].transactional);
    assert!(minimal.final_read.is_none());
}

#[test]
fn report_json_uses_snake_case_kinds() {
    let h = history(
        vec![txn(
            1,
            0,
            Outcome::Committed,
            0,
            Some(1),
            vec![poll(5, &[("t", 0, 0, "ghost")])],
        )],
        None,
    );
    let r = check(&h);
    let json = serde_json::to_string(&r).unwrap();
    assert!(
        json.contains("\"unknown_value\":[{\"kind\":\"unknown_value\""),
        "{json}"
    );
    let back: Report = serde_json::from_str(&json).unwrap();
    assert_eq!(back, r);
}

#[test]
fn lost_write() {
    let h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Committed,
                0,
                Some(5),
                vec![send("t", 0, "k", "v0", Some(0))],
            ),
            txn(
                2,
                2,
                Outcome::Committed,
                10,
                None,
                vec![poll(20, &[("t", 0, 0, "v0")])],
            ),
        ],
        Some(vec![part("t", 0, &[])]),
    );
    let r = check(&h);
    assert_only(&r, AnomalyKind::LostWrite);
    assert_eq!(r.of(AnomalyKind::LostWrite).len(), 1);
}

#[test]
fn unseen() {
    let h = history(
        vec![txn(
            1,
            1,
            Outcome::Committed,
            0,
            Some(5),
            vec![send("t", 0, "k", "v0", Some(0))],
        )],
        Some(vec![part("t", 0, &[])]),
    );
    assert_only(&check(&h), AnomalyKind::Unseen);
    // Without a final read nothing can be judged.
    let h = History {
        final_read: None,
        ..h
    };
    assert!(check(&h).is_clean());
}

#[test]
fn duplicate_value() {
    let h = history(
        vec![txn(
            1,
            1,
            Outcome::Committed,
            0,
            Some(5),
            vec![send("t", 0, "k", "v0", Some(0))],
        )],
        Some(vec![part("t", 0, &[(0, "v0"), (1, "v0")])]),
    );
    let r = check(&h);
    assert_only(&r, AnomalyKind::Duplicate);
    assert_eq!(r.of(AnomalyKind::Duplicate).len(), 1);
}

#[test]
fn duplicate_key() {
    let mut h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Indeterminate,
                0,
                Some(5),
                vec![send("t", 0, "k", "a1", Some(0))],
            ),
            txn(
                2,
                1,
                Outcome::Committed,
                10,
                Some(15),
                vec![send("t", 0, "k", "a2", Some(2))],
            ),
        ],
        Some(vec![part("t", 0, &[(0, "a1"), (2, "a2")])]),
    );
    h.expected_keys = Some(vec!["k".into()]);
    let r = check(&h);
    assert_only(&r, AnomalyKind::Duplicate);
    assert!(r.of(AnomalyKind::Duplicate)[0].detail.contains("key k"));
    // Unexpected keys are not judged.
    h.expected_keys = Some(vec![]);
    assert!(check(&h).is_clean());
}

#[test]
fn missing_key() {
    let mut h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Committed,
                0,
                Some(5),
                vec![send("t", 0, "k0", "a0", Some(0))],
            ),
            txn(
                2,
                1,
                Outcome::Aborted,
                10,
                None,
                vec![send("t", 0, "k1", "b1", Some(2))],
            ),
        ],
        Some(vec![part("t", 0, &[(0, "a0")])]),
    );
    h.expected_keys = Some(vec!["k0".into(), "k1".into()]);
    let r = check(&h);
    assert_only(&r, AnomalyKind::MissingKey);
    assert_eq!(r.of(AnomalyKind::MissingKey).len(), 1);
    assert!(r.of(AnomalyKind::MissingKey)[0].detail.contains("k1"));
}

#[test]
fn aborted_read() {
    let h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Aborted,
                0,
                None,
                vec![send("t", 0, "k", "v0", Some(0))],
            ),
            txn(
                2,
                2,
                Outcome::Committed,
                10,
                None,
                vec![poll(20, &[("t", 0, 0, "v0")])],
            ),
            txn(
                3,
                2,
                Outcome::Committed,
                30,
                None,
                vec![poll(40, &[("t", 0, 1, "v0")])],
            ),
        ],
        Some(vec![part("t", 0, &[])]),
    );
    let r = check(&h);
    assert_only(&r, AnomalyKind::AbortedRead);
    // One anomaly per value, however many reads.
    assert_eq!(r.of(AnomalyKind::AbortedRead).len(), 1);
    assert!(r.of(AnomalyKind::AbortedRead)[0].detail.contains("2 reads"));

    // Also in the final read.
    let h = history(
        vec![txn(
            1,
            1,
            Outcome::Aborted,
            0,
            Some(3),
            vec![send("t", 0, "k", "v0", Some(0))],
        )],
        Some(vec![part("t", 0, &[(0, "v0")])]),
    );
    assert_only(&check(&h), AnomalyKind::AbortedRead);
}

#[test]
fn torn_txn() {
    let h = history(
        vec![txn(
            1,
            1,
            Outcome::Indeterminate,
            0,
            Some(5),
            vec![
                send("t", 0, "a", "va", Some(0)),
                send("u", 3, "b", "vb", Some(0)),
            ],
        )],
        Some(vec![part("t", 0, &[(0, "va")]), part("u", 3, &[])]),
    );
    let r = check(&h);
    assert_only(&r, AnomalyKind::TornTxn);
    assert!(r.of(AnomalyKind::TornTxn)[0].detail.contains("1 of 2"));
}

#[test]
fn inconsistent_offset() {
    // Two polls disagree.
    let h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Committed,
                0,
                Some(5),
                vec![send("t", 0, "a", "va", None)],
            ),
            txn(
                2,
                1,
                Outcome::Committed,
                6,
                Some(8),
                vec![send("t", 0, "b", "vb", None)],
            ),
            txn(
                3,
                2,
                Outcome::Committed,
                10,
                None,
                vec![poll(20, &[("t", 0, 0, "va")])],
            ),
            txn(
                4,
                3,
                Outcome::Committed,
                10,
                None,
                vec![poll(20, &[("t", 0, 0, "vb")])],
            ),
        ],
        None,
    );
    let r = check(&h);
    assert_only(&r, AnomalyKind::InconsistentOffset);
    assert_eq!(r.of(AnomalyKind::InconsistentOffset).len(), 1);

    // An ack and a read disagree.
    let h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Committed,
                0,
                Some(5),
                vec![send("t", 0, "a", "va", Some(0))],
            ),
            txn(
                2,
                1,
                Outcome::Committed,
                6,
                Some(8),
                vec![send("t", 0, "b", "vb", None)],
            ),
            txn(
                3,
                2,
                Outcome::Committed,
                10,
                None,
                vec![poll(20, &[("t", 0, 0, "vb")])],
            ),
        ],
        None,
    );
    assert_only(&check(&h), AnomalyKind::InconsistentOffset);
}

#[test]
fn nonmonotonic_poll_within_txn() {
    let h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Committed,
                0,
                Some(5),
                vec![
                    send("t", 0, "a", "va", Some(0)),
                    send("t", 0, "b", "vb", Some(1)),
                ],
            ),
            txn(
                2,
                2,
                Outcome::Committed,
                10,
                None,
                vec![
                    poll(20, &[("t", 0, 1, "vb")]),
                    poll(21, &[("t", 0, 0, "va")]),
                ],
            ),
        ],
        None,
    );
    let r = check(&h);
    assert_only(&r, AnomalyKind::NonmonotonicPoll);
    assert!(r.of(AnomalyKind::NonmonotonicPoll)[0]
        .detail
        .contains("in txn 2"));

    // Reading the same offset twice in one poll is not strictly increasing.
    let h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Committed,
                0,
                Some(5),
                vec![send("t", 0, "a", "va", Some(0))],
            ),
            txn(
                2,
                2,
                Outcome::Aborted,
                10,
                None,
                vec![poll(20, &[("t", 0, 0, "va"), ("t", 0, 0, "va")])],
            ),
        ],
        None,
    );
    assert_only(&check(&h), AnomalyKind::NonmonotonicPoll);
}

#[test]
fn nonmonotonic_poll_across_txns() {
    let writer = txn(
        1,
        1,
        Outcome::Committed,
        0,
        Some(5),
        vec![
            send("t", 0, "a", "va", Some(0)),
            send("t", 0, "b", "vb", Some(1)),
        ],
    );
    // Txns listed out of start order: the checker sorts by start_ms.
    let second = txn(
        3,
        2,
        Outcome::Committed,
        30,
        None,
        vec![poll(31, &[("t", 0, 1, "vb")])],
    );
    let first_committed = txn(
        2,
        2,
        Outcome::Committed,
        10,
        None,
        vec![poll(20, &[("t", 0, 0, "va"), ("t", 0, 1, "vb")])],
    );
    let h = history(
        vec![writer.clone(), second.clone(), first_committed.clone()],
        None,
    );
    let r = check(&h);
    assert_only(&r, AnomalyKind::NonmonotonicPoll);
    assert!(r.of(AnomalyKind::NonmonotonicPoll)[0]
        .detail
        .contains("from txn 2 to txn 3"));

    // After a non-committed txn the position resets: a rewind is fine.
    for outcome in [Outcome::Aborted, Outcome::Indeterminate] {
        let first = Txn {
            outcome,
            ..first_committed.clone()
        };
        let h = history(vec![writer.clone(), first, second.clone()], None);
        assert!(check(&h).is_clean(), "{:?}", outcome);
    }
}

#[test]
fn skipped_poll() {
    let writes = txn(
        1,
        1,
        Outcome::Committed,
        0,
        Some(5),
        vec![
            send("t", 0, "a", "va", Some(0)),
            send("t", 0, "b", "vb", Some(1)),
            send("t", 0, "c", "vc", Some(2)),
        ],
    );
    let reader = txn(
        2,
        2,
        Outcome::Committed,
        10,
        None,
        vec![poll(20, &[("t", 0, 0, "va"), ("t", 0, 2, "vc")])],
    );
    let fin = vec![part("t", 0, &[(0, "va"), (1, "vb"), (2, "vc")])];
    let h = history(vec![writes.clone(), reader.clone()], Some(fin.clone()));
    let r = check(&h);
    assert_only(&r, AnomalyKind::SkippedPoll);
    assert!(r.of(AnomalyKind::SkippedPoll)[0]
        .detail
        .contains("skipping visible offset 1"));

    // Across two committed txns of the same process, too.
    let split = vec![
        writes.clone(),
        txn(
            2,
            2,
            Outcome::Committed,
            10,
            None,
            vec![poll(20, &[("t", 0, 0, "va")])],
        ),
        txn(
            3,
            2,
            Outcome::Committed,
            30,
            None,
            vec![poll(40, &[("t", 0, 2, "vc")])],
        ),
    ];
    assert_only(
        &check(&history(split, Some(fin.clone()))),
        AnomalyKind::SkippedPoll,
    );

    // Different processes are not compared.
    let two = vec![
        writes.clone(),
        txn(
            2,
            2,
            Outcome::Committed,
            10,
            None,
            vec![poll(20, &[("t", 0, 0, "va")])],
        ),
        txn(
            3,
            3,
            Outcome::Committed,
            30,
            None,
            vec![poll(40, &[("t", 0, 2, "vc")])],
        ),
    ];
    assert!(check(&history(two, Some(fin))).is_clean());

    // Without a final read, skips are not judged.
    assert!(check(&history(vec![writes, reader], None)).is_clean());
}

#[test]
fn precommitted_read() {
    let h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Committed,
                0,
                Some(100),
                vec![send("t", 0, "a", "va", Some(0))],
            ),
            txn(
                2,
                2,
                Outcome::Committed,
                10,
                None,
                vec![poll(50, &[("t", 0, 0, "va")])],
            ),
        ],
        None,
    );
    assert_only(&check(&h), AnomalyKind::PrecommittedRead);

    // Commit never requested (indeterminate: the client died before commit).
    let h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Indeterminate,
                0,
                None,
                vec![send("t", 0, "a", "va", Some(0))],
            ),
            txn(
                2,
                2,
                Outcome::Committed,
                10,
                None,
                vec![poll(50, &[("t", 0, 0, "va")])],
            ),
        ],
        None,
    );
    let r = check(&h);
    assert_only(&r, AnomalyKind::PrecommittedRead);
    assert!(r.of(AnomalyKind::PrecommittedRead)[0]
        .detail
        .contains("never requested"));

    // A non-transactional write is visible from its start.
    let mut plain = txn(
        1,
        1,
        Outcome::Committed,
        0,
        None,
        vec![send("t", 0, "a", "va", Some(0))],
    );
    plain.transactional = false;
    let h = history(
        vec![
            plain,
            txn(
                2,
                2,
                Outcome::Committed,
                10,
                None,
                vec![poll(50, &[("t", 0, 0, "va")])],
            ),
        ],
        None,
    );
    assert!(check(&h).is_clean());
}

#[test]
fn unknown_value() {
    let h = history(
        vec![txn(
            2,
            2,
            Outcome::Committed,
            10,
            None,
            vec![poll(50, &[("t", 0, 0, "ghost"), ("t", 0, 1, "ghost2")])],
        )],
        Some(vec![part("t", 0, &[(0, "ghost")])]),
    );
    let r = check(&h);
    assert_only(&r, AnomalyKind::UnknownValue);
    assert_eq!(r.of(AnomalyKind::UnknownValue).len(), 2);
}

#[test]
fn lso_stuck() {
    let h = History {
        liveness: vec![
            LivenessCheck {
                topic: "t".into(),
                partition: 0,
                waited_ms: 60_000,
                limit_ms: 60_000,
                reached: false,
                stalled_ms: None,
            },
            LivenessCheck {
                topic: "t".into(),
                partition: 1,
                waited_ms: 70_000,
                limit_ms: 60_000,
                reached: true,
                stalled_ms: None,
            },
            LivenessCheck {
                topic: "t".into(),
                partition: 2,
                waited_ms: 10,
                limit_ms: 60_000,
                reached: true,
                stalled_ms: None,
            },
        ],
        ..History::default()
    };
    let r = check(&h);
    assert_only(&r, AnomalyKind::LsoStuck);
    assert_eq!(r.of(AnomalyKind::LsoStuck).len(), 2);
    let s = r.summary();
    assert!(s.contains("lso_stuck            2 | t-0:"), "{s}");
}

#[test]
fn a_long_read_that_kept_moving_is_not_stuck() {
    let check_of = |stalled_ms, reached| {
        let h = History {
            liveness: vec![LivenessCheck {
                topic: "t".into(),
                partition: 0,
                waited_ms: 90_000,
                limit_ms: 40_000,
                reached,
                stalled_ms: Some(stalled_ms),
            }],
            ..History::default()
        };
        check(&h)
    };
    // 90 s through a backlog, never 40 s without a record: not stuck
    assert!(check_of(1_500, true).is_clean());
    // 41 s without progress, even if it got there in the end: stuck
    let r = check_of(41_000, true);
    assert_eq!(r.of(AnomalyKind::LsoStuck).len(), 1, "{}", r.summary());
    assert!(
        r.summary().contains("at most 41000ms without progress"),
        "{}",
        r.summary()
    );
    // never got there
    assert_eq!(check_of(40_001, false).of(AnomalyKind::LsoStuck).len(), 1);
}

#[test]
fn values_beyond_a_final_read_that_stopped_short_are_not_judged_lost() {
    // Four committed plain writes at offsets 0..3, each polled; the final
    // read stopped after offset 1 (lso -1: it did not reach the end).
    let writes: Vec<Txn> = (0..4)
        .map(|i| {
            let v = format!("v{i}");
            let mut t = txn(
                i + 1,
                0,
                Outcome::Committed,
                1,
                None,
                vec![send("in", 0, &v, &v, Some(i as i64))],
            );
            t.transactional = false;
            t
        })
        .collect();
    let reader = txn(
        9,
        1,
        Outcome::Committed,
        1,
        Some(5),
        vec![poll(
            2,
            &[
                ("in", 0, 0, "v0"),
                ("in", 0, 1, "v1"),
                ("in", 0, 2, "v2"),
                ("in", 0, 3, "v3"),
            ],
        )],
    );
    let short = |reads: &[(i64, &str)]| PartitionRead {
        high_watermark: 4,
        lso: -1,
        ..part("in", 0, reads)
    };
    let mut h = History {
        txns: writes.into_iter().chain([reader]).collect(),
        final_read: Some(FinalRead {
            partitions: vec![short(&[(0, "v0"), (1, "v1")])],
        }),
        ..History::default()
    };
    let r = check(&h);
    assert!(r.of(AnomalyKind::LostWrite).is_empty(), "{}", r.summary());
    // a value missing below where it stopped is still lost
    h.final_read = Some(FinalRead {
        partitions: vec![short(&[(0, "v0"), (2, "v2")])],
    });
    let r = check(&h);
    let lost = r.of(AnomalyKind::LostWrite);
    assert_eq!(lost.len(), 1, "{}", r.summary());
    assert!(lost[0].detail.contains("v1"), "{}", r.summary());
}

#[test]
fn empty_history_is_clean() {
    let r = check(&History::default());
    assert!(r.is_clean());
    assert_eq!(r.final_reads, None);
}

/// 200k values: copier-like txns of 10 sends each over 8 partitions, every
/// value polled once and present in the final read.
#[test]
fn large_history_is_fast() {
    const PARTS: i32 = 8;
    const PER_TXN: usize = 10;
    const TXNS: usize = 20_000;
    let mut txns = Vec::with_capacity(TXNS + 1);
    let mut next = [0i64; PARTS as usize];
    let mut finals: Vec<PartitionRead> = (0..PARTS).map(|p| part("t", p, &[])).collect();
    let mut polls = Vec::new();
    for i in 0..TXNS {
        let mut ops = Vec::with_capacity(PER_TXN);
        for j in 0..PER_TXN {
            let p = ((i * PER_TXN + j) % PARTS as usize) as i32;
            let slot = &mut next[p as usize];
            let value = format!("v{i}-{j}");
            ops.push(send("t", p, &format!("k{i}-{j}"), &value, Some(*slot)));
            finals[p as usize].reads.push(rd("t", p, *slot, &value));
            polls.push(rd("t", p, *slot, &value));
            *slot += 1;
        }
        // Skip one offset per partition touched for the commit marker.
        for n in next.iter_mut() {
            *n += 1;
        }
        txns.push(txn(
            i as u64,
            1 + (i % 4) as u32,
            Outcome::Committed,
            i as u64,
            Some(i as u64),
            ops,
        ));
    }
    // The reader consumes in partition order, one poll per partition.
    let mut reader_ops = Vec::new();
    for p in 0..PARTS {
        let reads: Vec<Read> = polls.iter().filter(|r| r.partition == p).cloned().collect();
        reader_ops.push(Op::Poll {
            at_ms: 1_000_000,
            reads,
        });
    }
    txns.push(txn(
        1_000_000,
        99,
        Outcome::Committed,
        1_000_000,
        None,
        reader_ops,
    ));
    let h = history(txns, Some(finals));
    let started = Instant::now();
    let r = check(&h);
    let took = started.elapsed();
    assert!(r.is_clean(), "{}", r.summary());
    assert_eq!(r.records, (TXNS * PER_TXN) as u64);
    eprintln!("checked {} values in {:?}", TXNS * PER_TXN, took);
    // Generous bound: tests run unoptimized.
    assert!(took.as_secs() < 20, "took {took:?}");
}

#[test]
fn zombie_write_is_reported() {
    // Process 7 was paused at 100 while its txn 2 was open; a successor took
    // its id at 150; it resumed at 200 and its txn 2 still committed (and
    // became visible). Txn 1 committed before the pause; txn 3 is empty.
    let h = History {
        txns: vec![
            txn(
                1,
                7,
                Outcome::Committed,
                10,
                Some(50),
                vec![send("z", 0, "a", "a", Some(0))],
            ),
            txn(
                2,
                7,
                Outcome::Committed,
                90,
                Some(210),
                vec![send("z", 0, "b", "b", Some(1))],
            ),
            txn(3, 7, Outcome::Committed, 220, Some(230), vec![]),
            // aborted long before the pause: not the zombie's business
            txn(
                4,
                7,
                Outcome::Aborted,
                60,
                None,
                vec![send("z", 0, "c", "c", None)],
            ),
        ],
        final_read: Some(FinalRead {
            partitions: vec![part("z", 0, &[(0, "a"), (1, "b")])],
        }),
        pauses: vec![Pause {
            process: 7,
            paused_ms: 100,
            fenced_ms: 150,
            resumed_ms: 200,
            initialised: true,
        }],
        ..History::default()
    };
    let r = check(&h);
    let z = r.of(AnomalyKind::ZombieWrite);
    assert_eq!(z.len(), 2, "{}", r.summary());
    // Paused before its own producer was initialised: its InitProducerId
    // may have come after its successor's, and then its commits are its
    // right (the successor is the one fenced).
    let mut early = h.clone();
    early.pauses[0].initialised = false;
    let r = check(&early);
    assert!(r.of(AnomalyKind::ZombieWrite).is_empty(), "{}", r.summary());
    assert!(z[0].detail.contains("committed although"));
    assert!(z[1].detail.contains("value b"));
    // The same run where the zombie's txn was refused is clean.
    let mut ok = h.clone();
    ok.txns[1].outcome = Outcome::Aborted;
    ok.final_read = Some(FinalRead {
        partitions: vec![part("z", 0, &[(0, "a")])],
    });
    let r = check(&ok);
    assert!(r.is_clean(), "{}", r.summary());
}

#[test]
fn double_consumption_is_reported() {
    // Input record at in-0 offset 0 ("x"). Txn 1 (indeterminate, but its
    // output "y1" is visible) and txn 2 (committed) both consumed it.
    let input = {
        let mut t = txn(
            1,
            0,
            Outcome::Committed,
            1,
            None,
            vec![send("in", 0, "x", "x", Some(0))],
        );
        t.transactional = false;
        t
    };
    let h = History {
        txns: vec![
            input,
            txn(
                2,
                1,
                Outcome::Indeterminate,
                10,
                Some(20),
                vec![
                    poll(15, &[("in", 0, 0, "x")]),
                    send("out", 0, "y1", "y1", None),
                ],
            ),
            txn(
                3,
                2,
                Outcome::Committed,
                30,
                Some(40),
                vec![
                    poll(35, &[("in", 0, 0, "x")]),
                    send("out", 0, "y2", "y2", None),
                ],
            ),
        ],
        final_read: Some(FinalRead {
            partitions: vec![
                part("in", 0, &[(0, "x")]),
                part("out", 0, &[(0, "y1"), (1, "y2")]),
            ],
        }),
        ..History::default()
    };
    let r = check(&h);
    let d = r.of(AnomalyKind::Duplicate);
    assert_eq!(d.len(), 1, "{}", r.summary());
    assert!(d[0].detail.contains("consumed by two transactions"));
    // If the indeterminate transaction's output is not visible, it did not
    // take effect: no anomaly.
    let mut ok = h.clone();
    ok.final_read = Some(FinalRead {
        partitions: vec![part("in", 0, &[(0, "x")]), part("out", 0, &[(1, "y2")])],
    });
    let r = check(&ok);
    assert!(r.of(AnomalyKind::Duplicate).is_empty(), "{}", r.summary());
}

/// The compacted workload: k1 written three times (the last aborted), k2
/// once, then the cleaner removed k1's first value.
fn compacted(final_reads: &[(i64, &str)]) -> History {
    let mut h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Committed,
                0,
                Some(5),
                vec![
                    send("c", 0, "k1", "v1.1", Some(0)),
                    send("c", 0, "k2", "v1.2", Some(1)),
                ],
            ),
            txn(
                2,
                2,
                Outcome::Committed,
                20,
                Some(25),
                vec![send("c", 0, "k1", "v2.1", Some(3))],
            ),
            txn(
                3,
                1,
                Outcome::Aborted,
                40,
                None,
                vec![send("c", 0, "k1", "v1.3", Some(5))],
            ),
        ],
        Some(vec![part("c", 0, final_reads)]),
    );
    h.compacted = true;
    h
}

#[test]
fn compacted_final_read_holds_every_latest_committed_value() {
    let r = check(&compacted(&[(1, "v1.2"), (3, "v2.1")]));
    assert!(r.is_clean(), "{}", r.summary());
    // An older value left beside the latest (not cleaned yet) is fine too.
    let r = check(&compacted(&[(0, "v1.1"), (1, "v1.2"), (3, "v2.1")]));
    assert!(r.is_clean(), "{}", r.summary());
}

#[test]
fn compacted_final_read_with_an_older_value_last_is_a_lost_write() {
    let r = check(&compacted(&[(0, "v1.1"), (1, "v1.2")]));
    assert_only(&r, AnomalyKind::LostWrite);
}

#[test]
fn compacted_final_read_without_a_key_is_a_missing_key() {
    let r = check(&compacted(&[(3, "v2.1")]));
    assert_only(&r, AnomalyKind::MissingKey);
}

#[test]
fn compacted_final_read_with_an_aborted_value_is_an_aborted_read() {
    let r = check(&compacted(&[(1, "v1.2"), (3, "v2.1"), (5, "v1.3")]));
    assert!(
        !r.of(AnomalyKind::AbortedRead).is_empty(),
        "{}",
        r.summary()
    );
}

/// The `recommit` workload: process 1's transactions 1 (committed, values
/// at offsets 0-1), 2 (aborted) and 3 (indeterminate, its value visible),
/// all of transactional id "r-1"; the final read shows 1's and 3's values.
fn recommit_history(recommits: Vec<Recommit>, inits: Vec<ProducerInit>) -> History {
    let mut h = history(
        vec![
            txn(
                1,
                1,
                Outcome::Committed,
                100,
                Some(105),
                vec![
                    send("r", 0, "a", "a", Some(0)),
                    send("r", 0, "b", "b", Some(1)),
                ],
            ),
            txn(
                2,
                1,
                Outcome::Aborted,
                200,
                None,
                vec![send("r", 0, "c", "c", Some(2))],
            ),
            txn(
                3,
                1,
                Outcome::Indeterminate,
                300,
                Some(305),
                vec![send("r", 0, "d", "d", Some(4))],
            ),
        ],
        Some(vec![part("r", 0, &[(0, "a"), (1, "b"), (4, "d")])]),
    );
    h.recommits = recommits;
    h.producer_inits = inits;
    h
}

fn re_end(txn: u64, commit: bool, sent_ms: u64, error_code: Option<i16>) -> Recommit {
    Recommit {
        txn,
        process: 1,
        transactional_id: "r-1".into(),
        commit,
        version: 5,
        producer_id: 7,
        epoch: 3,
        sent_ms,
        answered_ms: sent_ms + 2,
        error_code,
        reconnected: false,
    }
}

fn init_at(started_ms: u64, ready_ms: Option<u64>) -> ProducerInit {
    ProducerInit {
        process: 1,
        transactional_id: "r-1".into(),
        started_ms,
        ready_ms,
    }
}

const FENCED: i16 = 90;

#[test]
fn recommits_with_their_own_outcome_succeed_and_the_other_is_refused() {
    let h = recommit_history(
        vec![
            re_end(1, true, 150, Some(0)),
            re_end(1, false, 151, Some(FENCED)),
            re_end(2, false, 250, Some(0)),
            re_end(2, true, 251, Some(FENCED)),
            // Indeterminate, resolved as committed by the final read.
            re_end(3, true, 350, Some(0)),
            re_end(3, false, 351, Some(FENCED)),
            // Unanswered: not judged.
            re_end(1, true, 152, None),
        ],
        vec![init_at(10, Some(20))],
    );
    let r = check(&h);
    assert!(r.is_clean(), "{}", r.summary());
    assert_eq!(r.recommits_checked, 6);
    assert_eq!(r.recommits_must_succeed, 3);
    assert_eq!(r.recommits_must_refuse, 3);
    assert_eq!(r.recommits_skipped, 1);
}

#[test]
fn a_refused_recommit_of_its_own_outcome_is_reported() {
    let h = recommit_history(vec![re_end(1, true, 150, Some(FENCED))], vec![]);
    assert_only(&check(&h), AnomalyKind::RecommitRefused);
    // Committed by the final read, so refusing its commit is wrong too.
    let h = recommit_history(vec![re_end(3, true, 350, Some(FENCED))], vec![]);
    assert_only(&check(&h), AnomalyKind::RecommitRefused);
}

#[test]
fn an_accepted_recommit_of_the_other_outcome_is_reported() {
    // The door a zombie must not find: committing an aborted transaction.
    let h = recommit_history(vec![re_end(2, true, 250, Some(0))], vec![]);
    assert_only(&check(&h), AnomalyKind::RecommitWronglyAccepted);
    let h = recommit_history(vec![re_end(1, false, 150, Some(0))], vec![]);
    assert_only(&check(&h), AnomalyKind::RecommitWronglyAccepted);
}

#[test]
fn a_recommit_after_a_newer_producer_must_be_refused() {
    // A second instance finished InitProducerId (at 140) after txn 1 began
    // and before the re-commit was sent: the old identity is fenced.
    let h = recommit_history(
        vec![re_end(1, true, 150, Some(0))],
        vec![init_at(130, Some(140))],
    );
    assert_only(&check(&h), AnomalyKind::RecommitWronglyAccepted);
    let h = recommit_history(
        vec![re_end(1, true, 150, Some(FENCED))],
        vec![init_at(130, Some(140))],
    );
    let r = check(&h);
    assert!(r.is_clean(), "{}", r.summary());
    assert_eq!(r.recommits_must_refuse, 1);
}

#[test]
fn a_recommit_racing_an_init_may_go_either_way() {
    // The InitProducerId was under way while the re-commit was: either
    // answer is right, and neither is counted as a must.
    for code in [0, FENCED] {
        let h = recommit_history(
            vec![re_end(1, true, 150, Some(code))],
            vec![init_at(149, Some(155))],
        );
        let r = check(&h);
        assert!(r.is_clean(), "{code}: {}", r.summary());
        assert_eq!((r.recommits_must_succeed, r.recommits_must_refuse), (0, 0));
        assert_eq!(r.recommits_checked, 1);
    }
}
