//! Per-partition producer state: the idempotence and transaction core.
//!
//! For every producer id that wrote to the partition we keep its epoch, the
//! coordinator epoch of its last marker, the last five batches' sequence and
//! offset ranges, and the first offset of its open transaction. It is a pure
//! state machine: [`ProducerState::check`] decides what to do with a client
//! batch without changing anything; [`ProducerState::apply_batch`] records a
//! batch once it is in the log; markers go through
//! [`ProducerState::check_marker`] / [`ProducerState::apply_marker`]. The same
//! `apply_*` calls rebuild the state when the log is replayed at start.
//!
//! Rules (Kafka's, see PROTOCOL-BRIEF §2.7):
//! * a batch whose (epoch, first sequence, last sequence) equals one of the
//!   last five batches of its producer is a duplicate: it is not appended,
//!   and the answer is success with the *original* offsets;
//! * an epoch lower than the producer's is INVALID_PRODUCER_EPOCH (never
//!   PRODUCER_FENCED in a produce response);
//! * a new epoch must start at sequence 0; within an epoch the sequence must
//!   continue the last batch (wrapping from `i32::MAX` to 0), else
//!   OUT_OF_ORDER_SEQUENCE_NUMBER; a producer we know nothing of (expired, or
//!   its batches removed by retention) may start at any sequence;
//! * while a producer has an open transaction, a non-transactional batch from
//!   it is INVALID_TXN_STATE;
//! * the last stable offset is the first offset of the earliest open
//!   transaction (or the high watermark when there is none).

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

/// How many batches per producer are remembered for duplicate detection.
pub const BATCHES_TO_RETAIN: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchMeta {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub timestamp: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerEntry {
    pub epoch: i16,
    pub coordinator_epoch: i32,
    pub last_timestamp: i64,
    pub batches: VecDeque<BatchMeta>,
    pub current_txn_first_offset: Option<i64>,
}

impl ProducerEntry {
    fn new(epoch: i16) -> Self {
        Self {
            epoch,
            coordinator_epoch: -1,
            last_timestamp: -1,
            batches: VecDeque::new(),
            current_txn_first_offset: None,
        }
    }
    pub fn last_seq(&self) -> Option<i32> {
        self.batches.back().map(|b| b.last_seq)
    }
}

/// What the header of a producer batch says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerBatch {
    pub producer_id: i64,
    pub epoch: i16,
    pub first_seq: i32,
    pub last_seq: i32,
    pub transactional: bool,
    pub max_timestamp: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Append it.
    Append,
    /// Already in the log at these offsets: answer success, do not append.
    Duplicate { first_offset: i64, last_offset: i64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProduceReject {
    #[error("producer epoch {got} is older than the current epoch {current}")]
    InvalidProducerEpoch { got: i16, current: i16 },
    #[error("out of order sequence: got {got}, expected {expected}")]
    OutOfOrderSequence { got: i32, expected: i32 },
    #[error("a new producer epoch must start at sequence 0, got {got}")]
    NewEpochNotAtZero { got: i32 },
    #[error("a non-transactional batch from a producer with an open transaction")]
    InvalidTxnState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MarkerReject {
    #[error("marker producer epoch {got} is older than the current epoch {current}")]
    InvalidProducerEpoch { got: i16, current: i16 },
    #[error("marker coordinator epoch {got} is older than {current}")]
    CoordinatorFenced { got: i32, current: i32 },
}

/// A transaction that a marker closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The marker's offset.
    pub last_offset: i64,
    pub aborted: bool,
}

fn in_sequence(last: i32, next: i32) -> bool {
    next == last.wrapping_add(1) && next >= 0 || (last == i32::MAX && next == 0)
}

/// An aborted transaction's range, as Fetch reports it to read_committed consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The ABORT marker's offset.
    pub last_offset: i64,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerState {
    producers: HashMap<i64, ProducerEntry>,
    /// First offset of each open transaction → producer id.
    ongoing: BTreeMap<i64, i64>,
    /// Aborted transactions in marker order (the partition's abort index).
    #[serde(default)]
    aborted: Vec<AbortedTxn>,
    /// Transactions closed by a marker that may not be durable yet: first
    /// offset → the marker's offset. The last stable offset stays at such a
    /// transaction's first offset until the high watermark passes its
    /// marker (Kafka's "unreplicated transactions"), so a read_committed
    /// reader never sees records whose marker a crash could still take away.
    #[serde(default)]
    closing: BTreeMap<i64, i64>,
}

impl ProducerState {
    pub fn new() -> Self {
        Self::default()
    }

    /// A state holding just `entries` (cluster mode loads the producers a
    /// commit touches from their rows, decides with the same rules, and
    /// writes the changed entries back).
    pub fn with_entries(entries: impl IntoIterator<Item = (i64, ProducerEntry)>) -> Self {
        let mut s = Self::default();
        for (pid, e) in entries {
            if let Some(first) = e.current_txn_first_offset {
                s.ongoing.insert(first, pid);
            }
            s.producers.insert(pid, e);
        }
        s
    }

    pub fn get(&self, pid: i64) -> Option<&ProducerEntry> {
        self.producers.get(&pid)
    }

    pub fn producers(&self) -> impl Iterator<Item = (&i64, &ProducerEntry)> {
        self.producers.iter()
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// First offset of the earliest open transaction.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.ongoing.keys().next().copied()
    }

    /// The last stable offset for high watermark `hw`: the first offset of
    /// the earliest transaction that is open, or closed by a marker at or
    /// past `hw`; `hw` when there is none.
    pub fn last_stable_offset(&self, hw: i64) -> i64 {
        let open = self.first_unstable_offset();
        let closing = self
            .closing
            .iter()
            .find(|(_, marker)| **marker >= hw)
            .map(|(first, _)| *first);
        [open, closing].into_iter().flatten().fold(hw, i64::min)
    }

    /// Forgets closed transactions whose markers are below `hw` (durable).
    pub fn settle(&mut self, hw: i64) {
        self.closing.retain(|_, marker| *marker >= hw);
    }

    /// Open transactions: (first offset, producer id), oldest first.
    pub fn ongoing(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.ongoing.iter().map(|(o, p)| (*o, *p))
    }

    /// Decides what to do with a client batch. Changes nothing.
    pub fn check(&self, b: &ProducerBatch) -> Result<Verdict, ProduceReject> {
        let Some(e) = self.producers.get(&b.producer_id) else {
            // Unknown producer: any sequence is accepted (Kafka's rule after
            // KIP-360, so that expired or retained-away producers can go on).
            return Ok(Verdict::Append);
        };
        if e.epoch == b.epoch {
            if let Some(d) = e
                .batches
                .iter()
                .find(|x| x.first_seq == b.first_seq && x.last_seq == b.last_seq)
            {
                return Ok(Verdict::Duplicate {
                    first_offset: d.first_offset,
                    last_offset: d.last_offset,
                });
            }
        }
        if b.epoch < e.epoch {
            return Err(ProduceReject::InvalidProducerEpoch {
                got: b.epoch,
                current: e.epoch,
            });
        }
        if b.epoch != e.epoch {
            if b.first_seq != 0 {
                return Err(ProduceReject::NewEpochNotAtZero { got: b.first_seq });
            }
        } else if let Some(last) = e.last_seq() {
            if !in_sequence(last, b.first_seq) {
                return Err(ProduceReject::OutOfOrderSequence {
                    got: b.first_seq,
                    expected: last.wrapping_add(1).max(0),
                });
            }
        }
        if e.current_txn_first_offset.is_some() && !b.transactional {
            return Err(ProduceReject::InvalidTxnState);
        }
        Ok(Verdict::Append)
    }

    /// Records a producer batch that is now in the log.
    pub fn apply_batch(&mut self, b: &ProducerBatch, first_offset: i64, last_offset: i64) {
        let e = self
            .producers
            .entry(b.producer_id)
            .or_insert_with(|| ProducerEntry::new(b.epoch));
        if b.epoch != e.epoch {
            e.epoch = b.epoch;
            e.batches.clear();
        }
        e.batches.push_back(BatchMeta {
            first_seq: b.first_seq,
            last_seq: b.last_seq,
            first_offset,
            last_offset,
            timestamp: b.max_timestamp,
        });
        while e.batches.len() > BATCHES_TO_RETAIN {
            e.batches.pop_front();
        }
        e.last_timestamp = e.last_timestamp.max(b.max_timestamp);
        if b.transactional && e.current_txn_first_offset.is_none() {
            e.current_txn_first_offset = Some(first_offset);
            self.ongoing.insert(first_offset, b.producer_id);
        }
    }

    /// Checks a transaction marker for `pid`. Changes nothing.
    pub fn check_marker(
        &self,
        pid: i64,
        epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<(), MarkerReject> {
        if let Some(e) = self.producers.get(&pid) {
            if epoch < e.epoch {
                return Err(MarkerReject::InvalidProducerEpoch {
                    got: epoch,
                    current: e.epoch,
                });
            }
            if coordinator_epoch < e.coordinator_epoch {
                return Err(MarkerReject::CoordinatorFenced {
                    got: coordinator_epoch,
                    current: e.coordinator_epoch,
                });
            }
        }
        Ok(())
    }

    /// Records a marker now in the log at `offset`; returns the transaction
    /// it closed, if the producer had data in one here.
    pub fn apply_marker(
        &mut self,
        pid: i64,
        epoch: i16,
        coordinator_epoch: i32,
        offset: i64,
        aborted: bool,
        timestamp: i64,
    ) -> Option<CompletedTxn> {
        let e = self
            .producers
            .entry(pid)
            .or_insert_with(|| ProducerEntry::new(epoch));
        if epoch != e.epoch {
            e.epoch = epoch;
            e.batches.clear();
        }
        e.coordinator_epoch = coordinator_epoch;
        e.last_timestamp = e.last_timestamp.max(timestamp);
        let first = e.current_txn_first_offset.take()?;
        self.ongoing.remove(&first);
        self.closing.insert(first, offset);
        if aborted {
            self.aborted.push(AbortedTxn {
                producer_id: pid,
                first_offset: first,
                last_offset: offset,
            });
        }
        Some(CompletedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: offset,
            aborted,
        })
    }

    /// Aborted transactions that overlap [from, upper): what a read_committed
    /// fetch from `from` that returns data below `upper` must be told.
    pub fn aborted_overlapping(&self, from: i64, upper: i64) -> Vec<AbortedTxn> {
        // Entries are in marker (last offset) order: skip the ones that
        // ended before `from` without scanning them.
        let start = self.aborted.partition_point(|a| a.last_offset < from);
        self.aborted[start..]
            .iter()
            .filter(|a| a.first_offset < upper)
            .copied()
            .collect()
    }

    /// Forgets the aborted transactions whose ABORT markers the cleaner
    /// removed: (producer id, marker offset).
    pub fn forget_aborted(&mut self, removed: &[(i64, i64)]) {
        let gone: std::collections::HashSet<(i64, i64)> = removed.iter().copied().collect();
        self.aborted
            .retain(|a| !gone.contains(&(a.producer_id, a.last_offset)));
    }

    /// Drops abort-index entries wholly below the log start offset.
    pub fn trim_aborted(&mut self, log_start: i64) {
        self.aborted.retain(|a| a.last_offset >= log_start);
    }

    /// Forgets producers idle since before `cutoff` (ms), never one with an
    /// open transaction. Returns how many were removed.
    pub fn expire(&mut self, cutoff: i64) -> usize {
        let before = self.producers.len();
        self.producers
            .retain(|_, e| e.current_txn_first_offset.is_some() || e.last_timestamp >= cutoff);
        before - self.producers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(pid: i64, epoch: i16, first: i32, n: i32) -> ProducerBatch {
        ProducerBatch {
            producer_id: pid,
            epoch,
            first_seq: first,
            last_seq: first.wrapping_add(n - 1),
            transactional: false,
            max_timestamp: 1,
        }
    }

    fn append(s: &mut ProducerState, b: ProducerBatch, at: i64) -> Verdict {
        let v = s.check(&b).unwrap();
        if v == Verdict::Append {
            let n = (b.last_seq as i64 - b.first_seq as i64).rem_euclid(1 << 31);
            s.apply_batch(&b, at, at + n);
        }
        v
    }

    #[test]
    fn duplicates_answer_the_original_offsets() {
        let mut s = ProducerState::new();
        assert_eq!(append(&mut s, batch(1, 0, 0, 10), 100), Verdict::Append);
        assert_eq!(append(&mut s, batch(1, 0, 10, 5), 110), Verdict::Append);
        assert_eq!(
            s.check(&batch(1, 0, 0, 10)).unwrap(),
            Verdict::Duplicate {
                first_offset: 100,
                last_offset: 109
            }
        );
        assert_eq!(
            s.check(&batch(1, 0, 10, 5)).unwrap(),
            Verdict::Duplicate {
                first_offset: 110,
                last_offset: 114
            }
        );
    }

    #[test]
    fn only_the_last_five_batches_are_remembered() {
        let mut s = ProducerState::new();
        for i in 0..6 {
            append(&mut s, batch(1, 0, i * 2, 2), 10 * i as i64);
        }
        // The first batch fell out of the window: it is out of order now.
        assert!(matches!(
            s.check(&batch(1, 0, 0, 2)),
            Err(ProduceReject::OutOfOrderSequence { .. })
        ));
        assert!(matches!(
            s.check(&batch(1, 0, 2, 2)),
            Ok(Verdict::Duplicate { .. })
        ));
    }

    #[test]
    fn gaps_and_stale_epochs_are_rejected() {
        let mut s = ProducerState::new();
        append(&mut s, batch(1, 3, 0, 4), 0);
        assert_eq!(
            s.check(&batch(1, 3, 5, 1)),
            Err(ProduceReject::OutOfOrderSequence {
                got: 5,
                expected: 4
            })
        );
        assert_eq!(
            s.check(&batch(1, 2, 4, 1)),
            Err(ProduceReject::InvalidProducerEpoch { got: 2, current: 3 })
        );
        assert_eq!(
            s.check(&batch(1, 4, 7, 1)),
            Err(ProduceReject::NewEpochNotAtZero { got: 7 })
        );
        assert_eq!(s.check(&batch(1, 4, 0, 1)), Ok(Verdict::Append));
        // A producer we do not know may start anywhere.
        assert_eq!(s.check(&batch(2, 0, 12345, 1)), Ok(Verdict::Append));
    }

    #[test]
    fn sequence_wraps_to_zero() {
        let mut s = ProducerState::new();
        append(&mut s, batch(1, 0, i32::MAX - 1, 2), 0);
        assert_eq!(s.get(1).unwrap().last_seq(), Some(i32::MAX));
        assert_eq!(s.check(&batch(1, 0, 0, 3)), Ok(Verdict::Append));
        append(&mut s, batch(1, 0, 0, 3), 2);
        assert_eq!(s.check(&batch(1, 0, 3, 1)), Ok(Verdict::Append));
    }

    #[test]
    fn the_lso_waits_for_the_marker_to_be_durable() {
        // Found by the simulation test: the LSO moved past a transaction
        // as soon as its marker was appended, so read_committed readers saw
        // its records before the marker was synced; a crash then took them
        // away again until recovery rewrote the marker.
        let mut s = ProducerState::new();
        let mut t = batch(7, 0, 0, 3);
        t.transactional = true;
        append(&mut s, t, 10);
        assert_eq!(s.last_stable_offset(13), 10);
        s.apply_marker(7, 0, 1, 13, false, 5);
        assert_eq!(s.first_unstable_offset(), None);
        // The marker (offset 13) is not below the high watermark yet.
        assert_eq!(s.last_stable_offset(13), 10);
        assert_eq!(s.last_stable_offset(14), 14);
        s.settle(14);
        assert_eq!(
            s.last_stable_offset(13),
            13,
            "settled: only the HW bounds it"
        );
    }

    #[test]
    fn transactions_track_first_offset_and_markers_close_them() {
        let mut s = ProducerState::new();
        let mut t = batch(7, 0, 0, 3);
        t.transactional = true;
        append(&mut s, t, 50);
        assert_eq!(s.first_unstable_offset(), Some(50));
        // Non-transactional write while the transaction is open.
        assert_eq!(
            s.check(&batch(7, 0, 3, 1)),
            Err(ProduceReject::InvalidTxnState)
        );
        let mut t2 = batch(7, 0, 3, 1);
        t2.transactional = true;
        append(&mut s, t2, 60);
        assert_eq!(s.first_unstable_offset(), Some(50));
        assert_eq!(s.check_marker(7, 0, 1), Ok(()));
        let done = s.apply_marker(7, 0, 1, 70, true, 5).unwrap();
        assert_eq!(
            done,
            CompletedTxn {
                producer_id: 7,
                first_offset: 50,
                last_offset: 70,
                aborted: true
            }
        );
        assert_eq!(s.first_unstable_offset(), None);
        assert_eq!(s.aborted_overlapping(0, 100).len(), 1);
        assert_eq!(s.aborted_overlapping(71, 100).len(), 0);
        assert_eq!(s.aborted_overlapping(0, 50).len(), 0);
        assert_eq!(s.aborted_overlapping(60, 51).len(), 1);
        // A marker with an older coordinator epoch is fenced.
        assert_eq!(
            s.check_marker(7, 0, 0),
            Err(MarkerReject::CoordinatorFenced { got: 0, current: 1 })
        );
        // A marker for a producer with no open data closes nothing.
        assert_eq!(s.apply_marker(7, 1, 1, 71, false, 6), None);
    }

    proptest::proptest! {
        /// A producer sends batches in order and retries any of its last five
        /// at random moments (lost acks). Every retry is recognised and
        /// answered with the original offsets, and every new batch is appended.
        #[test]
        fn retries_never_append_twice(ops in proptest::collection::vec((1i32..5, 0usize..8), 1..200)) {
            let mut s = ProducerState::new();
            let mut sent: Vec<(ProducerBatch, i64, i64)> = Vec::new();
            let mut next_seq = 0i32;
            let mut next_offset = 0i64;
            for (n, retry) in ops {
                if retry < 5 && retry < sent.len() {
                    let (b, first, last) = sent[sent.len() - 1 - retry];
                    proptest::prop_assert_eq!(
                        s.check(&b).unwrap(),
                        Verdict::Duplicate { first_offset: first, last_offset: last }
                    );
                    continue;
                }
                let b = batch(1, 0, next_seq, n);
                proptest::prop_assert_eq!(s.check(&b).unwrap(), Verdict::Append);
                let (first, last) = (next_offset, next_offset + n as i64 - 1);
                s.apply_batch(&b, first, last);
                sent.push((b, first, last));
                next_seq += n;
                next_offset += n as i64;
            }
        }
    }

    #[test]
    fn expiry_keeps_open_transactions() {
        let mut s = ProducerState::new();
        append(&mut s, batch(1, 0, 0, 1), 0);
        let mut t = batch(2, 0, 0, 1);
        t.transactional = true;
        append(&mut s, t, 1);
        assert_eq!(s.expire(100), 1);
        assert!(s.get(1).is_none());
        assert!(s.get(2).is_some());
    }
}
