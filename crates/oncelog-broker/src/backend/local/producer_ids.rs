//! Producer id allocation. Ids are handed out from blocks whose upper bound
//! is made durable (`producer_ids.json`) before any id of the block is used,
//! so an id is never handed out twice, even across a crash.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::error::TopicError;
use crate::files::write_atomically;

const BLOCK: i64 = 1000;

#[derive(Serialize, Deserialize)]
struct Stored {
    next_block: i64,
}

pub struct ProducerIds {
    dir: Option<PathBuf>,
    /// (next id to hand out, end of the durable block)
    state: Mutex<(i64, i64)>,
}

impl ProducerIds {
    pub fn open(dir: &Path) -> Result<Self, TopicError> {
        let path = dir.join("producer_ids.json");
        let start = match std::fs::read(&path) {
            Ok(b) => {
                serde_json::from_slice::<Stored>(&b)
                    .map_err(|e| {
                        TopicError::Storage(format!("{} is not valid: {e}", path.display()))
                    })?
                    .next_block
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(TopicError::Storage(format!("read {}: {e}", path.display()))),
        };
        Ok(Self {
            dir: Some(dir.to_path_buf()),
            state: Mutex::new((start, start)),
        })
    }

    /// Cluster mode's: producer ids come from PostgreSQL; this hands out none.
    pub fn none() -> Self {
        Self {
            dir: None,
            state: Mutex::new((0, 0)),
        }
    }

    /// A producer id never handed out before.
    pub fn next(&self) -> Result<i64, TopicError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.0 >= st.1 {
            let end = st.1 + BLOCK;
            let data = serde_json::to_vec(&Stored { next_block: end })
                .map_err(|e| TopicError::Storage(e.to_string()))?;
            write_atomically(
                crate::files::local_dir(&self.dir)?,
                "producer_ids.json",
                &data,
            )?;
            st.1 = end;
        }
        let id = st.0;
        st.0 += 1;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_across_reopen() {
        let d = tempfile::tempdir().unwrap();
        let a = ProducerIds::open(d.path()).unwrap();
        let first: Vec<i64> = (0..5).map(|_| a.next().unwrap()).collect();
        assert_eq!(first, vec![0, 1, 2, 3, 4]);
        drop(a);
        let b = ProducerIds::open(d.path()).unwrap();
        let n = b.next().unwrap();
        assert!(n >= BLOCK, "{n}");
    }
}
