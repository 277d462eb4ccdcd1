//! Topics and partitions: the durable topic catalogue (`topics.json`,
//! replaced atomically) and the partitions it opens (see [`crate::backend::local::partition`]
//! for a partition's log, high watermark and writes).
//!
//! The high watermark is the end of the durable prefix of the log: with
//! fsync-before-ack (the default) a consumer never sees a byte that a crash
//! could take back. In interval-flush mode it follows the log end offset.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};

use oncelog_log::{Log, LogConfig};

pub use crate::backend::local::partition::{
    producer_batch, replay_batch, Partition, PartitionState, WriteMode,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::backend::local::datadir;
use crate::backend::topic::{check_new_topic, CleanupPolicy, TopicMeta};
use crate::config::BrokerConfig;
use crate::error::TopicError;
use crate::files::{fatal_storage, write_atomically};
use crate::machines::names;
use oncelog_log::now_ms;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Catalogue {
    cluster_id: String,
    topics: Vec<TopicMeta>,
}

pub struct Topic {
    pub meta: RwLock<TopicMeta>,
    pub partitions: RwLock<Vec<Arc<Partition>>>,
}

impl std::fmt::Debug for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topic").field("meta", &self.meta()).finish()
    }
}

impl Topic {
    /// Partition `i` as the protocol code sees it (the storage boundary).
    pub fn store(&self, i: i32) -> Option<Arc<dyn crate::backend::storage::PartitionStore>> {
        self.partition(i)
            .map(|p| p as Arc<dyn crate::backend::storage::PartitionStore>)
    }

    pub fn partition(&self, i: i32) -> Option<Arc<Partition>> {
        let ps = self.partitions.read().unwrap_or_else(|p| p.into_inner());
        usize::try_from(i).ok().and_then(|i| ps.get(i).cloned())
    }
    pub fn partition_count(&self) -> i32 {
        self.partitions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len() as i32
    }
    pub fn meta(&self) -> TopicMeta {
        self.meta.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The outcome of opening one partition's log.
type OpenResult = Result<Arc<Partition>, TopicError>;

pub struct Topics {
    /// `None` in cluster mode: the topics are the cluster's, and this
    /// holds none and refuses every change.
    dir: Option<PathBuf>,
    config: BrokerConfig,
    cluster_id: String,
    map: RwLock<HashMap<String, Arc<Topic>>>,
    /// Serializes catalogue changes (create, delete, alter) and their file write.
    write_lock: Mutex<()>,
    /// How every partition's writes become durable.
    mode: WriteMode,
}

impl Topics {
    /// Loads the catalogue and opens (recovering) every partition log; their
    /// writes become durable as `mode` says.
    pub fn open(config: &BrokerConfig, mode: WriteMode) -> Result<Self, TopicError> {
        let dir = config.data_dir.clone();
        crate::backend::local::datadir::ensure_dir(&dir)?;
        let path = dir.join("topics.json");
        let mut cat: Catalogue = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                TopicError::Storage(format!("{} is not valid: {e}", path.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Catalogue {
                cluster_id: Uuid::new_v4().simple().to_string(),
                topics: Vec::new(),
            },
            Err(e) => return Err(TopicError::Storage(format!("read {}: {e}", path.display()))),
        };
        // A data directory from before internal names were reserved may
        // list a client-created topic of such a name; its partition 0 was
        // the coordinator's own log. The log stays the coordinator's.
        for m in cat
            .topics
            .iter()
            .filter(|m| names::is_internal_topic(&m.name))
        {
            // Clients may have produced into the coordinator's log: let it
            // skip records it did not write (before the catalogue forgets).
            datadir::mark_client_written(&dir, &m.name)?;
            tracing::error!(topic = %m.name, partitions = m.partitions,
                "dropping a client-created topic with an internal name from the catalogue; its partition directories other than -0 are left in place");
        }
        cat.topics.retain(|m| !names::is_internal_topic(&m.name));
        finish_staged(&dir, &cat.topics)?;
        let topics = Self {
            dir: Some(dir),
            config: config.clone(),
            cluster_id: cat.cluster_id.clone(),
            map: RwLock::new(HashMap::new()),
            write_lock: Mutex::new(()),
            mode,
        };
        let started = std::time::Instant::now();
        let mut opened = topics.open_partitions(&cat.topics).into_iter();
        let mut map = HashMap::new();
        for meta in cat.topics {
            let mut parts = Vec::with_capacity(meta.partitions.max(0) as usize);
            for _ in 0..meta.partitions {
                let p = opened
                    .next()
                    .ok_or_else(|| TopicError::Storage("a partition log was not opened".into()))?;
                parts.push(p?);
            }
            let name = meta.name.clone();
            map.insert(
                name,
                Arc::new(Topic {
                    meta: RwLock::new(meta),
                    partitions: RwLock::new(parts),
                }),
            );
        }
        tracing::info!(
            topics = map.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "logs opened"
        );
        *topics.map.write().unwrap_or_else(|p| p.into_inner()) = map;
        topics.persist()?;
        Ok(topics)
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// Cluster mode's: no topics, no directory; every change is refused.
    pub fn none(config: &BrokerConfig, mode: WriteMode) -> Self {
        Self {
            dir: None,
            config: config.clone(),
            cluster_id: String::new(),
            map: RwLock::new(HashMap::new()),
            write_lock: Mutex::new(()),
            mode,
        }
    }

    fn dir(&self) -> Result<&Path, TopicError> {
        crate::files::local_dir(&self.dir)
    }

    fn partition_dir(&self, topic: &str, p: i32) -> Result<PathBuf, TopicError> {
        Ok(self.dir()?.join(format!("{topic}-{p}")))
    }

    pub fn log_config(&self, meta: &TopicMeta) -> LogConfig {
        let get = |k: &str| -> i64 {
            meta.configs
                .get(k)
                .cloned()
                .or_else(|| self.config.topic_default(k))
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(-1)
        };
        let policy = self.cleanup_policy(meta);
        // A compact-only topic keeps every key's last record however old;
        // time and size retention are for `delete`.
        let (retention_bytes, retention_ms) = if policy.delete {
            (get("retention.bytes"), get("retention.ms"))
        } else {
            (-1, -1)
        };
        let mut segment_ms = get("segment.ms");
        if policy.compact {
            // The active segment is never cleaned: roll it once its records
            // reach max.compaction.lag.ms, so they become cleanable.
            let lag = get("max.compaction.lag.ms");
            if lag > 0 && (segment_ms <= 0 || lag < segment_ms) {
                segment_ms = lag;
            }
        }
        LogConfig {
            segment_bytes: get("segment.bytes").max(1024) as u64,
            segment_ms,
            index_interval_bytes: get("index.interval.bytes").max(1) as u64,
            retention_bytes,
            retention_ms,
        }
    }

    /// A topic's cleanup.policy (its own, or the broker's default).
    pub fn cleanup_policy(&self, meta: &TopicMeta) -> CleanupPolicy {
        let text = meta
            .configs
            .get("cleanup.policy")
            .cloned()
            .unwrap_or_else(|| self.config.cleanup_policy.clone());
        CleanupPolicy::parse(&text)
    }

    /// A topic config's value (its own, or the broker's default), as text.
    pub fn topic_config(&self, meta: &TopicMeta, key: &str) -> Option<String> {
        meta.configs
            .get(key)
            .cloned()
            .or_else(|| self.config.topic_default(key))
    }

    pub fn max_message_bytes(&self, meta: &TopicMeta) -> i64 {
        meta.configs
            .get("max.message.bytes")
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.config.message_max_bytes)
    }

    fn open_partition(&self, meta: &TopicMeta, p: i32) -> Result<Arc<Partition>, TopicError> {
        let dir = self.partition_dir(&meta.name, p)?;
        let (log, report) = Log::open(&dir, self.log_config(meta))?;
        if report.bytes_dropped > 0 {
            tracing::warn!(
                partition = %format!("{}-{}", meta.name, p),
                bytes_dropped = report.bytes_dropped,
                reason = report.problem.as_deref().unwrap_or(""),
                "recovery truncated torn or corrupt tail: bytes_dropped={}",
                report.bytes_dropped
            );
        }
        Ok(Partition::new(meta.name.clone(), p, log, self.mode.clone()))
    }

    /// Opens (recovering) every partition of `metas`, in that order, on up
    /// to 16 threads: each open reads a few small pieces of its files, and
    /// with the data out of the page cache those reads wait on the disk one
    /// after another if done serially (5 GB in 100 partitions: 2.1 s).
    fn open_partitions(&self, metas: &[TopicMeta]) -> Vec<Result<Arc<Partition>, TopicError>> {
        let jobs: Vec<(usize, i32)> = metas
            .iter()
            .enumerate()
            .flat_map(|(ti, m)| (0..m.partitions).map(move |p| (ti, p)))
            .collect();
        let results: Vec<Mutex<Option<OpenResult>>> =
            jobs.iter().map(|_| Mutex::new(None)).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(ti, p)) = jobs.get(i) else { break };
            let r = self.open_partition(&metas[ti], p);
            *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        };
        std::thread::scope(|s| {
            for n in 0..jobs.len().clamp(1, 16) {
                let spawned = std::thread::Builder::new()
                    .name(format!("oncelog-open-{n}"))
                    .spawn_scoped(s, work);
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "could not start a log-opening thread");
                    break;
                }
            }
        });
        // whatever no thread got to (none could start) is opened here
        work();
        results
            .into_iter()
            .map(|m| {
                m.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .unwrap_or_else(|| {
                        Err(TopicError::Storage("a partition log was not opened".into()))
                    })
            })
            .collect()
    }

    /// The catalogue as it stands in memory.
    fn metas(&self) -> Vec<TopicMeta> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|t| t.meta())
            .collect()
    }

    fn persist(&self) -> Result<(), TopicError> {
        self.write_catalogue(self.metas())
    }

    /// Writes `topics` as the catalogue, atomically: the commit point of
    /// every create, delete and partition increase.
    fn write_catalogue(&self, mut topics: Vec<TopicMeta>) -> Result<(), TopicError> {
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        let cat = Catalogue {
            cluster_id: self.cluster_id.clone(),
            topics,
        };
        let data = serde_json::to_vec_pretty(&cat)
            .map_err(|e| TopicError::Storage(format!("encode catalogue: {e}")))?;
        write_atomically(self.dir()?, "topics.json", &data)
    }

    fn staged_dir(&self, id: Uuid) -> Result<PathBuf, TopicError> {
        Ok(datadir::staging_dir(self.dir()?).join(id.simple().to_string()))
    }

    /// Partitions held by the broker now.
    pub fn partition_total(&self) -> i64 {
        self.all()
            .iter()
            .map(|t| i64::from(t.partition_count()))
            .sum()
    }

    /// The partition limits and the open-files budget, checked before
    /// anything is written.
    fn check_capacity(&self, adding: i32) -> Result<(), TopicError> {
        let total = self.partition_total();
        let max = self.config.max_partitions;
        if total + i64::from(adding) > max {
            return Err(TopicError::InvalidPartitions(format!(
                "the broker holds {total} partitions; {adding} more would exceed max.partitions {max}"
            )));
        }
        if let Some(limit) = datadir::open_files_limit() {
            let open =
                datadir::open_files_now().unwrap_or(total.max(0) as u64 * FILES_PER_PARTITION);
            let reserve = (limit / 4).min(1024);
            let need = adding.max(0) as u64 * FILES_PER_PARTITION;
            if open.saturating_add(need).saturating_add(reserve) > limit {
                return Err(TopicError::InvalidPartitions(format!(
                    "{adding} new partitions need about {need} open files; the broker has {open} open \
                     and may open {limit}, keeping {reserve} for connections: raise its open files \
                     limit (ulimit -n, systemd LimitNOFILE=) or create fewer partitions"
                )));
            }
        }
        Ok(())
    }

    /// Creates partitions `from..to` of `meta` under `staging/<topic id>/`
    /// and checks that their logs open. On failure nothing is left.
    fn stage(&self, meta: &TopicMeta, from: i32, to: i32) -> Result<(), TopicError> {
        let staged = self.staged_dir(meta.id)?;
        let res = (|| -> Result<(), TopicError> {
            std::fs::create_dir_all(&staged)
                .map_err(|e| TopicError::Storage(format!("create {}: {e}", staged.display())))?;
            for p in from..to {
                let d = staged.join(format!("{}-{p}", meta.name));
                Log::open(&d, self.log_config(meta))?;
            }
            datadir::sync_dir(&staged)?;
            datadir::sync_dir(&datadir::staging_dir(self.dir()?))
        })();
        if res.is_err() {
            self.unstage(meta, from, to);
        }
        res
    }

    /// Removes staged partitions `from..to` of `meta` (only those: nothing
    /// else under `staging/<topic id>/` is this change's).
    fn unstage(&self, meta: &TopicMeta, from: i32, to: i32) {
        let (Ok(dir), Ok(staged)) = (self.dir(), self.staged_dir(meta.id)) else {
            return;
        };
        for p in from..to {
            remove_quietly(&staged.join(format!("{}-{p}", meta.name)));
        }
        let _ = std::fs::remove_dir(&staged);
        let _ = std::fs::remove_dir(datadir::staging_dir(dir));
    }

    /// Moves staged partitions `from..to` of a committed change into place
    /// and opens them.
    fn install(
        &self,
        meta: &TopicMeta,
        from: i32,
        to: i32,
    ) -> Result<Vec<Arc<Partition>>, TopicError> {
        move_staged(self.dir()?, meta, from, to)?;
        crate::faults::fail_point("topic-installed");
        (from..to).map(|p| self.open_partition(meta, p)).collect()
    }

    /// Undoes a change whose install failed after its catalogue write:
    /// writes `catalogue` back and removes partitions `from..to`. If the
    /// catalogue cannot be written either, the files stay and the next start
    /// completes the change.
    fn roll_back(
        &self,
        meta: &TopicMeta,
        from: i32,
        to: i32,
        catalogue: Vec<TopicMeta>,
        cause: &TopicError,
    ) {
        tracing::error!(topic = %meta.name, error = %cause, "topic change failed after its catalogue write; undoing it");
        match self.write_catalogue(catalogue) {
            Ok(()) => {
                for p in (from..to).filter_map(|p| self.partition_dir(&meta.name, p).ok()) {
                    remove_quietly(&p);
                }
                self.unstage(meta, from, to);
            }
            // Memory and disk would disagree from here on.
            Err(e) => fatal_storage(&format!(
                "could not undo the failed change of topic {}: {e}",
                meta.name
            )),
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<Topic>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<Topic>> {
        crate::backend::sorted_values(&self.map, |t| t.meta().name)
    }

    pub fn all_partitions(&self) -> Vec<Arc<Partition>> {
        self.all()
            .iter()
            .flat_map(|t| {
                t.partitions
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
            })
            .collect()
    }

    /// Creates a topic (or only checks that it could be, with `validate_only`).
    ///
    /// All partitions or none: they are made under `staging/`, the catalogue
    /// write commits the topic, then they are moved into place. A crash
    /// before the catalogue write leaves nothing after the next start; a
    /// crash after it is completed by the next start.
    pub fn create(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<Arc<Topic>, TopicError> {
        let partitions = if partitions == -1 {
            self.config.num_partitions
        } else {
            partitions
        };
        check_new_topic(
            name,
            partitions,
            &configs,
            self.config.max_partitions_per_topic,
        )?;
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.get(name).is_some() {
            return Err(TopicError::AlreadyExists(name.into()));
        }
        self.check_capacity(partitions)?;
        let meta = TopicMeta {
            name: name.into(),
            id: Uuid::new_v4(),
            partitions,
            configs,
        };
        if validate_only {
            return Ok(Arc::new(Topic {
                meta: RwLock::new(meta),
                partitions: RwLock::new(Vec::new()),
            }));
        }
        self.stage(&meta, 0, partitions)?;
        crate::faults::fail_point("topic-create-staged");
        let before = self.metas();
        let mut after = before.clone();
        after.push(meta.clone());
        if let Err(e) = self.write_catalogue(after) {
            self.unstage(&meta, 0, partitions);
            return Err(e);
        }
        crate::faults::fail_point("topic-create-committed");
        let parts = match self.install(&meta, 0, partitions) {
            Ok(parts) => parts,
            Err(e) => {
                self.roll_back(&meta, 0, partitions, before, &e);
                return Err(e);
            }
        };
        let t = Arc::new(Topic {
            meta: RwLock::new(meta),
            partitions: RwLock::new(parts),
        });
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), t.clone());
        tracing::info!(topic = name, partitions, "topic created");
        Ok(t)
    }

    /// Deletes a topic: its partitions are moved under `staging/`, the
    /// catalogue write commits the deletion, then they are removed. A crash
    /// before the catalogue write brings the topic back whole at the next
    /// start. With `id` (DeleteTopics v6+), the topic must still be that one.
    ///
    /// Every partition is closed under its lock first and stays locked
    /// through the change: appends, markers, retention and truncation reach
    /// files by path, and after the deletion those paths may be a new topic's.
    pub fn delete(&self, name: &str, id: Option<Uuid>) -> Result<(), TopicError> {
        if names::is_internal_topic(name) {
            return Err(TopicError::Internal {
                topic: name.into(),
                action: "delete",
            });
        }
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let t = self
            .get(name)
            .ok_or_else(|| TopicError::Unknown(name.into()))?;
        let meta = t.meta();
        if let Some(id) = id.filter(|id| !id.is_nil()) {
            if id != meta.id {
                return Err(TopicError::UnknownId(id));
            }
        }
        let parts = t
            .partitions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let dir = self.dir()?;
        let staged = self.staged_dir(meta.id)?;
        // Closed under their locks for the whole change: nothing of the old
        // topic is read or written meanwhile, nor written after.
        Partition::closing_all(&parts, || -> Result<(), TopicError> {
            let moved = (|| -> Result<(), TopicError> {
                std::fs::create_dir_all(&staged).map_err(|e| {
                    TopicError::Storage(format!("create {}: {e}", staged.display()))
                })?;
                datadir::sync_dir(&datadir::staging_dir(dir))?;
                datadir::sync_dir(dir)?;
                for p in 0..meta.partitions {
                    let src = self.partition_dir(name, p)?;
                    let dst = staged.join(format!("{name}-{p}"));
                    if src.exists() {
                        std::fs::rename(&src, &dst).map_err(|e| {
                            TopicError::Storage(format!("move {}: {e}", src.display()))
                        })?;
                    }
                }
                datadir::sync_dir(&staged)?;
                datadir::sync_dir(dir)
            })();
            crate::faults::fail_point("topic-delete-staged");
            let committed = moved.and_then(|()| {
                self.write_catalogue(
                    self.metas()
                        .into_iter()
                        .filter(|m| m.name != name)
                        .collect(),
                )
            });
            if let Err(e) = committed {
                // Still in the catalogue: put back whatever was moved, then reopen.
                if let Err(e2) = move_staged(dir, &meta, 0, meta.partitions) {
                    fatal_storage(&format!(
                        "could not move the partitions of {name} back after a failed delete: {e2}"
                    ));
                }
                return Err(e);
            }
            crate::faults::fail_point("topic-delete-committed");
            self.map
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(name);
            Ok(())
        })?;
        drop(std::mem::take(
            &mut *t.partitions.write().unwrap_or_else(|p| p.into_inner()),
        ));
        remove_quietly(&staged);
        let _ = std::fs::remove_dir(datadir::staging_dir(dir));
        tracing::info!(topic = name, "topic deleted");
        Ok(())
    }

    pub fn add_partitions(
        &self,
        name: &str,
        count: i32,
        validate_only: bool,
    ) -> Result<(), TopicError> {
        if names::is_internal_topic(name) {
            return Err(TopicError::Internal {
                topic: name.into(),
                action: "add partitions to",
            });
        }
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let t = self
            .get(name)
            .ok_or_else(|| TopicError::Unknown(name.into()))?;
        let meta = t.meta();
        let cur = t.partition_count();
        if count <= cur {
            return Err(TopicError::InvalidPartitions(format!(
                "topic currently has {cur} partitions, {count} would not be an increase"
            )));
        }
        let max = self.config.max_partitions_per_topic;
        if count > max {
            return Err(TopicError::InvalidPartitions(format!(
                "{count} partitions exceeds max.partitions.per.topic ({max})"
            )));
        }
        self.check_capacity(count - cur)?;
        if validate_only {
            return Ok(());
        }
        self.stage(&meta, cur, count)?;
        crate::faults::fail_point("topic-add-partitions-staged");
        let before = self.metas();
        let after = before
            .iter()
            .cloned()
            .map(|mut m| {
                if m.name == name {
                    m.partitions = count;
                }
                m
            })
            .collect();
        if let Err(e) = self.write_catalogue(after) {
            self.unstage(&meta, cur, count);
            return Err(e);
        }
        crate::faults::fail_point("topic-add-partitions-committed");
        let new = match self.install(&meta, cur, count) {
            Ok(new) => new,
            Err(e) => {
                self.roll_back(&meta, cur, count, before, &e);
                return Err(e);
            }
        };
        t.partitions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .extend(new);
        t.meta.write().unwrap_or_else(|p| p.into_inner()).partitions = count;
        tracing::info!(topic = name, from = cur, to = count, "partitions added");
        Ok(())
    }

    /// Replaces a topic's configs and applies the log settings to its partitions.
    pub fn set_configs(
        &self,
        name: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<(), TopicError> {
        self.update_configs(name, |_| Ok(configs))
    }

    /// Replaces a topic's configs by what `change` makes of the current
    /// ones, read and written under the catalogue's write lock: two
    /// alterations at once each see the other's result, none is lost.
    pub fn update_configs(
        &self,
        name: &str,
        change: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
    ) -> Result<(), TopicError> {
        if names::is_internal_topic(name) {
            return Err(TopicError::Internal {
                topic: name.into(),
                action: "alter",
            });
        }
        let _w = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let t = self
            .get(name)
            .ok_or_else(|| TopicError::Unknown(name.into()))?;
        let configs = change(&t.meta().configs)?;
        for (k, v) in &configs {
            crate::config::validate_topic_config(k, v)
                .map_err(|e| TopicError::InvalidConfig(e.0))?;
        }
        if configs == t.meta().configs {
            return Ok(());
        }
        // Saved before it is acted on: a retention change must never delete
        // segments on the strength of a setting that was not kept.
        let mut meta = t.meta();
        meta.configs = configs;
        let after = self
            .metas()
            .into_iter()
            .map(|m| if m.name == name { meta.clone() } else { m })
            .collect();
        self.write_catalogue(after)?;
        *t.meta.write().unwrap_or_else(|p| p.into_inner()) = meta.clone();
        let lc = self.log_config(&meta);
        for p in t
            .partitions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            p.set_config(lc.clone());
        }
        Ok(())
    }

    /// Runs retention on every partition.
    pub fn apply_retention(&self) {
        let now = now_ms();
        let producer_cutoff = now - self.config.producer_id_expiration_ms;
        for p in self.all_partitions() {
            p.apply_retention(now, producer_cutoff);
        }
    }
}

/// Open files a new partition holds: its segment, offset index and time index.
pub const FILES_PER_PARTITION: u64 = 3;

fn remove_quietly(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "could not remove"),
    }
}

/// Moves partitions `from..to` of `meta` from `staging/<topic id>/` into the
/// data directory, replacing any leftover directory of the same name (a
/// deleted topic's must not come back to life). Partitions already in place
/// are left alone, so this is safe to repeat.
fn move_staged(dir: &Path, meta: &TopicMeta, from: i32, to: i32) -> Result<(), TopicError> {
    let staged = datadir::staging_dir(dir).join(meta.id.simple().to_string());
    if !staged.is_dir() {
        return Ok(());
    }
    for p in from..to {
        let src = staged.join(format!("{}-{p}", meta.name));
        if !src.is_dir() {
            continue;
        }
        let dst = dir.join(format!("{}-{p}", meta.name));
        if dst.exists() {
            std::fs::remove_dir_all(&dst)
                .map_err(|e| TopicError::Storage(format!("remove stale {}: {e}", dst.display())))?;
        }
        std::fs::rename(&src, &dst)
            .map_err(|e| TopicError::Storage(format!("move {}: {e}", src.display())))?;
    }
    datadir::sync_dir(dir)?;
    datadir::sync_dir(&staged)?;
    let _ = std::fs::remove_dir(&staged);
    // only removed when empty: another change may be staged there
    let _ = std::fs::remove_dir(datadir::staging_dir(dir));
    Ok(())
}

/// At start: completes every topic change the catalogue committed whose
/// partitions are still under `staging/`, then removes what is left there
/// (changes that were never committed, and committed deletions).
fn finish_staged(dir: &Path, topics: &[TopicMeta]) -> Result<(), TopicError> {
    let staging = datadir::staging_dir(dir);
    if !staging.is_dir() {
        return Ok(());
    }
    for m in topics {
        let staged = staging.join(m.id.simple().to_string());
        if staged.is_dir() {
            tracing::info!(topic = %m.name, "completing a topic change interrupted by a stop");
            move_staged(dir, m, 0, m.partitions)?;
        }
    }
    let left: Vec<String> = std::fs::read_dir(&staging)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if !left.is_empty() {
        tracing::info!(
            entries = left.len(),
            "removing uncommitted or deleted partitions from staging/"
        );
    }
    match std::fs::remove_dir_all(&staging) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(TopicError::Storage(format!(
                "clear {}: {e}",
                staging.display()
            )))
        }
    }
    datadir::sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval() -> WriteMode {
        WriteMode::Interval(Arc::new(tokio::sync::Notify::new()))
    }

    fn config(dir: &Path) -> BrokerConfig {
        let mut m = BTreeMap::new();
        m.insert("data.dir".to_string(), dir.display().to_string());
        m.insert("max.partitions.per.topic".to_string(), "50".to_string());
        BrokerConfig::from_map(&m).unwrap()
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn internal_names_cannot_be_created_deleted_or_altered() {
        let dir = tempfile::tempdir().unwrap();
        let topics = Topics::open(&config(dir.path()), interval()).unwrap();
        for name in names::INTERNAL_TOPICS {
            let e = topics.create(name, 1, BTreeMap::new(), false).unwrap_err();
            assert!(
                matches!(
                    e,
                    TopicError::Internal {
                        action: "create",
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("internal topic"), "{e}");
            let e = topics.delete(name, None).unwrap_err();
            assert!(
                matches!(
                    e,
                    TopicError::Internal {
                        action: "delete",
                        ..
                    }
                ),
                "{e}"
            );
            let e = topics.add_partitions(name, 2, false).unwrap_err();
            assert!(matches!(e, TopicError::Internal { .. }), "{e}");
            let e = topics.set_configs(name, BTreeMap::new()).unwrap_err();
            assert!(matches!(e, TopicError::Internal { .. }), "{e}");
        }
        assert_eq!(entries(dir.path()), vec!["topics.json"]);
    }

    #[test]
    fn limits_are_checked_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let topics = Topics::open(&config(dir.path()), interval()).unwrap();
        let e = topics
            .create("big", 51, BTreeMap::new(), false)
            .unwrap_err();
        assert!(e.to_string().contains("max.partitions.per.topic"), "{e}");
        topics.create("t", 2, BTreeMap::new(), false).unwrap();
        let e = topics.add_partitions("t", 51, false).unwrap_err();
        assert!(e.to_string().contains("max.partitions.per.topic"), "{e}");
        assert_eq!(entries(dir.path()), vec!["t-0", "t-1", "topics.json"]);
    }

    #[test]
    fn a_failed_create_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let topics = Topics::open(&config(dir.path()), interval()).unwrap();
        // A plain file where partition 3 goes makes the install fail after
        // the catalogue write: the change must be undone.
        std::fs::write(dir.path().join("x-3"), b"in the way").unwrap();
        let e = topics.create("x", 5, BTreeMap::new(), false).unwrap_err();
        assert!(matches!(e, TopicError::Storage(_)), "{e}");
        assert!(topics.get("x").is_none());
        assert_eq!(entries(dir.path()), vec!["topics.json", "x-3"]);
        drop(topics);
        let topics = Topics::open(&config(dir.path()), interval()).unwrap();
        assert!(topics.get("x").is_none());
        assert_eq!(entries(dir.path()), vec!["topics.json", "x-3"]);
    }

    #[test]
    fn start_completes_committed_changes_and_drops_uncommitted_ones() {
        let dir = tempfile::tempdir().unwrap();
        let topics = Topics::open(&config(dir.path()), interval()).unwrap();
        topics.create("kept", 3, BTreeMap::new(), false).unwrap();
        let meta = topics.get("kept").unwrap().meta();
        drop(topics);
        // As a crash right after the catalogue write would leave it: the
        // partitions still under staging/.
        let staged = datadir::staging_dir(dir.path()).join(meta.id.simple().to_string());
        std::fs::create_dir_all(&staged).unwrap();
        for p in 0..3 {
            std::fs::rename(
                dir.path().join(format!("kept-{p}")),
                staged.join(format!("kept-{p}")),
            )
            .unwrap();
        }
        // And an uncommitted create of another topic.
        let orphan = datadir::staging_dir(dir.path()).join("0123");
        std::fs::create_dir_all(orphan.join("gone-0")).unwrap();
        let topics = Topics::open(&config(dir.path()), interval()).unwrap();
        assert_eq!(topics.get("kept").unwrap().partition_count(), 3);
        assert_eq!(
            entries(dir.path()),
            vec!["kept-0", "kept-1", "kept-2", "topics.json"]
        );
    }

    #[test]
    fn delete_removes_every_partition_and_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        let topics = Topics::open(&config(dir.path()), interval()).unwrap();
        topics.create("d", 4, BTreeMap::new(), false).unwrap();
        topics.add_partitions("d", 6, false).unwrap();
        assert_eq!(topics.get("d").unwrap().partition_count(), 6);
        let id = topics.get("d").unwrap().meta().id;
        let e = topics.delete("d", Some(Uuid::new_v4())).unwrap_err();
        assert!(matches!(e, TopicError::UnknownId(_)), "{e}");
        topics.delete("d", Some(id)).unwrap();
        assert_eq!(entries(dir.path()), vec!["topics.json"]);
        drop(topics);
        let topics = Topics::open(&config(dir.path()), interval()).unwrap();
        assert!(topics.get("d").is_none());
        assert_eq!(entries(dir.path()), vec!["topics.json"]);
    }

    #[test]
    fn a_legacy_catalogue_entry_with_an_internal_name_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let topics = Topics::open(&config(dir.path()), interval()).unwrap();
        topics.create("user", 1, BTreeMap::new(), false).unwrap();
        drop(topics);
        let path = dir.path().join("topics.json");
        let mut cat: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        cat["topics"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "name": "__consumer_offsets", "id": Uuid::new_v4(), "partitions": 1, "configs": {}
            }));
        std::fs::write(&path, serde_json::to_vec(&cat).unwrap()).unwrap();
        let topics = Topics::open(&config(dir.path()), interval()).unwrap();
        assert!(topics.get("__consumer_offsets").is_none());
        assert!(topics.get("user").is_some());
        assert!(!dir.path().join("__consumer_offsets-0").exists());
    }
}
