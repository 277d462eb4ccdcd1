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
//! Group state machine (Kafka's): Empty → PreparingRebalance (a join) →
//! CompletingRebalance (every member rejoined, or the rebalance timeout
//! passed: JoinGroup answers go out, the leader gets the member list) →
//! Stable (the leader's SyncGroup delivered the assignments). A join, a
//! leave or an expired session sends a Stable group back to
//! PreparingRebalance; heartbeats then answer REBALANCE_IN_PROGRESS so
//! members rejoin.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, Mutex};

use crate::error::ErrorCode;
use crate::error::TopicError;
use crate::internal_log::{InternalLog, OnDurable, Pending, PersistError};
use crate::storage::SharedStateLog;
use oncelog_log::now_ms;

pub use crate::datadir::OFFSETS_TOPIC;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetMeta {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    pub commit_ms: i64,
}

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

/// What a JoinGroup waiter receives.
#[derive(Debug, Clone)]
pub struct JoinResult {
    pub error: ErrorCode,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// (member id, instance id, metadata) — for the leader only.
    pub members: Vec<(String, Option<String>, Bytes)>,
}

pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    pub last_seen: Instant,
    join_waiter: Option<oneshot::Sender<JoinResult>>,
    sync_waiter: Option<oneshot::Sender<(ErrorCode, Bytes)>>,
}

pub struct Group {
    pub id: String,
    pub state: GroupState,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub members: BTreeMap<String, Member>,
    /// When the join phase must end (rebalance timeout), and the earliest it may
    /// (the initial rebalance delay of an empty group).
    join_deadline: Option<Instant>,
    join_not_before: Option<Instant>,
    pub offsets: HashMap<(String, i32), OffsetMeta>,
    /// Producer id → offsets committed in its open transaction.
    pub pending: HashMap<i64, HashMap<(String, i32), OffsetMeta>>,
    /// The membership last written to the offsets log.
    written: Option<MembershipRecord>,
}

/// A group's membership as the offsets log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct MembershipRecord {
    group: String,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: Vec<MemberRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct MemberRecord {
    id: String,
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: u64,
    rebalance_timeout_ms: u64,
    /// (protocol name, the member's metadata for it).
    protocols: Vec<(String, Vec<u8>)>,
    assignment: Vec<u8>,
}

impl Group {
    fn new(id: &str) -> Self {
        Self {
            id: id.to_string(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            join_deadline: None,
            join_not_before: None,
            offsets: HashMap::new(),
            pending: HashMap::new(),
            written: None,
        }
    }

    /// The membership to keep, when the group is at rest (Stable or Empty).
    fn membership(&self) -> Option<MembershipRecord> {
        if !matches!(self.state, GroupState::Stable | GroupState::Empty) {
            return None;
        }
        Some(MembershipRecord {
            group: self.id.clone(),
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            members: self
                .members
                .values()
                .map(|m| MemberRecord {
                    id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: m.session_timeout.as_millis() as u64,
                    rebalance_timeout_ms: m.rebalance_timeout.as_millis() as u64,
                    protocols: m
                        .protocols
                        .iter()
                        .map(|(n, md)| (n.clone(), md.to_vec()))
                        .collect(),
                    assignment: m.assignment.to_vec(),
                })
                .collect(),
        })
    }

    /// Takes up the membership last written (at start): the generation
    /// goes on, every member's session starts at `now`.
    fn restore(&mut self, now: Instant) {
        let Some(r) = self.written.clone() else {
            return;
        };
        self.generation = r.generation;
        self.protocol_type = r.protocol_type;
        self.protocol = r.protocol;
        self.leader = r.leader;
        self.members = r
            .members
            .into_iter()
            .map(|m| {
                let member = Member {
                    id: m.id.clone(),
                    instance_id: m.instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    session_timeout: Duration::from_millis(m.session_timeout_ms),
                    rebalance_timeout: Duration::from_millis(m.rebalance_timeout_ms),
                    protocols: m
                        .protocols
                        .into_iter()
                        .map(|(n, md)| (n, Bytes::from(md)))
                        .collect(),
                    assignment: Bytes::from(m.assignment),
                    last_seen: now,
                    join_waiter: None,
                    sync_waiter: None,
                };
                (m.id, member)
            })
            .collect();
        self.state = if self.members.is_empty() {
            GroupState::Empty
        } else {
            GroupState::Stable
        };
    }

    /// FENCED_INSTANCE_ID when `instance_id` now belongs to another member
    /// id than `member_id` (a newer incarnation of a static member took its
    /// place), or `member_id` is a static member with another instance id.
    fn fenced_instance(&self, member_id: &str, instance_id: Option<&str>) -> bool {
        let Some(iid) = instance_id else {
            return false;
        };
        if let Some(m) = self.members.get(member_id) {
            return m.instance_id.as_deref() != Some(iid);
        }
        self.members
            .values()
            .any(|m| m.instance_id.as_deref() == Some(iid))
    }

    pub fn has_pending(&self, topic: &str, partition: i32) -> bool {
        let k = (topic.to_string(), partition);
        self.pending.values().any(|m| m.contains_key(&k))
    }

    /// Starts (or keeps) a rebalance.
    fn prepare_rebalance(&mut self, now: Instant, initial_delay: Duration) {
        if self.state == GroupState::PreparingRebalance {
            return;
        }
        // Members waiting for their assignment learn that a new round started.
        for m in self.members.values_mut() {
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send((ErrorCode::RebalanceInProgress, Bytes::new()));
            }
        }
        let timeout = self
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or(Duration::from_secs(60));
        self.join_deadline = Some(now + timeout);
        self.join_not_before = (self.state == GroupState::Empty).then(|| now + initial_delay);
        self.state = GroupState::PreparingRebalance;
    }

    fn all_joined(&self) -> bool {
        !self.members.is_empty() && self.members.values().all(|m| m.join_waiter.is_some())
    }

    /// Ends the join phase: drops members that did not rejoin, picks the
    /// protocol, bumps the generation and answers every JoinGroup.
    fn complete_join(&mut self) {
        self.members.retain(|_, m| m.join_waiter.is_some());
        self.join_deadline = None;
        self.join_not_before = None;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.generation += 1;
            self.protocol = None;
            self.leader = None;
            return;
        }
        self.generation += 1;
        if self
            .leader
            .as_ref()
            .is_none_or(|l| !self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        // The first protocol of the leader's list that every member supports.
        let leader = self.leader.clone().unwrap_or_default();
        let candidates: Vec<String> = self
            .members
            .get(&leader)
            .map(|m| m.protocols.iter().map(|(n, _)| n.clone()).collect())
            .unwrap_or_default();
        self.protocol = candidates.into_iter().find(|p| {
            self.members
                .values()
                .all(|m| m.protocols.iter().any(|(n, _)| n == p))
        });
        self.state = GroupState::CompletingRebalance;
        let proto = self.protocol.clone();
        let members: Vec<(String, Option<String>, Bytes)> = self
            .members
            .values()
            .map(|m| {
                let meta = m
                    .protocols
                    .iter()
                    .find(|(n, _)| Some(n) == proto.as_ref())
                    .map(|(_, md)| md.clone())
                    .unwrap_or_default();
                (m.id.clone(), m.instance_id.clone(), meta)
            })
            .collect();
        for m in self.members.values_mut() {
            m.assignment = Bytes::new();
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(JoinResult {
                    error: ErrorCode::None,
                    generation: self.generation,
                    protocol_type: self.protocol_type.clone(),
                    protocol: proto.clone(),
                    leader: leader.clone(),
                    member_id: m.id.clone(),
                    members: if m.id == leader {
                        members.clone()
                    } else {
                        Vec::new()
                    },
                });
            }
        }
    }

    fn remove_member(&mut self, id: &str, now: Instant, initial_delay: Duration) {
        if let Some(mut m) = self.members.remove(id) {
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(join_error(ErrorCode::UnknownMemberId, id));
            }
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send((ErrorCode::UnknownMemberId, Bytes::new()));
            }
        }
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.join_deadline = None;
            self.join_not_before = None;
            self.generation += 1;
            self.protocol = None;
        } else {
            self.prepare_rebalance(now, initial_delay);
            if self.state == GroupState::PreparingRebalance && self.all_joined() {
                self.complete_join();
            }
        }
    }
}

fn join_error(error: ErrorCode, member_id: &str) -> JoinResult {
    JoinResult {
        error,
        generation: -1,
        protocol_type: None,
        protocol: None,
        leader: String::new(),
        member_id: member_id.to_string(),
        members: Vec::new(),
    }
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
}

pub struct Groups {
    /// The groups. Never held while waiting for the offsets log: changes
    /// are applied by the log's writer thread, in log order, once durable.
    state: Arc<Mutex<Inner>>,
    log: SharedStateLog,
    settings: GroupSettings,
    next_member: AtomicU64,
}

struct Inner {
    groups: HashMap<String, Group>,
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
            (Some(t), Some(p)) => {
                if let Some(g) = groups.get_mut(&group) {
                    g.offsets.remove(&(t, p));
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

/// Errors of the membership calls.
pub type GroupResult<T> = Result<T, ErrorCode>;

pub struct JoinRequest {
    pub group: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a first join without a member id is told its id and rejoins.
    pub require_known_member_id: bool,
}

impl Groups {
    pub fn open(data_dir: &Path, settings: GroupSettings) -> Result<Self, TopicError> {
        let (log, records) = InternalLog::open(data_dir, "__consumer_offsets-0")?;
        let mut groups = HashMap::new();
        let mut foreign = 0usize;
        let client_written = crate::datadir::client_written(data_dir, "__consumer_offsets-0");
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
        let log = log
            .into_writer("__consumer_offsets-0")
            .map_err(|e| TopicError::Storage(format!("start the offsets log writer: {e}")))?;
        Ok(Self {
            state: Arc::new(Mutex::new(Inner { groups })),
            log: Arc::new(log),
            settings,
            next_member: AtomicU64::new(0),
        })
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

    /// Writes `group`'s membership if it is at rest and differs from what
    /// the log holds. Membership is not acknowledged to anyone: if the write
    /// fails it is logged, and after a restart the members rebalance.
    fn save_membership(&self, inner: &mut Inner, group: &str) {
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
        let rx = {
            let mut inner = self.state.lock().await;
            let now = Instant::now();
            let delay = self.settings.initial_rebalance_delay;
            let g = inner
                .groups
                .entry(req.group.clone())
                .or_insert_with(|| Group::new(&req.group));
            if let Some(pt) = &g.protocol_type {
                if !g.members.is_empty() && pt != &req.protocol_type {
                    return join_error(ErrorCode::InconsistentGroupProtocol, &req.member_id);
                }
            }
            if !g.members.is_empty()
                && !req.protocols.iter().any(|(n, _)| {
                    g.members
                        .values()
                        .all(|m| m.protocols.iter().any(|(x, _)| x == n))
                })
            {
                return join_error(ErrorCode::InconsistentGroupProtocol, &req.member_id);
            }
            let mut member_id = req.member_id.clone();
            if member_id.is_empty() {
                // A static member coming back replaces its previous incarnation.
                let previous = req.instance_id.as_ref().and_then(|iid| {
                    g.members
                        .values()
                        .find(|m| m.instance_id.as_ref() == Some(iid))
                        .map(|m| m.id.clone())
                });
                member_id = self.new_member_id(&req.client_id);
                if let Some(old) = previous {
                    let Some(mut m) = g.members.remove(&old) else {
                        return join_error(ErrorCode::UnknownMemberId, &req.member_id);
                    };
                    if let Some(w) = m.join_waiter.take() {
                        let _ = w.send(join_error(ErrorCode::FencedInstanceId, &old));
                    }
                    if let Some(w) = m.sync_waiter.take() {
                        let _ = w.send((ErrorCode::FencedInstanceId, Bytes::new()));
                    }
                    let was_leader = g.leader.as_deref() == Some(old.as_str());
                    let keeps_protocol = g
                        .protocol
                        .as_ref()
                        .is_some_and(|p| req.protocols.iter().any(|(n, _)| n == p));
                    tracing::info!(group = %g.id, instance = ?req.instance_id, old_member = %old,
                        new_member = %member_id, "static member rejoined");
                    if g.state == GroupState::Stable && keeps_protocol {
                        // KIP-345: a static member coming back to a stable
                        // group keeps its assignment; no rebalance. When it
                        // led the group it leads it still, but the answer
                        // names the old leader id, so the member does not
                        // take itself for the leader and assign anew (an
                        // assignment a stable group would not hand out).
                        m.id = member_id.clone();
                        m.protocols = req.protocols.clone();
                        m.client_id = req.client_id.clone();
                        m.client_host = req.client_host.clone();
                        m.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
                        m.rebalance_timeout =
                            Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64);
                        m.last_seen = Instant::now();
                        g.members.insert(member_id.clone(), m);
                        let answered_leader = g.leader.clone().unwrap_or_default();
                        if was_leader {
                            g.leader = Some(member_id.clone());
                        }
                        let res = JoinResult {
                            error: ErrorCode::None,
                            generation: g.generation,
                            protocol_type: g.protocol_type.clone(),
                            protocol: g.protocol.clone(),
                            leader: answered_leader,
                            member_id,
                            members: Vec::new(),
                        };
                        self.save_membership(&mut inner, &req.group);
                        return res;
                    }
                    if was_leader {
                        g.leader = Some(member_id.clone());
                    }
                } else if req.require_known_member_id && req.instance_id.is_none() {
                    // KIP-394: tell a dynamic member its id; it rejoins with it.
                    return join_error(ErrorCode::MemberIdRequired, &member_id);
                }
            } else if !g.members.contains_key(&member_id) {
                // v4+: the id we handed out with MEMBER_ID_REQUIRED (or one
                // from before a restart) is accepted; older versions rejoin.
                if !req.require_known_member_id {
                    return join_error(ErrorCode::UnknownMemberId, &member_id);
                }
            } else if let Some(m) = g.members.get(&member_id) {
                if m.instance_id.is_some() && m.instance_id != req.instance_id {
                    return join_error(ErrorCode::FencedInstanceId, &member_id);
                }
            }
            if !member_id.is_empty()
                && !g.members.contains_key(&member_id)
                && g.fenced_instance(&member_id, req.instance_id.as_deref())
            {
                // An older incarnation of a static member that was replaced.
                return join_error(ErrorCode::FencedInstanceId, &member_id);
            }
            let (tx, rx) = oneshot::channel();
            let m =
                g.members
                    .entry(member_id.clone())
                    .or_insert_with(|| Member {
                        id: member_id.clone(),
                        instance_id: req.instance_id.clone(),
                        client_id: req.client_id.clone(),
                        client_host: req.client_host.clone(),
                        session_timeout: Duration::from_millis(req.session_timeout_ms as u64),
                        rebalance_timeout: Duration::from_millis(
                            req.rebalance_timeout_ms.max(0) as u64
                        ),
                        protocols: Vec::new(),
                        assignment: Bytes::new(),
                        last_seen: now,
                        join_waiter: None,
                        sync_waiter: None,
                    });
            m.protocols = req.protocols.clone();
            m.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
            m.rebalance_timeout = Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64);
            m.last_seen = now;
            if let Some(old) = m.join_waiter.replace(tx) {
                let _ = old.send(join_error(ErrorCode::UnknownMemberId, &member_id));
            }
            g.protocol_type = Some(req.protocol_type.clone());
            g.prepare_rebalance(now, delay);
            if g.all_joined() && g.join_not_before.is_none_or(|t| now >= t) {
                g.complete_join();
            }
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
            if g.fenced_instance(member_id, instance_id) {
                return (ErrorCode::FencedInstanceId, Bytes::new(), None, None);
            }
            let proto = (g.protocol_type.clone(), g.protocol.clone());
            let Some(m) = g.members.get_mut(member_id) else {
                return (ErrorCode::UnknownMemberId, Bytes::new(), None, None);
            };
            m.last_seen = Instant::now();
            if generation != g.generation {
                return (ErrorCode::IllegalGeneration, Bytes::new(), None, None);
            }
            match g.state {
                GroupState::Empty => return (ErrorCode::UnknownMemberId, Bytes::new(), None, None),
                GroupState::PreparingRebalance => {
                    return (ErrorCode::RebalanceInProgress, Bytes::new(), None, None)
                }
                GroupState::Stable => {
                    let a = m.assignment.clone();
                    return (ErrorCode::None, a, proto.0, proto.1);
                }
                GroupState::CompletingRebalance => {}
            }
            let (tx, rx) = oneshot::channel();
            m.sync_waiter = Some(tx);
            let leader = g.leader.as_deref() == Some(member_id);
            if leader {
                let given: HashMap<String, Bytes> = assignments.into_iter().collect();
                for m in g.members.values_mut() {
                    m.assignment = given.get(&m.id).cloned().unwrap_or_default();
                    if let Some(w) = m.sync_waiter.take() {
                        let _ = w.send((ErrorCode::None, m.assignment.clone()));
                    }
                }
                g.state = GroupState::Stable;
                tracing::info!(
                    group,
                    generation,
                    members = g.members.len(),
                    protocol = g.protocol.as_deref().unwrap_or(""),
                    "group stable"
                );
            }
            if leader {
                self.save_membership(&mut inner, group);
            }
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
        let Some(g) = inner.groups.get_mut(group) else {
            return ErrorCode::UnknownMemberId;
        };
        if g.fenced_instance(member_id, instance_id) {
            return ErrorCode::FencedInstanceId;
        }
        let state = g.state;
        let gen = g.generation;
        let Some(m) = g.members.get_mut(member_id) else {
            return ErrorCode::UnknownMemberId;
        };
        m.last_seen = Instant::now();
        match state {
            GroupState::PreparingRebalance => ErrorCode::RebalanceInProgress,
            _ if generation != gen => ErrorCode::IllegalGeneration,
            _ => ErrorCode::None,
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
        let now = Instant::now();
        let codes = members
            .into_iter()
            .map(|(id, iid)| {
                let id = if id.is_empty() {
                    iid.as_ref()
                        .and_then(|i| {
                            g.members
                                .values()
                                .find(|m| m.instance_id.as_ref() == Some(i))
                        })
                        .map(|m| m.id.clone())
                        .unwrap_or_default()
                } else {
                    id
                };
                if g.fenced_instance(&id, iid.as_deref()) {
                    return ErrorCode::FencedInstanceId;
                }
                if g.members.contains_key(&id) {
                    tracing::info!(group, member = %id, "member left");
                    g.remove_member(&id, now, delay);
                    ErrorCode::None
                } else {
                    ErrorCode::UnknownMemberId
                }
            })
            .collect();
        self.save_membership(&mut inner, group);
        codes
    }

    /// Checks that (member, generation) may commit for `group`; generation -1
    /// with no member is a standalone commit, allowed while the group is empty.
    fn check_commit(
        g: Option<&Group>,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> ErrorCode {
        let Some(g) = g else {
            return if generation < 0 {
                ErrorCode::None
            } else {
                ErrorCode::IllegalGeneration
            };
        };
        if generation < 0 && member_id.is_empty() {
            return if g.members.is_empty() {
                ErrorCode::None
            } else {
                ErrorCode::UnknownMemberId
            };
        }
        if g.fenced_instance(member_id, instance_id) {
            return ErrorCode::FencedInstanceId;
        }
        if !g.members.contains_key(member_id) {
            return ErrorCode::UnknownMemberId;
        }
        if generation != g.generation {
            return ErrorCode::IllegalGeneration;
        }
        if g.state == GroupState::PreparingRebalance {
            return ErrorCode::RebalanceInProgress;
        }
        ErrorCode::None
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
    pub async fn txn_commit(
        &self,
        group: &str,
        pid: i64,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        offsets: Vec<(String, i32, OffsetMeta)>,
    ) -> ErrorCode {
        let inner = self.state.lock().await;
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
    pub async fn complete_txn(&self, pid: i64, commit: bool) -> Result<(), PersistError> {
        let pending = {
            let inner = self.state.lock().await;
            if !inner.groups.values().any(|g| g.pending.contains_key(&pid)) {
                return Ok(());
            }
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

    /// Timers: ends join phases, expires sessions, drops old offsets of empty groups.
    pub async fn tick(&self) {
        let mut inner = self.state.lock().await;
        let now = Instant::now();
        let delay = self.settings.initial_rebalance_delay;
        let mut changed = Vec::new();
        for g in inner.groups.values_mut() {
            let before = (g.state, g.generation, g.members.len());
            if g.state == GroupState::PreparingRebalance {
                let ready = g.all_joined() && g.join_not_before.is_none_or(|t| now >= t);
                let expired = g.join_deadline.is_some_and(|d| now >= d);
                if ready || expired {
                    if expired && !ready {
                        let late: Vec<String> = g
                            .members
                            .values()
                            .filter(|m| m.join_waiter.is_none())
                            .map(|m| m.id.clone())
                            .collect();
                        for id in &late {
                            tracing::info!(group = %g.id, member = %id, "member did not rejoin in time; removed");
                        }
                    }
                    g.complete_join();
                }
            }
            let expired: Vec<String> = g
                .members
                .values()
                .filter(|m| {
                    m.join_waiter.is_none() && now.duration_since(m.last_seen) > m.session_timeout
                })
                .map(|m| m.id.clone())
                .collect();
            for id in expired {
                tracing::info!(group = %g.id, member = %id, "member session expired; removed");
                g.remove_member(&id, now, delay);
            }
            if (g.state, g.generation, g.members.len()) != before {
                changed.push(g.id.clone());
            }
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
            join_waiter: None,
            sync_waiter: None,
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
        }
    }

    async fn committed(groups: &Groups, partition: i32) -> i64 {
        let got = groups
            .fetch_offsets("g", Some(vec![("t".to_string(), vec![partition])]), false)
            .await;
        got[0].offset
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
}
