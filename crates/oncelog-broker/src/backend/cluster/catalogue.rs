//! Topics and partitions, as rows: every broker reads the same catalogue.

use std::collections::BTreeMap;

use deadpool_postgres::Pool;
use uuid::Uuid;

use super::ClusterError;
use crate::error::TopicError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRow {
    pub id: Uuid,
    pub name: String,
    pub partitions: i32,
    pub configs: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogueError {
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

impl From<tokio_postgres::Error> for CatalogueError {
    fn from(e: tokio_postgres::Error) -> Self {
        CatalogueError::Cluster(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for CatalogueError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        CatalogueError::Cluster(e.into())
    }
}

/// The channel a topic's creation, deletion or config change is announced
/// on (its name): every broker then reads the catalogue again, so a deleted
/// and recreated topic is not served from a stale copy.
pub const CATALOGUE_CHANNEL: &str = "oncelog_catalogue";

/// Creates a topic with `partitions` partitions, each starting at offset 0.
/// Creating a name that exists (by any broker, concurrently too) is
/// `TopicError::Exists` and changes nothing.

pub async fn create_topic(
    pool: &Pool,
    name: &str,
    partitions: i32,
    configs: &BTreeMap<String, String>,
    max_partitions: i32,
) -> Result<TopicRow, CatalogueError> {
    crate::backend::topic::check_new_topic(name, partitions, configs, max_partitions)?;
    let id = Uuid::new_v4();
    let configs_json = serde_json::to_value(configs).unwrap_or_default();
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let inserted = tx
        .execute(
            "INSERT INTO topics (id, name, partitions, configs) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (name) DO NOTHING",
            &[&id, &name, &partitions, &configs_json],
        )
        .await?;
    if inserted == 0 {
        return Err(TopicError::AlreadyExists(name.to_string()).into());
    }
    tx.execute(
        "INSERT INTO partitions (topic_id, partition) SELECT $1, generate_series(0, $2 - 1)",
        &[&id, &partitions],
    )
    .await?;
    tx.execute("SELECT pg_notify($1, $2)", &[&CATALOGUE_CHANNEL, &name])
        .await?;
    tx.commit().await?;
    Ok(TopicRow {
        id,
        name: name.to_string(),
        partitions,
        configs: configs.clone(),
    })
}

/// Every topic, by name.
pub async fn topics(pool: &Pool) -> Result<Vec<TopicRow>, ClusterError> {
    topics_on(&*pool.get().await?).await
}

/// [`topics`] on a connection of the caller's.
pub async fn topics_on(
    client: &deadpool_postgres::ClientWrapper,
) -> Result<Vec<TopicRow>, ClusterError> {
    // prepared once per connection: every broker runs this every second
    let st = client
        .prepare_cached("SELECT id, name, partitions, configs FROM topics ORDER BY name")
        .await?;
    let rows = client.query(&st, &[]).await?;
    Ok(rows.iter().map(topic_row).collect())
}

pub async fn topic(pool: &Pool, name: &str) -> Result<Option<TopicRow>, ClusterError> {
    let client = pool.get().await?;
    let row = client
        .query_opt(
            "SELECT id, name, partitions, configs FROM topics WHERE name = $1",
            &[&name],
        )
        .await?;
    Ok(row.as_ref().map(topic_row))
}

/// Replaces a topic's configs by what `change` makes of the current ones,
/// in one PostgreSQL transaction that holds the topic's row (`FOR NO KEY
/// UPDATE`: the partitions' foreign keys are not held up): alterations
/// through any brokers at once each see the one before, none is lost. The
/// change is announced, so every broker's copy follows at once. With
/// `validate_only` nothing is written. The topic's row after the change.
pub async fn alter_topic_configs(
    pool: &Pool,
    name: &str,
    validate_only: bool,
    change: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
) -> Result<TopicRow, CatalogueError> {
    if crate::machines::names::is_internal_topic(name) {
        return Err(TopicError::Internal {
            topic: name.into(),
            action: "alter",
        }
        .into());
    }
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let row = tx
        .query_opt(
            "SELECT id, name, partitions, configs FROM topics WHERE name = $1 FOR NO KEY UPDATE",
            &[&name],
        )
        .await?
        .ok_or_else(|| TopicError::Unknown(name.to_string()))?;
    let mut t = topic_row(&row);
    let configs = change(&t.configs)?;
    for (k, v) in &configs {
        crate::config::validate_topic_config(k, v).map_err(|e| TopicError::InvalidConfig(e.0))?;
    }
    if validate_only || configs == t.configs {
        return Ok(t);
    }
    let configs_json = serde_json::to_value(&configs).unwrap_or_default();
    tx.execute(
        "UPDATE topics SET configs = $2 WHERE id = $1",
        &[&t.id, &configs_json],
    )
    .await?;
    tx.execute("SELECT pg_notify($1, $2)", &[&CATALOGUE_CHANNEL, &name])
        .await?;
    tx.commit().await?;
    t.configs = configs;
    Ok(t)
}

/// Raises a topic's partition count to `count` (CreatePartitions), in one
/// PostgreSQL transaction holding the topic's row: the new partitions'
/// rows with it, announced so that every broker's copy follows. Refused
/// for an internal topic, a count that is not an increase, and past
/// `max_partitions`. With `validate_only` nothing is written. The topic's
/// row after the change.
pub async fn add_partitions(
    pool: &Pool,
    name: &str,
    count: i32,
    max_partitions: i32,
    validate_only: bool,
) -> Result<TopicRow, CatalogueError> {
    if crate::machines::names::is_internal_topic(name) {
        return Err(TopicError::Internal {
            topic: name.into(),
            action: "add partitions to",
        }
        .into());
    }
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let row = tx
        .query_opt(
            "SELECT id, name, partitions, configs FROM topics WHERE name = $1 FOR NO KEY UPDATE",
            &[&name],
        )
        .await?
        .ok_or_else(|| TopicError::Unknown(name.to_string()))?;
    let mut t = topic_row(&row);
    let cur = t.partitions;
    if count <= cur {
        return Err(TopicError::InvalidPartitions(format!(
            "topic currently has {cur} partitions, {count} would not be an increase"
        ))
        .into());
    }
    if count > max_partitions {
        return Err(TopicError::InvalidPartitions(format!(
            "{count} partitions exceeds max.partitions.per.topic ({max_partitions})"
        ))
        .into());
    }
    if validate_only {
        return Ok(t);
    }
    tx.execute(
        "UPDATE topics SET partitions = $2 WHERE id = $1",
        &[&t.id, &count],
    )
    .await?;
    tx.execute(
        "INSERT INTO partitions (topic_id, partition) SELECT $1, generate_series($2, $3 - 1)",
        &[&t.id, &cur, &count],
    )
    .await?;
    tx.execute("SELECT pg_notify($1, $2)", &[&CATALOGUE_CHANNEL, &name])
        .await?;
    tx.commit().await?;
    t.partitions = count;
    Ok(t)
}

fn topic_row(r: &tokio_postgres::Row) -> TopicRow {
    let configs: serde_json::Value = r.get(3);
    TopicRow {
        id: r.get(0),
        name: r.get(1),
        partitions: r.get(2),
        configs: serde_json::from_value(configs).unwrap_or_default(),
    }
}

/// Deletes a topic: its partitions', batches' and producers' rows and the
/// groups' offsets of it go in the same transaction; its objects are left to the collector, which removes an
/// object once no batch row names it.
/// Deletes `name` (only if its id is `id`, when one is given).
pub async fn delete_topic(pool: &Pool, name: &str, id: Option<Uuid>) -> Result<(), CatalogueError> {
    if crate::machines::names::is_internal_topic(name) {
        return Err(TopicError::Internal {
            topic: name.into(),
            action: "delete",
        }
        .into());
    }
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    // The topic's row, then its cut-over's, then the partitions' (the
    // cascade's order is the tables', which a coordinator decision, holding
    // a cut-over row and then partition rows, would meet the other way).
    tx.execute(
        "SELECT 1 FROM topics WHERE name = $1 FOR NO KEY UPDATE",
        &[&name],
    )
    .await?;
    tx.execute(
        "DELETE FROM cutovers USING topics WHERE cutovers.topic_id = topics.id AND topics.name = $1",
        &[&name],
    )
    .await?;
    let held: Option<Uuid> = tx
        .query_opt("SELECT id FROM topics WHERE name = $1", &[&name])
        .await?
        .map(|r| r.get(0));
    match (held, id) {
        (None, _) => return Err(TopicError::Unknown(name.to_string()).into()),
        (Some(held), Some(id)) if held != id => return Err(TopicError::UnknownId(id).into()),
        _ => {}
    }
    tx.execute("DELETE FROM topics WHERE name = $1", &[&name])
        .await?;
    // As Kafka's coordinator: the groups' committed (and pending) offsets of
    // the topic go with it, so a topic created again starts afresh.
    for table in ["group_offsets", "group_pending_offsets"] {
        tx.execute(&format!("DELETE FROM {table} WHERE topic = $1"), &[&name])
            .await?;
    }
    tx.execute("SELECT pg_notify($1, $2)", &[&CATALOGUE_CHANNEL, &name])
        .await?;
    tx.commit().await?;
    Ok(())
}
