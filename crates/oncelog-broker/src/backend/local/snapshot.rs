//! Producer-state snapshots: `<offset>.snapshot` in the partition directory
//! holds the producer state as of `offset` (everything before it applied).
//! Taken when a segment rolls, so a restart replays at most one segment.
//! A snapshot is a cache: an unreadable one is ignored and the state is
//! rebuilt from an older snapshot or from the log.

use std::path::{Path, PathBuf};

use crate::machines::producer_state::ProducerState;

const KEEP: usize = 3;

fn snapshots(dir: &Path) -> Vec<(i64, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<(i64, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let off = name.strip_suffix(".snapshot")?.parse::<i64>().ok()?;
            Some((off, e.path()))
        })
        .collect();
    v.sort_by_key(|(o, _)| *o);
    v
}

/// The newest readable snapshot at or below `max_offset`.
pub fn load_latest(dir: &Path, max_offset: i64) -> Option<(i64, ProducerState)> {
    for (off, path) in snapshots(dir).into_iter().rev() {
        if off > max_offset {
            continue;
        }
        match std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<ProducerState>(&b).map_err(|e| e.to_string()))
        {
            Ok(s) => return Some((off, s)),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable producer snapshot");
            }
        }
    }
    None
}

/// Writes the snapshot for `offset` and keeps only the newest few.
pub fn write(dir: &Path, offset: i64, state: &ProducerState) {
    let res = serde_json::to_vec(state)
        .map_err(|e| e.to_string())
        .and_then(|data| {
            crate::files::write_atomically(dir, &format!("{offset:020}.snapshot"), &data)
                .map_err(|e| e.to_string())
        });
    if let Err(e) = res {
        tracing::warn!(dir = %dir.display(), offset, error = %e, "producer snapshot not written; the log will be replayed instead");
        return;
    }
    let all = snapshots(dir);
    if all.len() > KEEP {
        for (_, p) in &all[..all.len() - KEEP] {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Removes snapshots beyond `offset` (after the log was cut back).
pub fn remove_after(dir: &Path, offset: i64) {
    for (off, p) in snapshots(dir) {
        if off > offset {
            let _ = std::fs::remove_file(p);
        }
    }
}
