//! Starting writeback of freshly written log bytes early, for interval-flush
//! mode. Left alone, the kernel keeps up to a whole flush interval of appends
//! dirty, and the periodic fdatasync then writes it all at once; on ext4 the
//! journal commit that goes with it holds up appends that extend the file
//! (hundreds of ms at ~1 GB/s). Asking for writeback every few tens of ms
//! spreads the same bytes out, so the fdatasync finds little left to do.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;

/// Asks the kernel to start writing `[offset, offset + len)` of `file` back
/// to disk, without waiting (`sync_file_range(SYNC_FILE_RANGE_WRITE)`). A
/// hint: durability still comes from fdatasync.
pub fn start(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let (Ok(off), Ok(n)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len),
    ) else {
        return Ok(());
    };
    // SAFETY: plain syscall on a file descriptor that `file` keeps open for
    // the duration of the call; no memory is passed.
    let rc =
        unsafe { libc::sync_file_range(file.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
