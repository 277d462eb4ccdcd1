//! Internal logs of coordinator state (`__transaction_state-0`,
//! `__consumer_offsets-0`): the same log engine as topics, holding
//! uncompressed batches of (key, value) records. Every append is fsynced
//! before it returns; a failed append is cut back so the log never holds a
//! change that was not acknowledged.
//!
//! [`InternalLog::into_writer`] hands the log to a thread of its own that
//! commits appends in groups: whatever was asked for while the previous
//! fsync ran goes out as one batch with one fsync, and every request of the
//! group gets that fsync's outcome. Many transactional ids changing state
//! at once then cost one fsync per group, not one each.
//!
//! The writer thread also compacts its log (see [`Compactor`]): once as
//! many records were appended since the last compaction as were live after
//! it (and at least [`CompactPolicy::min_records`]), the log's records are
//! reduced to the fewest that replay to the same state and the log is
//! rewritten as them, atomically. So a restart reads the live state, not
//! the history, and the log's size stays within a small multiple of it.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use oncelog_log::batch::{self, BatchBuilder, BatchIter};
use oncelog_log::{Log, LogConfig, LogError};

use crate::error::TopicError;

/// A record as stored: (key, value); a `None` value is a tombstone.
pub type Record = (Option<Vec<u8>>, Option<Vec<u8>>);

/// Why a change to an internal log was not made.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The record could not be encoded.
    #[error(transparent)]
    Encode(#[from] serde_json::Error),
    /// The write or its fsync failed; the log was cut back.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The group this change was committed with failed (the write or its
    /// fsync); the log was cut back, none of the group's changes were made.
    #[error(transparent)]
    Group(#[from] Arc<LogError>),
}

/// Most requests one group commit takes.
const MAX_GROUP: usize = 4096;

/// Records per batch when a compacted log is written.
const COMPACT_BATCH_RECORDS: usize = 1000;

/// Reduces a log's records, in log order, to the fewest records that replay
/// to the same state; an error leaves the log as it is.
pub type Compactor = Box<dyn Fn(Vec<Record>) -> Result<Vec<Record>, String> + Send>;

/// When an internal log compacts itself.
#[derive(Debug, Clone, Copy)]
pub struct CompactPolicy {
    /// Fewest records appended since the last compaction before the next.
    pub min_records: usize,
}

/// Run on the writer thread once a change is durable, before its reply is
/// sent and before any later change's: state built from the log is applied
/// in log order.
pub type OnDurable = Box<dyn FnOnce() + Send>;

struct WriteRequest {
    records: Vec<Record>,
    reply: tokio::sync::oneshot::Sender<Result<(), Arc<LogError>>>,
    on_durable: Option<OnDurable>,
}

/// A change handed to the writer: await [`Pending::durable`] for its outcome.
pub struct Pending {
    rx: tokio::sync::oneshot::Receiver<Result<(), Arc<LogError>>>,
    dir: PathBuf,
}

/// A log that keeps nothing: each change's `on_durable` runs on a thread
/// of its own, in submission order, before its [`Pending`] resolves, as
/// [`LogWriter`]'s do (the callers rely on both: never run under their
/// locks, and in order). Cluster mode's coordinators keep their durable
/// state in PostgreSQL; their local state needs no disk.
pub struct MemoryLog {
    tx: std::sync::Mutex<std::sync::mpsc::Sender<WriteRequest>>,
}

impl MemoryLog {
    pub fn start(name: &str) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<WriteRequest>();
        std::thread::Builder::new()
            .name(format!("memlog-{name}"))
            .spawn(move || {
                for req in rx {
                    if let Some(f) = req.on_durable {
                        f();
                    }
                    let _ = req.reply.send(Ok(()));
                }
            })?;
        Ok(Self {
            tx: std::sync::Mutex::new(tx),
        })
    }

    /// As [`LogWriter::submit`]: with no records `on_durable` does not run.
    pub fn submit(
        &self,
        records: Vec<Record>,
        on_durable: Option<OnDurable>,
    ) -> Result<Pending, PersistError> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let req = WriteRequest {
            on_durable: on_durable.filter(|_| !records.is_empty()),
            records,
            reply,
        };
        let sent = self.tx.lock().unwrap_or_else(|p| p.into_inner()).send(req);
        let dir = PathBuf::from("(memory)");
        if sent.is_err() {
            return Err(stopped(&dir));
        }
        Ok(Pending { rx, dir })
    }
}

impl Pending {
    /// A change whose outcome `rx` brings (a [`crate::backend::storage::StateLog`]
    /// of another kind: the simulation's in-memory log); `dir` names the log
    /// in the error when the reply is dropped.
    pub fn from_reply(
        rx: tokio::sync::oneshot::Receiver<Result<(), Arc<LogError>>>,
        dir: PathBuf,
    ) -> Self {
        Self { rx, dir }
    }

    pub async fn durable(self) -> Result<(), PersistError> {
        match self.rx.await {
            Ok(res) => res.map_err(PersistError::Group),
            Err(_) => Err(stopped(&self.dir)),
        }
    }
}

fn stopped(dir: &Path) -> PersistError {
    PersistError::Log(LogError::Io {
        op: "write internal log",
        path: dir.to_path_buf(),
        source: std::io::Error::other("the internal log writer has stopped"),
    })
}

/// The handle of an internal log owned by its writer thread (see
/// [`InternalLog::into_writer`]). Dropping every handle stops the thread.
#[derive(Clone)]
pub struct LogWriter {
    tx: mpsc::Sender<WriteRequest>,
    dir: PathBuf,
}

impl LogWriter {
    /// Queues `records` for the next group and returns at once. Once they
    /// are durable, `on_durable` runs on the writer thread, in log order
    /// (so it must not wait for anything that waits for this log); if their
    /// group fails it does not run, and none of it was made. With no
    /// records it does not run at all.
    pub fn submit(
        &self,
        records: Vec<Record>,
        on_durable: Option<OnDurable>,
    ) -> Result<Pending, PersistError> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        if records.is_empty() {
            // Nothing to write, nothing to apply.
            drop(on_durable);
            let _ = reply.send(Ok(()));
        } else {
            self.tx
                .send(WriteRequest {
                    records,
                    reply,
                    on_durable,
                })
                .map_err(|_| stopped(&self.dir))?;
        }
        Ok(Pending {
            rx,
            dir: self.dir.clone(),
        })
    }

    /// Queues `records` for the next group and returns at once: they are
    /// written and fsynced with that group (or, if it fails, not at all).
    /// For changes whose loss a restart repairs by itself.
    pub fn append_detached(&self, records: Vec<Record>) -> Result<(), PersistError> {
        self.submit(records, None).map(drop)
    }

    /// Appends `records` as part of the next group and waits until that
    /// group is durable (or failed, then none of it was made).
    pub async fn append(&self, records: Vec<Record>) -> Result<(), PersistError> {
        self.submit(records, None)?.durable().await
    }
}

pub struct InternalLog {
    log: Log,
    name: String,
    compactor: Option<(Compactor, CompactPolicy)>,
    /// Records in the log after its last compaction (0 before the first).
    live: usize,
    /// Records appended since (at open: every record found).
    appended: usize,
}

impl InternalLog {
    /// Opens `data_dir/internal/name`, recovering its tail, and returns every record in order.
    pub fn open(data_dir: &Path, name: &str) -> Result<(Self, Vec<Record>), TopicError> {
        let config = LogConfig {
            segment_bytes: 100 << 20,
            retention_bytes: -1,
            retention_ms: -1,
            ..LogConfig::default()
        };
        let (log, report) = Log::open(
            &crate::backend::local::datadir::internal_dir(data_dir).join(name),
            config,
        )?;
        if report.bytes_dropped > 0 {
            tracing::warn!(
                log = name,
                bytes_dropped = report.bytes_dropped,
                "internal log tail truncated at recovery"
            );
        }
        let records = read_records(&log, name)?;
        let appended = records.len();
        Ok((
            Self {
                log,
                name: name.to_string(),
                compactor: None,
                live: 0,
                appended,
            },
            records,
        ))
    }

    /// Lets the writer thread compact this log with `c` (see the module doc).
    pub fn with_compactor(mut self, c: Compactor, policy: CompactPolicy) -> Self {
        self.compactor = Some((c, policy));
        self
    }

    /// Compacts the log if enough was appended since the last compaction.
    fn maybe_compact(&mut self) {
        let Some((compactor, policy)) = &self.compactor else {
            return;
        };
        if self.appended < policy.min_records.max(self.live) {
            return;
        }
        let started = std::time::Instant::now();
        let before = self.log.size_bytes();
        let reduced = read_records(&self.log, &self.name)
            .map_err(|e| e.to_string())
            .and_then(|r| compactor(r).map(|out| (out.len(), out)));
        // Whatever happens, wait for as much again before the next try.
        self.appended = 0;
        let (n, records) = match reduced {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(log = %self.name, error = %e, "internal log compaction failed; the log is left as it was");
                return;
            }
        };
        let mut batches: Vec<Vec<u8>> = records
            .chunks(COMPACT_BATCH_RECORDS)
            .map(|chunk| {
                let mut bb = BatchBuilder::new(oncelog_log::now_ms());
                for (i, (k, v)) in chunk.iter().enumerate() {
                    bb = bb.record(i as i64, k.as_deref(), v.as_deref());
                }
                bb.build()
            })
            .collect();
        crate::faults::fail_point("internal-compact-before-swap");
        match self.log.rewrite_as(&mut batches) {
            Ok(()) => {
                self.live = n;
                tracing::info!(log = %self.name, records = n, bytes_before = before,
                    bytes_after = self.log.size_bytes(), ms = started.elapsed().as_millis() as u64,
                    "internal log compacted");
            }
            Err(e) => {
                tracing::error!(log = %self.name, error = %e, "internal log compaction failed; the log is left as it was");
            }
        }
    }

    /// Hands the log to a thread of its own that commits appends in groups.
    pub fn into_writer(self, name: &str) -> std::io::Result<LogWriter> {
        let (tx, rx) = mpsc::channel::<WriteRequest>();
        let dir = self.log.dir().to_path_buf();
        std::thread::Builder::new()
            .name(format!("internal-log-{name}"))
            .spawn(move || self.serve(rx))?;
        Ok(LogWriter { tx, dir })
    }

    /// The writer thread: one batch and one fsync per group of requests,
    /// and compaction between groups.
    fn serve(mut self, rx: mpsc::Receiver<WriteRequest>) {
        self.maybe_compact();
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(r) => group.push(r),
                    Err(_) => break,
                }
            }
            let records: Vec<batch::KeyValue<'_>> = group
                .iter()
                .flat_map(|r| r.records.iter().map(|(k, v)| (k.as_deref(), v.as_deref())))
                .collect();
            let n = records.len();
            let res = self.append_now(&records).map_err(Arc::new);
            drop(records);
            if res.is_ok() {
                self.appended += n;
            }
            for r in group {
                if res.is_ok() {
                    if let Some(f) = r.on_durable {
                        f();
                    }
                }
                // A requester that went away learns nothing; the change stands.
                let _ = r.reply.send(res.clone());
            }
            self.maybe_compact();
        }
    }

    /// Appends the records as one batch and fsyncs it, from async code
    /// (the blocking write runs in place on a worker thread).
    pub fn append(&mut self, records: &[batch::KeyValue<'_>]) -> Result<(), LogError> {
        tokio::task::block_in_place(|| self.append_now(records))
    }

    /// Appends the records as one batch and fsyncs it; blocks.
    fn append_now(&mut self, records: &[batch::KeyValue<'_>]) -> Result<(), LogError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut bb = BatchBuilder::new(oncelog_log::now_ms());
        for (i, (k, v)) in records.iter().enumerate() {
            bb = bb.record(i as i64, *k, *v);
        }
        let mut b = bb.build();
        let before = self.log.next_offset();
        let log = &mut self.log;
        let res = log.append(&mut b).and_then(|_| log.sync());
        if let Err(e) = &res {
            tracing::error!(dir = %self.log.dir().display(), error = %e, "internal log write failed; change not made");
            if let Err(te) = self.log.truncate_to(before) {
                tracing::error!(error = %te, "could not cut back the internal log");
            }
        }
        res
    }
}

/// Every record of `log`, in order.
fn read_records(log: &Log, name: &str) -> Result<Vec<Record>, TopicError> {
    let mut records = Vec::new();
    let mut offset = log.log_start_offset();
    let end = log.next_offset();
    while offset < end {
        let chunk = log.read(offset, 4 << 20, end, true)?;
        if chunk.is_empty() {
            break;
        }
        for item in BatchIter::new(&chunk) {
            let (at, h) = item.map_err(|e| TopicError::Storage(format!("{name}: {e}")))?;
            let whole = &chunk[at..at + h.total_size()];
            let recs = batch::records(whole).ok_or_else(|| {
                TopicError::Storage(format!(
                    "{name}: undecodable batch at offset {}",
                    h.base_offset()
                ))
            })?;
            for (k, v) in recs {
                records.push((k.map(<[u8]>::to_vec), v.map(<[u8]>::to_vec)));
            }
            offset = h.next_offset();
        }
    }
    Ok(records)
}

/// The compactor of a log of keyed records where a record is its key's
/// whole state and a `None` value deletes the key: the last record of every
/// key that is not deleted (records without a key are dropped).
pub fn compact_keyed(records: Vec<Record>) -> Result<Vec<Record>, String> {
    // key -> (position of its last record, that record's value)
    let mut last: std::collections::HashMap<Vec<u8>, (usize, Option<Vec<u8>>)> =
        std::collections::HashMap::new();
    for (i, (k, v)) in records.into_iter().enumerate() {
        if let Some(k) = k {
            last.insert(k, (i, v));
        }
    }
    let mut live: Vec<(usize, Vec<u8>, Vec<u8>)> = last
        .into_iter()
        .filter_map(|(k, (i, v))| v.map(|v| (i, k, v)))
        .collect();
    live.sort_unstable_by_key(|(i, _, _)| *i);
    Ok(live
        .into_iter()
        .map(|(_, k, v)| (Some(k), Some(v)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_keyed_keeps_the_last_live_record_per_key_in_log_order() {
        let r = |k: &str, v: Option<&str>| {
            (
                Some(k.as_bytes().to_vec()),
                v.map(|v| v.as_bytes().to_vec()),
            )
        };
        let out = compact_keyed(vec![
            r("a", Some("1")),
            r("b", Some("1")),
            r("a", Some("2")),
            r("c", Some("1")),
            r("b", None),
            (None, Some(b"keyless".to_vec())),
        ])
        .unwrap();
        assert_eq!(out, vec![r("a", Some("2")), r("c", Some("1"))]);
    }

    /// The writer compacts once enough was appended: a reopen reads the
    /// live state only, and it is the state the full history gives.
    #[test]
    fn the_writer_compacts_and_a_reopen_reads_the_live_state() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = InternalLog::open(dir.path(), "__transaction_state-0").unwrap();
        let log = log.with_compactor(Box::new(compact_keyed), CompactPolicy { min_records: 50 });
        let writer = log.into_writer("test").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            // 1010: the last compaction (every 50 records) is at 1000, so
            // none is running when the log is reopened.
            for i in 0..1010u32 {
                let k = format!("id-{}", i % 7).into_bytes();
                let v = if i % 100 == 99 {
                    None
                } else {
                    Some(i.to_string().into_bytes())
                };
                writer.append(vec![(Some(k), v)]).await.unwrap();
            }
        });
        drop(writer);
        let (_, recs) = InternalLog::open(dir.path(), "__transaction_state-0").unwrap();
        assert!(recs.len() < 100, "{} records after compaction", recs.len());
        let mut state = std::collections::HashMap::new();
        for (k, v) in recs {
            match v {
                Some(v) => state.insert(k.unwrap(), v),
                None => state.remove(&k.unwrap()),
            };
        }
        let mut want = std::collections::HashMap::new();
        for i in 0..1010u32 {
            let k = format!("id-{}", i % 7).into_bytes();
            if i % 100 == 99 {
                want.remove(&k);
            } else {
                want.insert(k, i.to_string().into_bytes());
            }
        }
        assert_eq!(state, want);
    }

    /// Many concurrent appends through the writer: every one is answered
    /// Ok, every record is in the log after a reopen, and they went out in
    /// fewer batches than requests (group commit).
    #[test]
    fn concurrent_appends_share_batches_and_all_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (log, recs) = InternalLog::open(dir.path(), "__transaction_state-0").unwrap();
        assert!(recs.is_empty());
        let writer = log.into_writer("test").unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        const N: usize = 200;
        rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..N {
                let w = writer.clone();
                tasks.spawn(async move {
                    let key = format!("id-{i}").into_bytes();
                    w.append(vec![(Some(key), Some(format!("v{i}").into_bytes()))])
                        .await
                });
            }
            while let Some(r) = tasks.join_next().await {
                r.unwrap().unwrap();
            }
        });
        drop(writer);
        // The writer thread ends when its last handle goes; the log's lock
        // on its files goes with it (a reopen may race it briefly).
        let mut reopened = None;
        for _ in 0..100 {
            match InternalLog::open(dir.path(), "__transaction_state-0") {
                Ok(r) => {
                    reopened = Some(r);
                    break;
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        let (log, recs) = reopened.unwrap();
        let mut keys: Vec<String> = recs
            .iter()
            .map(|(k, _)| String::from_utf8(k.clone().unwrap()).unwrap())
            .collect();
        keys.sort();
        let mut want: Vec<String> = (0..N).map(|i| format!("id-{i}")).collect();
        want.sort();
        assert_eq!(keys, want);
        // Batches in the log: one per group commit.
        let batches = {
            let end = log.log.next_offset();
            let chunk = log.log.read(0, 16 << 20, end, true).unwrap();
            BatchIter::new(&chunk).count()
        };
        assert!(batches < N, "{batches} batches for {N} concurrent appends");
    }

    /// A request to a writer whose thread has gone is an error, not a hang.
    #[test]
    fn append_after_the_writer_stopped_is_an_error() {
        let (tx, rx) = mpsc::channel::<WriteRequest>();
        drop(rx);
        let w = LogWriter {
            tx,
            dir: PathBuf::from("/nonexistent"),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let r = rt.block_on(w.append(vec![(Some(b"k".to_vec()), Some(b"v".to_vec()))]));
        assert!(matches!(r, Err(PersistError::Log(_))), "{r:?}");
    }
}
