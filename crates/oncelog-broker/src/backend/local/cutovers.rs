//! Local mode's cut-over store: every topic's latest cut-over in
//! `cutovers.json` in the data directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::TopicError;
use crate::files::{read_json, write_atomically};
use crate::machines::cutover::{Cutover, Phase};

pub const FILE: &str = "cutovers.json";

/// Every topic's latest cut-over, kept durable in the data dir
/// (`cutovers.json`, replaced whole at each change).
pub struct CutoverFile {
    /// `None` in cluster mode, whose cut-overs are the cluster's rows.
    dir: Option<PathBuf>,
    state: Mutex<BTreeMap<String, Cutover>>,
}

impl CutoverFile {
    pub fn open(data_dir: &Path) -> Result<Self, TopicError> {
        let state = read_json(data_dir, FILE)?;
        Ok(Self {
            dir: Some(data_dir.to_path_buf()),
            state: Mutex::new(state),
        })
    }

    /// Cluster mode's: holds none, and refuses a change.
    pub fn none() -> Self {
        Self {
            dir: None,
            state: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Cutover>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, topic: &str) -> Option<Cutover> {
        self.lock().get(topic).cloned()
    }

    pub fn all(&self) -> Vec<Cutover> {
        self.lock().values().cloned().collect()
    }

    /// Changes the topic's cut-over by `f` if it is still in `phase`; no
    /// write otherwise.
    pub fn update_if(
        &self,
        topic: &str,
        phase: Phase,
        f: impl FnOnce(&mut Cutover),
    ) -> Result<(), String> {
        let mut changed = false;
        let r = self.update(topic, |cur| match cur {
            Some(cur) if cur.phase == phase => {
                let mut n = cur.clone();
                f(&mut n);
                changed = true;
                Ok(Some(n))
            }
            // Not in `phase` (or gone): nothing to write.
            _ => Err(String::new()),
        });
        match r {
            Err(e) if changed => Err(e),
            _ => Ok(()),
        }
    }

    /// Forgets the cut-overs of topics `exists` says are gone (a topic
    /// deleted by a run that stopped before its cut-over was forgotten), so
    /// a topic created again under the name starts without one.
    pub fn forget_gone(&self, exists: impl Fn(&str) -> bool) -> Result<(), String> {
        for c in self.all() {
            if !exists(&c.topic) {
                self.update(&c.topic, |_| Ok(None))?;
            }
        }
        Ok(())
    }

    /// Changes the topic's cut-over to what `f` makes of the current one:
    /// durable first, then current. Changes are serialised.
    pub fn update(
        &self,
        topic: &str,
        f: impl FnOnce(Option<&Cutover>) -> Result<Option<Cutover>, String>,
    ) -> Result<Option<Cutover>, String> {
        let mut state = self.lock();
        let next_one = f(state.get(topic))?;
        let mut next = state.clone();
        match &next_one {
            Some(c) => next.insert(topic.to_string(), c.clone()),
            None => next.remove(topic),
        };
        let bytes = serde_json::to_vec_pretty(&next).map_err(|e| e.to_string())?;
        crate::files::local_dir(&self.dir)
            .and_then(|dir| write_atomically(dir, FILE, &bytes))
            .map_err(|e| e.to_string())?;
        *state = next;
        Ok(next_one)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machines::cutover::tests::draining;

    #[test]
    fn state_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let cs = CutoverFile::open(dir.path()).unwrap();
        assert!(cs.all().is_empty());
        let c = draining();
        cs.update("orders", |_| Ok(Some(c.clone()))).unwrap();
        let mut s = c.clone();
        s.phase = Phase::Switched;
        // A refused change changes nothing.
        assert!(cs.update("orders", |_| Err("no".into())).is_err());
        assert_eq!(cs.get("orders"), Some(c.clone()));
        cs.update("orders", |_| Ok(Some(s.clone()))).unwrap();
        let again = CutoverFile::open(dir.path()).unwrap();
        assert_eq!(again.get("orders"), Some(s));
        again.update("orders", |_| Ok(None)).unwrap();
        assert!(CutoverFile::open(dir.path())
            .unwrap()
            .get("orders")
            .is_none());
    }

    #[test]
    fn the_cut_overs_of_gone_topics_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let cs = CutoverFile::open(dir.path()).unwrap();
        cs.update("orders", |_| Ok(Some(draining()))).unwrap();
        cs.forget_gone(|t| t == "orders").unwrap();
        assert!(cs.get("orders").is_some());
        cs.forget_gone(|_| false).unwrap();
        assert!(CutoverFile::open(dir.path())
            .unwrap()
            .get("orders")
            .is_none());
    }
}
