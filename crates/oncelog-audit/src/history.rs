//! The recorded history of a run. Serializable, so histories can be saved as
//! JSON and checked later.
//!
//! Recording contract (what [`crate::check`] assumes):
//! * every `Send` writes a value no other `Send` writes;
//! * all reads (polls and the final read) are `read_committed`;
//! * `Poll::at_ms` is the time the poll *returned*; `Txn::commit_ms` is the
//!   time the commit was requested; all times come from one clock;
//! * a `process` is one consumer session with a fixed assignment: a workload
//!   whose assignment can change (rebalance) or that seeks back outside an
//!   abort must continue under a new process id;
//! * the final read covers every partition written during the run;
//! * a `Recommit` names a transactional txn that ended before it was sent,
//!   with the producer id and epoch that txn was ended under, and every
//!   InitProducerId of that transactional id by the run's workers is in
//!   `producer_inits` (the checker judges fences by them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a transaction ended, as far as its client knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The commit was acknowledged.
    Committed,
    /// The transaction was aborted (explicitly or by a fatal error before commit).
    Aborted,
    /// The client cannot tell (timeout, crash, lost connection during commit).
    Indeterminate,
}

/// One record returned by a read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Read {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub value: String,
}

/// One operation inside a [`Txn`], in client order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// A produced record. `key` names the logical record, `value` this attempt.
    Send {
        topic: String,
        partition: i32,
        key: String,
        value: String,
        /// Offset from the produce ack, if one arrived (negative means none).
        #[serde(default)]
        offset: Option<i64>,
    },
    /// One consumer poll that returned at `at_ms` with `reads`, in order.
    Poll { at_ms: u64, reads: Vec<Read> },
}

/// A transaction of one process. A non-transactional (idempotent) send is a
/// `Txn` with `transactional: false`, a single `Send` and a `Committed` or
/// `Indeterminate` outcome; a plain consumer's polls may be recorded the same
/// way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    pub id: u64,
    pub process: u32,
    #[serde(default = "default_true")]
    pub transactional: bool,
    pub ops: Vec<Op>,
    pub outcome: Outcome,
    pub start_ms: u64,
    /// When the commit was requested; `None` if it never was. For
    /// non-transactional txns, `None` means "visible from `start_ms`".
    #[serde(default)]
    pub commit_ms: Option<u64>,
    pub end_ms: u64,
}

fn default_true() -> bool {
    true
}

impl Txn {
    /// Values written by this txn's sends, in order.
    pub fn sent_values(&self) -> impl Iterator<Item = &str> {
        self.ops.iter().filter_map(|op| match op {
            Op::Send { value, .. } => Some(value.as_str()),
            Op::Poll { .. } => None,
        })
    }

    /// Reads of this txn's polls, in order, each with its poll's `at_ms`.
    pub fn reads(&self) -> impl Iterator<Item = (u64, &Read)> {
        self.ops.iter().flat_map(|op| {
            let (at_ms, reads): (u64, &[Read]) = match op {
                Op::Poll { at_ms, reads } => (*at_ms, reads),
                Op::Send { .. } => (0, &[]),
            };
            reads.iter().map(move |r| (at_ms, r))
        })
    }

    /// Time from which a read of this txn's values is legitimate.
    pub fn visible_from_ms(&self) -> Option<u64> {
        match (self.commit_ms, self.transactional) {
            (Some(t), _) => Some(t),
            (None, false) => Some(self.start_ms),
            (None, true) => None,
        }
    }
}

/// Final `read_committed` read of one partition, from its start to the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRead {
    pub topic: String,
    pub partition: i32,
    pub high_watermark: i64,
    /// Last stable offset when the read finished.
    pub lso: i64,
    pub reads: Vec<Read>,
}

/// Full `read_committed` read of every partition at the end of the run,
/// after faults healed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalRead {
    pub partitions: Vec<PartitionRead>,
}

/// After faults healed: how long `read_committed` took to reach the high
/// watermark of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessCheck {
    pub topic: String,
    pub partition: i32,
    pub waited_ms: u64,
    pub limit_ms: u64,
    pub reached: bool,
    /// The longest the reader went without progress (a record read or its
    /// position moved) while this partition was below its high watermark:
    /// stuck is longer than `limit_ms`; a long backlog read steadily is not.
    /// `None` in histories written before it: `waited_ms` is judged then.
    #[serde(default)]
    pub stalled_ms: Option<u64>,
}

/// A zombie episode: `process` was paused (SIGSTOP) at `paused_ms`, a
/// successor with its transactional id finished initialising at
/// `fenced_ms`, and the paused process resumed at `resumed_ms`. None of its
/// transactions whose commit was not requested before the pause may commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    pub process: u32,
    pub paused_ms: u64,
    pub fenced_ms: u64,
    pub resumed_ms: u64,
    /// Whether the paused process had finished initialising its producer
    /// (its InitProducerId answered) when it was paused. One that had not
    /// may send or finish its InitProducerId after its successor's, and then
    /// it holds the id and the successor is the one fenced: it is no zombie.
    #[serde(default = "initialised")]
    pub initialised: bool,
}

fn initialised() -> bool {
    true
}

/// An InitProducerId on a transactional id, as the `recommit` workload
/// logs each of its own: `started_ms` before the request was sent,
/// `ready_ms` once it was answered (`None`: never answered). A completed
/// one fences every older producer of the id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerInit {
    pub process: u32,
    pub transactional_id: String,
    pub started_ms: u64,
    #[serde(default)]
    pub ready_ms: Option<u64>,
}

/// A re-sent EndTxn for a transaction that already ended, as a committer
/// restored from a checkpoint sends it: the producer id and epoch the
/// transaction was ended under, the outcome asked for, and the answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recommit {
    /// The transaction (its [`Txn::id`]).
    pub txn: u64,
    pub process: u32,
    pub transactional_id: String,
    /// EndTxn(commit) if true, EndTxn(abort) if false.
    pub commit: bool,
    /// The EndTxn version sent.
    pub version: i16,
    pub producer_id: i64,
    pub epoch: i16,
    /// Before the first try.
    pub sent_ms: u64,
    /// When the last try ended.
    pub answered_ms: u64,
    /// The answer's error code (0: success) after retrying retriable ones;
    /// `None`: every try lost its connection.
    #[serde(default)]
    pub error_code: Option<i16>,
    /// The worker's connection was lost (typically a broker restart) between
    /// the transaction's end and this answer.
    #[serde(default)]
    pub reconnected: bool,
}

/// Everything a run recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub txns: Vec<Txn>,
    #[serde(default)]
    pub final_read: Option<FinalRead>,
    #[serde(default)]
    pub liveness: Vec<LivenessCheck>,
    /// Keys that must each be visible exactly once in the final read (copier).
    /// Keys are counted over every partition, so give keys of other topics
    /// distinct names.
    #[serde(default)]
    pub expected_keys: Option<Vec<String>>,
    /// Fault name -> number of times injected.
    #[serde(default)]
    pub faults: BTreeMap<String, u64>,
    /// Zombie episodes (paused producers whose id was taken over).
    #[serde(default)]
    pub pauses: Vec<Pause>,
    /// The written topic is compacted: the final read must show, for every
    /// key, its latest committed value; older values may be gone.
    #[serde(default)]
    pub compacted: bool,
    /// InitProducerId requests of the workers that log them (`recommit`).
    #[serde(default)]
    pub producer_inits: Vec<ProducerInit>,
    /// Re-sent EndTxn requests (`recommit`).
    #[serde(default)]
    pub recommits: Vec<Recommit>,
}
