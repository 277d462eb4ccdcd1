//! CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
//! IncrementalAlterConfigs and AlterConfigs, DeleteRecords.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use kafka_protocol::messages::alter_configs_request::AlterConfigsRequest;
use kafka_protocol::messages::alter_configs_response::{
    AlterConfigsResourceResponse as LegacyAlterResult, AlterConfigsResponse,
};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsRequest;
use kafka_protocol::messages::create_partitions_response::{
    CreatePartitionsResponse, CreatePartitionsTopicResult,
};
use kafka_protocol::messages::create_topics_request::CreateTopicsRequest;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult, CreateTopicsResponse,
};
use kafka_protocol::messages::delete_records_request::DeleteRecordsRequest;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsResponse, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::delete_topics_request::DeleteTopicsRequest;
use kafka_protocol::messages::delete_topics_response::{
    DeletableTopicResult, DeleteTopicsResponse,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsRequest;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResponse, DescribeConfigsResult,
};
use kafka_protocol::messages::incremental_alter_configs_request::IncrementalAlterConfigsRequest;
use kafka_protocol::messages::incremental_alter_configs_response::{
    AlterConfigsResourceResponse, IncrementalAlterConfigsResponse,
};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;

use crate::config::{BrokerConfig, SETTINGS};
use crate::error::ErrorCode;
use crate::error::TopicError;
use crate::Broker;

pub(crate) const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

pub(super) fn topic_error_code(e: &TopicError) -> ErrorCode {
    match e {
        TopicError::AlreadyExists(_) => ErrorCode::TopicAlreadyExists,
        TopicError::Unknown(_) => ErrorCode::UnknownTopicOrPartition,
        TopicError::UnknownId(_) => ErrorCode::UnknownTopicId,
        TopicError::InvalidName(..) => ErrorCode::InvalidTopicException,
        TopicError::InvalidPartitions(_) => ErrorCode::InvalidPartitions,
        TopicError::InvalidConfig(_) => ErrorCode::InvalidConfig,
        TopicError::Storage(_) | TopicError::DataDir(_) => ErrorCode::KafkaStorageError,
        // As Kafka: an internal name is not a valid name to create or write;
        // changing an internal topic is not something a client may do.
        TopicError::Internal {
            action: "create", ..
        } => ErrorCode::InvalidTopicException,
        TopicError::Internal { .. } => ErrorCode::TopicAuthorizationFailed,
    }
}

/// Kafka's config type numbers (DescribeConfigs v3+).
fn config_type(key: &str) -> i8 {
    match key {
        "cleanup.policy" => 7,
        "compression.type" | "message.timestamp.type" => 2,
        "preallocate"
        | "unclean.leader.election.enable"
        | "message.downconversion.enable"
        | "remote.storage.enable" => 1,
        "min.cleanable.dirty.ratio" => 6,
        "min.insync.replicas"
        | "index.interval.bytes"
        | "max.message.bytes"
        | "segment.bytes"
        | "segment.index.bytes" => 3,
        _ => 5,
    }
}

pub async fn create_topics(
    b: &Arc<Broker>,
    req: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let catalogue = b.catalogue();
    let brokers = catalogue.broker_ids().await;
    let mut seen = HashSet::new();
    let dups: HashSet<String> = req
        .topics
        .iter()
        .filter(|t| !seen.insert(t.name.0.to_string()))
        .map(|t| t.name.0.to_string())
        .collect();
    let mut out = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let r = CreatableTopicResult::default().with_name(t.name.clone());
        let fail = |mut r: CreatableTopicResult, code: ErrorCode, msg: String| {
            r.error_code = code.code();
            if version >= 1 {
                r.error_message = Some(s(msg));
            }
            r
        };
        if dups.contains(&name) {
            out.push(fail(
                r,
                ErrorCode::InvalidRequest,
                format!("topic {name} appears more than once"),
            ));
            continue;
        }
        // As Kafka: no more replicas than brokers listed. Every backend
        // keeps one copy (local: this broker's disk; cluster: the object
        // store), so a partition has one replica whatever was asked.
        let available = brokers.len() as i32;
        if t.assignments.is_empty()
            && t.replication_factor != -1
            && !(1..=available).contains(&(t.replication_factor as i32))
        {
            let why = if t.replication_factor < 1 {
                "replication factor must be larger than 0".to_string()
            } else {
                format!(
                    "replication factor {} is larger than the {available} available broker{}: \
                     {}; use replication factor 1 (or leave it out)",
                    t.replication_factor,
                    if available == 1 { "" } else { "s" },
                    catalogue.copies()
                )
            };
            out.push(fail(r, ErrorCode::InvalidReplicationFactor, why));
            continue;
        }
        let mut partitions = if t.num_partitions == -1 {
            b.config.num_partitions
        } else {
            t.num_partitions
        };
        if !t.assignments.is_empty() {
            if t.num_partitions != -1 || t.replication_factor != -1 {
                out.push(fail(
                    r,
                    ErrorCode::InvalidRequest,
                    "both replica assignments and partitions/replication factor were given".into(),
                ));
                continue;
            }
            let ok = t.assignments.iter().enumerate().all(|(i, a)| {
                let ids: HashSet<i32> = a.broker_ids.iter().map(|x| x.0).collect();
                a.partition_index == i as i32
                    && !a.broker_ids.is_empty()
                    && ids.len() == a.broker_ids.len()
                    && ids.iter().all(|id| brokers.contains(id))
            });
            if !ok {
                out.push(fail(
                    r,
                    ErrorCode::InvalidReplicaAssignment,
                    format!(
                        "assignments must name partitions 0.. in order, each on distinct brokers \
                         of {brokers:?}"
                    ),
                ));
                continue;
            }
            partitions = t.assignments.len() as i32;
        }
        let configs: BTreeMap<String, String> = t
            .configs
            .iter()
            .filter_map(|c| {
                c.value
                    .as_ref()
                    .map(|v| (c.name.to_string(), v.to_string()))
            })
            .collect();
        out.push(
            match catalogue
                .create_topic(&name, partitions, configs, req.validate_only)
                .await
            {
                Ok(meta) => created(b, r, &meta, version),
                Err(e) => {
                    // a storage failure is logged by the catalogue
                    if !matches!(
                        e,
                        TopicError::AlreadyExists(_)
                            | TopicError::Storage(_)
                            | TopicError::DataDir(_)
                    ) {
                        tracing::warn!(topic = %name, error = %e, "create topic refused");
                    }
                    fail(r, topic_error_code(&e), e.to_string())
                }
            },
        );
    }
    CreateTopicsResponse::default().with_topics(out)
}

/// A created (or, validate_only, creatable) topic's answer: from v5 its
/// partitions, replication factor and every topic config with its source.
fn created(
    b: &Broker,
    mut r: CreatableTopicResult,
    meta: &crate::backend::topic::TopicMeta,
    version: i16,
) -> CreatableTopicResult {
    if version >= 5 {
        r.num_partitions = meta.partitions;
        r.replication_factor = 1;
        r.configs = Some(
            BrokerConfig::TOPIC_CONFIGS
                .iter()
                .map(|k| {
                    let (v, src) = match meta.configs.get(*k) {
                        Some(v) => (Some(v.clone()), SOURCE_TOPIC),
                        None => (b.config.topic_default(k), SOURCE_DEFAULT),
                    };
                    CreatableTopicConfigs::default()
                        .with_name(s(*k))
                        .with_value(v.map(s))
                        .with_config_source(src)
                })
                .collect(),
        );
        if version >= 7 {
            r.topic_id = meta.id;
        }
    }
    r
}

/// DeleteTopics, in both modes (the groups' committed offsets of a deleted
/// topic go with it: [`crate::backend::Catalogue::delete_topic`]).
pub async fn delete_topics(
    b: &Arc<Broker>,
    req: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    let catalogue = b.catalogue();
    let targets: Vec<(Option<String>, uuid::Uuid)> = if version >= 6 {
        req.topics
            .into_iter()
            .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
            .collect()
    } else {
        req.topic_names
            .into_iter()
            .map(|n| (Some(n.0.to_string()), uuid::Uuid::nil()))
            .collect()
    };
    let mut responses = Vec::with_capacity(targets.len());
    for (name, id) in targets {
        let name = name.or_else(|| catalogue.name_of(id));
        let mut r = DeletableTopicResult::default();
        if version >= 6 {
            r.topic_id = id;
        }
        let res = match &name {
            Some(n) => {
                if version >= 6 && id.is_nil() {
                    if let Ok(Some(t)) = catalogue.topic(n).await {
                        r.topic_id = t.id;
                    }
                }
                catalogue.delete_topic(n, Some(id)).await
            }
            None if id.is_nil() => Err(TopicError::Unknown(String::new())),
            None => Err(TopicError::UnknownId(id)),
        };
        r.name = name.map(|n| TopicName(s(n)));
        if let Err(e) = res {
            r.error_code = topic_error_code(&e).code();
            if version >= 5 {
                r.error_message = Some(s(e.to_string()));
            }
        }
        responses.push(r);
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

/// CreatePartitions, in both modes: each topic's partition count raised
/// in one step of the catalogue. Assignments, when given, name one live
/// broker per new partition (every backend keeps one copy).
pub async fn create_partitions(
    b: &Arc<Broker>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let catalogue = b.catalogue();
    let brokers = catalogue.broker_ids().await;
    let mut results = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let mut r = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        let cur = match catalogue.topic(&name).await {
            Ok(meta) => meta.map(|m| m.partitions).unwrap_or(0),
            Err(e) => {
                r.error_code = topic_error_code(&e).code();
                r.error_message = Some(s(e.to_string()));
                results.push(r);
                continue;
            }
        };
        let bad_assign = t.assignments.as_ref().is_some_and(|a| {
            a.len() as i64 != i64::from(t.count) - i64::from(cur)
                || a.iter()
                    .any(|x| x.broker_ids.len() != 1 || !brokers.contains(&x.broker_ids[0].0))
        });
        if bad_assign {
            r.error_code = ErrorCode::InvalidReplicaAssignment.code();
            r.error_message = Some(s(format!(
                "one assignment per new partition, each naming one of the brokers {brokers:?}"
            )));
            results.push(r);
            continue;
        }
        if let Err(e) = catalogue
            .add_partitions(&name, t.count, req.validate_only)
            .await
        {
            r.error_code = topic_error_code(&e).code();
            r.error_message = Some(s(e.to_string()));
        }
        results.push(r);
    }
    CreatePartitionsResponse::default().with_results(results)
}

/// DescribeConfigs, in both modes: a topic's configs from the catalogue,
/// the broker's from its own settings.
pub async fn describe_configs(
    b: &Arc<Broker>,
    req: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let catalogue = b.catalogue();
    let mut rows: std::collections::HashMap<
        String,
        Result<Option<BTreeMap<String, String>>, String>,
    > = std::collections::HashMap::new();
    for res in &req.resources {
        let name = res.resource_name.to_string();
        if res.resource_type != RESOURCE_TOPIC || rows.contains_key(&name) {
            continue;
        }
        let got = catalogue.configs(&name).await;
        rows.insert(name, got);
    }
    let topic = |name: &str| rows.get(name).cloned().unwrap_or(Ok(None));
    describe_configs_with(b, req, version, catalogue.node_id(), topic)
}

/// DescribeConfigs, for either mode: `topic` gives a topic's own configs
/// (`Ok(None)`: no such topic; `Err`: they could not be read), `node_id`
/// is the broker resource this broker answers for.
pub fn describe_configs_with(
    b: &Broker,
    req: DescribeConfigsRequest,
    version: i16,
    node_id: i32,
    topic: impl Fn(&str) -> Result<Option<BTreeMap<String, String>>, String>,
) -> DescribeConfigsResponse {
    let results = req
        .resources
        .into_iter()
        .map(|res| {
            let mut out = DescribeConfigsResult::default()
                .with_resource_type(res.resource_type)
                .with_resource_name(res.resource_name.clone());
            let wanted = |k: &str| {
                res.configuration_keys
                    .as_ref()
                    .is_none_or(|ks| ks.iter().any(|x| x.as_str() == k))
            };
            let entry = |k: &str, v: Option<String>, src: i8| {
                let mut e = DescribeConfigsResourceResult::default()
                    .with_name(s(k))
                    .with_value(v.map(s))
                    .with_config_source(src);
                if version >= 3 {
                    e.config_type = config_type(k);
                }
                e
            };
            match res.resource_type {
                RESOURCE_TOPIC => match topic(res.resource_name.as_str()) {
                    Ok(Some(configs)) => {
                        out.configs = BrokerConfig::TOPIC_CONFIGS
                            .iter()
                            .filter(|k| wanted(k))
                            .map(|k| match configs.get(*k) {
                                Some(v) => entry(k, Some(v.clone()), SOURCE_TOPIC),
                                None => entry(k, b.config.topic_default(k), SOURCE_DEFAULT),
                            })
                            .collect();
                    }
                    Err(e) => {
                        out.error_code = ErrorCode::KafkaStorageError.code();
                        out.error_message = Some(s(e));
                    }
                    Ok(None) => {
                        out.error_code = ErrorCode::UnknownTopicOrPartition.code();
                        out.error_message = Some(s(format!(
                            "topic {} does not exist",
                            res.resource_name.as_str()
                        )));
                    }
                },
                RESOURCE_BROKER
                    if res.resource_name.is_empty()
                        || res.resource_name.as_str() == node_id.to_string() =>
                {
                    out.configs = SETTINGS
                        .iter()
                        .filter(|(k, _, _)| wanted(k))
                        .map(|(k, default, _)| {
                            let v = b
                                .config
                                .raw
                                .get(*k)
                                .cloned()
                                .unwrap_or_else(|| default.to_string());
                            let src = if v == *default {
                                SOURCE_DEFAULT
                            } else {
                                SOURCE_STATIC_BROKER
                            };
                            let mut e = entry(k, Some(v), src);
                            e.read_only = true;
                            if version >= 3 {
                                e.config_type = 2;
                            }
                            e
                        })
                        .collect();
                }
                _ => {
                    out.error_code = ErrorCode::InvalidRequest.code();
                    out.error_message = Some(s(format!(
                        "resource type {} name {:?} is not supported",
                        res.resource_type,
                        res.resource_name.as_str()
                    )));
                }
            }
            out
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// One alteration of a topic's configs, as either AlterConfigs API asks it.
pub(crate) enum ConfigChange {
    /// IncrementalAlterConfigs: (name, operation, value), applied in order
    /// (0 SET, 1 DELETE, 2 APPEND and 3 SUBTRACT for list configs).
    Ops(Vec<(String, i8, Option<String>)>),
    /// AlterConfigs (the older API): the topic's configs become exactly
    /// these; what is not named returns to its default.
    Replace(BTreeMap<String, String>),
}

impl ConfigChange {
    /// IncrementalAlterConfigs' change of one resource, or Kafka's
    /// INVALID_REQUEST for a config named twice, a null value on any
    /// operation but DELETE, or an operation that does not exist.
    pub(crate) fn incremental(
        configs: &[kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig],
    ) -> Result<Self, (ErrorCode, String)> {
        no_duplicate_keys(configs.iter().map(|c| c.name.as_str()))?;
        let null: Vec<&str> = configs
            .iter()
            .filter(|c| c.config_operation != 1 && c.value.is_none())
            .map(|c| c.name.as_str())
            .collect();
        if !null.is_empty() {
            return Err((
                ErrorCode::InvalidRequest,
                format!("Null value not supported for : {}", null.join(", ")),
            ));
        }
        if let Some(c) = configs
            .iter()
            .find(|c| !(0..=3).contains(&c.config_operation))
        {
            return Err((
                ErrorCode::InvalidRequest,
                format!(
                    "unknown operation {} for {}",
                    c.config_operation,
                    c.name.as_str()
                ),
            ));
        }
        Ok(ConfigChange::Ops(
            configs
                .iter()
                .map(|c| {
                    (
                        c.name.to_string(),
                        c.config_operation,
                        c.value.as_ref().map(|v| v.to_string()),
                    )
                })
                .collect(),
        ))
    }

    /// AlterConfigs' change of one resource, or INVALID_REQUEST for a
    /// config named twice or without a value (as Kafka answers).
    pub(crate) fn replace(
        configs: &[kafka_protocol::messages::alter_configs_request::AlterableConfig],
    ) -> Result<Self, (ErrorCode, String)> {
        no_duplicate_keys(configs.iter().map(|c| c.name.as_str()))?;
        let mut all = BTreeMap::new();
        let mut null = Vec::new();
        for c in configs {
            match &c.value {
                Some(v) => {
                    all.insert(c.name.to_string(), v.to_string());
                }
                None => null.push(c.name.as_str()),
            }
        }
        if !null.is_empty() {
            return Err((
                ErrorCode::InvalidRequest,
                format!("Null value not supported for : {}", null.join(", ")),
            ));
        }
        Ok(ConfigChange::Replace(all))
    }

    /// The topic's configs after this change of `current` (a list
    /// operation starts from the broker's default when the topic has none),
    /// each checked as CreateTopics checks them.
    pub(crate) fn apply(
        &self,
        current: &BTreeMap<String, String>,
        default: impl Fn(&str) -> Option<String>,
    ) -> Result<BTreeMap<String, String>, TopicError> {
        let list = |v: &str| -> Vec<String> {
            v.split(',')
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect()
        };
        let configs = match self {
            ConfigChange::Replace(all) => all.clone(),
            ConfigChange::Ops(ops) => {
                let mut configs = current.clone();
                for (key, op, value) in ops {
                    let value = value.clone().unwrap_or_default();
                    let now = configs
                        .get(key)
                        .cloned()
                        .or_else(|| default(key))
                        .unwrap_or_default();
                    match op {
                        0 => {
                            configs.insert(key.clone(), value);
                        }
                        1 => {
                            configs.remove(key);
                        }
                        2 if config_type(key) == 7 => {
                            let mut items = list(&now);
                            for v in list(&value) {
                                if !items.contains(&v) {
                                    items.push(v);
                                }
                            }
                            configs.insert(key.clone(), items.join(","));
                        }
                        3 if config_type(key) == 7 => {
                            let remove = list(&value);
                            let items: Vec<String> = list(&now)
                                .into_iter()
                                .filter(|x| !remove.contains(x))
                                .collect();
                            configs.insert(key.clone(), items.join(","));
                        }
                        op => {
                            return Err(TopicError::InvalidConfig(format!(
                                "operation {op} is not valid for {key}"
                            )))
                        }
                    }
                }
                configs
            }
        };
        for (k, v) in &configs {
            crate::config::validate_topic_config(k, v)
                .map_err(|e| TopicError::InvalidConfig(e.0))?;
        }
        Ok(configs)
    }
}

fn no_duplicate_keys<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), (ErrorCode, String)> {
    let mut seen = std::collections::HashSet::new();
    for n in names {
        if !seen.insert(n) {
            return Err((
                ErrorCode::InvalidRequest,
                "Error due to duplicate config keys".into(),
            ));
        }
    }
    Ok(())
}

/// A request's resources with their changes, each named more than once
/// refused with INVALID_REQUEST (every copy, as Kafka answers).
pub(crate) type AlterEntry = (i8, StrBytes, Result<ConfigChange, (ErrorCode, String)>);

pub(crate) fn refuse_duplicate_resources(mut entries: Vec<AlterEntry>) -> Vec<AlterEntry> {
    let mut count = std::collections::HashMap::new();
    for (t, name, _) in &entries {
        *count.entry((*t, name.to_string())).or_insert(0usize) += 1;
    }
    for (t, name, change) in &mut entries {
        if count[&(*t, name.to_string())] > 1 {
            *change = Err((
                ErrorCode::InvalidRequest,
                "Each resource must appear at most once.".into(),
            ));
        }
    }
    entries
}

/// Whether a resource's configs may be altered at all: only a client
/// topic's (broker settings are static; the internal topics are the
/// broker's own).
pub(crate) fn alterable_topic(resource_type: i8, name: &str) -> Result<(), (ErrorCode, String)> {
    if resource_type != RESOURCE_TOPIC {
        return Err((
            ErrorCode::InvalidRequest,
            "only topic configs can be altered; broker settings are static".into(),
        ));
    }
    if crate::machines::names::is_internal_topic(name) {
        let e = TopicError::Internal {
            topic: name.into(),
            action: "alter",
        };
        return Err((topic_error_code(&e), e.to_string()));
    }
    Ok(())
}

pub(crate) fn alter_error(e: &TopicError) -> (ErrorCode, String) {
    (topic_error_code(e), e.to_string())
}

/// One resource's answer, the same shape for both AlterConfigs APIs.
pub(crate) fn alter_result(
    resource_type: i8,
    resource_name: StrBytes,
    result: Result<(), (ErrorCode, String)>,
) -> AlterConfigsResourceResponse {
    let mut out = AlterConfigsResourceResponse::default()
        .with_resource_type(resource_type)
        .with_resource_name(resource_name);
    if let Err((code, msg)) = result {
        out.error_code = code.code();
        out.error_message = Some(s(msg));
    }
    out
}

/// The older AlterConfigs' answer, from the same results.
pub(crate) fn alter_configs_response(
    results: Vec<AlterConfigsResourceResponse>,
) -> AlterConfigsResponse {
    AlterConfigsResponse::default().with_responses(
        results
            .into_iter()
            .map(|r| {
                LegacyAlterResult::default()
                    .with_resource_type(r.resource_type)
                    .with_resource_name(r.resource_name)
                    .with_error_code(r.error_code)
                    .with_error_message(r.error_message)
            })
            .collect(),
    )
}

/// Alters each resource's configs (both AlterConfigs APIs, both modes):
/// each topic's change is one step of the catalogue.
async fn alter_all(
    b: &Broker,
    entries: Vec<AlterEntry>,
    validate_only: bool,
) -> Vec<AlterConfigsResourceResponse> {
    let catalogue = b.catalogue();
    let default = |k: &str| b.config.topic_default(k);
    let mut out = Vec::with_capacity(entries.len());
    for (resource_type, resource_name, change) in refuse_duplicate_resources(entries) {
        let name = resource_name.to_string();
        let result = match change
            .and_then(|change| alterable_topic(resource_type, &name).map(|()| change))
        {
            Err(e) => Err(e),
            Ok(change) => catalogue
                .alter_configs(&name, validate_only, |current| {
                    change.apply(current, default)
                })
                .await
                .map_err(|e| alter_error(&e)),
        };
        out.push(alter_result(resource_type, resource_name, result));
    }
    out
}

pub async fn incremental_alter_configs(
    b: &Arc<Broker>,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let entries = req
        .resources
        .into_iter()
        .map(|res| {
            let change = ConfigChange::incremental(&res.configs);
            (res.resource_type, res.resource_name, change)
        })
        .collect();
    IncrementalAlterConfigsResponse::default()
        .with_responses(alter_all(b, entries, req.validate_only).await)
}

/// AlterConfigs, the older API (kafka-python's `alter_configs`): each
/// topic's configs are replaced by the ones given.
pub async fn alter_configs(b: &Arc<Broker>, req: AlterConfigsRequest) -> AlterConfigsResponse {
    let entries = req
        .resources
        .into_iter()
        .map(|res| {
            let change = ConfigChange::replace(&res.configs);
            (res.resource_type, res.resource_name, change)
        })
        .collect();
    alter_configs_response(alter_all(b, entries, req.validate_only).await)
}

/// DeleteRecords (KIP-107): moves each partition's log start offset to the
/// requested offset (-1: the high watermark) and deletes the segments wholly
/// below it, as Kafka does: refused past the high watermark
/// (OFFSET_OUT_OF_RANGE), on a topic whose cleanup.policy lacks `delete`
/// (POLICY_VIOLATION), and on the internal topics (INVALID_TOPIC_EXCEPTION).
/// The answer's low watermark is the new log start offset.
pub async fn delete_records(b: &Arc<Broker>, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    use crate::backend::DeleteError;
    let catalogue = b.catalogue();
    let logs = b.logs();
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let topic = if crate::machines::names::is_internal_topic(&name) {
            Err(ErrorCode::InvalidTopicException)
        } else {
            match catalogue.topic(&name).await {
                Ok(Some(meta)) => Ok(meta),
                Ok(None) => Err(ErrorCode::UnknownTopicOrPartition),
                // logged by the catalogue
                Err(_) => Err(ErrorCode::KafkaStorageError),
            }
        };
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let mut r = DeleteRecordsPartitionResult::default()
                .with_partition_index(p.partition_index)
                .with_low_watermark(-1);
            let code = match &topic {
                Err(code) => *code,
                Ok(meta) if !b.topics.cleanup_policy(meta).delete => {
                    tracing::info!(topic = %name, "DeleteRecords refused: cleanup.policy has no delete");
                    ErrorCode::PolicyViolation
                }
                Ok(meta) => match logs.delete_records(meta, p.partition_index, p.offset).await {
                    Ok(start) => {
                        r.low_watermark = start;
                        ErrorCode::None
                    }
                    Err(DeleteError::OutOfRange) => ErrorCode::OffsetOutOfRange,
                    Err(DeleteError::Unknown) => ErrorCode::UnknownTopicOrPartition,
                    Err(DeleteError::Storage) => ErrorCode::KafkaStorageError,
                },
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

#[cfg(test)]
mod tests {
    use super::*;

    fn configs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn op(key: &str, op: i8, value: Option<&str>) -> (String, i8, Option<String>) {
        (key.to_string(), op, value.map(str::to_string))
    }

    #[test]
    fn incremental_operations_apply_in_order_and_lists_start_from_the_default() {
        let default = |k: &str| (k == "cleanup.policy").then(|| "delete".to_string());
        let current = configs(&[("retention.ms", "1000")]);
        let change = ConfigChange::Ops(vec![
            op("retention.ms", 1, None),
            op("segment.ms", 0, Some("60000")),
            op("cleanup.policy", 2, Some("compact,delete")),
        ]);
        assert_eq!(
            change.apply(&current, default).unwrap(),
            configs(&[
                ("cleanup.policy", "delete,compact"),
                ("segment.ms", "60000")
            ])
        );
        let current = configs(&[("cleanup.policy", "delete,compact")]);
        let change = ConfigChange::Ops(vec![op("cleanup.policy", 3, Some("compact"))]);
        assert_eq!(
            change.apply(&current, default).unwrap(),
            configs(&[("cleanup.policy", "delete")])
        );
    }

    #[test]
    fn a_bad_operation_or_value_refuses_the_whole_change() {
        let none = |_: &str| None;
        let current = configs(&[("retention.ms", "1000")]);
        for ops in [
            vec![
                op("segment.ms", 0, Some("1")),
                op("retention.ms", 0, Some("soon")),
            ],
            vec![op("retention.ms", 2, Some("1"))],
            vec![op("no.such.config", 0, Some("1"))],
        ] {
            let e = ConfigChange::Ops(ops).apply(&current, none).unwrap_err();
            assert!(matches!(e, TopicError::InvalidConfig(_)), "{e}");
        }
    }

    #[test]
    fn a_replacement_is_the_whole_set() {
        let none = |_: &str| None;
        let current = configs(&[("retention.ms", "1000"), ("cleanup.policy", "compact")]);
        let change = ConfigChange::Replace(configs(&[("segment.ms", "60000")]));
        assert_eq!(
            change.apply(&current, none).unwrap(),
            configs(&[("segment.ms", "60000")])
        );
    }

    #[test]
    fn a_request_of_the_wrong_shape_is_invalid_request() {
        use kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig as Inc;
        let inc = |name: &str, op: i8, value: Option<&str>| {
            Inc::default()
                .with_name(s(name))
                .with_config_operation(op)
                .with_value(value.map(|v| s(v)))
        };
        let refused = |r: Result<ConfigChange, (ErrorCode, String)>| match r {
            Err((ErrorCode::InvalidRequest, msg)) => msg,
            Err((code, msg)) => panic!("{code:?}: {msg}"),
            Ok(_) => panic!("accepted"),
        };
        let twice = [
            inc("retention.ms", 0, Some("1")),
            inc("retention.ms", 1, None),
        ];
        assert_eq!(
            refused(ConfigChange::incremental(&twice)),
            "Error due to duplicate config keys"
        );
        let null = [inc("a", 0, None), inc("b", 1, None), inc("c", 2, None)];
        assert_eq!(
            refused(ConfigChange::incremental(&null)),
            "Null value not supported for : a, c"
        );
        refused(ConfigChange::incremental(&[inc(
            "retention.ms",
            9,
            Some("1"),
        )]));
        assert!(ConfigChange::incremental(&[inc("retention.ms", 1, None)]).is_ok());

        use kafka_protocol::messages::alter_configs_request::AlterableConfig as Legacy;
        let legacy = |name: &str, value: Option<&str>| {
            Legacy::default()
                .with_name(s(name))
                .with_value(value.map(|v| s(v)))
        };
        refused(ConfigChange::replace(&[
            legacy("segment.ms", Some("1")),
            legacy("segment.ms", Some("2")),
        ]));
        refused(ConfigChange::replace(&[legacy("segment.ms", None)]));

        let ok = || ConfigChange::incremental(&[]);
        let entries = refuse_duplicate_resources(vec![
            (2, s("a"), ok()),
            (2, s("b"), ok()),
            (2, s("a"), ok()),
            (4, s("a"), ok()),
        ]);
        let refused_at: Vec<bool> = entries.iter().map(|(_, _, c)| c.is_err()).collect();
        assert_eq!(refused_at, [true, false, true, false]);
    }
}

/// CreateAcls, in both modes: one change of the catalogue's ACLs.
pub async fn create_acls(
    b: &Arc<Broker>,
    req: kafka_protocol::messages::CreateAclsRequest,
) -> kafka_protocol::messages::CreateAclsResponse {
    if !b.authz.enabled {
        return crate::security::acl::create_disabled(&req);
    }
    let (stored, plan) = b
        .catalogue()
        .change_acls(|acls| crate::security::acl::plan_create(acls, &req))
        .await;
    plan.answer(&stored)
}

/// DeleteAcls, in both modes: one change of the catalogue's ACLs.
pub async fn delete_acls(
    b: &Arc<Broker>,
    req: kafka_protocol::messages::DeleteAclsRequest,
) -> kafka_protocol::messages::DeleteAclsResponse {
    if !b.authz.enabled {
        return crate::security::acl::delete_disabled(&req);
    }
    let (stored, plan) = b
        .catalogue()
        .change_acls(|acls| crate::security::acl::plan_delete(acls, &req))
        .await;
    plan.answer(&stored)
}

/// DescribeAcls, in both modes, from the catalogue's ACLs as they stand.
pub async fn describe_acls(
    b: &Arc<Broker>,
    req: kafka_protocol::messages::DescribeAclsRequest,
) -> kafka_protocol::messages::DescribeAclsResponse {
    b.catalogue().refresh_acls().await;
    b.authz.describe(&req)
}

/// AlterUserScramCredentials, in both modes: a user with any invalid
/// change gets its error and keeps its credentials; the valid users'
/// changes are stored in one step before the answer.
pub async fn alter_user_scram_credentials(
    b: &Arc<Broker>,
    req: kafka_protocol::messages::AlterUserScramCredentialsRequest,
) -> kafka_protocol::messages::AlterUserScramCredentialsResponse {
    let (stored, next, plan) = b
        .catalogue()
        .change_users(|users| crate::security::plan_alter(users, &req))
        .await;
    plan.answer(&stored, &next)
}

/// DescribeUserScramCredentials, in both modes.
pub async fn describe_user_scram_credentials(
    b: &Arc<Broker>,
    req: kafka_protocol::messages::DescribeUserScramCredentialsRequest,
) -> kafka_protocol::messages::DescribeUserScramCredentialsResponse {
    b.catalogue().refresh_users().await;
    b.users.describe(&req)
}
