//! The transaction coordinator in cluster mode: the same decisions as local
//! mode ([`crate::machines::txn_coordinator`]'s `decide_*`, pure effect lists), run
//! by a driver that executes *every* effect of a decision inside one
//! PostgreSQL transaction holding the transactional id's row `FOR UPDATE`:
//! the new coordinator state, the COMMIT/ABORT markers of every partition
//! (with their LSO and aborted-index changes), the transaction's pending
//! group offsets made committed or dropped, and the reply's identity
//! commit together or not at all. There is no PREPARE state anyone can see
//! and no marker to re-drive after a crash.
//!
//! Any broker may run a decision for any id (PostgreSQL orders them);
//! FindCoordinator spreads ids over the live brokers for load only.

use std::collections::{BTreeMap, HashMap};

use deadpool_postgres::Pool;
use oncelog_log::batch;
use uuid::Uuid;

pub use super::gates::{Gates, Refusal};
use super::sequencer::Advanced;
use super::session::check_fence;
use super::{Cluster, ClusterError};
use crate::machines::producer_state::{ProducerEntry, ProducerState};
use crate::machines::txn_coordinator::{self as tc, Effect, OnTimeout, TxnMeta};

/// Cluster mode has one coordinator epoch: PostgreSQL orders every marker.
const COORDINATOR_EPOCH: i32 = 0;

/// A decision: given the current state (if any), PostgreSQL's time in ms,
/// a producer id allocator and the gates of the topics involved, the
/// effects to run.
pub type Decide<'a> = dyn FnOnce(Option<&TxnMeta>, i64, &mut dyn FnMut() -> i64, &Gates) -> Result<Vec<Effect>, Refusal>
    + Send
    + 'a;

/// What a committed decision did: the reply's identity, the id's state
/// before, and the effects run (for the callers' log lines, counters and
/// history).
#[derive(Debug, Clone)]
pub struct Ran {
    pub identity: (i64, i16),
    pub before: Option<TxnMeta>,
    pub effects: Vec<Effect>,
}

impl Ran {
    /// The id's state after the decision (its last write), if it changed.
    pub fn after(&self) -> Option<&TxnMeta> {
        self.effects.iter().rev().find_map(|e| match e {
            Effect::Persist(m) | Effect::PersistLater(m) => Some(m),
            _ => None,
        })
    }

    /// The transaction it ended: (prepared, completed), as
    /// [`tc::transition`].
    pub fn ended(&self) -> Option<(&TxnMeta, &TxnMeta)> {
        tc::transition(&self.effects)
    }
}

/// Runs one decision for `id`; `Ok(Err(_))` is a refusal (nothing
/// written), `Ok(Ok(ran))` what it did, after the commit. The gates
/// (writer fence, cut-over) of `topics` and of every topic the id's open
/// transaction holds are read in the same PostgreSQL transaction, the
/// cut-over rows held `FOR SHARE` ([`super::cutover`]).
pub async fn run(
    cluster: &Cluster,
    id: &str,
    topics: &[String],
    decide: Box<Decide<'_>>,
) -> Result<Result<Ran, Refusal>, ClusterError> {
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    check_fence(&*tx, cluster.config.broker_id, cluster.session.session()).await?;
    let row = tx
        .query_opt(
            "SELECT meta, (extract(epoch from clock_timestamp()) * 1000)::bigint \
             FROM transactions WHERE transactional_id = $1 FOR UPDATE",
            &[&id],
        )
        .await?;
    let (existing, now) = match row {
        Some(r) => {
            let meta: serde_json::Value = r.get(0);
            let meta: TxnMeta = serde_json::from_value(meta)
                .map_err(|e| ClusterError::Invariant(format!("transactions row {id}: {e}")))?;
            (Some(meta), r.get::<_, i64>(1))
        }
        None => {
            let r = tx
                .query_one(
                    "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint",
                    &[],
                )
                .await?;
            (None, r.get::<_, i64>(0))
        }
    };
    // Producer ids a decision may need, drawn before it (an unused one is a
    // harmless gap in the sequence).
    let ids: Vec<i64> = tx
        .query(
            "SELECT nextval('producer_ids') FROM generate_series(1, 2)",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut drawn = ids.into_iter();
    let mut spare = -1i64;
    let mut new_pid = || {
        drawn.next().unwrap_or_else(|| {
            spare -= 1;
            spare
        })
    };
    let mut involved: Vec<String> = topics.to_vec();
    if let Some(m) = &existing {
        involved.extend(m.partitions.iter().map(|(t, _)| t.clone()));
    }
    let gates = Gates::load(&tx, &involved).await?;
    let effects = match decide(existing.as_ref(), now, &mut new_pid, &gates) {
        Ok(e) => e,
        Err(e) => return Ok(Err(e)),
    };
    if spare < -1 {
        return Err(ClusterError::Invariant(
            "a decision needed more producer ids than were drawn".into(),
        ));
    }
    let mut reply = None;
    let mut moved = Vec::new();
    for e in effects.iter().cloned() {
        match e {
            Effect::Persist(m) | Effect::PersistLater(m) => {
                let meta = serde_json::to_value(&m)
                    .map_err(|e| ClusterError::Invariant(format!("TxnMeta: {e}")))?;
                tx.execute(
                    "INSERT INTO transactions (transactional_id, producer_id, meta) \
                     VALUES ($1, $2, $3) ON CONFLICT (transactional_id) DO UPDATE \
                     SET producer_id = EXCLUDED.producer_id, meta = EXCLUDED.meta, \
                         updated_at = clock_timestamp()",
                    &[&id, &m.producer_id, &meta],
                )
                .await?;
            }
            Effect::WriteMarkers {
                producer_id,
                epoch,
                commit,
                partitions,
            } => {
                let partitions = crate::faults::marker_partitions(id, commit, partitions);
                moved.extend(
                    write_markers(
                        &tx,
                        &|t, p, n| cluster.check_next(t, p, n),
                        producer_id,
                        epoch,
                        commit,
                        &partitions,
                        now,
                    )
                    .await?,
                );
            }
            Effect::CompleteOffsets {
                producer_id,
                commit,
            } => super::groups::complete_offsets(&tx, producer_id, commit).await?,
            Effect::Reply { producer_id, epoch } => reply = Some((producer_id, epoch)),
        }
    }
    tx.commit().await?;
    cluster.committed(&moved);
    Ok(Ok(Ran {
        identity: reply.unwrap_or((-1, -1)),
        before: existing,
        effects,
    }))
}

/// Writes one marker per partition, in (topic id, partition) order, each
/// under its partition's row lock, with the producer-state change (the LSO)
/// and, for an abort, the aborted-index row.
#[allow(clippy::too_many_arguments)]
async fn write_markers(
    tx: &tokio_postgres::Transaction<'_>,
    check_next: &super::sequencer::CheckNext<'_>,
    producer_id: i64,
    epoch: i16,
    commit: bool,
    partitions: &[(String, i32)],
    now: i64,
) -> Result<Vec<Advanced>, ClusterError> {
    let names: Vec<String> = partitions.iter().map(|(t, _)| t.clone()).collect();
    let ids: HashMap<String, Uuid> = tx
        .query(
            "SELECT name, id FROM topics WHERE name = ANY($1)",
            &[&names],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut targets: Vec<(Uuid, i32)> = partitions
        .iter()
        .filter_map(|(t, p)| ids.get(t).map(|id| (*id, *p)))
        .collect();
    targets.sort();
    targets.dedup();
    let mut moved = Vec::new();
    for (topic_id, partition) in targets {
        let Some(row) = tx
            .query_opt(
                "SELECT next_offset FROM partitions WHERE topic_id = $1 AND partition = $2 \
                 FOR UPDATE",
                &[&topic_id, &partition],
            )
            .await?
        else {
            continue; // the partition went with its topic
        };
        let offset: i64 = row.get(0);
        check_next(&topic_id, partition, offset)?;
        let entry = tx
            .query_opt(
                "SELECT entry FROM producers WHERE topic_id = $1 AND partition = $2 \
                 AND producer_id = $3",
                &[&topic_id, &partition, &producer_id],
            )
            .await?;
        let mut entries = BTreeMap::new();
        if let Some(r) = entry {
            let v: serde_json::Value = r.get(0);
            let e: ProducerEntry = serde_json::from_value(v)
                .map_err(|e| ClusterError::Invariant(format!("a producers row: {e}")))?;
            entries.insert(producer_id, e);
        }
        let mut state = ProducerState::with_entries(entries);
        if let Err(r) = state.check_marker(producer_id, epoch, COORDINATOR_EPOCH) {
            tracing::warn!(producer_id, epoch, error = %r, "cluster: marker refused by the partition; skipped");
            continue;
        }
        let data = batch::build_marker(producer_id, epoch, commit, COORDINATOR_EPOCH, now);
        let done = state.apply_marker(producer_id, epoch, COORDINATOR_EPOCH, offset, !commit, now);
        tx.execute(
            "INSERT INTO batches (topic_id, partition, base_offset, last_offset, object_key, \
               position, length, inline_data, max_timestamp, producer_id, control) \
             VALUES ($1, $2, $3, $3, NULL, 0, $4, $5, $6, $7, true)",
            &[
                &topic_id,
                &partition,
                &offset,
                &(data.len() as i32),
                &data,
                &now,
                &producer_id,
            ],
        )
        .await?;
        let e = state
            .get(producer_id)
            .ok_or_else(|| ClusterError::Invariant("marker without producer state".into()))?;
        let ev = serde_json::to_value(e)
            .map_err(|e| ClusterError::Invariant(format!("a producer entry: {e}")))?;
        tx.execute(
            "INSERT INTO producers (topic_id, partition, producer_id, txn_first_offset, entry) \
             VALUES ($1, $2, $3, NULL, $4) ON CONFLICT (topic_id, partition, producer_id) \
             DO UPDATE SET txn_first_offset = NULL, entry = EXCLUDED.entry",
            &[&topic_id, &partition, &producer_id, &ev],
        )
        .await?;
        if let Some(t) = done.filter(|t| t.aborted) {
            tx.execute(
                "INSERT INTO aborted_txns (topic_id, partition, producer_id, first_offset, \
                   last_offset) VALUES ($1, $2, $3, $4, $5)",
                &[
                    &topic_id,
                    &partition,
                    &producer_id,
                    &t.first_offset,
                    &t.last_offset,
                ],
            )
            .await?;
        }
        tx.execute(
            "UPDATE partitions SET next_offset = $3 WHERE topic_id = $1 AND partition = $2",
            &[&topic_id, &partition, &(offset + 1)],
        )
        .await?;
        moved.push(Advanced {
            topic_id,
            partition,
            next_offset: offset + 1,
        });
    }
    Ok(moved)
}

/// The open transactions that outlived their timeout (by PostgreSQL's
/// clock), with that clock's time now.
pub async fn expired(pool: &Pool) -> Result<(Vec<TxnMeta>, i64), ClusterError> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT meta, (extract(epoch from clock_timestamp()) * 1000)::bigint \
             FROM transactions WHERE meta->>'state' = 'Ongoing' \
             AND (meta->>'start_ms')::bigint >= 0 \
             AND (meta->>'start_ms')::bigint + (meta->>'timeout_ms')::bigint \
                 < (extract(epoch from clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await?;
    let now = match rows.first() {
        Some(r) => r.get::<_, i64>(1),
        None => return Ok((Vec::new(), 0)),
    };
    let metas = rows
        .iter()
        .map(|r| {
            serde_json::from_value(r.get::<_, serde_json::Value>(0))
                .map_err(|e| ClusterError::Invariant(format!("a transactions row: {e}")))
        })
        .collect::<Result<_, _>>()?;
    Ok((metas, now))
}

/// The state of one transactional id.
pub async fn describe(pool: &Pool, id: &str) -> Result<Option<TxnMeta>, ClusterError> {
    let client = pool.get().await?;
    let row = client
        .query_opt(
            "SELECT meta FROM transactions WHERE transactional_id = $1",
            &[&id],
        )
        .await?;
    row.map(|r| {
        serde_json::from_value(r.get::<_, serde_json::Value>(0))
            .map_err(|e| ClusterError::Invariant(format!("a transactions row: {e}")))
    })
    .transpose()
}

/// A transaction the timeout driver ended: aborted, its producer fenced.
#[derive(Debug, Clone)]
pub struct TimedOut {
    /// The state before (its producer id and epoch, partitions, timeout).
    pub before: TxnMeta,
    /// The abort: prepared (at the fenced producer's next epoch), then
    /// completed.
    pub prepared: TxnMeta,
    pub done: TxnMeta,
    /// It had been parked (under the two-phase-commit policy) until the
    /// maximum park time.
    pub was_parked: bool,
}

/// Aborts (fencing their producers) the transactions that outlived their
/// timeout, by PostgreSQL's clock, unless `on_timeout` parks them (then
/// only once parked longer than the maximum). Safe on every broker at
/// once: each abort is a decision under the id's row lock, re-decided on
/// the row as it is then, and one that finds the transaction already ended
/// does nothing. Returns what this call ended.
pub async fn abort_expired(
    cluster: &Cluster,
    on_timeout: &(dyn Fn(&TxnMeta) -> OnTimeout + Sync),
) -> Result<Expired, ClusterError> {
    let (candidates, now) = expired(&cluster.pool).await?;
    let mut done = Vec::new();
    let mut parked = Vec::new();
    for m in candidates {
        if tc::plan_timeout(&m, now, on_timeout(&m)).is_none() {
            parked.push(m); // parked, and not yet for the maximum
            continue;
        }
        let id = m.transactional_id.clone();
        let f = Box::new(
            move |m: Option<&TxnMeta>, now: i64, new_pid: &mut dyn FnMut() -> i64, g: &Gates| {
                // A transaction a cut-over's drain waits for ends only by its
                // own EndTxn or at the drain deadline.
                Ok(m.filter(|m| g.protected(m).is_none())
                    .map_or_else(Vec::new, |m| {
                        tc::decide_timeout(m, now, on_timeout(m), new_pid)
                    }))
            },
        );
        let ran = match run(cluster, &id, &[], f).await {
            Ok(Ok(ran)) => ran,
            Ok(Err(_)) => continue,
            Err(e) => {
                crate::backend::cluster::outage::cluster_warn!(cluster.outage, e, transactional_id = %id, error = %e, "cluster: timeout abort not committed");
                continue;
            }
        };
        let (Some(before), Some((prepared, completed))) = (ran.before.as_ref(), ran.ended()) else {
            continue;
        };
        let was_parked = matches!(on_timeout(before), OnTimeout::Park { .. });
        let (pid, old, timeout_ms, new) = (
            before.producer_id,
            before.epoch,
            before.timeout_ms,
            prepared.epoch,
        );
        if was_parked {
            tracing::warn!(transactional_id = %id, producer_id = pid, old_epoch = old, new_epoch = new, timeout_ms,
                "parked transaction reached the maximum park time (transaction.two.phase.commit.max.park.ms); aborting it and fencing its producer");
        } else {
            tracing::warn!(transactional_id = %id, producer_id = pid, old_epoch = old,
                new_epoch = new, timeout_ms,
                "transaction timed out; aborting it and fencing its producer");
        }
        done.push(TimedOut {
            before: before.clone(),
            prepared: prepared.clone(),
            done: completed.clone(),
            was_parked,
        });
    }
    Ok(Expired {
        ended: done,
        parked,
        now,
    })
}

/// What one pass of the timeout driver found.
#[derive(Debug, Clone, Default)]
pub struct Expired {
    /// The transactions it aborted.
    pub ended: Vec<TimedOut>,
    /// Those past their timeout that stay parked (the whole cluster's).
    pub parked: Vec<TxnMeta>,
    /// PostgreSQL's clock at the read, in ms.
    pub now: i64,
}

/// What an operator's abort of a producer id found.
#[derive(Debug, Clone)]
pub enum AdminAbort {
    /// Its open transactions are aborted and the producer fenced (a
    /// transaction already ended was left as it was): (before, prepared,
    /// completed) of each it aborted.
    Done(Vec<(TxnMeta, TxnMeta, TxnMeta)>),
    /// No transactional id has this producer id.
    NotKnown,
}

/// An operator's abort (WriteTxnMarkers ABORT from an admin tool) of the
/// transactions of producer `pid`: each runs local mode's decision under
/// its id's row lock, so the markers of every partition commit together.
pub async fn admin_abort(cluster: &Cluster, pid: i64) -> Result<AdminAbort, ClusterError> {
    let ids: Vec<String> = {
        let client = cluster.pool.get().await?;
        client
            .query(
                "SELECT transactional_id FROM transactions WHERE producer_id = $1",
                &[&pid],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    if ids.is_empty() {
        return Ok(AdminAbort::NotKnown);
    }
    let mut aborted = Vec::new();
    for id in ids {
        let f = Box::new(
            move |m: Option<&TxnMeta>, now: i64, new_pid: &mut dyn FnMut() -> i64, _: &Gates| {
                Ok(m.filter(|m| m.producer_id == pid)
                    .map_or_else(Vec::new, |m| tc::decide_admin_abort(m, now, new_pid)))
            },
        );
        let ran = match run(cluster, &id, &[], f).await? {
            Ok(ran) => ran,
            Err(e) => {
                tracing::warn!(transactional_id = %id, producer_id = pid, error = %e,
                    "cluster: admin abort refused by the coordinator");
                continue;
            }
        };
        if let (Some(before), Some((prepared, done))) = (ran.before.as_ref(), ran.ended()) {
            aborted.push((before.clone(), prepared.clone(), done.clone()));
        }
    }
    Ok(AdminAbort::Done(aborted))
}

/// The partitions this broker has seen added to each transactional id's
/// current transaction, by producer id and epoch (KIP-890 part 2: with
/// transactions V2 every transaction ends with a new epoch, so a producer
/// id and epoch name one transaction). A Produce v12 request whose
/// partitions are all here needs no coordinator decision to add them: the
/// produce commit verifies every transactional batch against the id's row
/// anyway, so a transaction that ended meanwhile still refuses the batch.
#[derive(Default)]
pub struct Added {
    by_id:
        std::sync::Mutex<HashMap<String, ((i64, i16), std::collections::HashSet<(String, i32)>)>>,
}

/// Transactional ids [`Added`] remembers at most (it forgets all beyond).
const ADDED_IDS: usize = 65_536;

impl Added {
    /// Whether every one of `parts` was added to the transaction of
    /// `tid`'s producer `pid` at `epoch`.
    pub fn covers(&self, tid: &str, pid: i64, epoch: i16, parts: &[(String, i32)]) -> bool {
        let m = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(tid) {
            Some((who, held)) if *who == (pid, epoch) => parts.iter().all(|p| held.contains(p)),
            _ => false,
        }
    }

    /// `parts` are in the transaction of `tid`'s producer `pid` at `epoch`.
    pub fn note(&self, tid: &str, pid: i64, epoch: i16, parts: &[(String, i32)]) {
        let mut m = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= ADDED_IDS && !m.contains_key(tid) {
            m.clear();
        }
        let e = m
            .entry(tid.to_string())
            .or_insert_with(|| ((pid, epoch), Default::default()));
        if e.0 != (pid, epoch) {
            *e = ((pid, epoch), Default::default());
        }
        e.1.extend(parts.iter().cloned());
    }
}
