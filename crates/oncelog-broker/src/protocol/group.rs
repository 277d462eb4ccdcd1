//! Consumer-group APIs (classic protocol) and the transactional offset
//! commit APIs: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
//! OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete,
//! AddOffsetsToTxn, TxnOffsetCommit.

use std::collections::HashMap;
use std::sync::Arc;

use kafka_protocol::messages::add_offsets_to_txn_request::AddOffsetsToTxnRequest;
use kafka_protocol::messages::add_offsets_to_txn_response::AddOffsetsToTxnResponse;
use kafka_protocol::messages::delete_groups_request::DeleteGroupsRequest;
use kafka_protocol::messages::delete_groups_response::{
    DeletableGroupResult, DeleteGroupsResponse,
};
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::describe_groups_response::{
    DescribeGroupsResponse, DescribedGroup, DescribedGroupMember,
};
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::heartbeat_response::HeartbeatResponse;
use kafka_protocol::messages::join_group_request::JoinGroupRequest;
use kafka_protocol::messages::join_group_response::{JoinGroupResponse, JoinGroupResponseMember};
use kafka_protocol::messages::leave_group_request::LeaveGroupRequest;
use kafka_protocol::messages::leave_group_response::{LeaveGroupResponse, MemberResponse};
use kafka_protocol::messages::list_groups_request::ListGroupsRequest;
use kafka_protocol::messages::list_groups_response::{ListGroupsResponse, ListedGroup};
use kafka_protocol::messages::offset_commit_request::OffsetCommitRequest;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponse, OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_request::OffsetDeleteRequest;
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponse, OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequest;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponse, OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequest;
use kafka_protocol::messages::sync_group_response::SyncGroupResponse;
use kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequest;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponse, TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{GroupId, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::coordinators::groups::{FetchedOffset, JoinRequest, OffsetMeta};
use crate::error::ErrorCode;
use crate::Broker;
use oncelog_log::now_ms;

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

pub async fn join_group(
    b: Arc<Broker>,
    req: JoinGroupRequest,
    version: i16,
    client_id: String,
    client_host: String,
) -> JoinGroupResponse {
    if let Err(code) = b.group_store().coordinate(req.group_id.0.as_str()).await {
        return JoinGroupResponse::default()
            .with_error_code(code.code())
            .with_generation_id(-1)
            .with_member_id(req.member_id);
    }
    let r = b
        .groups
        .join(JoinRequest {
            group: req.group_id.0.to_string(),
            member_id: req.member_id.to_string(),
            instance_id: req.group_instance_id.as_ref().map(|x| x.to_string()),
            client_id,
            client_host,
            session_timeout_ms: req.session_timeout_ms,
            rebalance_timeout_ms: if version >= 1 {
                req.rebalance_timeout_ms
            } else {
                req.session_timeout_ms
            },
            protocol_type: req.protocol_type.to_string(),
            protocols: req
                .protocols
                .iter()
                .map(|p| (p.name.to_string(), p.metadata.clone()))
                .collect(),
            require_known_member_id: version >= 4,
        })
        .await;
    let mut resp = JoinGroupResponse::default()
        .with_error_code(r.error.code())
        .with_generation_id(r.generation)
        .with_leader(s(r.leader))
        .with_member_id(s(r.member_id))
        .with_members(
            r.members
                .into_iter()
                .map(|(id, iid, meta)| {
                    let mut m = JoinGroupResponseMember::default()
                        .with_member_id(s(id))
                        .with_metadata(meta);
                    if version >= 5 {
                        m.group_instance_id = iid.map(s);
                    }
                    m
                })
                .collect(),
        );
    if version >= 7 {
        resp.protocol_type = r.protocol_type.map(s);
        resp.protocol_name = r.protocol.map(s);
    } else {
        resp.protocol_name = Some(s(r.protocol.unwrap_or_default()));
    }
    resp
}

pub async fn sync_group(b: Arc<Broker>, req: SyncGroupRequest, version: i16) -> SyncGroupResponse {
    if let Err(code) = b.group_store().coordinate(req.group_id.0.as_str()).await {
        return SyncGroupResponse::default().with_error_code(code.code());
    }
    let assignments = req
        .assignments
        .iter()
        .map(|a| (a.member_id.to_string(), a.assignment.clone()))
        .collect();
    let (code, assignment, ptype, pname) = b
        .groups
        .sync(
            req.group_id.0.as_str(),
            req.generation_id,
            req.member_id.as_str(),
            req.group_instance_id.as_ref().map(|x| x.as_str()),
            assignments,
        )
        .await;
    let mut resp = SyncGroupResponse::default()
        .with_error_code(code.code())
        .with_assignment(assignment);
    if version >= 5 {
        resp.protocol_type = ptype.map(s);
        resp.protocol_name = pname.map(s);
    }
    resp
}

pub async fn heartbeat(b: Arc<Broker>, req: HeartbeatRequest) -> HeartbeatResponse {
    if let Err(code) = b.group_store().coordinate(req.group_id.0.as_str()).await {
        return HeartbeatResponse::default().with_error_code(code.code());
    }
    let code = b
        .groups
        .heartbeat(
            req.group_id.0.as_str(),
            req.generation_id,
            req.member_id.as_str(),
            req.group_instance_id.as_ref().map(|x| x.as_str()),
        )
        .await;
    HeartbeatResponse::default().with_error_code(code.code())
}

pub async fn leave_group(
    b: Arc<Broker>,
    req: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    if let Err(code) = b.group_store().coordinate(req.group_id.0.as_str()).await {
        return LeaveGroupResponse::default().with_error_code(code.code());
    }
    let members: Vec<(String, Option<String>)> = if version >= 3 {
        req.members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|x| x.to_string()),
                )
            })
            .collect()
    } else {
        vec![(req.member_id.to_string(), None)]
    };
    let codes = b
        .groups
        .leave(req.group_id.0.as_str(), members.clone())
        .await;
    let mut resp = LeaveGroupResponse::default();
    if version >= 3 {
        resp.members = members
            .into_iter()
            .zip(codes)
            .map(|((id, iid), c)| {
                MemberResponse::default()
                    .with_member_id(s(id))
                    .with_group_instance_id(iid.map(s))
                    .with_error_code(c.code())
            })
            .collect();
    } else {
        resp.error_code = codes.first().copied().unwrap_or(ErrorCode::None).code();
    }
    resp
}

/// The offsets an OffsetCommit asks for, and the partitions of it that do
/// not exist (`exists` says which do).
pub fn commit_request_offsets(
    req: &OffsetCommitRequest,
    version: i16,
    exists: impl Fn(&str, i32) -> bool,
) -> (Vec<(String, i32, OffsetMeta)>, Vec<(String, i32)>) {
    let mut offsets = Vec::new();
    let mut unknown = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            if !exists(t.name.0.as_str(), p.partition_index) {
                unknown.push((t.name.0.to_string(), p.partition_index));
                continue;
            }
            offsets.push((
                t.name.0.to_string(),
                p.partition_index,
                OffsetMeta {
                    offset: p.committed_offset,
                    leader_epoch: if version >= 6 {
                        p.committed_leader_epoch
                    } else {
                        -1
                    },
                    metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                    commit_ms: now_ms(),
                },
            ));
        }
    }
    (offsets, unknown)
}

/// OffsetCommit's static member id (v7+).
pub fn commit_instance_id(req: &OffsetCommitRequest, version: i16) -> Option<String> {
    if version >= 7 {
        req.group_instance_id.as_ref().map(|x| x.to_string())
    } else {
        None
    }
}

/// OffsetCommit's answer: `code` for every partition but the unknown ones.
pub fn commit_response(
    req: &OffsetCommitRequest,
    unknown: &[(String, i32)],
    code: ErrorCode,
) -> OffsetCommitResponse {
    let topics = req
        .topics
        .iter()
        .map(|t| {
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let c = if unknown.contains(&(t.name.0.to_string(), p.partition_index)) {
                        ErrorCode::UnknownTopicOrPartition
                    } else {
                        code
                    };
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(c.code())
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(parts)
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

/// The partitions of `topics` that exist, by topic: its partition count.
async fn partition_counts<'a>(
    b: &Broker,
    topics: impl Iterator<Item = &'a str>,
) -> HashMap<String, i32> {
    let catalogue = b.catalogue();
    let mut out = HashMap::new();
    for t in topics {
        if out.contains_key(t) {
            continue;
        }
        if let Ok(Some(meta)) = catalogue.topic(t).await {
            out.insert(t.to_string(), meta.partitions);
        }
    }
    out
}

/// OffsetCommit, in both modes, on the group's coordinator.
pub async fn offset_commit(
    b: Arc<Broker>,
    req: OffsetCommitRequest,
    version: i16,
) -> OffsetCommitResponse {
    let group = req.group_id.0.to_string();
    let store = b.group_store();
    if let Err(code) = store.coordinate(&group).await {
        return commit_response(&req, &[], code);
    }
    let counts = partition_counts(&b, req.topics.iter().map(|t| t.name.0.as_str())).await;
    let (offsets, unknown) = commit_request_offsets(&req, version, |t, p| {
        counts.get(t).is_some_and(|n| (0..*n).contains(&p))
    });
    let iid = commit_instance_id(&req, version);
    let code = if offsets.is_empty() {
        ErrorCode::None
    } else {
        store
            .commit(
                &group,
                req.generation_id_or_member_epoch,
                req.member_id.as_str(),
                iid.as_deref(),
                offsets,
            )
            .await
    };
    commit_response(&req, &unknown, code)
}

/// The partitions an OffsetFetch asks for (`None`: all the group has).
pub fn fetch_request_topics(req: &OffsetFetchRequest) -> Option<Vec<(String, Vec<i32>)>> {
    req.topics.as_ref().map(|ts| {
        ts.iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
            .collect::<Vec<_>>()
    })
}

/// OffsetFetch's answer from its rows, grouped by topic in row order.
pub fn fetch_response(rows: Vec<FetchedOffset>, version: i16) -> OffsetFetchResponse {
    let mut by_topic: Vec<(String, Vec<OffsetFetchResponsePartition>)> = Vec::new();
    for row in rows {
        let mut part = OffsetFetchResponsePartition::default()
            .with_partition_index(row.partition)
            .with_committed_offset(row.offset)
            .with_metadata(row.metadata.map(s))
            .with_error_code(row.error.code());
        if version >= 5 {
            part.committed_leader_epoch = row.leader_epoch;
        }
        match by_topic.iter_mut().find(|(n, _)| *n == row.topic) {
            Some((_, v)) => v.push(part),
            None => by_topic.push((row.topic, vec![part])),
        }
    }
    OffsetFetchResponse::default().with_topics(
        by_topic
            .into_iter()
            .map(|(t, ps)| {
                OffsetFetchResponseTopic::default()
                    .with_name(TopicName(s(t)))
                    .with_partitions(ps)
            })
            .collect(),
    )
}

/// OffsetFetch, in both modes, on the group's coordinator.
pub async fn offset_fetch(
    b: Arc<Broker>,
    req: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let group = req.group_id.0.as_str();
    let store = b.group_store();
    let require_stable = version >= 7 && req.require_stable;
    let rows = match store.coordinate(group).await {
        Ok(()) => {
            store
                .fetch_offsets(group, fetch_request_topics(&req), require_stable)
                .await
        }
        Err(code) => Err(code),
    };
    match rows {
        Ok(rows) => fetch_response(rows, version),
        Err(code) => {
            let mut resp = OffsetFetchResponse::default();
            if version >= 2 {
                resp.error_code = code.code();
            }
            resp
        }
    }
}

/// ListGroups, in both modes: the groups this broker coordinates
/// ([`crate::backend::Groups::list`]; clients ask every broker).
pub async fn list_groups(
    b: Arc<Broker>,
    req: ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
    match b.group_store().list().await {
        Ok(groups) => list_groups_response(&req, version, groups),
        Err(code) => ListGroupsResponse::default().with_error_code(code.code()),
    }
}

/// ListGroups' answer over `groups` (id, protocol type, state name), with
/// the request's state filter (v4+).
pub fn list_groups_response(
    req: &ListGroupsRequest,
    version: i16,
    groups: Vec<(String, String, &'static str)>,
) -> ListGroupsResponse {
    let groups = groups
        .into_iter()
        .filter(|(_, _, st)| {
            version < 4
                || req.states_filter.is_empty()
                || req.states_filter.iter().any(|f| f.as_str() == *st)
        })
        .map(|(id, ptype, st)| {
            let mut g = ListedGroup::default()
                .with_group_id(GroupId(s(id)))
                .with_protocol_type(s(ptype));
            if version >= 4 {
                g.group_state = s(st);
            }
            if version >= 5 {
                g.group_type = s("classic");
            }
            g
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

pub async fn describe_groups(
    b: Arc<Broker>,
    req: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let store = b.group_store();
    let mut out = Vec::new();
    for gid in req.groups {
        if let Err(code) = store.coordinate(gid.0.as_str()).await {
            out.push(
                DescribedGroup::default()
                    .with_group_id(gid)
                    .with_error_code(code.code())
                    .with_group_state(s("")),
            );
            continue;
        }
        let described = b
            .groups
            .with_group(gid.0.as_str(), |g| {
                let proto = g.protocol.clone().unwrap_or_default();
                let members = g
                    .members
                    .values()
                    .map(|m| {
                        let meta = m.metadata_for(Some(&proto));
                        let mut dm = DescribedGroupMember::default()
                            .with_member_id(s(m.id.clone()))
                            .with_client_id(s(m.client_id.clone()))
                            .with_client_host(s(m.client_host.clone()))
                            .with_member_metadata(meta)
                            .with_member_assignment(m.assignment.clone());
                        if version >= 4 {
                            dm.group_instance_id = m.instance_id.clone().map(s);
                        }
                        dm
                    })
                    .collect();
                (
                    g.state.name(),
                    g.protocol_type.clone().unwrap_or_default(),
                    proto,
                    members,
                )
            })
            .await;
        let mut d = DescribedGroup::default().with_group_id(gid);
        match described {
            Some((state, ptype, proto, members)) => {
                d.group_state = s(state);
                d.protocol_type = s(ptype);
                d.protocol_data = s(proto);
                d.members = members;
            }
            None => match store.state_without_members(d.group_id.0.as_str()).await {
                Ok(state) => d.group_state = s(state),
                Err(code) => {
                    d.group_state = s("Dead");
                    d.error_code = code.code();
                }
            },
        }
        out.push(d);
    }
    DescribeGroupsResponse::default().with_groups(out)
}

/// DeleteGroups, in both modes, on each group's coordinator.
pub async fn delete_groups(b: Arc<Broker>, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let store = b.group_store();
    let mut results = Vec::new();
    for gid in req.groups_names {
        let code = match store.coordinate(gid.0.as_str()).await {
            Ok(()) => store.delete(gid.0.as_str()).await,
            Err(code) => code,
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(gid)
                .with_error_code(code.code()),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

/// OffsetDelete's partitions in request order, each with whether its
/// topic has it (`exists`).
pub fn offset_delete_partitions(
    req: &OffsetDeleteRequest,
    exists: impl Fn(&str, i32) -> bool,
) -> Vec<(String, i32, bool)> {
    req.topics
        .iter()
        .flat_map(|t| {
            let name = t.name.0.to_string();
            t.partitions
                .iter()
                .map(move |p| (name.clone(), p.partition_index))
        })
        .map(|(t, p)| {
            let known = exists(&t, p);
            (t, p, known)
        })
        .collect()
}

/// The partitions of existing topics, which go to the group's decision.
pub fn offset_delete_known(parts: &[(String, i32, bool)]) -> Vec<(String, i32)> {
    parts
        .iter()
        .filter(|(_, _, known)| *known)
        .map(|(t, p, _)| (t.clone(), *p))
        .collect()
}

/// OffsetDelete's answer: `Err(code)` for the whole request (GROUP_ID_NOT_FOUND,
/// NON_EMPTY_GROUP, NOT_COORDINATOR, ...), else `codes` (one per known
/// partition, in order) with UNKNOWN_TOPIC_OR_PARTITION for the others.
pub fn offset_delete_response(
    parts: &[(String, i32, bool)],
    result: Result<Vec<ErrorCode>, ErrorCode>,
) -> OffsetDeleteResponse {
    let codes = match result {
        Err(code) => return OffsetDeleteResponse::default().with_error_code(code.code()),
        Ok(codes) => codes,
    };
    let mut codes = codes.into_iter();
    let mut topics: Vec<OffsetDeleteResponseTopic> = Vec::new();
    for (t, p, known) in parts {
        let code = if *known {
            codes.next().unwrap_or(ErrorCode::UnknownServerError)
        } else {
            ErrorCode::UnknownTopicOrPartition
        };
        let part = OffsetDeleteResponsePartition::default()
            .with_partition_index(*p)
            .with_error_code(code.code());
        match topics.last_mut() {
            Some(last) if last.name.0.as_str() == t => last.partitions.push(part),
            _ => topics.push(
                OffsetDeleteResponseTopic::default()
                    .with_name(TopicName(s(t.clone())))
                    .with_partitions(vec![part]),
            ),
        }
    }
    OffsetDeleteResponse::default().with_topics(topics)
}

/// OffsetDelete (what `kafka-consumer-groups --delete-offsets` sends): the
/// group's committed offsets of the partitions asked for go, where the
/// group's rule allows ([`crate::coordinators::groups::Group::offset_delete_codes`]).
pub async fn offset_delete(b: Arc<Broker>, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let group = req.group_id.0.as_str();
    let counts = partition_counts(&b, req.topics.iter().map(|t| t.name.0.as_str())).await;
    let parts = offset_delete_partitions(&req, |t, p| {
        counts.get(t).is_some_and(|n| (0..*n).contains(&p))
    });
    let known = offset_delete_known(&parts);
    let store = b.group_store();
    let result = match store.coordinate(group).await {
        Ok(()) => store.delete_offsets(group, &known).await,
        Err(code) => Err(code),
    };
    offset_delete_response(&parts, result)
}

/// AddOffsetsToTxn: ties the group's offsets to the transaction, so its
/// marker reaches the group coordinator.
pub async fn add_offsets_to_txn(
    b: Arc<Broker>,
    req: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let code = match b
        .txns()
        .add_offsets(
            req.transactional_id.0.as_str(),
            req.producer_id.0,
            req.producer_epoch,
            version >= 2,
        )
        .await
    {
        Ok(()) => ErrorCode::None,
        Err(code) => code,
    };
    AddOffsetsToTxnResponse::default().with_error_code(code.code())
}

pub async fn txn_offset_commit(
    b: Arc<Broker>,
    req: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    let pid = req.producer_id.0;
    let epoch = req.producer_epoch;
    let group = req.group_id.0.to_string();
    let mut code = ErrorCode::None;
    if version >= 5 {
        // KIP-890 transaction version 2: the offsets join the transaction implicitly.
        // (never PRODUCER_FENCED in this answer)
        if let Err(c) = b
            .txns()
            .add_offsets(req.transactional_id.0.as_str(), pid, epoch, false)
            .await
        {
            code = c;
        }
    }
    let store = b.group_store();
    if code == ErrorCode::None {
        if let Err(c) = store.coordinate(&group).await {
            code = c;
        }
    }
    if code == ErrorCode::None {
        let offsets = txn_commit_offsets(&req, version);
        let (generation, member, iid) = txn_commit_member(&req, version);
        code = store
            .txn_commit(
                &group,
                req.transactional_id.0.as_str(),
                pid,
                epoch,
                generation,
                &member,
                iid.as_deref(),
                offsets,
            )
            .await;
    }
    if code != ErrorCode::None {
        tracing::warn!(group = %group, producer_id = pid, epoch, error = ?code, "TxnOffsetCommit refused");
    }
    txn_commit_response(&req, code)
}

/// The offsets a TxnOffsetCommit asks for.
pub fn txn_commit_offsets(
    req: &TxnOffsetCommitRequest,
    version: i16,
) -> Vec<(String, i32, OffsetMeta)> {
    req.topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (
                    t.name.0.to_string(),
                    p.partition_index,
                    OffsetMeta {
                        offset: p.committed_offset,
                        leader_epoch: if version >= 2 {
                            p.committed_leader_epoch
                        } else {
                            -1
                        },
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                        commit_ms: now_ms(),
                    },
                )
            })
        })
        .collect()
}

/// A TxnOffsetCommit's group member (KIP-447, v3+): generation, member id,
/// static instance id.
pub fn txn_commit_member(
    req: &TxnOffsetCommitRequest,
    version: i16,
) -> (i32, String, Option<String>) {
    if version >= 3 {
        (
            req.generation_id,
            req.member_id.to_string(),
            req.group_instance_id.as_ref().map(|x| x.to_string()),
        )
    } else {
        (-1, String::new(), None)
    }
}

/// TxnOffsetCommit's answer: `code` for every partition.
pub fn txn_commit_response(
    req: &TxnOffsetCommitRequest,
    code: ErrorCode,
) -> TxnOffsetCommitResponse {
    let topics = req
        .topics
        .iter()
        .map(|t| {
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            TxnOffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code.code())
                        })
                        .collect(),
                )
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}
