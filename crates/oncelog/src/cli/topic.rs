//! `oncelog topic`: list, create, describe (offsets, LSO, configs), delete,
//! add-partitions, alter-config.

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
use kafka_protocol::messages::delete_topics_request::{DeleteTopicState, DeleteTopicsRequest};
use kafka_protocol::messages::delete_topics_response::DeleteTopicsResponse;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig, IncrementalAlterConfigsRequest,
};
use kafka_protocol::messages::incremental_alter_configs_response::IncrementalAlterConfigsResponse;
use kafka_protocol::messages::{ApiKey, TopicName};
use oncelog_client::admin::{metadata, topic_configs, RESOURCE_TOPIC};
use oncelog_client::consumer::{list_offsets, EARLIEST, LATEST};
use oncelog_client::{check, check_msg, Client};
use serde_json::{json, Value};

use super::{emit, s};

/// IncrementalAlterConfigs operations.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;

#[derive(Subcommand)]
pub enum TopicCmd {
    /// List topics with their partition counts.
    List,
    /// Create a topic.
    Create {
        name: String,
        /// How many partitions.
        #[arg(long, short = 'p', default_value_t = 1)]
        partitions: i32,
        /// Copies of each partition, sent to the broker as asked (default:
        /// the broker's). An oncelog broker in local mode keeps one copy,
        /// made durable before it acknowledges, and refuses more than 1.
        #[arg(long, short = 'r', value_name = "N",
              value_parser = clap::value_parser!(i16).range(1..))]
        replication_factor: Option<i16>,
        /// Topic config, repeatable: --config retention.ms=60000
        #[arg(long = "config", short = 'c', value_name = "KEY=VALUE")]
        configs: Vec<String>,
    },
    /// Show a topic's partitions with their offsets and, from the broker's
    /// HTTP port, a compacted topic's log cleaner state and a fenced topic's
    /// cut-over (oncelog cutover).
    Describe {
        name: String,
        /// The broker's HTTP endpoint (`metrics.listen`); default
        /// http://<bootstrap host>:9644.
        #[arg(long, value_name = "URL", env = "ONCELOG_ADMIN")]
        admin: Option<String>,
    },
    /// Delete a topic.
    Delete { name: String },
    /// Raise a topic's partition count (all new partitions or none).
    AddPartitions {
        name: String,
        /// The new total number of partitions (also `--partitions` or
        /// `-p`, as kafka-topics --alter says it).
        #[arg(long, short = 'p', visible_alias = "partitions")]
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
            replication_factor,
            configs,
        } => {
            create(
                &mut c,
                json_out,
                name,
                partitions,
                replication_factor,
                configs,
            )
            .await?
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
            alter_config(&mut c, json_out, name, set, delete).await?
        }
        TopicCmd::Describe { name, admin } => {
            describe(&mut c, bootstrap, json_out, name, admin).await?
        }
    }
    Ok(())
}

/// `topic create`.
async fn create(
    c: &mut Client,
    json_out: bool,
    name: String,
    partitions: i32,
    replication_factor: Option<i16>,
    configs: Vec<String>,
) -> Result<()> {
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
            .with_replication_factor(replication_factor.unwrap_or(-1))
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
    Ok(())
}

/// `topic alter-config`: `--set KEY=VALUE` and `--delete KEY`.
async fn alter_config(
    c: &mut Client,
    json_out: bool,
    name: String,
    set: Vec<String>,
    delete: Vec<String>,
) -> Result<()> {
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
                .with_config_operation(OP_SET)
                .with_value(Some(s(val))),
        );
    }
    for k in &delete {
        cfgs.push(
            AlterableConfig::default()
                .with_name(s(k))
                .with_config_operation(OP_DELETE)
                .with_value(None),
        );
    }
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(RESOURCE_TOPIC)
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
    let configs = topic_configs(c, &name).await?;
    emit(
        json_out,
        &json!({"topic": name, "configs": configs}),
        &["CONFIG", "VALUE"],
        configs
            .iter()
            .map(|(k, v)| vec![k.clone(), v.clone()])
            .collect(),
    );
    Ok(())
}

/// `topic describe`: partitions, configs, and the broker's view of each
/// partition's offsets.
async fn describe(
    c: &mut Client,
    bootstrap: &str,
    json_out: bool,
    name: String,
    admin: Option<String>,
) -> Result<()> {
    let md = metadata(c, Some(vec![name.clone()])).await?;
    let t = md
        .topics
        .first()
        .ok_or_else(|| anyhow!("no metadata for {name}"))?;
    check(t.error_code, &format!("describe {name}"))?;
    let parts: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
    let start = list_offsets(c, &name, &parts, EARLIEST, false).await?;
    let hw = list_offsets(c, &name, &parts, LATEST, false).await?;
    let lso = list_offsets(c, &name, &parts, LATEST, true).await?;
    let configs = topic_configs(c, &name).await?;
    let compacted = configs
        .iter()
        .any(|(k, v)| k == "cleanup.policy" && v.contains("compact"));
    // The cleaner's state is not in the Kafka protocol: it comes
    // from the HTTP port, and its absence must not hide the rest.
    let mut cleaner = Value::Null;
    let mut cleaner_unavailable = None;
    let fenced = configs
        .iter()
        .any(|(k, _)| k == "writer.transactional.id.prefix");
    let explicit_admin = admin.is_some();
    let admin = super::history::admin_for(bootstrap, admin);
    // A topic's cut-over (oncelog cutover), when it has or had one.
    let mut cutover = Value::Null;
    if fenced || explicit_admin {
        let path = format!(
            "/v1/cutover?topic={}",
            super::history::percent_encode(&name)
        );
        if let Ok(v) = super::history::get_json(&admin, &path).await {
            if v["phase"] != "None" {
                cutover = v;
            }
        }
    }
    if compacted {
        match super::history::cleaner(&admin).await {
            Ok(v) => cleaner = v["partitions"].clone(),
            Err(e) => cleaner_unavailable = Some(format!("{e:#}")),
        }
    }
    let state = |p: &i32| {
        cleaner
            .get(format!("{name}-{p}"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let rows: Vec<Value> = parts
        .iter()
        .map(|p| {
            let mut row = json!({"partition": p, "log_start_offset": start.get(p), "high_watermark": hw.get(p),
                "last_stable_offset": lso.get(p)});
            if compacted {
                row["cleaner"] = state(p);
            }
            row
        })
        .collect();
    if !json_out && !configs.is_empty() {
        let cs: Vec<String> = configs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("configs: {}", cs.join(", "));
    }
    if let (false, Some(why)) = (json_out, &cleaner_unavailable) {
        println!("cleaner state unavailable: {why}");
    }
    if !json_out && !cutover.is_null() {
        let waiting: Vec<&str> = cutover["waiting_for"]
            .as_array()
            .map(|w| {
                w.iter()
                    .filter_map(|t| t["transactional_id"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "cut-over: {} from {} to {}{}{}",
            cutover["phase"].as_str().unwrap_or("?"),
            cutover["from"].as_str().unwrap_or("?"),
            cutover["to"].as_str().unwrap_or("?"),
            if cutover["done"] == true {
                ", done"
            } else {
                ""
            },
            if waiting.is_empty() {
                String::new()
            } else {
                format!(", waiting for {}", waiting.join(","))
            }
        );
    }
    let mut header = vec!["PARTITION", "LOG-START", "HIGH-WATERMARK", "LSO"];
    if compacted {
        header.extend([
            "CLEANED-TO",
            "DIRTY-RATIO",
            "DIRTY-BYTES",
            "PASSES",
            "LAST-ERROR",
        ]);
    }
    let table = parts
        .iter()
        .map(|p| {
            let mut row = vec![
                p.to_string(),
                start.get(p).unwrap_or(&-1).to_string(),
                hw.get(p).unwrap_or(&-1).to_string(),
                lso.get(p).unwrap_or(&-1).to_string(),
            ];
            if compacted {
                let s = state(p);
                let num = |k: &str| s.get(k).map_or("-".to_string(), |v| v.to_string());
                row.push(num("first_dirty_offset"));
                row.push(
                    s.get("dirty_ratio")
                        .and_then(Value::as_f64)
                        .map_or("-".into(), |r| format!("{r:.2}")),
                );
                row.push(num("dirty_bytes"));
                row.push(num("passes"));
                row.push(
                    s.get("last_error")
                        .and_then(Value::as_str)
                        .unwrap_or("-")
                        .to_string(),
                );
            }
            row
        })
        .collect();
    let mut out = json!({"topic": name, "partitions": rows, "configs": configs});
    if let Some(why) = cleaner_unavailable {
        out["cleaner_unavailable"] = json!(why);
    }
    if !cutover.is_null() {
        out["cutover"] = cutover;
    }
    emit(json_out, &out, &header, table);
    Ok(())
}
