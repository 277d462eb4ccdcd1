//! What one partition's log proves from its bytes alone.
//!
//! A [`Scanner`] is fed the partition's batches in offset order, from its
//! log start, one chunk of whole batches at a time (with the aborted
//! transactions the partition's index reports for that chunk), and finds:
//!
//! * `crc`: a batch whose CRC-32C or structure is wrong (its bytes are then
//!   not trusted for anything else);
//! * `offset_order` / `offset_gap`: offsets that go back, or skip offsets
//!   that only compaction could have removed (the log start is the
//!   caller's: it restarts the scanner there);
//! * `epoch_regression`: a producer's batch or marker with an epoch below
//!   one it already wrote with;
//! * `sequence_gap`: a producer's sequence that does not continue its last
//!   batch within an epoch, or a new epoch that does not start at 0;
//! * `unclosed_txn`: a transaction whose marker is not where the partition
//!   said it would be (its last stable offset passed the transaction's
//!   first offset, so the marker lies below the high watermark of then), or
//!   a transaction left open when its producer wrote with a newer epoch;
//! * `aborted_index`: an ABORT marker without its entry in the index, or an
//!   entry without its marker.
//!
//! The rules are the partition's own (the producer state machine's): a
//! producer the scanner has not seen, or not for longer than the producer
//! expiry, may start at any sequence; an epoch bumped by a marker leaves
//! the next sequence open. Compaction removes batches, so on a compacted
//! topic offset and sequence gaps are explained, and an aborted
//! transaction's first offset may be gone.

use std::collections::HashMap;

use oncelog_log::batch::{self, BatchHeader, CONTROL_ABORT, CONTROL_COMMIT, LOG_OVERHEAD};

/// What a finding is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Crc,
    OffsetOrder,
    OffsetGap,
    EpochRegression,
    SequenceGap,
    UnclosedTxn,
    AbortedIndex,
    /// A committed transaction's partition without its COMMIT marker (the
    /// coordinator's record against the partitions: the caller's check).
    CommitMissing,
    /// Committed content that changed between two passes (the caller's
    /// check, with [`crate::ledger::Ledger`]).
    DigestChanged,
    /// A business key committed twice within its window (the caller's
    /// check, with [`crate::unique::Unique`]).
    DuplicateKey,
    /// Two groups' committed transactions consumed overlapping ranges of
    /// one input partition into the same output topic
    /// ([`crate::lineage`]).
    DoubleProcessing,
    /// One group committed an input range it had committed before, with no
    /// offset reset in between ([`crate::lineage`]).
    RecommittedRange,
}

impl Kind {
    pub const ALL: [Kind; 12] = [
        Kind::Crc,
        Kind::OffsetOrder,
        Kind::OffsetGap,
        Kind::EpochRegression,
        Kind::SequenceGap,
        Kind::UnclosedTxn,
        Kind::AbortedIndex,
        Kind::CommitMissing,
        Kind::DigestChanged,
        Kind::DuplicateKey,
        Kind::DoubleProcessing,
        Kind::RecommittedRange,
    ];

    /// The kind [`Kind::name`] names.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Crc => "crc",
            Kind::OffsetOrder => "offset_order",
            Kind::OffsetGap => "offset_gap",
            Kind::EpochRegression => "epoch_regression",
            Kind::SequenceGap => "sequence_gap",
            Kind::UnclosedTxn => "unclosed_txn",
            Kind::AbortedIndex => "aborted_index",
            Kind::CommitMissing => "commit_missing",
            Kind::DigestChanged => "digest_changed",
            Kind::DuplicateKey => "duplicate_key",
            Kind::DoubleProcessing => "double_processing",
            Kind::RecommittedRange => "recommitted_range",
        }
    }
}

/// One thing found wrong, with the offsets it concerns (and the producer,
/// where one is concerned: else -1).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub kind: Kind,
    pub first_offset: i64,
    pub last_offset: i64,
    pub producer_id: i64,
    pub epoch: i16,
    pub detail: String,
}

/// What explains what the bytes show.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// The topic is compacted: batches may have been removed.
    pub compacted: bool,
    /// A producer unseen for this long (by its batches' timestamps) is
    /// forgotten, as the partition forgets it (`producer.id.expiration.ms`).
    pub producer_expiry_ms: i64,
}

/// An aborted transaction as the partition's index reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aborted {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The ABORT marker's offset.
    pub last_offset: i64,
}

/// A transaction marker the scanner read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    pub producer_id: i64,
    pub epoch: i16,
    pub offset: i64,
    pub commit: bool,
    pub timestamp: i64,
}

/// What one chunk gave, besides findings.
#[derive(Debug, Default, Clone)]
pub struct Fed {
    /// Bytes of the chunk read as whole batches (less than its length when
    /// a batch could not even be framed: the rest is not trusted).
    pub consumed: usize,
    /// (base offset, last offset, CRC) of every sound batch, markers
    /// included: the committed content's fingerprint.
    pub crcs: Vec<(i64, i64, u32)>,
    /// The markers read.
    pub markers: Vec<Marker>,
}

#[derive(Debug, Clone)]
struct Producer {
    epoch: i16,
    /// The last sequence written in `epoch` (`None`: any may follow).
    last_seq: Option<i32>,
    last_timestamp: i64,
    open: Option<Open>,
}

#[derive(Debug, Clone, Copy)]
struct Open {
    first: i64,
    epoch: i16,
    /// The partition said the transaction was closed: its marker is below
    /// this offset.
    marker_before: Option<i64>,
}

/// One partition's scan (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Scanner {
    rules: Rules,
    /// The offset the next batch must start at.
    next: Option<i64>,
    producers: HashMap<i64, Producer>,
}

fn in_sequence(last: i32, next: i32) -> bool {
    next == last.wrapping_add(1) && next >= 0 || (last == i32::MAX && next == 0)
}

impl Scanner {
    pub fn new(rules: Rules) -> Self {
        Self {
            rules,
            next: None,
            producers: HashMap::new(),
        }
    }

    /// A scanner for a log that starts at `log_start` (nothing known of
    /// what came before).
    pub fn starting_at(rules: Rules, log_start: i64) -> Self {
        let mut s = Self::new(rules);
        s.next = Some(log_start);
        s
    }

    /// The offset the scan reached: where the next chunk starts.
    pub fn next_offset(&self) -> Option<i64> {
        self.next
    }

    /// The first offset of the earliest transaction still open in what was
    /// read (nothing at or past it is settled yet).
    pub fn earliest_open(&self) -> Option<i64> {
        self.producers
            .values()
            .filter_map(|p| p.open.map(|o| o.first))
            .min()
    }

    /// Producers the scan keeps state for.
    pub fn producers(&self) -> usize {
        self.producers.len()
    }

    /// The scan reached the partition's last stable offset `lso` while
    /// its high watermark was `hw`: every transaction still open here that
    /// began below `lso` was closed by then, by a marker below `hw`.
    pub fn reached_stable(&mut self, lso: i64, hw: i64) {
        for p in self.producers.values_mut() {
            if let Some(o) = &mut p.open {
                if o.first < lso && o.marker_before.is_none() {
                    o.marker_before = Some(hw);
                }
            }
        }
    }

    /// Reads one chunk of whole batches (`aborted`: the index's entries for
    /// it), pushing what is wrong to `out`.
    pub fn feed(&mut self, data: &[u8], aborted: &[Aborted], out: &mut Vec<Finding>) -> Fed {
        let mut fed = Fed::default();
        let chunk_first = self.next;
        // ABORT markers read: (producer, first offset if known, marker offset)
        let mut aborts: Vec<(i64, Option<i64>, i64)> = Vec::new();
        let mut pos = 0;
        while pos < data.len() {
            let Some(total) = frame(&data[pos..]) else {
                out.push(Finding {
                    kind: Kind::Crc,
                    first_offset: self.next.unwrap_or(-1),
                    last_offset: self.next.unwrap_or(-1),
                    producer_id: -1,
                    epoch: -1,
                    detail: format!(
                        "no whole batch can be framed at byte {pos} of a {}-byte read",
                        data.len()
                    ),
                });
                break;
            };
            let buf = &data[pos..pos + total];
            pos += total;
            fed.consumed = pos;
            let h = match batch::validate(buf) {
                Ok(h) => h,
                Err(e) => {
                    self.corrupt(buf, &e.to_string(), out);
                    continue;
                }
            };
            fed.crcs.push((h.base_offset(), h.last_offset(), h.crc()));
            self.offsets(&h, out);
            if h.producer_id() < 0 {
                continue;
            }
            if h.is_control() {
                if let Some(m) = self.marker(&h, buf, out) {
                    if !m.commit {
                        aborts.push(m.closed);
                    }
                    fed.markers.push(m.marker);
                }
            } else {
                self.data(&h, out);
            }
        }
        self.check_index(chunk_first, &aborts, aborted, out);
        self.past_markers(out);
        fed
    }

    fn corrupt(&mut self, buf: &[u8], why: &str, out: &mut Vec<Finding>) {
        let (first, last, pid, epoch) = match BatchHeader::new(buf) {
            Ok(h) => (
                h.base_offset(),
                h.last_offset(),
                h.producer_id(),
                h.producer_epoch(),
            ),
            Err(_) => (self.next.unwrap_or(-1), self.next.unwrap_or(-1), -1, -1),
        };
        out.push(Finding {
            kind: Kind::Crc,
            first_offset: first,
            last_offset: last,
            producer_id: pid,
            epoch,
            detail: format!("batch at offsets {first}..={last}: {why}"),
        });
        // Its offsets are taken as they claim, and its producer's next
        // sequence is left open, so what follows is not reported again.
        if let Some(p) = self.producers.get_mut(&pid) {
            p.last_seq = None;
        }
        if last >= first && self.next.is_none_or(|n| last >= n) {
            self.next = Some(last + 1);
        }
    }

    fn offsets(&mut self, h: &BatchHeader<'_>, out: &mut Vec<Finding>) {
        let (base, last) = (h.base_offset(), h.last_offset());
        if let Some(next) = self.next {
            if base < next {
                out.push(Finding {
                    kind: Kind::OffsetOrder,
                    first_offset: base,
                    last_offset: last,
                    producer_id: h.producer_id(),
                    epoch: h.producer_epoch(),
                    detail: format!(
                        "batch at {base}..={last} follows one that ended at {}",
                        next - 1
                    ),
                });
            } else if base > next && !self.rules.compacted {
                out.push(Finding {
                    kind: Kind::OffsetGap,
                    first_offset: next,
                    last_offset: base - 1,
                    producer_id: -1,
                    epoch: -1,
                    detail: format!(
                        "offsets {next}..={} are missing (not compacted, above the log start)",
                        base - 1
                    ),
                });
            }
        }
        if self.next.is_none_or(|n| last >= n) {
            self.next = Some(last + 1);
        }
    }

    fn producer(&mut self, h: &BatchHeader<'_>) -> &mut Producer {
        let expiry = self.rules.producer_expiry_ms;
        let ts = h.max_timestamp();
        let p = self
            .producers
            .entry(h.producer_id())
            .or_insert_with(|| Producer {
                epoch: h.producer_epoch(),
                last_seq: None,
                last_timestamp: ts,
                open: None,
            });
        if p.open.is_none() && ts.saturating_sub(p.last_timestamp) > expiry {
            // Expired in the partition too: it may start over.
            p.epoch = h.producer_epoch();
            p.last_seq = None;
        }
        p.last_timestamp = p.last_timestamp.max(ts);
        p
    }

    fn data(&mut self, h: &BatchHeader<'_>, out: &mut Vec<Finding>) {
        let compacted = self.rules.compacted;
        let (pid, epoch, base) = (h.producer_id(), h.producer_epoch(), h.base_offset());
        let p = self.producer(h);
        let finding = |kind, first_offset, last_offset, detail| Finding {
            kind,
            first_offset,
            last_offset,
            producer_id: pid,
            epoch,
            detail,
        };
        if epoch < p.epoch {
            out.push(finding(
                Kind::EpochRegression,
                base,
                h.last_offset(),
                format!("data batch with epoch {epoch} after epoch {}", p.epoch),
            ));
            return;
        }
        if let Some(o) = p.open {
            if epoch > o.epoch || !h.is_transactional() {
                out.push(finding(
                    Kind::UnclosedTxn,
                    o.first,
                    base - 1,
                    format!(
                        "transaction from {} (epoch {}) has no marker before the producer's {} batch at {base} (epoch {epoch})",
                        o.first,
                        o.epoch,
                        if h.is_transactional() { "transactional" } else { "non-transactional" },
                    ),
                ));
                p.open = None;
            }
        }
        let seq = h.base_sequence();
        if epoch > p.epoch {
            if seq != 0 && !compacted {
                out.push(finding(
                    Kind::SequenceGap,
                    base,
                    h.last_offset(),
                    format!("epoch {epoch} starts at sequence {seq}, not 0"),
                ));
            }
        } else if let Some(last) = p.last_seq {
            if !in_sequence(last, seq) && !compacted {
                out.push(finding(
                    Kind::SequenceGap,
                    base,
                    h.last_offset(),
                    format!("sequence {seq} does not follow {last}"),
                ));
            }
        }
        p.epoch = epoch;
        p.last_seq = Some(h.last_sequence());
        if h.is_transactional() && p.open.is_none() {
            p.open = Some(Open {
                first: base,
                epoch,
                marker_before: None,
            });
        }
    }

    fn marker(
        &mut self,
        h: &BatchHeader<'_>,
        buf: &[u8],
        out: &mut Vec<Finding>,
    ) -> Option<ReadMarker> {
        let (ty, _coordinator_epoch) = batch::control_record(buf)?;
        if ty != CONTROL_ABORT && ty != CONTROL_COMMIT {
            return None;
        }
        let (pid, epoch, offset) = (h.producer_id(), h.producer_epoch(), h.base_offset());
        let p = self.producer(h);
        if epoch < p.epoch {
            out.push(Finding {
                kind: Kind::EpochRegression,
                first_offset: offset,
                last_offset: offset,
                producer_id: pid,
                epoch,
                detail: format!(
                    "{} marker with epoch {epoch} after epoch {}",
                    if ty == CONTROL_COMMIT {
                        "COMMIT"
                    } else {
                        "ABORT"
                    },
                    p.epoch
                ),
            });
        } else if epoch > p.epoch {
            p.epoch = epoch;
            p.last_seq = None;
        }
        let first = p.open.take().map(|o| o.first);
        Some(ReadMarker {
            marker: Marker {
                producer_id: pid,
                epoch,
                offset,
                commit: ty == CONTROL_COMMIT,
                timestamp: h.max_timestamp(),
            },
            commit: ty == CONTROL_COMMIT,
            closed: (pid, first, offset),
        })
    }

    /// ABORT markers read against the index's entries for the chunk.
    fn check_index(
        &self,
        chunk_first: Option<i64>,
        aborts: &[(i64, Option<i64>, i64)],
        index: &[Aborted],
        out: &mut Vec<Finding>,
    ) {
        let lo = chunk_first.unwrap_or(i64::MIN);
        let hi = self.next.unwrap_or(i64::MIN);
        for &(pid, first, m) in aborts {
            let Some(first) = first else {
                // An ABORT for a transaction with no data here: no entry.
                continue;
            };
            let found = index.iter().find(|a| a.last_offset == m);
            let good = found.is_some_and(|a| {
                a.producer_id == pid && (a.first_offset == first || self.rules.compacted)
            });
            if !good {
                out.push(Finding {
                    kind: Kind::AbortedIndex,
                    first_offset: first,
                    last_offset: m,
                    producer_id: pid,
                    epoch: -1,
                    detail: match found {
                        None => format!("ABORT marker at {m} closes {first}..={m}; the index has no entry"),
                        Some(a) => format!(
                            "ABORT marker at {m} closes {first}..={m} (producer {pid}); the index says producer {} from {}",
                            a.producer_id, a.first_offset
                        ),
                    },
                });
            }
        }
        for a in index.iter().filter(|a| (lo..hi).contains(&a.last_offset)) {
            if !aborts.iter().any(|&(_, _, m)| m == a.last_offset) {
                out.push(Finding {
                    kind: Kind::AbortedIndex,
                    first_offset: a.first_offset,
                    last_offset: a.last_offset,
                    producer_id: a.producer_id,
                    epoch: -1,
                    detail: format!(
                        "the index aborts {}..={} (producer {}); there is no ABORT marker at {}",
                        a.first_offset, a.last_offset, a.producer_id, a.last_offset
                    ),
                });
            }
        }
    }

    /// Transactions the partition said were closed below an offset the
    /// scan has now passed without their marker.
    fn past_markers(&mut self, out: &mut Vec<Finding>) {
        let Some(next) = self.next else { return };
        for (pid, p) in self.producers.iter_mut() {
            let Some(o) = p.open else { continue };
            if o.marker_before.is_some_and(|before| before <= next) {
                out.push(Finding {
                    kind: Kind::UnclosedTxn,
                    first_offset: o.first,
                    last_offset: o.marker_before.unwrap_or(next) - 1,
                    producer_id: *pid,
                    epoch: o.epoch,
                    detail: format!(
                        "the partition's last stable offset passed the transaction from {}, but no marker follows it below {}",
                        o.first,
                        o.marker_before.unwrap_or(next)
                    ),
                });
                p.open = None;
            }
        }
    }
}

struct ReadMarker {
    marker: Marker,
    commit: bool,
    closed: (i64, Option<i64>, i64),
}

/// The size of the whole batch that `buf` starts with, when its length
/// field frames one inside `buf`.
fn frame(buf: &[u8]) -> Option<usize> {
    let len = i32::from_be_bytes(buf.get(8..12)?.try_into().ok()?);
    if len < batch::MIN_LENGTH_FIELD {
        return None;
    }
    let total = LOG_OVERHEAD + len as usize;
    (total <= buf.len()).then_some(total)
}

#[cfg(test)]
mod tests;
