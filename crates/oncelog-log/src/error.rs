//! The log engine's error.

use std::path::PathBuf;

use thiserror::Error;

use crate::batch;

#[derive(Debug, Error)]
pub enum LogError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("offset {offset} out of range [{start}, {end}]")]
    OffsetOutOfRange { offset: i64, start: i64, end: i64 },
    #[error("invalid batch: {0}")]
    Batch(#[from] batch::BatchError),
}
