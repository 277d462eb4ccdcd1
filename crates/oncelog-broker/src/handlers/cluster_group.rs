//! Consumer groups in cluster mode. The broker coordinating a group
//! (`cluster::groups`, claimed in PostgreSQL) runs local mode's membership
//! handlers on it; any other broker answers `NOT_COORDINATOR`, and clients
//! look the coordinator up again. Committed offsets are PostgreSQL rows,
//! written only while this broker's session is live and still coordinates
//! the group; transactional offsets are pending rows of their producer until
//! the transaction's end.

use std::collections::HashMap;
use std::sync::Arc;

use kafka_protocol::messages::delete_groups_request::DeleteGroupsRequest;
use kafka_protocol::messages::delete_groups_response::{
    DeletableGroupResult, DeleteGroupsResponse,
};
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::describe_groups_response::{DescribeGroupsResponse, DescribedGroup};
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::heartbeat_response::HeartbeatResponse;
use kafka_protocol::messages::join_group_request::JoinGroupRequest;
use kafka_protocol::messages::join_group_response::JoinGroupResponse;
use kafka_protocol::messages::leave_group_request::LeaveGroupRequest;
use kafka_protocol::messages::leave_group_response::LeaveGroupResponse;
use kafka_protocol::messages::list_groups_request::ListGroupsRequest;
use kafka_protocol::messages::list_groups_response::ListGroupsResponse;
use kafka_protocol::messages::offset_commit_request::OffsetCommitRequest;
use kafka_protocol::messages::offset_commit_response::OffsetCommitResponse;
use kafka_protocol::messages::offset_delete_request::OffsetDeleteRequest;
use kafka_protocol::messages::offset_delete_response::OffsetDeleteResponse;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequest;
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponse;
use kafka_protocol::messages::sync_group_request::SyncGroupRequest;
use kafka_protocol::messages::sync_group_response::SyncGroupResponse;
use kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequest;
use kafka_protocol::messages::txn_offset_commit_response::TxnOffsetCommitResponse;
use kafka_protocol::protocol::StrBytes;

use super::group;
use crate::cluster::front::Front;
use crate::cluster::groups::{self as cg, Claim};
use crate::cluster::ClusterError;
use crate::error::ErrorCode;
use crate::txn_coordinator::VerifyError;
use crate::Broker;

/// Whether this broker coordinates `group`: `Ok(())`, or the code to answer.
/// A fresh claim starts the group's membership afresh.
async fn coordinate(b: &Broker, front: &Front, group: &str) -> Result<(), ErrorCode> {
    if group.is_empty() {
        return Err(ErrorCode::InvalidGroupId);
    }
    match front.groups.coordinate(&front.cluster, group).await {
        Ok(Claim::Held) => Ok(()),
        Ok(Claim::Claimed) => {
            b.groups.forget_membership(group).await;
            Ok(())
        }
        Ok(Claim::Elsewhere(_)) => Err(ErrorCode::NotCoordinator),
        Err(e) => Err(storage_code(front, group, &e)),
    }
}

fn storage_code(front: &Front, group: &str, e: &ClusterError) -> ErrorCode {
    match e {
        ClusterError::NotCoordinator(_) | ClusterError::Fenced { .. } => ErrorCode::NotCoordinator,
        e => {
            crate::cluster::outage::cluster_warn!(front.cluster.outage, *e, group, error = %e, "cluster: group coordination failed");
            ErrorCode::CoordinatorNotAvailable
        }
    }
}

pub async fn join_group(
    b: Arc<Broker>,
    front: &Front,
    req: JoinGroupRequest,
    version: i16,
    client_id: String,
    client_host: String,
) -> JoinGroupResponse {
    match coordinate(&b, front, req.group_id.0.as_str()).await {
        Ok(()) => group::join_group(b, req, version, client_id, client_host).await,
        Err(code) => JoinGroupResponse::default()
            .with_error_code(code.code())
            .with_generation_id(-1)
            .with_member_id(req.member_id),
    }
}

pub async fn sync_group(
    b: Arc<Broker>,
    front: &Front,
    req: SyncGroupRequest,
    version: i16,
) -> SyncGroupResponse {
    match coordinate(&b, front, req.group_id.0.as_str()).await {
        Ok(()) => group::sync_group(b, req, version).await,
        Err(code) => SyncGroupResponse::default().with_error_code(code.code()),
    }
}

pub async fn heartbeat(b: Arc<Broker>, front: &Front, req: HeartbeatRequest) -> HeartbeatResponse {
    match coordinate(&b, front, req.group_id.0.as_str()).await {
        Ok(()) => group::heartbeat(b, req).await,
        Err(code) => HeartbeatResponse::default().with_error_code(code.code()),
    }
}

pub async fn leave_group(
    b: Arc<Broker>,
    front: &Front,
    req: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    match coordinate(&b, front, req.group_id.0.as_str()).await {
        Ok(()) => group::leave_group(b, req, version).await,
        Err(code) => LeaveGroupResponse::default().with_error_code(code.code()),
    }
}

pub async fn offset_commit(
    b: Arc<Broker>,
    front: &Front,
    req: OffsetCommitRequest,
    version: i16,
) -> OffsetCommitResponse {
    let group_id = req.group_id.0.to_string();
    if let Err(code) = coordinate(&b, front, &group_id).await {
        return group::commit_response(&req, &[], code);
    }
    let mut partitions: HashMap<String, i32> = HashMap::new();
    for t in &req.topics {
        if let Ok(Some(row)) = front.topic(t.name.0.as_str()).await {
            partitions.insert(row.name.clone(), row.partitions);
        }
    }
    let (offsets, unknown) = group::commit_request_offsets(&req, version, |t, p| {
        partitions.get(t).is_some_and(|n| p >= 0 && p < *n)
    });
    let iid = group::commit_instance_id(&req, version);
    let mut code = b
        .groups
        .check_member(
            &group_id,
            req.generation_id_or_member_epoch,
            req.member_id.as_str(),
            iid.as_deref(),
        )
        .await;
    if code == ErrorCode::None && !offsets.is_empty() {
        if let Err(e) = cg::commit_offsets(&front.cluster, &group_id, &offsets).await {
            code = storage_code(front, &group_id, &e);
        }
    }
    group::commit_response(&req, &unknown, code)
}

pub async fn offset_fetch(
    b: Arc<Broker>,
    front: &Front,
    req: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let group_id = req.group_id.0.to_string();
    let answer = match coordinate(&b, front, &group_id).await {
        Ok(()) => cg::fetch_offsets(
            &front.cluster,
            &group_id,
            group::fetch_request_topics(&req),
            version >= 7 && req.require_stable,
        )
        .await
        .map_err(|e| storage_code(front, &group_id, &e)),
        Err(code) => Err(code),
    };
    match answer {
        Ok(rows) => group::fetch_response(rows, version),
        Err(code) => {
            let mut resp = OffsetFetchResponse::default();
            if version >= 2 {
                resp.error_code = code.code();
            }
            resp
        }
    }
}

/// ListGroups: the groups this broker coordinates (clients ask every broker).
/// ListGroups: the groups FindCoordinator names this broker for (their
/// live owner, else the rendezvous choice), so an admin client that asks
/// every broker lists each group once. A group this broker coordinates
/// with membership in memory shows its state; any other (only committed
/// offsets, a simple consumer's) is Empty with no protocol type.
pub async fn list_groups(
    b: Arc<Broker>,
    front: &Front,
    req: ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
    let me = front.cluster.config.broker_id;
    let live: Vec<i32> = front.live_now().await.iter().map(|x| x.id).collect();
    let all = match cg::all_groups(&front.cluster).await {
        Ok(all) => all,
        Err(e) => {
            crate::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: ListGroups could not read the groups");
            return ListGroupsResponse::default()
                .with_error_code(ErrorCode::CoordinatorNotAvailable.code());
        }
    };
    let held = front.groups.held(front.cluster.session.session());
    let memory: HashMap<String, (String, &'static str)> = b
        .groups
        .list()
        .await
        .into_iter()
        .map(|(id, ptype, st)| (id, (ptype, st)))
        .collect();
    // A group with neither offsets nor members here is gone (its owner row
    // outlived its last offsets, e.g. those of a deleted topic), as Kafka
    // drops an empty group without offsets.
    let mine = all
        .into_iter()
        .filter(|(g, owner, _)| {
            owner
                .filter(|o| live.contains(o))
                .or_else(|| crate::cluster::rendezvous(g.as_bytes(), &live))
                == Some(me)
        })
        .filter_map(
            |(g, _, has_offsets)| match memory.get(&g).filter(|_| held.contains(&g)) {
                Some((_, "Empty")) | None if !has_offsets => None,
                Some((ptype, st)) => Some((g, ptype.clone(), *st)),
                None => Some((g, String::new(), "Empty")),
            },
        )
        .collect();
    group::list_groups_response(&req, version, mine)
}

/// DeleteGroups: on the coordinator, a group with members is refused
/// (NON_EMPTY_GROUP, as local mode); otherwise its committed offsets are
/// deleted in PostgreSQL and its membership forgotten. A group with neither
/// members nor offsets is GROUP_ID_NOT_FOUND.
pub async fn delete_groups(
    b: Arc<Broker>,
    front: &Front,
    req: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(req.groups_names.len());
    for gid in req.groups_names {
        let group = gid.0.to_string();
        let code = match coordinate(&b, front, &group).await {
            Err(code) => code,
            Ok(()) => match b.groups.member_count(&group).await {
                Some(n) if n > 0 => ErrorCode::NonEmptyGroup,
                known => match cg::delete_offsets(&front.cluster, &group).await {
                    Ok(n) => {
                        // The owner row went too: the next request claims anew.
                        front.groups.release(&group);
                        b.groups.forget_membership(&group).await;
                        if n == 0 && known.is_none() {
                            ErrorCode::GroupIdNotFound
                        } else {
                            tracing::info!(group = %group, offsets = n, "group deleted");
                            ErrorCode::None
                        }
                    }
                    Err(e) => storage_code(front, &group, &e),
                },
            },
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(gid)
                .with_error_code(code.code()),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

/// OffsetDelete on the coordinator: the rule is local mode's
/// ([`crate::groups::Group::offset_delete_codes`]) on the membership this
/// broker holds; a group it knows no members of may lose any offset. The
/// rows go in one PostgreSQL transaction under this broker's fencing token
/// and the group's owner row, pending transactional offsets of the same
/// partitions with them; a group left with no members and no offsets loses
/// its owner row too (it is gone, as in Kafka). A group with neither
/// members nor offsets is GROUP_ID_NOT_FOUND.
pub async fn offset_delete(
    b: Arc<Broker>,
    front: &Front,
    req: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    let group = req.group_id.0.to_string();
    let mut exists = HashMap::new();
    for t in &req.topics {
        let name = t.name.0.to_string();
        if exists.contains_key(&name) {
            continue;
        }
        match front.topic(&name).await {
            Ok(row) => exists.insert(name, row.map(|r| r.partitions).unwrap_or(0)),
            Err(e) => {
                let code = storage_code(front, &group, &e);
                return OffsetDeleteResponse::default().with_error_code(code.code());
            }
        };
    }
    let parts = group::offset_delete_partitions(&req, |t, p| {
        p >= 0 && exists.get(t).is_some_and(|n| p < *n)
    });
    let known = group::offset_delete_known(&parts);
    let result = offset_delete_known(&b, front, &group, &known).await;
    group::offset_delete_response(&parts, result)
}

async fn offset_delete_known(
    b: &Broker,
    front: &Front,
    group: &str,
    known: &[(String, i32)],
) -> Result<Vec<ErrorCode>, ErrorCode> {
    coordinate(b, front, group).await?;
    let decided = b
        .groups
        .with_group(group, |g| {
            (g.offset_delete_codes(known), g.members.is_empty())
        })
        .await;
    let known_members = decided.is_some();
    let (codes, no_members) = match decided {
        Some((codes, no_members)) => (codes?, no_members),
        None => (vec![ErrorCode::None; known.len()], true),
    };
    let eligible: Vec<(String, i32)> = known
        .iter()
        .zip(&codes)
        .filter(|(_, c)| **c == ErrorCode::None)
        .map(|(tp, _)| tp.clone())
        .collect();
    match cg::delete_partition_offsets(&front.cluster, group, &eligible, no_members).await {
        Ok(cg::OffsetsDeleted {
            group_had_offsets,
            group_gone,
            deleted,
        }) => {
            if !known_members && !group_had_offsets {
                return Err(ErrorCode::GroupIdNotFound);
            }
            if group_gone {
                front.groups.release(group);
                b.groups.forget_membership(group).await;
            }
            tracing::info!(
                group,
                partitions = eligible.len(),
                rows = deleted,
                "committed offsets deleted"
            );
            Ok(codes)
        }
        Err(e) => Err(storage_code(front, group, &e)),
    }
}

pub async fn describe_groups(
    b: Arc<Broker>,
    front: &Front,
    req: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let mut out = Vec::with_capacity(req.groups.len());
    for gid in &req.groups {
        let one = match coordinate(&b, front, gid.0.as_str()).await {
            Ok(()) => {
                let mut single = req.clone();
                single.groups = vec![gid.clone()];
                let mut d = group::describe_groups(b.clone(), single, version)
                    .await
                    .groups
                    .pop();
                // Not in memory but with committed offsets (a simple
                // consumer's, or members gone before a coordinator move):
                // Empty, as Kafka's coordinator has it.
                if let Some(g) = d.as_mut().filter(|g| g.group_state.as_str() == "Dead") {
                    match cg::has_offsets(&front.cluster, gid.0.as_str()).await {
                        Ok(true) => g.group_state = StrBytes::from_static_str("Empty"),
                        Ok(false) => {}
                        Err(e) => g.error_code = storage_code(front, gid.0.as_str(), &e).code(),
                    }
                }
                d
            }
            Err(code) => Some(
                DescribedGroup::default()
                    .with_group_id(gid.clone())
                    .with_error_code(code.code())
                    .with_group_state(StrBytes::from_static_str("")),
            ),
        };
        out.extend(one);
    }
    DescribeGroupsResponse::default().with_groups(out)
}

/// TxnOffsetCommit, on the group's coordinator: the offsets are pending in
/// the producer's transaction until its end.
pub async fn txn_offset_commit(
    b: Arc<Broker>,
    front: &Front,
    req: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    let group_id = req.group_id.0.to_string();
    let (pid, epoch) = (req.producer_id.0, req.producer_epoch);
    let mut code = match coordinate(&b, front, &group_id).await {
        Ok(()) => ErrorCode::None,
        Err(code) => code,
    };
    let (generation, member, iid) = group::txn_commit_member(&req, version);
    if code == ErrorCode::None && !member.is_empty() {
        // KIP-447: a member id must be of the group's current generation.
        code = match b
            .groups
            .check_member(&group_id, generation, &member, iid.as_deref())
            .await
        {
            ErrorCode::RebalanceInProgress => ErrorCode::None,
            c => c,
        };
    }
    if code == ErrorCode::None {
        let offsets = group::txn_commit_offsets(&req, version);
        code = match cg::txn_commit_offsets(
            &front.cluster,
            &group_id,
            req.transactional_id.0.as_str(),
            pid,
            epoch,
            &offsets,
        )
        .await
        {
            Ok(Ok(())) => ErrorCode::None,
            Ok(Err(VerifyError::StaleEpoch)) => ErrorCode::InvalidProducerEpoch,
            Ok(Err(VerifyError::NotInTransaction)) => ErrorCode::InvalidTxnState,
            Err(e) => storage_code(front, &group_id, &e),
        };
    }
    if code != ErrorCode::None {
        tracing::warn!(group = %group_id, producer_id = pid, epoch, error = ?code,
            "cluster: TxnOffsetCommit refused");
    }
    group::txn_commit_response(&req, code)
}
