//! The classic consumer-group coordinator and committed offsets.
//!
//! Membership (JoinGroup / SyncGroup / Heartbeat / LeaveGroup) is worked
//! out in memory and kept in the offsets log as Kafka keeps it: whenever a
//! generation becomes Stable (the leader's assignments delivered), a static
//! member is replaced, or the group becomes Empty, one record holds the
//! generation, leader, protocol and every member with its subscription and
//! assignment. At start the last such record of each group is restored, each
//! member's session starting anew, so after a restart members carry on with
//! their generation: heartbeats, commits and KIP-447 TxnOffsetCommits are
//! answered as before the restart, and nobody has to rebalance. Committed
//! offsets live in the same internal log (`__consumer_offsets-0`, one JSON
//! record per change, fsynced before the answer) and are replayed at start.
//!
//! Static members (KIP-345): a member that comes back with its
//! `group.instance.id` and no member id takes over its previous
//! incarnation's place; the previous incarnation is fenced, and any request
//! it still sends with its old member id and that instance id is answered
//! FENCED_INSTANCE_ID.
//!
//! Transactional offset commits (TxnOffsetCommit) are kept *pending* per
//! producer id, also in the offsets log, until the transaction's marker
//! reaches the group coordinator: COMMIT makes them the committed offsets,
//! ABORT drops them. While a partition has pending offsets, OffsetFetch with
//! `require_stable` answers UNSTABLE_OFFSET_COMMIT (KIP-447), so a new owner
//! never starts from a stale offset.
//!
//! The membership rules are a pure state machine ([`machine`]): each request
//! takes the time as an input and returns its answer and its effects on
//! other members' waiting requests. This driver keeps those waiting
//! requests (one channel each), delivers the effects, and writes to the
//! offsets log what must be durable. It never waits on the log while holding
//! its lock: the log's writer applies each change once durable, in log order.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, Mutex};

use crate::machines::group::{join_error, MembershipRecord};
pub use crate::machines::group::{
    Effect, Group, GroupState, JoinOutcome, JoinRequest, JoinResult, Member, OffsetMeta,
    SyncOutcome,
};

use crate::backend::local::internal_log::{InternalLog, OnDurable, Pending, PersistError};
use crate::backend::storage::SharedStateLog;
use crate::error::ErrorCode;
use crate::error::TopicError;
use oncelog_log::now_ms;

pub use crate::machines::names::OFFSETS_TOPIC;

/// One partition's answer to OffsetFetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedOffset {
    pub topic: String,
    pub partition: i32,
    /// -1 when nothing is committed (or it is unstable).
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    pub error: ErrorCode,
}

/// Records of the offsets log.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "t")]
enum OffsetRecord {
    #[serde(rename = "offset")]
    Commit {
        group: String,
        topic: String,
        partition: i32,
        meta: OffsetMeta,
    },
    #[serde(rename = "txn_offset")]
    TxnCommit {
        pid: i64,
        group: String,
        topic: String,
        partition: i32,
        meta: OffsetMeta,
    },
    #[serde(rename = "txn_end")]
    TxnEnd { pid: i64, commit: bool },
    #[serde(rename = "delete")]
    Delete {
        group: String,
        topic: Option<String>,
        partition: Option<i32>,
    },
    /// The group's membership (see the module comment).
    #[serde(rename = "membership")]
    Membership(MembershipRecord),
}

pub struct GroupSettings {
    pub initial_rebalance_delay: Duration,
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
    pub offsets_retention_ms: i64,
    /// When the offsets log compacts itself.
    pub compact: crate::backend::local::internal_log::CompactPolicy,
}

pub struct Groups {
    /// The groups. Never held while waiting for the offsets log: changes
    /// are applied by the log's writer thread, in log order, once durable.
    state: Arc<Mutex<Inner>>,
    log: SharedStateLog,
    settings: GroupSettings,
    next_member: AtomicU64,
    /// Where each group's membership at rest goes as well (cluster mode:
    /// the cluster's rows, read by the console of any broker).
    snapshots: std::sync::OnceLock<SnapshotJournal>,
}

/// A group as its coordinator sees it (the console's view): state,
/// generation, protocol and members with their assignments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapshot {
    pub state: String,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub leader: String,
    pub members: Vec<MemberSnapshot>,
}

/// One member of a [`GroupSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSnapshot {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: u64,
    /// The consumer-protocol assignment as the leader sent it.
    pub assignment: Vec<u8>,
}

impl GroupSnapshot {
    fn of(g: &Group) -> Self {
        Self {
            state: g.state.name().to_string(),
            generation: g.generation,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol: g.protocol.clone().unwrap_or_default(),
            leader: g.leader.clone().unwrap_or_default(),
            members: g
                .members
                .values()
                .map(|m| MemberSnapshot {
                    member_id: m.id.clone(),
                    group_instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: m.session_timeout.as_millis() as u64,
                    assignment: m.assignment.to_vec(),
                })
                .collect(),
        }
    }
}

/// Where membership snapshots go ([`Groups::journal_to`]).
pub type SnapshotJournal = tokio::sync::mpsc::Sender<(String, GroupSnapshot)>;

struct Inner {
    groups: HashMap<String, Group>,
    /// JoinGroup and SyncGroup requests waiting, by (group, member id).
    joins: HashMap<(String, String), oneshot::Sender<JoinResult>>,
    syncs: HashMap<(String, String), oneshot::Sender<(ErrorCode, Bytes)>>,
    /// What was last sent to the snapshot journal, by group.
    journaled: HashMap<String, GroupSnapshot>,
}

impl Inner {
    /// Answers the waiting requests that `group`'s effects end.
    fn deliver(&mut self, group: &str, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Join(r) => {
                    if let Some(tx) = self.joins.remove(&(group.to_string(), r.member_id.clone())) {
                        let _ = tx.send(r);
                    }
                }
                Effect::Sync {
                    member,
                    error,
                    assignment,
                } => {
                    if let Some(tx) = self.syncs.remove(&(group.to_string(), member)) {
                        let _ = tx.send((error, assignment));
                    }
                }
            }
        }
    }
}

fn apply(groups: &mut HashMap<String, Group>, rec: OffsetRecord) {
    match rec {
        OffsetRecord::Commit {
            group,
            topic,
            partition,
            meta,
        } => {
            let g = groups
                .entry(group.clone())
                .or_insert_with(|| Group::new(&group));
            g.offsets.insert((topic, partition), meta);
        }
        OffsetRecord::TxnCommit {
            pid,
            group,
            topic,
            partition,
            meta,
        } => {
            let g = groups
                .entry(group.clone())
                .or_insert_with(|| Group::new(&group));
            g.pending
                .entry(pid)
                .or_default()
                .insert((topic, partition), meta);
        }
        OffsetRecord::TxnEnd { pid, commit } => {
            for g in groups.values_mut() {
                if let Some(p) = g.pending.remove(&pid) {
                    if commit {
                        g.offsets.extend(p);
                    }
                }
            }
        }
        OffsetRecord::Delete {
            group,
            topic,
            partition,
        } => match (topic, partition) {
            // One partition's offset (OffsetDelete, offsets retention): its
            // pending transactional offsets go too, and a group left with
            // no members and no offsets is gone, as in Kafka.
            (Some(t), Some(p)) => {
                if let Some(g) = groups.get_mut(&group) {
                    let k = (t, p);
                    g.offsets.remove(&k);
                    for offsets in g.pending.values_mut() {
                        offsets.remove(&k);
                    }
                    g.pending.retain(|_, offsets| !offsets.is_empty());
                    if g.members.is_empty() && g.offsets.is_empty() && g.pending.is_empty() {
                        groups.remove(&group);
                    }
                }
            }
            _ => match groups.get_mut(&group) {
                // Members joined while the delete was being written: its
                // offsets go, the live group stays (as a replay would
                // bring it back from its next membership record).
                Some(g) if !g.members.is_empty() => {
                    g.offsets.clear();
                    g.pending.clear();
                }
                _ => {
                    groups.remove(&group);
                }
            },
        },
        OffsetRecord::Membership(r) => {
            let g = groups
                .entry(r.group.clone())
                .or_insert_with(|| Group::new(&r.group));
            g.written = Some(r);
        }
    }
}

/// The offsets log's compactor: the records replayed into groups (as
/// [`Groups::open`] does), then written back as each group's state: its
/// membership, its committed offsets, and its transactions' pending
/// offsets. Records the broker did not write are dropped, as replay skips
/// them.
fn compact_offsets(
    records: Vec<crate::backend::local::internal_log::Record>,
) -> Result<Vec<crate::backend::local::internal_log::Record>, String> {
    let mut groups = HashMap::new();
    for (_, value) in records {
        if let Some(rec) = value.and_then(|v| serde_json::from_slice::<OffsetRecord>(&v).ok()) {
            apply(&mut groups, rec);
        }
    }
    let mut out = Vec::new();
    let mut push = |r: OffsetRecord| -> Result<(), String> {
        out.push((
            None,
            Some(serde_json::to_vec(&r).map_err(|e| e.to_string())?),
        ));
        Ok(())
    };
    let mut names: Vec<&String> = groups.keys().collect();
    names.sort();
    for name in names {
        let g = &groups[name];
        if let Some(m) = &g.written {
            push(OffsetRecord::Membership(m.clone()))?;
        }
        for ((topic, partition), meta) in &g.offsets {
            push(OffsetRecord::Commit {
                group: name.clone(),
                topic: topic.clone(),
                partition: *partition,
                meta: meta.clone(),
            })?;
        }
        for (pid, offsets) in &g.pending {
            for ((topic, partition), meta) in offsets {
                push(OffsetRecord::TxnCommit {
                    pid: *pid,
                    group: name.clone(),
                    topic: topic.clone(),
                    partition: *partition,
                    meta: meta.clone(),
                })?;
            }
        }
    }
    Ok(out)
}

/// Errors of the membership calls.
pub type GroupResult<T> = Result<T, ErrorCode>;

/// The groups from the offsets log's records. `client_written`: records a
/// client wrote there before internal names were reserved may be in it, and
/// are skipped.
fn load(
    records: Vec<crate::backend::local::internal_log::Record>,
    client_written: bool,
) -> Result<HashMap<String, Group>, TopicError> {
    let mut groups = HashMap::new();
    let mut foreign = 0usize;
    for (_, value) in records {
        let Some(v) = value else { continue };
        match serde_json::from_slice::<OffsetRecord>(&v) {
            Ok(rec) => apply(&mut groups, rec),
            Err(e) if !client_written => {
                return Err(TopicError::Storage(format!("offsets log record: {e}")))
            }
            // Before internal names were reserved a client could produce
            // into this log; such a record is not the broker's. It stays
            // on disk, and must not keep the broker from starting.
            Err(e) => {
                foreign += 1;
                if foreign == 1 {
                    tracing::error!(error = %e, "the offsets log holds a record the broker did not write (a client's, from before internal topics were reserved?); skipping it");
                }
            }
        }
    }
    if foreign > 0 {
        tracing::error!(
            records = foreign,
            "skipped records of the offsets log that the broker did not write"
        );
    }
    let now = Instant::now();
    let mut restored = 0usize;
    for g in groups.values_mut() {
        g.restore(now);
        restored += g.members.len();
    }
    tracing::info!(
        groups = groups.len(),
        members = restored,
        "group coordinator loaded"
    );
    Ok(groups)
}

impl Groups {
    pub fn open(data_dir: &Path, settings: GroupSettings) -> Result<Self, TopicError> {
        let (log, records) = InternalLog::open(data_dir, "__consumer_offsets-0")?;
        let log = log.with_compactor(Box::new(compact_offsets), settings.compact);
        let client_written =
            crate::backend::local::datadir::client_written(data_dir, "__consumer_offsets-0");
        let groups = load(records, client_written)?;
        let log = log
            .into_writer("__consumer_offsets-0")
            .map_err(|e| TopicError::Storage(format!("start the offsets log writer: {e}")))?;
        Ok(Self::with_log(Arc::new(log), groups, settings))
    }

    /// A coordinator over `log`, whose durable records so far are
    /// `records` (a log of another kind than the data directory's: the
    /// simulation's in-memory log, replayed after a crash).
    pub fn replay(
        log: SharedStateLog,
        records: Vec<crate::backend::local::internal_log::Record>,
        settings: GroupSettings,
    ) -> Result<Self, TopicError> {
        Ok(Self::with_log(log, load(records, false)?, settings))
    }

    /// A coordinator whose log keeps nothing ([`crate::backend::local::internal_log::MemoryLog`]):
    /// cluster mode's, whose offsets are PostgreSQL's rows and whose
    /// membership a group's new owner starts afresh anyway.
    pub fn in_memory(settings: GroupSettings) -> std::io::Result<Self> {
        Ok(Self::with_log(
            Arc::new(crate::backend::local::internal_log::MemoryLog::start(
                "__consumer_offsets",
            )?),
            HashMap::new(),
            settings,
        ))
    }

    fn with_log(
        log: SharedStateLog,
        groups: HashMap<String, Group>,
        settings: GroupSettings,
    ) -> Self {
        Self {
            state: Arc::new(Mutex::new(Inner {
                groups,
                joins: HashMap::new(),
                syncs: HashMap::new(),
                journaled: HashMap::new(),
            })),
            log,
            settings,
            next_member: AtomicU64::new(0),
            snapshots: std::sync::OnceLock::new(),
        }
    }

    /// Sends each group's membership at rest to `journal` too, from now on.
    pub fn journal_to(&self, journal: SnapshotJournal) {
        let _ = self.snapshots.set(journal);
    }

    /// `group` as its coordinator sees it now, if this broker holds it.
    pub async fn snapshot(&self, group: &str) -> Option<GroupSnapshot> {
        let inner = self.state.lock().await;
        inner.groups.get(group).map(GroupSnapshot::of)
    }

    /// The offsets committed in open transactions of `group`: (producer
    /// id, topic, partition, offset), sorted.
    pub async fn pending_offsets(&self, group: &str) -> Vec<(i64, String, i32, i64)> {
        let inner = self.state.lock().await;
        let mut out: Vec<(i64, String, i32, i64)> = inner
            .groups
            .get(group)
            .map(|g| {
                g.pending
                    .iter()
                    .flat_map(|(pid, m)| {
                        m.iter()
                            .map(move |((t, p), o)| (*pid, t.clone(), *p, o.offset))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    /// Hands records to the offsets log. Once they are durable the
    /// writer thread applies them (in log order, before anyone is told);
    /// if their group commit fails, none is applied. Never await the
    /// result while holding `state`: the apply needs it.
    fn submit(&self, recs: Vec<OffsetRecord>) -> Result<Pending, PersistError> {
        let mut values = Vec::with_capacity(recs.len());
        for r in &recs {
            values.push((None, Some(serde_json::to_vec(r)?)));
        }
        let state = self.state.clone();
        let apply_all: OnDurable = Box::new(move || {
            let mut inner = state.blocking_lock();
            for r in recs {
                apply(&mut inner.groups, r);
            }
        });
        self.log.submit(values, Some(apply_all))
    }

    /// Sends `group` as it is now to the snapshot journal (cluster mode:
    /// the rows every broker's console reads) when it differs from what was
    /// sent last: each step of a rebalance too, not only membership at
    /// rest. Never waits: a full queue drops it, and the group's next
    /// change sends it again (nothing decides on it).
    fn journal(&self, inner: &mut Inner, group: &str) {
        let Some(j) = self.snapshots.get() else {
            return;
        };
        let Some(g) = inner.groups.get(group) else {
            return;
        };
        let now = GroupSnapshot::of(g);
        if inner.journaled.get(group) == Some(&now) {
            return;
        }
        if j.try_send((group.to_string(), now.clone())).is_ok() {
            inner.journaled.insert(group.to_string(), now);
        }
    }

    /// Writes `group`'s membership if it is at rest and differs from what
    /// the log holds. Membership is not acknowledged to anyone: if the write
    /// fails it is logged, and after a restart the members rebalance.
    fn save_membership(&self, inner: &mut Inner, group: &str) {
        self.journal(inner, group);
        let Some(g) = inner.groups.get(group) else {
            return;
        };
        let Some(rec) = g.membership() else {
            return;
        };
        if g.written.as_ref() == Some(&rec) || (g.written.is_none() && rec.members.is_empty()) {
            return;
        }
        let generation = rec.generation;
        let members = rec.members.len();
        let group = group.to_string();
        match self.submit(vec![OffsetRecord::Membership(rec)]) {
            Ok(pending) => {
                tokio::spawn(async move {
                    match pending.durable().await {
                        Ok(()) => {
                            tracing::debug!(group, generation, members, "group membership written")
                        }
                        Err(e) => tracing::error!(group, generation, error = %e,
                            "group membership not written; after a restart its members rebalance"),
                    }
                });
            }
            Err(e) => tracing::error!(group, generation, error = %e,
                "group membership not written; after a restart its members rebalance"),
        }
    }

    fn new_member_id(&self, client_id: &str) -> String {
        let n = self.next_member.fetch_add(1, Ordering::Relaxed);
        format!("{client_id}-{}-{n}", uuid::Uuid::new_v4().simple())
    }

    /// JoinGroup: returns when the join phase completes (or at once on error).
    pub async fn join(&self, req: JoinRequest) -> JoinResult {
        if req.group.is_empty() {
            return join_error(ErrorCode::InvalidGroupId, &req.member_id);
        }
        if req.session_timeout_ms < self.settings.min_session_timeout_ms
            || req.session_timeout_ms > self.settings.max_session_timeout_ms
        {
            return join_error(ErrorCode::InvalidSessionTimeout, &req.member_id);
        }
        let fresh = self.new_member_id(&req.client_id);
        let rx = {
            let mut inner = self.state.lock().await;
            let g = inner
                .groups
                .entry(req.group.clone())
                .or_insert_with(|| Group::new(&req.group));
            let delay = self.settings.initial_rebalance_delay;
            let (outcome, effects) = g.join(&req, fresh, Instant::now(), delay);
            let rx = match outcome {
                JoinOutcome::Answer(r) => {
                    inner.deliver(&req.group, effects);
                    self.save_membership(&mut inner, &req.group);
                    return r;
                }
                JoinOutcome::Wait { member } => {
                    let (tx, rx) = oneshot::channel();
                    let key = (req.group.clone(), member.clone());
                    if let Some(old) = inner.joins.insert(key, tx) {
                        let _ = old.send(join_error(ErrorCode::UnknownMemberId, &member));
                    }
                    rx
                }
            };
            inner.deliver(&req.group, effects);
            self.journal(&mut inner, &req.group);
            rx
        };
        match rx.await {
            Ok(r) => r,
            Err(_) => join_error(ErrorCode::UnknownMemberId, &req.member_id),
        }
    }

    pub async fn sync(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        assignments: Vec<(String, Bytes)>,
    ) -> (ErrorCode, Bytes, Option<String>, Option<String>) {
        let rx = {
            let mut inner = self.state.lock().await;
            let Some(g) = inner.groups.get_mut(group) else {
                return (ErrorCode::UnknownMemberId, Bytes::new(), None, None);
            };
            let (outcome, effects) = g.sync(
                generation,
                member_id,
                instance_id,
                assignments,
                Instant::now(),
            );
            if let SyncOutcome::Answer(code, a) = outcome {
                let proto = (g.protocol_type.clone(), g.protocol.clone());
                inner.deliver(group, effects);
                self.journal(&mut inner, group);
                return (code, a, proto.0, proto.1);
            }
            let (tx, rx) = oneshot::channel();
            let key = (group.to_string(), member_id.to_string());
            if let Some(old) = inner.syncs.insert(key, tx) {
                let _ = old.send((ErrorCode::RebalanceInProgress, Bytes::new()));
            }
            inner.deliver(group, effects);
            // The leader's assignments make the group Stable: keep it.
            self.save_membership(&mut inner, group);
            rx
        };
        let (code, a) = rx
            .await
            .unwrap_or((ErrorCode::RebalanceInProgress, Bytes::new()));
        let inner = self.state.lock().await;
        let proto = inner
            .groups
            .get(group)
            .map(|g| (g.protocol_type.clone(), g.protocol.clone()))
            .unwrap_or((None, None));
        (code, a, proto.0, proto.1)
    }

    pub async fn heartbeat(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> ErrorCode {
        let mut inner = self.state.lock().await;
        match inner.groups.get_mut(group) {
            Some(g) => g.heartbeat(generation, member_id, instance_id, Instant::now()),
            None => ErrorCode::UnknownMemberId,
        }
    }

    /// LeaveGroup for each (member id, instance id); codes per member.
    pub async fn leave(
        &self,
        group: &str,
        members: Vec<(String, Option<String>)>,
    ) -> Vec<ErrorCode> {
        let mut inner = self.state.lock().await;
        let delay = self.settings.initial_rebalance_delay;
        let Some(g) = inner.groups.get_mut(group) else {
            return members.iter().map(|_| ErrorCode::UnknownMemberId).collect();
        };
        let (codes, effects) = g.leave(members, Instant::now(), delay);
        inner.deliver(group, effects);
        self.save_membership(&mut inner, group);
        codes
    }

    /// Checks that (member, generation) may commit for `group`.
    fn check_commit(
        g: Option<&Group>,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> ErrorCode {
        match g {
            Some(g) => g.check_commit(generation, member_id, instance_id),
            None if generation < 0 => ErrorCode::None,
            None => ErrorCode::IllegalGeneration,
        }
    }

    /// Whether (member, generation) may commit offsets for `group` now, as
    /// OffsetCommit checks it; a member that may is seen alive. For a
    /// coordinator whose offsets live elsewhere (cluster mode).
    pub async fn check_member(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> ErrorCode {
        let mut inner = self.state.lock().await;
        let code = Self::check_commit(inner.groups.get(group), generation, member_id, instance_id);
        if code == ErrorCode::None {
            if let Some(m) = inner
                .groups
                .get_mut(group)
                .and_then(|g| g.members.get_mut(member_id))
            {
                m.last_seen = Instant::now();
            }
        }
        code
    }

    /// How many members `group` has in memory (`None`: no such group here).
    pub async fn member_count(&self, group: &str) -> Option<usize> {
        let inner = self.state.lock().await;
        inner.groups.get(group).map(|g| g.members.len())
    }

    /// Forgets `group`'s membership (a coordinator that just took the group
    /// over starts it afresh, as after a coordinator move in Kafka): waiting
    /// JoinGroup and SyncGroup requests are answered `NOT_COORDINATOR`, and
    /// the members rejoin. Only the memory: nothing is written.
    pub async fn forget_membership(&self, group: &str) {
        let mut inner = self.state.lock().await;
        inner.groups.remove(group);
        inner.journaled.remove(group);
        let joins: Vec<_> = inner
            .joins
            .keys()
            .filter(|(g, _)| g == group)
            .cloned()
            .collect();
        for key in joins {
            if let Some(tx) = inner.joins.remove(&key) {
                let _ = tx.send(join_error(ErrorCode::NotCoordinator, &key.1));
            }
        }
        let syncs: Vec<_> = inner
            .syncs
            .keys()
            .filter(|(g, _)| g == group)
            .cloned()
            .collect();
        for key in syncs {
            if let Some(tx) = inner.syncs.remove(&key) {
                let _ = tx.send((ErrorCode::NotCoordinator, Bytes::new()));
            }
        }
    }

    /// OffsetCommit: one code for the whole request (membership), or per-partition storage errors.
    pub async fn commit(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        offsets: Vec<(String, i32, OffsetMeta)>,
    ) -> ErrorCode {
        let mut inner = self.state.lock().await;
        let code = Self::check_commit(inner.groups.get(group), generation, member_id, instance_id);
        if code != ErrorCode::None {
            return code;
        }
        if let Some(m) = inner
            .groups
            .get_mut(group)
            .and_then(|g| g.members.get_mut(member_id))
        {
            m.last_seen = Instant::now();
        }
        let recs = offsets
            .into_iter()
            .map(|(topic, partition, meta)| OffsetRecord::Commit {
                group: group.to_string(),
                topic,
                partition,
                meta,
            })
            .collect();
        let pending = self.submit(recs);
        drop(inner);
        Self::answer(pending).await
    }

    /// The answer to a commit once its records are durable (and applied).
    async fn answer(pending: Result<Pending, PersistError>) -> ErrorCode {
        match pending {
            Ok(p) => match p.durable().await {
                Ok(()) => ErrorCode::None,
                Err(_) => ErrorCode::CoordinatorNotAvailable,
            },
            Err(_) => ErrorCode::CoordinatorNotAvailable,
        }
    }

    /// TxnOffsetCommit: pending until the transaction's marker. KIP-447:
    /// a non-empty member id must belong to the group's current generation.
    ///
    /// `verify` (the producer's transaction still holds the offsets) runs
    /// under the groups' lock, the lock [`Self::complete_txn`] takes to end
    /// the transaction: a commit that passed it is in the log before the
    /// transaction's end, and one that comes after the end fails it. Checked
    /// before the lock, a fenced zombie's offsets could land after the
    /// abort and be committed by the next transaction of the same producer
    /// id.
    #[allow(clippy::too_many_arguments)]
    pub async fn txn_commit(
        &self,
        group: &str,
        pid: i64,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        offsets: Vec<(String, i32, OffsetMeta)>,
        verify: impl FnOnce() -> ErrorCode,
    ) -> ErrorCode {
        let inner = self.state.lock().await;
        let code = verify();
        if code != ErrorCode::None {
            return code;
        }
        if !member_id.is_empty() {
            let code =
                Self::check_commit(inner.groups.get(group), generation, member_id, instance_id);
            if code != ErrorCode::None && code != ErrorCode::RebalanceInProgress {
                return code;
            }
        }
        let recs = offsets
            .into_iter()
            .map(|(topic, partition, meta)| OffsetRecord::TxnCommit {
                pid,
                group: group.to_string(),
                topic,
                partition,
                meta,
            })
            .collect();
        let pending = self.submit(recs);
        drop(inner);
        Self::answer(pending).await
    }

    /// The transaction of `pid` ended: its pending offsets become committed
    /// (or are dropped). Durable before it returns.
    ///
    /// Always written, even when no pending offset of `pid` is applied yet:
    /// a TxnOffsetCommit submitted but not yet durable is applied only when
    /// it is, and this end must follow it in the log.
    pub async fn complete_txn(&self, pid: i64, commit: bool) -> Result<(), PersistError> {
        let pending = {
            let _inner = self.state.lock().await;
            self.submit(vec![OffsetRecord::TxnEnd { pid, commit }])?
        };
        pending.durable().await?;
        tracing::debug!(producer_id = pid, commit, "transactional offsets completed");
        Ok(())
    }

    /// OffsetFetch. `None` topics: every committed partition of the group.
    pub async fn fetch_offsets(
        &self,
        group: &str,
        topics: Option<Vec<(String, Vec<i32>)>>,
        require_stable: bool,
    ) -> Vec<FetchedOffset> {
        let inner = self.state.lock().await;
        let g = inner.groups.get(group);
        let wanted: Vec<(String, i32)> = match topics {
            Some(ts) => ts
                .into_iter()
                .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
                .collect(),
            None => {
                let mut v: Vec<(String, i32)> = g
                    .map(|g| g.offsets.keys().cloned().collect())
                    .unwrap_or_default();
                v.sort();
                v
            }
        };
        wanted
            .into_iter()
            .map(|(topic, partition)| {
                let none = |metadata, error| FetchedOffset {
                    offset: -1,
                    leader_epoch: -1,
                    metadata,
                    error,
                    topic: topic.clone(),
                    partition,
                };
                if require_stable && g.is_some_and(|g| g.has_pending(&topic, partition)) {
                    return none(None, ErrorCode::UnstableOffsetCommit);
                }
                match g.and_then(|g| g.offsets.get(&(topic.clone(), partition))) {
                    Some(m) => FetchedOffset {
                        offset: m.offset,
                        leader_epoch: m.leader_epoch,
                        metadata: m.metadata.clone(),
                        error: ErrorCode::None,
                        topic,
                        partition,
                    },
                    None => none(Some(String::new()), ErrorCode::None),
                }
            })
            .collect()
    }

    /// (group id, protocol type, state) of every group.
    pub async fn list(&self) -> Vec<(String, String, &'static str)> {
        let inner = self.state.lock().await;
        let mut v: Vec<_> = inner
            .groups
            .values()
            .map(|g| {
                (
                    g.id.clone(),
                    g.protocol_type.clone().unwrap_or_default(),
                    g.state.name(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Runs `f` on a group, if it exists.
    pub async fn with_group<R>(&self, group: &str, f: impl FnOnce(&Group) -> R) -> Option<R> {
        let inner = self.state.lock().await;
        inner.groups.get(group).map(f)
    }

    /// DeleteGroups: only empty groups (NON_EMPTY_GROUP otherwise).
    pub async fn delete(&self, group: &str) -> ErrorCode {
        let pending = {
            let inner = self.state.lock().await;
            match inner.groups.get(group) {
                None => return ErrorCode::GroupIdNotFound,
                Some(g) if !g.members.is_empty() => return ErrorCode::NonEmptyGroup,
                Some(_) => self.submit(vec![OffsetRecord::Delete {
                    group: group.to_string(),
                    topic: None,
                    partition: None,
                }]),
            }
        };
        let code = Self::answer(pending).await;
        if code == ErrorCode::None {
            tracing::info!(group, "group deleted");
        }
        code
    }

    /// OffsetDelete: the committed offsets (and pending transactional
    /// offsets) of `partitions` go where [`Group::offset_delete_codes`]
    /// allows, durably before the answer. One code per partition, or one
    /// for the whole request.
    pub async fn delete_offsets(
        &self,
        group: &str,
        partitions: &[(String, i32)],
    ) -> Result<Vec<ErrorCode>, ErrorCode> {
        let (codes, pending) = {
            let inner = self.state.lock().await;
            let Some(g) = inner.groups.get(group) else {
                return Err(ErrorCode::GroupIdNotFound);
            };
            let codes = g.offset_delete_codes(partitions)?;
            let records: Vec<_> = partitions
                .iter()
                .zip(&codes)
                .filter(|(_, c)| **c == ErrorCode::None)
                .map(|((t, p), _)| OffsetRecord::Delete {
                    group: group.to_string(),
                    topic: Some(t.clone()),
                    partition: Some(*p),
                })
                .collect();
            if records.is_empty() {
                return Ok(codes);
            }
            (codes, self.submit(records))
        };
        match Self::answer(pending).await {
            ErrorCode::None => {
                let n = codes.iter().filter(|c| **c == ErrorCode::None).count();
                tracing::info!(group, partitions = n, "committed offsets deleted");
                Ok(codes)
            }
            code => Err(code),
        }
    }

    /// A deleted topic's committed and pending offsets go from every group
    /// (a group left with no members and no offsets with them), durably
    /// before this returns. A failure is logged: the offsets then stay,
    /// as they would after a crash between the topic's deletion and this.
    pub async fn topic_deleted(&self, topic: &str) {
        let pending = {
            let inner = self.state.lock().await;
            let mut records = Vec::new();
            for g in inner.groups.values() {
                let partitions: BTreeSet<i32> = g
                    .offsets
                    .keys()
                    .chain(g.pending.values().flat_map(|m| m.keys()))
                    .filter(|(t, _)| t == topic)
                    .map(|(_, p)| *p)
                    .collect();
                records.extend(partitions.into_iter().map(|p| OffsetRecord::Delete {
                    group: g.id.clone(),
                    topic: Some(topic.to_string()),
                    partition: Some(p),
                }));
            }
            if records.is_empty() {
                return;
            }
            (records.len(), self.submit(records))
        };
        match Self::answer(pending.1).await {
            ErrorCode::None => {
                tracing::info!(
                    topic,
                    offsets = pending.0,
                    "a deleted topic's committed offsets removed"
                )
            }
            code => tracing::warn!(
                topic,
                ?code,
                "a deleted topic's committed offsets could not be removed"
            ),
        }
    }

    /// Timers: ends join phases, expires sessions, drops old offsets of empty groups.
    pub async fn tick(&self) {
        let mut inner = self.state.lock().await;
        let now = Instant::now();
        let delay = self.settings.initial_rebalance_delay;
        let mut changed = Vec::new();
        let mut effects = Vec::new();
        for g in inner.groups.values_mut() {
            let (c, e) = g.tick(now, delay);
            if c {
                changed.push(g.id.clone());
            }
            if !e.is_empty() {
                effects.push((g.id.clone(), e));
            }
        }
        for (id, e) in effects {
            inner.deliver(&id, e);
            self.journal(&mut inner, &id);
        }
        for id in changed {
            self.save_membership(&mut inner, &id);
        }
        // Offsets retention for groups without members.
        let cutoff = now_ms() - self.settings.offsets_retention_ms;
        let mut old = Vec::new();
        for g in inner.groups.values() {
            if g.members.is_empty() {
                for ((t, p), m) in &g.offsets {
                    if m.commit_ms < cutoff && !g.has_pending(t, *p) {
                        old.push(OffsetRecord::Delete {
                            group: g.id.clone(),
                            topic: Some(t.clone()),
                            partition: Some(*p),
                        });
                    }
                }
            }
        }
        if !old.is_empty() {
            let n = old.len();
            if let Ok(pending) = self.submit(old) {
                tokio::spawn(async move {
                    if pending.durable().await.is_ok() {
                        tracing::info!(offsets = n, "expired committed offsets removed");
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, instance: Option<&str>) -> Member {
        Member {
            id: id.to_string(),
            instance_id: instance.map(str::to_string),
            client_id: "c".to_string(),
            client_host: "/127.0.0.1".to_string(),
            session_timeout: Duration::from_millis(6000),
            rebalance_timeout: Duration::from_millis(30000),
            protocols: vec![("range".to_string(), Bytes::from_static(b"\x00\x01sub"))],
            assignment: Bytes::from_static(b"\x00\x01asg"),
            last_seen: Instant::now(),
            joining: false,
            syncing: false,
        }
    }

    fn stable_group() -> Group {
        let mut g = Group::new("g");
        g.state = GroupState::Stable;
        g.generation = 7;
        g.protocol_type = Some("consumer".to_string());
        g.protocol = Some("range".to_string());
        g.leader = Some("m1".to_string());
        g.members.insert("m1".to_string(), member("m1", None));
        g.members
            .insert("m2".to_string(), member("m2", Some("static-2")));
        g
    }

    /// OffsetDelete's rule: a consumer group's members keep the offsets of
    /// the topics they subscribe to; unknown subscriptions keep everything;
    /// another protocol type with members refuses; no members, all go.
    #[test]
    fn offset_delete_keeps_what_members_subscribe_to() {
        use bytes::{BufMut, BytesMut};
        use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
        use kafka_protocol::protocol::{Encodable, StrBytes};
        let mut g = stable_group();
        let mut buf = BytesMut::new();
        buf.put_i16(1);
        ConsumerProtocolSubscription::default()
            .with_topics(vec![StrBytes::from_static_str("a")])
            .encode(&mut buf, 1)
            .unwrap();
        let sub = buf.freeze();
        for m in g.members.values_mut() {
            m.protocols = vec![("range".to_string(), sub.clone())];
        }
        let parts = vec![("a".to_string(), 0), ("b".to_string(), 3)];
        use ErrorCode::{GroupSubscribedToTopic as Subscribed, None as Ok_};
        assert_eq!(g.offset_delete_codes(&parts), Ok(vec![Subscribed, Ok_]));
        // one member's subscription does not decode: nothing is known
        g.members.get_mut("m2").unwrap().protocols =
            vec![("range".to_string(), Bytes::from_static(b"\x00"))];
        assert_eq!(
            g.offset_delete_codes(&parts),
            Ok(vec![Subscribed, Subscribed])
        );
        g.protocol_type = Some("connect".to_string());
        assert_eq!(g.offset_delete_codes(&parts), Err(ErrorCode::NonEmptyGroup));
        g.members.clear();
        assert_eq!(g.offset_delete_codes(&parts), Ok(vec![Ok_, Ok_]));
    }

    /// Deleting a partition's offset drops its pending transactional
    /// offsets too; a group left with nothing is gone.
    #[test]
    fn a_partition_delete_drops_pending_offsets_and_empties_the_group() {
        let meta = OffsetMeta {
            offset: 5,
            leader_epoch: -1,
            metadata: None,
            commit_ms: 0,
        };
        let mut groups = HashMap::new();
        for (pid, p) in [(None, 0), (Some(7), 0), (Some(7), 1)] {
            let (topic, group) = ("t".to_string(), "g".to_string());
            apply(
                &mut groups,
                match pid {
                    None => OffsetRecord::Commit {
                        group,
                        topic,
                        partition: p,
                        meta: meta.clone(),
                    },
                    Some(pid) => OffsetRecord::TxnCommit {
                        pid,
                        group,
                        topic,
                        partition: p,
                        meta: meta.clone(),
                    },
                },
            );
        }
        let delete = |p| OffsetRecord::Delete {
            group: "g".to_string(),
            topic: Some("t".to_string()),
            partition: Some(p),
        };
        apply(&mut groups, delete(0));
        let g = &groups["g"];
        assert!(g.offsets.is_empty());
        assert!(!g.has_pending("t", 0) && g.has_pending("t", 1));
        apply(&mut groups, delete(1));
        assert!(!groups.contains_key("g"));
    }

    /// What is written is what comes back at start: generation, leader,
    /// protocol, members with subscriptions and assignments; the group is
    /// Stable again.
    #[test]
    fn membership_written_and_restored_round_trips() {
        let g = stable_group();
        let rec = g.membership().unwrap();
        let json = serde_json::to_vec(&OffsetRecord::Membership(rec.clone())).unwrap();
        let mut groups = HashMap::new();
        apply(&mut groups, serde_json::from_slice(&json).unwrap());
        let r = groups.get_mut("g").unwrap();
        r.restore(Instant::now());
        assert_eq!(r.state, GroupState::Stable);
        assert_eq!(r.generation, 7);
        assert_eq!(r.leader.as_deref(), Some("m1"));
        assert_eq!(r.membership().unwrap(), rec);
        assert_eq!(
            r.members["m2"].assignment,
            Bytes::from_static(b"\x00\x01asg")
        );
        assert_eq!(r.members["m2"].instance_id.as_deref(), Some("static-2"));
    }

    /// Nothing is written in the middle of a rebalance; an emptied group is
    /// restored Empty with its generation.
    #[test]
    fn only_groups_at_rest_are_written() {
        let mut g = stable_group();
        g.state = GroupState::PreparingRebalance;
        assert!(g.membership().is_none());
        g.state = GroupState::CompletingRebalance;
        assert!(g.membership().is_none());
        g.state = GroupState::Empty;
        g.members.clear();
        let rec = g.membership().unwrap();
        let mut r = Group::new("g");
        r.written = Some(rec);
        r.restore(Instant::now());
        assert_eq!((r.state, r.generation), (GroupState::Empty, 7));
    }

    /// KIP-345 fencing: an instance id now held by another member id fences
    /// the old one; dynamic members and the current holder are not fenced.
    #[test]
    fn replaced_static_member_is_fenced() {
        let g = stable_group();
        assert!(!g.fenced_instance("m2", Some("static-2")));
        assert!(g.fenced_instance("m2-old", Some("static-2")));
        assert!(g.fenced_instance("m2", Some("another")));
        assert!(!g.fenced_instance("m1", None));
        assert!(!g.fenced_instance("unknown", None));
        assert!(!g.fenced_instance("unknown", Some("never-seen")));
    }

    fn settings() -> GroupSettings {
        GroupSettings {
            initial_rebalance_delay: Duration::ZERO,
            min_session_timeout_ms: 1,
            max_session_timeout_ms: 10_000,
            offsets_retention_ms: 86_400_000,
            compact: crate::backend::local::internal_log::CompactPolicy { min_records: 100 },
        }
    }

    /// A committed offset with no leader epoch or metadata.
    fn meta(offset: i64) -> OffsetMeta {
        OffsetMeta {
            offset,
            leader_epoch: -1,
            metadata: None,
            commit_ms: 1,
        }
    }

    async fn committed(groups: &Groups, partition: i32) -> i64 {
        let got = groups
            .fetch_offsets("g", Some(vec![("t".to_string(), vec![partition])]), false)
            .await;
        got[0].offset
    }

    /// A transaction ends while its TxnOffsetCommit is still on its way to
    /// the disk (a fencing abort racing a zombie's offsets): the end follows
    /// the commit in the log, so the offsets are dropped, and the next
    /// transaction of the same producer id does not commit them; a restart
    /// replays the same. A commit whose verification fails writes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_end_racing_a_transactional_commit_follows_it() {
        let dir = tempfile::tempdir().unwrap();
        let groups = Groups::open(dir.path(), settings()).unwrap();
        let commit = groups.txn_commit(
            "g",
            7,
            -1,
            "",
            None,
            vec![("t".into(), 0, meta(40))],
            || ErrorCode::None,
        );
        let (code, ended) = tokio::join!(commit, groups.complete_txn(7, false));
        assert_eq!(code, ErrorCode::None);
        ended.unwrap();
        let refused = groups
            .txn_commit(
                "g",
                7,
                -1,
                "",
                None,
                vec![("t".into(), 0, meta(50))],
                || ErrorCode::InvalidTxnState,
            )
            .await;
        assert_eq!(refused, ErrorCode::InvalidTxnState);
        groups.complete_txn(7, true).await.unwrap();
        assert_eq!(committed(&groups, 0).await, -1);
        drop(groups);
        let reopened = Groups::open(dir.path(), settings()).unwrap();
        reopened.complete_txn(7, true).await.unwrap();
        assert_eq!(committed(&reopened, 0).await, -1);
    }

    /// Commits are applied off the lock by the log's writer thread: what a
    /// fetch sees after many concurrent commits is what a restart replays
    /// (the log's order), and every commit is seen by a fetch after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_commits_apply_in_log_order() {
        let dir = tempfile::tempdir().unwrap();
        let groups = Arc::new(Groups::open(dir.path(), settings()).unwrap());
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..200i64 {
            let g = groups.clone();
            tasks.spawn(async move {
                let meta = OffsetMeta {
                    offset: i,
                    leader_epoch: -1,
                    metadata: None,
                    commit_ms: 1,
                };
                let p = (i % 2) as i32;
                let code = g
                    .commit("g", -1, "", None, vec![("t".into(), p, meta)])
                    .await;
                assert_eq!(code, ErrorCode::None);
                // Read your write: at least this commit (or a later one) is seen.
                assert!(committed(&g, p).await >= 0);
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        let live = (committed(&groups, 0).await, committed(&groups, 1).await);
        drop(groups);
        let reopened = Groups::open(dir.path(), settings()).unwrap();
        let replayed = (committed(&reopened, 0).await, committed(&reopened, 1).await);
        assert_eq!(live, replayed);
    }

    /// The offsets log compacts itself (every 100 records here): committed
    /// offsets and a transaction's pending offsets survive it and a
    /// reopen, and the pending ones still wait for their transaction's end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn compaction_keeps_committed_and_pending_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let groups = Groups::open(dir.path(), settings()).unwrap();
        for i in 0..999i64 {
            let p = (i % 3) as i32;
            let code = groups
                .commit("g", -1, "", None, vec![("t".into(), p, meta(i))])
                .await;
            assert_eq!(code, ErrorCode::None);
        }
        let code = groups
            .txn_commit(
                "g",
                7,
                -1,
                "",
                None,
                vec![("t".into(), 0, meta(5000))],
                || ErrorCode::None,
            )
            .await;
        assert_eq!(code, ErrorCode::None);
        drop(groups);
        let reopened = Groups::open(dir.path(), settings()).unwrap();
        assert_eq!(committed(&reopened, 0).await, 996);
        assert_eq!(committed(&reopened, 1).await, 997);
        assert_eq!(committed(&reopened, 2).await, 998);
        reopened.complete_txn(7, true).await.unwrap();
        assert_eq!(committed(&reopened, 0).await, 5000);
        let bases: Vec<i64> = std::fs::read_dir(
            crate::backend::local::datadir::internal_dir(dir.path()).join("__consumer_offsets-0"),
        )
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".log").map(|b| b.parse().unwrap())
        })
        .collect();
        // Compacted: one segment, written at the end of the log as it was.
        assert_eq!(bases.len(), 1);
        assert!(bases[0] > 0, "{bases:?}");
    }
}
