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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    pub group: String,
    /// The transactional id that committed it.
    pub writer: String,
    pub from: i64,
    /// Exclusive.
    pub to: i64,
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
pub fn judge<'a>(new: &Consumed, before: &'a [Consumed]) -> Vec<Overlap<'a>> {
    if new.from >= new.to {
        return Vec::new();
    }
    before
        .iter()
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
#[derive(Debug, Clone, Default)]
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
            if last.to == new.from && last.outputs == new.outputs {
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
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            at_ms: 0,
        }
    }

    #[test]
    fn a_group_going_on_is_not_a_finding() {
        let mut r = Ranges::default();
        for (f, t) in [(0, 10), (10, 25), (25, 30)] {
            let new = c("app", f, t, &["out"]);
            assert!(judge(&new, &r.ranges).is_empty());
            r.add(new, 100);
        }
        assert_eq!(r.ranges.len(), 1, "coalesced");
        assert_eq!((r.ranges[0].from, r.ranges[0].to), (0, 30));
    }

    #[test]
    fn another_group_into_the_same_output_is_double_processing() {
        let mut r = Ranges::default();
        r.add(c("app-1", 0, 30, &["out"]), 100);
        let found = judge(&c("app-2", 20, 40, &["out", "other"]), &r.ranges);
        assert_eq!(
            found,
            vec![Overlap::DoubleProcessing(&r.ranges[0], vec!["out".into()])]
        );
        // into another output: fan-out
        assert!(judge(&c("app-3", 0, 40, &["elsewhere"]), &r.ranges).is_empty());
        // not overlapping
        assert!(judge(&c("app-2", 30, 40, &["out"]), &r.ranges).is_empty());
    }

    #[test]
    fn a_group_committing_a_range_again_is_recommitted_unless_reset() {
        let mut r = Ranges::default();
        r.add(c("app", 0, 30, &["out"]), 100);
        let again = c("app", 10, 20, &["out"]);
        assert_eq!(
            judge(&again, &r.ranges),
            vec![Overlap::Recommitted(&r.ranges[0])]
        );
        r.reset("app");
        assert!(judge(&again, &r.ranges).is_empty());
        assert!(
            judge(&c("app", 5, 5, &["out"]), &r.ranges).is_empty(),
            "empty range"
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
