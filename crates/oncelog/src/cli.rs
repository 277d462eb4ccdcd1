//! Client commands of the `oncelog` CLI. They talk the Kafka protocol
//! (through `oncelog-client`), so they work against any Kafka-compatible
//! cluster. Tables for people, `--json` for scripts.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use kafka_protocol::messages::create_partitions_request::{
    CreatePartitionsRequest, CreatePartitionsTopic,
};
use kafka_protocol::messages::create_partitions_response::CreatePartitionsResponse;
use kafka_protocol::messages::create_topics_request::{
    CreatableTopic, CreatableTopicConfig, CreateTopicsRequest,
};
use kafka_protocol::messages::create_topics_response::CreateTopicsResponse;
use kafka_protocol::messages::delete_groups_request::DeleteGroupsRequest;
use kafka_protocol::messages::delete_groups_response::DeleteGroupsResponse;
use kafka_protocol::messages::delete_topics_request::{DeleteTopicState, DeleteTopicsRequest};
use kafka_protocol::messages::delete_topics_response::DeleteTopicsResponse;
use kafka_protocol::messages::describe_configs_request::{
    DescribeConfigsRequest, DescribeConfigsResource,
};
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResponse;
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::describe_groups_response::DescribeGroupsResponse;
use kafka_protocol::messages::describe_producers_request::{
    DescribeProducersRequest, TopicRequest,
};
use kafka_protocol::messages::describe_producers_response::DescribeProducersResponse;
use kafka_protocol::messages::describe_transactions_request::DescribeTransactionsRequest;
use kafka_protocol::messages::describe_transactions_response::DescribeTransactionsResponse;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig, IncrementalAlterConfigsRequest,
};
use kafka_protocol::messages::incremental_alter_configs_response::IncrementalAlterConfigsResponse;
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
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_commit_response::OffsetCommitResponse;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequest;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponse;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest,
};
use kafka_protocol::messages::write_txn_markers_response::WriteTxnMarkersResponse;
use kafka_protocol::messages::{ApiKey, BrokerId, GroupId, ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use oncelog_client::Client;
use serde_json::{json, Value};

mod history;

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
    /// Raise a topic's partition count (all new partitions or none).
    AddPartitions {
        name: String,
        /// The new total number of partitions.
        #[arg(long)]
        count: i32,
    },
    /// Change topic configs: --set retention.ms=60000, --delete retention.ms.
    AlterConfig {
        name: String,
        /// Set a config, repeatable.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Return a config to its default, repeatable.
        #[arg(long = "delete", value_name = "KEY")]
        delete: Vec<String>,
    },
}

#[derive(Subcommand)]
pub enum TxnCmd {
    /// List transactional ids and their state.
    List {
        /// Only these states (e.g. Ongoing), repeatable.
        #[arg(long = "state")]
        states: Vec<String>,
    },
    /// Describe one transactional id: its state (Kafka protocol), and from
    /// the broker's HTTP port the epochs, fences (when, cause, old -> new
    /// epoch, the fencing client's client.id and address) and recent events.
    Describe {
        transactional_id: String,
        /// The broker's HTTP endpoint (`metrics.listen`); default
        /// http://<bootstrap host>:9644.
        #[arg(long, value_name = "URL")]
        admin: Option<String>,
    },
    /// The recent events of one transactional id (from the broker's HTTP port).
    History {
        transactional_id: String,
        /// The broker's HTTP endpoint; default http://<bootstrap host>:9644.
        #[arg(long, value_name = "URL")]
        admin: Option<String>,
    },
    /// The producers a partition knows (epoch, last sequence, open transaction).
    Producers { topic: String, partition: i32 },
    /// Open transactions older than --min-age-ms, with the partitions they pin.
    FindHanging {
        #[arg(long, default_value_t = 60_000)]
        min_age_ms: i64,
    },
    /// Abort the open transaction a partition shows for a producer (through
    /// the coordinator when it knows the transaction). Fails with "nothing
    /// open" when neither the partition nor the coordinator has one.
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
    /// Move an inactive group's committed offsets (a dry run unless --execute).
    #[command(group(clap::ArgGroup::new("to").required(true)
        .args(["to_earliest", "to_latest", "to_offset", "to_datetime", "shift_by"])))]
    ResetOffsets {
        group: String,
        #[arg(long)]
        topic: String,
        /// Only this partition (default: all of the topic).
        #[arg(long)]
        partition: Option<i32>,
        #[arg(long)]
        to_earliest: bool,
        #[arg(long)]
        to_latest: bool,
        #[arg(long, value_name = "OFFSET")]
        to_offset: Option<i64>,
        /// The first offset at or after this timestamp (ms since the epoch).
        #[arg(long, value_name = "MS")]
        to_datetime: Option<i64>,
        /// Move by N (negative goes back), kept inside the log.
        #[arg(long, value_name = "N", allow_hyphen_values = true)]
        shift_by: Option<i64>,
        /// Apply the change (without it only the plan is shown).
        #[arg(long)]
        execute: bool,
    },
    /// Delete an inactive group and its committed offsets.
    Delete { group: String },
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

/// As [`check`], with the broker's `error_message` (the reason) when it sent one.
pub(crate) fn check_msg(code: i16, message: Option<&StrBytes>, what: &str) -> Result<()> {
    check(code, what).map_err(
        |e| match message.map(|m| m.as_str()).filter(|m| !m.is_empty()) {
            Some(m) => anyhow!("{e} ({m})"),
            None => e,
        },
    )
}

pub(crate) fn check(code: i16, what: &str) -> Result<()> {
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
pub(crate) async fn offsets(
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
                check_msg(
                    t.error_code,
                    t.error_message.as_ref(),
                    &format!("create {name}"),
                )?;
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
                check_msg(
                    t.error_code,
                    t.error_message.as_ref(),
                    &format!("delete {name}"),
                )?;
            }
            emit(
                json_out,
                &json!({"deleted": name}),
                &["DELETED"],
                vec![vec![name.clone()]],
            );
        }
        TopicCmd::AddPartitions { name, count } => {
            let req = CreatePartitionsRequest::default()
                .with_timeout_ms(30000)
                .with_topics(vec![CreatePartitionsTopic::default()
                    .with_name(TopicName(s(&name)))
                    .with_count(count)
                    .with_assignments(None)]);
            let (r, _) = c
                .call::<_, CreatePartitionsResponse>(ApiKey::CreatePartitions, &req)
                .await?;
            for t in &r.results {
                check_msg(
                    t.error_code,
                    t.error_message.as_ref(),
                    &format!("add partitions to {name}"),
                )?;
            }
            emit(
                json_out,
                &json!({"topic": name, "partitions": count}),
                &["TOPIC", "PARTITIONS"],
                vec![vec![name.clone(), count.to_string()]],
            );
        }
        TopicCmd::AlterConfig { name, set, delete } => {
            if set.is_empty() && delete.is_empty() {
                bail!("nothing to change: give --set KEY=VALUE or --delete KEY");
            }
            let mut cfgs = Vec::new();
            for kv in &set {
                let (k, val) = kv
                    .split_once('=')
                    .ok_or_else(|| anyhow!("--set expects KEY=VALUE, got {kv}"))?;
                cfgs.push(
                    AlterableConfig::default()
                        .with_name(s(k))
                        .with_config_operation(0)
                        .with_value(Some(s(val))),
                );
            }
            for k in &delete {
                cfgs.push(
                    AlterableConfig::default()
                        .with_name(s(k))
                        .with_config_operation(1)
                        .with_value(None),
                );
            }
            let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
                AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s(&name))
                    .with_configs(cfgs),
            ]);
            let (r, _) = c
                .call::<_, IncrementalAlterConfigsResponse>(ApiKey::IncrementalAlterConfigs, &req)
                .await?;
            for x in &r.responses {
                if x.error_code != 0 {
                    let msg = x
                        .error_message
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default();
                    check(x.error_code, &format!("alter configs of {name} ({msg})"))?;
                }
            }
            let configs = topic_configs(&mut c, &name).await?;
            emit(
                json_out,
                &json!({"topic": name, "configs": configs}),
                &["CONFIG", "VALUE"],
                configs
                    .iter()
                    .map(|(k, v)| vec![k.clone(), v.clone()])
                    .collect(),
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
            let configs = topic_configs(&mut c, &name).await?;
            if !json_out && !configs.is_empty() {
                let cs: Vec<String> = configs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!("configs: {}", cs.join(", "));
            }
            emit(
                json_out,
                &json!({"topic": name, "partitions": rows, "configs": configs}),
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

/// A topic's configs that are not defaults (set on the topic or the broker).
async fn topic_configs(c: &mut Client, topic: &str) -> Result<BTreeMap<String, String>> {
    let req =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(s(topic))
            .with_configuration_keys(None)]);
    let (r, _) = c
        .call::<_, DescribeConfigsResponse>(ApiKey::DescribeConfigs, &req)
        .await?;
    let mut out = BTreeMap::new();
    for res in &r.results {
        check(res.error_code, &format!("configs of {topic}"))?;
        for cfg in &res.configs {
            // source 1 = set on the topic (DYNAMIC_TOPIC_CONFIG)
            if cfg.config_source == 1 {
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
        TxnCmd::Describe {
            transactional_id,
            admin,
        } => {
            let admin = admin.unwrap_or_else(|| history::default_admin_url(bootstrap));
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
            let mut v = json!({"transactional_id": transactional_id, "state": t.transaction_state.as_str(),
                "producer_id": t.producer_id.0, "producer_epoch": t.producer_epoch,
                "timeout_ms": t.transaction_timeout_ms, "start_time_ms": t.transaction_start_time_ms,
                "partitions": parts});
            // The Kafka protocol has no history: it comes from the HTTP port,
            // and its absence must not hide what the protocol told.
            let hist = history::fetch(&admin, &transactional_id).await;
            match &hist {
                Ok(h) => v["history"] = h.clone(),
                Err(e) => {
                    v["history"] = Value::Null;
                    v["history_unavailable"] = json!(format!("{e:#}"));
                }
            }
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
            if !json_out {
                match &hist {
                    Ok(h) => history::print_sections(h, table),
                    Err(e) => println!("\nhistory: unavailable ({e:#})"),
                }
            }
        }
        TxnCmd::History {
            transactional_id,
            admin,
        } => {
            let admin = admin.unwrap_or_else(|| history::default_admin_url(bootstrap));
            let h = history::fetch(&admin, &transactional_id).await?;
            let v = json!({"transactional_id": transactional_id,
                "history_since_ms": h["history_since_ms"], "events": h["events"],
                "events_dropped": h["events_dropped"], "stuck": h["stuck"]});
            if !json_out {
                history::print_stuck(&h);
            }
            emit(
                json_out,
                &v,
                history::EVENT_HEADERS,
                history::event_rows(&h),
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
                let now = oncelog_broker::now_ms();
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
            let held = coordinator_transaction(&mut c, producer_id).await?;
            let open_here = producers(&mut c, &topic, partition)
                .await?
                .iter()
                .any(|r| r[0] == producer_id.to_string() && r[5] != "-1");
            if held.is_none() && !open_here {
                bail!(
                    "nothing open: producer {producer_id} has no open transaction at \
                     {topic}-{partition}, and the transaction coordinator holds none for it; \
                     nothing was aborted"
                );
            }
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
                &json!({"aborted": {"topic": topic, "partition": partition, "producer_id": producer_id,
                    "transactional_id": held}}),
                &["ABORTED", "PRODUCER-ID", "TRANSACTIONAL-ID"],
                vec![vec![
                    format!("{topic}-{partition}"),
                    producer_id.to_string(),
                    held.clone().unwrap_or_else(|| "-".to_string()),
                ]],
            );
        }
    }
    Ok(())
}

/// The transactional id whose transaction the coordinator holds open (or is
/// completing) for `pid`, if any.
async fn coordinator_transaction(c: &mut Client, pid: i64) -> Result<Option<String>> {
    let req = ListTransactionsRequest::default()
        .with_producer_id_filters(vec![ProducerId(pid)])
        .with_duration_filter(-1);
    let (r, _) = c
        .call::<_, ListTransactionsResponse>(ApiKey::ListTransactions, &req)
        .await?;
    check(r.error_code, "list transactions")?;
    Ok(r.transaction_states
        .iter()
        .find(|t| {
            t.producer_id.0 == pid
                && matches!(
                    t.transaction_state.as_str(),
                    "Ongoing" | "PrepareCommit" | "PrepareAbort"
                )
        })
        .map(|t| t.transactional_id.0.to_string()))
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
            // Kafka answers an unknown group with state Dead (or, from
            // DescribeGroups v6, GROUP_ID_NOT_FOUND).
            if g.error_code == GROUP_ID_NOT_FOUND || g.group_state.as_str() == "Dead" {
                bail!("group {group} does not exist");
            }
            check(g.error_code, &format!("describe {group}"))?;
            let consumer = g.protocol_type.as_str() == "consumer";
            let members: Vec<Member> = g
                .members
                .iter()
                .map(|m| Member {
                    member_id: m.member_id.to_string(),
                    client_id: m.client_id.to_string(),
                    host: m.client_host.to_string(),
                    instance_id: m.group_instance_id.as_ref().map(|x| x.to_string()),
                    assignment: if consumer {
                        decode_assignment(&m.member_assignment)
                    } else {
                        None
                    },
                })
                .collect();
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
                "protocol_type": g.protocol_type.as_str(),
                "members": members.iter().map(Member::to_json).collect::<Vec<_>>(),
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
                if !members.is_empty() {
                    table(
                        &[
                            "MEMBER-ID",
                            "CLIENT-ID",
                            "HOST",
                            "INSTANCE-ID",
                            "ASSIGNMENT",
                        ],
                        &members.iter().map(Member::row).collect::<Vec<_>>(),
                    );
                    println!();
                }
                table(
                    &["TOPIC", "PARTITION", "COMMITTED", "LSO", "LAG"],
                    &lag_rows,
                );
            }
        }
        GroupCmd::ResetOffsets {
            group,
            topic,
            partition,
            to_earliest,
            to_latest,
            to_offset,
            to_datetime,
            shift_by,
            execute,
        } => {
            let (d, _) = c
                .call::<_, DescribeGroupsResponse>(
                    ApiKey::DescribeGroups,
                    &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(&group))]),
                )
                .await?;
            if let Some(g) = d.groups.first() {
                let state = g.group_state.as_str();
                if g.error_code == 0 && !g.members.is_empty() {
                    bail!(
                        "group {group} is {state} with {} members: offsets can only be reset \
                         while it has none (stop its consumers first)",
                        g.members.len()
                    );
                }
            }
            let md = metadata(&mut c, Some(vec![topic.clone()])).await?;
            let t = md
                .topics
                .first()
                .ok_or_else(|| anyhow!("no metadata for {topic}"))?;
            check(t.error_code, &format!("topic {topic}"))?;
            let mut parts: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
            parts.sort();
            if let Some(p) = partition {
                if !parts.contains(&p) {
                    bail!("{topic} has no partition {p}");
                }
                parts = vec![p];
            }
            let (o, _) = c
                .call::<_, OffsetFetchResponse>(
                    ApiKey::OffsetFetch,
                    &OffsetFetchRequest::default()
                        .with_group_id(GroupId(s(&group)))
                        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                            .with_name(TopicName(s(&topic)))
                            .with_partition_indexes(parts.clone())])),
                )
                .await?;
            check(o.error_code, &format!("offsets of {group}"))?;
            let current: BTreeMap<i32, i64> = o
                .topics
                .iter()
                .flat_map(|t| {
                    t.partitions
                        .iter()
                        .map(|p| (p.partition_index, p.committed_offset))
                })
                .collect();
            let start = offsets(&mut c, &topic, &parts, -2, false).await?;
            let end = offsets(&mut c, &topic, &parts, -1, false).await?;
            let by_time = match to_datetime {
                Some(ts) => Some(offsets(&mut c, &topic, &parts, ts, false).await?),
                None => None,
            };
            let mut plan: Vec<(i32, i64, i64)> = Vec::new();
            for p in &parts {
                let lo = start.get(p).copied().unwrap_or(0);
                let hi = end.get(p).copied().unwrap_or(0);
                let cur = current.get(p).copied().unwrap_or(-1);
                let target = if to_earliest {
                    lo
                } else if to_latest {
                    hi
                } else if let Some(x) = to_offset {
                    x
                } else if let Some(m) = &by_time {
                    match m.get(p).copied() {
                        Some(x) if x >= 0 => x,
                        _ => hi,
                    }
                } else {
                    let base = if cur >= 0 { cur } else { lo };
                    base.saturating_add(shift_by.unwrap_or(0))
                };
                plan.push((*p, cur, target.clamp(lo, hi)));
            }
            if execute {
                let req = OffsetCommitRequest::default()
                    .with_group_id(GroupId(s(&group)))
                    .with_generation_id_or_member_epoch(-1)
                    .with_member_id(StrBytes::default())
                    .with_topics(vec![OffsetCommitRequestTopic::default()
                        .with_name(TopicName(s(&topic)))
                        .with_partitions(
                            plan.iter()
                                .map(|(p, _, o)| {
                                    OffsetCommitRequestPartition::default()
                                        .with_partition_index(*p)
                                        .with_committed_offset(*o)
                                })
                                .collect(),
                        )]);
                let (r, _) = c
                    .call::<_, OffsetCommitResponse>(ApiKey::OffsetCommit, &req)
                    .await?;
                for t in &r.topics {
                    for p in &t.partitions {
                        check(p.error_code, &format!("reset offsets of {group}"))?;
                    }
                }
            }
            let v = json!({"group": group, "topic": topic, "executed": execute,
                "partitions": plan.iter().map(|(p, cur, new)| json!({"partition": p, "current": cur, "new": new})).collect::<Vec<_>>()});
            emit(
                json_out,
                &v,
                &["GROUP", "TOPIC", "PARTITION", "CURRENT", "NEW"],
                plan.iter()
                    .map(|(p, cur, new)| {
                        vec![
                            group.clone(),
                            topic.clone(),
                            p.to_string(),
                            cur.to_string(),
                            new.to_string(),
                        ]
                    })
                    .collect(),
            );
            if !execute && !json_out {
                eprintln!("dry run: nothing changed; add --execute to apply");
            }
        }
        GroupCmd::Delete { group } => {
            let (r, _) = c
                .call::<_, DeleteGroupsResponse>(
                    ApiKey::DeleteGroups,
                    &DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(&group))]),
                )
                .await?;
            for x in &r.results {
                check(x.error_code, &format!("delete group {group}"))?;
            }
            emit(
                json_out,
                &json!({"deleted": group}),
                &["DELETED"],
                vec![vec![group.clone()]],
            );
        }
    }
    Ok(())
}

/// Kafka's GROUP_ID_NOT_FOUND.
const GROUP_ID_NOT_FOUND: i16 = 69;

/// One member of a group, as DescribeGroups tells it.
struct Member {
    member_id: String,
    client_id: String,
    host: String,
    instance_id: Option<String>,
    /// (topic, partitions), for a consumer group whose assignment decodes.
    assignment: Option<Vec<(String, Vec<i32>)>>,
}

impl Member {
    fn to_json(&self) -> Value {
        json!({"member_id": self.member_id, "client_id": self.client_id, "host": self.host,
            "instance_id": self.instance_id,
            "assignment": self.assignment.as_ref().map(|a| a.iter()
                .map(|(t, ps)| json!({"topic": t, "partitions": ps})).collect::<Vec<_>>())})
    }

    fn row(&self) -> Vec<String> {
        let assignment = match &self.assignment {
            None => "-".to_string(),
            Some(a) if a.is_empty() => "(none)".to_string(),
            Some(a) => a
                .iter()
                .flat_map(|(t, ps)| ps.iter().map(move |p| format!("{t}-{p}")))
                .collect::<Vec<_>>()
                .join(","),
        };
        vec![
            self.member_id.clone(),
            self.client_id.clone(),
            self.host.clone(),
            self.instance_id.clone().unwrap_or_else(|| "-".to_string()),
            assignment,
        ]
    }
}

/// A consumer-protocol assignment (version, then the fields of that
/// version; a newer version than we know is read as our newest, whose
/// fields it starts with): topic-partitions sorted. `None` when the bytes do
/// not decode (or there are none: the member has no assignment yet).
fn decode_assignment(raw: &bytes::Bytes) -> Option<Vec<(String, Vec<i32>)>> {
    use bytes::Buf;
    use kafka_protocol::messages::consumer_protocol_assignment::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::{Decodable, Message};
    if raw.len() < 2 {
        return None;
    }
    let mut buf = raw.clone();
    let version = buf.get_i16();
    if version < 0 {
        return None;
    }
    let version = version.min(ConsumerProtocolAssignment::VERSIONS.max);
    let a = ConsumerProtocolAssignment::decode(&mut buf, version).ok()?;
    let mut out: Vec<(String, Vec<i32>)> = a
        .assigned_partitions
        .iter()
        .map(|tp| {
            let mut ps = tp.partitions.clone();
            ps.sort_unstable();
            (tp.topic.0.to_string(), ps)
        })
        .collect();
    out.sort();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;
    use kafka_protocol::messages::consumer_protocol_assignment::{
        ConsumerProtocolAssignment, TopicPartition,
    };
    use kafka_protocol::protocol::Encodable;

    fn encoded(version: i16, a: &ConsumerProtocolAssignment) -> bytes::Bytes {
        let mut b = bytes::BytesMut::new();
        b.put_i16(version);
        a.encode(&mut b, version.min(3)).unwrap();
        b.freeze()
    }

    #[test]
    fn assignments_decode_in_every_version() {
        let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
            TopicPartition::default()
                .with_topic(TopicName(s("b")))
                .with_partitions(vec![2, 0]),
            TopicPartition::default()
                .with_topic(TopicName(s("a")))
                .with_partitions(vec![1]),
        ]);
        let want = vec![("a".to_string(), vec![1]), ("b".to_string(), vec![0, 2])];
        for v in 0..=3 {
            assert_eq!(
                decode_assignment(&encoded(v, &a)),
                Some(want.clone()),
                "v{v}"
            );
        }
        // A newer version starts with the fields we know.
        assert_eq!(decode_assignment(&encoded(7, &a)), Some(want));
        assert_eq!(decode_assignment(&bytes::Bytes::new()), None);
        assert_eq!(
            decode_assignment(&bytes::Bytes::from_static(b"\x00\x00\xff")),
            None
        );
    }
}
