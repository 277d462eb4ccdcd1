//! KIP-664 transaction admin APIs in cluster mode, answered by any broker
//! from PostgreSQL: DescribeProducers (the partitions' producer rows),
//! DescribeTransactions (the coordinator's rows), ListTransactions (the ids
//! FindCoordinator names this broker for, so an admin client that asks
//! every broker lists each id once) and an operator's abort through
//! WriteTxnMarkers, shaped by local mode's helpers in `admin_txn`;
//! DeleteRecords; DescribeConfigs; IncrementalAlterConfigs and AlterConfigs;
//! the ACL and SCRAM credential APIs on the cluster's rows.

use std::collections::HashMap;

use kafka_protocol::messages::alter_user_scram_credentials_request::AlterUserScramCredentialsRequest;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResponse;
use kafka_protocol::messages::create_acls_request::CreateAclsRequest;
use kafka_protocol::messages::create_acls_response::CreateAclsResponse;
use kafka_protocol::messages::delete_acls_request::DeleteAclsRequest;
use kafka_protocol::messages::delete_acls_response::DeleteAclsResponse;
use kafka_protocol::messages::delete_records_request::DeleteRecordsRequest;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsResponse, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::describe_acls_request::DescribeAclsRequest;
use kafka_protocol::messages::describe_acls_response::DescribeAclsResponse;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsRequest;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResponse;
use kafka_protocol::messages::describe_producers_request::DescribeProducersRequest;
use kafka_protocol::messages::describe_producers_response::DescribeProducersResponse;
use kafka_protocol::messages::describe_transactions_request::DescribeTransactionsRequest;
use kafka_protocol::messages::describe_transactions_response::DescribeTransactionsResponse;
use kafka_protocol::messages::describe_user_scram_credentials_request::DescribeUserScramCredentialsRequest;
use kafka_protocol::messages::describe_user_scram_credentials_response::DescribeUserScramCredentialsResponse;
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::list_transactions_request::ListTransactionsRequest;
use kafka_protocol::messages::list_transactions_response::ListTransactionsResponse;
use kafka_protocol::messages::write_txn_markers_request::WriteTxnMarkersRequest;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    WriteTxnMarkersResponse,
};

use super::{admin, admin_txn};
use crate::acl::{self, Acl};
use crate::cluster::catalogue::{self, CatalogueError};
use crate::cluster::describe;
use crate::cluster::front::Front;
use crate::cluster::records::{self, Refused};
use crate::cluster::security;
use crate::cluster::txn::{admin_abort, AdminAbort};
use crate::cluster::ClusterError;
use crate::error::ErrorCode;
use crate::security::{plan_alter, UserMap};

pub async fn describe_producers(
    front: &Front,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    // Partition name -> its (topic id, index), for the partitions that exist.
    let mut known: HashMap<(String, i32), (uuid::Uuid, i32)> = HashMap::new();
    let mut failed = false;
    for t in &req.topics {
        match front.topic(t.name.0.as_str()).await {
            Ok(Some(row)) => {
                for p in t
                    .partition_indexes
                    .iter()
                    .filter(|p| (0..row.partitions).contains(*p))
                {
                    known.insert((row.name.clone(), *p), (row.id, *p));
                }
            }
            Ok(None) => {}
            Err(e) => {
                crate::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: DescribeProducers could not read the catalogue");
                failed = true;
            }
        }
    }
    let keys: Vec<(uuid::Uuid, i32)> = known.values().copied().collect();
    let rows = if failed {
        None
    } else {
        match describe::producers(&front.cluster, &keys).await {
            Ok(rows) => Some(rows),
            Err(e) => {
                crate::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: DescribeProducers could not read producer state");
                None
            }
        }
    };
    admin_txn::producers_response(req, |topic, partition| {
        let Some(rows) = &rows else {
            return Err(ErrorCode::NotLeaderOrFollower);
        };
        known
            .get(&(topic.to_string(), partition))
            .and_then(|k| rows.get(k))
            .cloned()
            .ok_or(ErrorCode::UnknownTopicOrPartition)
    })
}

pub async fn describe_transactions(
    front: &Front,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let ids: Vec<String> = req
        .transactional_ids
        .iter()
        .map(|i| i.0.to_string())
        .collect();
    let states = match describe::transactions(&front.cluster, Some(&ids)).await {
        Ok(m) => m,
        Err(e) => {
            crate::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: DescribeTransactions could not read the coordinator");
            let out = req
                .transactional_ids
                .into_iter()
                .map(|id| {
                    admin_txn::described(id, None)
                        .with_error_code(ErrorCode::CoordinatorNotAvailable.code())
                })
                .collect();
            return DescribeTransactionsResponse::default().with_transaction_states(out);
        }
    };
    let out = req
        .transactional_ids
        .into_iter()
        .map(|id| {
            let meta = states.iter().find(|m| m.transactional_id == id.0.as_str());
            admin_txn::described(id, meta)
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(out)
}

pub async fn list_transactions(
    front: &Front,
    req: ListTransactionsRequest,
    version: i16,
) -> ListTransactionsResponse {
    let me = front.cluster.config.broker_id;
    let live: Vec<i32> = front.live_now().await.iter().map(|x| x.id).collect();
    let read = async {
        let all = describe::transactions(&front.cluster, None).await?;
        let now = describe::now_ms(&front.cluster).await?;
        Ok::<_, crate::cluster::ClusterError>((all, now))
    };
    match read.await {
        Ok((all, now)) => {
            let mine = all
                .into_iter()
                .filter(|m| {
                    crate::cluster::rendezvous(m.transactional_id.as_bytes(), &live) == Some(me)
                })
                .collect();
            admin_txn::list_response(req, version, mine, now)
        }
        Err(e) => {
            crate::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: ListTransactions could not read the coordinator");
            ListTransactionsResponse::default()
                .with_error_code(ErrorCode::CoordinatorNotAvailable.code())
        }
    }
}

/// WriteTxnMarkers from an admin tool: only ABORT, run as the coordinator's
/// abort of the producer's transaction (markers on all of its partitions in
/// one PostgreSQL transaction). Cluster mode has no orphan transactions (a
/// partition accepts transactional data only for a partition its
/// coordinator added), so a producer no id knows has nothing to abort.
pub async fn write_txn_markers(
    front: &Front,
    req: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let mut results = Vec::with_capacity(req.markers.len());
    for m in req.markers {
        let pid = m.producer_id.0;
        let code = if m.transaction_result {
            ErrorCode::InvalidRequest
        } else {
            match admin_abort(&front.cluster, pid).await {
                Ok(AdminAbort::Done) => ErrorCode::None,
                Ok(AdminAbort::NotKnown) => {
                    tracing::info!(producer_id = pid, "cluster: admin abort of a producer no transactional id has; nothing to abort");
                    ErrorCode::None
                }
                Err(e) => {
                    crate::cluster::outage::cluster_warn!(front.cluster.outage, e, producer_id = pid, error = %e, "cluster: admin abort not committed");
                    ErrorCode::ConcurrentTransactions
                }
            }
        };
        let topics = m
            .topics
            .iter()
            .map(|t| {
                let parts = t
                    .partition_indexes
                    .iter()
                    .map(|p| {
                        WritableTxnMarkerPartitionResult::default()
                            .with_partition_index(*p)
                            .with_error_code(code.code())
                    })
                    .collect();
                WritableTxnMarkerTopicResult::default()
                    .with_name(t.name.clone())
                    .with_partitions(parts)
            })
            .collect();
        results.push(
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(topics),
        );
    }
    WriteTxnMarkersResponse::default().with_markers(results)
}

/// DeleteRecords: as local mode, refused for a topic whose cleanup policy
/// has no `delete` (POLICY_VIOLATION) and beyond the high watermark
/// (OFFSET_OUT_OF_RANGE); -1 is the high watermark.
pub async fn delete_records(
    b: &crate::Broker,
    front: &Front,
    req: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let row = front.topic(&name).await;
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let mut r = DeleteRecordsPartitionResult::default()
                .with_partition_index(p.partition_index)
                .with_low_watermark(-1);
            let code = match &row {
                _ if crate::datadir::is_internal_topic(&name) => ErrorCode::InvalidTopicException,
                Err(e) => {
                    crate::cluster::outage::cluster_warn!(front.cluster.outage, e, topic = %name, error = %e, "cluster: DeleteRecords could not read the catalogue");
                    ErrorCode::KafkaStorageError
                }
                Ok(None) => ErrorCode::UnknownTopicOrPartition,
                Ok(Some(row)) if !(0..row.partitions).contains(&p.partition_index) => {
                    ErrorCode::UnknownTopicOrPartition
                }
                Ok(Some(row)) => {
                    let policy = crate::topics::CleanupPolicy::parse(
                        row.configs
                            .get("cleanup.policy")
                            .unwrap_or(&b.config.cleanup_policy),
                    );
                    if !policy.delete {
                        tracing::info!(topic = %name, "DeleteRecords refused: cleanup.policy has no delete");
                        ErrorCode::PolicyViolation
                    } else {
                        match records::delete_records(
                            &front.cluster,
                            row.id,
                            p.partition_index,
                            p.offset,
                        )
                        .await
                        {
                            Ok(Ok(start)) => {
                                r.low_watermark = start;
                                ErrorCode::None
                            }
                            Ok(Err(Refused::OutOfRange { .. })) => ErrorCode::OffsetOutOfRange,
                            Ok(Err(Refused::Unknown)) => ErrorCode::UnknownTopicOrPartition,
                            Err(e) => {
                                crate::cluster::outage::cluster_warn!(front.cluster.outage, e, topic = %name, partition = p.partition_index, error = %e,
                                    "cluster: DeleteRecords not committed");
                                ErrorCode::KafkaStorageError
                            }
                        }
                    }
                }
            };
            r.error_code = code.code();
            partitions.push(r);
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

/// DescribeConfigs: a topic's configs from its catalogue row (read afresh,
/// not from this broker's copy), the broker's from its own settings; the
/// answer is shaped as local mode's.
pub async fn describe_configs(
    b: &crate::Broker,
    front: &Front,
    req: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let mut rows: HashMap<
        String,
        Result<Option<std::collections::BTreeMap<String, String>>, String>,
    > = HashMap::new();
    for res in &req.resources {
        let name = res.resource_name.to_string();
        if res.resource_type != admin::RESOURCE_TOPIC || rows.contains_key(&name) {
            continue;
        }
        let got = match catalogue::topic(&front.cluster.pool, &name).await {
            Ok(row) => Ok(row.map(|t| t.configs)),
            Err(e) => {
                crate::cluster::outage::cluster_warn!(front.cluster.outage, e, topic = %name, error = %e, "cluster: DescribeConfigs could not read the catalogue");
                Err(format!("the catalogue could not be read: {e}"))
            }
        };
        rows.insert(name, got);
    }
    let topic = |name: &str| rows.get(name).cloned().unwrap_or(Ok(None));
    admin::describe_configs_with(b, req, version, front.cluster.config.broker_id, topic)
}

/// IncrementalAlterConfigs and AlterConfigs: each topic's change is one
/// PostgreSQL transaction on its catalogue row (local mode's rules and
/// answers); every broker's copy follows through the catalogue channel.
pub async fn alter_configs(
    b: &crate::Broker,
    front: &Front,
    resources: Vec<admin::AlterEntry>,
    validate_only: bool,
) -> Vec<AlterConfigsResourceResponse> {
    let mut out = Vec::with_capacity(resources.len());
    for (resource_type, resource_name, change) in admin::refuse_duplicate_resources(resources) {
        let name = resource_name.to_string();
        let result = match change
            .and_then(|change| admin::alterable_topic(resource_type, &name).map(|()| change))
        {
            Err(e) => Err(e),
            Ok(change) => {
                let default = |k: &str| b.config.topic_default(k);
                match catalogue::alter_topic_configs(
                    &front.cluster.pool,
                    &name,
                    validate_only,
                    |current| change.apply(current, default),
                )
                .await
                {
                    Ok(row) => {
                        if !validate_only {
                            front.remember(row);
                        }
                        Ok(())
                    }
                    Err(CatalogueError::Topic(e)) => Err(admin::alter_error(&e)),
                    Err(CatalogueError::Cluster(e)) => {
                        crate::cluster::outage::cluster_warn!(front.cluster.outage, e, topic = %name, error = %e, "cluster: altering a topic's configs failed");
                        Err((
                            ErrorCode::KafkaStorageError,
                            format!("the catalogue could not be changed: {e}"),
                        ))
                    }
                }
            }
        };
        out.push(admin::alter_result(resource_type, resource_name, result));
    }
    out
}

/// CreateAcls, DeleteAcls and AlterUserScramCredentials change the
/// cluster's row (local mode's rules and answers, one transaction holding
/// the row); this broker's copy takes the result at once, the others at
/// their next refresh. A failure to reach PostgreSQL is KAFKA_STORAGE_ERROR
/// for every valid change, and nothing changed.
fn security_failed(front: &Front, what: &str, e: &ClusterError) -> String {
    crate::cluster::outage::cluster_warn!(front.cluster.outage, *e, error = %e, "cluster: changing the {what} failed; nothing changed");
    format!("the cluster's {what} could not be changed: {e}")
}

pub async fn create_acls(
    b: &crate::Broker,
    front: &Front,
    req: CreateAclsRequest,
) -> CreateAclsResponse {
    if !b.authz.enabled {
        return acl::create_disabled(&req);
    }
    let pool = &front.cluster.pool;
    match security::change(pool, security::ACLS, |cur: &Vec<Acl>| {
        acl::plan_create(cur, &req)
    })
    .await
    {
        Ok((next, version, plan)) => {
            front.security.set_acls(next, version);
            plan.answer(&Ok(()))
        }
        Err(e) => acl::plan_create(&[], &req)
            .1
            .answer(&Err(security_failed(front, "ACLs", &e))),
    }
}

pub async fn delete_acls(
    b: &crate::Broker,
    front: &Front,
    req: DeleteAclsRequest,
) -> DeleteAclsResponse {
    if !b.authz.enabled {
        return acl::delete_disabled(&req);
    }
    let pool = &front.cluster.pool;
    match security::change(pool, security::ACLS, |cur: &Vec<Acl>| {
        acl::plan_delete(cur, &req)
    })
    .await
    {
        Ok((next, version, plan)) => {
            front.security.set_acls(next, version);
            plan.answer(&Ok(()))
        }
        Err(e) => acl::plan_delete(&[], &req)
            .1
            .answer(&Err(security_failed(front, "ACLs", &e))),
    }
}

/// DescribeAcls from the cluster's row, read now (the copy if PostgreSQL
/// cannot be reached).
pub async fn describe_acls(
    b: &crate::Broker,
    front: &Front,
    req: DescribeAclsRequest,
) -> DescribeAclsResponse {
    match security::load(&front.cluster.pool, security::ACLS).await {
        Ok((acls, version)) => front.security.set_acls(acls, version),
        Err(e) => {
            crate::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: reading the ACLs failed; answering from the copy")
        }
    }
    b.authz.describe(&req)
}

pub async fn alter_user_scram_credentials(
    front: &Front,
    req: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let pool = &front.cluster.pool;
    match security::change(pool, security::USERS, |cur: &UserMap| plan_alter(cur, &req)).await {
        Ok((next, version, plan)) => {
            let resp = plan.answer(&Ok(()), &next);
            front.security.set_users(next, version);
            resp
        }
        Err(e) => {
            let empty = UserMap::default();
            plan_alter(&empty, &req).1.answer(
                &Err(security_failed(front, "SCRAM credentials", &e)),
                &empty,
            )
        }
    }
}

/// DescribeUserScramCredentials from the cluster's row, read now (the copy
/// if PostgreSQL cannot be reached).
pub async fn describe_user_scram_credentials(
    b: &crate::Broker,
    front: &Front,
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    match security::load(&front.cluster.pool, security::USERS).await {
        Ok((users, version)) => front.security.set_users(users, version),
        Err(e) => {
            crate::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: reading the SCRAM credentials failed; answering from the copy")
        }
    }
    b.users.describe(&req)
}
