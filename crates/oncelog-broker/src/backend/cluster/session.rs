//! A broker's registration: every start is a new session of its id, with a
//! lease in PostgreSQL's clock. `(broker id, session)` is the fencing token
//! that every commit checks ([`check_fence`]).
//!
//! A node id belongs to one running broker. Each process has an
//! [`incarnation`] (a random id) stored in its row: a broker that finds its
//! id's lease held by another incarnation watches the row for half a lease;
//! if the holder renews, it is alive, and this broker refuses to start and
//! names it; if not, the holder died (kill -9, a lost host) and its id is
//! taken over (its session fenced). A broker whose row was taken over stops
//! ([`Session::stopped`]) instead of taking it back. A broker given no
//! `node.id` is assigned one the cluster never used ([`assign_id`]).
//!
//! The lease is kept in PostgreSQL's clock, but a broker cut off from
//! PostgreSQL cannot read that clock. So it keeps its own deadline on its
//! monotonic clock: a renewal (or registration) sent at local instant `t`
//! moves PostgreSQL's expiry to at least `t + lease`, and the broker counts
//! itself live only until `t + lease × 3/4` ([`Session::is_live`]). Past that
//! it stops serving what it holds in memory (group membership) until a
//! renewal reaches PostgreSQL again, so no other broker can have claimed
//! those groups while it still answers for them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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
    /// Until when this broker may count its lease as held, in ms of
    /// [`monotonic_ms`]: three quarters of a lease after the last successful
    /// renewal was sent.
    live_until_ms: AtomicU64,
    /// Whether the last [`Self::is_live`] found the local deadline passed
    /// (to say so once, not on every request).
    lapsed: AtomicBool,
    lease_ms: i64,
    host: String,
    port: i32,
    /// Every listener's advertised address, by listener name.
    listeners: serde_json::Value,
    /// Set (with the reason) when another broker took this broker's id: it
    /// must stop serving.
    stopped: tokio::sync::watch::Sender<Option<String>>,
}

/// This process's incarnation, stored in its broker row.
pub fn incarnation() -> uuid::Uuid {
    static ID: OnceLock<uuid::Uuid> = OnceLock::new();
    *ID.get_or_init(uuid::Uuid::new_v4)
}

/// Milliseconds on this process's monotonic clock (since its first call).
fn monotonic_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Any number that no other user of the database takes as advisory lock.
const ASSIGN_LOCK: i64 = 0x6f6e_6365_6c6f_6702;

/// A node id for a broker started without `node.id`: one more than the
/// highest id the cluster has seen, so an id is never handed out twice
/// (a restarted broker without `node.id` is a new node). The row is made
/// with this process's incarnation and an ended lease, so [`Session::register`]
/// takes it at once and nothing lists it before then.
pub async fn assign_id(pool: &Pool) -> Result<i32, ClusterError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ASSIGN_LOCK])
        .await?;
    let id: i32 = tx
        .query_one("SELECT COALESCE(max(id), 0) + 1 FROM brokers", &[])
        .await?
        .get(0);
    tx.execute(
        "INSERT INTO brokers (id, session, host, port, lease_expires_at, registered_at, renewed_at, \
           incarnation) \
         VALUES ($1, 0, '', 0, clock_timestamp(), clock_timestamp(), clock_timestamp(), $2)",
        &[&id, &incarnation()],
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// What a broker row says of the broker holding it.
struct Holder {
    incarnation: Option<uuid::Uuid>,
    live: bool,
    address: String,
    renewed_at_us: i64,
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
    /// Registers `config.broker_id` with a new session number, once no
    /// other live broker holds it (see the module's doc).
    pub async fn register(pool: &Pool, config: &ClusterConfig) -> Result<Self, ClusterError> {
        let lease_ms = i64::try_from(config.lease.as_millis()).unwrap_or(i64::MAX);
        let s = Self {
            broker_id: config.broker_id,
            session: AtomicI64::new(0),
            live: AtomicBool::new(false),
            live_until_ms: AtomicU64::new(0),
            lapsed: AtomicBool::new(false),
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
            stopped: tokio::sync::watch::channel(None).0,
        };
        s.claim(pool).await?;
        Ok(s)
    }

    /// Takes this broker's id: at once when its row is free, ours, or its
    /// lease ended; after half a lease without a renewal when another
    /// incarnation holds it; never when that holder renews meanwhile.
    async fn claim(&self, pool: &Pool) -> Result<i64, ClusterError> {
        let watch_for = Duration::from_millis((self.lease_ms / 2).max(1000) as u64);
        let mut first_seen: Option<(i64, Instant)> = None;
        loop {
            let mut client = pool.get().await?;
            let tx = client.transaction().await?;
            let holder = tx
                .query_opt(
                    "SELECT incarnation, lease_expires_at > clock_timestamp(), host || ':' || port, \
                       (extract(epoch from renewed_at) * 1000000)::bigint \
                     FROM brokers WHERE id = $1 FOR UPDATE",
                    &[&self.broker_id],
                )
                .await?
                .map(|r| Holder {
                    incarnation: r.get(0),
                    live: r.get(1),
                    address: r.get(2),
                    renewed_at_us: r.get(3),
                });
            let take = match &holder {
                None => true,
                Some(h) if h.incarnation == Some(incarnation()) || !h.live => true,
                Some(h) => match first_seen {
                    None => {
                        tracing::info!(
                            broker = self.broker_id,
                            holder = %h.address,
                            "cluster: node.id {} has a live lease (held by {}); watching whether \
                             that broker still renews it",
                            self.broker_id,
                            h.address
                        );
                        first_seen = Some((h.renewed_at_us, Instant::now()));
                        false
                    }
                    Some((renewed, _)) if h.renewed_at_us != renewed => {
                        return Err(ClusterError::Config(format!(
                            "node.id {} is held by a live broker at {} (it renews its lease): \
                             give this broker another node.id (or none, to be assigned one), \
                             or stop that broker first",
                            self.broker_id, h.address
                        )));
                    }
                    Some((_, since)) if since.elapsed() >= watch_for => {
                        tracing::warn!(
                            broker = self.broker_id,
                            holder = %h.address,
                            "cluster: taking over node.id {} from the broker at {}, which stopped \
                             renewing its lease (its session is fenced)",
                            self.broker_id,
                            h.address
                        );
                        true
                    }
                    Some(_) => false,
                },
            };
            if take {
                let sent = monotonic_ms();
                let session = self.write_row(&*tx, sent).await?;
                tx.commit().await?;
                return Ok(session);
            }
            drop(tx);
            drop(client);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Makes the row this incarnation's, with a new session and a fresh lease
    /// (counted locally from `sent`, an instant before the statement).
    async fn write_row(&self, tx: &impl GenericClient, sent: u64) -> Result<i64, ClusterError> {
        let row = tx
            .query_one(
                "INSERT INTO brokers (id, session, host, port, lease_expires_at, registered_at, renewed_at, \
                   listeners, incarnation) \
                 VALUES ($1, 1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond', \
                         clock_timestamp(), clock_timestamp(), $5, $6) \
                 ON CONFLICT (id) DO UPDATE SET session = brokers.session + 1, host = EXCLUDED.host, \
                   port = EXCLUDED.port, lease_expires_at = EXCLUDED.lease_expires_at, \
                   listeners = EXCLUDED.listeners, incarnation = EXCLUDED.incarnation, \
                   registered_at = EXCLUDED.registered_at, renewed_at = EXCLUDED.renewed_at \
                 RETURNING session",
                &[
                    &self.broker_id,
                    &self.host,
                    &self.port,
                    &(self.lease_ms as f64),
                    &self.listeners,
                    &incarnation(),
                ],
            )
            .await?;
        // The other brokers' copies of the live brokers follow at once.
        tx.execute(
            "SELECT pg_notify($1, 'brokers')",
            &[&super::catalogue::CATALOGUE_CHANNEL],
        )
        .await?;
        let session: i64 = row.get(0);
        self.session.store(session, Ordering::Release);
        self.renewed(sent);
        Ok(session)
    }

    /// Takes a new session after this broker's lease ended: any commit of
    /// an earlier one fails from now on. Refused when another broker took
    /// the id meanwhile ([`ClusterError::Replaced`]).
    pub async fn reregister(&self, pool: &Pool) -> Result<i64, ClusterError> {
        let sent = monotonic_ms();
        let mut client = pool.get().await?;
        let tx = client.transaction().await?;
        let holder: Option<(Option<uuid::Uuid>, String)> = tx
            .query_opt(
                "SELECT incarnation, host || ':' || port FROM brokers WHERE id = $1 FOR UPDATE",
                &[&self.broker_id],
            )
            .await?
            .map(|r| (r.get(0), r.get(1)));
        if let Some((Some(other), by)) = holder {
            if other != incarnation() {
                return Err(ClusterError::Replaced {
                    broker_id: self.broker_id,
                    by,
                });
            }
        }
        let session = self.write_row(&*tx, sent).await?;
        tx.commit().await?;
        Ok(session)
    }

    /// A renewal sent at `sent` reached PostgreSQL: the lease is held until
    /// at least `sent + lease` there, so count it held until three quarters
    /// of that here.
    fn renewed(&self, sent: u64) {
        let until = sent + (self.lease_ms.max(0) as u64) * 3 / 4;
        self.live_until_ms.fetch_max(until, Ordering::AcqRel);
        self.live.store(true, Ordering::Release);
        if self.lapsed.swap(false, Ordering::AcqRel) {
            tracing::info!(
                broker = self.broker_id,
                session = self.session(),
                "cluster: the lease was renewed again; serving groups again"
            );
        }
    }

    /// Ends this broker's lease at once (a clean stop), so that its id is
    /// free for the next start without waiting.
    pub async fn release(&self, pool: &Pool) -> Result<(), ClusterError> {
        let client = pool.get().await?;
        client
            .execute(
                "UPDATE brokers SET lease_expires_at = clock_timestamp() \
                 WHERE id = $1 AND session = $2 AND incarnation = $3",
                &[&self.broker_id, &self.session(), &incarnation()],
            )
            .await?;
        self.live.store(false, Ordering::Release);
        let _ = client
            .execute(
                "SELECT pg_notify($1, 'brokers')",
                &[&super::catalogue::CATALOGUE_CHANNEL],
            )
            .await;
        Ok(())
    }

    /// Resolves with the reason once this broker must stop serving
    /// (another broker took its id).
    pub async fn stopped(&self) -> String {
        let mut rx = self.stopped.subscribe();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return why;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    pub fn session(&self) -> i64 {
        self.session.load(Ordering::Acquire)
    }

    /// `Ok` while [`Self::is_live`]; else `Fenced` when a renewal found
    /// the lease ended, or `LeaseUnproven` when no renewal got through in
    /// time (PostgreSQL unreachable: counted as part of the outage).
    pub fn check_live(&self) -> Result<(), ClusterError> {
        if self.is_live() {
            return Ok(());
        }
        let (broker_id, session) = (self.broker_id, self.session());
        if self.live.load(Ordering::Acquire) {
            Err(ClusterError::LeaseUnproven { broker_id, session })
        } else {
            Err(ClusterError::Fenced { broker_id, session })
        }
    }

    /// Whether this broker can prove it still holds its lease: the last
    /// renewal kept it, and was sent less than three quarters of a lease ago
    /// on this broker's monotonic clock (see the module's doc).
    pub fn is_live(&self) -> bool {
        if !self.live.load(Ordering::Acquire) {
            return false;
        }
        if monotonic_ms() < self.live_until_ms.load(Ordering::Acquire) {
            return true;
        }
        if !self.lapsed.swap(true, Ordering::AcqRel) {
            tracing::error!(
                broker = self.broker_id,
                session = self.session(),
                lease_ms = self.lease_ms,
                "cluster: no renewal of this broker's lease reached PostgreSQL for three quarters \
                 of a lease; it stops coordinating groups until one does (another broker may \
                 take them over once the lease ends)"
            );
        }
        false
    }

    /// Extends the lease if it has not ended. `Err(Fenced)` when it had: the
    /// broker must stop acknowledging and [`Self::reregister`].
    pub async fn renew(&self, pool: &Pool) -> Result<(), ClusterError> {
        let session = self.session();
        let sent = monotonic_ms();
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
        self.renewed(sent);
        Ok(())
    }

    /// Renews every third of the lease, re-registering when it was lost,
    /// until the task is dropped.
    pub async fn keep_alive(&self, pool: &Pool, outage: &super::outage::Outage) {
        let every = Duration::from_millis((self.lease_ms / 3).max(50) as u64);
        loop {
            tokio::time::sleep(every).await;
            match self.renew(pool).await {
                Ok(()) => outage.reached(),
                Err(ClusterError::Fenced { session, .. }) => {
                    outage.reached();
                    tracing::warn!(
                        broker = self.broker_id,
                        session,
                        "cluster: the lease ended before it was renewed; registering a new session"
                    );
                    match self.reregister(pool).await {
                        Ok(_) => {}
                        Err(e @ ClusterError::Replaced { .. }) => {
                            tracing::error!(error = %e, "cluster: this broker stops");
                            self.stopped.send_replace(Some(e.to_string()));
                            return;
                        }
                        Err(e) => {
                            crate::backend::cluster::outage::cluster_warn!(outage, e, error = %e, "cluster: re-registering failed")
                        }
                    }
                }
                Err(e) => {
                    crate::backend::cluster::outage::cluster_warn!(outage, e, error = %e, "cluster: renewing the lease failed");
                }
            }
        }
    }
}

/// The fencing check's statement: a row when the session `$2` of broker `$1`
/// is current and its lease live, held `FOR SHARE`.
pub const FENCE_SQL: &str = "SELECT 1 FROM brokers WHERE id = $1 AND session = $2 \
     AND lease_expires_at > clock_timestamp() FOR SHARE";

/// Inside a commit's transaction: holds this broker's row `FOR SHARE` if its
/// session is current and its lease live (PostgreSQL's clock). An expiry or
/// a new session updates the row, so it waits for commits holding it, and
/// none of the old session's commits can pass this check after it.
pub async fn check_fence(
    tx: &impl GenericClient,
    broker_id: i32,
    session: i64,
) -> Result<(), ClusterError> {
    let row = tx.query_opt(FENCE_SQL, &[&broker_id, &session]).await?;
    match row {
        Some(_) => Ok(()),
        None => Err(ClusterError::Fenced { broker_id, session }),
    }
}

/// Every registered broker, live or not.
pub async fn brokers(pool: &Pool) -> Result<Vec<BrokerRow>, ClusterError> {
    brokers_on(&*pool.get().await?).await
}

/// [`brokers`] on a connection of the caller's (the refresh pipelines it
/// with its other reads).
pub async fn brokers_on(
    client: &deadpool_postgres::ClientWrapper,
) -> Result<Vec<BrokerRow>, ClusterError> {
    // prepared once per connection: every broker runs this every second
    let st = client
        .prepare_cached(
            "SELECT id, session, host, port, \
               (extract(epoch from (lease_expires_at - clock_timestamp())) * 1000)::bigint, \
               listeners \
             FROM brokers ORDER BY id",
        )
        .await?;
    let rows = client.query(&st, &[]).await?;
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
