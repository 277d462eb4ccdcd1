//! A committed transaction must show on every partition (or with every
//! value) it wrote, or on none: the auditor checks its values in a final
//! read (`torn_txn`), the broker checks its partitions for the COMMIT
//! marker (`commit_missing`).

/// Where a transaction shows, of the places it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Showing<'a, T> {
    /// How many of the places show it.
    pub present: usize,
    /// How many places it wrote.
    pub total: usize,
    /// The places that do not show it, in the order given.
    pub missing: Vec<&'a T>,
}

impl<T> Showing<'_, T> {
    /// Some places show it and others do not: the transaction is torn.
    pub fn is_torn(&self) -> bool {
        self.present > 0 && self.present < self.total
    }

    /// Some place does not show it (torn, or missing everywhere).
    pub fn is_incomplete(&self) -> bool {
        !self.missing.is_empty()
    }
}

/// Which of `places` show the transaction, as `shows` says.
pub fn showing<'a, T>(
    places: impl IntoIterator<Item = &'a T>,
    shows: impl Fn(&T) -> bool,
) -> Showing<'a, T> {
    let mut s = Showing {
        present: 0,
        total: 0,
        missing: Vec::new(),
    };
    for p in places {
        s.total += 1;
        if shows(p) {
            s.present += 1;
        } else {
            s.missing.push(p);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_only_when_some_but_not_all_show() {
        let parts = [0, 1, 2];
        let all = showing(&parts, |_| true);
        assert!(!all.is_torn() && !all.is_incomplete());
        let none = showing(&parts, |_| false);
        assert!(!none.is_torn() && none.is_incomplete());
        assert_eq!(none.missing, vec![&0, &1, &2]);
        let some = showing(&parts, |p| *p != 1);
        assert!(some.is_torn());
        assert_eq!((some.present, some.total, some.missing), (2, 3, vec![&1]));
    }
}
