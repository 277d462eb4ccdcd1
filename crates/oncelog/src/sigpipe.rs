//! A client command piped into `head` should end quietly when the reader
//! goes away, as Unix tools do. Rust ignores SIGPIPE, so a write to a
//! closed stdout fails and `println!` panics; restoring the default action
//! ends the process instead. Sockets are unaffected: the standard library
//! sends with MSG_NOSIGNAL. The broker (`serve`) keeps SIGPIPE ignored.
#![allow(unsafe_code)]

/// Restores SIGPIPE's default action (terminate) for this process.
pub fn default() {
    // SAFETY: signal() with SIG_DFL installs no handler of ours; it only
    // changes the disposition of SIGPIPE, before any thread writes stdout.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
