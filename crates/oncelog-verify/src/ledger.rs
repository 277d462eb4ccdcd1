//! Stability: what is at a position must not change. The first value seen
//! at each position is kept with where it was seen; a later, different one
//! is a conflict. The auditor keeps the values its clients acknowledged
//! and read (`inconsistent_offset`); the broker's scrubber keeps the CRC of
//! each committed batch it verified (`digest_changed`).

use std::collections::BTreeMap;

/// The first value seen at each position, with its observation.
#[derive(Debug, Clone)]
pub struct Ledger<P, V, O> {
    first: BTreeMap<P, (V, O)>,
}

impl<P: Ord, V: PartialEq, O> Default for Ledger<P, V, O> {
    fn default() -> Self {
        Self {
            first: BTreeMap::new(),
        }
    }
}

impl<P: Ord + Clone, V: PartialEq, O> Ledger<P, V, O> {
    /// Notes `value` seen at `at`: the first observation there when
    /// `value` differs from it (a conflict), else `None`. The first value
    /// stays the reference either way.
    pub fn see(&mut self, at: P, value: V, obs: O) -> Option<&(V, O)> {
        use std::collections::btree_map::Entry;
        match self.first.entry(at) {
            Entry::Vacant(e) => {
                e.insert((value, obs));
                None
            }
            Entry::Occupied(e) => {
                let first = e.into_mut();
                (first.0 != value).then_some(&*first)
            }
        }
    }

    /// Forgets every position below `at` (removed by retention).
    pub fn forget_below(&mut self, at: &P) {
        self.first = self.first.split_off(at);
    }

    /// Forgets every position from `at` on.
    pub fn forget_from(&mut self, at: &P) {
        self.first.split_off(at);
    }

    /// The positions whose first value is `at` or later, in order.
    pub fn from<'a>(&'a self, at: &P) -> impl Iterator<Item = (&'a P, &'a (V, O))> + 'a {
        self.first.range(at.clone()..)
    }

    pub fn len(&self) -> usize {
        self.first.len()
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_value_is_reported_against_the_first() {
        let mut l: Ledger<i64, u32, &str> = Ledger::default();
        assert!(l.see(5, 0xaa, "pass 1").is_none());
        assert!(l.see(5, 0xaa, "pass 2").is_none());
        assert_eq!(l.see(5, 0xbb, "pass 3"), Some(&(0xaa, "pass 1")));
        // the first value stays the reference
        assert_eq!(l.see(5, 0xcc, "pass 4"), Some(&(0xaa, "pass 1")));
        assert!(l.see(5, 0xaa, "pass 5").is_none());
    }

    #[test]
    fn forgetting_keeps_the_rest() {
        let mut l: Ledger<i64, u32, ()> = Ledger::default();
        for o in 0..10 {
            l.see(o, o as u32, ());
        }
        l.forget_below(&3);
        l.forget_from(&8);
        let kept: Vec<i64> = l.from(&0).map(|(p, _)| *p).collect();
        assert_eq!(kept, vec![3, 4, 5, 6, 7]);
        assert_eq!(l.len(), 5);
    }
}
