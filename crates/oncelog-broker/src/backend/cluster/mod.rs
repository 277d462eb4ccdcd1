//! Cluster mode's storage backend (docs/cluster.md): every sequencing
//! decision is one PostgreSQL transaction; record batches live in an object
//! store (S3 API, or a shared directory through `file://`).
//!
//! * [`binding`]: the object store's marker, which binds it to its cluster.
//! * [`outage`]: PostgreSQL unreachable, said once a minute.
//! * [`pg`]: the PostgreSQL URL and its TLS settings (`sslmode`).
//! * [`schema`]: the tables, created (idempotently) at connect.
//! * [`objects`]: the object store named by a URL, and the cache of batches.
//! * [`session`]: a broker's registration, session number and lease.
//! * [`catalogue`]: topics and partitions.
//! * [`sequencer`]: the produce commit (offsets, idempotence, fencing token).
//! * [`flusher`]: gathers produce requests into one object and one commit.
//! * [`reader`]: fetch from the batch index and object byte ranges.
//! * [`collector`]: removes objects that no committed row names.
//! * [`jobs`]: background jobs one broker holds a lease for: [`retention`]
//!   and [`compactor`].

pub mod binding;
pub mod catalogue;
pub mod collector;
pub mod compactor;
pub mod cutover;
pub mod describe;
pub mod ends;
pub mod expiry;
pub mod flusher;
pub mod front;
pub mod gates;
pub mod groups;
pub mod history;
pub mod info;
pub mod jobs;
pub mod keys;
pub mod lineage;
pub mod membership;
pub mod merger;
pub mod objects;
pub mod outage;
pub mod pg;
pub mod reader;
pub mod records;
pub mod retention;
pub mod scheduler;
pub mod schema;
pub mod security;
pub mod sequencer;
pub mod session;
pub mod txn;
pub mod verify_record;
pub mod writers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

pub use objects::{BatchCache, Objects};
pub use session::Session;

/// What `oncelog serve --cluster … --object-store …` is given.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// `postgres://user@host:port/db`.
    pub postgres_url: String,
    /// `s3://bucket/prefix` or `file:///dir`.
    pub object_store_url: String,
    pub broker_id: i32,
    /// Where clients reach this broker (Metadata).
    pub advertised_host: String,
    pub advertised_port: i32,
    /// Every listener's name and advertised address (Metadata answers a
    /// client with the addresses of the listener it came on).
    pub listeners: Vec<(String, String, i32)>,
    /// How long a broker's lease lasts without renewal (PostgreSQL's clock).
    pub lease: Duration,
    /// How long the flusher gathers produce requests (`cluster.flush.ms`).
    pub flush_interval: Duration,
    /// A flush starts early once it holds this many bytes (`cluster.flush.bytes`).
    pub flush_bytes: usize,
    /// Bytes of batches kept in memory for fetches (`cluster.cache.bytes`).
    pub cache_bytes: usize,
    /// How old an object intent must be before the collector may remove its
    /// object (`cluster.intent.grace.ms`).
    pub intent_grace: Duration,
    /// Connections to PostgreSQL.
    pub pool_size: usize,
    /// How long an object PUT may take before its flush fails
    /// (`cluster.put.timeout.ms`).
    pub put_timeout: Duration,
    /// How long a partition's end as last read answers a fetch at the end
    /// without an announcement (`cluster.fetch.end.fresh.ms`; zero: never).
    pub end_fresh_for: Duration,
}

impl ClusterConfig {
    pub fn new(postgres_url: &str, object_store_url: &str, broker_id: i32) -> Self {
        Self {
            postgres_url: postgres_url.to_string(),
            object_store_url: object_store_url.to_string(),
            broker_id,
            advertised_host: "127.0.0.1".to_string(),
            advertised_port: 9092,
            listeners: Vec::new(),
            lease: Duration::from_secs(10),
            flush_interval: Duration::from_millis(5),
            flush_bytes: 4 << 20,
            cache_bytes: 256 << 20,
            intent_grace: Duration::from_secs(120),
            pool_size: 16,
            put_timeout: Duration::from_secs(10),
            end_fresh_for: ends::FRESH_FOR,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("PostgreSQL connection pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("object store: {0}")]
    Objects(#[from] object_store::Error),
    /// A PUT was not answered within `cluster.put.timeout.ms`.
    #[error(
        "object store: the PUT of {key} was not answered in {after_ms} ms (cluster.put.timeout.ms)"
    )]
    PutTimeout { key: String, after_ms: u64 },
    #[error("bad cluster setting: {0}")]
    Config(String),
    /// This broker's session is not the current one, or its lease ended:
    /// nothing it commits may be acknowledged.
    #[error(
        "broker {broker_id} session {session} is fenced (lease ended or a newer session exists)"
    )]
    Fenced { broker_id: i32, session: i64 },
    /// No renewal of this broker's lease reached PostgreSQL for three
    /// quarters of a lease ([`session::Session::is_live`]): it may have
    /// ended, so nothing held in memory is served.
    #[error(
        "broker {broker_id} session {session} cannot prove its lease: no renewal reached PostgreSQL \
         for three quarters of a lease"
    )]
    LeaseUnproven { broker_id: i32, session: i64 },
    /// Another broker registered with this broker's node id after its lease
    /// ended: this one must stop.
    #[error("node.id {broker_id} was taken over by another broker at {by}, after this broker's lease ended")]
    Replaced { broker_id: i32, by: String },
    /// Another broker coordinates this group (or took it over).
    #[error("group {0} is coordinated by another broker")]
    NotCoordinator(String),
    /// PostgreSQL's next offset of a partition is below one this broker saw
    /// committed: the database lost acknowledged commits.
    #[error(
        "partition {partition} of topic id {topic_id}: PostgreSQL's next offset is {database}, \
         below {seen}, which this broker saw committed: the database lost acknowledged commits \
         (an asynchronous standby promoted, or a backup restored); the partition is not served \
         rather than hand out those offsets again (docs/cluster.md, \"PostgreSQL settings\")"
    )]
    Behind {
        topic_id: uuid::Uuid,
        partition: i32,
        database: i64,
        seen: i64,
    },
    /// The object's key is in no slab of the committing session, or its
    /// slab is being collected: its commit must fail.
    #[error("object {0} was collected before its commit")]
    IntentGone(String),
    #[error("{0}")]
    Invariant(String),
}

impl ClusterError {
    /// Whether a client may retry what failed (every storage failure is).
    pub fn retriable(&self) -> bool {
        !matches!(self, ClusterError::Config(_) | ClusterError::Invariant(_))
    }
}

/// A connection pool to PostgreSQL. Every connection's session is bounded
/// by the lease ([`session_options`]).
pub fn pool(target: &pg::Target, size: usize, lease: Duration) -> Result<Pool, ClusterError> {
    let mut pg = target.config.clone();
    let options = match pg.get_options() {
        Some(theirs) if !theirs.trim().is_empty() => {
            format!("{theirs} {}", session_options(lease))
        }
        _ => session_options(lease),
    };
    pg.options(&options);
    let mgr = Manager::from_config(
        pg,
        target.tls.clone(),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(mgr)
        .max_size(size.max(2))
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(5)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| ClusterError::Config(format!("connection pool: {e}")))
}

/// The server settings of a broker's connections. A broker stopped (SIGSTOP,
/// a long pause) inside a transaction holds row locks every other broker's
/// commits to those partitions wait on: PostgreSQL ends such a transaction
/// once it has been idle for the lease, when the broker's commits are fenced
/// anyway. No statement runs longer than three leases (at least 30 s): a
/// commit stuck behind a lock is answered with a retriable error instead.
pub fn session_options(lease: Duration) -> String {
    let idle = lease.as_millis().max(1000);
    let statement = (lease.as_millis() * 3).max(30_000);
    format!("-c idle_in_transaction_session_timeout={idle} -c statement_timeout={statement}")
}

/// One broker's handle on the cluster: its PostgreSQL pool, object store,
/// session, batch cache.
pub struct Cluster {
    pub config: ClusterConfig,
    /// PostgreSQL's address and TLS settings, for connections outside the pool.
    pub pg: pg::Target,
    /// Whether PostgreSQL is reachable, said once a minute when it is not.
    pub outage: outage::Outage,
    pub pool: Pool,
    pub objects: Objects,
    pub session: Session,
    pub cache: BatchCache,
    /// The keys of the objects this broker writes.
    pub keys: keys::Keys,
    /// Whether another broker is live (as of the last refresh): a broker
    /// alone announces its commits to nobody, so it does not send them.
    pub peers: std::sync::atomic::AtomicBool,
    /// Woken when a partition's high watermark moves (a commit of ours, or
    /// another broker's through NOTIFY), for long-poll fetches.
    pub data_notify: tokio::sync::Notify,
    /// Woken when a topic is created or deleted (by any broker), or the
    /// announcements may have been missed (one waiter: the catalogue copy's
    /// refresh, woken with `notify_one` so a change during a refresh counts).
    pub catalogue_notify: tokio::sync::Notify,
    /// The highest next offset seen per partition (from commits and NOTIFY).
    known: Mutex<HashMap<(uuid::Uuid, i32), i64>>,
    /// Partitions' offsets as last read, answering fetches at the end.
    pub ends: ends::Ends,
    /// This broker's commits' new offsets, for [`announce`] to tell the
    /// other brokers.
    announcements: tokio::sync::mpsc::UnboundedSender<Vec<sequencer::Advanced>>,
    /// The partitions found behind what this broker saw ([`Self::check_next`]),
    /// said once each.
    behind: Mutex<std::collections::HashSet<(uuid::Uuid, i32)>>,
}

impl Cluster {
    /// Connects, creates the schema if it is missing, and registers this
    /// broker with a new session.
    pub async fn connect(config: ClusterConfig) -> Result<Arc<Self>, ClusterError> {
        let pg = pg::target(&config.postgres_url)?;
        let pool = pool(&pg, config.pool_size, config.lease)?;
        schema::migrate(&pool).await?;
        let objects =
            Objects::from_url(&config.object_store_url)?.with_put_timeout(config.put_timeout);
        let cluster_id = schema::cluster_id(&pool).await?;
        binding::check(&objects, &pool, &cluster_id).await?;
        let session = Session::register(&pool, &config).await?;
        let cache = BatchCache::new(config.cache_bytes);
        let (announcements, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(announce(pool.clone(), rx));
        let keys = keys::Keys::new(config.broker_id);
        let ends = ends::Ends::new(config.end_fresh_for);
        Ok(Arc::new(Self {
            config,
            outage: outage::Outage::new(&pg.config),
            pg,
            pool,
            objects,
            session,
            cache,
            keys,
            peers: std::sync::atomic::AtomicBool::new(true),
            data_notify: tokio::sync::Notify::new(),
            catalogue_notify: tokio::sync::Notify::new(),
            known: Mutex::new(HashMap::new()),
            ends,
            behind: Mutex::new(Default::default()),
            announcements,
        }))
    }

    /// After a commit of this broker's: records the high watermarks that
    /// moved, wakes this broker's waiting fetches, and has the other brokers
    /// told ([`announce`]).
    pub fn committed(&self, moved: &[sequencer::Advanced]) {
        if moved.is_empty() {
            return;
        }
        self.advanced(moved);
        if self.has_peers() {
            let _ = self.announcements.send(moved.to_vec());
        }
    }

    /// Whether another broker was live at the last refresh.
    pub fn has_peers(&self) -> bool {
        self.peers.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records high watermarks that moved and wakes waiting fetches.
    pub fn advanced(&self, moved: &[sequencer::Advanced]) {
        {
            let mut k = self.known.lock().unwrap_or_else(|p| p.into_inner());
            for a in moved {
                let e = k.entry((a.topic_id, a.partition)).or_insert(0);
                *e = (*e).max(a.next_offset);
            }
        }
        self.data_notify.notify_waiters();
    }

    /// `Err(Behind)` when PostgreSQL's next offset of a partition,
    /// `database`, is below the highest this broker saw committed: the
    /// database lost acknowledged commits, and offsets handed out from it
    /// would be handed out twice. Every reader and writer of a partition's
    /// offsets asks this first, so the partition is not served; the first
    /// finding is logged as an error.
    ///
    /// For a value read under the partition row's lock (`FOR UPDATE`): no
    /// commit this broker can have seen is newer than it. A value read
    /// without the lock comes from a snapshot that may predate a commit
    /// announced since: that takes [`Self::check_next_since`].
    pub fn check_next(
        &self,
        topic_id: &uuid::Uuid,
        partition: i32,
        database: i64,
    ) -> Result<(), ClusterError> {
        self.check_next_since(
            topic_id,
            partition,
            database,
            self.known_next_offset(topic_id, partition),
        )
    }

    /// [`Self::check_next`] against `seen`, what
    /// [`Self::known_next_offset`] said before the read of `database`
    /// began: every commit seen by then is in the read's snapshot.
    pub fn check_next_since(
        &self,
        topic_id: &uuid::Uuid,
        partition: i32,
        database: i64,
        seen: i64,
    ) -> Result<(), ClusterError> {
        if database >= seen {
            return Ok(());
        }
        let e = ClusterError::Behind {
            topic_id: *topic_id,
            partition,
            database,
            seen,
        };
        let first = self
            .behind
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((*topic_id, partition));
        if first {
            tracing::error!(%topic_id, partition, database, seen, error = %e, "cluster: a partition went back");
        }
        Err(e)
    }

    /// A read found a partition's next offset at `next`: the check of
    /// later reads and writes ([`Self::check_next`]) holds the database to
    /// it, as to the commits this broker saw. Wakes no long poll (a read
    /// is not new data).
    pub fn saw_next(&self, topic_id: &uuid::Uuid, partition: i32, next: i64) {
        let mut k = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let e = k.entry((*topic_id, partition)).or_insert(0);
        *e = (*e).max(next);
    }

    /// The highest next offset this broker has seen for a partition (a lower
    /// bound of its high watermark; 0 when it saw none).
    pub fn known_next_offset(&self, topic_id: &uuid::Uuid, partition: i32) -> i64 {
        let k = self.known.lock().unwrap_or_else(|p| p.into_inner());
        k.get(&(*topic_id, partition)).copied().unwrap_or(0)
    }
}

/// How long [`announce`] gathers commits into one NOTIFY.
const ANNOUNCE_WINDOW: std::time::Duration = std::time::Duration::from_millis(2);

/// Tells the other brokers (their LISTEN tasks) where this broker's commits
/// moved partitions' offsets, after the commits and coalesced: one NOTIFY
/// for every commit of a couple of milliseconds, each partition at its
/// newest offset. A NOTIFY inside each data commit would take PostgreSQL's
/// one instance-wide notification lock at every commit, serialising every
/// produce and EndTxn commit of the cluster. A lost NOTIFY (a crash after
/// the commit, PostgreSQL unreachable) costs only a wake-up: a long poll
/// reads PostgreSQL again when its wait ends.
async fn announce(
    pool: Pool,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Vec<sequencer::Advanced>>,
) {
    let mut latest: std::collections::BTreeMap<(uuid::Uuid, i32), i64> = Default::default();
    while let Some(first) = rx.recv().await {
        let mut merge = |moved: Vec<sequencer::Advanced>| {
            for a in moved {
                let e = latest.entry((a.topic_id, a.partition)).or_insert(0);
                *e = (*e).max(a.next_offset);
            }
        };
        merge(first);
        tokio::time::sleep(ANNOUNCE_WINDOW).await;
        while let Ok(more) = rx.try_recv() {
            merge(more);
        }
        let moved: Vec<sequencer::Advanced> = std::mem::take(&mut latest)
            .into_iter()
            .map(|((topic_id, partition), next_offset)| sequencer::Advanced {
                topic_id,
                partition,
                next_offset,
            })
            .collect();
        let payload = sequencer::notify_payload(&moved);
        let sent = async {
            let c = pool.get().await?;
            let st = c.prepare_cached("SELECT pg_notify($1, $2)").await?;
            c.execute(&st, &[&sequencer::DATA_CHANNEL, &payload])
                .await?;
            Ok::<_, ClusterError>(())
        };
        if let Err(e) = sent.await {
            tracing::debug!(error = %e, "cluster: the announcement of new offsets was not sent");
        }
    }
}
