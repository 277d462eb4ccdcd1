//! KIP-664 transaction admin APIs: DescribeProducers (per partition, from the
//! partition's producer state), DescribeTransactions and ListTransactions
//! (from the coordinator).

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
use kafka_protocol::messages::{ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;

use crate::error::ErrorCode;
use crate::txn_coordinator::TxnState;
use crate::{now_ms, Broker};

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

pub fn describe_producers(
    b: &Arc<Broker>,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = b.topics.get(t.name.0.as_str());
            let partitions = t
                .partition_indexes
                .iter()
                .map(|i| {
                    let mut pr = PartitionResponse::default().with_partition_index(*i);
                    let Some(p) = topic.as_ref().and_then(|x| x.partition(*i)) else {
                        pr.error_code = ErrorCode::UnknownTopicOrPartition.code();
                        return pr;
                    };
                    let st = p.lock();
                    let mut producers: Vec<WireProducer> = st
                        .producers
                        .producers()
                        .map(|(pid, e)| {
                            WireProducer::default()
                                .with_producer_id(ProducerId(*pid))
                                .with_producer_epoch(e.epoch as i32)
                                .with_last_sequence(e.last_seq().unwrap_or(-1))
                                .with_last_timestamp(e.last_timestamp)
                                .with_coordinator_epoch(e.coordinator_epoch)
                                .with_current_txn_start_offset(
                                    e.current_txn_first_offset.unwrap_or(-1),
                                )
                        })
                        .collect();
                    producers.sort_by_key(|x| x.producer_id.0);
                    pr.active_producers = producers;
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

pub async fn describe_transactions(
    b: Arc<Broker>,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut out = Vec::new();
    for id in req.transactional_ids {
        let mut d = DescribedTxn::default().with_transactional_id(id.clone());
        match b.txn.describe(id.0.as_str()).await {
            None => d.error_code = ErrorCode::TransactionalIdNotFound.code(),
            Some(m) => {
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
                d = d
                    .with_transaction_state(s(m.state.name()))
                    .with_transaction_timeout_ms(m.timeout_ms)
                    .with_transaction_start_time_ms(if m.state == TxnState::Ongoing {
                        m.start_ms
                    } else {
                        -1
                    })
                    .with_producer_id(ProducerId(m.producer_id))
                    .with_producer_epoch(m.epoch)
                    .with_topics(topics);
            }
        }
        out.push(d);
    }
    DescribeTransactionsResponse::default().with_transaction_states(out)
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

pub async fn list_transactions(
    b: Arc<Broker>,
    req: ListTransactionsRequest,
    version: i16,
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
    let now = now_ms();
    let min_duration = if version >= 1 {
        req.duration_filter
    } else {
        -1
    };
    let mut listed: Vec<ListedTxn> = b
        .txn
        .list()
        .await
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
