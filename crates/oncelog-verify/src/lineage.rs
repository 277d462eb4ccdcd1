//! Pipeline lineage: which input ranges each consumer group's committed
//! transactions consumed, and what they wrote. A consume-transform-produce
//! job commits its input offsets in its transactions, so each committed
//! transaction of group G that moved G's offset on an input partition from
//! P to N consumed `[P, N)` there. Two judgments:
//!
//! * **recommitted range**: G commits a range overlapping one it already
//!   committed (its offsets went back without an operator's reset);
//! * **double processing**: another group's committed range overlaps G's on
//!   the same input partition and both wrote to the same output topic (two
//!   jobs doing the same work, each exactly once).
//!
//! Two groups reading the same input into different outputs is fan-out,
//! not a finding.

use std::collections::BTreeSet;

/// A committed range of one input partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Consumed {
    pub group: String,
    /// The transactional id that committed it.
    pub writer: String,
    pub from: i64,
    /// Exclusive.
    pub to: i64,
    /// `from` is where the group's offset was; `false`: the group had no
    /// committed offset, so where it began reading is not known and `from`
    /// is the partition's start (what it may have read).
    pub start_known: bool,
    /// The topics the transaction wrote.
    pub outputs: BTreeSet<String>,
    pub at_ms: i64,
}

/// What a new range overlaps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overlap<'a> {
    /// The same group committed part of it before.
    Recommitted(&'a Consumed),
    /// Another group committed part of it before, into these same outputs.
    DoubleProcessing(&'a Consumed, Vec<String>),
}

/// `new` against the ranges already committed on its input partition.
/// A report (`strict` false) counts only ranges whose start is known; a
/// fence (`strict`) counts what a group may have read too.
pub fn judge<'a>(new: &Consumed, before: &'a [Consumed], strict: bool) -> Vec<Overlap<'a>> {
    if new.from >= new.to || !(strict || new.start_known) {
        return Vec::new();
    }
    before
        .iter()
        .filter(|e| strict || e.start_known)
        .filter(|e| e.from < new.to && new.from < e.to)
        .filter_map(|e| {
            if e.group == new.group {
                return Some(Overlap::Recommitted(e));
            }
            let shared: Vec<String> = e.outputs.intersection(&new.outputs).cloned().collect();
            (!shared.is_empty()).then_some(Overlap::DoubleProcessing(e, shared))
        })
        .collect()
}

/// One input partition's committed ranges, bounded: adjacent ranges of one
/// group into the same outputs are kept as one, and past `max` the oldest
/// are dropped.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Ranges {
    pub ranges: Vec<Consumed>,
}

impl Ranges {
    /// Adds `new` (after [`judge`]).
    pub fn add(&mut self, new: Consumed, max: usize) {
        if new.from >= new.to {
            return;
        }
        if let Some(last) = self.ranges.iter_mut().rev().find(|e| e.group == new.group) {
            if last.to == new.from
                && last.outputs == new.outputs
                && last.start_known
                && new.start_known
            {
                last.to = new.to;
                last.at_ms = new.at_ms;
                last.writer = new.writer;
                return;
            }
        }
        self.ranges.push(new);
        if self.ranges.len() > max {
            let excess = self.ranges.len() - max;
            self.ranges.drain(..excess);
        }
    }

    /// An operator reset the group's offsets: its earlier ranges no longer
    /// count against it.
    pub fn reset(&mut self, group: &str) {
        self.ranges.retain(|e| e.group != group);
    }

    /// Forgets ranges committed before `cutoff_ms`.
    pub fn expire(&mut self, cutoff_ms: i64) {
        self.ranges.retain(|e| e.at_ms >= cutoff_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(group: &str, from: i64, to: i64, outputs: &[&str]) -> Consumed {
        Consumed {
            group: group.into(),
            writer: format!("{group}-w"),
            from,
            to,
            start_known: true,
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            at_ms: 0,
        }
    }

    #[test]
    fn a_group_going_on_is_not_a_finding() {
        let mut r = Ranges::default();
        for (f, t) in [(0, 10), (10, 25), (25, 30)] {
            let new = c("app", f, t, &["out"]);
            assert!(judge(&new, &r.ranges, false).is_empty());
            r.add(new, 100);
        }
        assert_eq!(r.ranges.len(), 1, "coalesced");
        assert_eq!((r.ranges[0].from, r.ranges[0].to), (0, 30));
    }

    #[test]
    fn another_group_into_the_same_output_is_double_processing() {
        let mut r = Ranges::default();
        r.add(c("app-1", 0, 30, &["out"]), 100);
        let found = judge(&c("app-2", 20, 40, &["out", "other"]), &r.ranges, false);
        assert_eq!(
            found,
            vec![Overlap::DoubleProcessing(&r.ranges[0], vec!["out".into()])]
        );
        // into another output: fan-out
        assert!(judge(&c("app-3", 0, 40, &["elsewhere"]), &r.ranges, false).is_empty());
        // not overlapping
        assert!(judge(&c("app-2", 30, 40, &["out"]), &r.ranges, false).is_empty());
    }

    #[test]
    fn a_group_committing_a_range_again_is_recommitted_unless_reset() {
        let mut r = Ranges::default();
        r.add(c("app", 0, 30, &["out"]), 100);
        let again = c("app", 10, 20, &["out"]);
        assert_eq!(
            judge(&again, &r.ranges, false),
            vec![Overlap::Recommitted(&r.ranges[0])]
        );
        r.reset("app");
        assert!(judge(&again, &r.ranges, false).is_empty());
        assert!(
            judge(&c("app", 5, 5, &["out"]), &r.ranges, false).is_empty(),
            "empty range"
        );
    }

    #[test]
    fn a_range_of_unknown_start_counts_for_a_fence_not_a_report() {
        let mut r = Ranges::default();
        let mut first = c("app-1", 0, 30, &["out"]);
        first.start_known = false;
        r.add(first, 100);
        r.add(c("app-1", 30, 40, &["out"]), 100);
        assert_eq!(r.ranges.len(), 2, "not joined to the unknown start");
        let second = c("app-2", 10, 20, &["out"]);
        assert!(judge(&second, &r.ranges, false).is_empty());
        assert_eq!(judge(&second, &r.ranges, true).len(), 1);
        assert_eq!(
            judge(&c("app-2", 35, 45, &["out"]), &r.ranges, false).len(),
            1
        );
    }

    #[test]
    fn ranges_are_bounded() {
        let mut r = Ranges::default();
        for i in 0..10 {
            r.add(c(&format!("g{i}"), i, i + 1, &["out"]), 4);
        }
        assert_eq!(r.ranges.len(), 4);
        assert_eq!(r.ranges[0].group, "g6");
    }
}
