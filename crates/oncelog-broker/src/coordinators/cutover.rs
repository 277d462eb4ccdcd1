//! The cut-over driver (scenario S10), written once over
//! [`crate::backend::Cutovers`]: the operator's start, rollback and status,
//! and the steps that move a cut-over on — the drain deadline, the switch,
//! then fencing the old writer (or, after a rollback, the new writer's
//! transactions holding the topic). The phases, checks and refusals are
//! the pure machine in [`crate::machines::cutover`].
//!
//! Local mode runs [`drive`] on the broker's transaction timer; cluster mode
//! as a job one broker holds the lease of. Each step is idempotent: a step
//! cut short by a crash is done again by the next run, on whichever broker.

use crate::backend::{CutoverFailure, Cutovers};
use crate::machines::cutover::{plan_rollback, plan_start, status_json, Cutover, Phase};

/// `oncelog cutover start`: no new transaction of `from` may write `topic`
/// from now on; `to` takes it over once `from`'s transactions holding it
/// have ended (or at the drain deadline).
pub async fn start(
    s: &Cutovers<'_>,
    topic: &str,
    from: &str,
    to: &str,
    drain_timeout_ms: i64,
) -> Result<Cutover, CutoverFailure> {
    let c = s
        .change(topic, |cur, config, now| {
            plan_start(cur, topic, config, from, to, now, drain_timeout_ms)
        })
        .await?;
    let holding: Vec<String> = s
        .holding(from, topic)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.transactional_id)
        .collect();
    tracing::warn!(topic, from, to, drain_timeout_ms, open_transactions_of_from = ?holding,
        "cut-over started: no new transaction of {from:?} may write the topic; commits of {to:?} wait until these have ended");
    Ok(c)
}

/// `oncelog cutover rollback`: only while draining.
pub async fn rollback(s: &Cutovers<'_>, topic: &str) -> Result<Cutover, CutoverFailure> {
    let c = s
        .change(topic, |cur, _, now| plan_rollback(cur, topic, now))
        .await?;
    tracing::warn!(topic, from = %c.from, to = %c.to, "cut-over rolled back: {:?} writes the topic again", c.from);
    Ok(c)
}

/// What `oncelog cutover status` shows of `topic`: its cut-over with the
/// old writer's open transactions a drain waits for.
pub async fn status(s: &Cutovers<'_>, topic: &str) -> Result<serde_json::Value, CutoverFailure> {
    let c = s.get(topic).await?;
    let waiting = match &c {
        Some(c) if c.phase == Phase::Draining => s.holding(&c.from, topic).await?,
        _ => Vec::new(),
    };
    Ok(status_json(topic, c.as_ref(), &waiting))
}

/// Every cut-over with the number of the old writer's transactions a
/// draining one waits for (`/metrics`).
pub async fn with_waiting(s: &Cutovers<'_>) -> Result<Vec<(Cutover, usize)>, CutoverFailure> {
    let mut out = Vec::new();
    for c in s.all().await? {
        let n = if c.phase == Phase::Draining {
            s.holding(&c.from, &c.topic).await?.len()
        } else {
            0
        };
        out.push((c, n));
    }
    Ok(out)
}

/// One step of every cut-over. Each topic on its own: one that fails
/// holds up no other's deadline or switch, and is retried at the next run.
pub async fn drive(s: &Cutovers<'_>) {
    let Ok(all) = s.all().await else {
        return;
    };
    for c in all {
        let step = async {
            match c.phase {
                Phase::Draining => drain(s, &c).await,
                Phase::Switched if !c.done => finish(s, &c).await,
                Phase::RolledBack if !c.done => undo(s, &c).await,
                _ => Ok(()),
            }
        };
        if let Err(e) = step.await {
            tracing::debug!(topic = %c.topic, phase = ?c.phase, error = %e, "cut-over: this step is not finished; retried");
        }
    }
}

async fn drain(s: &Cutovers<'_>, c: &Cutover) -> Result<(), CutoverFailure> {
    if s.now().await? >= c.drain_deadline_ms {
        let open: Vec<String> = s
            .holding(&c.from, &c.topic)
            .await?
            .into_iter()
            .map(|m| m.transactional_id)
            .collect();
        if !open.is_empty() {
            tracing::warn!(topic = %c.topic, from = %c.from, transactions = ?open,
                "cut-over drain deadline reached: aborting the old writer's open transactions");
            s.fence_writer(&c.from, Some(&c.topic), "cut-over drain deadline")
                .await?;
            s.update_if(&c.topic, Phase::Draining, |n| {
                n.aborted_at_deadline.extend(open)
            })
            .await?;
        }
    }
    if s.switch(c).await? {
        tracing::warn!(topic = %c.topic, from = %c.from, to = %c.to,
            "cut-over switched: {:?} is the topic's writer; fencing every transactional id of {:?}", c.to, c.from);
        if let Some(c) = s.get(&c.topic).await? {
            finish(s, &c).await?;
        }
    }
    Ok(())
}

/// After the switch: every transactional id of the old writer fenced, the
/// topic's writer config set to the new writer, then done.
async fn finish(s: &Cutovers<'_>, c: &Cutover) -> Result<(), CutoverFailure> {
    let fenced = s.fence_writer(&c.from, None, "cut-over").await?;
    s.set_writer(&c.topic, &c.to).await?;
    s.update_if(&c.topic, Phase::Switched, |n| n.done = true)
        .await?;
    tracing::info!(topic = %c.topic, from = %c.from, to = %c.to, fenced_ids = fenced, "cut-over done");
    Ok(())
}

/// After a rollback: the new writer's transactions holding the topic
/// aborted, then done.
async fn undo(s: &Cutovers<'_>, c: &Cutover) -> Result<(), CutoverFailure> {
    s.fence_writer(&c.to, Some(&c.topic), "cut-over rolled back")
        .await?;
    s.update_if(&c.topic, Phase::RolledBack, |n| n.done = true)
        .await
}
