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

/// A copy of `buf` with the CRC of every batch it holds (walked by their
/// length fields, as recovery does) recomputed, so that mutated batches get
/// past the CRC check and the code behind it is reached.
pub fn fix_crcs(buf: &[u8]) -> Vec<u8> {
    let mut out = buf.to_vec();
    let mut pos = 0usize;
    while pos + 61 <= out.len() {
        let len = i32::from_be_bytes([out[pos + 8], out[pos + 9], out[pos + 10], out[pos + 11]]);
        let Ok(len) = usize::try_from(len) else { break };
        if len < 49 || pos + 12 + len > out.len() {
            break;
        }
        let end = pos + 12 + len;
        if out[pos + 16] == 2 {
            let crc = crc32c::crc32c(&out[pos + 21..end]);
            out[pos + 17..pos + 21].copy_from_slice(&crc.to_be_bytes());
        }
        pos = end;
    }
    out
}

/// How a stream of request frames ends.
#[derive(Debug, PartialEq)]
pub enum End {
    Clean,
    Error(oncelog_broker::protocol::server::FrameReadError),
}

/// The frames of a whole stream, split in one go: the reference the
/// server's incremental `read_frame` is held to.
pub fn reference_split(mut s: &[u8], max: usize) -> (Vec<&[u8]>, End) {
    use oncelog_broker::protocol::server::{frame_size, FrameReadError};
    let mut frames = Vec::new();
    loop {
        if s.len() < 4 {
            return (frames, End::Clean);
        }
        let len = i32::from_be_bytes([s[0], s[1], s[2], s[3]]);
        let n = match frame_size(len, max) {
            Ok(n) => n,
            Err(e) => return (frames, End::Error(e)),
        };
        if s.len() - 4 < n {
            return (frames, End::Error(FrameReadError::Truncated));
        }
        frames.push(&s[4..4 + n]);
        s = &s[4 + n..];
    }
}
