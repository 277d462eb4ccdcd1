//! The storage a broker's protocol runs over, chosen in one place: local
//! mode's data directory, or cluster mode's PostgreSQL and object store
//! (docs/cluster.md). A handler written once calls these and never asks
//! which mode it is in; what differs between the modes lives here.
//!
//! Every request is served by one handler in both modes (`handlers`),
//! which calls these: the catalogue (topics and configs, brokers, ACLs and
//! SCRAM credentials), the partitions' logs, the transaction store and the
//! group store. The backend is chosen once, at start.

use std::collections::BTreeMap;

pub mod cluster;
mod cutovers;
mod groups;
pub mod lineage;
pub mod local;
mod logs;
mod security;
pub mod storage;
pub mod topic;
mod txns;
pub mod verify_record;

pub use cutovers::{CutoverFailure, Cutovers};
pub use groups::Groups;
pub use logs::{
    Acked, Appending, Budget, DeleteError, Durable, FetchAsk, Logs, PartitionError, PartitionRow,
    Refusal,
};
pub use txns::{Scope, Txns};

use crate::backend::cluster::catalogue::CatalogueError;
use crate::backend::cluster::front::Front;
use crate::backend::topic::TopicMeta;
use crate::error::TopicError;
use crate::Broker;

/// A catalogue map's entries, sorted by `key` (listings: both backends
/// keep their topics in such a map).
pub(crate) fn sorted_values<V: Clone, K: Ord>(
    map: &std::sync::RwLock<std::collections::HashMap<String, V>>,
    key: impl FnMut(&V) -> K,
) -> Vec<V> {
    let mut v: Vec<V> = map
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect();
    v.sort_by_key(key);
    v
}

/// Runs file-heavy work (a topic's directories, their fsyncs) without
/// stalling the other tasks of an async worker thread, where the runtime
/// allows it.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Topics and their configs.
pub enum Catalogue<'a> {
    Local(&'a Broker),
    Cluster(&'a Broker, &'a Front),
}

impl Broker {
    /// This broker's catalogue.
    pub fn catalogue(&self) -> Catalogue<'_> {
        match &self.mode {
            crate::Mode::Cluster(front) => Catalogue::Cluster(self, front),
            crate::Mode::Local => Catalogue::Local(self),
        }
    }
}

fn meta_of(row: crate::backend::cluster::catalogue::TopicRow) -> TopicMeta {
    TopicMeta {
        name: row.name,
        id: row.id,
        partitions: row.partitions,
        configs: row.configs,
    }
}

fn from_catalogue(e: CatalogueError) -> TopicError {
    match e {
        CatalogueError::Topic(t) => t,
        CatalogueError::Cluster(c) => TopicError::Storage(c.to_string()),
    }
}

/// A live broker as a client that came in on one listener is told of it.
pub struct Node {
    pub id: i32,
    /// Where that client reaches it: `None` when it has no endpoint on
    /// that listener (an address on another would take the client to a
    /// port that speaks another protocol).
    pub address: Option<(String, i32)>,
}

impl Catalogue<'_> {
    /// The cluster's id, as Metadata gives it.
    pub fn cluster_id(&self) -> String {
        match self {
            Catalogue::Local(b) => b.topics.cluster_id().to_string(),
            Catalogue::Cluster(_, front) => front.cluster_id.clone(),
        }
    }

    /// The live brokers, each with its address on the listener
    /// `listener` (an index into `config.listeners`). In cluster mode read
    /// now, so that a broker that registered a moment ago is named.
    pub async fn nodes(&self, listener: usize) -> Vec<Node> {
        match self {
            Catalogue::Local(b) => {
                let address = match b.config.listeners.get(listener) {
                    Some(l) => (l.advertised_host.clone(), l.advertised_port),
                    None => (b.config.advertised_host.clone(), b.config.advertised_port),
                };
                vec![Node {
                    id: b.config.node_id,
                    address: Some(address),
                }]
            }
            Catalogue::Cluster(b, front) => {
                let name = b
                    .config
                    .listeners
                    .get(listener)
                    .map(|l| l.name.as_str())
                    .unwrap_or_default();
                front
                    .live_now()
                    .await
                    .iter()
                    .map(|row| Node {
                        id: row.id,
                        address: row.serves(name).then(|| row.address(name)),
                    })
                    .collect()
            }
        }
    }

    /// Every topic (in cluster mode read from PostgreSQL, so that a topic
    /// another broker created a moment ago is listed; this broker's copy
    /// only if that read fails).
    pub async fn topics(&self) -> Vec<TopicMeta> {
        match self {
            Catalogue::Local(b) => b.topics.all().iter().map(|t| t.meta()).collect(),
            Catalogue::Cluster(_, front) => {
                match crate::backend::cluster::catalogue::topics(&front.cluster.pool).await {
                    Ok(all) => all.into_iter().map(meta_of).collect(),
                    Err(e) => {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: listing topics failed; answering from the copy");
                        front.topics().into_iter().map(meta_of).collect()
                    }
                }
            }
        }
    }

    /// Every topic's transactional writers seen committing within the
    /// window (`writers::WINDOW_MS`) with their last commit (ms, this
    /// broker's clock): in cluster mode the commits every broker recorded.
    pub async fn live_writers(&self, now: i64) -> BTreeMap<String, Vec<(String, i64)>> {
        match self {
            Catalogue::Local(b) => b.writers.live_detail(now),
            Catalogue::Cluster(b, front) => {
                match crate::backend::cluster::writers::live(&front.cluster, now).await {
                    Ok(all) => all,
                    Err(e) => {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: reading the topics' writers failed; answering from this broker's");
                        b.writers.live_detail(now)
                    }
                }
            }
        }
    }

    /// The broker among `live` that coordinates `group`: this one on a
    /// single node; in cluster mode the group's owner, or the one
    /// rendezvous hashing picks when none of the live ones owns it.
    pub async fn group_coordinator(&self, group: &str, live: &[i32]) -> Option<i32> {
        match self {
            Catalogue::Local(b) => Some(b.config.node_id),
            Catalogue::Cluster(_, front) => {
                match crate::backend::cluster::groups::owner(&front.cluster, group).await {
                    Ok(Some(id)) if live.contains(&id) => Some(id),
                    Ok(_) => crate::machines::placement::rendezvous(group.as_bytes(), live),
                    Err(e) => {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, group, error = %e, "cluster: looking up a group's coordinator failed");
                        None
                    }
                }
            }
        }
    }
    /// The brokers Metadata lists, by id: the only ones a replica
    /// assignment may name.
    pub async fn broker_ids(&self) -> Vec<i32> {
        match self {
            Catalogue::Local(b) => vec![b.config.node_id],
            // read now: a broker that registered a moment ago counts
            Catalogue::Cluster(_, front) => front.live_now().await.iter().map(|r| r.id).collect(),
        }
    }

    /// What a refused replication factor is told about where copies are.
    pub fn copies(&self) -> &'static str {
        match self {
            Catalogue::Local(_) => "a local-mode broker keeps one copy of each partition",
            Catalogue::Cluster(..) => {
                "cluster mode keeps one copy of each partition in the object store, whose \
                 durability is the store's"
            }
        }
    }

    /// Creates `name` with `partitions` partitions and `configs` (checked
    /// by [`crate::backend::topic::check_new_topic`] in both modes), or with
    /// `validate_only` checks that it could be.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<TopicMeta, TopicError> {
        match self {
            Catalogue::Local(b) => blocking(|| {
                b.topics
                    .create(name, partitions, configs, validate_only)
                    .map(|t| t.meta())
            })
            .inspect_err(|e| {
                if matches!(e, TopicError::Storage(_) | TopicError::DataDir(_)) {
                    tracing::error!(topic = %name, error = %e, "creating a topic failed");
                }
            }),
            Catalogue::Cluster(b, front) => {
                let max = b.config.max_partitions_per_topic;
                if validate_only {
                    crate::backend::topic::check_new_topic(name, partitions, &configs, max)?;
                    return match front.topic(name).await {
                        Ok(Some(_)) => Err(TopicError::AlreadyExists(name.to_string())),
                        Ok(None) => Ok(TopicMeta {
                            name: name.to_string(),
                            id: uuid::Uuid::nil(),
                            partitions,
                            configs,
                        }),
                        Err(e) => {
                            crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, topic = %name, error = %e, "cluster: topic lookup failed");
                            Err(TopicError::Storage(e.to_string()))
                        }
                    };
                }
                let row = crate::backend::cluster::catalogue::create_topic(
                    &front.cluster.pool,
                    name,
                    partitions,
                    &configs,
                    max,
                )
                .await
                .map_err(|e| {
                    if let CatalogueError::Cluster(c) = &e {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, *c, topic = %name, error = %c, "cluster: creating a topic failed");
                    }
                    from_catalogue(e)
                })?;
                front.remember(row.clone());
                Ok(meta_of(row))
            }
        }
    }

    /// Whether `transactional_id` may write transactionally to `topic`
    /// (holding it in its transaction) by the topic's writer fence and
    /// cut-over. In cluster mode the gates are checked inside the
    /// coordinator's decision that adds a partition to a transaction, which
    /// every transactional batch passes (its verification refuses a
    /// partition not added), so nothing more is checked here.
    pub fn write_gate(
        &self,
        topic: &str,
        transactional_id: &str,
    ) -> Result<(), crate::error::Gate> {
        match self {
            Catalogue::Local(b) => b.write_gate(topic, transactional_id, true),
            Catalogue::Cluster(..) => Ok(()),
        }
    }

    /// This broker's id (in cluster mode the one it registered with,
    /// assigned from PostgreSQL when `node.id` is unset).
    pub fn node_id(&self) -> i32 {
        match self {
            Catalogue::Local(b) => b.config.node_id,
            Catalogue::Cluster(_, front) => front.cluster.config.broker_id,
        }
    }

    /// A topic's own configs (`None`: no such topic), read afresh in
    /// cluster mode (not from this broker's copy); `Err` says why they
    /// could not be read.
    pub async fn configs(&self, name: &str) -> Result<Option<BTreeMap<String, String>>, String> {
        match self {
            Catalogue::Local(b) => Ok(b.topics.get(name).map(|t| t.meta().configs)),
            Catalogue::Cluster(_, front) => {
                match crate::backend::cluster::catalogue::topic(&front.cluster.pool, name).await {
                    Ok(row) => Ok(row.map(|t| t.configs)),
                    Err(e) => {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, topic = %name, error = %e, "cluster: reading a topic's configs failed");
                        Err(format!("the catalogue could not be read: {e}"))
                    }
                }
            }
        }
    }

    /// Changes a topic's configs to what `change` makes of them (or with
    /// `validate_only` checks that it could), in one step: local mode
    /// under the catalogue's write lock, cluster mode in one PostgreSQL
    /// transaction on its row (every broker's copy follows through the
    /// catalogue channel).
    pub async fn alter_configs(
        &self,
        name: &str,
        validate_only: bool,
        change: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
    ) -> Result<(), TopicError> {
        match self {
            Catalogue::Local(b) => {
                if validate_only {
                    let t = b
                        .topics
                        .get(name)
                        .ok_or_else(|| TopicError::Unknown(name.into()))?;
                    return change(&t.meta().configs).map(|_| ());
                }
                blocking(|| b.topics.update_configs(name, change))
            }
            Catalogue::Cluster(_, front) => {
                match crate::backend::cluster::catalogue::alter_topic_configs(
                    &front.cluster.pool,
                    name,
                    validate_only,
                    change,
                )
                .await
                {
                    Ok(row) => {
                        if !validate_only {
                            front.remember(row);
                        }
                        Ok(())
                    }
                    Err(CatalogueError::Topic(e)) => Err(e),
                    Err(CatalogueError::Cluster(e)) => {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, topic = %name, error = %e, "cluster: altering a topic's configs failed");
                        Err(TopicError::Storage(format!(
                            "the catalogue could not be changed: {e}"
                        )))
                    }
                }
            }
        }
    }

    /// Raises `name`'s partition count to `count` (or with
    /// `validate_only` checks that it could be).
    pub async fn add_partitions(
        &self,
        name: &str,
        count: i32,
        validate_only: bool,
    ) -> Result<(), TopicError> {
        match self {
            Catalogue::Local(b) => blocking(|| b.topics.add_partitions(name, count, validate_only)),
            Catalogue::Cluster(b, front) => {
                let max = b.config.max_partitions_per_topic;
                match crate::backend::cluster::catalogue::add_partitions(
                    &front.cluster.pool,
                    name,
                    count,
                    max,
                    validate_only,
                )
                .await
                {
                    Ok(row) => {
                        if !validate_only {
                            front.remember(row);
                        }
                        Ok(())
                    }
                    Err(e) => {
                        if let CatalogueError::Cluster(c) = &e {
                            crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, *c, topic = %name, error = %c, "cluster: adding partitions failed");
                        }
                        Err(from_catalogue(e))
                    }
                }
            }
        }
    }

    /// The topic named `name`, if there is one (in cluster mode read from
    /// PostgreSQL when this broker's copy lacks it).
    pub async fn topic(&self, name: &str) -> Result<Option<TopicMeta>, TopicError> {
        match self {
            Catalogue::Local(b) => Ok(b.topics.get(name).map(|t| t.meta())),
            Catalogue::Cluster(_, front) => front.topic(name).await.map(|t| t.map(meta_of)).map_err(|e| {
                crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, topic = %name, error = %e, "cluster: topic lookup failed");
                TopicError::Storage(e.to_string())
            }),
        }
    }

    /// The name of the topic whose id is `id` (this broker's copy in
    /// cluster mode), if any.
    pub fn name_of(&self, id: uuid::Uuid) -> Option<String> {
        if id.is_nil() {
            return None;
        }
        match self {
            Catalogue::Local(b) => b
                .topics
                .all()
                .into_iter()
                .map(|t| t.meta())
                .find(|m| m.id == id)
                .map(|m| m.name),
            Catalogue::Cluster(_, front) => front
                .topics()
                .into_iter()
                .find(|t| t.id == id)
                .map(|t| t.name),
        }
    }

    /// Deletes `name` (only if its id is `id`, when one is given) and the
    /// groups' committed offsets of it, so that a topic created again under
    /// the name starts afresh, as Kafka's coordinator does.
    pub async fn delete_topic(&self, name: &str, id: Option<uuid::Uuid>) -> Result<(), TopicError> {
        let id = id.filter(|id| !id.is_nil());
        match self {
            Catalogue::Local(b) => {
                blocking(|| b.topics.delete(name, id))?;
                // Its cut-over goes with it, as a cluster's row does.
                if let Err(e) = b.cutovers.forget_gone(|t| t != name) {
                    tracing::warn!(topic = name, error = %e, "the deleted topic's cut-over is forgotten at the next start");
                }
                b.groups.topic_deleted(name).await;
                Ok(())
            }
            Catalogue::Cluster(_, front) => {
                // the offsets go in the same PostgreSQL transaction
                let r =
                    crate::backend::cluster::catalogue::delete_topic(&front.cluster.pool, name, id)
                        .await
                        .map_err(from_catalogue);
                if !matches!(r, Err(TopicError::UnknownId(_))) {
                    front.forget(name);
                }
                r
            }
        }
    }
}
