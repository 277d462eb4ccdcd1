//! Exactly-once checks with no I/O and no clock, shared by the broker's live
//! verification (its scrubber) and `oncelog audit`'s history checker, so a
//! judgment is written once:
//!
//! * [`scan`]: what the bytes of one partition's log prove on their own
//!   (CRCs, offsets, producer epochs and sequences, transactions closed by
//!   their markers, the aborted-transaction index);
//! * [`ledger`]: stability, the first value seen at a position against
//!   every later one;
//! * [`torn`]: a committed transaction that shows on some of its partitions
//!   and not on the others;
//! * [`unique`]: a business key committed twice, with both writers;
//! * [`lineage`]: input ranges consumed twice by one group, or by two groups
//!   into the same output.

pub mod ledger;
pub mod lineage;
pub mod scan;
pub mod torn;
pub mod unique;
