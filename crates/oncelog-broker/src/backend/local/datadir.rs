//! The data directory: its layout, its single owner, and the names the
//! broker keeps for itself.
//!
//! ```text
//! <data.dir>/
//!   oncelog.lock                  flock()ed by the broker that owns the directory; holds its pid
//!   topics.json                   the topic catalogue (the commit point of create/delete)
//!   producer_ids.json             the next block of producer ids
//!   internal/__transaction_state-0   the transaction coordinator's log
//!   internal/__consumer_offsets-0    the group coordinator's log
//!   staging/<topic id>/<topic>-<p>   partitions of a topic being created or deleted
//!   <topic>-<p>/                  a user topic's partition
//! ```
//!
//! A user partition directory always ends in `-<digits>`; `internal` and
//! `staging` never do, so no topic name can map onto the coordinators' logs.
//! Data directories written before this layout kept the coordinators' logs
//! beside the topics; [`migrate`] moves them (a rename, safe to repeat after
//! a crash).

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use crate::error::TopicError;

/// Directory (under the data dir) of the coordinators' internal logs.
pub const INTERNAL_DIR: &str = "internal";
/// Directory (under the data dir) of partitions not yet (or no longer) in the catalogue.
pub const STAGING_DIR: &str = "staging";
const LOCK_FILE: &str = "oncelog.lock";
/// The internal logs, by their directory name.
pub const INTERNAL_LOGS: &[&str] = &["__transaction_state-0", "__consumer_offsets-0"];

pub fn internal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(INTERNAL_DIR)
}

pub fn staging_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(STAGING_DIR)
}

fn storage(what: impl std::fmt::Display) -> TopicError {
    TopicError::Storage(what.to_string())
}

/// fsyncs a directory so that entries created or renamed in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<(), TopicError> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| storage(format!("fsync directory {}: {e}", dir.display())))
}

/// Creates the data directory if it is missing; a path that exists but is
/// not a directory is an error that says so.
pub fn ensure_dir(dir: &Path) -> Result<(), TopicError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(TopicError::DataDir(format!(
            "data directory {} is not a directory",
            dir.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(dir)
            .map_err(|e| storage(format!("create data directory {}: {e}", dir.display()))),
        Err(e) => Err(storage(format!("data directory {}: {e}", dir.display()))),
    }
}

/// The exclusive lock on a data directory, held for the broker's lifetime
/// (the kernel drops it when the process ends, however it ends).
pub struct DirLock {
    _file: nix::fcntl::Flock<File>,
}

impl std::fmt::Debug for DirLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DirLock")
    }
}

/// Takes the data directory's lock, or fails at once naming the pid of the
/// broker that holds it. Two brokers on one directory would both
/// acknowledge writes to the same files, and one's would be lost.
pub fn lock(data_dir: &Path) -> Result<DirLock, TopicError> {
    use nix::fcntl::{Flock, FlockArg};
    // The lock is on the directory itself, so removing the pid file cannot
    // let a second broker in; the pid file only says who holds it.
    let dir = File::open(data_dir)
        .map_err(|e| storage(format!("open data directory {}: {e}", data_dir.display())))?;
    let path = data_dir.join(LOCK_FILE);
    match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
        Ok(held) => {
            let pid = std::process::id();
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .and_then(|mut f| {
                    f.set_len(0)?;
                    f.rewind()?;
                    writeln!(f, "{pid}")
                });
            if let Err(e) = written {
                tracing::warn!(path = %path.display(), error = %e, "could not write the pid to the lock file");
            }
            Ok(DirLock { _file: held })
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            if let Ok(mut f) = File::open(&path) {
                let _ = f.read_to_string(&mut holder);
            }
            let holder = holder.trim();
            let who = if holder.is_empty() {
                "another process".to_string()
            } else {
                format!("another oncelog process (pid {holder})")
            };
            Err(TopicError::DataDir(format!(
                "data directory {} is in use by {who}; stop it, or give this broker its own --data-dir",
                data_dir.display()
            )))
        }
        Err((_, e)) => Err(storage(format!("lock {}: {e}", path.display()))),
    }
}

/// Moves the coordinators' logs of an older layout into `internal/`.
/// Idempotent: after a crash half way, the next start finishes it.
pub fn migrate(data_dir: &Path) -> Result<(), TopicError> {
    let internal = internal_dir(data_dir);
    if !internal.is_dir() {
        std::fs::create_dir_all(&internal)
            .map_err(|e| storage(format!("create {}: {e}", internal.display())))?;
        sync_dir(data_dir)?;
    }
    for name in INTERNAL_LOGS {
        let old = data_dir.join(name);
        let new = internal.join(name);
        if !old.is_dir() {
            if !new.exists() {
                // the coordinator's log directory, durable before it is used
                std::fs::create_dir_all(&new)
                    .map_err(|e| storage(format!("create {}: {e}", new.display())))?;
                sync_dir(&internal)?;
            }
            continue;
        }
        if new.exists() {
            tracing::error!(old = %old.display(), kept = %new.display(),
                "an internal log exists in both layouts; keeping the one under internal/ and leaving the other untouched for an operator to inspect");
            continue;
        }
        std::fs::rename(&old, &new)
            .map_err(|e| storage(format!("move {} to {}: {e}", old.display(), new.display())))?;
        sync_dir(&internal)?;
        sync_dir(data_dir)?;
        tracing::info!(from = %old.display(), to = %new.display(), "internal log moved to the internal/ directory");
    }
    Ok(())
}

fn client_written_marker(data_dir: &Path, log: &str) -> PathBuf {
    internal_dir(data_dir).join(format!("{log}.client-written"))
}

/// Records that clients could write into an internal log (a data directory
/// from before internal names were reserved listed it as a topic), so its
/// coordinator may skip records it cannot decode instead of refusing to start.
pub fn mark_client_written(data_dir: &Path, topic: &str) -> Result<(), TopicError> {
    let internal = internal_dir(data_dir);
    std::fs::create_dir_all(&internal)
        .map_err(|e| storage(format!("create {}: {e}", internal.display())))?;
    let path = client_written_marker(data_dir, &format!("{topic}-0"));
    File::create(&path)
        .and_then(|f| f.sync_all())
        .map_err(|e| storage(format!("write {}: {e}", path.display())))?;
    sync_dir(&internal)
}

/// Whether the internal log `log` (e.g. `__consumer_offsets-0`) may hold
/// records written by clients (see [`mark_client_written`]).
pub fn client_written(data_dir: &Path, log: &str) -> bool {
    client_written_marker(data_dir, log).exists()
}

/// Raises this process's soft limit on open files to its hard limit and
/// returns the limit now in force (None if it cannot be read).
pub fn raise_open_files_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard {
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::warn!(soft, hard, error = %e, "could not raise the open files limit");
            return Some(soft);
        }
        return Some(hard);
    }
    Some(soft)
}

/// The current soft limit on open files.
pub fn open_files_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// Files this process has open now (from /proc; None where that is not available).
pub fn open_files_now() -> Option<u64> {
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path()).unwrap();
        let err = lock(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        assert!(err.contains("in use"), "{err}");
        drop(held);
        lock(dir.path()).unwrap();
    }

    #[test]
    fn a_file_is_not_a_data_directory() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("plain");
        std::fs::write(&f, b"x").unwrap();
        let err = ensure_dir(&f).unwrap_err().to_string();
        assert!(err.contains("is not a directory"), "{err}");
    }

    #[test]
    fn migration_moves_old_internal_logs_once() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("__consumer_offsets-0");
        std::fs::create_dir(&old).unwrap();
        std::fs::write(old.join("00000000000000000000.log"), b"abc").unwrap();
        migrate(dir.path()).unwrap();
        assert!(!old.exists());
        let moved = internal_dir(dir.path()).join("__consumer_offsets-0/00000000000000000000.log");
        assert_eq!(std::fs::read(&moved).unwrap(), b"abc");
        migrate(dir.path()).unwrap();
        assert_eq!(std::fs::read(&moved).unwrap(), b"abc");
    }
}

#[cfg(test)]
mod client_written_tests {
    use super::*;
    use crate::backend::local::internal_log::InternalLog;
    use crate::coordinators::groups::{GroupSettings, Groups};
    use crate::coordinators::txn_service::TxnService;

    fn settings() -> GroupSettings {
        GroupSettings {
            initial_rebalance_delay: std::time::Duration::ZERO,
            min_session_timeout_ms: 1,
            max_session_timeout_ms: 10,
            offsets_retention_ms: 1000,
            compact: crate::backend::local::internal_log::CompactPolicy { min_records: 100 },
        }
    }

    /// A record a client produced into a coordinator's log (possible before
    /// internal names were reserved) stops the coordinator from loading,
    /// unless the log is marked as client-written.
    #[test]
    fn coordinators_skip_client_records_only_when_marked() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        rt.block_on(async {
            for log in INTERNAL_LOGS {
                let (mut l, _) = InternalLog::open(dir.path(), log).unwrap();
                l.append(&[(Some(b"fare-writer-7".as_slice()), Some(b"boom".as_slice()))])
                    .unwrap();
            }
        });
        assert!(Groups::open(dir.path(), settings()).is_err());
        assert!(TxnService::open(
            dir.path(),
            crate::backend::local::internal_log::CompactPolicy { min_records: 100 }
        )
        .is_err());
        mark_client_written(dir.path(), "__consumer_offsets").unwrap();
        mark_client_written(dir.path(), "__transaction_state").unwrap();
        assert!(Groups::open(dir.path(), settings()).is_ok());
        assert!(TxnService::open(
            dir.path(),
            crate::backend::local::internal_log::CompactPolicy { min_records: 100 }
        )
        .is_ok());
    }
}
