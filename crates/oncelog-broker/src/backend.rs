//! The storage a broker's protocol runs over, chosen in one place: local
//! mode's data directory, or cluster mode's PostgreSQL and object store
//! (docs/cluster.md). A handler written once calls these and never asks
//! which mode it is in; what differs between the modes lives here.
//!
//! This is where the protocol layer and the two backends meet while the
//! rest of cluster mode's second dispatcher (`handlers/cluster*.rs`) is
//! folded into the handlers that local mode uses: each request moved here
//! is served by one handler in both modes (see `handlers::SHARED`).

use std::collections::BTreeMap;

use crate::cluster::catalogue::CatalogueError;
use crate::cluster::front::Front;
use crate::error::TopicError;
use crate::topics::TopicMeta;
use crate::Broker;

/// Topics and their configs.
pub enum Catalogue<'a> {
    Local(&'a Broker),
    Cluster(&'a Broker, &'a Front),
}

impl Broker {
    /// This broker's catalogue.
    pub fn catalogue(&self) -> Catalogue<'_> {
        match self.cluster.get() {
            Some(front) => Catalogue::Cluster(self, front),
            None => Catalogue::Local(self),
        }
    }
}

fn meta_of(row: crate::cluster::catalogue::TopicRow) -> TopicMeta {
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

impl Catalogue<'_> {
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
    /// by [`crate::topics::check_new_topic`] in both modes), or with
    /// `validate_only` checks that it could be.
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<TopicMeta, TopicError> {
        match self {
            Catalogue::Local(b) => crate::handlers::blocking(|| {
                b.topics
                    .create(name, partitions, configs, validate_only)
                    .map(|t| t.meta())
            }),
            Catalogue::Cluster(b, front) => {
                let max = b.config.max_partitions_per_topic;
                if validate_only {
                    crate::topics::check_new_topic(name, partitions, &configs, max)?;
                    return match front.topic(name).await {
                        Ok(Some(_)) => Err(TopicError::AlreadyExists(name.to_string())),
                        Ok(None) => Ok(TopicMeta {
                            name: name.to_string(),
                            id: uuid::Uuid::nil(),
                            partitions,
                            configs,
                        }),
                        Err(e) => Err(TopicError::Storage(e.to_string())),
                    };
                }
                let row = crate::cluster::catalogue::create_topic(
                    &front.cluster.pool,
                    name,
                    partitions,
                    &configs,
                    max,
                )
                .await
                .map_err(from_catalogue)?;
                front.remember(row.clone());
                Ok(meta_of(row))
            }
        }
    }

    /// The topic named `name`, if there is one (in cluster mode read from
    /// PostgreSQL when this broker's copy lacks it).
    pub async fn topic(&self, name: &str) -> Result<Option<TopicMeta>, TopicError> {
        match self {
            Catalogue::Local(b) => Ok(b.topics.get(name).map(|t| t.meta())),
            Catalogue::Cluster(_, front) => front
                .topic(name)
                .await
                .map(|t| t.map(meta_of))
                .map_err(|e| TopicError::Storage(e.to_string())),
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
                crate::handlers::blocking(|| b.topics.delete(name, id))?;
                b.groups.topic_deleted(name).await;
                Ok(())
            }
            Catalogue::Cluster(_, front) => {
                // the offsets go in the same PostgreSQL transaction
                let r = crate::cluster::catalogue::delete_topic(&front.cluster.pool, name, id)
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
