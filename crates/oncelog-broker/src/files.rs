//! Small durable files: JSON state written through a temporary file,
//! fsync and rename, and the stop when durable state is in doubt. Local
//! mode's stores (the catalogue, ACLs, SCRAM users, cut-overs, producer
//! ids) keep their state this way.

use std::path::Path;

use crate::error::TopicError;

/// Reads the JSON state file `name` in `dir` (written by
/// [`write_atomically`]); a missing file is the default state.
pub fn read_json<T: serde::de::DeserializeOwned + Default>(
    dir: &Path,
    name: &str,
) -> Result<T, TopicError> {
    let path = dir.join(name);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| TopicError::Storage(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(TopicError::Storage(format!("{}: {e}", path.display()))),
    }
}

/// Writes `name` in `dir` through a temporary file, fsync and rename, so a
/// crash leaves either the old or the new content.
pub fn write_atomically(dir: &Path, name: &str, data: &[u8]) -> Result<(), TopicError> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}.tmp"));
    let dst = dir.join(name);
    let res = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &dst)
    })();
    res.map_err(|e| TopicError::Storage(format!("write {}: {e}", dst.display())))?;
    // After the rename the new content may or may not survive a crash: the
    // caller can neither go on as if it did nor undo it. Stop; the next start
    // reads whichever content the disk kept and settles from there.
    if let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        fatal_storage(&format!(
            "fsync of {} after replacing {name} failed: {e}",
            dir.display()
        ));
    }
    Ok(())
}

/// Stops the process when durable state is in doubt: an fsync failed after a
/// change became visible, or a change could neither be finished nor undone.
/// Every such change is settled by the next start from what is on disk.
pub fn fatal_storage(what: &str) -> ! {
    tracing::error!(
        "{what}: stopping, so that the next start settles the change from what is on disk"
    );
    eprintln!("error: {what}");
    std::process::abort()
}

/// The directory a local store keeps its files in: `None` in cluster mode,
/// where the state is the cluster's and a broker keeps nothing on its
/// local disk, so a change there is refused rather than written anywhere.
pub fn local_dir(dir: &Option<std::path::PathBuf>) -> Result<&Path, TopicError> {
    dir.as_deref().ok_or_else(|| {
        TopicError::DataDir(
            "a cluster-mode broker keeps no state on its local disk; this change belongs to the cluster".into(),
        )
    })
}
