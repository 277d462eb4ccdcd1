//! The storage boundary.
//!
//! Protocol code (the request handlers and the two coordinators) is written
//! against these two traits, not against files:
//!
//! * [`PartitionStore`]: one partition's records. It decides appends
//!   (idempotence, the transaction checks through the caller's `verify`,
//!   markers), serves reads with the high watermark, the last stable offset
//!   and the aborted-transaction index, and says when a write is durable.
//! * [`StateLog`]: a coordinator's state as a log of keyed records. The
//!   coordinator replays it at start and hands it changes; a change is
//!   applied (by the callback it comes with) only once it is durable, in log
//!   order.
//!
//! The local backend implements them with segment files and group commit:
//! [`crate::backend::local::partition::Partition`] and [`crate::backend::local::internal_log::LogWriter`].
//! The handlers reach them through [`crate::backend`]'s local arms; cluster
//! mode's arms call `crate::backend::cluster` directly and does not implement these
//! traits (docs/architecture.md). What stays on the local side of the line:
//! the topic catalogue (`topics`), group commit's sync threads
//! (`durability`), retention and page-cache hygiene, which are how the
//! local backend keeps its promises, not part of them.

use std::sync::Arc;

use crate::backend::local::internal_log::{
    LogWriter, MemoryLog, OnDurable, Pending, PersistError, Record,
};
use crate::backend::local::partition::{
    AppendError, Appended, Marker, MarkerError, OffsetLookupError, Partition, PartitionStatus,
    Read, SyncReply,
};
use crate::machines::producer_state::{MarkerReject, ProducerBatch, ProducerEntry};
use crate::machines::txn_coordinator::VerifyError;

/// One partition's records, as the protocol code sees them.
pub trait PartitionStore: Send + Sync {
    fn topic(&self) -> &str;
    fn index(&self) -> i32;
    fn name(&self) -> String {
        format!("{}-{}", self.topic(), self.index())
    }
    /// High watermark, last stable offset, log start and size.
    fn status(&self) -> PartitionStatus;
    /// The log start offset alone (cheaper than [`Self::status`]).
    fn log_start_offset(&self) -> i64;
    /// Appends a client batch: refused, answered as a duplicate, or written
    /// (`Appended::durable` says when it is durable). A transactional batch
    /// must pass `verify` at the moment it is written.
    fn append(
        &self,
        data: &mut [u8],
        producer: Option<&ProducerBatch>,
        verify: &dyn Fn(&ProducerBatch) -> Result<(), VerifyError>,
    ) -> Result<Appended, AppendError>;
    /// Writes a COMMIT or ABORT marker; `Some` says when it is durable.
    fn write_marker(&self, marker: Marker) -> Result<Option<SyncReply>, MarkerError>;
    /// A fetch from `offset` (see [`Partition::read`]).
    fn read(&self, offset: i64, max_bytes: usize, read_committed: bool, min_one: bool) -> Read;
    /// ListOffsets (see [`Partition::offset_for`]).
    fn offset_for(
        &self,
        spec: i64,
        read_committed: bool,
    ) -> Result<Option<(i64, i64)>, OffsetLookupError>;
    /// Open transactions: (first offset, producer id, producer epoch).
    fn open_transactions(&self) -> Vec<(i64, i64, i16)>;
    /// Every producer the partition knows, with its state.
    fn producers(&self) -> Vec<(i64, ProducerEntry)>;
    /// Whether `pid` has a transaction open here that a marker with
    /// `epoch` and `coordinator_epoch` may close.
    fn open_transaction_of(
        &self,
        pid: i64,
        epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<bool, MarkerReject>;
}

impl PartitionStore for Partition {
    fn topic(&self) -> &str {
        &self.topic
    }
    fn index(&self) -> i32 {
        self.index
    }
    fn status(&self) -> PartitionStatus {
        Partition::status(self)
    }
    fn log_start_offset(&self) -> i64 {
        Partition::log_start_offset(self)
    }
    fn append(
        &self,
        data: &mut [u8],
        producer: Option<&ProducerBatch>,
        verify: &dyn Fn(&ProducerBatch) -> Result<(), VerifyError>,
    ) -> Result<Appended, AppendError> {
        Partition::append(self, data, producer, verify)
    }
    fn write_marker(&self, marker: Marker) -> Result<Option<SyncReply>, MarkerError> {
        Partition::write_marker(self, marker)
    }
    fn read(&self, offset: i64, max_bytes: usize, read_committed: bool, min_one: bool) -> Read {
        Partition::read(self, offset, max_bytes, read_committed, min_one)
    }
    fn offset_for(
        &self,
        spec: i64,
        read_committed: bool,
    ) -> Result<Option<(i64, i64)>, OffsetLookupError> {
        Partition::offset_for(self, spec, read_committed)
    }
    fn open_transactions(&self) -> Vec<(i64, i64, i16)> {
        Partition::open_transactions(self)
    }
    fn producers(&self) -> Vec<(i64, ProducerEntry)> {
        Partition::producers(self)
    }
    fn open_transaction_of(
        &self,
        pid: i64,
        epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<bool, MarkerReject> {
        Partition::open_transaction_of(self, pid, epoch, coordinator_epoch)
    }
}

/// A coordinator's state log.
pub trait StateLog: Send + Sync {
    /// Queues `records` and returns at once. Once they are durable,
    /// `on_durable` runs, in log order, before the returned [`Pending`]
    /// resolves; if they are not made durable it does not run and none of
    /// them is in the log.
    fn submit(
        &self,
        records: Vec<Record>,
        on_durable: Option<OnDurable>,
    ) -> Result<Pending, PersistError>;
}

impl StateLog for LogWriter {
    fn submit(
        &self,
        records: Vec<Record>,
        on_durable: Option<OnDurable>,
    ) -> Result<Pending, PersistError> {
        LogWriter::submit(self, records, on_durable)
    }
}

impl StateLog for MemoryLog {
    fn submit(
        &self,
        records: Vec<Record>,
        on_durable: Option<OnDurable>,
    ) -> Result<Pending, PersistError> {
        MemoryLog::submit(self, records, on_durable)
    }
}

impl dyn StateLog {
    /// Appends `records` and waits until they are durable.
    pub async fn append(&self, records: Vec<Record>) -> Result<(), PersistError> {
        self.submit(records, None)?.durable().await
    }

    /// Queues `records` without waiting: for changes whose loss a restart
    /// repairs by itself.
    pub fn append_detached(&self, records: Vec<Record>) -> Result<(), PersistError> {
        self.submit(records, None).map(drop)
    }
}

/// A coordinator's log handle, shared.
pub type SharedStateLog = Arc<dyn StateLog>;
