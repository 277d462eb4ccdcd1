//! A broker's registration: every start is a new session of its id, with a
//! lease in PostgreSQL's clock. `(broker id, session)` is the fencing token
//! that every commit checks ([`check_fence`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::GenericClient;

use super::{ClusterConfig, ClusterError};

/// This broker's current session.
#[derive(Debug)]
pub struct Session {
    pub broker_id: i32,
    session: AtomicI64,
    /// False once a renewal found the lease ended (until a new registration).
    live: AtomicBool,
    lease_ms: i64,
    host: String,
    port: i32,
    /// Every listener's advertised address, by listener name.
    listeners: serde_json::Value,
}

/// A registered broker, as `brokers` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRow {
    pub id: i32,
    pub session: i64,
    pub host: String,
    pub port: i32,
    /// Milliseconds until the lease ends (negative: ended that long ago).
    pub lease_left_ms: i64,
    /// Each listener's advertised address, by listener name (empty for a
    /// broker that registered none: `host` and `port` then stand for all).
    pub listeners: BTreeMap<String, (String, i32)>,
}

impl BrokerRow {
    /// Whether a client that came in on the listener `name` can reach this
    /// broker: it has a listener of that name (a broker that registered no
    /// names stands on `host` and `port` for every listener).
    pub fn serves(&self, name: &str) -> bool {
        self.listeners.is_empty() || self.listeners.contains_key(name)
    }

    /// The address a client on the listener `name` reaches this broker at:
    /// its listener of that name, as Kafka answers each listener with its
    /// own addresses. Only for a broker that [`serves`](Self::serves) it
    /// (`host` and `port` otherwise, which a caller must not hand out).
    pub fn address(&self, name: &str) -> (String, i32) {
        self.listeners
            .get(name)
            .cloned()
            .unwrap_or_else(|| (self.host.clone(), self.port))
    }
}

impl Session {
    /// Registers `config.broker_id` with a new session number.
    pub async fn register(pool: &Pool, config: &ClusterConfig) -> Result<Self, ClusterError> {
        let lease_ms = i64::try_from(config.lease.as_millis()).unwrap_or(i64::MAX);
        let s = Self {
            broker_id: config.broker_id,
            session: AtomicI64::new(0),
            live: AtomicBool::new(false),
            lease_ms,
            host: config.advertised_host.clone(),
            port: config.advertised_port,
            listeners: serde_json::to_value(
                config
                    .listeners
                    .iter()
                    .map(|(n, h, p)| (n.clone(), (h.clone(), *p)))
                    .collect::<BTreeMap<_, _>>(),
            )
            .unwrap_or_default(),
        };
        s.reregister(pool).await?;
        Ok(s)
    }

    /// Takes a new session: any commit of an earlier one fails from now on.
    pub async fn reregister(&self, pool: &Pool) -> Result<i64, ClusterError> {
        let client = pool.get().await?;
        let row = client
            .query_one(
                "INSERT INTO brokers (id, session, host, port, lease_expires_at, registered_at, renewed_at, \
                   listeners) \
                 VALUES ($1, 1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond', \
                         clock_timestamp(), clock_timestamp(), $5) \
                 ON CONFLICT (id) DO UPDATE SET session = brokers.session + 1, host = EXCLUDED.host, \
                   port = EXCLUDED.port, lease_expires_at = EXCLUDED.lease_expires_at, \
                   listeners = EXCLUDED.listeners, \
                   registered_at = EXCLUDED.registered_at, renewed_at = EXCLUDED.renewed_at \
                 RETURNING session",
                &[
                    &self.broker_id,
                    &self.host,
                    &self.port,
                    &(self.lease_ms as f64),
                    &self.listeners,
                ],
            )
            .await?;
        let session: i64 = row.get(0);
        self.session.store(session, Ordering::Release);
        self.live.store(true, Ordering::Release);
        Ok(session)
    }

    pub fn session(&self) -> i64 {
        self.session.load(Ordering::Acquire)
    }

    /// Whether the last renewal kept the lease.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Extends the lease if it has not ended. `Err(Fenced)` when it had: the
    /// broker must stop acknowledging and [`Self::reregister`].
    pub async fn renew(&self, pool: &Pool) -> Result<(), ClusterError> {
        let session = self.session();
        let client = pool.get().await?;
        let n = client
            .execute(
                "UPDATE brokers SET lease_expires_at = clock_timestamp() + $3 * interval '1 millisecond', \
                   renewed_at = clock_timestamp() \
                 WHERE id = $1 AND session = $2 AND lease_expires_at > clock_timestamp()",
                &[&self.broker_id, &session, &(self.lease_ms as f64)],
            )
            .await?;
        if n == 0 {
            self.live.store(false, Ordering::Release);
            return Err(ClusterError::Fenced {
                broker_id: self.broker_id,
                session,
            });
        }
        self.live.store(true, Ordering::Release);
        Ok(())
    }

    /// Renews every third of the lease, re-registering when it was lost,
    /// until the task is dropped.
    pub async fn keep_alive(&self, pool: &Pool) {
        let every = Duration::from_millis((self.lease_ms / 3).max(50) as u64);
        loop {
            tokio::time::sleep(every).await;
            match self.renew(pool).await {
                Ok(()) => {}
                Err(ClusterError::Fenced { session, .. }) => {
                    tracing::warn!(
                        broker = self.broker_id,
                        session,
                        "cluster: the lease ended before it was renewed; registering a new session"
                    );
                    if let Err(e) = self.reregister(pool).await {
                        tracing::warn!(error = %e, "cluster: re-registering failed");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cluster: renewing the lease failed");
                }
            }
        }
    }
}

/// Inside a commit's transaction: holds this broker's row `FOR SHARE` if its
/// session is current and its lease live (PostgreSQL's clock). An expiry or
/// a new session updates the row, so it waits for commits holding it, and
/// none of the old session's commits can pass this check after it.
pub async fn check_fence(
    tx: &impl GenericClient,
    broker_id: i32,
    session: i64,
) -> Result<(), ClusterError> {
    let row = tx
        .query_opt(
            "SELECT 1 FROM brokers WHERE id = $1 AND session = $2 \
             AND lease_expires_at > clock_timestamp() FOR SHARE",
            &[&broker_id, &session],
        )
        .await?;
    match row {
        Some(_) => Ok(()),
        None => Err(ClusterError::Fenced { broker_id, session }),
    }
}

/// Every registered broker, live or not.
pub async fn brokers(pool: &Pool) -> Result<Vec<BrokerRow>, ClusterError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT id, session, host, port, \
               (extract(epoch from (lease_expires_at - clock_timestamp())) * 1000)::bigint, \
               listeners \
             FROM brokers ORDER BY id",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| BrokerRow {
            id: r.get(0),
            session: r.get(1),
            host: r.get(2),
            port: r.get(3),
            lease_left_ms: r.get(4),
            listeners: serde_json::from_value(r.get(5)).unwrap_or_default(),
        })
        .collect())
}

/// The brokers whose lease has not ended.
pub async fn live_brokers(pool: &Pool) -> Result<Vec<BrokerRow>, ClusterError> {
    Ok(brokers(pool)
        .await?
        .into_iter()
        .filter(|b| b.lease_left_ms > 0)
        .collect())
}
