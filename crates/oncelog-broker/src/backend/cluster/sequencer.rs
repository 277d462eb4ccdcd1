//! The produce commit: one PostgreSQL transaction per flushed object that
//! checks the broker's fencing token, claims the object's intent, assigns
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
use uuid::Uuid;

use super::session::check_fence;
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

/// Records an object intent before its PUT (autocommit): the collector may
/// remove the object only after deleting this row, and the commit needs the
/// row, so the two never both succeed.
pub async fn insert_intent(
    pool: &Pool,
    key: &str,
    broker_id: i32,
    session: i64,
) -> Result<(), ClusterError> {
    let client = pool.get().await?;
    client
        .execute(
            "INSERT INTO object_intents (key, broker_id, session) VALUES ($1, $2, $3)",
            &[&key, &broker_id, &session],
        )
        .await?;
    Ok(())
}

/// The state of the producers `batches` write for, from their rows, by
/// partition (read in the flush's transaction, its partitions locked).
async fn load_producers(
    tx: &tokio_postgres::Transaction<'_>,
    batches: &[FlushBatch],
) -> Result<BTreeMap<(Uuid, i32), ProducerState>, ClusterError> {
    let mut want: Vec<(Uuid, i32, i64)> = batches
        .iter()
        .filter_map(|b| b.producer.map(|p| (b.topic_id, b.partition, p.producer_id)))
        .collect();
    want.sort();
    want.dedup();
    let mut states: BTreeMap<(Uuid, i32), ProducerState> = BTreeMap::new();
    if !want.is_empty() {
        let wt: Vec<Uuid> = want.iter().map(|w| w.0).collect();
        let wp: Vec<i32> = want.iter().map(|w| w.1).collect();
        let wi: Vec<i64> = want.iter().map(|w| w.2).collect();
        let rows = tx
            .query(
                "SELECT topic_id, partition, producer_id, entry FROM producers \
                 WHERE (topic_id, partition, producer_id) IN \
                   (SELECT * FROM unnest($1::uuid[], $2::int[], $3::bigint[]))",
                &[&wt, &wp, &wi],
            )
            .await?;
        let mut loaded: BTreeMap<(Uuid, i32), Vec<(i64, ProducerEntry)>> = BTreeMap::new();
        for r in &rows {
            let entry: serde_json::Value = r.get(3);
            let entry: ProducerEntry = serde_json::from_value(entry).map_err(|e| {
                ClusterError::Invariant(format!("a producers row does not parse: {e}"))
            })?;
            loaded
                .entry((r.get(0), r.get(1)))
                .or_default()
                .push((r.get(2), entry));
        }
        for (k, entries) in loaded {
            states.insert(k, ProducerState::with_entries(entries));
        }
    }
    Ok(states)
}

/// Commits one flushed object of `size` bytes holding `batches`.
/// `Err` means nothing was committed (every batch may be retried).
pub async fn commit_flush(
    pool: &Pool,
    broker_id: i32,
    session: i64,
    key: &str,
    size: u64,
    batches: &[FlushBatch],
) -> Result<(Vec<BatchOutcome>, Vec<Advanced>), ClusterError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    check_fence(&*tx, broker_id, session).await?;
    let claimed = tx
        .execute("DELETE FROM object_intents WHERE key = $1", &[&key])
        .await?;
    if claimed == 0 {
        return Err(ClusterError::IntentGone(key.to_string()));
    }
    tx.execute(
        "INSERT INTO objects (key, size, broker_id) VALUES ($1, $2, $3)",
        &[&key, &(size as i64), &broker_id],
    )
    .await?;

    // Transactional producers' coordinator rows, FOR SHARE (before the
    // partitions, the order EndTxn takes them in too).
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
    let views = if txn_pids.is_empty() {
        Default::default()
    } else {
        views_for_produce(&tx, &txn_pids).await?
    };

    // Lock every partition of the flush, in order.
    let mut parts: Vec<(Uuid, i32)> = batches.iter().map(|b| (b.topic_id, b.partition)).collect();
    parts.sort();
    parts.dedup();
    let (pt, pp): (Vec<Uuid>, Vec<i32>) = parts.iter().copied().unzip();
    let rows = tx
        .query(
            "SELECT topic_id, partition, next_offset, log_start_offset FROM partitions \
             WHERE (topic_id, partition) IN (SELECT * FROM unnest($1::uuid[], $2::int[])) \
             ORDER BY topic_id, partition FOR UPDATE",
            &[&pt, &pp],
        )
        .await?;
    // (next offset, log start) per locked partition
    let mut offsets: BTreeMap<(Uuid, i32), (i64, i64)> = rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3))))
        .collect();

    let mut states = load_producers(&tx, batches).await?;

    let mut outcomes = Vec::with_capacity(batches.len());
    let mut ins = BatchRows::default();
    let mut touched: Vec<(Uuid, i32, i64)> = Vec::new();
    for b in batches {
        let k = (b.topic_id, b.partition);
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

    ins.insert(&tx).await?;
    write_producers(&tx, &states, touched).await?;

    let advanced: Vec<Advanced> = offsets
        .iter()
        .map(|((t, p), (n, _))| Advanced {
            topic_id: *t,
            partition: *p,
            next_offset: *n,
        })
        .collect();
    let (at, ap, an) = advanced.iter().fold(
        (Vec::new(), Vec::new(), Vec::new()),
        |(mut t, mut p, mut n), a| {
            t.push(a.topic_id);
            p.push(a.partition);
            n.push(a.next_offset);
            (t, p, n)
        },
    );
    tx.execute(
        "UPDATE partitions AS p SET next_offset = u.n \
         FROM unnest($1::uuid[], $2::int[], $3::bigint[]) AS u (t, q, n) \
         WHERE p.topic_id = u.t AND p.partition = u.q AND p.next_offset <> u.n",
        &[&at, &ap, &an],
    )
    .await?;
    tx.execute(
        "SELECT pg_notify($1, $2)",
        &[&DATA_CHANNEL, &notify_payload(&advanced)],
    )
    .await?;
    tx.commit().await?;
    Ok((outcomes, advanced))
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

async fn write_producers(
    tx: &tokio_postgres::Transaction<'_>,
    states: &BTreeMap<(Uuid, i32), ProducerState>,
    mut touched: Vec<(Uuid, i32, i64)>,
) -> Result<(), ClusterError> {
    touched.sort();
    touched.dedup();
    if touched.is_empty() {
        return Ok(());
    }
    let mut t = Vec::new();
    let mut p = Vec::new();
    let mut id = Vec::new();
    let mut txn = Vec::new();
    let mut entry = Vec::new();
    for (topic, part, pid) in touched {
        let Some(e) = states.get(&(topic, part)).and_then(|s| s.get(pid)) else {
            continue;
        };
        t.push(topic);
        p.push(part);
        id.push(pid);
        txn.push(e.current_txn_first_offset);
        entry.push(serde_json::to_value(e).map_err(|e| {
            ClusterError::Invariant(format!("a producer entry does not serialize: {e}"))
        })?);
    }
    tx.execute(
        "INSERT INTO producers (topic_id, partition, producer_id, txn_first_offset, entry) \
         SELECT * FROM unnest($1::uuid[], $2::int[], $3::bigint[], $4::bigint[], $5::jsonb[]) \
         ON CONFLICT (topic_id, partition, producer_id) DO UPDATE \
           SET txn_first_offset = EXCLUDED.txn_first_offset, entry = EXCLUDED.entry",
        &[&t, &p, &id, &txn, &entry],
    )
    .await?;
    Ok(())
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

    async fn insert(&self, tx: &tokio_postgres::Transaction<'_>) -> Result<(), ClusterError> {
        if self.topic.is_empty() {
            return Ok(());
        }
        tx.execute(
            "INSERT INTO batches (topic_id, partition, base_offset, last_offset, object_key, \
               position, length, max_timestamp, producer_id, control) \
             SELECT t, p, b, l, k, pos, len, ts, pid, false FROM unnest($1::uuid[], $2::int[], \
               $3::bigint[], $4::bigint[], $5::text[], $6::bigint[], $7::int[], $8::bigint[], \
               $9::bigint[]) AS u (t, p, b, l, k, pos, len, ts, pid)",
            &[
                &self.topic,
                &self.partition,
                &self.base,
                &self.last,
                &self.key,
                &self.position,
                &self.length,
                &self.max_ts,
                &self.pid,
            ],
        )
        .await?;
        Ok(())
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
    let rows = tx
        .query(
            "SELECT meta FROM transactions WHERE producer_id = ANY($1) \
             ORDER BY transactional_id FOR SHARE",
            &[&producer_ids],
        )
        .await?;
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
