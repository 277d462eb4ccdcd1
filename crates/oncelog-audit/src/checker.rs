//! The checker: one pass over a [`History`], building hash indexes, then
//! per-anomaly scans. O(n log n) in the number of sends and reads.
//!
//! Rules (see [`AnomalyKind`] for each kind):
//! * a value's writer is the first `Send` that wrote it;
//! * "reads" are poll reads and final reads; "observations" of a position
//!   (topic, partition, offset) are reads plus acked send offsets;
//! * checks that need the final read (`lost_write`, `unseen`, `duplicate`,
//!   `missing_key`, `torn_txn`, `skipped_poll`) are skipped without one;
//! * per-process poll order: a process's txns are taken in order of
//!   (`start_ms`, `id`), reads in op order. The per-partition position is
//!   carried across txns and reset after any txn whose outcome is not
//!   `Committed` (the consumer rewinds after an abort).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};

use crate::history::{FinalRead, History, Op, Outcome, Read, Txn};

/// Kind of anomaly. Serialized in snake_case (e.g. `lost_write`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnomalyKind {
    /// A value of a `Committed` txn read by a poll but absent from the final read.
    LostWrite,
    /// A value of a `Committed` txn seen by no poll and absent from the final read.
    Unseen,
    /// A value at two positions of the final read, or an expected key visible
    /// more than once (several attempts).
    Duplicate,
    /// An expected key with no visible value in the final read.
    MissingKey,
    /// A read (poll or final) of a value of an `Aborted` txn (G1a). One per value.
    AbortedRead,
    /// A `Committed` or `Indeterminate` txn with some but not all of its
    /// values in the final read.
    TornTxn,
    /// One position observed (read or acked) with two different values.
    InconsistentOffset,
    /// Successive reads of a partition by one process whose offsets do not
    /// strictly increase (see the module docs for the per-process order).
    NonmonotonicPoll,
    /// Successive reads of a partition by one process at offsets a < b while
    /// the final read holds a non-aborted value strictly between a and b.
    SkippedPoll,
    /// A poll at `at_ms` read a value of another process's non-aborted txn
    /// whose commit had not been requested by `at_ms`.
    PrecommittedRead,
    /// A read of a value no txn wrote. One per value.
    UnknownValue,
    /// A liveness check that did not reach the high watermark in time.
    LsoStuck,
    /// A paused producer whose id was taken over committed, or made visible,
    /// a transaction whose commit it had not requested before the pause.
    ZombieWrite,
    /// A re-sent EndTxn with its transaction's own outcome, from the producer
    /// id and epoch the transaction was ended under, was refused although no
    /// InitProducerId of its transactional id could have fenced that
    /// identity first (idempotent re-commit).
    RecommitRefused,
    /// A re-sent EndTxn that had to be refused was answered success: it
    /// asked for the other outcome than its transaction's, or a newer
    /// producer of its transactional id had finished InitProducerId before
    /// it was sent.
    RecommitWronglyAccepted,
}

impl AnomalyKind {
    /// Every kind, in report order.
    pub const ALL: [AnomalyKind; 15] = [
        AnomalyKind::LostWrite,
        AnomalyKind::Unseen,
        AnomalyKind::Duplicate,
        AnomalyKind::MissingKey,
        AnomalyKind::AbortedRead,
        AnomalyKind::TornTxn,
        AnomalyKind::InconsistentOffset,
        AnomalyKind::NonmonotonicPoll,
        AnomalyKind::SkippedPoll,
        AnomalyKind::PrecommittedRead,
        AnomalyKind::UnknownValue,
        AnomalyKind::LsoStuck,
        AnomalyKind::ZombieWrite,
        AnomalyKind::RecommitRefused,
        AnomalyKind::RecommitWronglyAccepted,
    ];

    /// The snake_case name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            AnomalyKind::LostWrite => "lost_write",
            AnomalyKind::Unseen => "unseen",
            AnomalyKind::Duplicate => "duplicate",
            AnomalyKind::MissingKey => "missing_key",
            AnomalyKind::AbortedRead => "aborted_read",
            AnomalyKind::TornTxn => "torn_txn",
            AnomalyKind::InconsistentOffset => "inconsistent_offset",
            AnomalyKind::NonmonotonicPoll => "nonmonotonic_poll",
            AnomalyKind::SkippedPoll => "skipped_poll",
            AnomalyKind::PrecommittedRead => "precommitted_read",
            AnomalyKind::UnknownValue => "unknown_value",
            AnomalyKind::LsoStuck => "lso_stuck",
            AnomalyKind::ZombieWrite => "zombie_write",
            AnomalyKind::RecommitRefused => "recommit_refused",
            AnomalyKind::RecommitWronglyAccepted => "recommit_wrongly_accepted",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One anomaly, with a human-readable detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    pub detail: String,
}

/// Result of [`check`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub txns_committed: u64,
    pub txns_aborted: u64,
    pub txns_indeterminate: u64,
    /// Non-transactional (idempotent) writes, each recorded as a txn.
    #[serde(default)]
    pub plain_writes: u64,
    /// Values written by committed txns.
    pub records: u64,
    /// Records returned by polls.
    pub poll_reads: u64,
    /// Records in the final read; `None` if the history has none.
    pub final_reads: Option<u64>,
    /// Faults injected, copied from the history.
    pub faults: BTreeMap<String, u64>,
    /// Re-sent EndTxn requests judged (answered, of a transaction whose
    /// outcome is known or resolved from the final read).
    #[serde(default)]
    pub recommits_checked: u64,
    /// Of those, the ones that had to succeed, and the ones that had to be
    /// refused (the rest could be either: a fence may have come first).
    #[serde(default)]
    pub recommits_must_succeed: u64,
    #[serde(default)]
    pub recommits_must_refuse: u64,
    /// Of those checked, the ones answered after the worker lost its
    /// connection since the transaction's end (a broker restart, typically).
    #[serde(default)]
    pub recommits_after_reconnect: u64,
    /// Re-sent EndTxn requests not judged: no answer, or a transaction of
    /// unknown outcome without a final read.
    #[serde(default)]
    pub recommits_skipped: u64,
    /// Anomalies by kind name; only kinds that occurred.
    pub anomalies: BTreeMap<String, Vec<Anomaly>>,
}

impl Report {
    /// Count per kind name, every kind included (zeros too).
    pub fn anomaly_counts(&self) -> BTreeMap<String, u64> {
        AnomalyKind::ALL
            .iter()
            .map(|k| (k.as_str().to_string(), self.of(*k).len() as u64))
            .collect()
    }

    /// Anomalies of one kind (empty if none).
    pub fn of(&self, kind: AnomalyKind) -> &[Anomaly] {
        self.anomalies
            .get(kind.as_str())
            .map_or(&[][..], Vec::as_slice)
    }

    /// Total number of anomalies.
    pub fn total_anomalies(&self) -> u64 {
        self.anomalies.values().map(|v| v.len() as u64).sum()
    }

    /// True if no anomaly was found.
    pub fn is_clean(&self) -> bool {
        self.anomalies.values().all(Vec::is_empty)
    }

    /// Multi-line summary: totals, then one line per kind with its count and
    /// up to 3 example details.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let total = self.total_anomalies();
        if total == 0 {
            s.push_str("result: clean\n");
        } else {
            s.push_str(&format!("result: {total} anomalies\n"));
        }
        s.push_str(&format!(
            "txns: {} committed, {} aborted, {} indeterminate; {} plain writes; {} committed records\n",
            self.txns_committed, self.txns_aborted, self.txns_indeterminate, self.plain_writes, self.records
        ));
        match self.final_reads {
            Some(n) => s.push_str(&format!(
                "reads: {} by polls, {} in the final read\n",
                self.poll_reads, n
            )),
            None => s.push_str(&format!(
                "reads: {} by polls, no final read (final-read checks skipped)\n",
                self.poll_reads
            )),
        }
        if self.recommits_checked + self.recommits_skipped > 0 {
            s.push_str(&format!(
                "re-commits: {} checked ({} had to succeed, {} had to be refused; {} after a reconnect), {} skipped\n",
                self.recommits_checked,
                self.recommits_must_succeed,
                self.recommits_must_refuse,
                self.recommits_after_reconnect,
                self.recommits_skipped
            ));
        }
        if !self.faults.is_empty() {
            let f: Vec<String> = self
                .faults
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            s.push_str(&format!("faults: {}\n", f.join(", ")));
        }
        for kind in AnomalyKind::ALL {
            let list = self.of(kind);
            s.push_str(&format!("{:<20} {}", kind.as_str(), list.len()));
            for a in list.iter().take(3) {
                s.push_str(" | ");
                s.push_str(&a.detail);
            }
            s.push('\n');
        }
        s
    }
}

/// Multiply-rotate hasher (the FxHash scheme) with a final avalanche: cheaper than SipHash on
/// short strings. Histories are trusted input, so no HashDoS resistance.
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        // Final avalanche (MurmurHash3 fmix64): the table uses low bits for the
        // bucket, which the multiply alone leaves poorly mixed.
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
}

type Map<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// The writer of a value.
struct Writer<'a> {
    txn: &'a Txn,
    key: &'a str,
}

/// Where a read happened.
#[derive(Clone, Copy)]
enum Src<'a> {
    Poll { txn: &'a Txn, at_ms: u64 },
    Final,
}

impl fmt::Display for Src<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Src::Poll { txn, at_ms } => {
                write!(
                    f,
                    "poll of process {} txn {} at {}ms",
                    txn.process, txn.id, at_ms
                )
            }
            Src::Final => f.write_str("final read"),
        }
    }
}

type Tp<'a> = (&'a str, i32);

fn pos(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}-{partition}@{offset}")
}

fn outcome_str(o: Outcome) -> &'static str {
    match o {
        Outcome::Committed => "committed",
        Outcome::Aborted => "aborted",
        Outcome::Indeterminate => "indeterminate",
    }
}

fn txn_desc(t: &Txn) -> String {
    format!(
        "txn {} (process {}, {})",
        t.id,
        t.process,
        outcome_str(t.outcome)
    )
}

#[derive(Default)]
struct Out {
    by_kind: BTreeMap<AnomalyKind, Vec<Anomaly>>,
}

impl Out {
    fn push(&mut self, kind: AnomalyKind, detail: String) {
        self.by_kind
            .entry(kind)
            .or_default()
            .push(Anomaly { kind, detail });
    }
}

/// Per-value aggregation of repeated reads (first place seen, count).
#[derive(Default)]
struct PerValue<'a> {
    index: Map<&'a str, usize>,
    items: Vec<(&'a str, String, u64)>,
}

impl<'a> PerValue<'a> {
    fn add(&mut self, value: &'a str, first: impl FnOnce() -> String) {
        match self.index.get(value).and_then(|&i| self.items.get_mut(i)) {
            Some(item) => item.2 += 1,
            None => {
                self.index.insert(value, self.items.len());
                self.items.push((value, first(), 1));
            }
        }
    }
}

/// Check a history for exactly-once anomalies.
pub fn check(h: &History) -> Report {
    let mut report = Report {
        faults: h.faults.clone(),
        ..Report::default()
    };
    let mut out = Out::default();

    // Writers and counts.
    let mut writers: Map<&str, Writer> = Map::default();
    for t in &h.txns {
        match (t.transactional, t.outcome) {
            (false, _) => report.plain_writes += 1,
            (true, Outcome::Committed) => report.txns_committed += 1,
            (true, Outcome::Aborted) => report.txns_aborted += 1,
            (true, Outcome::Indeterminate) => report.txns_indeterminate += 1,
        }
        for op in &t.ops {
            match op {
                Op::Send { key, value, .. } => {
                    if t.outcome == Outcome::Committed {
                        report.records += 1;
                    }
                    writers
                        .entry(value.as_str())
                        .or_insert(Writer { txn: t, key });
                }
                Op::Poll { reads, .. } => report.poll_reads += reads.len() as u64,
            }
        }
    }

    // All reads, in history order: polls first, then the final read.
    let mut reads: Vec<(Src, &Read)> = Vec::new();
    for t in &h.txns {
        for (at_ms, r) in t.reads() {
            reads.push((Src::Poll { txn: t, at_ms }, r));
        }
    }
    if let Some(fr) = &h.final_read {
        let mut n = 0u64;
        for p in &fr.partitions {
            n += p.reads.len() as u64;
            reads.extend(p.reads.iter().map(|r| (Src::Final, r)));
        }
        report.final_reads = Some(n);
    }

    check_reads(&reads, &writers, &mut out);
    check_positions(h, &reads, &writers, &mut out);
    if let Some(fr) = &h.final_read {
        let final_index = FinalIndex::build(fr, &writers);
        if h.compacted {
            check_duplicates(fr, &final_index, &mut out);
            check_compacted(h, fr, &writers, &mut out);
        } else {
            check_final(h, fr, &final_index, &reads, &writers, &mut out);
        }
        check_poll_order(h, Some(&final_index), &mut out);
    } else {
        check_poll_order(h, None, &mut out);
    }
    for l in &h.liveness {
        if !l.reached || l.stalled_ms.unwrap_or(l.waited_ms) > l.limit_ms {
            out.push(
                AnomalyKind::LsoStuck,
                format!(
                    "{}-{}: read_committed {} the high watermark after {}ms{} (limit {}ms)",
                    l.topic,
                    l.partition,
                    if l.reached {
                        "reached"
                    } else {
                        "did not reach"
                    },
                    l.waited_ms,
                    l.stalled_ms.map_or(String::new(), |s| format!(
                        ", at most {s}ms without progress"
                    )),
                    l.limit_ms
                ),
            );
        }
    }
    check_zombies(h, &reads, &mut out);
    if let Some(fr) = &h.final_read {
        check_double_consume(h, fr, &mut out);
    }
    check_recommits(h, &mut report, &mut out);

    report.anomalies = out
        .by_kind
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.as_str().to_string(), v))
        .collect();
    report
}

/// aborted_read, unknown_value, precommitted_read.
fn check_reads<'a>(reads: &[(Src<'a>, &'a Read)], writers: &Map<&str, Writer<'a>>, out: &mut Out) {
    let mut aborted = PerValue::default();
    let mut unknown = PerValue::default();
    for &(src, r) in reads {
        let at = || format!("{} in {}", pos(&r.topic, r.partition, r.offset), src);
        let Some(w) = writers.get(r.value.as_str()) else {
            unknown.add(&r.value, at);
            continue;
        };
        if w.txn.outcome == Outcome::Aborted {
            aborted.add(&r.value, || {
                format!("{} of {}, first at {}", r.value, txn_desc(w.txn), at())
            });
            continue;
        }
        if let Src::Poll { txn, at_ms } = src {
            let early = w.txn.visible_from_ms().is_none_or(|v| v > at_ms);
            if txn.process != w.txn.process && early {
                let commit = match w.txn.commit_ms {
                    Some(c) => format!("commit requested at {c}ms"),
                    None => "commit never requested".to_string(),
                };
                out.push(
                    AnomalyKind::PrecommittedRead,
                    format!(
                        "{} of {} ({commit}) read at {}",
                        r.value,
                        txn_desc(w.txn),
                        at()
                    ),
                );
            }
        }
    }
    for (_, first, n) in aborted.items {
        out.push(AnomalyKind::AbortedRead, format!("{first} ({n} reads)"));
    }
    for (value, first, n) in unknown.items {
        out.push(
            AnomalyKind::UnknownValue,
            format!("{value} read at {first} ({n} reads)"),
        );
    }
}

/// How a position was observed.
#[derive(Clone, Copy)]
enum Obs<'a> {
    Ack(&'a Txn),
    Read(Src<'a>),
}

impl fmt::Display for Obs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Obs::Ack(t) => write!(f, "acked to {}", txn_desc(t)),
            Obs::Read(src) => write!(f, "read by {src}"),
        }
    }
}

type Position<'a> = (&'a str, i32, i64);

/// inconsistent_offset: one position observed with two values (reads and acks).
fn check_positions<'a>(
    h: &'a History,
    reads: &[(Src<'a>, &'a Read)],
    writers: &Map<&str, Writer<'a>>,
    out: &mut Out,
) {
    // Position -> first value observed there; conflicting positions -> every
    // distinct value with its first observation.
    let mut first: oncelog_verify::ledger::Ledger<Position<'a>, &'a str, Obs<'a>> =
        Default::default();
    let mut conflicts: BTreeMap<Position<'a>, Vec<(&'a str, Obs<'a>)>> = BTreeMap::default();
    let mut note = |p: Position<'a>, value: &'a str, obs: Obs<'a>| {
        if let Some(&(v0, o0)) = first.see(p, value, obs) {
            let vals = conflicts.entry(p).or_insert_with(|| vec![(v0, o0)]);
            if !vals.iter().any(|(v, _)| *v == value) {
                vals.push((value, obs));
            }
        }
    };
    for t in &h.txns {
        for op in &t.ops {
            if let Op::Send {
                topic,
                partition,
                value,
                offset: Some(o),
                ..
            } = op
            {
                if *o >= 0 {
                    note((topic, *partition, *o), value, Obs::Ack(t));
                }
            }
        }
    }
    for &(src, r) in reads {
        note((&r.topic, r.partition, r.offset), &r.value, Obs::Read(src));
    }
    for ((topic, partition, offset), vals) in conflicts {
        let list: Vec<String> = vals
            .iter()
            .map(|(v, obs)| {
                let w = writers
                    .get(v)
                    .map_or("unknown writer".to_string(), |w| txn_desc(w.txn));
                format!("{v} [{w}; first {obs}]")
            })
            .collect();
        out.push(
            AnomalyKind::InconsistentOffset,
            format!(
                "{} holds {} values: {}",
                pos(topic, partition, offset),
                vals.len(),
                list.join(", ")
            ),
        );
    }
}

/// Index of the final read.
struct FinalIndex<'a> {
    /// Value -> number of positions where it is visible.
    count: Map<&'a str, u32>,
    /// Partition -> sorted offsets of visible values whose writer is known and
    /// not aborted.
    visible: Map<Tp<'a>, Vec<i64>>,
}

impl<'a> FinalIndex<'a> {
    fn build(fr: &'a FinalRead, writers: &Map<&str, Writer<'a>>) -> Self {
        let mut count: Map<&str, u32> = Map::default();
        let mut visible: Map<Tp, Vec<i64>> = Map::default();
        for p in &fr.partitions {
            let offsets = visible.entry((&p.topic, p.partition)).or_default();
            for r in &p.reads {
                let n = count.entry(&r.value).or_default();
                *n = n.saturating_add(1);
                let live = writers
                    .get(r.value.as_str())
                    .is_some_and(|w| w.txn.outcome != Outcome::Aborted);
                if live {
                    offsets.push(r.offset);
                }
            }
        }
        for v in visible.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        FinalIndex { count, visible }
    }

    fn contains(&self, value: &str) -> bool {
        self.count.contains_key(value)
    }

    /// Smallest visible non-aborted offset strictly between `a` and `b`.
    fn visible_between(&self, tp: Tp, a: i64, b: i64) -> Option<i64> {
        let offs = self.visible.get(&tp)?;
        let i = offs.partition_point(|&o| o <= a);
        offs.get(i).copied().filter(|&o| o < b)
    }
}

/// duplicate: a value at two positions of the final read.
fn check_duplicates(fr: &FinalRead, fi: &FinalIndex<'_>, out: &mut Out) {
    let final_reads = fr.partitions.iter().flat_map(|p| p.reads.iter());
    // Duplicate values, in order of first appearance.
    let mut dups: Vec<&str> = Vec::new();
    let mut dup_positions: Map<&str, Vec<String>> = Map::default();
    for r in final_reads {
        if fi.count.get(r.value.as_str()).is_some_and(|&n| n > 1) {
            let ps = dup_positions.entry(&r.value).or_insert_with(|| {
                dups.push(&r.value);
                Vec::new()
            });
            ps.push(pos(&r.topic, r.partition, r.offset));
        }
    }
    for value in dups {
        let ps = dup_positions.get(value).map_or(&[][..], Vec::as_slice);
        out.push(
            AnomalyKind::Duplicate,
            format!(
                "value {value} visible {} times: {}",
                ps.len(),
                ps.join(", ")
            ),
        );
    }
}

/// The compacted workload's final read (lost_write, missing_key): for every
/// partition and key, the value with the highest acknowledged offset among
/// committed transactions must be the key's last visible value there. A
/// later visible value of a transaction that was not aborted (its outcome
/// unknown, or its ack lost) also passes. Older values may have been
/// removed by the cleaner; aborted values are aborted_read wherever they
/// show (checked for every read).
fn check_compacted<'a>(
    h: &'a History,
    fr: &'a FinalRead,
    writers: &Map<&str, Writer<'a>>,
    out: &mut Out,
) {
    type Slot<'a> = (&'a str, i32, &'a str);
    let mut latest: BTreeMap<Slot<'a>, (i64, &'a str, &'a Txn)> = BTreeMap::new();
    for t in h.txns.iter().filter(|t| t.outcome == Outcome::Committed) {
        for op in &t.ops {
            if let Op::Send {
                topic,
                partition,
                key,
                value,
                offset: Some(o),
            } = op
            {
                if *o < 0 {
                    continue;
                }
                let e = latest
                    .entry((topic.as_str(), *partition, key.as_str()))
                    .or_insert((*o, value.as_str(), t));
                if *o > e.0 {
                    *e = (*o, value.as_str(), t);
                }
            }
        }
    }
    let mut last: Map<Slot<'a>, (i64, &'a str)> = Map::default();
    for p in &fr.partitions {
        for r in &p.reads {
            let Some(w) = writers.get(r.value.as_str()) else {
                continue;
            };
            let e = last
                .entry((r.topic.as_str(), r.partition, w.key))
                .or_insert((r.offset, r.value.as_str()));
            if r.offset > e.0 {
                *e = (r.offset, r.value.as_str());
            }
        }
    }
    for ((topic, partition, key), (offset, value, txn)) in latest {
        let at = pos(topic, partition, offset);
        match last.get(&(topic, partition, key)) {
            Some((_, v)) if *v == value => {}
            Some((o, v))
                if *o > offset
                    && writers
                        .get(v)
                        .is_some_and(|w| w.txn.outcome != Outcome::Aborted) => {}
            Some((o, v)) => out.push(
                AnomalyKind::LostWrite,
                format!(
                    "key {key}: the latest committed value {value} ({}, at {at}) is not the last visible; {v} at offset {o} is",
                    txn_desc(txn)
                ),
            ),
            None => out.push(
                AnomalyKind::MissingKey,
                format!(
                    "key {key}: no value visible at {topic}-{partition}; the latest committed is {value} ({}, at {at})",
                    txn_desc(txn)
                ),
            ),
        }
    }
}

/// duplicate, missing_key, lost_write, unseen, torn_txn.
fn check_final<'a>(
    h: &'a History,
    fr: &'a FinalRead,
    fi: &FinalIndex<'a>,
    reads: &[(Src<'a>, &'a Read)],
    writers: &Map<&str, Writer<'a>>,
    out: &mut Out,
) {
    let final_reads = fr.partitions.iter().flat_map(|p| p.reads.iter());
    check_duplicates(fr, fi, out);

    // Expected keys: each must have exactly one visible value.
    if let Some(keys) = &h.expected_keys {
        let mut key_values: Map<&str, Vec<&str>> =
            keys.iter().map(|k| (k.as_str(), Vec::new())).collect();
        for r in final_reads {
            let value = r.value.as_str();
            let Some(w) = writers.get(value) else {
                continue;
            };
            if let Some(vals) = key_values.get_mut(w.key) {
                if !vals.contains(&value) {
                    vals.push(value);
                }
            }
        }
        for key in keys {
            // Removing makes repeated expected keys count once.
            match key_values.remove(key.as_str()).as_deref() {
                None | Some([_]) => {}
                Some([]) => out.push(
                    AnomalyKind::MissingKey,
                    format!("key {key} not visible in the final read"),
                ),
                Some(vals) => out.push(
                    AnomalyKind::Duplicate,
                    format!(
                        "key {key} visible {} times: values {}",
                        vals.len(),
                        vals.join(", ")
                    ),
                ),
            }
        }
    }

    // Lost or unseen committed values.
    let mut first_poll: Map<&str, (Src, &Read)> = Map::default();
    for &(src, r) in reads {
        if matches!(src, Src::Poll { .. }) {
            first_poll.entry(&r.value).or_insert((src, r));
        }
    }
    // A partition whose final read stopped short (reported as lso_stuck):
    // the last offset it read. What lies beyond it is not judged here.
    let short: Map<(&str, i32), i64> = fr
        .partitions
        .iter()
        .filter(|p| p.lso < 0)
        .map(|p| {
            let last = p.reads.iter().map(|r| r.offset).max().unwrap_or(-1);
            ((p.topic.as_str(), p.partition), last)
        })
        .collect();
    let beyond = |topic: &str, partition: i32, offset: Option<i64>| {
        short
            .get(&(topic, partition))
            .is_some_and(|last| offset.is_none_or(|o| o > *last))
    };
    for t in h.txns.iter().filter(|t| t.outcome == Outcome::Committed) {
        for op in &t.ops {
            let Op::Send {
                topic,
                partition,
                value,
                offset,
                ..
            } = op
            else {
                continue;
            };
            let value = value.as_str();
            if fi.contains(value) {
                continue;
            }
            let seen_at = first_poll.get(value).map(|(_, r)| r.offset);
            if beyond(topic, *partition, seen_at.or(offset.filter(|o| *o >= 0))) {
                continue;
            }
            match first_poll.get(value) {
                Some((src, r)) => out.push(
                    AnomalyKind::LostWrite,
                    format!(
                        "{value} of {} read at {} by {src}, absent from the final read",
                        txn_desc(t),
                        pos(&r.topic, r.partition, r.offset)
                    ),
                ),
                None => out.push(
                    AnomalyKind::Unseen,
                    format!("{value} of {} never read", txn_desc(t)),
                ),
            }
        }
    }

    // Torn txns.
    for t in &h.txns {
        if t.outcome == Outcome::Aborted {
            continue;
        }
        let sent: Vec<&str> = t.sent_values().collect();
        let s = oncelog_verify::torn::showing(&sent, |v| fi.contains(v));
        if s.is_torn() {
            let missing: Vec<&str> = s.missing.iter().take(3).map(|v| **v).collect();
            out.push(
                AnomalyKind::TornTxn,
                format!(
                    "{}: {} of {} values visible; missing e.g. {}",
                    txn_desc(t),
                    s.present,
                    s.total,
                    missing.join(", ")
                ),
            );
        }
    }
}

/// nonmonotonic_poll and (with a final read) skipped_poll.
fn check_poll_order(h: &History, fi: Option<&FinalIndex>, out: &mut Out) {
    let mut by_process: BTreeMap<u32, Vec<&Txn>> = BTreeMap::default();
    for t in &h.txns {
        by_process.entry(t.process).or_default().push(t);
    }
    for (process, mut txns) in by_process {
        txns.sort_by_key(|t| (t.start_ms, t.id));
        // Partition -> (last offset read, txn id).
        let mut last: Map<Tp, (i64, u64)> = Map::default();
        for t in txns {
            for (at_ms, r) in t.reads() {
                let tp = (r.topic.as_str(), r.partition);
                if let Some(&(prev, prev_txn)) = last.get(&tp) {
                    let describe = || {
                        let scope = if prev_txn == t.id {
                            format!("in txn {}", t.id)
                        } else {
                            format!("from txn {prev_txn} to txn {}", t.id)
                        };
                        format!(
                            "process {process} read {} at {at_ms}ms after offset {prev} ({scope})",
                            pos(&r.topic, r.partition, r.offset)
                        )
                    };
                    if r.offset <= prev {
                        out.push(AnomalyKind::NonmonotonicPoll, describe());
                    } else if let Some(skipped) =
                        fi.and_then(|fi| fi.visible_between(tp, prev, r.offset))
                    {
                        out.push(
                            AnomalyKind::SkippedPoll,
                            format!("{}, skipping visible offset {skipped}", describe()),
                        );
                    }
                }
                last.insert(tp, (r.offset, t.id));
            }
            if t.outcome != Outcome::Committed {
                last.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests;

/// Zombie episodes: a transaction of a paused process that started before
/// it resumed and whose commit was not requested before the pause must not
/// commit, and none of its values may be read.
fn check_zombies(h: &History, reads: &[(Src, &Read)], out: &mut Out) {
    if h.pauses.is_empty() {
        return;
    }
    let mut doomed: Map<&str, u64> = Map::default();
    // A process paused before its own InitProducerId was answered may win
    // the id after the resume (its request reaching the coordinator after
    // its successor's): which of the two is fenced is then the broker's
    // order, not the pause's. The other checks (lost, duplicated and
    // doubly consumed records) still hold both to exactly-once.
    for p in h.pauses.iter().filter(|p| p.initialised) {
        // A paused producer that, once resumed, finished an InitProducerId of
        // its own is a new producer from then on (the `recommit` workload's
        // second instance): its transactions after that are not a zombie's.
        let reborn_ms = h
            .producer_inits
            .iter()
            .filter(|i| i.process == p.process && i.started_ms > p.paused_ms)
            .filter_map(|i| i.ready_ms)
            .min();
        for t in h.txns.iter().filter(|t| {
            t.process == p.process && t.transactional && reborn_ms.is_none_or(|r| t.start_ms < r)
        }) {
            // `paused_ms` is read after the stop took effect: a commit logged in
            // that same millisecond was requested before it.
            let before_pause = t.commit_ms.is_some_and(|c| c <= p.paused_ms);
            // every transaction of the paused producer from the pause on:
            // its id was taken over, so none of them may take effect
            if t.end_ms < p.paused_ms || before_pause {
                continue;
            }
            // An empty transaction has nothing to commit (clients finish it
            // without asking the coordinator).
            if t.outcome == Outcome::Committed && t.sent_values().next().is_some() {
                out.push(
                    AnomalyKind::ZombieWrite,
                    format!(
                        "txn {} of process {} committed although its id was taken over at {} while it was paused ({}..{})",
                        t.id, t.process, p.fenced_ms, p.paused_ms, p.resumed_ms
                    ),
                );
            }
            // reads of an aborted transaction's values are aborted reads
            if t.outcome != Outcome::Aborted {
                for v in t.sent_values() {
                    doomed.insert(v, t.id);
                }
            }
        }
    }
    let mut reported: Map<&str, ()> = Map::default();
    for (_, r) in reads {
        if let Some(id) = doomed.get(r.value.as_str()) {
            if reported.insert(r.value.as_str(), ()).is_none() {
                out.push(
                    AnomalyKind::ZombieWrite,
                    format!(
                        "value {} of zombie txn {id} read at {}-{} offset {}",
                        r.value, r.topic, r.partition, r.offset
                    ),
                );
            }
        }
    }
}

/// Consumed-offset commits are part of each transaction, so a record polled
/// by one transaction that took effect must not be polled by another that
/// also took effect. A transaction took effect if it committed, or if it is
/// indeterminate and some of its writes are visible in the final read (on a
/// correct broker only a committed transaction's writes become visible).
fn check_double_consume(h: &History, fr: &FinalRead, out: &mut Out) {
    let mut visible: Map<&str, ()> = Map::default();
    for p in &fr.partitions {
        for r in &p.reads {
            visible.insert(r.value.as_str(), ());
        }
    }
    let mut consumed: Map<(&str, i32, i64), &Txn> = Map::default();
    let mut reported = 0usize;
    for t in h.txns.iter().filter(|t| t.transactional) {
        let took_effect = match t.outcome {
            Outcome::Committed => true,
            Outcome::Aborted => false,
            Outcome::Indeterminate => t.sent_values().any(|v| visible.contains_key(v)),
        };
        if !took_effect {
            continue;
        }
        // a transaction may poll a record twice itself; count it once
        let mut own: Map<(&str, i32, i64), ()> = Map::default();
        for (_, r) in t.reads() {
            let k = (r.topic.as_str(), r.partition, r.offset);
            if own.insert(k, ()).is_some() {
                continue;
            }
            if let Some(prev) = consumed.insert(k, t) {
                if prev.id != t.id && reported < 1000 {
                    reported += 1;
                    out.push(
                        AnomalyKind::Duplicate,
                        format!(
                            "{} ({}) consumed by two transactions that took effect: {} and {}",
                            pos(&r.topic, r.partition, r.offset),
                            r.value,
                            txn_desc(prev),
                            txn_desc(t)
                        ),
                    );
                }
            }
        }
    }
}

/// Re-sent EndTxn requests (idempotent re-commit). Each names a transaction
/// and the identity it was ended under. Its outcome is the recorded one, or
/// for an indeterminate transaction the one the final read shows (committed
/// if any of its values is visible, else aborted); without either the
/// request is skipped, and so is one that never got an answer.
/// * The other outcome must be refused, and so must anything sent after an
///   InitProducerId of the transactional id that started once the
///   transaction had begun and finished before the request was sent (a
///   newer producer fences every older identity);
/// * the same outcome must otherwise succeed, unless an InitProducerId of
///   the id may have been applied after the transaction began and before
///   the answer (started by then, not finished before the transaction began).
///
/// Times are milliseconds of one clock; the worker gives its own
/// InitProducerId events a millisecond of their own, so equal times never
/// hide its order.
fn check_recommits(h: &History, report: &mut Report, out: &mut Out) {
    if h.recommits.is_empty() {
        return;
    }
    let txns: Map<u64, &Txn> = h.txns.iter().map(|t| (t.id, t)).collect();
    let visible: Option<Map<&str, ()>> = h.final_read.as_ref().map(|fr| {
        fr.partitions
            .iter()
            .flat_map(|p| p.reads.iter().map(|r| (r.value.as_str(), ())))
            .collect()
    });
    for rc in &h.recommits {
        let Some(code) = rc.error_code else {
            report.recommits_skipped += 1;
            continue;
        };
        let Some(t) = txns.get(&rc.txn) else {
            report.recommits_skipped += 1;
            continue;
        };
        let committed = match (t.outcome, &visible) {
            (Outcome::Committed, _) => true,
            (Outcome::Aborted, _) => false,
            (Outcome::Indeterminate, Some(v)) => t.sent_values().any(|x| v.contains_key(x)),
            (Outcome::Indeterminate, None) => {
                report.recommits_skipped += 1;
                continue;
            }
        };
        let inits = || {
            h.producer_inits
                .iter()
                .filter(|i| i.transactional_id == rc.transactional_id)
        };
        let fenced = inits()
            .find(|i| i.started_ms >= t.start_ms && i.ready_ms.is_some_and(|r| r < rc.sent_ms));
        let maybe_fenced = inits()
            .any(|i| i.started_ms <= rc.answered_ms && i.ready_ms.is_none_or(|r| r >= t.start_ms));
        let same = rc.commit == committed;
        report.recommits_checked += 1;
        if rc.reconnected {
            report.recommits_after_reconnect += 1;
        }
        let what = || {
            format!(
                "EndTxn v{} ({}) of {}{} from producer {} epoch {} of {}, sent at {}ms",
                rc.version,
                if rc.commit { "commit" } else { "abort" },
                txn_desc(t),
                if t.outcome == Outcome::Indeterminate {
                    if committed {
                        ", committed by the final read"
                    } else {
                        ", aborted by the final read"
                    }
                } else {
                    ""
                },
                rc.producer_id,
                rc.epoch,
                rc.transactional_id,
                rc.sent_ms
            )
        };
        if !same || fenced.is_some() {
            report.recommits_must_refuse += 1;
            if code == 0 {
                let why = match fenced {
                    Some(i) => format!(
                        "process {} finished InitProducerId at {}ms",
                        i.process,
                        i.ready_ms.unwrap_or_default()
                    ),
                    None => "it asks for the other outcome".to_string(),
                };
                out.push(
                    AnomalyKind::RecommitWronglyAccepted,
                    format!("{} answered success although {why}", what()),
                );
            }
        } else if !maybe_fenced {
            report.recommits_must_succeed += 1;
            if code != 0 {
                out.push(
                    AnomalyKind::RecommitRefused,
                    format!("{} refused with {}", what(), error_name(code)),
                );
            }
        }
    }
}

/// A Kafka error code's name (`ProducerFenced (90)`).
fn error_name(code: i16) -> String {
    match kafka_protocol::error::ResponseError::try_from_code(code) {
        Some(e) => format!("{e:?} ({code})"),
        None => format!("error {code}"),
    }
}
