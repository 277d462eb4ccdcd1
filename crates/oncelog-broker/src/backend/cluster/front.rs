//! What a broker in cluster mode runs beside its request handlers: the
//! connection to the cluster, the flusher, the lease renewal, the LISTEN
//! task, the object collector, and short-lived copies of the live brokers,
//! the topic catalogue (for Metadata; every sequencing decision reads
//! PostgreSQL itself, never these copies), the ACLs and SCRAM credentials.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::catalogue::{self, TopicRow};
use super::flusher::Flusher;
use super::groups::Ownership;
use super::session::{self, BrokerRow};
use super::{collector, reader, Cluster, ClusterConfig, ClusterError};

/// How often the copies of the live brokers and the topics are refreshed
/// (at once, too, when a broker registers or leaves, or a topic, its configs,
/// a cut-over or the security rows change: those are announced).
const REFRESH: Duration = Duration::from_secs(1);
/// How often transactions past their timeout are looked for.
/// How often the collector runs.
const COLLECT_EVERY: Duration = Duration::from_secs(60);

pub struct Front {
    pub cluster: Arc<Cluster>,
    pub flusher: Flusher,
    live: RwLock<Vec<BrokerRow>>,
    topics: RwLock<HashMap<String, TopicRow>>,
    pub cluster_id: String,
    /// The consumer groups this broker coordinates.
    pub groups: Ownership,
    /// Partitions known to be in transactions (Produce v12's implicit adds).
    pub added: super::txn::Added,
    /// When this broker last recorded each topic's writers.
    pub writers: super::writers::Recorded,
    /// Transactional ids this broker fenced by a timeout abort, not yet
    /// The authorizer's ACLs and the SASL listeners' credentials, replaced
    /// from the cluster's rows at each refresh.
    pub security: super::security::Copies,
}

impl Front {
    /// Connects, registers, and starts the background tasks.
    pub async fn start(
        config: ClusterConfig,
        security: super::security::Copies,
    ) -> Result<Arc<Self>, ClusterError> {
        let cluster = Cluster::connect(config).await?;
        let cluster_id = super::schema::cluster_id(&cluster.pool).await?;
        let flusher = Flusher::start(cluster.clone());
        let front = Arc::new(Self {
            cluster: cluster.clone(),
            flusher,
            live: RwLock::new(Vec::new()),
            topics: RwLock::new(HashMap::new()),
            cluster_id,
            groups: Ownership::default(),
            added: Default::default(),
            writers: Default::default(),
            security,
        });
        front.refresh().await?;
        // Never serve on the data directory's own users and ACLs: a broker
        // that cannot read the cluster's does not start.
        front.security.refresh(&cluster.pool).await?;
        {
            let c = cluster.clone();
            tokio::spawn(async move { c.session.keep_alive(&c.pool, &c.outage).await });
        }
        tokio::spawn(reader::listen(cluster.clone()));
        {
            let f = front.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(REFRESH) => {}
                        _ = f.cluster.catalogue_notify.notified() => {}
                    }
                    if let Err(e) = f.refresh().await {
                        crate::backend::cluster::outage::cluster_warn!(f.cluster.outage, e, error = %e, "cluster: refreshing brokers and topics failed");
                    }
                }
            });
        }
        {
            let c = cluster.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(COLLECT_EVERY).await;
                    match collector::collect(&c, c.config.intent_grace).await {
                        Ok(r) if r.removed_uncommitted + r.removed_unreferenced > 0 => {
                            tracing::info!(?r, "cluster: collected objects")
                        }
                        Ok(_) => {}
                        Err(e) => {
                            crate::backend::cluster::outage::cluster_warn!(c.outage, e, error = %e, "cluster: the collector failed")
                        }
                    }
                }
            });
        }
        Ok(front)
    }

    async fn refresh(&self) -> Result<(), ClusterError> {
        // One round trip and one read-only transaction for every copy: the
        // statements are pipelined on one connection. A copy that cannot be
        // read (a document that does not parse) is kept as it was and does
        // not hold up the others.
        let client = self.cluster.pool.get().await?;
        let (_, security, live, topics, _) = futures_util::join!(
            client.batch_execute("BEGIN READ ONLY"),
            self.security.refresh_on(&client),
            session::brokers_on(&client),
            catalogue::topics_on(&client),
            client.batch_execute("COMMIT"),
        );
        if let Err(e) = security {
            crate::backend::cluster::outage::cluster_warn!(self.cluster.outage, e, error = %e, "cluster: reading the ACLs and SCRAM credentials failed; keeping the copy");
        }
        let live: Vec<BrokerRow> = live?.into_iter().filter(|b| b.lease_left_ms > 0).collect();
        let me = self.cluster.config.broker_id;
        self.cluster.peers.store(
            live.iter().any(|b| b.id != me),
            std::sync::atomic::Ordering::Relaxed,
        );
        let topics = topics?;
        *self.live.write().unwrap_or_else(|p| p.into_inner()) = live;
        *self.topics.write().unwrap_or_else(|p| p.into_inner()) =
            topics.into_iter().map(|t| (t.name.clone(), t)).collect();
        Ok(())
    }

    /// The live brokers as last seen (this one always among them while its
    /// own lease holds).
    pub fn live(&self) -> Vec<BrokerRow> {
        let mut v = self.live.read().unwrap_or_else(|p| p.into_inner()).clone();
        let me = self.cluster.config.broker_id;
        if self.cluster.session.is_live() && !v.iter().any(|b| b.id == me) {
            v.push(BrokerRow {
                id: me,
                session: self.cluster.session.session(),
                host: self.cluster.config.advertised_host.clone(),
                port: self.cluster.config.advertised_port,
                lease_left_ms: 1,
                listeners: self
                    .cluster
                    .config
                    .listeners
                    .iter()
                    .map(|(n, h, p)| (n.clone(), (h.clone(), *p)))
                    .collect(),
            });
            v.sort_by_key(|b| b.id);
        }
        v
    }

    /// The live brokers, read now from PostgreSQL (the copy if that fails).
    pub async fn live_now(&self) -> Vec<BrokerRow> {
        match session::live_brokers(&self.cluster.pool).await {
            Ok(v) => {
                *self.live.write().unwrap_or_else(|p| p.into_inner()) = v;
                self.live()
            }
            Err(e) => {
                crate::backend::cluster::outage::cluster_warn!(self.cluster.outage, e, error = %e, "cluster: listing live brokers failed; answering from the copy");
                self.live()
            }
        }
    }

    /// Every topic as last seen.
    pub fn topics(&self) -> Vec<TopicRow> {
        crate::backend::sorted_values(&self.topics, |t| t.name.clone())
    }

    /// A topic by name: from the copy, else from PostgreSQL (a topic another
    /// broker created a moment ago).
    pub async fn topic(&self, name: &str) -> Result<Option<TopicRow>, ClusterError> {
        if let Some(t) = self
            .topics
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Ok(Some(t.clone()));
        }
        let t = catalogue::topic(&self.cluster.pool, name).await?;
        if let Some(t) = &t {
            self.remember(t.clone());
        }
        Ok(t)
    }

    pub fn remember(&self, t: TopicRow) {
        self.topics
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(t.name.clone(), t);
    }

    pub fn forget(&self, name: &str) {
        self.topics
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }
}

impl Front {
    /// Cluster mode's part of /metrics: object PUT/GET counts, bytes and
    /// latencies, produce-commit latency (the PostgreSQL transaction) and
    /// ack latency, flushes, cache hits, and this broker's lease.
    pub fn render_metrics(&self, out: &mut crate::observe::exposition::Scrape) {
        use std::sync::atomic::Ordering::Relaxed;
        let o = &self.cluster.objects.stats;
        let f = &self.flusher.stats;
        let c = &self.cluster.cache;
        let e = &self.cluster.ends;
        let counters: [(&str, &str, u64); 14] = [
            (
                "oncelog_cluster_object_puts_total",
                "Objects written.",
                o.puts.load(Relaxed),
            ),
            (
                "oncelog_cluster_object_put_bytes_total",
                "Bytes of objects written.",
                o.put_bytes.load(Relaxed),
            ),
            (
                "oncelog_cluster_object_put_errors_total",
                "Object writes that failed.",
                o.put_errors.load(Relaxed),
            ),
            (
                "oncelog_cluster_object_gets_total",
                "Ranged object reads.",
                o.gets.load(Relaxed),
            ),
            (
                "oncelog_cluster_object_get_bytes_total",
                "Bytes read from objects.",
                o.get_bytes.load(Relaxed),
            ),
            (
                "oncelog_cluster_object_get_errors_total",
                "Object reads that failed.",
                o.get_errors.load(Relaxed),
            ),
            (
                "oncelog_cluster_object_deletes_total",
                "Objects removed by the collector.",
                o.deletes.load(Relaxed),
            ),
            (
                "oncelog_cluster_flushes_total",
                "Flushes (one object and one produce commit each).",
                f.flushes.load(Relaxed),
            ),
            (
                "oncelog_cluster_failed_flushes_total",
                "Flushes whose commit did not happen (their batches got retriable errors).",
                f.failed_flushes.load(Relaxed),
            ),
            (
                "oncelog_cluster_batches_total",
                "Client batches committed by this broker.",
                f.batches.load(Relaxed),
            ),
            (
                "oncelog_cluster_cache_hits_total",
                "Batches served from the cache.",
                c.hits.load(Relaxed),
            ),
            (
                "oncelog_cluster_cache_misses_total",
                "Batches read from the object store.",
                c.misses.load(Relaxed),
            ),
            (
                "oncelog_cluster_fetch_ends_from_memory_total",
                "Fetched partitions answered from memory: at their end as last read, with no commit seen since.",
                e.answered.load(Relaxed),
            ),
            (
                "oncelog_cluster_fetch_partitions_read_total",
                "Fetched partitions read from PostgreSQL.",
                e.read_through.load(Relaxed),
            ),
        ];
        for (name, help, v) in counters {
            out.counter(name, help).int(&[], v as i64);
        }
        let hists = [
            (
                "oncelog_cluster_object_put_seconds",
                "Duration of one object PUT.",
                &o.put_latency,
            ),
            (
                "oncelog_cluster_object_get_seconds",
                "Duration of one ranged object GET.",
                &o.get_latency,
            ),
            (
                "oncelog_cluster_commit_seconds",
                "Duration of one produce commit (its PostgreSQL transaction).",
                &f.commit_latency,
            ),
            (
                "oncelog_cluster_ack_seconds",
                "A batch's wait from arrival to its answer.",
                &f.ack_latency,
            ),
        ];
        for (name, help, h) in hists {
            out.histogram(name, help).histogram(&[], h);
        }
        let s = &self.cluster.session;
        out.gauge(
            "oncelog_cluster_session",
            "This broker's session number (0 while fenced).",
        )
        .int(&[], if s.is_live() { s.session() } else { 0 });
    }
}
