//! Admin lookups the CLI's commands share: metadata, a topic's configs,
//! the producers a partition knows, and which transaction holds a partition
//! back.

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_configs_request::{
    DescribeConfigsRequest, DescribeConfigsResource,
};
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResponse;
use kafka_protocol::messages::describe_producers_request::{
    DescribeProducersRequest, TopicRequest,
};
use kafka_protocol::messages::describe_producers_response::{
    DescribeProducersResponse, ProducerState,
};
use kafka_protocol::messages::describe_transactions_request::DescribeTransactionsRequest;
use kafka_protocol::messages::describe_transactions_response::DescribeTransactionsResponse;
use kafka_protocol::messages::list_transactions_request::ListTransactionsRequest;
use kafka_protocol::messages::list_transactions_response::ListTransactionsResponse;
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::metadata_response::MetadataResponse;
use kafka_protocol::messages::{ApiKey, ProducerId, TopicName};

use crate::cluster::{s, Cluster};
use crate::conn::Client;
use crate::error::{check, ClientError};

/// The resource type of a topic in DescribeConfigs and AlterConfigs.
pub const RESOURCE_TOPIC: i8 = 2;
/// The config source of a value set on the topic (DYNAMIC_TOPIC_CONFIG).
pub const SOURCE_TOPIC: i8 = 1;

/// Metadata of `topics` (all of them for `None`); never creates a topic.
pub async fn metadata(
    c: &mut Client,
    topics: Option<Vec<String>>,
) -> Result<MetadataResponse, ClientError> {
    let req = MetadataRequest::default()
        .with_allow_auto_topic_creation(false)
        .with_topics(topics.map(|ts| {
            ts.into_iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(s(&t)))))
                .collect()
        }));
    Ok(c.call::<_, MetadataResponse>(ApiKey::Metadata, &req)
        .await?
        .0)
}

/// A topic's configs that are not defaults (set on the topic).
pub async fn topic_configs(
    c: &mut Client,
    topic: &str,
) -> Result<BTreeMap<String, String>, ClientError> {
    let req =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(RESOURCE_TOPIC)
            .with_resource_name(s(topic))
            .with_configuration_keys(None)]);
    let (r, _) = c
        .call::<_, DescribeConfigsResponse>(ApiKey::DescribeConfigs, &req)
        .await?;
    let mut out = BTreeMap::new();
    for res in &r.results {
        check(res.error_code, &format!("configs of {topic}"))?;
        for cfg in &res.configs {
            if cfg.config_source == SOURCE_TOPIC {
                out.insert(
                    cfg.name.to_string(),
                    cfg.value
                        .as_ref()
                        .map(|v| v.to_string())
                        .unwrap_or_default(),
                );
            }
        }
    }
    Ok(out)
}

/// The producers partition `partition` of `topic` knows (DescribeProducers).
pub async fn describe_producers(
    c: &mut Client,
    topic: &str,
    partition: i32,
) -> Result<Vec<ProducerState>, ClientError> {
    let req = DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
        .with_name(TopicName(s(topic)))
        .with_partition_indexes(vec![partition])]);
    let (r, _) = c
        .call::<_, DescribeProducersResponse>(ApiKey::DescribeProducers, &req)
        .await?;
    let mut out = Vec::new();
    for t in &r.topics {
        for p in &t.partitions {
            check(p.error_code, &format!("producers of {topic}-{partition}"))?;
            out.extend(p.active_producers.iter().cloned());
        }
    }
    Ok(out)
}

/// The transactional id whose transaction the coordinator holds open (or is
/// completing) for producer id `pid`, if any.
pub async fn open_transaction_of(c: &mut Client, pid: i64) -> Result<Option<String>, ClientError> {
    let req = ListTransactionsRequest::default()
        .with_producer_id_filters(vec![ProducerId(pid)])
        .with_duration_filter(-1);
    let (r, _) = c
        .call::<_, ListTransactionsResponse>(ApiKey::ListTransactions, &req)
        .await?;
    check(r.error_code, "list transactions")?;
    Ok(open_transaction_in(&r, pid))
}

/// The transactional id whose transaction a ListTransactions answer shows
/// open (or completing) for producer id `pid`, if any. (In a cluster each
/// broker lists the ids it coordinates: look through every broker's.)
pub fn open_transaction_in(r: &ListTransactionsResponse, pid: i64) -> Option<String> {
    r.transaction_states
        .iter()
        .find(|t| {
            t.producer_id.0 == pid
                && matches!(
                    t.transaction_state.as_str(),
                    "Ongoing" | "PrepareCommit" | "PrepareAbort"
                )
        })
        .map(|t| t.transactional_id.0.to_string())
}

/// What holds a partition back at its last stable offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnHolder {
    /// No producer has a transaction open there any more.
    Ended,
    /// The open transaction of `producer_id`, which starts at `first_offset`.
    Open {
        producer_id: i64,
        epoch: i16,
        first_offset: i64,
        /// Its transactional id, when a coordinator names one.
        transactional_id: Option<String>,
        /// When it began (ms since the epoch), when its coordinator says.
        start_time_ms: Option<i64>,
    },
}

/// Which open transaction holds `topic`-`p` back at the last stable offset
/// `lso`: the partition's producers (DescribeProducers at its `leader`),
/// and the coordinators' transactions (ListTransactions,
/// DescribeTransactions) for its transactional id.
pub async fn holding_transaction(
    c: &mut Cluster,
    leader: i32,
    topic: &str,
    p: i32,
    lso: i64,
) -> Result<TxnHolder, ClientError> {
    let producers = describe_producers(c.node(leader).await?, topic, p).await?;
    let mut open: Vec<(i64, i16, i64)> = producers
        .iter()
        .filter(|a| a.current_txn_start_offset >= 0)
        .map(|a| {
            (
                a.producer_id.0,
                a.producer_epoch as i16,
                a.current_txn_start_offset,
            )
        })
        .collect();
    open.sort_by_key(|x| (x.2 != lso, x.2));
    let Some(&(producer_id, epoch, first_offset)) = open.first() else {
        return Ok(TxnHolder::Ended);
    };
    let mut nodes = c.node_ids();
    if nodes.is_empty() {
        nodes.push(-1); // the bootstrap connection
    }
    for node in nodes {
        let req = ListTransactionsRequest::default().with_duration_filter(-1);
        let Ok(conn) = c.node(node).await else {
            continue;
        };
        let Ok((list, _)) = conn
            .call::<_, ListTransactionsResponse>(ApiKey::ListTransactions, &req)
            .await
        else {
            continue;
        };
        let Some(t) = list
            .transaction_states
            .iter()
            .find(|t| t.producer_id.0 == producer_id)
        else {
            continue;
        };
        let tid = t.transactional_id.clone();
        let req = DescribeTransactionsRequest::default().with_transactional_ids(vec![tid.clone()]);
        let mut start_time_ms = None;
        if let Ok((d, _)) = conn
            .call::<_, DescribeTransactionsResponse>(ApiKey::DescribeTransactions, &req)
            .await
        {
            start_time_ms = d
                .transaction_states
                .iter()
                .find(|x| x.error_code == 0 && x.transaction_start_time_ms > 0)
                .map(|x| x.transaction_start_time_ms);
        }
        return Ok(TxnHolder::Open {
            producer_id,
            epoch,
            first_offset,
            transactional_id: Some(tid.0.to_string()),
            start_time_ms,
        });
    }
    Ok(TxnHolder::Open {
        producer_id,
        epoch,
        first_offset,
        transactional_id: None,
        start_time_ms: None,
    })
}
