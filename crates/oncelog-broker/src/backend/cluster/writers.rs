//! Second-writer detection across the cluster (scenario S6): a topic's
//! transactional writers (the job a transactional id belongs to, as
//! [`crate::machines::writers::prefix_of`] reads it) and their last commit are rows of
//! `topic_writers`, so a broker sees the commits every broker coordinated.
//! Written after the commit, at most once per [`RECORD_EVERY`] per topic and
//! writer on each broker: a job's parallel producers do not queue on one row.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{Cluster, ClusterError};
use crate::machines::writers::{Writers, WINDOW_MS};

/// How often one broker writes a (topic, writer) row.
pub const RECORD_EVERY_MS: i64 = 5_000;

#[derive(Default)]
pub struct Recorded {
    /// (topic, writer) -> when this broker last wrote its row (ms).
    last: Mutex<HashMap<(String, String), i64>>,
}

impl Recorded {
    /// The (topic, writer) pairs of a commit at `now` that are due a write.
    fn due(&self, topics: &[String], writer: &str, now: i64) -> Vec<String> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.retain(|_, at| now - *at <= WINDOW_MS);
        topics
            .iter()
            .filter(|t| {
                let at = last
                    .entry(((*t).clone(), writer.to_string()))
                    .or_insert(i64::MIN);
                let due = now.saturating_sub(*at) >= RECORD_EVERY_MS;
                if due {
                    *at = now;
                }
                due
            })
            .cloned()
            .collect()
    }
}

/// Records that `writer` committed to `topics` at PostgreSQL's clock, then
/// feeds every live writer of those topics to `writers` (which warns on a
/// second one, and backs the metrics and the console).
pub async fn record_commit(
    cluster: &Cluster,
    recorded: &Recorded,
    writers: &Writers,
    topics: &[String],
    writer: &str,
    now_local: i64,
) -> Result<(), ClusterError> {
    let due = recorded.due(topics, writer, now_local);
    if due.is_empty() {
        return Ok(());
    }
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "WITH now AS (SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint AS ms), \
             up AS (INSERT INTO topic_writers (topic, writer, last_commit_ms) \
                    SELECT t, $2, now.ms FROM unnest($1::text[]) AS t, now \
                    ON CONFLICT (topic, writer) DO UPDATE \
                    SET last_commit_ms = GREATEST(topic_writers.last_commit_ms, EXCLUDED.last_commit_ms)) \
             SELECT w.topic, w.writer, w.last_commit_ms, now.ms FROM topic_writers w, now \
             WHERE w.topic = ANY($1) AND w.last_commit_ms >= now.ms - $3",
            &[&due, &writer, &WINDOW_MS],
        )
        .await?;
    // A cut-over handed the topic to this writer: the old writer's recent
    // commits are no second writer (as local mode).
    for r in client
        .query(
            "SELECT t.name, c.cutover->>'from' FROM cutovers c JOIN topics t ON t.id = c.topic_id \
             WHERE t.name = ANY($1) AND c.cutover->>'phase' = 'Switched' AND c.cutover->>'to' = $2",
            &[&due, &writer],
        )
        .await?
    {
        let (topic, from): (String, String) = (r.get(0), r.get(1));
        writers.forget(&topic, &from);
    }
    for r in rows {
        let (topic, w, at, pg_now): (String, String, i64, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        // Ages by PostgreSQL's clock, kept on this broker's: the window is
        // measured by one clock (skew between brokers does not matter).
        // The row of this very commit is not visible to the statement's
        // SELECT (one snapshot): it is fed below.
        writers.observe(&topic, &w, now_local - (pg_now - at), now_local);
    }
    for t in &due {
        writers.observe(t, writer, now_local, now_local);
    }
    Ok(())
}

/// Every topic's writers that committed within [`WINDOW_MS`], with their
/// last commit on this broker's clock (aged by PostgreSQL's), sorted: what
/// [`Writers::live_detail`] answers in local mode.
pub async fn live(
    cluster: &Cluster,
    now_local: i64,
) -> Result<std::collections::BTreeMap<String, Vec<(String, i64)>>, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "WITH now AS (SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint AS ms) \
             SELECT w.topic, w.writer, w.last_commit_ms, now.ms FROM topic_writers w, now \
             WHERE w.last_commit_ms >= now.ms - $1 ORDER BY w.topic, w.writer",
            &[&WINDOW_MS],
        )
        .await?;
    let mut out: std::collections::BTreeMap<String, Vec<(String, i64)>> = Default::default();
    for r in rows {
        let (topic, w, at, pg_now): (String, String, i64, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        out.entry(topic)
            .or_default()
            .push((w, now_local - (pg_now - at)));
    }
    Ok(out)
}
