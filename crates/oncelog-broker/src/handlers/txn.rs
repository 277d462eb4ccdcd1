//! InitProducerId, AddPartitionsToTxn and EndTxn.
//!
//! Idempotent producers (no transactional id) get a fresh producer id at
//! epoch 0 every time, as Kafka does. Transactional ones go through the
//! coordinator. Error codes are gated by request version (PROTOCOL-BRIEF §1):
//! PRODUCER_FENCED only where the version knows it, INVALID_PRODUCER_EPOCH
//! before that.

use std::sync::Arc;

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnRequest;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResponse, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::ProducerId;

use crate::error::ErrorCode;
use crate::txn_coordinator::CoordError;
use crate::txn_service::TxnError;
use crate::Broker;

/// The wire code for a coordinator error; PRODUCER_FENCED only where the
/// request version knows it.
pub(crate) fn txn_error_code(e: &TxnError, fenced_known: bool) -> ErrorCode {
    match e {
        TxnError::Coord(CoordError::ConcurrentTransactions) => ErrorCode::ConcurrentTransactions,
        TxnError::Coord(CoordError::ProducerFenced) if fenced_known => ErrorCode::ProducerFenced,
        TxnError::Coord(CoordError::ProducerFenced) => ErrorCode::InvalidProducerEpoch,
        TxnError::Coord(CoordError::InvalidProducerIdMapping) => {
            ErrorCode::InvalidProducerIdMapping
        }
        TxnError::Coord(CoordError::InvalidTxnState) => ErrorCode::InvalidTxnState,
        TxnError::Storage(_) => ErrorCode::CoordinatorNotAvailable,
    }
}

pub async fn init_producer_id(
    b: Arc<Broker>,
    req: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let resp = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let Some(id) = req.transactional_id.as_ref().map(|t| t.0.to_string()) else {
        return match b.producer_ids.next() {
            Ok(pid) => {
                tracing::debug!(producer_id = pid, "idempotent producer id allocated");
                resp.with_producer_id(ProducerId(pid))
                    .with_producer_epoch(0)
            }
            Err(e) => {
                tracing::error!(error = %e, "could not allocate a producer id");
                resp.with_error_code(ErrorCode::CoordinatorNotAvailable.code())
            }
        };
    };
    if req.transaction_timeout_ms <= 0
        || req.transaction_timeout_ms > b.config.transaction_max_timeout_ms
    {
        return resp.with_error_code(ErrorCode::InvalidTransactionTimeout.code());
    }
    let expected =
        (version >= 3 && req.producer_id.0 >= 0).then_some((req.producer_id.0, req.producer_epoch));
    match b
        .txn
        .init_producer_id(&b, &id, req.transaction_timeout_ms, expected)
        .await
    {
        Ok((pid, epoch)) => resp
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch),
        Err(e) => resp.with_error_code(txn_error_code(&e, version >= 4).code()),
    }
}

pub async fn add_partitions_to_txn(
    b: Arc<Broker>,
    req: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    let id = req.v3_and_below_transactional_id.0.to_string();
    let pid = req.v3_and_below_producer_id.0;
    let epoch = req.v3_and_below_producer_epoch;
    // Unknown partitions fail the whole request: they get
    // UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED.
    let mut wanted = Vec::new();
    let mut unknown = false;
    for t in &req.v3_and_below_topics {
        for p in &t.partitions {
            let exists = b
                .topics
                .get(t.name.0.as_str())
                .and_then(|x| x.partition(*p))
                .is_some();
            unknown |= !exists;
            wanted.push((t.name.0.to_string(), *p, exists));
        }
    }
    let code_for = |exists: bool, e: Option<ErrorCode>| -> i16 {
        if unknown {
            if exists {
                55 // OPERATION_NOT_ATTEMPTED
            } else {
                ErrorCode::UnknownTopicOrPartition.code()
            }
        } else {
            e.unwrap_or(ErrorCode::None).code()
        }
    };
    let err = if unknown {
        None
    } else {
        let parts: Vec<(String, i32)> = wanted.iter().map(|(t, p, _)| (t.clone(), *p)).collect();
        b.txn
            .add_partitions(&id, pid, epoch, &parts)
            .await
            .err()
            .map(|e| txn_error_code(&e, version >= 2))
    };
    let results = req
        .v3_and_below_topics
        .iter()
        .map(|t| {
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let exists = wanted
                        .iter()
                        .any(|(n, i, e)| n == t.name.0.as_str() && i == p && *e);
                    AddPartitionsToTxnPartitionResult::default()
                        .with_partition_index(*p)
                        .with_partition_error_code(code_for(exists, err))
                })
                .collect();
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(parts)
        })
        .collect();
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}

pub async fn end_txn(b: Arc<Broker>, req: EndTxnRequest, version: i16) -> EndTxnResponse {
    let id = req.transactional_id.0.to_string();
    let tv2 = version >= 5;
    let mut resp = EndTxnResponse::default();
    let res = b
        .txn
        .end_txn(
            &b,
            &id,
            req.producer_id.0,
            req.producer_epoch,
            req.committed,
            tv2,
        )
        .await;
    match res {
        Ok((pid, epoch)) => {
            if tv2 {
                resp.producer_id = ProducerId(pid);
                resp.producer_epoch = epoch;
            }
        }
        Err(e) => {
            resp.error_code = txn_error_code(&e, version >= 2).code();
            if tv2 {
                resp.producer_id = ProducerId(-1);
                resp.producer_epoch = -1;
            }
        }
    }
    resp
}
