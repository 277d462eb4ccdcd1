//! Helpers shared by the fuzz targets in `fuzz_targets/`.

use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Runs a future that never waits (its I/O is all in memory) to completion.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a future over in-memory I/O returned Pending"),
    }
}

/// A fresh directory for one input's files: under `$ONCELOG_FUZZ_TMP`, else
/// /dev/shm when there is one (no disk I/O for the many small files), else
/// the system temp dir. Removed when dropped.
pub fn scratch_dir() -> tempfile::TempDir {
    let base = std::env::var_os("ONCELOG_FUZZ_TMP")
        .map(PathBuf::from)
        .or_else(|| {
            let shm = PathBuf::from("/dev/shm");
            shm.is_dir().then_some(shm)
        })
        .unwrap_or_else(std::env::temp_dir);
    tempfile::Builder::new()
        .prefix("oncelog-fuzz-")
        .tempdir_in(base)
        .expect("temp dir")
}

/// Reads a big-endian u32 at `at`, if there are 4 bytes.
pub fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}
