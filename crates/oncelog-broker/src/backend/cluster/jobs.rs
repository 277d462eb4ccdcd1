//! Background jobs that one broker runs at a time for the whole cluster
//! (started by [`super::scheduler::spawn`]):
//! time/size retention, compaction, the retention of committed offsets
//! of groups no live broker coordinates, and the cut-overs' driver. A job's `job_leases` row names the
//! broker session holding it until `expires_at` (PostgreSQL's clock, so
//! brokers' clocks do not matter); the holder renews it at each run, and
//! any broker takes it over once it has expired.
//!
//! The lease saves work, it does not carry correctness: every change a job
//! makes is one PostgreSQL transaction that checks the broker's fencing
//! token and re-checks what it read (retention moves a log start only up,
//! under the partition's row lock; a compaction chunk replaces batch rows
//! only if they are still the ones it read). Two holders at once — a paused
//! broker waking after its lease — waste a pass, never a record.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::catalogue::{self, TopicRow};
use super::{Cluster, ClusterError};

pub const RETENTION: &str = "retention";
pub const COMPACTION: &str = "compaction";
pub const MERGE: &str = "merge";
pub const OFFSETS: &str = "offsets";
pub const CUTOVERS: &str = "cutovers";
pub const IDS: &str = "transactional_ids";

/// How often idle transactional ids are looked for: a tenth of how long
/// they may idle, between 1 s (local mode's) and a minute. Each look is a
/// scan of the `transactions` rows, and the default expiry is a week.
pub(super) fn ids_every(expiration_ms: i64) -> Duration {
    Duration::from_millis((expiration_ms / 10).clamp(1_000, 60_000) as u64)
}

/// How often the cut-overs' driver looks at them (as local mode's).
pub(super) const CUTOVERS_EVERY: Duration = Duration::from_secs(1);

/// A topic config's value: the topic's own, else the broker's default.
pub type ConfigOf = Arc<dyn Fn(&BTreeMap<String, String>, &str) -> Option<String> + Send + Sync>;

/// What the jobs need to know beyond the cluster.
#[derive(Clone)]
pub struct JobSettings {
    pub config_of: ConfigOf,
    /// How often retention runs (`log.retention.check.interval.ms`).
    pub retention_every: Duration,
    /// How often compaction looks for work (`log.cleaner.backoff.ms`);
    /// `None` when the cleaner is disabled (`log.cleaner.enable=false`).
    pub compaction_every: Option<Duration>,
    /// Keys a compaction pass's offset map holds.
    pub map_entries: usize,
    /// How often expired committed offsets are looked for
    /// (`offsets.retention.check.interval.ms`), and how old they must be
    /// (`offsets.retention.minutes`).
    pub offsets_every: Duration,
    pub offsets_retention_ms: i64,
    /// `transactional.id.expiration.ms` and `producer.id.expiration.ms`
    /// (idle producers are forgotten by the retention job, as a local
    /// partition's retention does).
    pub transactional_id_expiration_ms: i64,
    pub producer_id_expiration_ms: i64,
}

impl JobSettings {
    pub fn config_i64(&self, t: &TopicRow, key: &str) -> i64 {
        (self.config_of)(&t.configs, key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1)
    }

    pub fn config_f64(&self, t: &TopicRow, key: &str) -> f64 {
        (self.config_of)(&t.configs, key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.5)
    }

    pub fn policy(&self, t: &TopicRow) -> crate::backend::topic::CleanupPolicy {
        crate::backend::topic::CleanupPolicy::parse(
            &(self.config_of)(&t.configs, "cleanup.policy").unwrap_or_default(),
        )
    }
}

/// Takes or renews `job`'s lease for `ttl`: whether this broker's session
/// holds it now.
pub async fn hold(cluster: &Cluster, job: &str, ttl: Duration) -> Result<bool, ClusterError> {
    if !cluster.session.is_live() {
        return Ok(false);
    }
    let client = cluster.pool.get().await?;
    let ttl_ms = ttl.as_millis() as f64;
    let row = client
        .query_opt(
            "INSERT INTO job_leases (job, broker_id, session, expires_at) \
             VALUES ($1, $2, $3, clock_timestamp() + $4 * interval '1 millisecond') \
             ON CONFLICT (job) DO UPDATE SET broker_id = EXCLUDED.broker_id, \
               session = EXCLUDED.session, expires_at = EXCLUDED.expires_at \
             WHERE job_leases.expires_at < clock_timestamp() \
                OR (job_leases.broker_id = EXCLUDED.broker_id \
                    AND job_leases.session = EXCLUDED.session) \
             RETURNING 1",
            &[
                &job,
                &cluster.config.broker_id,
                &cluster.session.session(),
                &ttl_ms,
            ],
        )
        .await?;
    Ok(row.is_some())
}

/// A job's lease as held by a run, renewed as the run goes on (a long run
/// over many topics stops when another broker has the job).
#[derive(Debug, Clone, Copy)]
pub struct Held {
    pub job: &'static str,
    pub ttl: Duration,
}

impl Held {
    /// Renews the lease: whether this broker still holds the job (if not,
    /// the run stops; the holder goes on).
    pub async fn still_held(&self, cluster: &Cluster) -> Result<bool, ClusterError> {
        let held = hold(cluster, self.job, self.ttl).await?;
        if !held {
            tracing::info!(
                job = self.job,
                "cluster: another broker holds the job now; this run stops"
            );
        }
        Ok(held)
    }
}

/// Records that `runs` runs of `job` ended, the last with `error` if it
/// failed.
pub(super) async fn ran(
    cluster: &Cluster,
    job: &str,
    runs: i64,
    error: &Option<String>,
) -> Result<(), ClusterError> {
    let client = cluster.pool.get().await?;
    client
        .execute(
            "UPDATE job_leases SET runs = runs + $5, last_run_at = clock_timestamp(), \
               last_error = $4 \
             WHERE job = $1 AND broker_id = $2 AND session = $3",
            &[
                &job,
                &cluster.config.broker_id,
                &cluster.session.session(),
                error,
                &runs,
            ],
        )
        .await?;
    Ok(())
}

/// How often a job that runs more often than this records its runs (at
/// once when its error changes).
pub(super) const RECORD_EVERY: Duration = Duration::from_secs(10);

/// A job's lease row, for `oncelog cluster info`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobRow {
    pub job: String,
    pub broker_id: i32,
    pub expires_in_ms: i64,
    pub runs: i64,
    pub last_run_ago_ms: Option<i64>,
    pub last_error: Option<String>,
}

/// Every job's lease (none on a database no broker of this version has
/// migrated yet).
pub async fn job_rows(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Vec<JobRow>, ClusterError> {
    let rows = match client
        .query(
            "SELECT job, broker_id, \
               (extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint, runs, \
               (extract(epoch FROM clock_timestamp() - last_run_at) * 1000)::bigint, last_error \
             FROM job_leases ORDER BY job",
            &[],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
            return Ok(Vec::new())
        }
        Err(e) => return Err(e.into()),
    };
    Ok(rows
        .iter()
        .map(|r| JobRow {
            job: r.get(0),
            broker_id: r.get(1),
            expires_in_ms: r.get(2),
            runs: r.get(3),
            last_run_ago_ms: r.get(4),
            last_error: r.get(5),
        })
        .collect())
}

/// Every topic, read now (the jobs never act on a stale catalogue).
pub(super) async fn topics(cluster: &Cluster) -> Result<Vec<TopicRow>, ClusterError> {
    catalogue::topics(&cluster.pool).await
}

/// PostgreSQL's time in ms since the epoch. Every job measures ages by it
/// (retention, compaction lags, producer expiry), not by the clock of
/// whichever broker holds the job: a broker whose clock jumped must not
/// remove data early or keep it forever.
pub async fn database_now_ms(cluster: &Cluster) -> Result<i64, ClusterError> {
    let client = cluster.pool.get().await?;
    let row = client
        .query_one(
            "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await?;
    Ok(row.get(0))
}
