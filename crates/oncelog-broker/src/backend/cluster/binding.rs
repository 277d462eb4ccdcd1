//! The object store is bound to its cluster. A broker given another
//! store than its cluster's (another directory, bucket or prefix) would
//! acknowledge records that no other broker can read. So the store holds a
//! marker object naming the cluster and the store, PostgreSQL names the
//! store the cluster is bound to, and a broker whose `--object-store` does
//! not match both refuses to start, before it registers.
//!
//! The first broker of a cluster binds it (under an advisory lock, so two
//! first brokers with different stores cannot both win). A cluster made by
//! a build before markers is bound at its first start on this build, once
//! its oldest object is found in the store given.

use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};

use super::objects::Objects;
use super::ClusterError;

/// The marker's key, under the store's prefix.
pub const MARKER: &str = "oncelog-cluster.json";

/// Any number that no other user of the database takes as advisory lock.
const BIND_LOCK: i64 = 0x6f6e_6365_6c6f_6703;

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Marker {
    cluster_id: String,
    store_id: String,
}

async fn bound_store(pool: &Pool) -> Result<Option<String>, ClusterError> {
    let client = pool.get().await?;
    Ok(client
        .query_opt(
            "SELECT value FROM oncelog_meta WHERE key = 'object_store_id'",
            &[],
        )
        .await?
        .map(|r| r.get(0)))
}

async fn read_marker(objects: &Objects) -> Result<Option<Marker>, ClusterError> {
    let Some(bytes) = objects.get_whole(MARKER).await? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        ClusterError::Config(format!(
            "object store {}: {MARKER} is not an oncelog cluster marker ({e})",
            objects.describe
        ))
    })
}

/// Checks that `objects` is the store of the cluster `cluster_id` whose
/// database is `pool`, binding them if the cluster has no store yet.
pub async fn check(objects: &Objects, pool: &Pool, cluster_id: &str) -> Result<(), ClusterError> {
    let store = &objects.describe;
    for _ in 0..3 {
        let marker = read_marker(objects).await?;
        let bound = bound_store(pool).await?;
        match (marker, bound) {
            (Some(m), _) if m.cluster_id != cluster_id => {
                return Err(ClusterError::Config(format!(
                    "object store {store} belongs to cluster {}, and this PostgreSQL database is \
                     cluster {cluster_id}: give every broker of a cluster the --object-store its \
                     first broker was given",
                    m.cluster_id
                )))
            }
            (Some(m), Some(b)) if m.store_id == b => return Ok(()),
            (Some(m), Some(b)) => {
                return Err(ClusterError::Config(format!(
                    "object store {store} is store {} of cluster {cluster_id}, but the cluster is \
                     bound to store {b}: it is a copy or an older store, not the one in use",
                    m.store_id
                )))
            }
            (None, Some(b)) => {
                return Err(ClusterError::Config(format!(
                    "object store {store} has no marker of cluster {cluster_id} ({MARKER}), which \
                     is bound to store {b}: this is not the --object-store the cluster's brokers use"
                )))
            }
            (Some(m), None) => {
                // bound by a broker that stopped between the two writes
                bind(pool, &m.store_id, None).await?;
            }
            (None, None) => {
                if let Some(oldest) = oldest_object(pool).await? {
                    if !objects.exists(&oldest).await? {
                        return Err(ClusterError::Config(format!(
                            "object store {store} does not hold this cluster's objects (no \
                             {oldest}): this is not the --object-store the cluster's brokers use"
                        )));
                    }
                }
                let store_id = uuid::Uuid::new_v4().simple().to_string();
                let marker = Marker {
                    cluster_id: cluster_id.to_string(),
                    store_id: store_id.clone(),
                };
                bind(pool, &store_id, Some((objects, &marker))).await?;
            }
        }
    }
    Err(ClusterError::Invariant(format!(
        "object store {store}: binding it to cluster {cluster_id} did not settle"
    )))
}

async fn oldest_object(pool: &Pool) -> Result<Option<String>, ClusterError> {
    let client = pool.get().await?;
    Ok(client
        .query_opt("SELECT key FROM objects ORDER BY created_at LIMIT 1", &[])
        .await?
        .map(|r| r.get(0)))
}

/// Records `store_id` as the cluster's store, writing the marker first
/// (`with`), unless another broker bound one meanwhile (the caller looks
/// again either way).
async fn bind(
    pool: &Pool,
    store_id: &str,
    with: Option<(&Objects, &Marker)>,
) -> Result<(), ClusterError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&BIND_LOCK])
        .await?;
    let taken = tx
        .query_opt(
            "SELECT 1 FROM oncelog_meta WHERE key = 'object_store_id'",
            &[],
        )
        .await?
        .is_some();
    if taken {
        return Ok(());
    }
    if let Some((objects, marker)) = with {
        let body =
            serde_json::to_vec(marker).map_err(|e| ClusterError::Invariant(e.to_string()))?;
        objects.put(MARKER, body.into()).await?;
    }
    tx.execute(
        "INSERT INTO oncelog_meta (key, value) VALUES ('object_store_id', $1)",
        &[&store_id],
    )
    .await?;
    tx.commit().await?;
    tracing::info!(
        store_id,
        "cluster: the object store is bound to this cluster"
    );
    Ok(())
}
