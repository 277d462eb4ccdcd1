//! The oncelog broker. Its folders group it by role (no file imports one
//! that imports it back: `scripts/module_cycles.py`):
//!
//! - `protocol`: the TCP server (sockets, framing, version negotiation)
//!   and the Kafka request handlers, one module per API family, written
//!   once for both modes.
//! - `coordinators`: the drivers of the transaction and group
//!   coordinators, cut-overs and second-writer detection, which run the
//!   pure state machines in `machines` against a backend.
//! - `backend`: the storage the protocol runs over, chosen once at start
//!   ([`Mode`]): `backend::local` (the data directory: topics, partitions
//!   and their durability, the coordinators' internal logs, the cleaner) or
//!   `backend::cluster` (PostgreSQL and an object store).
//! - `security`: listeners, authentication, TLS and ACLs.
//! - `observe`: metrics, the HTTP listener, the console and the
//!   transaction history.

pub mod backend;
pub mod config;
pub mod coordinators;
pub mod error;
pub mod faults;
pub mod files;
pub mod machines;
pub mod nice;
pub mod observe;
pub mod protocol;
pub mod reference;
pub mod security;

use std::sync::Arc;

use backend::local::{compaction, datadir, durability, internal_log, partition, producer_ids};
use backend::{cluster, storage};
use coordinators::{groups, txn_service};
use machines::{cutover, names, writers};
use observe::{histogram, samples};
use security::acl;
#[cfg(feature = "tls")]
use security::tls;

use tokio::sync::Notify;

use backend::local::topics::Topics;
pub use config::BrokerConfig;
use durability::Syncer;
use error::TopicError;
pub use faults::{fail_point, injected_marker_error};

/// Wall-clock milliseconds since the epoch; the log engine's clock, so
/// that record timestamps, segment ages and coordinator deadlines agree.
pub use oncelog_log::now_ms;

/// How often transactions are checked against their timeout.
pub const TXN_REAPER_INTERVAL_MS: u64 = 1000;

/// A transaction open at a partition whose coordinator does not hold it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OrphanCandidate {
    pub topic: String,
    pub partition: i32,
    pub producer_id: i64,
    pub epoch: i16,
    pub first_offset: i64,
}

/// One partition's consumer lag for a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LagRow {
    pub topic: String,
    pub partition: i32,
    pub committed: i64,
    pub last_stable_offset: i64,
    pub high_watermark: i64,
    /// Records a read_committed consumer still has to read.
    pub lag_committed: i64,
    /// Records a read_uncommitted consumer still has to read.
    pub lag_uncommitted: i64,
}

/// Shared broker state.
/// API keys below this get a request-latency histogram.
pub const REQUEST_KEYS: usize = 128;

pub struct Broker {
    pub config: BrokerConfig,
    pub topics: Topics,
    pub producer_ids: producer_ids::ProducerIds,
    pub txn: txn_service::TxnService,
    pub groups: groups::Groups,
    pub writers: writers::Writers,
    /// Every topic's hand-over from one writer to another.
    pub cutovers: backend::local::cutovers::CutoverFile,
    /// SCRAM credentials of the users SASL listeners authenticate.
    pub users: security::ScramUsers,
    /// Authentication outcomes, for /metrics.
    pub auth_stats: security::AuthStats,
    /// ACLs and the authorizer (off unless `authorizer.class.name` is set).
    pub authz: acl::Authorizer,
    /// Open client connections and their limits.
    pub connections: Arc<security::Connections>,
    /// What Fetch's reads and long polls did, for `/metrics`.
    pub fetch_stats: protocol::FetchStats,
    /// The TLS listeners' certificates, when there are TLS listeners.
    #[cfg(feature = "tls")]
    pub tls: Option<tls::TlsServer>,
    pub syncer: Arc<Syncer>,
    /// Woken whenever a high watermark moves, for long-poll fetches.
    pub data_notify: Arc<Notify>,
    /// Bytes of record batches appended since start (for bytes-per-sync figures).
    pub appended_bytes: std::sync::atomic::AtomicU64,
    /// Orphaned transactions found by the healing check.
    pub orphans: std::sync::atomic::AtomicU64,
    /// Request latency per API key (arrival to response ready).
    pub request_latency: Box<[histogram::Histogram]>,
    /// The log cleaner of compacted topics.
    pub cleaner: Arc<compaction::LogCleaner>,
    /// Rates of the last minutes, for the console.
    pub samples: samples::Samples,
    /// What live verification found ([`coordinators::verify`]).
    pub verify: observe::verify::Verify,
    /// Pipeline lineage: committed ranges (local mode's store) and offers
    /// not settled yet ([`coordinators::verify_lineage`]).
    pub lineage: backend::lineage::LocalLineage,
    pub lineage_pending: coordinators::verify_lineage::Pending,
    /// This broker's exclusive hold on its data directory.
    _dir_lock: Option<datadir::DirLock>,
    /// The storage this broker serves from, chosen once before it is
    /// shared ([`Broker::start`]); the stores in `backend` match on it.
    pub mode: Mode,
}

/// Which backend a broker runs over (docs/cluster.md).
pub enum Mode {
    /// The data directory.
    Local,
    /// PostgreSQL and the object store, registered as this broker.
    Cluster(Arc<cluster::front::Front>),
}

/// Why a broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("opening the data directory: {0}")]
    Open(#[from] TopicError),
    #[error("starting cluster mode: {0}")]
    Cluster(#[from] cluster::ClusterError),
}

impl Broker {
    /// Opens the broker over the backend its config names: the data
    /// directory, or (with `cluster.postgres`) PostgreSQL and the object
    /// store, where it registers as `node.id` at its advertised address.
    /// The choice is made here, once, before the broker is shared.
    pub async fn start(config: BrokerConfig) -> Result<Arc<Self>, StartError> {
        let mut broker = Self::build(config)?;
        if let Some(front) = broker.connect_cluster().await? {
            broker.mode = Mode::Cluster(front);
        }
        Ok(Arc::new(broker))
    }

    /// Cluster mode's backend: connects, registers this broker and starts
    /// the cluster's jobs. `None` in local mode.
    async fn connect_cluster(
        &self,
    ) -> Result<Option<Arc<cluster::front::Front>>, cluster::ClusterError> {
        let c = &self.config;
        if c.cluster_postgres.is_empty() {
            return Ok(None);
        }
        if c.cluster_object_store.is_empty() {
            return Err(cluster::ClusterError::Config(
                "cluster.postgres is set but cluster.object.store is not (--object-store)".into(),
            ));
        }
        let mut cc =
            cluster::ClusterConfig::new(&c.cluster_postgres, &c.cluster_object_store, c.node_id);
        cc.advertised_host = c.advertised_host.clone();
        cc.advertised_port = c.advertised_port;
        cc.listeners = c
            .listeners
            .iter()
            .map(|l| (l.name.clone(), l.advertised_host.clone(), l.advertised_port))
            .collect();
        cc.flush_interval = std::time::Duration::from_millis(c.cluster_flush_ms);
        cc.flush_bytes = c.cluster_flush_bytes;
        cc.lease = std::time::Duration::from_millis(c.cluster_lease_ms.max(300));
        cc.cache_bytes = c.cluster_cache_bytes;
        cc.put_timeout = std::time::Duration::from_millis(c.cluster_put_timeout_ms.max(100));
        cc.intent_grace = std::time::Duration::from_millis(c.cluster_intent_grace_ms);
        cc.end_fresh_for = std::time::Duration::from_millis(c.cluster_fetch_end_fresh_ms);
        let security = cluster::security::Copies::new(self.authz.shared(), self.users.shared());
        let front = cluster::front::Front::start(cc, security).await?;
        let defaults = self.config.clone();
        cluster::scheduler::spawn(
            front.cluster.clone(),
            cluster::jobs::JobSettings {
                config_of: Arc::new(move |configs, key| {
                    configs
                        .get(key)
                        .cloned()
                        .or_else(|| defaults.topic_default(key))
                }),
                retention_every: std::time::Duration::from_millis(
                    c.retention_check_interval_ms.max(100),
                ),
                compaction_every: c
                    .cleaner_enable
                    .then(|| std::time::Duration::from_millis(c.cleaner_backoff_ms.max(100))),
                map_entries: (c.cleaner_dedupe_buffer_size as usize
                    / oncelog_log::cleaner::MAP_ENTRY_BYTES)
                    .max(1024),
                offsets_every: std::time::Duration::from_millis(
                    c.offsets_retention_check_interval_ms.max(100),
                ),
                offsets_retention_ms: c.offsets_retention_minutes.saturating_mul(60_000),
                transactional_id_expiration_ms: c.transactional_id_expiration_ms,
                producer_id_expiration_ms: c.producer_id_expiration_ms,
            },
        );
        tracing::info!(
            broker = c.node_id,
            session = front.cluster.session.session(),
            cluster_id = %front.cluster_id,
            object_store = %front.cluster.objects.describe,
            "cluster mode: registered"
        );
        // The transaction history is the cluster's: rows every broker reads.
        self.txn
            .journal_to(cluster::history::start(front.cluster.clone()));
        // Each group's state and members too: any broker's console shows them.
        self.groups
            .journal_to(cluster::membership::start(front.cluster.clone()));
        Ok(Some(front))
    }

    /// Cluster mode without `node.id`: asks the cluster for an id it never
    /// handed out (schema created first if missing), and sets it. A no-op
    /// in local mode or when `node.id` was given.
    pub async fn assign_node_id(config: &mut BrokerConfig) -> Result<(), cluster::ClusterError> {
        if config.cluster_postgres.is_empty() || config.node_id_set {
            return Ok(());
        }
        let target = cluster::pg::target(&config.cluster_postgres)?;
        let lease = std::time::Duration::from_millis(config.cluster_lease_ms.max(300));
        let pool = cluster::pool(&target, 2, lease)?;
        cluster::schema::migrate(&pool).await?;
        config.node_id = cluster::session::assign_id(&pool).await?;
        config.node_id_set = true;
        tracing::info!(
            broker = config.node_id,
            "cluster: node.id not set; the cluster assigned this broker node.id {}",
            config.node_id
        );
        Ok(())
    }

    /// Cluster mode's backend, or `None` in local mode.
    pub fn front(&self) -> Option<&Arc<cluster::front::Front>> {
        match &self.mode {
            Mode::Cluster(front) => Some(front),
            Mode::Local => None,
        }
    }

    /// The cluster's id, as Metadata answers it.
    pub fn cluster_id(&self) -> String {
        match self.front() {
            Some(front) => front.cluster_id.clone(),
            None => self.topics.cluster_id().to_string(),
        }
    }

    /// This broker's node id (in cluster mode, the one it registered with).
    pub fn node_id(&self) -> i32 {
        match self.front() {
            Some(front) => front.cluster.session.broker_id,
            None => self.config.node_id,
        }
    }

    /// Resolves with the reason once cluster mode must stop this broker
    /// (another broker took its node id); never in local mode.
    pub async fn cluster_stopped(&self) -> String {
        match self.front() {
            Some(front) => front.cluster.session.stopped().await,
            None => std::future::pending().await,
        }
    }

    /// A clean stop in cluster mode: ends this broker's lease, so its node id
    /// is free at once for the next start. A no-op in local mode.
    pub async fn leave_cluster(&self) {
        if let Some(front) = self.front() {
            let c = &front.cluster;
            if let Err(e) = c.session.release(&c.pool).await {
                tracing::warn!(error = %e, "cluster: could not end this broker's lease at stop; it ends by itself");
            }
        }
    }

    /// Opens a local-mode broker on its data directory, recovering every
    /// partition ([`Broker::start`] opens either mode).
    pub fn open(config: BrokerConfig) -> Result<Arc<Self>, TopicError> {
        if !config.cluster_postgres.is_empty() {
            return Err(TopicError::DataDir(
                "cluster.postgres is set: cluster mode starts with Broker::start".into(),
            ));
        }
        Ok(Arc::new(Self::build(config)?))
    }

    /// Everything a broker holds but its backend.
    ///
    /// In cluster mode the broker opens no data directory: its state is
    /// PostgreSQL's and the object store's, and the local stores below are
    /// empty, hold no directory, and refuse a change.
    fn build(config: BrokerConfig) -> Result<Self, TopicError> {
        let cluster_mode = !config.cluster_postgres.is_empty();
        let dir = (!cluster_mode).then(|| config.data_dir.clone());
        let dir_lock = match &dir {
            Some(d) => {
                datadir::ensure_dir(d)?;
                // Before anything is read or written: one broker per directory.
                let lock = datadir::lock(d)?;
                datadir::migrate(d)?;
                Some(lock)
            }
            None => None,
        };
        let data_notify = Arc::new(Notify::new());
        let syncer = Arc::new(Syncer::start(
            data_notify.clone(),
            config.cache_keep_bytes,
            config.sync_threads,
        ));
        let mode = if config.flush_interval_ms > 0 {
            partition::WriteMode::Interval(data_notify.clone())
        } else {
            partition::WriteMode::GroupCommit(syncer.clone())
        };
        let (topics, producer_ids) = match &dir {
            Some(d) => (
                Topics::open(&config, mode)?,
                producer_ids::ProducerIds::open(d)?,
            ),
            None => (
                Topics::none(&config, mode),
                producer_ids::ProducerIds::none(),
            ),
        };
        let compact = internal_log::CompactPolicy {
            min_records: config.coordinator_log_compact_records,
        };
        let (cutovers, users) = match &dir {
            Some(d) => {
                let cutovers = backend::local::cutovers::CutoverFile::open(d)?;
                cutovers
                    .forget_gone(|t| topics.get(t).is_some())
                    .map_err(TopicError::Storage)?;
                (cutovers, security::ScramUsers::open(d)?)
            }
            None => (
                backend::local::cutovers::CutoverFile::none(),
                security::ScramUsers::in_memory(),
            ),
        };
        #[cfg(feature = "tls")]
        let tls = if config.metrics_tls || config.listeners.iter().any(|l| l.protocol.tls()) {
            let settings = tls::TlsSettings {
                keystore: config.ssl_keystore.clone().into(),
                truststore: (!config.ssl_truststore.is_empty())
                    .then(|| config.ssl_truststore.clone().into()),
                client_auth: tls::ClientAuth::parse(&config.ssl_client_auth)
                    .unwrap_or(tls::ClientAuth::None),
            };
            Some(
                tls::TlsServer::load(settings)
                    .map_err(|e| TopicError::DataDir(format!("TLS: {e}")))?,
            )
        } else {
            None
        };
        let authz = acl::Authorizer::open(
            dir.as_deref(),
            config.authorizer,
            &config.super_users,
            config.allow_everyone_if_no_acl,
        )?;
        // The coordinators' logs: the data directory's in local mode; in
        // cluster mode PostgreSQL holds their state, and they keep none.
        let txn = if cluster_mode {
            txn_service::TxnService::in_memory()
                .map_err(|e| TopicError::Storage(format!("transaction coordinator: {e}")))?
        } else {
            txn_service::TxnService::open(&config.data_dir, compact)?
        }
        .with_park_policy(config.two_phase_commit.clone());
        let group_settings = groups::GroupSettings {
            initial_rebalance_delay: std::time::Duration::from_millis(
                config.group_initial_rebalance_delay_ms,
            ),
            min_session_timeout_ms: config.group_min_session_timeout_ms,
            max_session_timeout_ms: config.group_max_session_timeout_ms,
            offsets_retention_ms: config.offsets_retention_minutes.saturating_mul(60_000),
            compact,
        };
        let groups = if cluster_mode {
            groups::Groups::in_memory(group_settings)
                .map_err(|e| TopicError::Storage(format!("group coordinator: {e}")))?
        } else {
            groups::Groups::open(&config.data_dir, group_settings)?
        };
        let cleaner = Arc::new(compaction::LogCleaner::new(compaction::CleanerSettings {
            threads: config.cleaner_threads,
            dedupe_buffer_size: config.cleaner_dedupe_buffer_size,
            io_max_bytes_per_second: config.cleaner_io_max_bytes_per_second,
            backoff: std::time::Duration::from_millis(config.cleaner_backoff_ms),
        }));
        Ok(Self {
            config,
            topics,
            producer_ids,
            txn,
            groups,
            writers: Default::default(),
            cutovers,
            users,
            auth_stats: Default::default(),
            authz,
            connections: Default::default(),
            fetch_stats: Default::default(),
            #[cfg(feature = "tls")]
            tls,
            syncer,
            data_notify,
            appended_bytes: Default::default(),
            orphans: Default::default(),
            cleaner,
            verify: Default::default(),
            lineage: backend::lineage::LocalLineage::opened(dir.as_deref()),
            lineage_pending: Default::default(),
            samples: samples::Samples::new(now_ms()),
            request_latency: (0..REQUEST_KEYS)
                .map(|_| histogram::Histogram::latency())
                .collect(),
            _dir_lock: dir_lock,
            mode: Mode::Local,
        })
    }

    /// May `transactional_id` write `topic` (`holds`: its open transaction
    /// already holds a partition of it)? The writer fence and cut-over.
    pub fn write_gate(
        &self,
        topic: &str,
        transactional_id: &str,
        holds: bool,
    ) -> Result<(), error::Gate> {
        let config = self.writer_of(topic);
        cutover::check_write(
            self.cutovers.get(topic).as_ref(),
            config.as_deref(),
            transactional_id,
            holds,
        )
    }

    fn writer_of(&self, topic: &str) -> Option<String> {
        self.topics
            .get(topic)
            .and_then(|t| t.meta().configs.get(writers::WRITER_PREFIX_CONFIG).cloned())
    }

    /// Whether appends are acknowledged before they are synced.
    pub fn interval_flush(&self) -> bool {
        self.config.flush_interval_ms > 0
    }

    /// Syncs every partition; used at shutdown and by the interval flusher.
    /// Starts writeback of every partition's bytes appended since the last
    /// call (interval-flush mode; see [`writeback`]).
    pub fn start_writeback(&self) {
        for p in self.topics.all_partitions() {
            let tail = p.tail();
            p.start_writeback(&tail.file, tail.active_size);
        }
    }

    pub fn flush_all(&self) -> usize {
        let mut failed = 0;
        for p in self.topics.all_partitions() {
            let crate::backend::local::partition::Tail {
                file,
                next_offset: end,
                active_size,
                ..
            } = p.tail();
            match file.sync_data() {
                Ok(()) => {
                    p.advance_high_watermark(end);
                    if let Some(keep) = self.config.cache_keep_bytes {
                        p.drop_cache_behind(&file, active_size, keep);
                    }
                }
                Err(e) => {
                    failed += 1;
                    tracing::error!(partition = %p.name(), error = %e, "fdatasync failed during flush");
                }
            }
        }
        failed
    }

    /// Consumer lag of a group, per partition it has committed offsets for:
    /// against the last stable offset (what a read_committed consumer can
    /// reach) and the high watermark.
    pub async fn group_lag(self: &Arc<Self>, group: &str) -> Vec<LagRow> {
        let committed = self
            .group_store()
            .fetch_offsets(group, None, false)
            .await
            .unwrap_or_default();
        let logs = self.logs();
        let mut out = Vec::with_capacity(committed.len());
        for row in committed {
            let (topic, partition, offset) = (row.topic, row.partition, row.offset);
            let (hw, lso) = logs.bounds(&topic, partition).await.unwrap_or((-1, -1));
            out.push(LagRow {
                topic,
                partition,
                committed: offset,
                last_stable_offset: lso,
                high_watermark: hw,
                lag_committed: if offset >= 0 && lso >= 0 {
                    (lso - offset).max(0)
                } else {
                    -1
                },
                lag_uncommitted: if offset >= 0 && hw >= 0 {
                    (hw - offset).max(0)
                } else {
                    -1
                },
            });
        }
        out
    }

    /// Open transactions at partitions that the coordinator does not hold open.
    pub fn transaction_orphan_candidates(&self) -> Vec<OrphanCandidate> {
        let mut out = Vec::new();
        for p in self.topics.all_partitions() {
            for (first_offset, producer_id, epoch) in p.open_transactions() {
                if self
                    .txn
                    .verify(producer_id, epoch, &p.topic, p.index)
                    .is_err()
                {
                    out.push(OrphanCandidate {
                        topic: p.topic.clone(),
                        partition: p.index,
                        producer_id,
                        epoch,
                        first_offset,
                    });
                }
            }
        }
        out
    }

    /// The running totals the console's rates are taken from.
    pub fn totals(&self) -> samples::Totals {
        let (fsyncs, appended_bytes) = self.io_counters();
        let stats = self.txn.stats();
        samples::Totals {
            time_ms: now_ms(),
            appended_bytes,
            fsyncs,
            fsync_seconds: self.syncer.stats.latency.sum(),
            commits: stats.commits,
            aborts: stats.aborts,
            requests: self.request_latency.iter().map(|h| h.count()).sum(),
        }
    }

    /// (fdatasync calls by group commit, bytes appended) since start.
    pub fn io_counters(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.syncer.stats.syncs.load(Relaxed),
            self.appended_bytes.load(Relaxed),
        )
    }

    /// Background work: retention, the log cleaner and, in interval mode,
    /// periodic flushes.
    pub fn spawn_background(self: &Arc<Self>) {
        #[cfg(feature = "tls")]
        self.spawn_tls_reload();
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(b) = weak.upgrade() else { return };
                b.samples.record(b.totals());
            }
        });
        if self.config.cleaner_enable {
            let weak = Arc::downgrade(self);
            self.cleaner.start(Arc::new(move || {
                weak.upgrade()
                    .map(|b| compaction::candidates(&b.topics))
                    .unwrap_or_default()
            }));
        }
        self.spawn_healing();
        let b = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
            loop {
                tick.tick().await;
                b.groups.tick().await;
            }
        });
        self.spawn_cluster_offsets();
        if self.config.verify_enable {
            tokio::spawn(coordinators::verify::run(Arc::downgrade(self)));
        }
        let b = self.clone();
        tokio::spawn(async move {
            // Finish what a previous run left between Prepare and Complete,
            // then abort transactions that outlive their timeout.
            b.txn.recover(&b).await;
            let mut tick =
                tokio::time::interval(std::time::Duration::from_millis(TXN_REAPER_INTERVAL_MS));
            loop {
                tick.tick().await;
                b.txns().time_out().await;
                let cutovers = b.cutover_store();
                if cutovers.driven_by_timer() {
                    coordinators::cutover::drive(&cutovers).await;
                }
                let cutoff = now_ms() - b.config.transactional_id_expiration_ms;
                b.txn.expire_ids(cutoff).await;
            }
        });
        let b = self.clone();
        tokio::spawn(async move {
            let period = std::time::Duration::from_millis(b.config.retention_check_interval_ms);
            let mut tick = tokio::time::interval(period);
            tick.tick().await;
            loop {
                tick.tick().await;
                let b2 = b.clone();
                let _ = tokio::task::spawn_blocking(move || b2.topics.apply_retention()).await;
            }
        });
        self.spawn_interval_flush();
    }

    #[cfg(feature = "tls")]
    /// Reloads the TLS certificates when their files change.
    fn spawn_tls_reload(self: &Arc<Self>) {
        if self.tls.is_some() {
            let weak = Arc::downgrade(self);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
                loop {
                    tick.tick().await;
                    let Some(b) = weak.upgrade() else { return };
                    if let Some(t) = &b.tls {
                        t.reload_if_changed();
                    }
                }
            });
        }
    }

    /// Hanging-transaction healing: orphans found on two checks in a row.
    fn spawn_healing(self: &Arc<Self>) {
        let b = self.clone();
        tokio::spawn(async move {
            // Hanging-transaction healing: an orphan is a partition-side open
            // transaction the coordinator does not hold open, seen on two
            // checks in a row (a marker in flight takes milliseconds).
            let period =
                std::time::Duration::from_millis(b.config.transaction_heal_check_interval_ms);
            let mut tick = tokio::time::interval(period);
            let mut previous = std::collections::HashSet::new();
            loop {
                tick.tick().await;
                let now: std::collections::HashSet<_> =
                    b.transaction_orphan_candidates().into_iter().collect();
                for o in now.intersection(&previous) {
                    let (topic, index, pid, epoch, first) = (
                        &o.topic,
                        &o.partition,
                        &o.producer_id,
                        &o.epoch,
                        &o.first_offset,
                    );
                    // Never race the coordinator: a transaction it holds is its to end.
                    if b.txn.holds(*pid).await {
                        continue;
                    }
                    b.orphans.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if b.config.transaction_auto_heal {
                        tracing::warn!(partition = %format!("{topic}-{index}"), producer_id = pid, epoch, first_offset = first,
                            "orphaned transaction found; aborting it (transaction.auto.heal)");
                        if let Err(e) = txn_service::abort_orphan(
                            &b,
                            topic,
                            *index,
                            *pid,
                            *epoch,
                            b.txn.coordinator_epoch,
                        )
                        .await
                        {
                            tracing::error!(error = %e, "orphan abort failed");
                        }
                    } else {
                        tracing::warn!(partition = %format!("{topic}-{index}"), producer_id = pid, epoch, first_offset = first,
                            "orphaned transaction pins the last stable offset; abort it with an admin tool or set transaction.auto.heal");
                    }
                }
                previous = now;
            }
        });
    }

    /// Cluster mode: expires the offsets of the groups this broker coordinates.
    fn spawn_cluster_offsets(self: &Arc<Self>) {
        if let Some(front) = self.front().cloned() {
            // Cluster mode: the offsets of the groups this broker coordinates
            // and which have no members here expire on this broker (the
            // leased `offsets` job takes the groups nobody coordinates).
            let b = self.clone();
            let every = std::time::Duration::from_millis(
                self.config.offsets_retention_check_interval_ms.max(100),
            );
            let retention_ms = self.config.offsets_retention_minutes.saturating_mul(60_000);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let held = front.groups.held(front.cluster.session.session());
                    let mut idle = Vec::new();
                    for g in held {
                        if b.groups.member_count(&g).await.unwrap_or(0) == 0 {
                            idle.push(g);
                        }
                    }
                    match cluster::groups::expire_owned_offsets(&front.cluster, &idle, retention_ms)
                        .await
                    {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(
                            offsets = n,
                            "cluster: expired committed offsets removed"
                        ),
                        Err(e) => {
                            tracing::warn!(error = %e, "cluster: offsets retention failed; it runs again")
                        }
                    }
                }
            });
        }
    }

    /// Interval-flush mode: the flushes and the writeback between them.
    fn spawn_interval_flush(self: &Arc<Self>) {
        if self.interval_flush() {
            let b = self.clone();
            tokio::spawn(async move {
                let period = std::time::Duration::from_millis(b.config.flush_interval_ms);
                let mut tick = tokio::time::interval(period);
                loop {
                    tick.tick().await;
                    let b2 = b.clone();
                    let _ = tokio::task::spawn_blocking(move || b2.flush_all()).await;
                }
            });
            // Between flushes, start writeback of what was appended, so a
            // flush does not write a whole interval's bytes at once.
            let b = self.clone();
            tokio::spawn(async move {
                let period = std::time::Duration::from_millis(
                    (b.config.flush_interval_ms / 10).clamp(10, 100),
                );
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let b2 = b.clone();
                    let _ = tokio::task::spawn_blocking(move || b2.start_writeback()).await;
                }
            });
        }
    }
}

impl txn_service::TxnRuntime for Broker {
    fn txn(&self) -> &txn_service::TxnService {
        &self.txn
    }

    fn partition(&self, topic: &str, index: i32) -> Option<Arc<dyn storage::PartitionStore>> {
        self.topics.get(topic).and_then(|t| t.store(index))
    }

    async fn complete_offsets(
        &self,
        producer_id: i64,
        commit: bool,
    ) -> Result<(), internal_log::PersistError> {
        self.groups.complete_txn(producer_id, commit).await
    }

    fn next_producer_id(&self) -> Result<i64, TopicError> {
        self.producer_ids.next()
    }

    fn record_commit(&self, topic: &str, transactional_id: &str, now_ms: i64) {
        // A cut-over handed the topic over: the old writer's recent commits
        // are no second writer.
        if let Some(c) = self.cutovers.get(topic) {
            if c.phase == cutover::Phase::Switched && writers::prefix_of(transactional_id) == c.to {
                self.writers.forget(topic, &c.from);
            }
        }
        self.writers.record_commit(topic, transactional_id, now_ms)
    }

    fn protects(&self, topic: &str, transactional_id: &str) -> bool {
        cutover::protects(self.cutovers.get(topic).as_ref(), transactional_id)
    }

    fn commit_gate(&self, topic: &str, transactional_id: &str) -> Result<(), error::Gate> {
        let config = self.writer_of(topic);
        cutover::check_commit(
            self.cutovers.get(topic).as_ref(),
            config.as_deref(),
            transactional_id,
        )
    }
}

impl Broker {
    /// The topic's `writer.transactional.id.prefix` (local mode); `Err`
    /// when there is no such topic, or it is internal.
    pub(crate) fn writer_config(&self, topic: &str) -> Result<Option<String>, String> {
        if names::is_internal_topic(topic) {
            return Err(format!(
                "{topic} is an internal topic: it has no writer to hand over"
            ));
        }
        let t = self
            .topics
            .get(topic)
            .ok_or_else(|| format!("unknown topic {topic}"))?;
        let config = t.meta().configs.get(writers::WRITER_PREFIX_CONFIG).cloned();
        Ok(config)
    }

    /// Sets the topic's `writer.transactional.id.prefix` (local mode).
    pub(crate) fn set_writer_config(&self, topic: &str, writer: &str) -> Result<(), String> {
        self.topics
            .update_configs(topic, |current| {
                let mut configs = current.clone();
                configs.insert(
                    writers::WRITER_PREFIX_CONFIG.to_string(),
                    writer.to_string(),
                );
                Ok(configs)
            })
            .map_err(|e| e.to_string())
    }
}
