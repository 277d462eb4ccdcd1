//! The group coordinator's state machine: one consumer group's membership
//! (Kafka's classic protocol) and offsets, without I/O, clocks or channels.
//! Every request is a method that takes the time as an input and returns
//! its answer and the effects it has on other members' waiting requests
//! ([`Effect`]): a JoinGroup answered when the join phase ends, a SyncGroup
//! answered when the leader's assignments arrive, either ended by a
//! rebalance, a removal or a fence. The driver (`super::Groups`) keeps the
//! waiting requests, delivers effects, and writes what must be durable.
//!
//! States (Kafka's): Empty → PreparingRebalance (a join) →
//! CompletingRebalance (every member rejoined, or the rebalance timeout
//! passed: JoinGroup answers go out, the leader gets the member list) →
//! Stable (the leader's SyncGroup delivered the assignments). A join, a
//! leave or an expired session sends a Stable group back to
//! PreparingRebalance; heartbeats then answer REBALANCE_IN_PROGRESS.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::ErrorCode;

/// What a request does to other requests that wait.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Answer the JoinGroup that `JoinResult::member_id` is waiting on.
    Join(JoinResult),
    /// Answer the SyncGroup that `member` is waiting on.
    Sync {
        member: String,
        error: ErrorCode,
        assignment: Bytes,
    },
}

/// How a JoinGroup goes on.
#[derive(Debug, Clone, PartialEq)]
pub enum JoinOutcome {
    /// Answered now.
    Answer(JoinResult),
    /// `member` waits (its answer is a [`Effect::Join`], maybe among the
    /// effects of this very request).
    Wait { member: String },
}

/// How a SyncGroup goes on.
#[derive(Debug, Clone, PartialEq)]
pub enum SyncOutcome {
    Answer(ErrorCode, Bytes),
    /// Waits for the leader's assignments (or is among this request's effects).
    Wait,
}

/// A JoinGroup as the machine sees it.
#[derive(Debug, Clone)]
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

/// What a JoinGroup waiter receives.
#[derive(Debug, Clone, PartialEq)]
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
    /// A JoinGroup of this member waits for the join phase to end.
    pub(crate) joining: bool,
    /// A SyncGroup of this member waits for the leader's assignments.
    pub(crate) syncing: bool,
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
    pub(crate) join_deadline: Option<Instant>,
    pub(crate) join_not_before: Option<Instant>,
    pub offsets: HashMap<(String, i32), OffsetMeta>,
    /// Producer id → offsets committed in its open transaction.
    pub pending: HashMap<i64, HashMap<(String, i32), OffsetMeta>>,
    /// The membership last written to the offsets log.
    pub(crate) written: Option<MembershipRecord>,
}

/// A group's membership as the offsets log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MembershipRecord {
    pub(crate) group: String,
    pub(crate) generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    pub(crate) members: Vec<MemberRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemberRecord {
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
    pub(crate) fn new(id: &str) -> Self {
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
    pub(crate) fn membership(&self) -> Option<MembershipRecord> {
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
    pub(crate) fn restore(&mut self, now: Instant) {
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
                    joining: false,
                    syncing: false,
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
    pub(crate) fn fenced_instance(&self, member_id: &str, instance_id: Option<&str>) -> bool {
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

    /// The topics the members subscribe to: a consumer group's members'
    /// subscriptions (ConsumerProtocolSubscription) for the group's
    /// protocol. `None` when that cannot be known (another protocol type,
    /// no protocol chosen yet, a subscription that does not decode): then
    /// every topic counts as subscribed.
    pub fn subscribed_topics(&self) -> Option<BTreeSet<String>> {
        use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
        use kafka_protocol::protocol::{Decodable, Message};
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let protocol = self.protocol.as_deref()?;
        let mut topics = BTreeSet::new();
        for m in self.members.values() {
            let mut buf = m.metadata_for(Some(protocol));
            if buf.len() < 2 {
                return None;
            }
            let version = i16::from_be_bytes([buf[0], buf[1]]);
            let _ = bytes::Buf::get_i16(&mut buf);
            let version = version.clamp(0, ConsumerProtocolSubscription::VERSIONS.max);
            let sub = ConsumerProtocolSubscription::decode(&mut buf, version).ok()?;
            topics.extend(sub.topics.into_iter().map(|t| t.to_string()));
        }
        Some(topics)
    }

    /// OffsetDelete's rule (as Kafka's): a group without members may lose
    /// any partition's offset; a consumer group with members only those of
    /// topics no member subscribes to (the others answer
    /// GROUP_SUBSCRIBED_TO_TOPIC); a group of another protocol type with
    /// members refuses the request (NON_EMPTY_GROUP). Returns one code per
    /// partition, `None` where the offset may go.
    pub fn offset_delete_codes(
        &self,
        partitions: &[(String, i32)],
    ) -> Result<Vec<ErrorCode>, ErrorCode> {
        if self.members.is_empty() {
            return Ok(vec![ErrorCode::None; partitions.len()]);
        }
        if self.protocol_type.as_deref() != Some("consumer") {
            return Err(ErrorCode::NonEmptyGroup);
        }
        let subscribed = self.subscribed_topics();
        Ok(partitions
            .iter()
            .map(|(t, _)| match &subscribed {
                Some(topics) if !topics.contains(t) => ErrorCode::None,
                _ => ErrorCode::GroupSubscribedToTopic,
            })
            .collect())
    }

    /// Starts (or keeps) a rebalance.
    fn prepare_rebalance(&mut self, now: Instant, initial_delay: Duration, out: &mut Vec<Effect>) {
        if self.state == GroupState::PreparingRebalance {
            return;
        }
        // Members waiting for their assignment learn that a new round started.
        for m in self.members.values_mut() {
            if std::mem::take(&mut m.syncing) {
                out.push(Effect::Sync {
                    member: m.id.clone(),
                    error: ErrorCode::RebalanceInProgress,
                    assignment: Bytes::new(),
                });
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
        !self.members.is_empty() && self.members.values().all(|m| m.joining)
    }

    /// Ends the join phase: drops members that did not rejoin, picks the
    /// protocol, bumps the generation and answers every JoinGroup.
    fn complete_join(&mut self, out: &mut Vec<Effect>) {
        self.members.retain(|_, m| m.joining);
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
                let meta = m.metadata_for(proto.as_deref());
                (m.id.clone(), m.instance_id.clone(), meta)
            })
            .collect();
        for m in self.members.values_mut() {
            m.assignment = Bytes::new();
            if std::mem::take(&mut m.joining) {
                out.push(Effect::Join(JoinResult {
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
                }));
            }
        }
    }

    fn remove_member(
        &mut self,
        id: &str,
        now: Instant,
        initial_delay: Duration,
        out: &mut Vec<Effect>,
    ) {
        if let Some(m) = self.members.remove(id) {
            m.dismiss(ErrorCode::UnknownMemberId, out);
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
            self.prepare_rebalance(now, initial_delay, out);
            if self.state == GroupState::PreparingRebalance && self.all_joined() {
                self.complete_join(out);
            }
        }
    }
}

pub(crate) fn join_error(error: ErrorCode, member_id: &str) -> JoinResult {
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

impl Member {
    /// The member's metadata (subscription) for `protocol`; empty if it
    /// does not support it.
    pub fn metadata_for(&self, protocol: Option<&str>) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| Some(n.as_str()) == protocol)
            .map(|(_, md)| md.clone())
            .unwrap_or_default()
    }

    /// The member's waiting requests end with `error`.
    fn dismiss(&self, error: ErrorCode, out: &mut Vec<Effect>) {
        if self.joining {
            out.push(Effect::Join(join_error(error, &self.id)));
        }
        if self.syncing {
            out.push(Effect::Sync {
                member: self.id.clone(),
                error,
                assignment: Bytes::new(),
            });
        }
    }
}

impl Group {
    /// JoinGroup. `fresh_id` is the member id a member joining without one
    /// gets; `delay` the initial rebalance delay of an empty group.
    pub fn join(
        &mut self,
        req: &JoinRequest,
        fresh_id: String,
        now: Instant,
        delay: Duration,
    ) -> (JoinOutcome, Vec<Effect>) {
        let mut out = Vec::new();
        let answer = |e| (JoinOutcome::Answer(e), Vec::new());
        if let Some(pt) = &self.protocol_type {
            if !self.members.is_empty() && pt != &req.protocol_type {
                return answer(join_error(
                    ErrorCode::InconsistentGroupProtocol,
                    &req.member_id,
                ));
            }
        }
        if !self.members.is_empty()
            && !req.protocols.iter().any(|(n, _)| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(x, _)| x == n))
            })
        {
            return answer(join_error(
                ErrorCode::InconsistentGroupProtocol,
                &req.member_id,
            ));
        }
        let mut member_id = req.member_id.clone();
        if member_id.is_empty() {
            // A static member coming back replaces its previous incarnation.
            let previous = req.instance_id.as_ref().and_then(|iid| {
                self.members
                    .values()
                    .find(|m| m.instance_id.as_ref() == Some(iid))
                    .map(|m| m.id.clone())
            });
            member_id = fresh_id;
            if let Some(old) = previous {
                let Some(mut m) = self.members.remove(&old) else {
                    return answer(join_error(ErrorCode::UnknownMemberId, &req.member_id));
                };
                m.dismiss(ErrorCode::FencedInstanceId, &mut out);
                m.joining = false;
                m.syncing = false;
                let was_leader = self.leader.as_deref() == Some(old.as_str());
                let keeps_protocol = self
                    .protocol
                    .as_ref()
                    .is_some_and(|p| req.protocols.iter().any(|(n, _)| n == p));
                tracing::info!(group = %self.id, instance = ?req.instance_id, old_member = %old,
                    new_member = %member_id, "static member rejoined");
                if self.state == GroupState::Stable && keeps_protocol {
                    // KIP-345: a static member coming back to a stable group
                    // keeps its assignment; no rebalance. When it led the
                    // group it leads it still, but the answer names the old
                    // leader id, so the member does not take itself for the
                    // leader and assign anew (an assignment a stable group
                    // would not hand out).
                    m.id = member_id.clone();
                    m.protocols = req.protocols.clone();
                    m.client_id = req.client_id.clone();
                    m.client_host = req.client_host.clone();
                    m.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
                    m.rebalance_timeout =
                        Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64);
                    m.last_seen = now;
                    self.members.insert(member_id.clone(), m);
                    let answered_leader = self.leader.clone().unwrap_or_default();
                    if was_leader {
                        self.leader = Some(member_id.clone());
                    }
                    let res = JoinResult {
                        error: ErrorCode::None,
                        generation: self.generation,
                        protocol_type: self.protocol_type.clone(),
                        protocol: self.protocol.clone(),
                        leader: answered_leader,
                        member_id,
                        members: Vec::new(),
                    };
                    return (JoinOutcome::Answer(res), out);
                }
                if was_leader {
                    self.leader = Some(member_id.clone());
                }
            } else if req.require_known_member_id && req.instance_id.is_none() {
                // KIP-394: tell a dynamic member its id; it rejoins with it.
                return answer(join_error(ErrorCode::MemberIdRequired, &member_id));
            }
        } else if !self.members.contains_key(&member_id) {
            // v4+: the id we handed out with MEMBER_ID_REQUIRED (or one from
            // before a restart) is accepted; older versions rejoin.
            if !req.require_known_member_id {
                return answer(join_error(ErrorCode::UnknownMemberId, &member_id));
            }
        } else if let Some(m) = self.members.get(&member_id) {
            if m.instance_id.is_some() && m.instance_id != req.instance_id {
                return answer(join_error(ErrorCode::FencedInstanceId, &member_id));
            }
        }
        if !member_id.is_empty()
            && !self.members.contains_key(&member_id)
            && self.fenced_instance(&member_id, req.instance_id.as_deref())
        {
            // An older incarnation of a static member that was replaced.
            return (
                JoinOutcome::Answer(join_error(ErrorCode::FencedInstanceId, &member_id)),
                out,
            );
        }
        let m = self
            .members
            .entry(member_id.clone())
            .or_insert_with(|| Member {
                id: member_id.clone(),
                instance_id: req.instance_id.clone(),
                client_id: req.client_id.clone(),
                client_host: req.client_host.clone(),
                session_timeout: Duration::from_millis(req.session_timeout_ms as u64),
                rebalance_timeout: Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64),
                protocols: Vec::new(),
                assignment: Bytes::new(),
                last_seen: now,
                joining: false,
                syncing: false,
            });
        m.protocols = req.protocols.clone();
        m.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
        m.rebalance_timeout = Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64);
        m.last_seen = now;
        // A JoinGroup already waiting for this member is superseded by this
        // one; the driver answers it UNKNOWN_MEMBER_ID.
        m.joining = true;
        self.protocol_type = Some(req.protocol_type.clone());
        self.prepare_rebalance(now, delay, &mut out);
        if self.all_joined() && self.join_not_before.is_none_or(|t| now >= t) {
            self.complete_join(&mut out);
        }
        (JoinOutcome::Wait { member: member_id }, out)
    }

    /// SyncGroup. The leader's `assignments` end the rebalance.
    pub fn sync(
        &mut self,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
    ) -> (SyncOutcome, Vec<Effect>) {
        let answer = |e| (SyncOutcome::Answer(e, Bytes::new()), Vec::new());
        if self.fenced_instance(member_id, instance_id) {
            return answer(ErrorCode::FencedInstanceId);
        }
        let state = self.state;
        let current = self.generation;
        let Some(m) = self.members.get_mut(member_id) else {
            return answer(ErrorCode::UnknownMemberId);
        };
        m.last_seen = now;
        if generation != current {
            return answer(ErrorCode::IllegalGeneration);
        }
        match state {
            GroupState::Empty => return answer(ErrorCode::UnknownMemberId),
            GroupState::PreparingRebalance => return answer(ErrorCode::RebalanceInProgress),
            GroupState::Stable => {
                return (
                    SyncOutcome::Answer(ErrorCode::None, m.assignment.clone()),
                    Vec::new(),
                )
            }
            GroupState::CompletingRebalance => {}
        }
        m.syncing = true;
        let mut out = Vec::new();
        if self.leader.as_deref() == Some(member_id) {
            let given: HashMap<String, Bytes> = assignments.into_iter().collect();
            for m in self.members.values_mut() {
                m.assignment = given.get(&m.id).cloned().unwrap_or_default();
                if std::mem::take(&mut m.syncing) {
                    out.push(Effect::Sync {
                        member: m.id.clone(),
                        error: ErrorCode::None,
                        assignment: m.assignment.clone(),
                    });
                }
            }
            self.state = GroupState::Stable;
            tracing::info!(group = %self.id, generation, members = self.members.len(),
                protocol = self.protocol.as_deref().unwrap_or(""), "group stable");
        }
        (SyncOutcome::Wait, out)
    }

    /// Heartbeat: keeps the session; tells the member about a rebalance.
    pub fn heartbeat(
        &mut self,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        now: Instant,
    ) -> ErrorCode {
        if self.fenced_instance(member_id, instance_id) {
            return ErrorCode::FencedInstanceId;
        }
        let (state, current) = (self.state, self.generation);
        let Some(m) = self.members.get_mut(member_id) else {
            return ErrorCode::UnknownMemberId;
        };
        m.last_seen = now;
        match state {
            GroupState::PreparingRebalance => ErrorCode::RebalanceInProgress,
            _ if generation != current => ErrorCode::IllegalGeneration,
            _ => ErrorCode::None,
        }
    }

    /// LeaveGroup for each (member id, instance id): a code per member.
    pub fn leave(
        &mut self,
        members: Vec<(String, Option<String>)>,
        now: Instant,
        delay: Duration,
    ) -> (Vec<ErrorCode>, Vec<Effect>) {
        let mut out = Vec::new();
        let codes = members
            .into_iter()
            .map(|(id, iid)| {
                let id = if id.is_empty() {
                    iid.as_ref()
                        .and_then(|i| {
                            self.members
                                .values()
                                .find(|m| m.instance_id.as_ref() == Some(i))
                        })
                        .map(|m| m.id.clone())
                        .unwrap_or_default()
                } else {
                    id
                };
                if self.fenced_instance(&id, iid.as_deref()) {
                    return ErrorCode::FencedInstanceId;
                }
                if self.members.contains_key(&id) {
                    tracing::info!(group = %self.id, member = %id, "member left");
                    self.remove_member(&id, now, delay, &mut out);
                    ErrorCode::None
                } else {
                    ErrorCode::UnknownMemberId
                }
            })
            .collect();
        (codes, out)
    }

    /// Timers at `now`: ends a join phase whose members all rejoined (after
    /// the initial delay) or whose rebalance timeout passed, and removes
    /// members whose session expired. True if the membership changed.
    pub fn tick(&mut self, now: Instant, delay: Duration) -> (bool, Vec<Effect>) {
        let mut out = Vec::new();
        let before = (self.state, self.generation, self.members.len());
        if self.state == GroupState::PreparingRebalance {
            let ready = self.all_joined() && self.join_not_before.is_none_or(|t| now >= t);
            let expired = self.join_deadline.is_some_and(|d| now >= d);
            if ready || expired {
                if expired && !ready {
                    for m in self.members.values().filter(|m| !m.joining) {
                        tracing::info!(group = %self.id, member = %m.id, "member did not rejoin in time; removed");
                    }
                }
                self.complete_join(&mut out);
            }
        }
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| !m.joining && now.duration_since(m.last_seen) > m.session_timeout)
            .map(|m| m.id.clone())
            .collect();
        for id in expired {
            tracing::info!(group = %self.id, member = %id, "member session expired; removed");
            self.remove_member(&id, now, delay, &mut out);
        }
        let changed = (self.state, self.generation, self.members.len()) != before;
        (changed, out)
    }

    /// Whether (member, generation) may commit offsets; generation -1 with
    /// no member is a standalone commit, allowed while the group is empty.
    pub fn check_commit(
        &self,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> ErrorCode {
        if generation < 0 && member_id.is_empty() {
            return if self.members.is_empty() {
                ErrorCode::None
            } else {
                ErrorCode::UnknownMemberId
            };
        }
        if self.fenced_instance(member_id, instance_id) {
            return ErrorCode::FencedInstanceId;
        }
        if !self.members.contains_key(member_id) {
            return ErrorCode::UnknownMemberId;
        }
        if generation != self.generation {
            return ErrorCode::IllegalGeneration;
        }
        if self.state == GroupState::PreparingRebalance {
            return ErrorCode::RebalanceInProgress;
        }
        ErrorCode::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::ZERO;

    fn req(member_id: &str, instance: Option<&str>) -> JoinRequest {
        JoinRequest {
            group: "g".into(),
            member_id: member_id.into(),
            instance_id: instance.map(str::to_string),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"sub"))],
            require_known_member_id: true,
        }
    }

    fn joined(e: &Effect) -> (&str, ErrorCode, i32, usize) {
        match e {
            Effect::Join(r) => (&r.member_id, r.error, r.generation, r.members.len()),
            other => panic!("expected a join answer, got {other:?}"),
        }
    }

    fn synced(e: &Effect) -> (&str, ErrorCode, &[u8]) {
        match e {
            Effect::Sync {
                member,
                error,
                assignment,
            } => (member, *error, assignment),
            other => panic!("expected a sync answer, got {other:?}"),
        }
    }

    fn asg(pairs: &[(&str, &'static [u8])]) -> Vec<(String, Bytes)> {
        pairs
            .iter()
            .map(|(m, a)| (m.to_string(), Bytes::from_static(a)))
            .collect()
    }

    /// A group of `a` and `b` at generation 2, Stable, `a` leading.
    fn two_member_group(t0: Instant) -> Group {
        let mut g = Group::new("g");
        g.join(&req("a", None), "-".into(), t0, DELAY);
        g.sync(1, "a", None, asg(&[("a", b"A")]), t0);
        g.join(&req("b", None), "-".into(), t0, DELAY);
        g.join(&req("a", None), "-".into(), t0, DELAY);
        g.sync(2, "b", None, vec![], t0);
        g.sync(2, "a", None, asg(&[("a", b"A"), ("b", b"B")]), t0);
        assert_eq!((g.state, g.generation), (GroupState::Stable, 2));
        g
    }

    #[test]
    fn join_sync_heartbeat_and_a_second_member() {
        let t0 = Instant::now();
        let mut g = Group::new("g");
        // KIP-394: a new dynamic member is told its id first.
        let (o, e) = g.join(&req("", None), "a-1".into(), t0, DELAY);
        match o {
            JoinOutcome::Answer(r) => {
                assert_eq!(
                    (r.error, r.member_id.as_str()),
                    (ErrorCode::MemberIdRequired, "a-1")
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(e.is_empty() && g.members.is_empty());
        // Rejoining with it ends the join phase at once (no initial delay).
        let (o, e) = g.join(&req("a-1", None), "-".into(), t0, DELAY);
        assert_eq!(
            o,
            JoinOutcome::Wait {
                member: "a-1".into()
            }
        );
        assert_eq!(e.len(), 1);
        assert_eq!(joined(&e[0]), ("a-1", ErrorCode::None, 1, 1));
        assert_eq!(g.state, GroupState::CompletingRebalance);
        // The leader's SyncGroup delivers the assignments, its own included.
        let (o, e) = g.sync(1, "a-1", None, asg(&[("a-1", b"A")]), t0);
        assert_eq!(o, SyncOutcome::Wait);
        assert_eq!(synced(&e[0]), ("a-1", ErrorCode::None, &b"A"[..]));
        assert_eq!(g.state, GroupState::Stable);
        assert_eq!(g.heartbeat(1, "a-1", None, t0), ErrorCode::None);
        assert_eq!(
            g.heartbeat(0, "a-1", None, t0),
            ErrorCode::IllegalGeneration
        );
        assert_eq!(g.heartbeat(1, "x", None, t0), ErrorCode::UnknownMemberId);
        // A second member: a rebalance that waits for the first to rejoin.
        let (o, e) = g.join(&req("b-1", None), "-".into(), t0, DELAY);
        assert_eq!(
            o,
            JoinOutcome::Wait {
                member: "b-1".into()
            }
        );
        assert!(e.is_empty());
        assert_eq!(g.state, GroupState::PreparingRebalance);
        assert_eq!(
            g.heartbeat(1, "a-1", None, t0),
            ErrorCode::RebalanceInProgress
        );
        let (_, e) = g.join(&req("a-1", None), "-".into(), t0, DELAY);
        let mut answers: Vec<_> = e.iter().map(joined).collect();
        answers.sort_by_key(|a| a.0);
        // Both are answered with generation 2; only the leader gets the members.
        assert_eq!(
            answers,
            vec![
                ("a-1", ErrorCode::None, 2, 2),
                ("b-1", ErrorCode::None, 2, 0)
            ]
        );
        // A follower's SyncGroup waits for the leader's.
        let (o, e) = g.sync(2, "b-1", None, vec![], t0);
        assert_eq!((o, e.len()), (SyncOutcome::Wait, 0));
        let (_, e) = g.sync(2, "a-1", None, asg(&[("a-1", b"A"), ("b-1", b"B")]), t0);
        let mut got: Vec<_> = e.iter().map(synced).collect();
        got.sort_by_key(|a| a.0);
        assert_eq!(
            got,
            vec![
                ("a-1", ErrorCode::None, &b"A"[..]),
                ("b-1", ErrorCode::None, &b"B"[..])
            ]
        );
        // A SyncGroup of a stable generation is answered at once.
        assert_eq!(
            g.sync(2, "b-1", None, vec![], t0).0,
            SyncOutcome::Answer(ErrorCode::None, Bytes::from_static(b"B"))
        );
    }

    #[test]
    fn a_new_round_ends_waiting_syncs_and_a_leave_rebalances() {
        let t0 = Instant::now();
        let mut g = two_member_group(t0);
        // b rejoins (say, its subscription changed): a must rejoin too.
        g.join(&req("b", None), "-".into(), t0, DELAY);
        let (_, e) = g.join(&req("a", None), "-".into(), t0, DELAY);
        assert_eq!(e.len(), 2);
        // b waits in SyncGroup; c's join starts a new round, ending that wait.
        g.sync(3, "b", None, vec![], t0);
        let (_, e) = g.join(&req("c", None), "-".into(), t0, DELAY);
        assert_eq!(
            e.iter().map(synced).collect::<Vec<_>>(),
            vec![("b", ErrorCode::RebalanceInProgress, &b""[..])]
        );
        // c leaves while the others have not rejoined: its join is ended.
        let (codes, e) = g.leave(vec![("c".into(), None), ("zz".into(), None)], t0, DELAY);
        assert_eq!(codes, vec![ErrorCode::None, ErrorCode::UnknownMemberId]);
        assert_eq!(
            e.iter().map(joined).collect::<Vec<_>>(),
            vec![("c", ErrorCode::UnknownMemberId, -1, 0)]
        );
        assert_eq!(g.state, GroupState::PreparingRebalance);
    }

    #[test]
    fn sessions_expire_and_join_phases_time_out_on_tick() {
        let t0 = Instant::now();
        let mut g = two_member_group(t0);
        // a heartbeats, b does not: past b's session (10 s) it is removed.
        assert_eq!(
            g.heartbeat(2, "a", None, t0 + Duration::from_secs(6)),
            ErrorCode::None
        );
        let (changed, e) = g.tick(t0 + Duration::from_secs(11), DELAY);
        assert!(changed && e.is_empty());
        assert!(!g.members.contains_key("b"));
        assert_eq!(g.state, GroupState::PreparingRebalance);
        // a does not rejoin within the rebalance timeout (30 s): the join
        // phase ends without it and the group is empty.
        let (changed, _) = g.tick(t0 + Duration::from_secs(42), DELAY);
        assert!(changed);
        assert_eq!(
            (g.state, g.members.len(), g.generation),
            (GroupState::Empty, 0, 3)
        );
        // Nothing more to do.
        assert_eq!(g.tick(t0 + Duration::from_secs(99), DELAY), (false, vec![]));
    }

    #[test]
    fn the_initial_delay_holds_the_first_join_phase() {
        let t0 = Instant::now();
        let mut g = Group::new("g");
        let delay = Duration::from_secs(3);
        let (_, e) = g.join(&req("a", None), "-".into(), t0, delay);
        assert!(
            e.is_empty(),
            "an empty group waits the initial delay for more members"
        );
        let (_, e) = g.join(
            &req("b", None),
            "-".into(),
            t0 + Duration::from_secs(1),
            delay,
        );
        assert!(e.is_empty());
        assert_eq!(g.tick(t0 + Duration::from_secs(2), delay).1, vec![]);
        let (_, e) = g.tick(t0 + Duration::from_secs(3), delay);
        assert_eq!(e.len(), 2);
    }

    #[test]
    fn a_static_member_coming_back_keeps_its_place_and_fences_the_old_one() {
        let t0 = Instant::now();
        let mut g = Group::new("g");
        g.join(&req("a", None), "-".into(), t0, DELAY);
        g.sync(1, "a", None, asg(&[("a", b"A")]), t0);
        g.join(&req("s1", Some("static")), "-".into(), t0, DELAY);
        g.join(&req("a", None), "-".into(), t0, DELAY);
        g.sync(2, "a", None, asg(&[("a", b"A"), ("s1", b"S")]), t0);
        assert_eq!(g.state, GroupState::Stable);
        // A new incarnation comes: no member id, the same instance id.
        let (o, e) = g.join(&req("", Some("static")), "s2".into(), t0, DELAY);
        let JoinOutcome::Answer(r) = o else {
            panic!("a stable group answers a returning static member at once")
        };
        assert_eq!(
            (r.error, r.generation, r.member_id.as_str()),
            (ErrorCode::None, 2, "s2")
        );
        assert!(e.is_empty());
        assert_eq!(g.state, GroupState::Stable, "no rebalance");
        assert_eq!(g.members["s2"].assignment, Bytes::from_static(b"S"));
        // The old incarnation is fenced everywhere.
        assert_eq!(
            g.heartbeat(2, "s1", Some("static"), t0),
            ErrorCode::FencedInstanceId
        );
        assert_eq!(
            g.sync(2, "s1", Some("static"), vec![], t0).0,
            SyncOutcome::Answer(ErrorCode::FencedInstanceId, Bytes::new())
        );
        assert_eq!(
            g.check_commit(2, "s1", Some("static")),
            ErrorCode::FencedInstanceId
        );
        let (codes, _) = g.leave(vec![("s1".into(), Some("static".into()))], t0, DELAY);
        assert_eq!(codes, vec![ErrorCode::FencedInstanceId]);
        // A waiting request of a replaced incarnation is ended FENCED_INSTANCE_ID.
        g.members.get_mut("s2").unwrap().syncing = true;
        let (_, e) = g.join(&req("", Some("static")), "s3".into(), t0, DELAY);
        assert_eq!(
            e.iter().map(synced).collect::<Vec<_>>(),
            vec![("s2", ErrorCode::FencedInstanceId, &b""[..])]
        );
    }

    #[test]
    fn commit_checks_for_offset_and_kip447_commits() {
        let t0 = Instant::now();
        let mut g = two_member_group(t0);
        assert_eq!(g.check_commit(2, "a", None), ErrorCode::None);
        assert_eq!(g.check_commit(1, "a", None), ErrorCode::IllegalGeneration);
        assert_eq!(
            g.check_commit(2, "nobody", None),
            ErrorCode::UnknownMemberId
        );
        // A standalone commit (no member) while the group has members.
        assert_eq!(g.check_commit(-1, "", None), ErrorCode::UnknownMemberId);
        g.join(&req("c", None), "-".into(), t0, DELAY);
        assert_eq!(g.check_commit(2, "a", None), ErrorCode::RebalanceInProgress);
        let mut empty = Group::new("e");
        assert_eq!(empty.check_commit(-1, "", None), ErrorCode::None);
        assert_eq!(
            empty.heartbeat(0, "x", None, t0),
            ErrorCode::UnknownMemberId
        );
    }
}
