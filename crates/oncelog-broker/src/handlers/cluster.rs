//! The requests a broker in cluster mode still serves from the cluster
//! backend directly (docs/cluster.md): Produce, Fetch, transactions
//! (InitProducerId, AddPartitionsToTxn, EndTxn; transaction versions 1 and
//! 2), and through `cluster_group`/`cluster_admin` consumer groups,
//! transactional offsets and the operator APIs. The requests in
//! `handlers::SHARED` (ApiVersions, Metadata, FindCoordinator, ListOffsets,
//! CreateTopics, DeleteTopics) are not here: one handler serves them in
//! both modes over `crate::backend`. An API in neither closes the
//! connection with a log line, as any unsupported API does.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::add_offsets_to_txn_request::AddOffsetsToTxnRequest;
use kafka_protocol::messages::add_offsets_to_txn_response::AddOffsetsToTxnResponse;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnRequest;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResponse, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::fetch_request::FetchRequest;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchResponse, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::incremental_alter_configs_response::IncrementalAlterConfigsResponse;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::produce_request::ProduceRequest;
use kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, ProducerId, RequestKind, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{cluster_admin, cluster_group, ready, FrameError, Pending};
use crate::cluster::catalogue::TopicRow;
use crate::cluster::cutover::Gates;
use crate::cluster::flusher::{ProduceResult, PRODUCE_TIMEOUT};
use crate::cluster::front::Front;
use crate::cluster::reader::{self, ReadRefusal};
use crate::cluster::sequencer::BatchOutcome;
use crate::cluster::txn::Refusal;
use crate::cluster::ClusterError;
use crate::error::{ErrorCode, Gate};
use crate::producer_state::ProduceReject;
use crate::topics::TopicMeta;
use crate::txn_coordinator::{self as tc, CoordError, TxnMeta, VerifyError};
use crate::Broker;

/// What cluster mode serves, and the versions.
pub const CLUSTER_SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 12),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 8),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 5),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 5),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 2),
    (ApiKey::WriteTxnMarkers, 1, 1),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    // Answered by the connection's security session (`crate::security`),
    // against the cluster's credentials.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    // No client quotas are kept: always empty, as local mode.
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
];

/// Longest long poll honoured.
const MAX_WAIT: Duration = Duration::from_secs(60);

fn s(x: impl Into<String>) -> StrBytes {
    StrBytes::from_string(x.into())
}

/// Who sent a request: its client id and address (JoinGroup keeps them).
pub struct Sender {
    pub client_id: String,
    pub host: String,
}

/// Runs one request in cluster mode.
pub async fn handle(
    b: Arc<Broker>,
    front: Arc<Front>,
    key: ApiKey,
    req: RequestKind,
    version: i16,
    sender: Sender,
    respond: impl Fn(ResponseKind) -> Option<Bytes> + Send + Sync + 'static,
) -> Result<Pending, FrameError> {
    if !CLUSTER_SUPPORTED.iter().any(|(k, _, _)| *k == key) {
        tracing::warn!(api = ?key, "not served in cluster mode yet");
        return Err(FrameError::UnsupportedApi(key));
    }
    Ok(match req {
        RequestKind::InitProducerId(r) => Box::pin(async move {
            respond(ResponseKind::InitProducerId(
                init_producer_id(&b, &front, r, version, sender).await,
            ))
        }),
        RequestKind::AddPartitionsToTxn(r) => Box::pin(async move {
            respond(ResponseKind::AddPartitionsToTxn(
                add_partitions_to_txn(&front, r, version).await,
            ))
        }),
        RequestKind::EndTxn(r) => {
            Box::pin(
                async move { respond(ResponseKind::EndTxn(end_txn(&b, &front, r, version).await)) },
            )
        }
        RequestKind::Produce(r) => {
            // Queued now, in arrival order; answered after the commit.
            let wait = produce(&b, &front, r, version).await;
            Box::pin(async move {
                let resp = wait.await?;
                respond(ResponseKind::Produce(resp))
            })
        }
        RequestKind::Fetch(r) => {
            Box::pin(
                async move { respond(ResponseKind::Fetch(fetch(&b, &front, r, version).await)) },
            )
        }
        RequestKind::JoinGroup(r) => Box::pin(async move {
            let resp =
                cluster_group::join_group(b, &front, r, version, sender.client_id, sender.host)
                    .await;
            respond(ResponseKind::JoinGroup(resp))
        }),
        RequestKind::SyncGroup(r) => Box::pin(async move {
            let resp = cluster_group::sync_group(b, &front, r, version).await;
            respond(ResponseKind::SyncGroup(resp))
        }),
        RequestKind::Heartbeat(r) => Box::pin(async move {
            let resp = cluster_group::heartbeat(b, &front, r).await;
            respond(ResponseKind::Heartbeat(resp))
        }),
        RequestKind::LeaveGroup(r) => Box::pin(async move {
            let resp = cluster_group::leave_group(b, &front, r, version).await;
            respond(ResponseKind::LeaveGroup(resp))
        }),
        RequestKind::OffsetCommit(r) => Box::pin(async move {
            let resp = cluster_group::offset_commit(b, &front, r, version).await;
            respond(ResponseKind::OffsetCommit(resp))
        }),
        RequestKind::OffsetFetch(r) => Box::pin(async move {
            let resp = cluster_group::offset_fetch(b, &front, r, version).await;
            respond(ResponseKind::OffsetFetch(resp))
        }),
        RequestKind::ListGroups(r) => Box::pin(async move {
            let resp = cluster_group::list_groups(b, &front, r, version).await;
            respond(ResponseKind::ListGroups(resp))
        }),
        RequestKind::DescribeGroups(r) => Box::pin(async move {
            let resp = cluster_group::describe_groups(b, &front, r, version).await;
            respond(ResponseKind::DescribeGroups(resp))
        }),
        RequestKind::AddOffsetsToTxn(r) => Box::pin(async move {
            let resp = add_offsets_to_txn(&front, r, version).await;
            respond(ResponseKind::AddOffsetsToTxn(resp))
        }),
        RequestKind::TxnOffsetCommit(r) => Box::pin(async move {
            // Transaction version 2 (v5): the offsets join the transaction
            // implicitly, by the decision AddOffsetsToTxn runs.
            let added = if version >= 5 {
                let id = r.transactional_id.0.to_string();
                add_offsets(&front, &id, r.producer_id.0, r.producer_epoch, false).await
            } else {
                Ok(())
            };
            let resp = match added {
                Ok(()) => cluster_group::txn_offset_commit(b, &front, r, version).await,
                Err(code) => super::group::txn_commit_response(&r, code),
            };
            respond(ResponseKind::TxnOffsetCommit(resp))
        }),
        RequestKind::DescribeProducers(r) => Box::pin(async move {
            let resp = cluster_admin::describe_producers(&front, r).await;
            respond(ResponseKind::DescribeProducers(resp))
        }),
        RequestKind::DescribeTransactions(r) => Box::pin(async move {
            let resp = cluster_admin::describe_transactions(&front, r).await;
            respond(ResponseKind::DescribeTransactions(resp))
        }),
        RequestKind::ListTransactions(r) => Box::pin(async move {
            let resp = cluster_admin::list_transactions(&front, r, version).await;
            respond(ResponseKind::ListTransactions(resp))
        }),
        RequestKind::DeleteGroups(r) => Box::pin(async move {
            let resp = cluster_group::delete_groups(b, &front, r).await;
            respond(ResponseKind::DeleteGroups(resp))
        }),
        RequestKind::OffsetDelete(r) => Box::pin(async move {
            let resp = cluster_group::offset_delete(b, &front, r).await;
            respond(ResponseKind::OffsetDelete(resp))
        }),
        RequestKind::DeleteRecords(r) => Box::pin(async move {
            let resp = cluster_admin::delete_records(&b, &front, r).await;
            respond(ResponseKind::DeleteRecords(resp))
        }),
        RequestKind::DescribeConfigs(r) => Box::pin(async move {
            let resp = cluster_admin::describe_configs(&b, &front, r, version).await;
            respond(ResponseKind::DescribeConfigs(resp))
        }),
        RequestKind::IncrementalAlterConfigs(r) => Box::pin(async move {
            let resources = r
                .resources
                .into_iter()
                .map(|res| {
                    let change = super::admin::ConfigChange::incremental(&res.configs);
                    (res.resource_type, res.resource_name, change)
                })
                .collect();
            let responses =
                cluster_admin::alter_configs(&b, &front, resources, r.validate_only).await;
            respond(ResponseKind::IncrementalAlterConfigs(
                IncrementalAlterConfigsResponse::default().with_responses(responses),
            ))
        }),
        RequestKind::AlterConfigs(r) => Box::pin(async move {
            let resources = r
                .resources
                .into_iter()
                .map(|res| {
                    let change = super::admin::ConfigChange::replace(&res.configs);
                    (res.resource_type, res.resource_name, change)
                })
                .collect();
            let responses =
                cluster_admin::alter_configs(&b, &front, resources, r.validate_only).await;
            respond(ResponseKind::AlterConfigs(
                super::admin::alter_configs_response(responses),
            ))
        }),
        RequestKind::DescribeClientQuotas(_) => ready(respond(ResponseKind::DescribeClientQuotas(
            kafka_protocol::messages::DescribeClientQuotasResponse::default()
                .with_entries(Some(Vec::new())),
        ))),
        RequestKind::CreateAcls(r) => Box::pin(async move {
            let resp = cluster_admin::create_acls(&b, &front, r).await;
            respond(ResponseKind::CreateAcls(resp))
        }),
        RequestKind::DeleteAcls(r) => Box::pin(async move {
            let resp = cluster_admin::delete_acls(&b, &front, r).await;
            respond(ResponseKind::DeleteAcls(resp))
        }),
        RequestKind::DescribeAcls(r) => Box::pin(async move {
            let resp = cluster_admin::describe_acls(&b, &front, r).await;
            respond(ResponseKind::DescribeAcls(resp))
        }),
        RequestKind::AlterUserScramCredentials(r) => Box::pin(async move {
            let resp = cluster_admin::alter_user_scram_credentials(&front, r).await;
            respond(ResponseKind::AlterUserScramCredentials(resp))
        }),
        RequestKind::DescribeUserScramCredentials(r) => Box::pin(async move {
            let resp = cluster_admin::describe_user_scram_credentials(&b, &front, r).await;
            respond(ResponseKind::DescribeUserScramCredentials(resp))
        }),
        RequestKind::WriteTxnMarkers(r) => Box::pin(async move {
            let resp = cluster_admin::write_txn_markers(&front, r).await;
            respond(ResponseKind::WriteTxnMarkers(resp))
        }),
        _ => return Err(FrameError::UnsupportedApi(key)),
    })
}

fn meta_of(t: &TopicRow) -> TopicMeta {
    TopicMeta {
        name: t.name.clone(),
        id: t.id,
        partitions: t.partitions,
        configs: t.configs.clone(),
    }
}

/// The wire code of a coordinator refusal; PRODUCER_FENCED only where the
/// request version knows it (as local mode).
fn coord_code(e: CoordError, fenced_known: bool) -> ErrorCode {
    match e {
        CoordError::ConcurrentTransactions => ErrorCode::ConcurrentTransactions,
        CoordError::ProducerFenced if fenced_known => ErrorCode::ProducerFenced,
        CoordError::ProducerFenced => ErrorCode::InvalidProducerEpoch,
        CoordError::InvalidProducerIdMapping => ErrorCode::InvalidProducerIdMapping,
        CoordError::InvalidTxnState => ErrorCode::InvalidTxnState,
    }
}

/// Runs a coordinator decision (with the gates of `topics`); storage
/// failures are retriable (COORDINATOR_NOT_AVAILABLE: the client looks the
/// coordinator up again). `what` names the request in the log lines.
async fn decide(
    front: &Front,
    id: &str,
    what: &str,
    topics: &[String],
    f: Box<crate::cluster::txn::Decide<'_>>,
    fenced_known: bool,
) -> Result<(i64, i16), ErrorCode> {
    match crate::cluster::txn::run(&front.cluster, id, topics, f).await {
        Ok(Ok(identity)) => Ok(identity),
        Ok(Err(Refusal::Coord(CoordError::ProducerFenced))) => {
            tracing::warn!(
                transactional_id = id,
                request = what,
                "{what} from a fenced producer"
            );
            Err(coord_code(CoordError::ProducerFenced, fenced_known))
        }
        Ok(Err(Refusal::Coord(e))) => {
            tracing::debug!(transactional_id = id, error = %e, "cluster: coordinator refused");
            Err(coord_code(e, fenced_known))
        }
        // As local mode: a held commit is retried by the client.
        Ok(Err(Refusal::Gate(Gate::Held(why)))) => {
            tracing::debug!(transactional_id = id, request = what, reason = %why, "commit held");
            Err(ErrorCode::ConcurrentTransactions)
        }
        Ok(Err(Refusal::SecondWriter(why))) => {
            tracing::warn!(transactional_id = id, request = what, reason = %why, "second transactional writer refused");
            Err(ErrorCode::TransactionalIdAuthorizationFailed)
        }
        Ok(Err(Refusal::Gate(Gate::Refused(why)))) => {
            tracing::warn!(transactional_id = id, request = what, reason = %why, "transactional write refused");
            Err(ErrorCode::TransactionalIdAuthorizationFailed)
        }
        Err(e) => {
            crate::cluster::outage::cluster_warn!(front.cluster.outage, e, transactional_id = id, error = %e, "cluster: coordinator decision not committed");
            Err(ErrorCode::CoordinatorNotAvailable)
        }
    }
}

/// Logs what an InitProducerId did to the id's previous producer, as local
/// mode does: a newer producer fences the old epoch, and aborts the
/// transaction it had open.
fn log_fence(
    b: &Broker,
    id: &str,
    before: Option<&TxnMeta>,
    expected: Option<(i64, i16)>,
    after: (i64, i16),
    sender: &Sender,
) {
    let Some(before) = before else { return };
    if expected == Some((before.producer_id, before.epoch))
        || (before.producer_id, before.epoch) == after
    {
        return;
    }
    b.txn.count_fence(id, "newer_producer");
    let b = before;
    if b.state == crate::txn_coordinator::TxnState::Ongoing {
        let partitions: Vec<String> = b
            .partitions
            .iter()
            .map(|(t, p)| format!("{t}-{p}"))
            .collect();
        tracing::warn!(transactional_id = %id, producer_id = b.producer_id, old_epoch = b.epoch,
            new_epoch = after.1, client_id = %sender.client_id, peer = %sender.host,
            aborted = %partitions.join(","),
            "a newer producer took the transactional id; the previous epoch is fenced and its open transaction aborted");
    } else {
        tracing::info!(transactional_id = %id, producer_id = b.producer_id, old_epoch = b.epoch,
            new_epoch = after.1, client_id = %sender.client_id, peer = %sender.host,
            "a newer producer took the transactional id; the previous epoch is fenced");
    }
}

async fn init_producer_id(
    b: &Broker,
    front: &Front,
    req: InitProducerIdRequest,
    version: i16,
    sender: Sender,
) -> InitProducerIdResponse {
    let resp = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    if let Some(id) = req.transactional_id.as_ref().map(|t| t.0.to_string()) {
        let timeout = req.transaction_timeout_ms;
        if timeout <= 0 || timeout > b.config.transaction_max_timeout_ms {
            return resp.with_error_code(ErrorCode::InvalidTransactionTimeout.code());
        }
        let expected = (version >= 3 && req.producer_id.0 >= 0)
            .then_some((req.producer_id.0, req.producer_epoch));
        let tid = id.clone();
        let before: std::sync::Mutex<Option<TxnMeta>> = std::sync::Mutex::new(None);
        let seen = &before;
        let f = Box::new(
            move |m: Option<&TxnMeta>, now: i64, new_pid: &mut dyn FnMut() -> i64, g: &Gates| {
                if let Ok(mut b) = seen.lock() {
                    *b = m.cloned();
                }
                if let Some((m, t)) = m.and_then(|m| g.protected(m).map(|t| (m, t))) {
                    tracing::warn!(transactional_id = %tid, topic = t, producer_id = m.producer_id, epoch = m.epoch,
                        "InitProducerId refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): it would abort a transaction holding a topic being cut over");
                    return Err(Gate::Refused(format!(
                        "transactional id {tid:?} has an open transaction holding topic {t:?}, which is being cut over (oncelog cutover): \
                         it ends only by its own EndTxn (the new writer's restored committer) or at the drain deadline, \
                         so a new producer may not take the id and abort it"
                    ))
                    .into());
                }
                Ok(tc::decide_init(m, &tid, timeout, expected, now, new_pid)?)
            },
        );
        return match decide(front, &id, "InitProducerId", &[], f, version >= 4).await {
            Ok((pid, epoch)) => {
                let before = before.into_inner().unwrap_or_else(|p| p.into_inner());
                log_fence(b, &id, before.as_ref(), expected, (pid, epoch), &sender);
                tracing::debug!(transactional_id = %id, producer_id = pid, epoch, "cluster: producer initialised");
                resp.with_producer_id(ProducerId(pid))
                    .with_producer_epoch(epoch)
            }
            Err(code) => resp.with_error_code(code.code()),
        };
    }
    let next = async {
        let client = front.cluster.pool.get().await.map_err(ClusterError::from)?;
        let row = client
            .query_one("SELECT nextval('producer_ids')", &[])
            .await
            .map_err(ClusterError::from)?;
        Ok::<i64, ClusterError>(row.get(0))
    };
    match next.await {
        Ok(pid) => resp
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(0),
        Err(e) => {
            crate::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: could not allocate a producer id");
            resp.with_error_code(ErrorCode::CoordinatorNotAvailable.code())
        }
    }
}

async fn add_partitions_to_txn(
    front: &Front,
    req: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    let id = req.v3_and_below_transactional_id.0.to_string();
    let (pid, epoch) = (
        req.v3_and_below_producer_id.0,
        req.v3_and_below_producer_epoch,
    );
    let topics = &req.v3_and_below_topics;
    // Unknown partitions fail the whole set (they get UNKNOWN_TOPIC_OR_PARTITION,
    // the others OPERATION_NOT_ATTEMPTED), as local mode.
    let mut known: BTreeMap<String, i32> = BTreeMap::new();
    for t in topics {
        if let Ok(Some(row)) = front.topic(t.name.0.as_str()).await {
            known.insert(row.name.clone(), row.partitions);
        }
    }
    let exists = |t: &str, p: i32| known.get(t).is_some_and(|n| p >= 0 && p < *n);
    let unknown = topics
        .iter()
        .any(|t| t.partitions.iter().any(|p| !exists(t.name.0.as_str(), *p)));
    let shared = if unknown {
        None
    } else {
        // A topic reserved for one writer (writer.transactional.id.prefix)
        // refuses every other writer's transactions (S6), and a cut-over
        // the old writer's new ones: checked in the decision's transaction.
        let parts: Vec<(String, i32)> = topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(move |p| (t.name.0.to_string(), *p)))
            .collect();
        let names: Vec<String> = topics.iter().map(|t| t.name.0.to_string()).collect();
        let tid = id.clone();
        let f = Box::new(
            move |m: Option<&TxnMeta>, now: i64, _: &mut dyn FnMut() -> i64, g: &Gates| {
                let effects = tc::decide_add_partitions(m, pid, epoch, &parts, now)?;
                g.check_adds(m, &tid, parts.iter().map(|(t, _)| t.as_str()))?;
                Ok(effects)
            },
        );
        decide(front, &id, "AddPartitionsToTxn", &names, f, version >= 2)
            .await
            .err()
    };
    let results = topics
        .iter()
        .map(|t| {
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let code = if unknown {
                        if exists(t.name.0.as_str(), *p) {
                            ErrorCode::OperationNotAttempted
                        } else {
                            ErrorCode::UnknownTopicOrPartition
                        }
                    } else {
                        shared.unwrap_or(ErrorCode::None)
                    };
                    AddPartitionsToTxnPartitionResult::default()
                        .with_partition_index(*p)
                        .with_partition_error_code(code.code())
                })
                .collect();
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(parts)
        })
        .collect();
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}

/// AddOffsetsToTxn: the group's offsets join the transaction (as local
/// mode: the offsets partition is one of its partitions; EndTxn then
/// completes the pending offsets instead of writing a marker there). Any
/// broker runs it: the decision is the transactional id's, under its row.
async fn add_offsets_to_txn(
    front: &Front,
    req: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let id = req.transactional_id.0.to_string();
    let code = match add_offsets(
        front,
        &id,
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

/// Adds the group offsets' partition to the transaction of `id`
/// (AddOffsetsToTxn, and TxnOffsetCommit v5 implicitly).
async fn add_offsets(
    front: &Front,
    id: &str,
    pid: i64,
    epoch: i16,
    fenced_known: bool,
) -> Result<(), ErrorCode> {
    let parts = vec![(crate::groups::OFFSETS_TOPIC.to_string(), 0)];
    let f = Box::new(
        move |m: Option<&TxnMeta>, now: i64, _: &mut dyn FnMut() -> i64, _: &Gates| {
            Ok(tc::decide_add_partitions(m, pid, epoch, &parts, now)?)
        },
    );
    decide(front, id, "AddOffsetsToTxn", &[], f, fenced_known)
        .await
        .map(|_| ())
}

async fn end_txn(
    b: &Arc<Broker>,
    front: &Arc<Front>,
    req: EndTxnRequest,
    version: i16,
) -> EndTxnResponse {
    let id = req.transactional_id.0.to_string();
    let (pid, epoch, commit) = (req.producer_id.0, req.producer_epoch, req.committed);
    // KIP-890 transaction version 2: every end bumps the epoch.
    let tv2 = version >= 5;
    // The topics an open transaction commits to (for second-writer detection).
    let committed: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let seen = &committed;
    let tid = id.clone();
    let f = Box::new(
        move |m: Option<&TxnMeta>, now: i64, new_pid: &mut dyn FnMut() -> i64, g: &Gates| {
            if let (true, Some(m), Ok(mut c)) = (commit, m, seen.lock()) {
                if m.state == crate::txn_coordinator::TxnState::Ongoing && m.producer_id == pid {
                    *c = m.partitions.iter().map(|(t, _)| t.clone()).collect();
                }
            }
            let effects = tc::decide_end(m, pid, epoch, commit, tv2, now, new_pid)?;
            // The writer fence and a cut-over, in the step that commits.
            g.check_commit(&tid, &effects)?;
            Ok(effects)
        },
    );
    let mut resp = EndTxnResponse::default();
    match decide(front, &id, "EndTxn", &[], f, version >= 2).await {
        Ok((new_pid, new_epoch)) => {
            if tv2 {
                // Transaction version 2: the identity the next transaction uses.
                resp.producer_id = ProducerId(new_pid);
                resp.producer_epoch = new_epoch;
            }
            tracing::debug!(transactional_id = %id, commit, "cluster: transaction ended");
            let mut topics = committed.into_inner().unwrap_or_else(|p| p.into_inner());
            topics.retain(|t| t != crate::groups::OFFSETS_TOPIC);
            topics.sort();
            topics.dedup();
            if !topics.is_empty() {
                let (b, front) = (b.clone(), front.clone());
                let writer = crate::writers::prefix_of(&id).to_string();
                tokio::spawn(async move {
                    if let Err(e) = crate::cluster::writers::record_commit(
                        &front.cluster,
                        &front.writers,
                        &b.writers,
                        &topics,
                        &writer,
                        oncelog_log::now_ms(),
                    )
                    .await
                    {
                        tracing::debug!(error = %e, "cluster: recording a topic's writers failed");
                    }
                });
            }
        }
        Err(code) => {
            resp.error_code = code.code();
            if tv2 {
                resp.producer_id = ProducerId(-1);
                resp.producer_epoch = -1;
            }
        }
    }
    resp
}

enum Queued {
    /// Answered now: the code, the message, KIP-467's record errors.
    Done(ErrorCode, Option<String>, Vec<(i32, String)>),
    /// Queued to the flusher; the broker's time stamped on it
    /// (LogAppendTime) or -1.
    Waiting(oneshot::Receiver<ProduceResult>, i64),
}

/// Checks one partition's batch and queues it to the flusher.
async fn queue_one(
    front: &Front,
    b: &Broker,
    topic: &str,
    index: i32,
    records: Option<Bytes>,
) -> Queued {
    let bad = |code, why: String| Queued::Done(code, Some(why), Vec::new());
    if crate::datadir::is_internal_topic(topic) {
        tracing::warn!(topic, "produce to an internal topic refused");
        return bad(
            ErrorCode::InvalidTopicException,
            format!("cannot append to internal topic {topic}: it belongs to the broker"),
        );
    }
    let t = match front.topic(topic).await {
        Ok(Some(t)) => t,
        Ok(None) => {
            return bad(
                ErrorCode::UnknownTopicOrPartition,
                format!("unknown topic {topic}"),
            )
        }
        Err(e) => return bad(ErrorCode::KafkaStorageError, e.to_string()),
    };
    if index < 0 || index >= t.partitions {
        return bad(
            ErrorCode::UnknownTopicOrPartition,
            format!("unknown partition {topic}-{index}"),
        );
    }
    let Some(records) = records.filter(|r| !r.is_empty()) else {
        return bad(ErrorCode::InvalidRecord, "no records".into());
    };
    let name = format!("{topic}-{index}");
    let refused =
        |r: super::produce::Refusal| Queued::Done(r.code, Some(r.message), r.record_errors);
    let h = match super::produce::check_batch(&records, &name) {
        Ok(h) => h,
        Err(r) => return refused(r),
    };
    let meta = meta_of(&t);
    // The stored bytes are the client's (offsets are patched when served),
    // stamped with the broker's time under LogAppendTime.
    let (data, append_time) = match super::produce::check_contents(b, &meta, &name, &records, &h) {
        Ok(x) => x,
        Err(r) => return refused(r),
    };
    match front
        .flusher
        .submit(t.id, &t.name, index, data.freeze())
        .await
    {
        Ok(rx) => Queued::Waiting(rx, append_time),
        Err(e) => bad(ErrorCode::KafkaStorageError, e.to_string()),
    }
}

fn outcome_code(
    o: &Result<BatchOutcome, Arc<ClusterError>>,
) -> (ErrorCode, i64, i64, Option<String>) {
    match o {
        Ok(BatchOutcome::Appended {
            base_offset,
            log_start_offset,
        })
        | Ok(BatchOutcome::Duplicate {
            base_offset,
            log_start_offset,
        }) => (ErrorCode::None, *base_offset, *log_start_offset, None),
        Ok(BatchOutcome::Rejected(r)) => {
            let code = match r {
                ProduceReject::InvalidProducerEpoch { .. } => ErrorCode::InvalidProducerEpoch,
                ProduceReject::OutOfOrderSequence { .. }
                | ProduceReject::NewEpochNotAtZero { .. } => ErrorCode::OutOfOrderSequenceNumber,
                ProduceReject::InvalidTxnState => ErrorCode::InvalidTxnState,
            };
            (code, -1, -1, Some(r.to_string()))
        }
        Ok(BatchOutcome::UnknownPartition) => (
            ErrorCode::UnknownTopicOrPartition,
            -1,
            -1,
            Some("the partition does not exist".into()),
        ),
        // as local mode: a fenced epoch is INVALID_PRODUCER_EPOCH in a
        // produce answer, a partition outside the transaction INVALID_TXN_STATE
        Ok(BatchOutcome::Unverified(v)) => (
            match v {
                VerifyError::StaleEpoch => ErrorCode::InvalidProducerEpoch,
                VerifyError::NotInTransaction => ErrorCode::InvalidTxnState,
            },
            -1,
            -1,
            Some(v.to_string()),
        ),
        // Fenced: this broker's session ended; NOT_LEADER makes the client
        // refresh its metadata and retry (elsewhere, or here once re-registered).
        Err(e) if matches!(**e, ClusterError::Fenced { .. }) => {
            (ErrorCode::NotLeaderOrFollower, -1, -1, Some(e.to_string()))
        }
        Err(e) => (ErrorCode::KafkaStorageError, -1, -1, Some(e.to_string())),
    }
}

type ProduceWait =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<ProduceResponse>> + Send>>;

/// Produce v12 (KIP-890 transaction version 2): a transactional batch adds
/// its partition to its producer's transaction (the decision AddPartitionsToTxn
/// runs, under the id's row) before it is queued, as local mode. Returns the
/// partitions that could not be added, with the code and message to answer.
async fn implicit_add(
    front: &Front,
    req: &ProduceRequest,
    version: i16,
) -> HashMap<(String, i32), (ErrorCode, String)> {
    let mut refused = HashMap::new();
    let Some(id) = req
        .transactional_id
        .as_ref()
        .filter(|_| version >= 12)
        .map(|t| t.0.to_string())
    else {
        return refused;
    };
    let mut ident = None;
    let mut parts = Vec::new();
    for td in &req.topic_data {
        let Ok(Some(row)) = front.topic(td.name.0.as_str()).await else {
            continue;
        };
        for pd in &td.partition_data {
            let Some(who) = super::produce::transactional_identity(pd.records.as_deref()) else {
                continue;
            };
            if (0..row.partitions).contains(&pd.index) {
                ident = Some(who);
                parts.push((row.name.clone(), pd.index));
            }
        }
    }
    let Some((pid, epoch)) = ident else {
        return refused;
    };
    let add = parts.clone();
    let names: Vec<String> = parts.iter().map(|(t, _)| t.clone()).collect();
    let gate: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let why = &gate;
    let tid = id.clone();
    let f = Box::new(
        move |m: Option<&TxnMeta>, now: i64, _: &mut dyn FnMut() -> i64, g: &Gates| {
            let effects = tc::decide_add_partitions(m, pid, epoch, &add, now)?;
            if let Err(e) = g.check_adds(m, &tid, add.iter().map(|(t, _)| t.as_str())) {
                if let Ok(mut w) = why.lock() {
                    *w = Some(e.to_string());
                }
                return Err(e);
            }
            Ok(effects)
        },
    );
    let failed = match decide(front, &id, "Produce", &names, f, false).await {
        Ok(_) => None,
        // Never PRODUCER_FENCED in a produce answer; retriable states
        // become NOT_ENOUGH_REPLICAS, which every client retries.
        Err(code) => Some((
            match code {
                ErrorCode::InvalidProducerEpoch | ErrorCode::ProducerFenced => {
                    ErrorCode::InvalidProducerEpoch
                }
                ErrorCode::ConcurrentTransactions | ErrorCode::CoordinatorNotAvailable => {
                    ErrorCode::NotEnoughReplicas
                }
                ErrorCode::TransactionalIdAuthorizationFailed => {
                    ErrorCode::TransactionalIdAuthorizationFailed
                }
                _ => ErrorCode::InvalidTxnState,
            },
            gate.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(|| {
                    "the partition could not be added to the transaction".to_string()
                }),
        )),
    };
    if let Some(f) = failed {
        for p in parts {
            refused.insert(p, f.clone());
        }
    }
    refused
}

async fn produce(b: &Broker, front: &Front, req: ProduceRequest, version: i16) -> ProduceWait {
    let acks = req.acks;
    let valid_acks = (-1..=1).contains(&acks);
    let refused = implicit_add(front, &req, version).await;
    let mut queued: Vec<(TopicName, Vec<(i32, Queued)>)> = Vec::with_capacity(req.topic_data.len());
    for td in req.topic_data {
        let mut parts = Vec::with_capacity(td.partition_data.len());
        for pd in td.partition_data {
            let q = if !valid_acks {
                Queued::Done(
                    ErrorCode::InvalidRequiredAcks,
                    Some(format!("acks={acks} is not 0, 1 or -1")),
                    Vec::new(),
                )
            } else if let Some((code, why)) = refused.get(&(td.name.0.to_string(), pd.index)) {
                Queued::Done(*code, Some(why.clone()), Vec::new())
            } else {
                queue_one(front, b, td.name.0.as_str(), pd.index, pd.records).await
            };
            parts.push((pd.index, q));
        }
        queued.push((td.name, parts));
    }
    Box::pin(async move {
        let mut topics = Vec::with_capacity(queued.len());
        for (name, parts) in queued {
            let mut responses = Vec::with_capacity(parts.len());
            for (index, q) in parts {
                let mut errors = Vec::new();
                let mut stamped = -1;
                let (code, base, log_start, message) = match q {
                    Queued::Done(code, why, record_errors) => {
                        errors = record_errors;
                        (code, -1, -1, why)
                    }
                    Queued::Waiting(rx, append_time) => {
                        match tokio::time::timeout(PRODUCE_TIMEOUT, rx).await {
                            Ok(Ok(o)) => {
                                let out = outcome_code(&o);
                                if out.0 == ErrorCode::None {
                                    stamped = append_time;
                                }
                                out
                            }
                            Ok(Err(_)) => (
                                ErrorCode::KafkaStorageError,
                                -1,
                                -1,
                                Some("the flusher stopped".into()),
                            ),
                            Err(_) => (
                                ErrorCode::RequestTimedOut,
                                -1,
                                -1,
                                Some("the commit did not finish in time; it may still".into()),
                            ),
                        }
                    }
                };
                let mut r = PartitionProduceResponse::default()
                    .with_index(index)
                    .with_error_code(code.code())
                    .with_base_offset(base)
                    .with_log_append_time_ms(stamped);
                if version >= 5 {
                    r.log_start_offset = log_start;
                }
                if version >= 8 {
                    r.error_message = message.map(s);
                    r.record_errors = super::produce::record_errors(errors);
                }
                responses.push(r);
            }
            topics.push(
                TopicProduceResponse::default()
                    .with_name(name)
                    .with_partition_responses(responses),
            );
        }
        if acks == 0 {
            return None;
        }
        Some(ProduceResponse::default().with_responses(topics))
    })
}

struct Round {
    resp: FetchResponse,
    bytes: usize,
    has_error: bool,
}

async fn fetch_once(b: &Broker, front: &Front, req: &FetchRequest, version: i16) -> Round {
    let read_committed = req.isolation_level == 1;
    let mut remaining = (req.max_bytes.max(0) as usize).min(b.config.fetch_max_bytes);
    let mut total = 0usize;
    let mut has_error = false;
    let mut topics = Vec::with_capacity(req.topics.len());
    for ft in &req.topics {
        let topic = front.topic(ft.topic.0.as_str()).await.ok().flatten();
        let mut parts = Vec::with_capacity(ft.partitions.len());
        for fp in &ft.partitions {
            let mut pd = PartitionData::default()
                .with_partition_index(fp.partition)
                .with_records(Some(Bytes::new()));
            let Some(t) = topic
                .as_ref()
                .filter(|t| fp.partition >= 0 && fp.partition < t.partitions)
            else {
                pd.error_code = ErrorCode::UnknownTopicOrPartition.code();
                has_error = true;
                parts.push(pd);
                continue;
            };
            let limit = (fp.partition_max_bytes.max(0) as usize).min(remaining);
            match reader::read(
                &front.cluster,
                &t.id,
                fp.partition,
                fp.fetch_offset,
                limit,
                read_committed,
                total == 0,
            )
            .await
            {
                Ok(Some(read)) => {
                    pd.high_watermark = read.high_watermark;
                    pd.last_stable_offset = read.last_stable_offset;
                    if version >= 5 {
                        pd.log_start_offset = read.log_start_offset;
                    }
                    if read_committed {
                        pd.aborted_transactions = Some(
                            read.aborted
                                .into_iter()
                                .map(|a| {
                                    AbortedTransaction::default()
                                        .with_producer_id(ProducerId(a.producer_id))
                                        .with_first_offset(a.first_offset)
                                })
                                .collect(),
                        );
                    }
                    match read.data {
                        Ok(data) if data.is_empty() => {}
                        Ok(data) => {
                            total += data.len();
                            remaining = remaining.saturating_sub(data.len());
                            pd.records = Some(Bytes::from(data));
                        }
                        Err(ReadRefusal::OutOfRange) => {
                            pd.error_code = ErrorCode::OffsetOutOfRange.code();
                            has_error = true;
                        }
                    }
                }
                Ok(None) => {
                    pd.error_code = ErrorCode::UnknownTopicOrPartition.code();
                    has_error = true;
                }
                Err(e) => {
                    crate::cluster::outage::cluster_warn!(front.cluster.outage, e, partition = %format!("{}-{}", t.name, fp.partition), error = %e,
                        "cluster: read failed");
                    pd.error_code = ErrorCode::KafkaStorageError.code();
                    has_error = true;
                }
            }
            parts.push(pd);
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(ft.topic.clone())
                .with_partitions(parts),
        );
    }
    Round {
        resp: FetchResponse::default().with_responses(topics),
        bytes: total,
        has_error,
    }
}

async fn fetch(b: &Broker, front: &Front, req: FetchRequest, version: i16) -> FetchResponse {
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(MAX_WAIT);
    let deadline = Instant::now() + wait;
    let min_bytes = req.min_bytes.max(1) as usize;
    loop {
        // Register for wake-ups before reading, so no commit slips between.
        let notified = front.cluster.data_notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let round = fetch_once(b, front, &req, version).await;
        if round.bytes >= min_bytes || round.has_error || Instant::now() >= deadline {
            return round.resp;
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}
