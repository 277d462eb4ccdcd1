//! Client commands of the `oncelog` CLI. They talk the Kafka protocol
//! (through `oncelog-client`), so they work against any Kafka-compatible
//! cluster. Tables for people, `--json` for scripts.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use kafka_protocol::messages::create_topics_request::{
    CreatableTopic, CreatableTopicConfig, CreateTopicsRequest,
};
use kafka_protocol::messages::create_topics_response::CreateTopicsResponse;
use kafka_protocol::messages::delete_topics_request::{DeleteTopicState, DeleteTopicsRequest};
use kafka_protocol::messages::delete_topics_response::DeleteTopicsResponse;
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::describe_groups_response::DescribeGroupsResponse;
use kafka_protocol::messages::describe_producers_request::{
    DescribeProducersRequest, TopicRequest,
};
use kafka_protocol::messages::describe_producers_response::DescribeProducersResponse;
use kafka_protocol::messages::describe_transactions_request::DescribeTransactionsRequest;
use kafka_protocol::messages::describe_transactions_response::DescribeTransactionsResponse;
use kafka_protocol::messages::list_groups_request::ListGroupsRequest;
use kafka_protocol::messages::list_groups_response::ListGroupsResponse;
use kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
};
use kafka_protocol::messages::list_offsets_response::ListOffsetsResponse;
use kafka_protocol::messages::list_transactions_request::ListTransactionsRequest;
use kafka_protocol::messages::list_transactions_response::ListTransactionsResponse;
use kafka_protocol::messages::metadata_request::MetadataRequest;
use kafka_protocol::messages::metadata_response::MetadataResponse;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequest;
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponse;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest,
};
use kafka_protocol::messages::write_txn_markers_response::WriteTxnMarkersResponse;
use kafka_protocol::messages::{ApiKey, BrokerId, GroupId, ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use oncelog_client::Client;
use serde_json::{json, Value};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

#[derive(Subcommand)]
pub enum TopicCmd {
    /// List topics with their partition counts.
    List,
    /// Create a topic.
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: i32,
        /// Topic config, repeatable: --config retention.ms=60000
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
    },
    /// Show a topic's partitions with their offsets.
    Describe { name: String },
    /// Delete a topic.
    Delete { name: String },
}

#[derive(Subcommand)]
pub enum TxnCmd {
    /// List transactional ids and their state.
    List {
        /// Only these states (e.g. Ongoing), repeatable.
        #[arg(long = "state")]
        states: Vec<String>,
    },
    /// Describe one transactional id.
    Describe { transactional_id: String },
    /// The producers a partition knows (epoch, last sequence, open transaction).
    Producers { topic: String, partition: i32 },
    /// Open transactions older than --min-age-ms, with the partitions they pin.
    FindHanging {
        #[arg(long, default_value_t = 60_000)]
        min_age_ms: i64,
    },
    /// Abort the open transaction a partition shows for a producer (through
    /// the coordinator when it knows the transaction).
    Abort {
        topic: String,
        partition: i32,
        #[arg(long)]
        producer_id: i64,
        #[arg(long)]
        producer_epoch: i16,
        #[arg(long, default_value_t = 0)]
        coordinator_epoch: i32,
    },
}

#[derive(Subcommand)]
pub enum GroupCmd {
    /// List consumer groups.
    List,
    /// A group's state, members and per-partition lag (against the last stable offset).
    Describe { group: String },
}

/// Prints rows as an aligned table.
fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r.clone());
    }
}

fn emit(json_out: bool, v: &Value, headers: &[&str], rows: Vec<Vec<String>>) {
    if json_out {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        table(headers, &rows);
    }
}

fn check(code: i16, what: &str) -> Result<()> {
    if code != 0 {
        let e = kafka_protocol::error::ParseResponseErrorCode::err(code);
        bail!(
            "{what}: {}",
            e.map(|e| format!("{e:?}"))
                .unwrap_or_else(|| code.to_string())
        );
    }
    Ok(())
}

async fn metadata(c: &mut Client, topics: Option<Vec<String>>) -> Result<MetadataResponse> {
    let req = MetadataRequest::default()
        .with_allow_auto_topic_creation(false)
        .with_topics(topics.map(|ts| {
            ts.into_iter()
                .map(|t| {
                    kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                        .with_name(Some(TopicName(s(&t))))
                })
                .collect()
        }));
    Ok(c.call::<_, MetadataResponse>(ApiKey::Metadata, &req)
        .await?
        .0)
}

/// (log start, latest) offsets of a topic's partitions; `committed` asks for the LSO.
async fn offsets(
    c: &mut Client,
    topic: &str,
    parts: &[i32],
    ts: i64,
    committed: bool,
) -> Result<BTreeMap<i32, i64>> {
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(if committed { 1 } else { 0 })
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(
                parts
                    .iter()
                    .map(|p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(*p)
                            .with_timestamp(ts)
                    })
                    .collect(),
            )]);
    let (r, _) = c
        .call::<_, ListOffsetsResponse>(ApiKey::ListOffsets, &req)
        .await?;
    Ok(r.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (p.partition_index, p.offset)))
        .collect())
}

pub async fn cluster_info(bootstrap: &str, json_out: bool) -> Result<()> {
    let mut c = Client::connect(bootstrap).await?;
    let md = metadata(&mut c, None).await?;
    let brokers: Vec<Value> = md
        .brokers
        .iter()
        .map(|b| json!({"node_id": b.node_id.0, "host": b.host.as_str(), "port": b.port}))
        .collect();
    let mut apis: Vec<(i16, (i16, i16))> = c.api_versions().iter().map(|(k, v)| (*k, *v)).collect();
    apis.sort();
    let v = json!({
        "cluster_id": md.cluster_id.as_ref().map(|x| x.as_str()),
        "controller_id": md.controller_id.0,
        "brokers": brokers,
        "topics": md.topics.len(),
        "apis": apis.iter().map(|(k, (lo, hi))| json!({
            "api": ApiKey::try_from(*k).map(|a| format!("{a:?}")).unwrap_or_else(|_| k.to_string()),
            "min": lo, "max": hi})).collect::<Vec<_>>(),
    });
    if json_out {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "cluster id: {}",
            md.cluster_id.as_ref().map(|x| x.as_str()).unwrap_or("-")
        );
        println!("controller: {}", md.controller_id.0);
        println!("topics:     {}", md.topics.len());
        let rows = md
            .brokers
            .iter()
            .map(|b| {
                vec![
                    b.node_id.0.to_string(),
                    format!("{}:{}", b.host.as_str(), b.port),
                ]
            })
            .collect::<Vec<_>>();
        table(&["NODE", "ADDRESS"], &rows);
    }
    Ok(())
}

pub async fn topic(bootstrap: &str, json_out: bool, cmd: TopicCmd) -> Result<()> {
    let mut c = Client::connect(bootstrap).await?;
    match cmd {
        TopicCmd::List => {
            let md = metadata(&mut c, None).await?;
            let mut topics: Vec<(String, usize)> = md
                .topics
                .iter()
                .filter_map(|t| {
                    t.name
                        .as_ref()
                        .map(|n| (n.0.to_string(), t.partitions.len()))
                })
                .collect();
            topics.sort();
            let v = json!(topics
                .iter()
                .map(|(n, p)| json!({"topic": n, "partitions": p}))
                .collect::<Vec<_>>());
            emit(
                json_out,
                &v,
                &["TOPIC", "PARTITIONS"],
                topics
                    .iter()
                    .map(|(n, p)| vec![n.clone(), p.to_string()])
                    .collect(),
            );
        }
        TopicCmd::Create {
            name,
            partitions,
            configs,
        } => {
            let mut cfgs = Vec::new();
            for kv in configs {
                let (k, val) = kv
                    .split_once('=')
                    .ok_or_else(|| anyhow!("--config expects KEY=VALUE, got {kv}"))?;
                cfgs.push(
                    CreatableTopicConfig::default()
                        .with_name(s(k))
                        .with_value(Some(s(val))),
                );
            }
            let req = CreateTopicsRequest::default()
                .with_timeout_ms(30000)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(TopicName(s(&name)))
                    .with_num_partitions(partitions)
                    .with_replication_factor(-1)
                    .with_configs(cfgs)]);
            let (r, _) = c
                .call::<_, CreateTopicsResponse>(ApiKey::CreateTopics, &req)
                .await?;
            for t in &r.topics {
                check(t.error_code, &format!("create {name}"))?;
            }
            emit(
                json_out,
                &json!({"created": name, "partitions": partitions}),
                &["CREATED", "PARTITIONS"],
                vec![vec![name.clone(), partitions.to_string()]],
            );
        }
        TopicCmd::Delete { name } => {
            let req = DeleteTopicsRequest::default()
                .with_timeout_ms(30000)
                .with_topic_names(vec![TopicName(s(&name))])
                .with_topics(vec![
                    DeleteTopicState::default().with_name(Some(TopicName(s(&name))))
                ]);
            let (r, _) = c
                .call::<_, DeleteTopicsResponse>(ApiKey::DeleteTopics, &req)
                .await?;
            for t in &r.responses {
                check(t.error_code, &format!("delete {name}"))?;
            }
            emit(
                json_out,
                &json!({"deleted": name}),
                &["DELETED"],
                vec![vec![name.clone()]],
            );
        }
        TopicCmd::Describe { name } => {
            let md = metadata(&mut c, Some(vec![name.clone()])).await?;
            let t = md
                .topics
                .first()
                .ok_or_else(|| anyhow!("no metadata for {name}"))?;
            check(t.error_code, &format!("describe {name}"))?;
            let parts: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
            let start = offsets(&mut c, &name, &parts, -2, false).await?;
            let hw = offsets(&mut c, &name, &parts, -1, false).await?;
            let lso = offsets(&mut c, &name, &parts, -1, true).await?;
            let rows: Vec<Value> = parts
                .iter()
                .map(|p| json!({"partition": p, "log_start_offset": start.get(p), "high_watermark": hw.get(p),
                    "last_stable_offset": lso.get(p)}))
                .collect();
            emit(
                json_out,
                &json!({"topic": name, "partitions": rows}),
                &["PARTITION", "LOG-START", "HIGH-WATERMARK", "LSO"],
                parts
                    .iter()
                    .map(|p| {
                        vec![
                            p.to_string(),
                            start.get(p).unwrap_or(&-1).to_string(),
                            hw.get(p).unwrap_or(&-1).to_string(),
                            lso.get(p).unwrap_or(&-1).to_string(),
                        ]
                    })
                    .collect(),
            );
        }
    }
    Ok(())
}

pub async fn txn(bootstrap: &str, json_out: bool, cmd: TxnCmd) -> Result<()> {
    let mut c = Client::connect(bootstrap).await?;
    match cmd {
        TxnCmd::List { states } => {
            let req = ListTransactionsRequest::default()
                .with_state_filters(states.iter().map(|x| s(x)).collect())
                .with_duration_filter(-1);
            let (r, _) = c
                .call::<_, ListTransactionsResponse>(ApiKey::ListTransactions, &req)
                .await?;
            check(r.error_code, "list transactions")?;
            let rows: Vec<Vec<String>> = r
                .transaction_states
                .iter()
                .map(|t| {
                    vec![
                        t.transactional_id.0.to_string(),
                        t.producer_id.0.to_string(),
                        t.transaction_state.to_string(),
                    ]
                })
                .collect();
            let v = json!(rows.iter().map(|r| json!({"transactional_id": r[0], "producer_id": r[1].parse::<i64>().unwrap_or(-1), "state": r[2]})).collect::<Vec<_>>());
            emit(
                json_out,
                &v,
                &["TRANSACTIONAL-ID", "PRODUCER-ID", "STATE"],
                rows,
            );
        }
        TxnCmd::Describe { transactional_id } => {
            let req = DescribeTransactionsRequest::default()
                .with_transactional_ids(vec![TransactionalId(s(&transactional_id))]);
            let (r, _) = c
                .call::<_, DescribeTransactionsResponse>(ApiKey::DescribeTransactions, &req)
                .await?;
            let t = r
                .transaction_states
                .first()
                .ok_or_else(|| anyhow!("empty answer"))?;
            check(t.error_code, &format!("describe {transactional_id}"))?;
            let parts: Vec<String> = t
                .topics
                .iter()
                .flat_map(|x| {
                    x.partitions
                        .iter()
                        .map(move |p| format!("{}-{p}", x.topic.0.as_str()))
                })
                .collect();
            let v = json!({"transactional_id": transactional_id, "state": t.transaction_state.as_str(),
                "producer_id": t.producer_id.0, "producer_epoch": t.producer_epoch,
                "timeout_ms": t.transaction_timeout_ms, "start_time_ms": t.transaction_start_time_ms,
                "partitions": parts});
            emit(
                json_out,
                &v,
                &[
                    "TRANSACTIONAL-ID",
                    "STATE",
                    "PRODUCER-ID",
                    "EPOCH",
                    "TIMEOUT-MS",
                    "PARTITIONS",
                ],
                vec![vec![
                    transactional_id.clone(),
                    t.transaction_state.to_string(),
                    t.producer_id.0.to_string(),
                    t.producer_epoch.to_string(),
                    t.transaction_timeout_ms.to_string(),
                    parts.join(","),
                ]],
            );
        }
        TxnCmd::Producers { topic, partition } => {
            let rows = producers(&mut c, &topic, partition).await?;
            let v = json!(rows.iter().map(|r| json!({"producer_id": r[0].parse::<i64>().unwrap_or(-1),
                "epoch": r[1].parse::<i64>().unwrap_or(-1), "last_sequence": r[2].parse::<i64>().unwrap_or(-1),
                "last_timestamp": r[3].parse::<i64>().unwrap_or(-1), "coordinator_epoch": r[4].parse::<i64>().unwrap_or(-1),
                "current_txn_start_offset": r[5].parse::<i64>().unwrap_or(-1)})).collect::<Vec<_>>());
            emit(
                json_out,
                &v,
                &[
                    "PRODUCER-ID",
                    "EPOCH",
                    "LAST-SEQUENCE",
                    "LAST-TIMESTAMP",
                    "COORDINATOR-EPOCH",
                    "TXN-START-OFFSET",
                ],
                rows,
            );
        }
        TxnCmd::FindHanging { min_age_ms } => {
            let req = ListTransactionsRequest::default()
                .with_state_filters(vec![s("Ongoing")])
                .with_duration_filter(min_age_ms);
            let (r, _) = c
                .call::<_, ListTransactionsResponse>(ApiKey::ListTransactions, &req)
                .await?;
            check(r.error_code, "list transactions")?;
            let ids: Vec<TransactionalId> = r
                .transaction_states
                .iter()
                .map(|t| t.transactional_id.clone())
                .collect();
            let mut rows = Vec::new();
            if !ids.is_empty() {
                let (d, _) = c
                    .call::<_, DescribeTransactionsResponse>(
                        ApiKey::DescribeTransactions,
                        &DescribeTransactionsRequest::default().with_transactional_ids(ids),
                    )
                    .await?;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|x| x.as_millis() as i64)
                    .unwrap_or(0);
                for t in d.transaction_states.iter().filter(|t| t.error_code == 0) {
                    let parts: Vec<String> = t
                        .topics
                        .iter()
                        .flat_map(|x| {
                            x.partitions
                                .iter()
                                .map(move |p| format!("{}-{p}", x.topic.0.as_str()))
                        })
                        .collect();
                    let age = if t.transaction_start_time_ms > 0 {
                        now - t.transaction_start_time_ms
                    } else {
                        -1
                    };
                    rows.push(vec![
                        t.transactional_id.0.to_string(),
                        t.producer_id.0.to_string(),
                        t.producer_epoch.to_string(),
                        age.to_string(),
                        parts.join(","),
                    ]);
                }
            }
            let v = json!(rows.iter().map(|r| json!({"transactional_id": r[0], "producer_id": r[1].parse::<i64>().unwrap_or(-1),
                "producer_epoch": r[2].parse::<i64>().unwrap_or(-1), "age_ms": r[3].parse::<i64>().unwrap_or(-1),
                "partitions": r[4].split(',').filter(|x| !x.is_empty()).collect::<Vec<_>>()})).collect::<Vec<_>>());
            emit(
                json_out,
                &v,
                &[
                    "TRANSACTIONAL-ID",
                    "PRODUCER-ID",
                    "EPOCH",
                    "AGE-MS",
                    "PINNED-PARTITIONS",
                ],
                rows,
            );
        }
        TxnCmd::Abort {
            topic,
            partition,
            producer_id,
            producer_epoch,
            coordinator_epoch,
        } => {
            let req =
                WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
                    .with_producer_id(ProducerId(producer_id))
                    .with_producer_epoch(producer_epoch)
                    .with_transaction_result(false)
                    .with_coordinator_epoch(coordinator_epoch)
                    .with_topics(vec![WritableTxnMarkerTopic::default()
                        .with_name(TopicName(s(&topic)))
                        .with_partition_indexes(vec![partition])])]);
            let (r, _) = c
                .call::<_, WriteTxnMarkersResponse>(ApiKey::WriteTxnMarkers, &req)
                .await?;
            for m in &r.markers {
                for t in &m.topics {
                    for p in &t.partitions {
                        check(p.error_code, &format!("abort at {topic}-{partition}"))?;
                    }
                }
            }
            emit(
                json_out,
                &json!({"aborted": {"topic": topic, "partition": partition, "producer_id": producer_id}}),
                &["ABORTED", "PRODUCER-ID"],
                vec![vec![
                    format!("{topic}-{partition}"),
                    producer_id.to_string(),
                ]],
            );
        }
    }
    Ok(())
}

async fn producers(c: &mut Client, topic: &str, partition: i32) -> Result<Vec<Vec<String>>> {
    let req = DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
        .with_name(TopicName(s(topic)))
        .with_partition_indexes(vec![partition])]);
    let (r, _) = c
        .call::<_, DescribeProducersResponse>(ApiKey::DescribeProducers, &req)
        .await?;
    let mut rows = Vec::new();
    for t in &r.topics {
        for p in &t.partitions {
            check(p.error_code, &format!("producers of {topic}-{partition}"))?;
            for a in &p.active_producers {
                rows.push(vec![
                    a.producer_id.0.to_string(),
                    a.producer_epoch.to_string(),
                    a.last_sequence.to_string(),
                    a.last_timestamp.to_string(),
                    a.coordinator_epoch.to_string(),
                    a.current_txn_start_offset.to_string(),
                ]);
            }
        }
    }
    Ok(rows)
}

pub async fn group(bootstrap: &str, json_out: bool, cmd: GroupCmd) -> Result<()> {
    let mut c = Client::connect(bootstrap).await?;
    match cmd {
        GroupCmd::List => {
            let (r, _) = c
                .call::<_, ListGroupsResponse>(ApiKey::ListGroups, &ListGroupsRequest::default())
                .await?;
            check(r.error_code, "list groups")?;
            let mut rows: Vec<Vec<String>> = r
                .groups
                .iter()
                .map(|g| {
                    vec![
                        g.group_id.0.to_string(),
                        g.group_state.to_string(),
                        g.protocol_type.to_string(),
                    ]
                })
                .collect();
            rows.sort();
            let v = json!(rows
                .iter()
                .map(|r| json!({"group": r[0], "state": r[1], "protocol_type": r[2]}))
                .collect::<Vec<_>>());
            emit(json_out, &v, &["GROUP", "STATE", "PROTOCOL-TYPE"], rows);
        }
        GroupCmd::Describe { group } => {
            let (d, _) = c
                .call::<_, DescribeGroupsResponse>(
                    ApiKey::DescribeGroups,
                    &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(&group))]),
                )
                .await?;
            let g = d.groups.first().ok_or_else(|| anyhow!("empty answer"))?;
            check(g.error_code, &format!("describe {group}"))?;
            let (o, _) = c
                .call::<_, OffsetFetchResponse>(
                    ApiKey::OffsetFetch,
                    &OffsetFetchRequest::default()
                        .with_group_id(GroupId(s(&group)))
                        .with_topics(None),
                )
                .await?;
            let mut lag_rows = Vec::new();
            for t in &o.topics {
                let parts: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
                let lso = offsets(&mut c, t.name.0.as_str(), &parts, -1, true).await?;
                for p in &t.partitions {
                    let end = lso.get(&p.partition_index).copied().unwrap_or(-1);
                    let lag = if p.committed_offset >= 0 && end >= 0 {
                        (end - p.committed_offset).max(0)
                    } else {
                        -1
                    };
                    lag_rows.push(vec![
                        t.name.0.to_string(),
                        p.partition_index.to_string(),
                        p.committed_offset.to_string(),
                        end.to_string(),
                        lag.to_string(),
                    ]);
                }
            }
            lag_rows.sort();
            let v = json!({"group": group, "state": g.group_state.as_str(), "protocol": g.protocol_data.as_str(),
                "members": g.members.iter().map(|m| json!({"member_id": m.member_id.as_str(), "client_id": m.client_id.as_str(),
                    "host": m.client_host.as_str()})).collect::<Vec<_>>(),
                "offsets": lag_rows.iter().map(|r| json!({"topic": r[0], "partition": r[1].parse::<i64>().unwrap_or(-1),
                    "committed": r[2].parse::<i64>().unwrap_or(-1), "last_stable_offset": r[3].parse::<i64>().unwrap_or(-1),
                    "lag": r[4].parse::<i64>().unwrap_or(-1)})).collect::<Vec<_>>()});
            if json_out {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "group {group}: {} ({} members, protocol {})",
                    g.group_state.as_str(),
                    g.members.len(),
                    g.protocol_data.as_str()
                );
                table(
                    &["TOPIC", "PARTITION", "COMMITTED", "LSO", "LAG"],
                    &lag_rows,
                );
            }
        }
    }
    Ok(())
}
