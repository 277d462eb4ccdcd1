//! Internal logs of coordinator state (`__transaction_state-0`,
//! `__consumer_offsets-0`): the same log engine as topics, holding
//! uncompressed batches of (key, value) records. Every append is fsynced
//! before it returns; a failed append is cut back so the log never holds a
//! change that was not acknowledged.

use std::path::Path;

use oncelog_log::batch::{self, BatchBuilder, BatchIter};
use oncelog_log::{Log, LogConfig, LogError};

use crate::topics::TopicError;

/// A record as stored: (key, value); a `None` value is a tombstone.
pub type Record = (Option<Vec<u8>>, Option<Vec<u8>>);

/// Why a change to an internal log was not made.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The record could not be encoded.
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
    /// The write or its fsync failed; the log was cut back.
    #[error(transparent)]
    Log(#[from] LogError),
}

pub struct InternalLog {
    log: Log,
}

impl InternalLog {
    /// Opens `data_dir/internal/name`, recovering its tail, and returns every record in order.
    pub fn open(data_dir: &Path, name: &str) -> Result<(Self, Vec<Record>), TopicError> {
        let config = LogConfig {
            segment_bytes: 100 << 20,
            retention_bytes: -1,
            retention_ms: -1,
            ..LogConfig::default()
        };
        let (log, report) = Log::open(&crate::datadir::internal_dir(data_dir).join(name), config)?;
        if report.bytes_dropped > 0 {
            tracing::warn!(
                log = name,
                bytes_dropped = report.bytes_dropped,
                "internal log tail truncated at recovery"
            );
        }
        let mut records = Vec::new();
        let mut offset = log.log_start_offset();
        let end = log.next_offset();
        while offset < end {
            let chunk = log.read(offset, 4 << 20, end, true)?;
            if chunk.is_empty() {
                break;
            }
            for item in BatchIter::new(&chunk) {
                let (at, h) = item.map_err(|e| TopicError::Storage(format!("{name}: {e}")))?;
                let whole = &chunk[at..at + h.total_size()];
                let recs = batch::records(whole).ok_or_else(|| {
                    TopicError::Storage(format!(
                        "{name}: undecodable batch at offset {}",
                        h.base_offset()
                    ))
                })?;
                for (k, v) in recs {
                    records.push((k.map(<[u8]>::to_vec), v.map(<[u8]>::to_vec)));
                }
                offset = h.next_offset();
            }
        }
        Ok((Self { log }, records))
    }

    /// Appends the records as one batch and fsyncs it.
    pub fn append(&mut self, records: &[batch::KeyValue<'_>]) -> Result<(), LogError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut bb = BatchBuilder::new(crate::now_ms());
        for (i, (k, v)) in records.iter().enumerate() {
            bb = bb.record(i as i64, *k, *v);
        }
        let mut b = bb.build();
        let before = self.log.next_offset();
        let log = &mut self.log;
        let res = tokio::task::block_in_place(|| -> Result<(), LogError> {
            log.append(&mut b)?;
            log.sync()
        });
        if let Err(e) = &res {
            tracing::error!(dir = %self.log.dir().display(), error = %e, "internal log write failed; change not made");
            if let Err(te) = self.log.truncate_to(before) {
                tracing::error!(error = %te, "could not cut back the internal log");
            }
        }
        res
    }
}
