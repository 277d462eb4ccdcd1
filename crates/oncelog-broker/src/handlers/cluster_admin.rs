//! KIP-664 transaction admin APIs in cluster mode, answered by any broker
//! from PostgreSQL: DescribeProducers (the partitions' producer rows),
//! DescribeTransactions (the coordinator's rows), ListTransactions (the ids
//! FindCoordinator names this broker for, so an admin client that asks
//! every broker lists each id once) and an operator's abort through
//! WriteTxnMarkers, shaped by local mode's helpers in `admin_txn`;
//! DeleteRecords; DescribeConfigs.

use std::collections::HashMap;

use kafka_protocol::messages::delete_records_request::DeleteRecordsRequest;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsResponse, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsRequest;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResponse;
use kafka_protocol::messages::describe_producers_request::DescribeProducersRequest;
use kafka_protocol::messages::describe_producers_response::DescribeProducersResponse;
use kafka_protocol::messages::describe_transactions_request::DescribeTransactionsRequest;
use kafka_protocol::messages::describe_transactions_response::DescribeTransactionsResponse;
use kafka_protocol::messages::list_transactions_request::ListTransactionsRequest;
use kafka_protocol::messages::list_transactions_response::ListTransactionsResponse;
use kafka_protocol::messages::write_txn_markers_request::WriteTxnMarkersRequest;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    WriteTxnMarkersResponse,
};

use super::{admin, admin_txn};
use crate::cluster::catalogue;
use crate::cluster::describe;
use crate::cluster::front::Front;
use crate::cluster::records::{self, Refused};
use crate::cluster::txn::{admin_abort, AdminAbort};
use crate::error::ErrorCode;

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
                tracing::warn!(error = %e, "cluster: DescribeProducers could not read the catalogue");
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
                tracing::warn!(error = %e, "cluster: DescribeProducers could not read producer state");
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
            tracing::warn!(error = %e, "cluster: DescribeTransactions could not read the coordinator");
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
            tracing::warn!(error = %e, "cluster: ListTransactions could not read the coordinator");
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
                    tracing::warn!(producer_id = pid, error = %e, "cluster: admin abort not committed");
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
                    tracing::warn!(topic = %name, error = %e, "cluster: DeleteRecords could not read the catalogue");
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
                                tracing::warn!(topic = %name, partition = p.partition_index, error = %e,
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
                tracing::warn!(topic = %name, error = %e, "cluster: DescribeConfigs could not read the catalogue");
                Err(format!("the catalogue could not be read: {e}"))
            }
        };
        rows.insert(name, got);
    }
    let topic = |name: &str| rows.get(name).cloned().unwrap_or(Ok(None));
    admin::describe_configs_with(b, req, version, front.cluster.config.broker_id, topic)
}
