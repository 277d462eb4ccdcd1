//! ApiVersions and Metadata.

use std::sync::Arc;

use kafka_protocol::messages::api_versions_response::{
    ApiVersion, ApiVersionsResponse, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::find_coordinator_response::{Coordinator, FindCoordinatorResponse};
use kafka_protocol::messages::metadata_request::MetadataRequest;
use kafka_protocol::messages::metadata_response::{
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{ApiKey, BrokerId, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::SUPPORTED;
use crate::backend::topic::TopicMeta;
use crate::error::ErrorCode;
use crate::error::TopicError;
use crate::Broker;

/// The APIs and versions local mode's ApiVersions answers with (and
/// docs/protocol.md lists): KIP-939's InitProducerId v6 only when the
/// operator serves it.
pub fn served_api_keys(two_phase_commit_enable: bool) -> Vec<ApiVersion> {
    SUPPORTED
        .iter()
        .map(|(k, lo, hi)| {
            let hi = match k {
                ApiKey::InitProducerId if !two_phase_commit_enable => 5,
                _ => *hi,
            };
            ApiVersion::default()
                .with_api_key(*k as i16)
                .with_min_version(*lo)
                .with_max_version(hi)
        })
        .collect()
}

/// ApiVersions, in both modes: what this broker's backend serves.
pub fn api_versions(b: &Broker, version: i16, unsupported: bool) -> ApiVersionsResponse {
    let keys = super::served_apis(b);
    let code = if unsupported {
        ErrorCode::UnsupportedVersion
    } else {
        ErrorCode::None
    };
    let mut resp = ApiVersionsResponse::default()
        .with_error_code(code.code())
        .with_api_keys(keys);
    if version >= 3 && !unsupported {
        resp = with_transaction_version(resp, b.config.transaction_version);
    }
    resp
}

/// KIP-890: the Java client uses transaction version 2 (EndTxn v5, Produce
/// v12) only when the finalized `transaction.version` feature is 2.
/// ApiVersions v3+ carries the features (both modes).
pub fn with_transaction_version(mut resp: ApiVersionsResponse, tv: i16) -> ApiVersionsResponse {
    resp.supported_features = vec![SupportedFeatureKey::default()
        .with_name(StrBytes::from_static_str("transaction.version"))
        .with_min_version(0)
        .with_max_version(2)];
    resp.finalized_features_epoch = 1;
    resp.finalized_features = vec![FinalizedFeatureKey::default()
        .with_name(StrBytes::from_static_str("transaction.version"))
        .with_min_version_level(tv)
        .with_max_version_level(tv)];
    resp
}

/// A topic's entry: each partition led by the broker
/// [`crate::machines::placement::preferred_broker`] picks among `ids` (the brokers the
/// client can reach; any broker serves any partition), or none with the
/// code a client retries on.
fn topic_entry(
    meta: &TopicMeta,
    ids: &[i32],
    missing_listener: bool,
    version: i16,
) -> MetadataResponseTopic {
    let parts = (0..meta.partitions)
        .map(|i| {
            let leader =
                crate::machines::placement::preferred_broker(&meta.id, i, ids).unwrap_or(-1);
            let mut p = MetadataResponsePartition::default()
                .with_partition_index(i)
                .with_leader_id(BrokerId(leader))
                .with_replica_nodes(vec![BrokerId(leader)])
                .with_isr_nodes(vec![BrokerId(leader)]);
            if version >= 7 {
                p.leader_epoch = 0;
            }
            if leader < 0 {
                // Kafka's answer for a leader without the listener, from
                // the version that knows the code
                p.error_code = if missing_listener && version >= 6 {
                    ErrorCode::ListenerNotFound.code()
                } else {
                    ErrorCode::LeaderNotAvailable.code()
                };
            }
            p
        })
        .collect();
    let mut e = MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(meta.name.clone()))))
        .with_partitions(parts);
    if version >= 10 {
        e.topic_id = meta.id;
    }
    e
}

fn error_entry(name: &str, code: ErrorCode) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(name.to_string()))))
        .with_error_code(code.code())
}

/// Metadata, in both modes: the live brokers with an endpoint on the
/// listener the client came in on (as Kafka, another listener's address
/// would take it to a port that speaks another protocol), and the topics
/// asked for, auto-created where allowed.
pub async fn metadata(
    b: &Arc<Broker>,
    req: MetadataRequest,
    version: i16,
    listener: usize,
) -> MetadataResponse {
    let catalogue = b.catalogue();
    let nodes = catalogue.nodes(listener).await;
    let ids: Vec<i32> = nodes
        .iter()
        .filter(|n| n.address.is_some())
        .map(|n| n.id)
        .collect();
    let missing_listener = ids.is_empty() && !nodes.is_empty();
    if missing_listener {
        tracing::warn!(
            listener,
            "no live broker has this listener; Metadata names no leader"
        );
    }
    let brokers = nodes
        .iter()
        .filter_map(|n| {
            let (host, port) = n.address.clone()?;
            Some(
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(n.id))
                    .with_host(StrBytes::from_string(host))
                    .with_port(port),
            )
        })
        .collect();
    let mut resp = MetadataResponse::default().with_brokers(brokers);
    if version >= 1 {
        resp.controller_id = BrokerId(ids.first().copied().unwrap_or(-1));
    }
    if version >= 2 {
        resp.cluster_id = Some(StrBytes::from_string(catalogue.cluster_id()));
    }
    let auto_create = b.config.auto_create_topics && (version < 4 || req.allow_auto_topic_creation);
    let wanted: Option<Vec<String>> = match req.topics {
        None => None,
        Some(v) if v.is_empty() && version == 0 => None,
        Some(v) => Some(
            v.into_iter()
                .filter_map(|t| t.name.map(|n| n.0.to_string()))
                .collect(),
        ),
    };
    let entry = |t: &TopicMeta| topic_entry(t, &ids, missing_listener, version);
    let Some(names) = wanted else {
        resp.topics = catalogue.topics().await.iter().map(entry).collect();
        return resp;
    };
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        out.push(match catalogue.topic(&name).await {
            Ok(Some(t)) => entry(&t),
            // the catalogue could not be read (logged there): retriable
            Err(_) => error_entry(&name, ErrorCode::LeaderNotAvailable),
            // The coordinators' logs are not served as topics, and their
            // names are never auto-created.
            Ok(None) if crate::machines::names::is_internal_topic(&name) => {
                error_entry(&name, ErrorCode::InvalidTopicException)
            }
            Ok(None) if auto_create => {
                let n = b.config.num_partitions;
                match catalogue
                    .create_topic(&name, n, Default::default(), false)
                    .await
                {
                    Ok(t) => entry(&t),
                    // Raced with another creator: serve what exists.
                    Err(TopicError::AlreadyExists(_)) => match catalogue.topic(&name).await {
                        Ok(Some(t)) => entry(&t),
                        _ => error_entry(&name, ErrorCode::LeaderNotAvailable),
                    },
                    Err(TopicError::InvalidName(..)) => {
                        error_entry(&name, ErrorCode::InvalidTopicException)
                    }
                    Err(e) => {
                        // a storage failure is logged by the catalogue
                        if !matches!(e, TopicError::Storage(_) | TopicError::DataDir(_)) {
                            tracing::warn!(topic = %name, error = %e, "auto-create refused");
                        }
                        error_entry(&name, super::admin::topic_error_code(&e))
                    }
                }
            }
            Ok(None) => error_entry(&name, ErrorCode::UnknownTopicOrPartition),
        });
    }
    resp.topics = out;
    resp
}

/// What FindCoordinator says of one key.
struct CoordAnswer {
    code: ErrorCode,
    message: Option<String>,
    node: i32,
    host: String,
    port: i32,
}

impl CoordAnswer {
    fn none(code: ErrorCode, message: String) -> Self {
        Self {
            code,
            message: Some(message),
            node: -1,
            host: String::new(),
            port: -1,
        }
    }
}

/// FindCoordinator, in both modes. A group's coordinator is the broker that
/// owns it ([`crate::backend::Catalogue::group_coordinator`]); a
/// transactional id's is the live broker rendezvous hashing picks among
/// those the client can reach (any broker can decide for it; this spreads
/// the load). On one node both are this broker. Key types other than group
/// (0) and transaction (1) get INVALID_REQUEST.
pub async fn find_coordinator(
    b: &Arc<Broker>,
    req: FindCoordinatorRequest,
    version: i16,
    listener: usize,
) -> FindCoordinatorResponse {
    let catalogue = b.catalogue();
    let nodes = catalogue.nodes(listener).await;
    let live: Vec<i32> = nodes.iter().map(|n| n.id).collect();
    let reachable: Vec<i32> = nodes
        .iter()
        .filter(|n| n.address.is_some())
        .map(|n| n.id)
        .collect();
    let answer = |chosen: Option<i32>| match chosen.and_then(|id| nodes.iter().find(|n| n.id == id))
    {
        Some(n) => match &n.address {
            Some((host, port)) => CoordAnswer {
                code: ErrorCode::None,
                message: None,
                node: n.id,
                host: host.clone(),
                port: *port,
            },
            // a group's coordinator is its owner: one without this
            // listener is not available to this client (Kafka answers the
            // same)
            None => CoordAnswer::none(
                ErrorCode::CoordinatorNotAvailable,
                format!("coordinator {} has no endpoint on this listener", n.id),
            ),
        },
        None => CoordAnswer::none(ErrorCode::CoordinatorNotAvailable, "no live broker".into()),
    };
    let keys: Vec<StrBytes> = if version >= 4 {
        req.coordinator_keys.clone()
    } else {
        vec![req.key.clone()]
    };
    let mut answers = Vec::with_capacity(keys.len());
    for key in &keys {
        answers.push(match req.key_type {
            0 => answer(catalogue.group_coordinator(key.as_str(), &live).await),
            1 => answer(crate::machines::placement::rendezvous(
                key.as_bytes(),
                &reachable,
            )),
            k => CoordAnswer::none(ErrorCode::InvalidRequest, format!("unknown key type {k}")),
        });
    }
    let mut resp = FindCoordinatorResponse::default();
    if version >= 4 {
        resp.coordinators = keys
            .into_iter()
            .zip(answers)
            .map(|(key, a)| {
                Coordinator::default()
                    .with_key(key)
                    .with_error_code(a.code.code())
                    .with_error_message(a.message.map(StrBytes::from_string))
                    .with_node_id(BrokerId(a.node))
                    .with_host(StrBytes::from_string(a.host))
                    .with_port(a.port)
            })
            .collect();
    } else if let Some(a) = answers.pop() {
        resp.error_code = a.code.code();
        if version >= 1 {
            resp.error_message = a.message.map(StrBytes::from_string);
        }
        resp.node_id = BrokerId(a.node);
        resp.host = StrBytes::from_string(a.host);
        resp.port = a.port;
    }
    resp
}
