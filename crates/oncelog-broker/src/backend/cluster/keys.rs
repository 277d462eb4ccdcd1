//! Object keys, handed out from slabs a broker reserves in PostgreSQL.
//!
//! Every object a broker writes (a flush, a compacted chunk) is named
//! `data/<broker>-<session>-<seq>.batches`. Before its first PUT under a key,
//! the broker holds an `object_slabs` row that covers the key's sequence
//! number: one autocommit INSERT reserves [`SLAB_KEYS`] keys at once, instead
//! of one row per object. The commit of an object takes that row
//! `FOR KEY SHARE` and fails without it ([`CLAIM_SQL`]).
//!
//! The rows are how the collector finds objects that were written and never
//! committed, without listing the bucket: a slab that is closed (its broker
//! moved on to a newer one) for longer than the grace period, or whose
//! session is over (superseded, or its lease expired: neither ever commits
//! again), is marked `collecting` under `FOR UPDATE` (which waits for the
//! commits holding it, and makes every later commit of its keys fail), then
//! each of its keys with no `objects` row is deleted from the store, then
//! the row. Each step may be repeated.

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

use super::objects::Objects;
use super::ClusterError;

/// Keys one slab reserves.
pub const SLAB_KEYS: i64 = 64;
/// A slab older than this is closed at the next key, so that the objects of
/// failed commits in it become collectable within about this plus the grace.
pub const SLAB_MAX_AGE: Duration = Duration::from_secs(60);

/// Inside a commit, the slab holding `$3` of broker `$1`'s session `$2`, not
/// being collected; `FOR KEY SHARE`, so the collector's `FOR UPDATE` waits
/// for the commit (and the owner's closing of the slab does not).
pub const CLAIM_SQL: &str = "SELECT 1 FROM object_slabs WHERE broker_id = $1 AND session = $2 \
     AND first_seq <= $3 AND $3 <= last_seq AND NOT collecting FOR KEY SHARE";

/// A key handed out, with what its commit claims it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectKey {
    pub key: String,
    pub broker_id: i32,
    pub session: i64,
    pub seq: i64,
}

impl ObjectKey {
    pub fn new(broker_id: i32, session: i64, seq: i64) -> Self {
        Self {
            key: Objects::data_key(broker_id, session, seq as u64),
            broker_id,
            session,
            seq,
        }
    }
}

struct Slab {
    next: i64,
    last: i64,
    opened: Instant,
}

#[derive(Default)]
struct State {
    session: i64,
    /// The first sequence number of the next slab of `session`: ranges are
    /// never reserved twice, even when a reservation's answer was lost.
    next_first: i64,
    slab: Option<Slab>,
}

/// The keys of one broker.
pub struct Keys {
    broker_id: i32,
    state: tokio::sync::Mutex<State>,
}

impl Keys {
    pub fn new(broker_id: i32) -> Self {
        Self {
            broker_id,
            state: tokio::sync::Mutex::new(State::default()),
        }
    }

    /// The next key of `session`; reserves a new slab (one round trip) when
    /// the current one is used up, old, or of another session.
    pub async fn next(&self, pool: &Pool, session: i64) -> Result<ObjectKey, ClusterError> {
        let mut st = self.state.lock().await;
        if st.session != session {
            *st = State {
                session,
                ..State::default()
            };
        }
        let usable = st
            .slab
            .as_ref()
            .is_some_and(|s| s.next <= s.last && s.opened.elapsed() < SLAB_MAX_AGE);
        if !usable {
            st.slab = None;
            let first = st.next_first;
            let last = first + SLAB_KEYS - 1;
            st.next_first = last + 1;
            open(pool, self.broker_id, session, first, last).await?;
            st.slab = Some(Slab {
                next: first,
                last,
                opened: Instant::now(),
            });
        }
        let Some(s) = st.slab.as_mut() else {
            return Err(ClusterError::Invariant("no key slab".into()));
        };
        let seq = s.next;
        s.next += 1;
        Ok(ObjectKey::new(self.broker_id, session, seq))
    }
}

/// Closes the broker's open slabs and reserves `first..=last` of `session`.
async fn open(
    pool: &Pool,
    broker_id: i32,
    session: i64,
    first: i64,
    last: i64,
) -> Result<(), ClusterError> {
    let c = pool.get().await?;
    let st = c
        .prepare_cached(
            "WITH closed AS (UPDATE object_slabs SET closed_at = clock_timestamp() \
               WHERE broker_id = $1 AND closed_at IS NULL) \
             INSERT INTO object_slabs (broker_id, session, first_seq, last_seq) \
             VALUES ($1, $2, $3, $4)",
        )
        .await?;
    c.execute(&st, &[&broker_id, &session, &first, &last])
        .await?;
    Ok(())
}

/// What one collection of slabs did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SlabReport {
    /// Slabs still in use, or closed for less than the grace period.
    pub waiting: usize,
    pub collected: usize,
    /// Keys of collected slabs no commit named: deleted from the store
    /// (most were never written).
    pub uncommitted_keys: usize,
}

/// Collects every slab no commit can use any more (see the module's
/// documentation); `grace` is how long a closed slab of a live session is
/// left alone.
pub async fn collect_slabs(
    pool: &Pool,
    objects: &Objects,
    grace: Duration,
) -> Result<SlabReport, ClusterError> {
    let grace_ms = grace.as_millis() as f64;
    let mut client = pool.get().await?;
    let rows = client
        .query(
            "SELECT s.broker_id, s.session, s.first_seq, s.last_seq, coalesce(s.collecting \
               OR s.closed_at <= clock_timestamp() - $1 * interval '1 millisecond' \
               OR b.id IS NULL OR b.session <> s.session \
               OR b.lease_expires_at <= clock_timestamp(), false) \
             FROM object_slabs s LEFT JOIN brokers b ON b.id = s.broker_id",
            &[&grace_ms],
        )
        .await?;
    let mut report = SlabReport::default();
    for r in rows {
        let (broker, session, first, last): (i32, i64, i64, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        if !r.get::<_, bool>(4) {
            report.waiting += 1;
            continue;
        }
        // Waits for the commits holding the slab; later ones find it
        // collecting and fail.
        let tx = client.transaction().await?;
        let held = tx
            .execute(
                "SELECT 1 FROM object_slabs WHERE broker_id = $1 AND session = $2 \
                   AND first_seq = $3 FOR UPDATE",
                &[&broker, &session, &first],
            )
            .await?;
        if held == 0 {
            continue;
        }
        tx.execute(
            "UPDATE object_slabs SET collecting = true WHERE broker_id = $1 AND session = $2 \
               AND first_seq = $3",
            &[&broker, &session, &first],
        )
        .await?;
        tx.commit().await?;
        let keys: Vec<String> = (first..=last)
            .map(|s| ObjectKey::new(broker, session, s).key)
            .collect();
        let orphans = client
            .query(
                "SELECT k FROM unnest($1::text[]) AS k \
                 WHERE NOT EXISTS (SELECT 1 FROM objects o WHERE o.key = k)",
                &[&keys],
            )
            .await?;
        for o in &orphans {
            objects.delete(o.get::<_, &str>(0)).await?;
        }
        report.uncommitted_keys += orphans.len();
        client
            .execute(
                "DELETE FROM object_slabs WHERE broker_id = $1 AND session = $2 \
                   AND first_seq = $3",
                &[&broker, &session, &first],
            )
            .await?;
        report.collected += 1;
    }
    Ok(report)
}
