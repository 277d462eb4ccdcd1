//! Lowers a thread's CPU priority, for background work (the log cleaner)
//! that should use the CPU the request path leaves and yield it under load.
#![allow(unsafe_code)]

/// Sets the calling thread's nice value to `nice` (higher = yields more).
pub fn lower_current_thread(nice: i32) -> std::io::Result<()> {
    // SAFETY: gettid and setpriority take and return plain integers and
    // touch no memory of ours. On Linux, PRIO_PROCESS with a thread id
    // changes that thread alone.
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
