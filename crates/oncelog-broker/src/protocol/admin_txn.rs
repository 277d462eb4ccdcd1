//! KIP-664 transaction admin APIs: DescribeProducers (per partition, from the
//! partition's producer state), DescribeTransactions and ListTransactions
//! (from the coordinator), and WriteTxnMarkers for an operator's abort.

use std::sync::Arc;

use kafka_protocol::messages::describe_producers_request::DescribeProducersRequest;
use kafka_protocol::messages::describe_producers_response::{
    DescribeProducersResponse, PartitionResponse, ProducerState as WireProducer, TopicResponse,
};
use kafka_protocol::messages::describe_transactions_request::DescribeTransactionsRequest;
use kafka_protocol::messages::describe_transactions_response::{
    DescribeTransactionsResponse, TopicData, TransactionState as DescribedTxn,
};
use kafka_protocol::messages::list_transactions_request::ListTransactionsRequest;
use kafka_protocol::messages::list_transactions_response::{
    ListTransactionsResponse, TransactionState as ListedTxn,
};
use kafka_protocol::messages::write_txn_markers_request::WriteTxnMarkersRequest;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    WriteTxnMarkersResponse,
};
use kafka_protocol::messages::{ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;

use crate::backend::PartitionError;
use crate::error::ErrorCode;
use crate::machines::producer_state::ProducerEntry;
use crate::machines::txn_coordinator::{TxnMeta, TxnState};
use crate::observe::txn_history::Requester;
use crate::Broker;

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// DescribeProducers, in both modes.
pub async fn describe_producers(
    b: &Arc<Broker>,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let logs = b.logs();
    let mut found = std::collections::HashMap::new();
    for t in &req.topics {
        for i in &t.partition_indexes {
            let got = logs
                .producers(t.name.0.as_str(), *i)
                .await
                .map_err(|e| match e {
                    PartitionError::Unknown => ErrorCode::UnknownTopicOrPartition,
                    // retriable: the client asks again
                    PartitionError::Storage => ErrorCode::NotLeaderOrFollower,
                });
            found.insert((t.name.0.to_string(), *i), got);
        }
    }
    producers_response(req, |topic, i| {
        found
            .remove(&(topic.to_string(), i))
            .unwrap_or(Err(ErrorCode::UnknownTopicOrPartition))
    })
}

/// DescribeProducers' answer from `producers(topic, partition)`, whose
/// error is the partition's error code. Both modes shape their answer here.
pub fn producers_response(
    req: DescribeProducersRequest,
    mut producers: impl FnMut(&str, i32) -> Result<Vec<(i64, ProducerEntry)>, ErrorCode>,
) -> DescribeProducersResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partition_indexes
                .iter()
                .map(|i| {
                    let mut pr = PartitionResponse::default().with_partition_index(*i);
                    let found = match producers(t.name.0.as_str(), *i) {
                        Ok(found) => found,
                        Err(code) => {
                            pr.error_code = code.code();
                            return pr;
                        }
                    };
                    let mut listed: Vec<WireProducer> = found
                        .into_iter()
                        .map(|(pid, e)| {
                            WireProducer::default()
                                .with_producer_id(ProducerId(pid))
                                .with_producer_epoch(e.epoch as i32)
                                .with_last_sequence(e.last_seq().unwrap_or(-1))
                                .with_last_timestamp(e.last_timestamp)
                                .with_coordinator_epoch(e.coordinator_epoch)
                                .with_current_txn_start_offset(
                                    e.current_txn_first_offset.unwrap_or(-1),
                                )
                        })
                        .collect();
                    listed.sort_by_key(|x| x.producer_id.0);
                    pr.active_producers = listed;
                    pr
                })
                .collect();
            TopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}

/// DescribeTransactions, in both modes.
pub async fn describe_transactions(
    b: Arc<Broker>,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let ids: Vec<String> = req
        .transactional_ids
        .iter()
        .map(|i| i.0.to_string())
        .collect();
    let out = match b.txns().describe(&ids).await {
        Ok(metas) => req
            .transactional_ids
            .into_iter()
            .zip(metas)
            .map(|(id, meta)| described(id, meta.as_ref()))
            .collect(),
        Err(code) => req
            .transactional_ids
            .into_iter()
            .map(|id| described(id, None).with_error_code(code.code()))
            .collect(),
    };
    DescribeTransactionsResponse::default().with_transaction_states(out)
}

/// One id's DescribeTransactions entry; `None` is an id the coordinator
/// does not know.
pub fn described(id: TransactionalId, meta: Option<&TxnMeta>) -> DescribedTxn {
    let mut d = DescribedTxn::default().with_transactional_id(id);
    let Some(m) = meta else {
        d.error_code = ErrorCode::TransactionalIdNotFound.code();
        return d;
    };
    let mut topics: Vec<TopicData> = Vec::new();
    for (t, p) in &m.partitions {
        match topics.iter_mut().find(|x| x.topic.0.as_str() == t) {
            Some(x) => x.partitions.push(*p),
            None => topics.push(
                TopicData::default()
                    .with_topic(TopicName(s(t.clone())))
                    .with_partitions(vec![*p]),
            ),
        }
    }
    d.with_transaction_state(s(m.state.name()))
        .with_transaction_timeout_ms(m.timeout_ms)
        .with_transaction_start_time_ms(if m.state == TxnState::Ongoing {
            m.start_ms
        } else {
            -1
        })
        .with_producer_id(ProducerId(m.producer_id))
        .with_producer_epoch(m.epoch)
        .with_topics(topics)
}

const STATES: &[&str] = &[
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
];

/// ListTransactions, in both modes.
pub async fn list_transactions(
    b: Arc<Broker>,
    req: ListTransactionsRequest,
    version: i16,
) -> ListTransactionsResponse {
    match b.txns().list().await {
        Ok((known, now)) => list_response(req, version, known, now),
        Err(code) => ListTransactionsResponse::default().with_error_code(code.code()),
    }
}

/// ListTransactions' answer over the coordinator's `known` transactions at
/// `now` (ms): the request's state, producer, duration and (v2) id pattern
/// filters, sorted by id.
pub fn list_response(
    req: ListTransactionsRequest,
    version: i16,
    known: Vec<TxnMeta>,
    now: i64,
) -> ListTransactionsResponse {
    let mut resp = ListTransactionsResponse::default();
    resp.unknown_state_filters = req
        .state_filters
        .iter()
        .filter(|f| !STATES.contains(&f.as_str()))
        .cloned()
        .collect();
    let pattern = match req
        .transactional_id_pattern
        .as_ref()
        .filter(|_| version >= 2)
    {
        Some(p) if !p.is_empty() => match regex::Regex::new(&format!("^(?:{})$", p.as_str())) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(pattern = %p.as_str(), error = %e, "ListTransactions: invalid pattern");
                resp.error_code = ErrorCode::InvalidRegularExpression.code();
                return resp;
            }
        },
        _ => None,
    };
    let min_duration = if version >= 1 {
        req.duration_filter
    } else {
        -1
    };
    let mut listed: Vec<ListedTxn> = known
        .into_iter()
        .filter(|m| {
            req.state_filters.is_empty()
                || req
                    .state_filters
                    .iter()
                    .any(|f| f.as_str() == m.state.name())
        })
        .filter(|m| {
            req.producer_id_filters.is_empty()
                || req.producer_id_filters.iter().any(|p| p.0 == m.producer_id)
        })
        .filter(|m| {
            min_duration < 0
                || (m.state == TxnState::Ongoing
                    && m.start_ms >= 0
                    && now - m.start_ms >= min_duration)
        })
        .filter(|m| {
            pattern
                .as_ref()
                .is_none_or(|r| r.is_match(&m.transactional_id))
        })
        .map(|m| {
            ListedTxn::default()
                .with_transactional_id(TransactionalId(s(m.transactional_id)))
                .with_producer_id(ProducerId(m.producer_id))
                .with_transaction_state(s(m.state.name()))
        })
        .collect();
    listed.sort_by(|a, b| {
        a.transactional_id
            .0
            .as_str()
            .cmp(b.transactional_id.0.as_str())
    });
    resp.transaction_states = listed;
    resp
}

/// WriteTxnMarkers from an admin tool (Kafka's `kafka-transactions abort`,
/// kafka-python's `abort_transaction`). Only ABORT is accepted. A transaction
/// the coordinator knows is aborted through it (fence, then markers on all of
/// its partitions); an orphan gets one ABORT marker at the named partition.
/// One the coordinator is completing is answered CONCURRENT_TRANSACTIONS
/// (retriable): an orphan marker then could tear it.
/// WriteTxnMarkers from an admin tool (KIP-664), in both modes: only
/// ABORT, run as the coordinator's abort of the producer's transaction, or
/// for a transaction no coordinator knows, a marker on each partition.
pub async fn write_txn_markers(
    b: Arc<Broker>,
    req: WriteTxnMarkersRequest,
    who: Requester,
) -> WriteTxnMarkersResponse {
    let txns = b.txns();
    let mut results = Vec::with_capacity(req.markers.len());
    for m in req.markers {
        let pid = m.producer_id.0;
        let mut shared: Option<ErrorCode> = None;
        if m.transaction_result {
            shared = Some(ErrorCode::InvalidRequest);
        } else {
            match txns.admin_abort(pid, &who).await {
                Ok(true) => shared = Some(ErrorCode::None),
                Ok(false) => {}
                Err(code) => shared = Some(code),
            }
        }
        let mut topics = Vec::with_capacity(m.topics.len());
        for t in &m.topics {
            let mut parts = Vec::with_capacity(t.partition_indexes.len());
            for p in &t.partition_indexes {
                let code = match shared {
                    Some(c) => c,
                    None => {
                        txns.abort_hanging(
                            t.name.0.as_str(),
                            *p,
                            pid,
                            m.producer_epoch,
                            m.coordinator_epoch,
                        )
                        .await
                    }
                };
                parts.push(
                    WritableTxnMarkerPartitionResult::default()
                        .with_partition_index(*p)
                        .with_error_code(code.code()),
                );
            }
            topics.push(
                WritableTxnMarkerTopicResult::default()
                    .with_name(t.name.clone())
                    .with_partitions(parts),
            );
        }
        results.push(
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(topics),
        );
    }
    WriteTxnMarkersResponse::default().with_markers(results)
}
