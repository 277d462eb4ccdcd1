//! InitProducerId, AddPartitionsToTxn and EndTxn.
//!
//! Idempotent producers (no transactional id) get a fresh producer id at
//! epoch 0 every time, as Kafka does. Transactional ones go through the
//! coordinator. Error codes are gated by request version (PROTOCOL-BRIEF §1):
//! PRODUCER_FENCED only where the version knows it, INVALID_PRODUCER_EPOCH
//! before that.

use std::sync::Arc;

use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnTopic,
};
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResponse, AddPartitionsToTxnResult,
    AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::ProducerId;

use crate::coordinators::txn_service::{EndRequest, VerifyError};
use crate::error::ErrorCode;
use crate::observe::txn_history::Requester;
use crate::Broker;

/// InitProducerId, in both modes (over [`crate::backend::Txns`]).
pub async fn init_producer_id(
    b: Arc<Broker>,
    req: InitProducerIdRequest,
    version: i16,
    who: Requester,
) -> InitProducerIdResponse {
    let resp = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let txns = b.txns();
    let Some(id) = req.transactional_id.as_ref().map(|t| t.0.to_string()) else {
        return match txns.new_producer_id().await {
            Ok(pid) => {
                tracing::debug!(producer_id = pid, "idempotent producer id allocated");
                resp.with_producer_id(ProducerId(pid))
                    .with_producer_epoch(0)
            }
            Err(code) => resp.with_error_code(code.code()),
        };
    };
    if req.transaction_timeout_ms <= 0
        || req.transaction_timeout_ms > b.config.transaction_max_timeout_ms
    {
        return resp.with_error_code(ErrorCode::InvalidTransactionTimeout.code());
    }
    let expected =
        (version >= 3 && req.producer_id.0 >= 0).then_some((req.producer_id.0, req.producer_epoch));
    let two_phase = crate::machines::txn_coordinator::TwoPhase {
        enable: version >= 6 && req.enable_2_pc,
        keep_prepared: version >= 6 && req.keep_prepared_txn,
    };
    if (two_phase.enable || two_phase.keep_prepared) && !b.config.two_phase_commit_enable {
        tracing::warn!(transactional_id = %id, "InitProducerId asked for two-phase commit (KIP-939), which is off (transaction.two.phase.commit.enable)");
        return resp.with_error_code(ErrorCode::TransactionalIdAuthorizationFailed.code());
    }
    if two_phase.keep_prepared && expected.is_some() {
        // Kept only by the first InitProducerId of a restarted producer.
        return resp.with_error_code(ErrorCode::InvalidRequest.code());
    }
    let resp = resp
        .with_ongoing_txn_producer_id(ProducerId(-1))
        .with_ongoing_txn_producer_epoch(-1);
    match txns
        .init_producer_id(
            &id,
            req.transaction_timeout_ms,
            expected,
            two_phase,
            &who,
            version >= 4,
        )
        .await
    {
        Ok(init) => {
            let (kpid, kepoch) = init.kept.unwrap_or((-1, -1));
            resp.with_producer_id(ProducerId(init.producer_id))
                .with_producer_epoch(init.epoch)
                .with_ongoing_txn_producer_id(ProducerId(kpid))
                .with_ongoing_txn_producer_epoch(kepoch)
        }
        Err(code) => resp.with_error_code(code.code()),
    }
}

/// AddPartitionsToTxn, in both modes. v0–3: one transaction, from a client. v4–5 (broker
/// to broker in Kafka, KIP-890 part 1): a batch of transactions, each either
/// added or, with `verify_only`, only checked.
pub async fn add_partitions_to_txn(
    b: Arc<Broker>,
    req: AddPartitionsToTxnRequest,
    version: i16,
    who: Requester,
) -> AddPartitionsToTxnResponse {
    if version <= 3 {
        let txn = TxnRef {
            id: req.v3_and_below_transactional_id.0.as_str(),
            pid: req.v3_and_below_producer_id.0,
            epoch: req.v3_and_below_producer_epoch,
        };
        let results = add_one(&b, txn, &req.v3_and_below_topics, false, version >= 2, &who).await;
        return AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results);
    }
    let mut out = Vec::with_capacity(req.transactions.len());
    for t in &req.transactions {
        let txn = TxnRef {
            id: t.transactional_id.0.as_str(),
            pid: t.producer_id.0,
            epoch: t.producer_epoch,
        };
        let topic_results = add_one(&b, txn, &t.topics, t.verify_only, true, &who).await;
        out.push(
            AddPartitionsToTxnResult::default()
                .with_transactional_id(t.transactional_id.clone())
                .with_topic_results(topic_results),
        );
    }
    AddPartitionsToTxnResponse::default().with_results_by_transaction(out)
}

/// The transaction an AddPartitionsToTxn entry names.
#[derive(Debug, Clone, Copy)]
struct TxnRef<'a> {
    id: &'a str,
    pid: i64,
    epoch: i16,
}

/// One transaction's partitions: unknown partitions fail the whole set (they
/// get UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED).
async fn add_one(
    b: &Arc<Broker>,
    txn: TxnRef<'_>,
    topics: &[AddPartitionsToTxnTopic],
    verify_only: bool,
    fenced_known: bool,
    who: &Requester,
) -> Vec<AddPartitionsToTxnTopicResult> {
    let TxnRef { id, pid, epoch } = txn;
    let catalogue = b.catalogue();
    let mut known: std::collections::BTreeMap<String, i32> = std::collections::BTreeMap::new();
    for t in topics {
        if let Ok(Some(meta)) = catalogue.topic(t.name.0.as_str()).await {
            known.insert(meta.name, meta.partitions);
        }
    }
    let exists = |t: &str, p: i32| known.get(t).is_some_and(|n| (0..*n).contains(&p));
    let unknown = topics
        .iter()
        .any(|t| t.partitions.iter().any(|p| !exists(t.name.0.as_str(), *p)));
    let mut shared = None;
    // A topic reserved for one writer refuses everyone else (S6); a topic
    // being cut over refuses new transactions of its old writer (S10). The
    // add itself asks again in its step.
    for t in topics {
        if let Err(why) = catalogue.write_gate(t.name.0.as_str(), id) {
            tracing::warn!(transactional_id = id, topic = %t.name.0.as_str(), reason = %why,
                "second transactional writer refused");
            shared = Some(ErrorCode::TransactionalIdAuthorizationFailed);
        }
    }
    let txns = b.txns();
    if !unknown && !verify_only && shared.is_none() {
        let parts: Vec<(String, i32)> = topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(move |p| (t.name.0.to_string(), *p)))
            .collect();
        shared = txns
            .add_partitions(id, pid, epoch, &parts, who, fenced_known)
            .await
            .err();
    }
    let mut verified = std::collections::HashMap::new();
    if verify_only && !unknown && shared.is_none() {
        for t in topics {
            for p in &t.partitions {
                let code = match txns.verify(id, pid, epoch, t.name.0.as_str(), *p).await {
                    Ok(Ok(())) => ErrorCode::None,
                    Ok(Err(VerifyError::StaleEpoch)) => ErrorCode::InvalidProducerEpoch,
                    Ok(Err(VerifyError::NotInTransaction)) => ErrorCode::InvalidTxnState,
                    Err(code) => code,
                };
                verified.insert((t.name.0.to_string(), *p), code);
            }
        }
    }
    topics
        .iter()
        .map(|t| {
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let code = if let Some(ErrorCode::TransactionalIdAuthorizationFailed) = shared {
                        ErrorCode::TransactionalIdAuthorizationFailed
                    } else if unknown {
                        if exists(t.name.0.as_str(), *p) {
                            ErrorCode::OperationNotAttempted
                        } else {
                            ErrorCode::UnknownTopicOrPartition
                        }
                    } else if verify_only {
                        verified
                            .get(&(t.name.0.to_string(), *p))
                            .copied()
                            .unwrap_or(ErrorCode::InvalidTxnState)
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
        .collect()
}

/// EndTxn, in both modes.
pub async fn end_txn(
    b: Arc<Broker>,
    req: EndTxnRequest,
    version: i16,
    who: Requester,
) -> EndTxnResponse {
    let id = req.transactional_id.0.to_string();
    let tv2 = version >= 5;
    let mut resp = EndTxnResponse::default();
    if req.committed && crate::faults::injected_end_txn_unavailable(&id) {
        tracing::warn!(transactional_id = %id, "injected fault (ONCELOG_FAULTS): EndTxn(commit) answered COORDINATOR_LOAD_IN_PROGRESS");
        resp.error_code = ErrorCode::CoordinatorLoadInProgress.code();
        resp.producer_id = ProducerId(-1);
        resp.producer_epoch = -1;
        return resp;
    }
    let res = b
        .txns()
        .end_txn(
            EndRequest {
                id: &id,
                producer_id: req.producer_id.0,
                epoch: req.producer_epoch,
                commit: req.committed,
                tv2,
            },
            &who,
            version >= 2,
        )
        .await;
    match res {
        Ok((pid, epoch)) => {
            if tv2 {
                resp.producer_id = ProducerId(pid);
                resp.producer_epoch = epoch;
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
