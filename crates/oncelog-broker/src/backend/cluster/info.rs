//! `oncelog cluster info --postgres …`: what a cluster's database and
//! object store say, with no broker running. Read only: the connection is
//! opened with `default_transaction_read_only`, nothing is created or
//! migrated, and the object store is only listed.

use std::time::Instant;

use serde::Serialize;

use super::objects::Objects;
use super::ClusterError;

#[derive(Debug, Serialize)]
pub struct ClusterInfo {
    pub cluster_id: String,
    pub schema_version: String,
    pub postgres: PostgresHealth,
    pub brokers: Vec<BrokerInfo>,
    pub topics: i64,
    pub partitions: i64,
    /// The sum of the partitions' high watermarks.
    pub offsets: i64,
    pub open_transactions: i64,
    /// Age of the oldest open transaction, by PostgreSQL's clock.
    pub oldest_open_transaction_ms: Option<i64>,
    pub groups: Vec<GroupInfo>,
    /// The background jobs' leases (retention, compaction).
    pub jobs: Vec<super::jobs::JobRow>,
    /// Offsets pending in open transactions (TxnOffsetCommit).
    pub pending_transactional_offsets: i64,
    pub objects: i64,
    pub object_bytes: i64,
    /// Slabs of reserved object keys not yet collected (the brokers' current
    /// ones, and closed ones inside `cluster.intent.grace.ms`), with any
    /// per-object intents left by earlier versions.
    pub key_slabs: i64,
    pub object_store: Option<StoreHealth>,
}

#[derive(Debug, Serialize)]
pub struct PostgresHealth {
    pub server_version: String,
    pub round_trip_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct BrokerInfo {
    pub id: i32,
    pub session: i64,
    pub address: String,
    pub live: bool,
    /// Time left on the lease (negative: ended that long ago).
    pub lease_left_ms: i64,
    pub renewed_ms_ago: i64,
    pub registered_ms_ago: i64,
}

#[derive(Debug, Serialize)]
pub struct GroupInfo {
    pub group: String,
    pub coordinator: i32,
    pub session: i64,
    /// Whether the coordinator's session is live (else the next broker a
    /// member reaches takes the group over).
    pub live: bool,
}

#[derive(Debug, Serialize)]
pub struct StoreHealth {
    pub store: String,
    pub ok: bool,
    pub list_ms: f64,
    pub error: Option<String>,
}

/// Reads the cluster's state from PostgreSQL at `postgres_url`, and probes
/// the object store at `store_url` (a listing) when given.
pub async fn info(
    postgres_url: &str,
    store_url: Option<&str>,
) -> Result<ClusterInfo, ClusterError> {
    let target = super::pg::target(postgres_url)?;
    let mut pg = target.config.clone();
    let theirs = pg.get_options().unwrap_or_default().to_string();
    pg.options(format!("{theirs} -c default_transaction_read_only=on").trim());
    let (client, conn) = pg.connect(target.tls.clone()).await?;
    let conn = tokio::spawn(conn);
    let started = Instant::now();
    let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    let round_trip_ms = started.elapsed().as_secs_f64() * 1000.0;
    let meta = client
        .query(
            "SELECT key, value FROM oncelog_meta WHERE key IN ('cluster_id', 'schema_version')",
            &[],
        )
        .await
        .map_err(|e| {
            if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) {
                ClusterError::Config(format!(
                    "{} is not an oncelog cluster's database (no oncelog_meta table)",
                    target.shown
                ))
            } else {
                e.into()
            }
        })?;
    let value = |k: &str| {
        meta.iter()
            .find(|r| r.get::<_, String>(0) == k)
            .map(|r| r.get::<_, String>(1))
            .unwrap_or_default()
    };
    let brokers = client
        .query(
            "SELECT id, session, host, port, lease_expires_at > clock_timestamp(), \
               (extract(epoch from (lease_expires_at - clock_timestamp())) * 1000)::bigint, \
               (extract(epoch from (clock_timestamp() - renewed_at)) * 1000)::bigint, \
               (extract(epoch from (clock_timestamp() - registered_at)) * 1000)::bigint \
             FROM brokers ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(|r| BrokerInfo {
            id: r.get(0),
            session: r.get(1),
            address: format!("{}:{}", r.get::<_, String>(2), r.get::<_, i32>(3)),
            live: r.get(4),
            lease_left_ms: r.get(5),
            renewed_ms_ago: r.get(6),
            registered_ms_ago: r.get(7),
        })
        .collect();
    let counts = client
        .query_one(
            "SELECT (SELECT count(*) FROM topics), (SELECT count(*) FROM partitions), \
               (SELECT coalesce(sum(next_offset), 0)::bigint FROM partitions), \
               (SELECT count(*) FROM transactions WHERE meta->>'state' = 'Ongoing'), \
               (SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint \
                  - min((meta->>'start_ms')::bigint) FROM transactions \
                WHERE meta->>'state' = 'Ongoing' AND (meta->>'start_ms')::bigint >= 0), \
               (SELECT count(*) FROM group_pending_offsets), \
               (SELECT count(*) FROM objects), \
               (SELECT coalesce(sum(size), 0)::bigint FROM objects), \
               (SELECT count(*) FROM object_slabs) + (SELECT count(*) FROM object_intents)",
            &[],
        )
        .await?;
    let groups = client
        .query(
            "SELECT o.group_id, o.broker_id, o.session, EXISTS (SELECT 1 FROM brokers b \
               WHERE b.id = o.broker_id AND b.session = o.session \
                 AND b.lease_expires_at > clock_timestamp()) \
             FROM group_owners o ORDER BY o.group_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| GroupInfo {
            group: r.get(0),
            coordinator: r.get(1),
            session: r.get(2),
            live: r.get(3),
        })
        .collect();
    let jobs = super::jobs::job_rows(&client).await?;
    drop(client);
    let _ = conn.await;
    let object_store = match store_url {
        None => None,
        // A shared directory that is not there is reported, not created.
        Some(url)
            if url
                .strip_prefix("file://")
                .is_some_and(|dir| !std::path::Path::new(dir).is_dir()) =>
        {
            Some(StoreHealth {
                store: url.to_string(),
                ok: false,
                list_ms: 0.0,
                error: Some("no such directory".into()),
            })
        }
        Some(url) => Some(match Objects::from_url(url) {
            Ok(objects) => {
                let started = Instant::now();
                let probe = objects.probe().await;
                StoreHealth {
                    store: objects.describe.clone(),
                    ok: probe.is_ok(),
                    list_ms: started.elapsed().as_secs_f64() * 1000.0,
                    error: probe.err().map(|e| e.to_string()),
                }
            }
            Err(e) => StoreHealth {
                store: url.to_string(),
                ok: false,
                list_ms: 0.0,
                error: Some(e.to_string()),
            },
        }),
    };
    Ok(ClusterInfo {
        cluster_id: value("cluster_id"),
        schema_version: value("schema_version"),
        postgres: PostgresHealth {
            server_version: version,
            round_trip_ms,
        },
        brokers,
        topics: counts.get(0),
        partitions: counts.get(1),
        offsets: counts.get(2),
        open_transactions: counts.get(3),
        oldest_open_transaction_ms: counts.get(4),
        groups,
        jobs,
        pending_transactional_offsets: counts.get(5),
        objects: counts.get(6),
        object_bytes: counts.get(7),
        key_slabs: counts.get(8),
        object_store,
    })
}
