//! The authorizer in front of the handlers: for each request, the checks
//! Kafka's broker makes (KafkaApis) with the errors it answers. A request
//! wholly denied is answered here; one denied in part goes on without the
//! denied items, which the [`Fixup`] adds back to the response with their
//! error. With no authorizer configured every check passes and nothing is
//! touched.

use std::net::IpAddr;
use std::sync::Arc;

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_acls_response::DeleteAclsFilterResult;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::Conn;
use crate::error::ErrorCode;
use crate::security::acl::{Operation as Op, ResourceType as Rt, CLUSTER_NAME};
use crate::Broker;

/// Who asks, for the checks.
#[derive(Clone)]
pub struct Who {
    b: Arc<Broker>,
    principal: String,
    host: IpAddr,
}

impl Who {
    fn can(&self, op: Op, t: Rt, name: &str) -> bool {
        self.b
            .authz
            .allowed(&self.principal, self.host, op, t, name)
    }

    fn cluster(&self, op: Op) -> bool {
        self.can(op, Rt::Cluster, CLUSTER_NAME)
    }

    /// Logs a denial of `what` on `res`.
    fn denied(&self, what: &str, res: &str) {
        tracing::warn!(principal = %self.principal, host = %self.host, request = what, resource = res, "authorization denied");
    }
}

/// The request to handle and what to do to its response, or the answer to
/// a request denied as a whole.
type Guarded = Result<(RequestKind, Fixup), ResponseKind>;

const TOPIC_DENIED: i16 = ErrorCode::TopicAuthorizationFailed.code();
const GROUP_DENIED: i16 = ErrorCode::GroupAuthorizationFailed.code();
const CLUSTER_DENIED: i16 = ErrorCode::ClusterAuthorizationFailed.code();
const TXN_DENIED: i16 = ErrorCode::TransactionalIdAuthorizationFailed.code();

fn msg(s: &str) -> Option<StrBytes> {
    Some(StrBytes::from_string(s.to_string()))
}

/// What to add to (or take from) the response of a request let through in part.
pub enum Fixup {
    None,
    /// (topic, partitions, error) entries to add.
    Produce(Vec<(TopicName, Vec<i32>, i16)>),
    Fetch(Vec<(TopicName, Vec<i32>)>),
    ListOffsets(Vec<(TopicName, Vec<i32>)>),
    /// Names asked for and denied; and, with the checker, topics to hide.
    Metadata(Vec<TopicName>, Who),
    OffsetCommit(Vec<(TopicName, Vec<i32>)>),
    TxnOffsetCommit(Vec<(TopicName, Vec<i32>)>),
    OffsetFetch(Vec<(TopicName, Vec<i32>)>, Option<Who>),
    FindCoordinator(Vec<(StrBytes, i16)>),
    ListGroups(Who),
    DescribeGroups(Vec<GroupId>),
    DeleteGroups(Vec<GroupId>),
    OffsetDelete(Vec<(TopicName, Vec<i32>)>),
    CreateTopics(Vec<TopicName>),
    DeleteTopics(Vec<TopicName>),
    DeleteRecords(Vec<(TopicName, Vec<i32>)>),
    CreatePartitions(Vec<TopicName>),
    DescribeConfigs(Vec<(i8, StrBytes, i16)>),
    AlterConfigs(Vec<(i8, StrBytes, i16)>),
    DescribeProducers(Vec<(TopicName, Vec<i32>)>),
    DescribeTransactions(Vec<TransactionalId>),
    ListTransactions(Who),
}

/// Checks `req` for the connection's principal: `Err` is the answer to a
/// request denied as a whole; `Ok` is the request to handle (perhaps with
/// items taken out) and what to do to its response.
pub fn guard(
    b: &Arc<Broker>,
    conn: &Conn,
    version: i16,
    req: RequestKind,
) -> Result<(RequestKind, Fixup), ResponseKind> {
    if !b.authz.enabled {
        return Ok((req, Fixup::None));
    }
    let who = Who {
        b: b.clone(),
        principal: conn
            .principal
            .clone()
            .unwrap_or_else(|| crate::security::ANONYMOUS.to_string()),
        host: conn.peer.ip(),
    };
    use RequestKind as R;
    match req {
        r @ (R::Produce(_) | R::Fetch(_) | R::ListOffsets(_) | R::Metadata(_)) => {
            guard_data(&who, r)
        }
        r @ (R::InitProducerId(_)
        | R::AddPartitionsToTxn(_)
        | R::AddOffsetsToTxn(_)
        | R::TxnOffsetCommit(_)
        | R::EndTxn(_)) => guard_txn(&who, version, r),
        r @ (R::FindCoordinator(_)
        | R::JoinGroup(_)
        | R::SyncGroup(_)
        | R::Heartbeat(_)
        | R::LeaveGroup(_)) => guard_membership(&who, version, r),
        r @ (R::OffsetCommit(_)
        | R::OffsetFetch(_)
        | R::ListGroups(_)
        | R::DescribeGroups(_)
        | R::DeleteGroups(_)
        | R::OffsetDelete(_)) => guard_offsets(&who, r),
        r @ (R::CreateTopics(_)
        | R::DeleteTopics(_)
        | R::DeleteRecords(_)
        | R::CreatePartitions(_)
        | R::DescribeConfigs(_)
        | R::IncrementalAlterConfigs(_)
        | R::AlterConfigs(_)) => guard_topics(&who, r),
        r @ (R::DescribeProducers(_)
        | R::DescribeTransactions(_)
        | R::ListTransactions(_)
        | R::WriteTxnMarkers(_)) => guard_txn_admin(&who, r),
        r @ (R::CreateAcls(_)
        | R::DeleteAcls(_)
        | R::DescribeAcls(_)
        | R::DescribeUserScramCredentials(_)
        | R::AlterUserScramCredentials(_)
        | R::DescribeClientQuotas(_)) => guard_security(&who, r),
        other => Ok((other, Fixup::None)),
    }
}

/// Produce, Fetch, ListOffsets and Metadata.
fn guard_data(who: &Who, req: RequestKind) -> Guarded {
    use RequestKind as R;
    Ok(match req {
        R::Produce(mut r) => {
            if let Some(tid) = r.transactional_id.clone() {
                if !who.can(Op::Write, Rt::TransactionalId, &tid) {
                    who.denied("Produce", &tid);
                    let gone = r
                        .topic_data
                        .drain(..)
                        .map(|t| {
                            (
                                t.name,
                                t.partition_data.iter().map(|p| p.index).collect(),
                                TXN_DENIED,
                            )
                        })
                        .collect();
                    return Ok((R::Produce(r), Fixup::Produce(gone)));
                }
            }
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topic_data
                .into_iter()
                .partition(|t| who.can(Op::Write, Rt::Topic, &t.name));
            r.topic_data = ok;
            for t in &no {
                who.denied("Produce", &t.name);
            }
            let gone = no
                .into_iter()
                .map(|t| {
                    (
                        t.name,
                        t.partition_data.iter().map(|p| p.index).collect(),
                        TOPIC_DENIED,
                    )
                })
                .collect();
            (R::Produce(r), Fixup::Produce(gone))
        }
        R::Fetch(mut r) => {
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topics
                .into_iter()
                .partition(|t| who.can(Op::Read, Rt::Topic, &t.topic));
            r.topics = ok;
            let gone = no
                .into_iter()
                .map(|t| (t.topic, t.partitions.iter().map(|p| p.partition).collect()))
                .collect();
            (R::Fetch(r), Fixup::Fetch(gone))
        }
        R::ListOffsets(mut r) => {
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topics
                .into_iter()
                .partition(|t| who.can(Op::Describe, Rt::Topic, &t.name));
            r.topics = ok;
            let gone = no
                .into_iter()
                .map(|t| {
                    (
                        t.name,
                        t.partitions.iter().map(|p| p.partition_index).collect(),
                    )
                })
                .collect();
            (R::ListOffsets(r), Fixup::ListOffsets(gone))
        }
        R::Metadata(mut r) => {
            let mut gone = Vec::new();
            if let Some(topics) = r.topics.take() {
                let mut kept = Vec::new();
                for t in topics {
                    match &t.name {
                        Some(n) if !who.can(Op::Describe, Rt::Topic, n) => gone.push(n.clone()),
                        _ => kept.push(t),
                    }
                }
                r.topics = Some(kept);
            }
            // Auto-creation needs CREATE, on the cluster or the topic.
            if r.allow_auto_topic_creation && !who.cluster(Op::Create) {
                let all_named_ok = r.topics.iter().flatten().all(|t| {
                    t.name
                        .as_ref()
                        .is_none_or(|n| who.can(Op::Create, Rt::Topic, n))
                });
                if !all_named_ok {
                    r.allow_auto_topic_creation = false;
                }
            }
            (R::Metadata(r), Fixup::Metadata(gone, who.clone()))
        }
        other => (other, Fixup::None),
    })
}

/// The transactional producer's requests.
fn guard_txn(who: &Who, version: i16, req: RequestKind) -> Guarded {
    use RequestKind as R;
    use ResponseKind as S;
    Ok(match req {
        R::InitProducerId(r) => {
            let ok = match &r.transactional_id {
                Some(tid) => who.can(Op::Write, Rt::TransactionalId, tid),
                None => {
                    who.cluster(Op::IdempotentWrite)
                        || who
                            .b
                            .authz
                            .allowed_any(&who.principal, who.host, Op::Write, Rt::Topic)
                }
            };
            if !ok {
                let (code, what) = match &r.transactional_id {
                    Some(t) => (TXN_DENIED, t.to_string()),
                    None => (CLUSTER_DENIED, "idempotent write".to_string()),
                };
                who.denied("InitProducerId", &what);
                return Err(S::InitProducerId(
                    InitProducerIdResponse::default()
                        .with_error_code(code)
                        .with_producer_id(ProducerId(-1))
                        .with_producer_epoch(-1),
                ));
            }
            (R::InitProducerId(r), Fixup::None)
        }
        R::AddPartitionsToTxn(r) => {
            if version >= 4 {
                if !who.cluster(Op::ClusterAction) {
                    who.denied("AddPartitionsToTxn v4", "cluster");
                    return Err(S::AddPartitionsToTxn(
                        AddPartitionsToTxnResponse::default()
                            .with_error_code(CLUSTER_DENIED)
                            .with_results_by_transaction(
                                r.transactions
                                    .iter()
                                    .map(|t| {
                                        AddPartitionsToTxnResult::default()
                                            .with_transactional_id(t.transactional_id.clone())
                                            .with_topic_results(topic_results(&t.topics, |_| {
                                                CLUSTER_DENIED
                                            }))
                                    })
                                    .collect(),
                            ),
                    ));
                }
                return Ok((R::AddPartitionsToTxn(r), Fixup::None));
            }
            let tid = r.v3_and_below_transactional_id.clone();
            if !who.can(Op::Write, Rt::TransactionalId, &tid) {
                who.denied("AddPartitionsToTxn", &tid);
                return Err(S::AddPartitionsToTxn(
                    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(
                        topic_results(&r.v3_and_below_topics, |_| TXN_DENIED),
                    ),
                ));
            }
            let bad: Vec<&TopicName> = r
                .v3_and_below_topics
                .iter()
                .map(|t| &t.name)
                .filter(|n| !who.can(Op::Write, Rt::Topic, n))
                .collect();
            if !bad.is_empty() {
                who.denied("AddPartitionsToTxn", &bad[0].to_string());
                let not_attempted = ErrorCode::OperationNotAttempted.code();
                return Err(S::AddPartitionsToTxn(
                    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(
                        topic_results(&r.v3_and_below_topics, |n| {
                            if bad.contains(&n) {
                                TOPIC_DENIED
                            } else {
                                not_attempted
                            }
                        }),
                    ),
                ));
            }
            (R::AddPartitionsToTxn(r), Fixup::None)
        }
        R::AddOffsetsToTxn(r) => {
            let code = if !who.can(Op::Write, Rt::TransactionalId, &r.transactional_id) {
                TXN_DENIED
            } else if !who.can(Op::Read, Rt::Group, &r.group_id) {
                GROUP_DENIED
            } else {
                return Ok((R::AddOffsetsToTxn(r), Fixup::None));
            };
            who.denied("AddOffsetsToTxn", &r.transactional_id);
            return Err(S::AddOffsetsToTxn(
                AddOffsetsToTxnResponse::default().with_error_code(code),
            ));
        }
        R::TxnOffsetCommit(mut r) => {
            let whole = if !who.can(Op::Write, Rt::TransactionalId, &r.transactional_id) {
                Some(TXN_DENIED)
            } else if !who.can(Op::Read, Rt::Group, &r.group_id) {
                Some(GROUP_DENIED)
            } else {
                None
            };
            if let Some(code) = whole {
                who.denied("TxnOffsetCommit", &r.transactional_id);
                return Err(S::TxnOffsetCommit(TxnOffsetCommitResponse::default().with_topics(r.topics.iter().map(|t| {
                    txn_offset_commit_response::TxnOffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                        t.partitions.iter().map(|p| txn_offset_commit_response::TxnOffsetCommitResponsePartition::default().with_partition_index(p.partition_index).with_error_code(code)).collect())
                }).collect())));
            }
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topics
                .into_iter()
                .partition(|t| who.can(Op::Read, Rt::Topic, &t.name));
            r.topics = ok;
            let gone = no
                .into_iter()
                .map(|t| {
                    (
                        t.name,
                        t.partitions.iter().map(|p| p.partition_index).collect(),
                    )
                })
                .collect();
            (R::TxnOffsetCommit(r), Fixup::TxnOffsetCommit(gone))
        }
        R::EndTxn(r) => {
            if !who.can(Op::Write, Rt::TransactionalId, &r.transactional_id) {
                who.denied("EndTxn", &r.transactional_id);
                return Err(S::EndTxn(
                    EndTxnResponse::default()
                        .with_error_code(TXN_DENIED)
                        .with_producer_id(ProducerId(-1))
                        .with_producer_epoch(-1),
                ));
            }
            (R::EndTxn(r), Fixup::None)
        }
        other => (other, Fixup::None),
    })
}

/// Finding a coordinator and a group's membership.
fn guard_membership(who: &Who, version: i16, req: RequestKind) -> Guarded {
    use RequestKind as R;
    use ResponseKind as S;
    Ok(match req {
        R::FindCoordinator(mut r) => {
            let kind = match r.key_type {
                0 => Some((Rt::Group, GROUP_DENIED)),
                1 => Some((Rt::TransactionalId, TXN_DENIED)),
                _ => None,
            };
            let Some((t, code)) = kind else {
                return Ok((R::FindCoordinator(r), Fixup::None));
            };
            if version < 4 {
                if !who.can(Op::Describe, t, &r.key) {
                    who.denied("FindCoordinator", &r.key);
                    return Err(S::FindCoordinator(
                        FindCoordinatorResponse::default()
                            .with_error_code(code)
                            .with_node_id(BrokerId(-1))
                            .with_port(-1)
                            .with_error_message(msg("not authorized")),
                    ));
                }
                return Ok((R::FindCoordinator(r), Fixup::None));
            }
            let (ok, no): (Vec<_>, Vec<_>) = r
                .coordinator_keys
                .into_iter()
                .partition(|k| who.can(Op::Describe, t, k));
            r.coordinator_keys = ok;
            (
                R::FindCoordinator(r),
                Fixup::FindCoordinator(no.into_iter().map(|k| (k, code)).collect()),
            )
        }
        R::JoinGroup(r) => {
            if !who.can(Op::Read, Rt::Group, &r.group_id) {
                who.denied("JoinGroup", &r.group_id);
                return Err(S::JoinGroup(
                    JoinGroupResponse::default()
                        .with_error_code(GROUP_DENIED)
                        .with_generation_id(-1),
                ));
            }
            (R::JoinGroup(r), Fixup::None)
        }
        R::SyncGroup(r) => {
            if !who.can(Op::Read, Rt::Group, &r.group_id) {
                return Err(S::SyncGroup(
                    SyncGroupResponse::default().with_error_code(GROUP_DENIED),
                ));
            }
            (R::SyncGroup(r), Fixup::None)
        }
        R::Heartbeat(r) => {
            if !who.can(Op::Read, Rt::Group, &r.group_id) {
                return Err(S::Heartbeat(
                    HeartbeatResponse::default().with_error_code(GROUP_DENIED),
                ));
            }
            (R::Heartbeat(r), Fixup::None)
        }
        R::LeaveGroup(r) => {
            if !who.can(Op::Read, Rt::Group, &r.group_id) {
                return Err(S::LeaveGroup(
                    LeaveGroupResponse::default().with_error_code(GROUP_DENIED),
                ));
            }
            (R::LeaveGroup(r), Fixup::None)
        }
        other => (other, Fixup::None),
    })
}

/// Committed offsets and the groups' listing and deletion.
fn guard_offsets(who: &Who, req: RequestKind) -> Guarded {
    use RequestKind as R;
    use ResponseKind as S;
    Ok(match req {
        R::OffsetCommit(mut r) => {
            if !who.can(Op::Read, Rt::Group, &r.group_id) {
                who.denied("OffsetCommit", &r.group_id);
                return Err(S::OffsetCommit(OffsetCommitResponse::default().with_topics(r.topics.iter().map(|t| {
                    offset_commit_response::OffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                        t.partitions.iter().map(|p| offset_commit_response::OffsetCommitResponsePartition::default().with_partition_index(p.partition_index).with_error_code(GROUP_DENIED)).collect())
                }).collect())));
            }
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topics
                .into_iter()
                .partition(|t| who.can(Op::Read, Rt::Topic, &t.name));
            r.topics = ok;
            let gone = no
                .into_iter()
                .map(|t| {
                    (
                        t.name,
                        t.partitions.iter().map(|p| p.partition_index).collect(),
                    )
                })
                .collect();
            (R::OffsetCommit(r), Fixup::OffsetCommit(gone))
        }
        R::OffsetFetch(mut r) => {
            if !who.can(Op::Describe, Rt::Group, &r.group_id) {
                who.denied("OffsetFetch", &r.group_id);
                return Err(S::OffsetFetch(
                    OffsetFetchResponse::default().with_error_code(GROUP_DENIED),
                ));
            }
            match r.topics.take() {
                None => (
                    R::OffsetFetch(r),
                    Fixup::OffsetFetch(Vec::new(), Some(who.clone())),
                ),
                Some(ts) => {
                    let (ok, no): (Vec<_>, Vec<_>) = ts
                        .into_iter()
                        .partition(|t| who.can(Op::Describe, Rt::Topic, &t.name));
                    r.topics = Some(ok);
                    let gone = no
                        .into_iter()
                        .map(|t| (t.name, t.partition_indexes))
                        .collect();
                    (R::OffsetFetch(r), Fixup::OffsetFetch(gone, None))
                }
            }
        }
        R::ListGroups(r) => {
            if who.cluster(Op::Describe) {
                (R::ListGroups(r), Fixup::None)
            } else {
                (R::ListGroups(r), Fixup::ListGroups(who.clone()))
            }
        }
        R::DescribeGroups(mut r) => {
            let (ok, no): (Vec<_>, Vec<_>) = r
                .groups
                .into_iter()
                .partition(|g| who.can(Op::Describe, Rt::Group, g));
            r.groups = ok;
            (R::DescribeGroups(r), Fixup::DescribeGroups(no))
        }
        R::DeleteGroups(mut r) => {
            let (ok, no): (Vec<_>, Vec<_>) = r
                .groups_names
                .into_iter()
                .partition(|g| who.can(Op::Delete, Rt::Group, g));
            r.groups_names = ok;
            (R::DeleteGroups(r), Fixup::DeleteGroups(no))
        }
        R::OffsetDelete(mut r) => {
            // As Kafka: DELETE on the group, READ on each topic.
            if !who.can(Op::Delete, Rt::Group, &r.group_id) {
                who.denied("OffsetDelete", &r.group_id);
                return Err(S::OffsetDelete(
                    OffsetDeleteResponse::default().with_error_code(GROUP_DENIED),
                ));
            }
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topics
                .into_iter()
                .partition(|t| who.can(Op::Read, Rt::Topic, &t.name));
            r.topics = ok;
            let gone = no
                .into_iter()
                .map(|t| {
                    (
                        t.name,
                        t.partitions.iter().map(|p| p.partition_index).collect(),
                    )
                })
                .collect();
            (R::OffsetDelete(r), Fixup::OffsetDelete(gone))
        }
        other => (other, Fixup::None),
    })
}

/// Topics, records and configs.
fn guard_topics(who: &Who, req: RequestKind) -> Guarded {
    use RequestKind as R;
    Ok(match req {
        R::CreateTopics(mut r) => {
            let cluster = who.cluster(Op::Create);
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topics
                .into_iter()
                .partition(|t| cluster || who.can(Op::Create, Rt::Topic, &t.name));
            r.topics = ok;
            (
                R::CreateTopics(r),
                Fixup::CreateTopics(no.into_iter().map(|t| t.name).collect()),
            )
        }
        R::DeleteTopics(mut r) => {
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topic_names
                .into_iter()
                .partition(|t| who.can(Op::Delete, Rt::Topic, t));
            r.topic_names = ok;
            let mut gone: Vec<TopicName> = no;
            let (ok, no): (Vec<_>, Vec<_>) = r.topics.into_iter().partition(|t| {
                t.name
                    .as_ref()
                    .is_none_or(|n| who.can(Op::Delete, Rt::Topic, n))
            });
            r.topics = ok;
            gone.extend(no.into_iter().filter_map(|t| t.name));
            (R::DeleteTopics(r), Fixup::DeleteTopics(gone))
        }
        R::DeleteRecords(mut r) => {
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topics
                .into_iter()
                .partition(|t| who.can(Op::Delete, Rt::Topic, &t.name));
            r.topics = ok;
            let gone = no
                .into_iter()
                .map(|t| {
                    (
                        t.name,
                        t.partitions.iter().map(|p| p.partition_index).collect(),
                    )
                })
                .collect();
            (R::DeleteRecords(r), Fixup::DeleteRecords(gone))
        }
        R::CreatePartitions(mut r) => {
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topics
                .into_iter()
                .partition(|t| who.can(Op::Alter, Rt::Topic, &t.name));
            r.topics = ok;
            (
                R::CreatePartitions(r),
                Fixup::CreatePartitions(no.into_iter().map(|t| t.name).collect()),
            )
        }
        R::DescribeConfigs(mut r) => {
            let mut gone = Vec::new();
            r.resources.retain(|res| {
                match config_check(
                    &who,
                    res.resource_type,
                    &res.resource_name,
                    Op::DescribeConfigs,
                ) {
                    Some(code) => {
                        gone.push((res.resource_type, res.resource_name.clone(), code));
                        false
                    }
                    None => true,
                }
            });
            (R::DescribeConfigs(r), Fixup::DescribeConfigs(gone))
        }
        R::IncrementalAlterConfigs(mut r) => {
            let gone = refuse_alters(&who, "IncrementalAlterConfigs", &mut r.resources, |x| {
                (x.resource_type, &x.resource_name)
            });
            (R::IncrementalAlterConfigs(r), Fixup::AlterConfigs(gone))
        }
        R::AlterConfigs(mut r) => {
            let gone = refuse_alters(&who, "AlterConfigs", &mut r.resources, |x| {
                (x.resource_type, &x.resource_name)
            });
            (R::AlterConfigs(r), Fixup::AlterConfigs(gone))
        }
        other => (other, Fixup::None),
    })
}

/// The transaction tools' requests and the markers.
fn guard_txn_admin(who: &Who, req: RequestKind) -> Guarded {
    use RequestKind as R;
    use ResponseKind as S;
    Ok(match req {
        R::DescribeProducers(mut r) => {
            let (ok, no): (Vec<_>, Vec<_>) = r
                .topics
                .into_iter()
                .partition(|t| who.can(Op::Read, Rt::Topic, &t.name));
            r.topics = ok;
            (
                R::DescribeProducers(r),
                Fixup::DescribeProducers(
                    no.into_iter()
                        .map(|t| (t.name, t.partition_indexes))
                        .collect(),
                ),
            )
        }
        R::DescribeTransactions(mut r) => {
            let (ok, no): (Vec<_>, Vec<_>) = r
                .transactional_ids
                .into_iter()
                .partition(|t| who.can(Op::Describe, Rt::TransactionalId, t));
            r.transactional_ids = ok;
            (R::DescribeTransactions(r), Fixup::DescribeTransactions(no))
        }
        R::ListTransactions(r) => (R::ListTransactions(r), Fixup::ListTransactions(who.clone())),
        R::WriteTxnMarkers(r) => {
            if !who.cluster(Op::ClusterAction) {
                who.denied("WriteTxnMarkers", "cluster");
                return Err(S::WriteTxnMarkers(WriteTxnMarkersResponse::default().with_markers(r.markers.iter().map(|m| {
                    write_txn_markers_response::WritableTxnMarkerResult::default().with_producer_id(m.producer_id).with_topics(m.topics.iter().map(|t| {
                        write_txn_markers_response::WritableTxnMarkerTopicResult::default().with_name(t.name.clone()).with_partitions(t.partition_indexes.iter().map(|p| {
                            write_txn_markers_response::WritableTxnMarkerPartitionResult::default().with_partition_index(*p).with_error_code(CLUSTER_DENIED)
                        }).collect())
                    }).collect())
                }).collect())));
            }
            (R::WriteTxnMarkers(r), Fixup::None)
        }
        other => (other, Fixup::None),
    })
}

/// ACLs, SCRAM credentials and quotas.
fn guard_security(who: &Who, req: RequestKind) -> Guarded {
    use RequestKind as R;
    use ResponseKind as S;
    Ok(match req {
        R::CreateAcls(r) => {
            if !who.cluster(Op::Alter) {
                who.denied("CreateAcls", "cluster");
                return Err(S::CreateAcls(
                    CreateAclsResponse::default().with_results(
                        r.creations
                            .iter()
                            .map(|_| {
                                AclCreationResult::default()
                                    .with_error_code(CLUSTER_DENIED)
                                    .with_error_message(msg("ALTER on the cluster is required"))
                            })
                            .collect(),
                    ),
                ));
            }
            (R::CreateAcls(r), Fixup::None)
        }
        R::DeleteAcls(r) => {
            if !who.cluster(Op::Alter) {
                who.denied("DeleteAcls", "cluster");
                return Err(S::DeleteAcls(
                    DeleteAclsResponse::default().with_filter_results(
                        r.filters
                            .iter()
                            .map(|_| {
                                DeleteAclsFilterResult::default()
                                    .with_error_code(CLUSTER_DENIED)
                                    .with_error_message(msg("ALTER on the cluster is required"))
                            })
                            .collect(),
                    ),
                ));
            }
            (R::DeleteAcls(r), Fixup::None)
        }
        R::DescribeAcls(r) => {
            if !who.cluster(Op::Describe) {
                who.denied("DescribeAcls", "cluster");
                return Err(S::DescribeAcls(
                    DescribeAclsResponse::default()
                        .with_error_code(CLUSTER_DENIED)
                        .with_error_message(msg("DESCRIBE on the cluster is required")),
                ));
            }
            (R::DescribeAcls(r), Fixup::None)
        }
        R::DescribeUserScramCredentials(r) => {
            if !who.cluster(Op::Describe) {
                who.denied("DescribeUserScramCredentials", "cluster");
                return Err(S::DescribeUserScramCredentials(
                    DescribeUserScramCredentialsResponse::default()
                        .with_error_code(CLUSTER_DENIED)
                        .with_error_message(msg("DESCRIBE on the cluster is required")),
                ));
            }
            (R::DescribeUserScramCredentials(r), Fixup::None)
        }
        R::AlterUserScramCredentials(r) => {
            if !who.cluster(Op::Alter) {
                who.denied("AlterUserScramCredentials", "cluster");
                let mut users: Vec<StrBytes> = r
                    .deletions
                    .iter()
                    .map(|d| d.name.clone())
                    .chain(r.upsertions.iter().map(|u| u.name.clone()))
                    .collect();
                users.sort();
                users.dedup();
                return Err(S::AlterUserScramCredentials(
                    AlterUserScramCredentialsResponse::default().with_results(
                        users
                            .into_iter()
                            .map(|u| {
                                AlterUserScramCredentialsResult::default()
                                    .with_user(u)
                                    .with_error_code(CLUSTER_DENIED)
                                    .with_error_message(msg("ALTER on the cluster is required"))
                            })
                            .collect(),
                    ),
                ));
            }
            (R::AlterUserScramCredentials(r), Fixup::None)
        }
        R::DescribeClientQuotas(r) => {
            if !who.cluster(Op::DescribeConfigs) {
                return Err(S::DescribeClientQuotas(
                    DescribeClientQuotasResponse::default().with_error_code(CLUSTER_DENIED),
                ));
            }
            (R::DescribeClientQuotas(r), Fixup::None)
        }
        other => (other, Fixup::None),
    })
}

/// Removes the config resources `who` may not ALTER_CONFIGS (either
/// AlterConfigs API), logging each: what was removed, with its error.
fn refuse_alters<T>(
    who: &Who,
    api: &str,
    resources: &mut Vec<T>,
    key: impl Fn(&T) -> (i8, &StrBytes),
) -> Vec<(i8, StrBytes, i16)> {
    let mut gone = Vec::new();
    resources.retain(|res| {
        let (resource_type, name) = key(res);
        match config_check(who, resource_type, name, Op::AlterConfigs) {
            Some(code) => {
                tracing::warn!(principal = %who.principal, host = %who.host, request = api,
                    resource = name.as_str(), "authorization denied");
                gone.push((resource_type, name.clone(), code));
                false
            }
            None => true,
        }
    });
    gone
}

/// A config resource's check: TOPIC (2) on the topic, BROKER (4) and
/// BROKER_LOGGER (8) on the cluster; `Some(error)` when denied.
fn config_check(who: &Who, resource_type: i8, name: &str, op: Op) -> Option<i16> {
    match resource_type {
        2 => (!who.can(op, Rt::Topic, name)).then_some(TOPIC_DENIED),
        _ => (!who.cluster(op)).then_some(CLUSTER_DENIED),
    }
}

fn topic_results(
    topics: &[add_partitions_to_txn_request::AddPartitionsToTxnTopic],
    code: impl Fn(&TopicName) -> i16,
) -> Vec<AddPartitionsToTxnTopicResult> {
    topics
        .iter()
        .map(|t| {
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(
                    t.partitions
                        .iter()
                        .map(|p| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(*p)
                                .with_partition_error_code(code(&t.name))
                        })
                        .collect(),
                )
        })
        .collect()
}

impl Fixup {
    /// Adds the denied items to `body`, or hides what the principal may not see.
    pub fn apply(&self, body: &mut ResponseKind) {
        // Each part matches only its own kinds of fixup.
        apply_data(self, body);
        apply_groups(self, body);
        apply_admin(self, body);
    }
}

/// Produce, Fetch, ListOffsets and Metadata.
fn apply_data(fixup: &Fixup, body: &mut ResponseKind) {
    use ResponseKind as S;
    match (fixup, body) {
        (Fixup::Produce(gone), S::Produce(r)) => {
            for (t, parts, code) in gone {
                r.responses.push(
                    produce_response::TopicProduceResponse::default()
                        .with_name(t.clone())
                        .with_partition_responses(
                            parts
                                .iter()
                                .map(|p| {
                                    produce_response::PartitionProduceResponse::default()
                                        .with_index(*p)
                                        .with_error_code(*code)
                                        .with_base_offset(-1)
                                        .with_log_append_time_ms(-1)
                                        .with_log_start_offset(-1)
                                })
                                .collect(),
                        ),
                );
            }
        }
        (Fixup::Fetch(gone), S::Fetch(r)) => {
            for (t, parts) in gone {
                r.responses.push(
                    fetch_response::FetchableTopicResponse::default()
                        .with_topic(t.clone())
                        .with_partitions(
                            parts
                                .iter()
                                .map(|p| {
                                    fetch_response::PartitionData::default()
                                        .with_partition_index(*p)
                                        .with_error_code(TOPIC_DENIED)
                                        .with_high_watermark(-1)
                                        .with_last_stable_offset(-1)
                                        .with_log_start_offset(-1)
                                })
                                .collect(),
                        ),
                );
            }
        }
        (Fixup::ListOffsets(gone), S::ListOffsets(r)) => {
            for (t, parts) in gone {
                r.topics.push(
                    list_offsets_response::ListOffsetsTopicResponse::default()
                        .with_name(t.clone())
                        .with_partitions(
                            parts
                                .iter()
                                .map(|p| {
                                    list_offsets_response::ListOffsetsPartitionResponse::default()
                                        .with_partition_index(*p)
                                        .with_error_code(TOPIC_DENIED)
                                        .with_timestamp(-1)
                                        .with_offset(-1)
                                        .with_leader_epoch(-1)
                                })
                                .collect(),
                        ),
                );
            }
        }
        (Fixup::Metadata(gone, who), S::Metadata(r)) => {
            r.topics.retain(|t| {
                t.name
                    .as_ref()
                    .is_none_or(|n| who.can(Op::Describe, Rt::Topic, n))
            });
            for n in gone {
                r.topics.push(
                    metadata_response::MetadataResponseTopic::default()
                        .with_name(Some(n.clone()))
                        .with_error_code(TOPIC_DENIED),
                );
            }
        }
        _ => {}
    }
}

/// Offsets, coordinators and groups.
fn apply_groups(fixup: &Fixup, body: &mut ResponseKind) {
    use ResponseKind as S;
    match (fixup, body) {
        (Fixup::OffsetCommit(gone), S::OffsetCommit(r)) => {
            for (t, parts) in gone {
                r.topics.push(
                    offset_commit_response::OffsetCommitResponseTopic::default()
                        .with_name(t.clone())
                        .with_partitions(
                            parts
                                .iter()
                                .map(|p| {
                                    offset_commit_response::OffsetCommitResponsePartition::default()
                                        .with_partition_index(*p)
                                        .with_error_code(TOPIC_DENIED)
                                })
                                .collect(),
                        ),
                );
            }
        }
        (Fixup::TxnOffsetCommit(gone), S::TxnOffsetCommit(r)) => {
            for (t, parts) in gone {
                r.topics.push(txn_offset_commit_response::TxnOffsetCommitResponseTopic::default().with_name(t.clone()).with_partitions(
                    parts.iter().map(|p| txn_offset_commit_response::TxnOffsetCommitResponsePartition::default().with_partition_index(*p).with_error_code(TOPIC_DENIED)).collect()));
            }
        }
        (Fixup::OffsetFetch(gone, hide), S::OffsetFetch(r)) => {
            if let Some(who) = hide {
                r.topics
                    .retain(|t| who.can(Op::Describe, Rt::Topic, &t.name));
            }
            for (t, parts) in gone {
                r.topics.push(
                    offset_fetch_response::OffsetFetchResponseTopic::default()
                        .with_name(t.clone())
                        .with_partitions(
                            parts
                                .iter()
                                .map(|p| {
                                    offset_fetch_response::OffsetFetchResponsePartition::default()
                                        .with_partition_index(*p)
                                        .with_committed_offset(-1)
                                        .with_committed_leader_epoch(-1)
                                        .with_error_code(TOPIC_DENIED)
                                })
                                .collect(),
                        ),
                );
            }
        }
        (Fixup::FindCoordinator(gone), S::FindCoordinator(r)) => {
            for (k, code) in gone {
                r.coordinators.push(
                    Coordinator::default()
                        .with_key(k.clone())
                        .with_node_id(BrokerId(-1))
                        .with_port(-1)
                        .with_error_code(*code)
                        .with_error_message(msg("not authorized")),
                );
            }
        }
        (Fixup::ListGroups(who), S::ListGroups(r)) => {
            r.groups
                .retain(|g| who.can(Op::Describe, Rt::Group, &g.group_id));
        }
        (Fixup::DescribeGroups(gone), S::DescribeGroups(r)) => {
            for g in gone {
                r.groups.push(
                    DescribedGroup::default()
                        .with_group_id(g.clone())
                        .with_error_code(GROUP_DENIED)
                        .with_error_message(msg("not authorized")),
                );
            }
        }
        (Fixup::DeleteGroups(gone), S::DeleteGroups(r)) => {
            for g in gone {
                r.results.push(
                    DeletableGroupResult::default()
                        .with_group_id(g.clone())
                        .with_error_code(GROUP_DENIED),
                );
            }
        }
        (Fixup::OffsetDelete(gone), S::OffsetDelete(r)) => {
            if r.error_code == 0 {
                for (t, parts) in gone {
                    r.topics.push(
                        offset_delete_response::OffsetDeleteResponseTopic::default()
                            .with_name(t.clone())
                            .with_partitions(
                                parts
                                    .iter()
                                    .map(|p| {
                                        offset_delete_response::OffsetDeleteResponsePartition::default()
                                            .with_partition_index(*p)
                                            .with_error_code(TOPIC_DENIED)
                                    })
                                    .collect(),
                            ),
                    );
                }
            }
        }
        _ => {}
    }
}

/// Topics, records, configs and transactions.
fn apply_admin(fixup: &Fixup, body: &mut ResponseKind) {
    use ResponseKind as S;
    match (fixup, body) {
        (Fixup::CreateTopics(gone), S::CreateTopics(r)) => {
            for t in gone {
                r.topics.push(
                    CreatableTopicResult::default()
                        .with_name(t.clone())
                        .with_error_code(TOPIC_DENIED)
                        .with_num_partitions(-1)
                        .with_replication_factor(-1)
                        .with_error_message(msg("CREATE on the cluster or the topic is required")),
                );
            }
        }
        (Fixup::DeleteTopics(gone), S::DeleteTopics(r)) => {
            for t in gone {
                r.responses.push(
                    DeletableTopicResult::default()
                        .with_name(Some(t.clone()))
                        .with_error_code(TOPIC_DENIED),
                );
            }
        }
        (Fixup::DeleteRecords(gone), S::DeleteRecords(r)) => {
            for (t, parts) in gone {
                r.topics.push(
                    delete_records_response::DeleteRecordsTopicResult::default()
                        .with_name(t.clone())
                        .with_partitions(
                            parts
                                .iter()
                                .map(|p| {
                                    delete_records_response::DeleteRecordsPartitionResult::default()
                                        .with_partition_index(*p)
                                        .with_low_watermark(-1)
                                        .with_error_code(TOPIC_DENIED)
                                })
                                .collect(),
                        ),
                );
            }
        }
        (Fixup::CreatePartitions(gone), S::CreatePartitions(r)) => {
            for t in gone {
                r.results.push(
                    create_partitions_response::CreatePartitionsTopicResult::default()
                        .with_name(t.clone())
                        .with_error_code(TOPIC_DENIED),
                );
            }
        }
        (Fixup::DescribeConfigs(gone), S::DescribeConfigs(r)) => {
            for (ty, n, code) in gone {
                r.results.push(
                    describe_configs_response::DescribeConfigsResult::default()
                        .with_resource_type(*ty)
                        .with_resource_name(n.clone())
                        .with_error_code(*code)
                        .with_error_message(msg("not authorized")),
                );
            }
        }
        (Fixup::AlterConfigs(gone), S::IncrementalAlterConfigs(r)) => {
            for (ty, n, code) in gone {
                r.responses.push(
                    incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                        .with_resource_type(*ty)
                        .with_resource_name(n.clone())
                        .with_error_code(*code)
                        .with_error_message(msg("not authorized")),
                );
            }
        }
        (Fixup::AlterConfigs(gone), S::AlterConfigs(r)) => {
            for (ty, n, code) in gone {
                r.responses.push(
                    alter_configs_response::AlterConfigsResourceResponse::default()
                        .with_resource_type(*ty)
                        .with_resource_name(n.clone())
                        .with_error_code(*code)
                        .with_error_message(msg("not authorized")),
                );
            }
        }
        (Fixup::DescribeProducers(gone), S::DescribeProducers(r)) => {
            for (t, parts) in gone {
                r.topics.push(
                    describe_producers_response::TopicResponse::default()
                        .with_name(t.clone())
                        .with_partitions(
                            parts
                                .iter()
                                .map(|p| {
                                    describe_producers_response::PartitionResponse::default()
                                        .with_partition_index(*p)
                                        .with_error_code(TOPIC_DENIED)
                                })
                                .collect(),
                        ),
                );
            }
        }
        (Fixup::DescribeTransactions(gone), S::DescribeTransactions(r)) => {
            for t in gone {
                r.transaction_states.push(
                    describe_transactions_response::TransactionState::default()
                        .with_transactional_id(t.clone())
                        .with_error_code(TXN_DENIED)
                        .with_producer_id(ProducerId(-1))
                        .with_producer_epoch(-1),
                );
            }
        }
        (Fixup::ListTransactions(who), S::ListTransactions(r)) => {
            r.transaction_states
                .retain(|t| who.can(Op::Describe, Rt::TransactionalId, &t.transactional_id));
        }
        _ => {}
    }
}
