//! The produce commit: one PostgreSQL transaction per flushed object that
//! checks the broker's fencing token, claims the object's key slab, assigns
//! offsets under each partition's row lock, applies the idempotence rules
//! (the same [`ProducerState`] code as local mode, over the producers' rows)
//! and records where every batch lives. Nothing is acknowledged before it
//! commits; if it does not commit, nothing of it is visible.
//!
//! A partition's row lock (`SELECT … FOR UPDATE` on `partitions`) guards
//! everything of that partition: its offsets, its batch rows and its
//! producers' rows. Flushes lock their partitions in (topic id, partition)
//! order, so two flushes never deadlock.

use std::collections::{BTreeMap, HashMap};

use deadpool_postgres::Pool;
use tokio_postgres::Statement;
use uuid::Uuid;

use super::keys::{ObjectKey, CLAIM_SQL};
use super::ClusterError;
use crate::machines::producer_state::{
    ProduceReject, ProducerBatch, ProducerEntry, ProducerState, Verdict,
};
use crate::machines::txn_coordinator::{verify_write, ProducerView, TxnMeta, VerifyError};

/// One client batch of a flushed object.
#[derive(Debug, Clone)]
pub struct FlushBatch {
    pub topic_id: Uuid,
    /// The topic's name (transactions name their partitions by it).
    pub topic: std::sync::Arc<str>,
    pub partition: i32,
    /// Where the batch starts in the object, and its length.
    pub position: u64,
    pub length: u32,
    pub last_offset_delta: i32,
    pub max_timestamp: i64,
    /// Set for batches with a producer id (idempotent or transactional).
    pub producer: Option<ProducerBatch>,
}

/// What the commit did with one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    Appended {
        base_offset: i64,
        log_start_offset: i64,
    },
    /// A retry of a batch already in the log: its original base offset.
    Duplicate {
        base_offset: i64,
        log_start_offset: i64,
    },
    Rejected(ProduceReject),
    /// No such partition (the topic was deleted, or never existed).
    UnknownPartition,
    /// A transactional batch its producer's open transaction does not hold
    /// (not added, ended, or the producer was fenced).
    Unverified(VerifyError),
    /// The partition's next offset in PostgreSQL is below one this broker
    /// saw committed ([`super::Cluster::check_next`]): not appended. Says why.
    Behind(String),
}

/// A partition's high watermark after a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advanced {
    pub topic_id: Uuid,
    pub partition: i32,
    pub next_offset: i64,
}

/// The NOTIFY channel commits announce new offsets on.
pub const DATA_CHANNEL: &str = "oncelog_data";

/// A statement's parameter.
type Param<'a> = dyn tokio_postgres::types::ToSql + Sync + 'a;

/// Asks whether a partition's next offset in PostgreSQL is behind what
/// this broker saw ([`super::Cluster::check_next`]).
pub type CheckNext<'a> = dyn Fn(&Uuid, i32, i64) -> Result<(), ClusterError> + Sync + 'a;

/// The statements of a produce commit, prepared once per connection
/// (deadpool's statement cache), so each costs no round trip of its own.
struct Statements {
    fence: Statement,
    claim: Statement,
    insert_object: Statement,
    views: Statement,
    lock: Statement,
    producers: Statement,
    insert_batches: Statement,
    write_producers: Statement,
    advance: Statement,
    announce: Statement,
}

const INSERT_OBJECT: &str = "INSERT INTO objects (key, size, broker_id) VALUES ($1, $2, $3)";
/// Transactional producers' coordinator rows, `FOR SHARE` (before the
/// partitions, the order EndTxn takes them in too).
const VIEWS: &str = "SELECT meta FROM transactions WHERE producer_id = ANY($1) \
     ORDER BY transactional_id FOR SHARE";
/// Every partition of the flush, locked in order.
const LOCK: &str = "SELECT topic_id, partition, next_offset, log_start_offset FROM partitions \
     WHERE (topic_id, partition) IN (SELECT * FROM unnest($1::uuid[], $2::int[])) \
     ORDER BY topic_id, partition FOR UPDATE";
const PRODUCERS: &str = "SELECT topic_id, partition, producer_id, entry FROM producers \
     WHERE (topic_id, partition, producer_id) IN \
       (SELECT * FROM unnest($1::uuid[], $2::int[], $3::bigint[]))";
const INSERT_BATCHES: &str = "INSERT INTO batches (topic_id, partition, base_offset, \
       last_offset, object_key, position, length, max_timestamp, producer_id, control) \
     SELECT t, p, b, l, k, pos, len, ts, pid, false FROM unnest($1::uuid[], $2::int[], \
       $3::bigint[], $4::bigint[], $5::text[], $6::bigint[], $7::int[], $8::bigint[], \
       $9::bigint[]) AS u (t, p, b, l, k, pos, len, ts, pid)";
const WRITE_PRODUCERS: &str = "INSERT INTO producers (topic_id, partition, producer_id, \
       txn_first_offset, entry) \
     SELECT * FROM unnest($1::uuid[], $2::int[], $3::bigint[], $4::bigint[], $5::jsonb[]) \
     ON CONFLICT (topic_id, partition, producer_id) DO UPDATE \
       SET txn_first_offset = EXCLUDED.txn_first_offset, entry = EXCLUDED.entry";
const ADVANCE: &str = "UPDATE partitions AS p SET next_offset = u.n \
     FROM unnest($1::uuid[], $2::int[], $3::bigint[]) AS u (t, q, n) \
     WHERE p.topic_id = u.t AND p.partition = u.q AND p.next_offset <> u.n";
/// After the commit, in the same round trip but a transaction of its own:
/// tells the other brokers where the commit moved its partitions, only if
/// PostgreSQL holds those offsets (so nothing is announced for a commit
/// that did not happen).
const ANNOUNCE: &str = "SELECT pg_notify($1, $2) WHERE NOT EXISTS (SELECT 1 \
       FROM unnest($3::uuid[], $4::int[], $5::bigint[]) AS u (t, q, n) \
       LEFT JOIN partitions p ON p.topic_id = u.t AND p.partition = u.q \
     WHERE p.next_offset IS NULL OR p.next_offset < u.n)";

impl Statements {
    async fn prepare(c: &deadpool_postgres::Client) -> Result<Self, ClusterError> {
        let (fence, claim, insert_object, views, lock, producers) = futures_util::try_join!(
            c.prepare_cached(super::session::FENCE_SQL),
            c.prepare_cached(CLAIM_SQL),
            c.prepare_cached(INSERT_OBJECT),
            c.prepare_cached(VIEWS),
            c.prepare_cached(LOCK),
            c.prepare_cached(PRODUCERS),
        )?;
        let (insert_batches, write_producers, advance, announce) = futures_util::try_join!(
            c.prepare_cached(INSERT_BATCHES),
            c.prepare_cached(WRITE_PRODUCERS),
            c.prepare_cached(ADVANCE),
            c.prepare_cached(ANNOUNCE),
        )?;
        Ok(Self {
            fence,
            claim,
            insert_object,
            views,
            lock,
            producers,
            insert_batches,
            write_producers,
            advance,
            announce,
        })
    }
}

/// A pooled connection inside a transaction its BEGIN was pipelined into.
/// The connection goes back to the pool only once the transaction is known
/// to have ended (its COMMIT answered, or a ROLLBACK after a failure); a
/// failed ROLLBACK, or a commit dropped midway, closes the connection
/// instead, which ends the transaction in PostgreSQL.
struct Pipelined {
    client: Option<deadpool_postgres::Client>,
    ended: bool,
}

impl Pipelined {
    fn new(client: deadpool_postgres::Client) -> Self {
        Self {
            client: Some(client),
            ended: false,
        }
    }

    async fn end(mut self, committed: bool) {
        self.ended = committed;
        if !committed {
            if let Some(c) = &self.client {
                self.ended = c.batch_execute("ROLLBACK").await.is_ok();
            }
        }
    }
}

impl Drop for Pipelined {
    fn drop(&mut self) {
        if !self.ended {
            if let Some(c) = self.client.take() {
                drop(deadpool_postgres::Object::take(c));
            }
        }
    }
}

/// Commits one flushed object of `size` bytes holding `batches`.
/// `Err` means nothing was committed (every batch may be retried).
///
/// Two round trips to PostgreSQL, each a pipeline of prepared statements:
/// the first begins the transaction, checks the fencing token, claims the
/// object's key slab, records the object and locks and reads what the
/// decisions need (the transactional producers' views, the partitions'
/// offsets, the producers' states); the second, after the same decisions
/// as local mode's, writes the batch index, the producers and the offsets,
/// commits, and then (when `announce`: another broker is live) announces
/// the new offsets to the other brokers. A failure anywhere ends the
/// transaction unwritten.
pub async fn commit_flush(
    pool: &Pool,
    check_next: &CheckNext<'_>,
    announce: bool,
    key: &ObjectKey,
    size: u64,
    batches: &[FlushBatch],
) -> Result<(Vec<BatchOutcome>, Vec<Advanced>), ClusterError> {
    let client = pool.get().await?;
    let st = Statements::prepare(&client).await?;
    let open = Pipelined::new(client);
    let Some(c) = open.client.as_ref() else {
        return Err(ClusterError::Invariant("no connection".into()));
    };
    let result = commit_pipelined(c, &st, check_next, announce, key, size, batches).await;
    open.end(result.is_ok()).await;
    result
}

async fn commit_pipelined(
    c: &deadpool_postgres::Client,
    st: &Statements,
    check_next: &CheckNext<'_>,
    announce: bool,
    object: &ObjectKey,
    size: u64,
    batches: &[FlushBatch],
) -> Result<(Vec<BatchOutcome>, Vec<Advanced>), ClusterError> {
    let mut txn_pids: Vec<i64> = batches
        .iter()
        .filter_map(|b| {
            b.producer
                .filter(|p| p.transactional)
                .map(|p| p.producer_id)
        })
        .collect();
    txn_pids.sort();
    txn_pids.dedup();
    let mut parts: Vec<(Uuid, i32)> = batches.iter().map(|b| (b.topic_id, b.partition)).collect();
    parts.sort();
    parts.dedup();
    let (pt, pp): (Vec<Uuid>, Vec<i32>) = parts.iter().copied().unzip();
    let (wt, wp, wi) = producer_keys(batches);

    // Round trip 1.
    let (broker_id, session, key) = (object.broker_id, object.session, object.key.as_str());
    let size = size as i64;
    let fence_p: [&Param<'_>; 2] = [&broker_id, &session];
    let claim_p: [&Param<'_>; 3] = [&broker_id, &session, &object.seq];
    let object_p: [&Param<'_>; 3] = [&key, &size, &broker_id];
    let views_p: [&Param<'_>; 1] = [&txn_pids];
    let lock_p: [&Param<'_>; 2] = [&pt, &pp];
    let producers_p: [&Param<'_>; 3] = [&wt, &wp, &wi];
    let (_, fence, claimed, _, views, rows, producers) = futures_util::try_join!(
        c.batch_execute("BEGIN"),
        c.query_opt(&st.fence, &fence_p),
        c.query_opt(&st.claim, &claim_p),
        c.execute(&st.insert_object, &object_p),
        c.query(&st.views, &views_p),
        c.query(&st.lock, &lock_p),
        c.query(&st.producers, &producers_p),
    )?;
    if fence.is_none() {
        return Err(ClusterError::Fenced { broker_id, session });
    }
    if claimed.is_none() {
        return Err(ClusterError::IntentGone(key.to_string()));
    }
    let views = parse_views(&views)?;
    let mut states = parse_producers(&producers)?;
    // (next offset, log start) per locked partition
    let mut offsets: BTreeMap<(Uuid, i32), (i64, i64)> = rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3))))
        .collect();
    // A partition behind what this broker saw appends nothing.
    let mut behind: BTreeMap<(Uuid, i32), String> = BTreeMap::new();
    for (k, (next, _)) in &offsets {
        if let Err(e) = check_next(&k.0, k.1, *next) {
            behind.insert(*k, e.to_string());
        }
    }
    offsets.retain(|k, _| !behind.contains_key(k));

    let (outcomes, ins, touched) =
        decide_batches(batches, key, &mut offsets, &behind, &mut states, &views);

    let advanced: Vec<Advanced> = offsets
        .iter()
        .map(|((t, p), (n, _))| Advanced {
            topic_id: *t,
            partition: *p,
            next_offset: *n,
        })
        .collect();
    let (at, ap, an): (Vec<Uuid>, Vec<i32>, Vec<i64>) = (
        advanced.iter().map(|a| a.topic_id).collect(),
        advanced.iter().map(|a| a.partition).collect(),
        advanced.iter().map(|a| a.next_offset).collect(),
    );
    let w = ProducerRows::of(&states, touched)?;

    // Round trip 2.
    let batches_p: [&Param<'_>; 9] = [
        &ins.topic,
        &ins.partition,
        &ins.base,
        &ins.last,
        &ins.key,
        &ins.position,
        &ins.length,
        &ins.max_ts,
        &ins.pid,
    ];
    let producers_p: [&Param<'_>; 5] = [&w.topic, &w.partition, &w.id, &w.txn, &w.entry];
    let advance_p: [&Param<'_>; 3] = [&at, &ap, &an];
    let payload = notify_payload(&advanced);
    let announce_p: [&Param<'_>; 5] = [&DATA_CHANNEL, &payload, &at, &ap, &an];
    let (written, announced) = futures_util::join!(
        async {
            futures_util::try_join!(
                c.execute(&st.insert_batches, &batches_p),
                c.execute(&st.write_producers, &producers_p),
                c.execute(&st.advance, &advance_p),
                c.batch_execute("COMMIT"),
            )
        },
        async {
            if announce {
                c.execute(&st.announce, &announce_p).await.map(|_| ())
            } else {
                Ok(())
            }
        },
    );
    written?;
    if let Err(e) = announced {
        // Costs the other brokers only a wake-up: a long poll reads again
        // when its wait ends.
        tracing::debug!(error = %e, "cluster: the announcement of new offsets was not sent");
    }
    Ok((outcomes, advanced))
}

/// Each batch's outcome by the same rules as a local partition, over the
/// locked partitions' `offsets` (advanced here) and the producers' `states`
/// (updated here); with the rows to insert and the producers touched.
fn decide_batches(
    batches: &[FlushBatch],
    key: &str,
    offsets: &mut BTreeMap<(Uuid, i32), (i64, i64)>,
    behind: &BTreeMap<(Uuid, i32), String>,
    states: &mut BTreeMap<(Uuid, i32), ProducerState>,
    views: &HashMap<i64, ProducerView>,
) -> (Vec<BatchOutcome>, BatchRows, Vec<(Uuid, i32, i64)>) {
    let mut outcomes = Vec::with_capacity(batches.len());
    let mut ins = BatchRows::default();
    let mut touched: Vec<(Uuid, i32, i64)> = Vec::new();
    for b in batches {
        let k = (b.topic_id, b.partition);
        if let Some(e) = behind.get(&k) {
            outcomes.push(BatchOutcome::Behind(e.clone()));
            continue;
        }
        let Some((next, log_start)) = offsets.get_mut(&k) else {
            outcomes.push(BatchOutcome::UnknownPartition);
            continue;
        };
        let log_start_offset = *log_start;
        if let Some(p) = &b.producer {
            // As a local partition: the producer's state first (a retry of
            // a stored batch is a duplicate even once its transaction has
            // ended; a stale epoch is the partition's refusal), then the
            // transaction's verification of a batch to append.
            let state = states.entry(k).or_default();
            let verdict = state.check(p);
            if let (Ok(Verdict::Append), true) = (&verdict, p.transactional) {
                if let Err(e) =
                    verify_write(views.get(&p.producer_id), p.epoch, &b.topic, b.partition)
                {
                    outcomes.push(BatchOutcome::Unverified(e));
                    continue;
                }
            }
            match verdict {
                Err(r) => {
                    outcomes.push(BatchOutcome::Rejected(r));
                    continue;
                }
                Ok(Verdict::Duplicate { first_offset, .. }) => {
                    outcomes.push(BatchOutcome::Duplicate {
                        base_offset: first_offset,
                        log_start_offset,
                    });
                    continue;
                }
                Ok(Verdict::Append) => {
                    let base = *next;
                    state.apply_batch(p, base, base + i64::from(b.last_offset_delta));
                    touched.push((b.topic_id, b.partition, p.producer_id));
                }
            }
        }
        let base = *next;
        let last = base + i64::from(b.last_offset_delta);
        *next = last + 1;
        ins.push(b, base, last, key);
        outcomes.push(BatchOutcome::Appended {
            base_offset: base,
            log_start_offset,
        });
    }

    (outcomes, ins, touched)
}

/// The (topic id, partition, producer id) of every producer `batches`
/// write for, as columns.
fn producer_keys(batches: &[FlushBatch]) -> (Vec<Uuid>, Vec<i32>, Vec<i64>) {
    let mut want: Vec<(Uuid, i32, i64)> = batches
        .iter()
        .filter_map(|b| b.producer.map(|p| (b.topic_id, b.partition, p.producer_id)))
        .collect();
    want.sort();
    want.dedup();
    (
        want.iter().map(|w| w.0).collect(),
        want.iter().map(|w| w.1).collect(),
        want.iter().map(|w| w.2).collect(),
    )
}

/// The producers' states by partition, from their rows.
fn parse_producers(
    rows: &[tokio_postgres::Row],
) -> Result<BTreeMap<(Uuid, i32), ProducerState>, ClusterError> {
    let mut loaded: BTreeMap<(Uuid, i32), Vec<(i64, ProducerEntry)>> = BTreeMap::new();
    for r in rows {
        let entry: serde_json::Value = r.get(3);
        let entry: ProducerEntry = serde_json::from_value(entry)
            .map_err(|e| ClusterError::Invariant(format!("a producers row does not parse: {e}")))?;
        loaded
            .entry((r.get(0), r.get(1)))
            .or_default()
            .push((r.get(2), entry));
    }
    Ok(loaded
        .into_iter()
        .map(|(k, entries)| (k, ProducerState::with_entries(entries)))
        .collect())
}

/// `topic-id:partition:next` entries separated by spaces; `*` (everything
/// may have moved) when that would not fit a NOTIFY payload.
pub fn notify_payload(advanced: &[Advanced]) -> String {
    let mut s = String::new();
    for a in advanced {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(&format!(
            "{}:{}:{}",
            a.topic_id.simple(),
            a.partition,
            a.next_offset
        ));
        if s.len() > 7000 {
            return "*".to_string();
        }
    }
    s
}

/// Parses [`notify_payload`]; `None` for `*`.
pub fn parse_notify(payload: &str) -> Option<Vec<Advanced>> {
    if payload == "*" {
        return None;
    }
    Some(
        payload
            .split(' ')
            .filter_map(|e| {
                let mut it = e.split(':');
                let t = Uuid::parse_str(it.next()?).ok()?;
                let p = it.next()?.parse().ok()?;
                let n = it.next()?.parse().ok()?;
                Some(Advanced {
                    topic_id: t,
                    partition: p,
                    next_offset: n,
                })
            })
            .collect(),
    )
}

/// The producers' rows a commit writes, column by column.
struct ProducerRows {
    topic: Vec<Uuid>,
    partition: Vec<i32>,
    id: Vec<i64>,
    txn: Vec<Option<i64>>,
    entry: Vec<serde_json::Value>,
}

impl ProducerRows {
    fn of(
        states: &BTreeMap<(Uuid, i32), ProducerState>,
        mut touched: Vec<(Uuid, i32, i64)>,
    ) -> Result<Self, ClusterError> {
        touched.sort();
        touched.dedup();
        let mut w = Self {
            topic: Vec::new(),
            partition: Vec::new(),
            id: Vec::new(),
            txn: Vec::new(),
            entry: Vec::new(),
        };
        for (topic, part, pid) in touched {
            let Some(e) = states.get(&(topic, part)).and_then(|s| s.get(pid)) else {
                continue;
            };
            w.topic.push(topic);
            w.partition.push(part);
            w.id.push(pid);
            w.txn.push(e.current_txn_first_offset);
            w.entry.push(serde_json::to_value(e).map_err(|e| {
                ClusterError::Invariant(format!("a producer entry does not serialize: {e}"))
            })?);
        }
        Ok(w)
    }
}

/// `batches` rows to insert, column by column (one multi-row INSERT).
#[derive(Default)]
struct BatchRows {
    topic: Vec<Uuid>,
    partition: Vec<i32>,
    base: Vec<i64>,
    last: Vec<i64>,
    key: Vec<String>,
    position: Vec<i64>,
    length: Vec<i32>,
    max_ts: Vec<i64>,
    pid: Vec<i64>,
}

impl BatchRows {
    fn push(&mut self, b: &FlushBatch, base: i64, last: i64, key: &str) {
        self.topic.push(b.topic_id);
        self.partition.push(b.partition);
        self.base.push(base);
        self.last.push(last);
        self.key.push(key.to_string());
        self.position.push(b.position as i64);
        self.length.push(b.length as i32);
        self.max_ts.push(b.max_timestamp);
        self.pid
            .push(b.producer.map(|p| p.producer_id).unwrap_or(-1));
    }
}

/// Inside a produce commit: the verification views of `producer_ids`, their
/// transactions rows held `FOR SHARE` so no EndTxn of theirs can commit
/// between the check and the batch (a batch after its marker would hang
/// the partition).
pub async fn views_for_produce(
    tx: &tokio_postgres::Transaction<'_>,
    producer_ids: &[i64],
) -> Result<HashMap<i64, ProducerView>, ClusterError> {
    parse_views(&tx.query(VIEWS, &[&producer_ids]).await?)
}

/// The verification views of the transactions rows `rows` ([`VIEWS`]).
fn parse_views(rows: &[tokio_postgres::Row]) -> Result<HashMap<i64, ProducerView>, ClusterError> {
    let mut out = HashMap::new();
    for r in rows {
        let v: serde_json::Value = r.get(0);
        let m: TxnMeta = serde_json::from_value(v)
            .map_err(|e| ClusterError::Invariant(format!("a transactions row: {e}")))?;
        out.insert(m.producer_id, ProducerView::of(&m));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_payload_round_trips_and_overflows_to_everything() {
        let a: Vec<Advanced> = (0..3)
            .map(|i| Advanced {
                topic_id: Uuid::from_u128(i as u128 + 7),
                partition: i,
                next_offset: i64::from(i) * 10,
            })
            .collect();
        assert_eq!(parse_notify(&notify_payload(&a)), Some(a));
        let many: Vec<Advanced> = (0..500)
            .map(|i| Advanced {
                topic_id: Uuid::from_u128(i as u128),
                partition: i,
                next_offset: 1,
            })
            .collect();
        assert_eq!(notify_payload(&many), "*");
        assert_eq!(parse_notify("*"), None);
    }
}
