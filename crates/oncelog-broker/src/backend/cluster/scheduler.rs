//! Runs the cluster's background jobs ([`super::jobs`]) on this broker:
//! each loop runs its job whenever this broker holds (or can take) the
//! job's lease.

use std::sync::Arc;
use std::time::Duration;

use super::jobs::{
    hold, ran, Held, JobSettings, COMPACTION, CUTOVERS, CUTOVERS_EVERY, IDS, MERGE, OFFSETS,
    RECORD_EVERY, RETENTION,
};
use super::{compactor, merger, retention, Cluster, ClusterError};

/// Starts the retention, offsets and compaction loops on this broker; each
/// runs its job whenever it holds (or can take) the job's lease.
pub fn spawn(cluster: Arc<Cluster>, settings: JobSettings) {
    let lease = cluster.config.lease;
    {
        let (c, s) = (cluster.clone(), settings.clone());
        let every = s.retention_every;
        tokio::spawn(run_every(
            c,
            RETENTION,
            every,
            every + lease * 2,
            move |c, held| {
                let s = s.clone();
                async move { retention::run(&c, &s, held).await.map(|_| ()) }
            },
        ));
    }
    {
        let every = settings.offsets_every;
        let retention_ms = settings.offsets_retention_ms;
        tokio::spawn(run_every(
            cluster.clone(),
            OFFSETS,
            every,
            every + lease * 2,
            move |c, _held| async move {
                let n = super::groups::expire_unowned_offsets(&c, retention_ms).await?;
                if n > 0 {
                    tracing::info!(offsets = n, "cluster: expired committed offsets removed");
                }
                Ok(())
            },
        ));
    }
    {
        let expiration_ms = settings.transactional_id_expiration_ms;
        tokio::spawn(run_every(
            cluster.clone(),
            IDS,
            super::jobs::ids_every(expiration_ms),
            super::jobs::ids_every(expiration_ms) + lease * 2,
            move |c, _held| async move {
                super::expiry::transactional_ids(&c, expiration_ms)
                    .await
                    .map(|_| ())
            },
        ));
    }
    tokio::spawn(run_every(
        cluster.clone(),
        CUTOVERS,
        CUTOVERS_EVERY,
        CUTOVERS_EVERY + lease * 2,
        |c, _held| async move {
            crate::coordinators::cutover::drive(&crate::backend::Cutovers::Cluster(&c)).await;
            Ok(())
        },
    ));
    tokio::spawn(run_every(
        cluster.clone(),
        MERGE,
        merger::EVERY,
        merger::EVERY + lease * 2,
        |c, held| async move { merger::run(&c, held).await.map(|_| ()) },
    ));
    if let Some(every) = settings.compaction_every {
        let s = settings;
        tokio::spawn(run_every(
            cluster,
            COMPACTION,
            every,
            every + lease * 2,
            move |c, held| {
                let s = s.clone();
                async move { compactor::run(&c, &s, held).await.map(|_| ()) }
            },
        ));
    }
}

async fn run_every<F, Fut>(
    cluster: Arc<Cluster>,
    job: &'static str,
    every: Duration,
    ttl: Duration,
    f: F,
) where
    F: Fn(Arc<Cluster>, Held) -> Fut,
    Fut: std::future::Future<Output = Result<(), ClusterError>>,
{
    let mut unrecorded: i64 = 0;
    let mut last_recorded: Option<std::time::Instant> = None;
    let mut last_error: Option<String> = None;
    loop {
        tokio::time::sleep(every).await;
        match hold(&cluster, job, ttl).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                crate::backend::cluster::outage::cluster_warn!(cluster.outage, e, job, error = %e, "cluster: taking a job's lease failed");
                continue;
            }
        }
        let r = f(cluster.clone(), Held { job, ttl }).await;
        if let Err(e) = &r {
            crate::backend::cluster::outage::cluster_warn!(cluster.outage, *e, job, error = %e, "cluster: a background job failed; it runs again");
        }
        // A job that runs every second records its runs every few seconds
        // (one write fewer a second), and at once when its outcome changes.
        let error = r.err().map(|e| e.to_string());
        unrecorded += 1;
        if every >= RECORD_EVERY
            || error != last_error
            || last_recorded.is_none_or(|t| t.elapsed() >= RECORD_EVERY)
        {
            match ran(&cluster, job, unrecorded, &error).await {
                Ok(()) => {
                    unrecorded = 0;
                    last_recorded = Some(std::time::Instant::now());
                    last_error = error;
                }
                Err(e) => tracing::debug!(job, error = %e, "cluster: recording a job's run failed"),
            }
        }
    }
}
