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
use crate::error::ErrorCode;
use crate::error::TopicError;
use crate::topics::Topic;
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

pub fn api_versions(b: &Broker, version: i16, unsupported: bool) -> ApiVersionsResponse {
    let keys = served_api_keys(b.config.two_phase_commit_enable);
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

fn topic_entry(b: &Broker, t: &Topic, version: i16) -> MetadataResponseTopic {
    let meta = t.meta();
    let node = BrokerId(b.config.node_id);
    let parts = (0..t.partition_count())
        .map(|i| {
            let mut p = MetadataResponsePartition::default()
                .with_partition_index(i)
                .with_leader_id(node)
                .with_replica_nodes(vec![node])
                .with_isr_nodes(vec![node]);
            if version >= 7 {
                p.leader_epoch = 0;
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

/// The address a client that came in on listener `listener` is told.
fn advertised(b: &Broker, listener: usize) -> (StrBytes, i32) {
    match b.config.listeners.get(listener) {
        Some(l) => (
            StrBytes::from_string(l.advertised_host.clone()),
            l.advertised_port,
        ),
        None => (
            StrBytes::from_string(b.config.advertised_host.clone()),
            b.config.advertised_port,
        ),
    }
}

pub fn metadata(
    b: &Arc<Broker>,
    req: MetadataRequest,
    version: i16,
    listener: usize,
) -> MetadataResponse {
    let (host, port) = advertised(b, listener);
    let brokers = vec![MetadataResponseBroker::default()
        .with_node_id(BrokerId(b.config.node_id))
        .with_host(host)
        .with_port(port)];
    let mut resp = MetadataResponse::default().with_brokers(brokers);
    if version >= 1 {
        resp.controller_id = BrokerId(b.config.node_id);
    }
    if version >= 2 {
        resp.cluster_id = Some(StrBytes::from_string(b.topics.cluster_id().to_string()));
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
    resp.topics = match wanted {
        None => b
            .topics
            .all()
            .iter()
            .map(|t| topic_entry(b, t, version))
            .collect(),
        Some(names) => names
            .iter()
            .map(|name| match b.topics.get(name) {
                Some(t) => topic_entry(b, &t, version),
                // The coordinators' logs are not served as topics, and
                // their names are never auto-created.
                None if crate::datadir::is_internal_topic(name) => {
                    error_entry(name, ErrorCode::InvalidTopicException)
                }
                None if auto_create => {
                    match b.topics.create(name, -1, Default::default(), false) {
                        Ok(t) => topic_entry(b, &t, version),
                        // Raced with another creator: serve what exists.
                        Err(TopicError::AlreadyExists(_)) => match b.topics.get(name) {
                            Some(t) => topic_entry(b, &t, version),
                            None => error_entry(name, ErrorCode::LeaderNotAvailable),
                        },
                        Err(TopicError::InvalidName(..)) => {
                            error_entry(name, ErrorCode::InvalidTopicException)
                        }
                        Err(e) => {
                            tracing::error!(topic = %name, error = %e, "auto-create failed");
                            error_entry(name, ErrorCode::KafkaStorageError)
                        }
                    }
                }
                None => error_entry(name, ErrorCode::UnknownTopicOrPartition),
            })
            .collect(),
    };
    resp
}

/// FindCoordinator: on a single node this broker coordinates every group
/// and transactional id. Key types other than group (0) and transaction (1)
/// get INVALID_REQUEST.
pub fn find_coordinator(
    b: &Arc<Broker>,
    req: FindCoordinatorRequest,
    version: i16,
    listener: usize,
) -> FindCoordinatorResponse {
    let (host, port) = advertised(b, listener);
    let node = BrokerId(b.config.node_id);
    let known = matches!(req.key_type, 0 | 1);
    let code = if known {
        ErrorCode::None
    } else {
        ErrorCode::InvalidRequest
    };
    let message =
        (!known).then(|| StrBytes::from_string(format!("unknown key type {}", req.key_type)));
    let mut resp = FindCoordinatorResponse::default();
    if version >= 4 {
        resp.coordinators = req
            .coordinator_keys
            .into_iter()
            .map(|key| {
                let mut c = Coordinator::default()
                    .with_key(key)
                    .with_error_code(code.code())
                    .with_error_message(message.clone());
                if known {
                    c.node_id = node;
                    c.host = host.clone();
                    c.port = port;
                } else {
                    c.node_id = BrokerId(-1);
                    c.port = -1;
                }
                c
            })
            .collect();
    } else {
        resp.error_code = code.code();
        if version >= 1 {
            resp.error_message = message;
        }
        if known {
            resp.node_id = node;
            resp.host = host;
            resp.port = port;
        } else {
            resp.node_id = BrokerId(-1);
            resp.port = -1;
        }
    }
    resp
}
