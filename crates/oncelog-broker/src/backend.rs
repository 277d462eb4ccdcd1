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

fn from_catalogue(e: CatalogueError) -> TopicError {
    match e {
        CatalogueError::Topic(t) => t,
        CatalogueError::Cluster(c) => TopicError::Storage(c.to_string()),
    }
}

impl Catalogue<'_> {
    /// The brokers Metadata lists, by id: the only ones a replica
    /// assignment may name.
    pub fn broker_ids(&self) -> Vec<i32> {
        match self {
            Catalogue::Local(b) => vec![b.config.node_id],
            Catalogue::Cluster(_, front) => front.live().iter().map(|r| r.id).collect(),
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
                Ok(TopicMeta {
                    name: row.name,
                    id: row.id,
                    partitions: row.partitions,
                    configs: row.configs,
                })
            }
        }
    }
}
