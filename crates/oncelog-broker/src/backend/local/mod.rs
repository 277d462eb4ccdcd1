//! Local mode's backend: the data directory. Topics and their partitions
//! (append, markers, the high watermark, producer state and its snapshots),
//! group commit, the coordinators' internal logs, producer-id blocks,
//! cut-overs and the log cleaner.

pub mod compaction;
pub mod cutovers;
pub mod datadir;
pub mod durability;
pub mod internal_log;
pub mod partition;
pub mod producer_ids;
pub mod snapshot;
pub mod topics;
pub mod writeback;
