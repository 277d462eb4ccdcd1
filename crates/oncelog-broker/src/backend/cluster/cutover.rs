//! Cut-overs (scenario S10) in cluster mode: local mode's state machine
//! ([`crate::coordinators::cutover`]: its phases, its checks, its refusals), with the
//! state a row of `cutovers` and every check made inside the PostgreSQL
//! transaction of the decision it gates.
//!
//! * Every coordinator decision ([`super::txn::run`]) reads the cut-over
//!   rows of the topics it touches — the request's and those its open
//!   transaction holds — under its transactional id's row lock (the rows
//!   of cut-overs in progress `FOR SHARE`), and applies [`super::gates::Gates`]: BLUE may not add the topic while draining,
//!   GREEN's commit is held (CONCURRENT_TRANSACTIONS), a new producer or the
//!   timeout may not abort BLUE's transaction holding it.
//! * The switch is one PostgreSQL transaction that holds the cut-over row
//!   `FOR UPDATE`, finds no transaction of BLUE holding the topic, and
//!   writes `Switched` and the topic's `writer.transactional.id.prefix`
//!   together. Every decision that changes whether a BLUE transaction holds
//!   the topic holds the row `FOR SHARE` while the cut-over is in progress, so none
//!   runs beside the switch: every BLUE commit to the topic committed
//!   before it, and every GREEN commit after it.
//! * The driver ([`crate::coordinators::cutover::drive`], written once for
//!   both modes; here a job one broker holds the lease of) takes the
//!   switch, aborts at the drain deadline, and fences the old writer after
//!   the switch (or the new one's holding transactions after a rollback),
//!   each a decision of its own; a step cut short by a crash is done again
//!   by whichever broker holds the job next.

use deadpool_postgres::Pool;
use tokio_postgres::GenericClient;

use super::txn::{self, Gates};
use super::{Cluster, ClusterError};
use crate::coordinators::txn_service::holds_topic;
use crate::machines::cutover::{Cutover, Phase};
use crate::machines::txn_coordinator::{Effect, TxnMeta, TxnState};
use crate::machines::writers::{prefix_of, WRITER_PREFIX_CONFIG};

/// PostgreSQL's clock in ms (the cut-over's times are PostgreSQL's, so
/// brokers' clocks do not matter).
async fn pg_now(c: &impl GenericClient) -> Result<i64, ClusterError> {
    Ok(c.query_one(
        "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint",
        &[],
    )
    .await?
    .get(0))
}

fn to_json(c: &Cutover) -> Result<serde_json::Value, ClusterError> {
    serde_json::to_value(c).map_err(|e| ClusterError::Invariant(format!("a cut-over: {e}")))
}

/// A failure of an operator's request: refused (with why) or storage.
#[derive(Debug, thiserror::Error)]
pub enum CutoverError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

impl From<tokio_postgres::Error> for CutoverError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Cluster(e.into())
    }
}

/// The topic's id and writer config, its row held against a concurrent
/// start or delete.
async fn topic_for_change(
    tx: &tokio_postgres::Transaction<'_>,
    topic: &str,
) -> Result<(uuid::Uuid, Option<String>), CutoverError> {
    if crate::machines::names::is_internal_topic(topic) {
        return Err(CutoverError::Refused(format!(
            "{topic} is an internal topic: it has no writer to hand over"
        )));
    }
    let row = tx
        .query_opt(
            "SELECT id, configs->>$2 FROM topics WHERE name = $1 FOR NO KEY UPDATE",
            &[&topic, &WRITER_PREFIX_CONFIG],
        )
        .await?
        .ok_or_else(|| CutoverError::Refused(format!("unknown topic {topic}")))?;
    Ok((row.get(0), row.get(1)))
}

async fn current(
    tx: &tokio_postgres::Transaction<'_>,
    topic_id: uuid::Uuid,
) -> Result<Option<Cutover>, ClusterError> {
    tx.query_opt(
        "SELECT cutover FROM cutovers WHERE topic_id = $1 FOR UPDATE",
        &[&topic_id],
    )
    .await?
    .map(|r| {
        serde_json::from_value(r.get(0))
            .map_err(|e| ClusterError::Invariant(format!("a cutovers row: {e}")))
    })
    .transpose()
}

async fn store(
    tx: &tokio_postgres::Transaction<'_>,
    topic_id: uuid::Uuid,
    c: &Cutover,
) -> Result<(), ClusterError> {
    tx.execute(
        "INSERT INTO cutovers (topic_id, cutover) VALUES ($1, $2) \
         ON CONFLICT (topic_id) DO UPDATE SET cutover = EXCLUDED.cutover, \
           changed_at = clock_timestamp()",
        &[&topic_id, &to_json(c)?],
    )
    .await?;
    Ok(())
}

/// Changes the cut-over of `topic` to what `f` makes of the current one
/// (given the topic's writer config and PostgreSQL's clock), in one
/// transaction holding the topic's row and its cut-over's.
pub async fn change(
    pool: &Pool,
    topic: &str,
    f: impl FnOnce(Option<&Cutover>, Option<&str>, i64) -> Result<Cutover, String>,
) -> Result<Cutover, CutoverError> {
    let mut client = pool.get().await.map_err(ClusterError::from)?;
    let tx = client.transaction().await?;
    let (topic_id, config) = topic_for_change(&tx, topic).await?;
    let existing = current(&tx, topic_id).await?;
    let now = pg_now(&*tx).await?;
    let c = f(existing.as_ref(), config.as_deref(), now).map_err(CutoverError::Refused)?;
    store(&tx, topic_id, &c).await?;
    tx.commit().await?;
    Ok(c)
}

/// PostgreSQL's clock in ms.
pub async fn now(pool: &Pool) -> Result<i64, ClusterError> {
    let client = pool.get().await?;
    pg_now(&**client).await
}

/// Every topic's latest cut-over.
pub async fn all(pool: &Pool) -> Result<Vec<Cutover>, ClusterError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT c.cutover FROM cutovers c JOIN topics t ON t.id = c.topic_id ORDER BY t.name",
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| {
            serde_json::from_value(r.get(0))
                .map_err(|e| ClusterError::Invariant(format!("a cutovers row: {e}")))
        })
        .collect()
}

pub async fn get(pool: &Pool, topic: &str) -> Result<Option<Cutover>, ClusterError> {
    let client = pool.get().await?;
    client
        .query_opt(
            "SELECT c.cutover FROM cutovers c JOIN topics t ON t.id = c.topic_id WHERE t.name = $1",
            &[&topic],
        )
        .await?
        .map(|r| {
            serde_json::from_value(r.get(0))
                .map_err(|e| ClusterError::Invariant(format!("a cutovers row: {e}")))
        })
        .transpose()
}

/// The transactions of `writer` (every id whose prefix it is).
async fn of_writer(c: &impl GenericClient, writer: &str) -> Result<Vec<TxnMeta>, ClusterError> {
    let rows = c
        .query(
            "SELECT meta FROM transactions WHERE starts_with(transactional_id, $1) \
             ORDER BY transactional_id",
            &[&writer],
        )
        .await?;
    let mut out = Vec::new();
    for r in rows {
        let m: TxnMeta = serde_json::from_value(r.get(0))
            .map_err(|e| ClusterError::Invariant(format!("a transactions row: {e}")))?;
        if prefix_of(&m.transactional_id) == writer {
            out.push(m);
        }
    }
    Ok(out)
}

/// The transactions of `writer` that hold `topic`.
pub async fn holding(pool: &Pool, writer: &str, topic: &str) -> Result<Vec<TxnMeta>, ClusterError> {
    let client = pool.get().await?;
    Ok(of_writer(&**client, writer)
        .await?
        .into_iter()
        .filter(|m| holds_topic(m, topic))
        .collect())
}

/// Changes the cut-over of `topic` by `f` if it still is in `phase`, in one
/// transaction holding its row.
pub async fn update_if(
    pool: &Pool,
    topic: &str,
    phase: Phase,
    f: impl FnOnce(&mut Cutover),
) -> Result<(), ClusterError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let Some(row) = tx
        .query_opt(
            "SELECT c.topic_id, c.cutover FROM cutovers c JOIN topics t ON t.id = c.topic_id \
             WHERE t.name = $1 FOR UPDATE OF c",
            &[&topic],
        )
        .await?
    else {
        return Ok(());
    };
    let topic_id: uuid::Uuid = row.get(0);
    let mut c: Cutover = serde_json::from_value(row.get(1))
        .map_err(|e| ClusterError::Invariant(format!("a cutovers row: {e}")))?;
    if c.phase != phase {
        return Ok(());
    }
    f(&mut c);
    store(&tx, topic_id, &c).await?;
    tx.commit().await?;
    Ok(())
}

/// Fences every transactional id of `writer` (only those whose transaction
/// holds `holding`, when given), each by a decision of its own: an open
/// transaction is aborted with a bumped epoch, an idle id gets a bumped
/// epoch. Returns how many were fenced; an error leaves the rest to the
/// next call.
pub async fn fence_writer(
    cluster: &Cluster,
    writer: &str,
    holding: Option<&str>,
    why: &str,
) -> Result<usize, ClusterError> {
    let ids: Vec<String> = {
        let client = cluster.pool.get().await?;
        of_writer(&**client, writer)
            .await?
            .into_iter()
            .filter(|m| holding.is_none_or(|t| holds_topic(m, t)))
            .map(|m| m.transactional_id)
            .collect()
    };
    let mut fenced = 0;
    for id in &ids {
        let seen: std::sync::Mutex<Option<(i64, i16, i16)>> = std::sync::Mutex::new(None);
        let s = &seen;
        let f = Box::new(
            move |m: Option<&TxnMeta>, now: i64, new_pid: &mut dyn FnMut() -> i64, _: &Gates| {
                let Some(m) = m.filter(|m| holding.is_none_or(|t| holds_topic(m, t))) else {
                    return Ok(Vec::new());
                };
                let effects = if m.state == TxnState::Ongoing {
                    crate::machines::txn_coordinator::decide_admin_abort(m, now, new_pid)
                } else {
                    crate::machines::txn_coordinator::fence_idle(m, now, new_pid)
                        .map(|n| vec![Effect::Persist(n)])
                        .unwrap_or_default()
                };
                let after = effects.iter().find_map(|e| match e {
                    Effect::Persist(n) => Some(n.epoch),
                    _ => None,
                });
                if let (Some(after), Ok(mut s)) = (after, s.lock()) {
                    *s = Some((m.producer_id, m.epoch, after));
                }
                Ok(effects)
            },
        );
        if let Err(e) = txn::run(cluster, id, &[], f).await? {
            return Err(ClusterError::Invariant(format!(
                "fencing {id:?} was refused: {e}"
            )));
        }
        if let Some((pid, old, new)) = seen.into_inner().unwrap_or_else(|p| p.into_inner()) {
            fenced += 1;
            tracing::info!(transactional_id = %id, producer_id = pid, old_epoch = old, new_epoch = new,
                reason = why, "transactional id fenced");
        }
    }
    Ok(fenced)
}

/// The switch: `Switched` and the topic's writer config in one transaction
/// holding the cut-over row, taken only while no transaction of the old
/// writer holds the topic. `Ok(false)`: not yet.
pub async fn switch(pool: &Pool, c: &Cutover) -> Result<bool, ClusterError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    // The topic's row before the cut-over's, in the order a start, a
    // rollback and a topic's deletion take them (no lock cycle).
    if tx
        .query_opt(
            "SELECT 1 FROM topics WHERE name = $1 FOR NO KEY UPDATE",
            &[&c.topic],
        )
        .await?
        .is_none()
    {
        return Ok(false);
    }
    let Some(row) = tx
        .query_opt(
            "SELECT c.topic_id, c.cutover FROM cutovers c JOIN topics t ON t.id = c.topic_id \
             WHERE t.name = $1 FOR UPDATE OF c",
            &[&c.topic],
        )
        .await?
    else {
        return Ok(false);
    };
    let topic_id: uuid::Uuid = row.get(0);
    let mut now_c: Cutover = serde_json::from_value(row.get(1))
        .map_err(|e| ClusterError::Invariant(format!("a cutovers row: {e}")))?;
    if now_c.phase != Phase::Draining || now_c.from != c.from || now_c.to != c.to {
        return Ok(false);
    }
    // Read after the lock: every decision that changed whether one of them
    // holds the topic held the row, and has committed.
    if of_writer(&*tx, &c.from)
        .await?
        .iter()
        .any(|m| holds_topic(m, &c.topic))
    {
        return Ok(false);
    }
    now_c.phase = Phase::Switched;
    now_c.ended_ms = pg_now(&*tx).await?;
    store(&tx, topic_id, &now_c).await?;
    tx.execute(
        "UPDATE topics SET configs = jsonb_set(configs, ARRAY[$2::text], to_jsonb($3::text)) \
         WHERE id = $1",
        &[&topic_id, &WRITER_PREFIX_CONFIG, &c.to],
    )
    .await?;
    // A hand-over is no second writer: the old writer's recent commits go.
    tx.execute(
        "DELETE FROM topic_writers WHERE topic = $1 AND writer = $2",
        &[&c.topic, &c.from],
    )
    .await?;
    tx.execute(
        "SELECT pg_notify($1, $2)",
        &[&super::catalogue::CATALOGUE_CHANNEL, &c.topic],
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Sets the topic's `writer.transactional.id.prefix` (the switch already
/// did; done again by the driver's last step, so it holds whatever the
/// switch left).
pub async fn set_writer(pool: &Pool, topic: &str, writer: &str) -> Result<(), ClusterError> {
    let client = pool.get().await?;
    let n = client
        .execute(
            "UPDATE topics SET configs = jsonb_set(configs, ARRAY[$2::text], to_jsonb($3::text)) \
             WHERE name = $1 AND configs->>$2 IS DISTINCT FROM $3",
            &[&topic, &WRITER_PREFIX_CONFIG, &writer],
        )
        .await?;
    if n > 0 {
        client
            .execute(
                "SELECT pg_notify($1, $2)",
                &[&super::catalogue::CATALOGUE_CHANNEL, &topic],
            )
            .await?;
    }
    Ok(())
}
