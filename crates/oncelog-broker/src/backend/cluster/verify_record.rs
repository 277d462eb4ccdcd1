//! The `verify_progress` and `verify_anomalies` tables: live
//! verification's record in a cluster ([`crate::backend::verify_record`]).
//! One progress row per partition, written by the broker verifying it; one
//! row per anomaly, written once by whichever broker found it first.

use std::collections::BTreeMap;

use oncelog_verify::scan::Kind;

use super::{Cluster, ClusterError};
use crate::observe::verify::{Progress, Reported, Saved};

/// Anomalies the table keeps (the oldest are dropped beyond this).
pub const MAX_ANOMALIES: i64 = 100_000;

pub async fn save_progress(c: &Cluster, rows: &[Progress]) -> Result<(), ClusterError> {
    if rows.is_empty() {
        return Ok(());
    }
    let topic: Vec<&str> = rows.iter().map(|r| r.topic.as_str()).collect();
    let partition: Vec<i32> = rows.iter().map(|r| r.partition).collect();
    let topic_id: Vec<&str> = rows.iter().map(|r| r.topic_id.as_str()).collect();
    let verified: Vec<i64> = rows.iter().map(|r| r.verified_through).collect();
    let start: Vec<i64> = rows.iter().map(|r| r.log_start_offset).collect();
    let lso: Vec<i64> = rows.iter().map(|r| r.last_stable_offset).collect();
    let passes: Vec<i64> = rows.iter().map(|r| r.passes as i64).collect();
    let remembered: Vec<i64> = rows.iter().map(|r| r.remembered_batches as i64).collect();
    let compacted: Vec<bool> = rows.iter().map(|r| r.compacted).collect();
    let client = c.pool.get().await?;
    client
        .execute(
            "INSERT INTO verify_progress (topic, partition, topic_id, verified_through, \
             log_start_offset, last_stable_offset, passes, remembered_batches, compacted, broker_id) \
             SELECT t, p, i, v, s, l, n, r, k, $10 FROM unnest($1::text[], $2::int4[], $3::text[], \
             $4::int8[], $5::int8[], $6::int8[], $7::int8[], $8::int8[], $9::bool[]) AS x(t, p, i, v, s, l, n, r, k) \
             ON CONFLICT (topic, partition) DO UPDATE SET topic_id = EXCLUDED.topic_id, \
             verified_through = EXCLUDED.verified_through, log_start_offset = EXCLUDED.log_start_offset, \
             last_stable_offset = EXCLUDED.last_stable_offset, passes = EXCLUDED.passes, \
             remembered_batches = EXCLUDED.remembered_batches, compacted = EXCLUDED.compacted, \
             broker_id = EXCLUDED.broker_id",
            &[
                &topic,
                &partition,
                &topic_id,
                &verified,
                &start,
                &lso,
                &passes,
                &remembered,
                &compacted,
                &c.config.broker_id,
            ],
        )
        .await?;
    Ok(())
}

pub async fn add_anomalies(c: &Cluster, new: &[Reported]) -> Result<(), ClusterError> {
    let kind: Vec<&str> = new.iter().map(|r| r.kind.name()).collect();
    let topic: Vec<&str> = new.iter().map(|r| r.topic.as_str()).collect();
    let partition: Vec<i32> = new.iter().map(|r| r.partition).collect();
    let first: Vec<i64> = new.iter().map(|r| r.first_offset).collect();
    let last: Vec<i64> = new.iter().map(|r| r.last_offset).collect();
    let pid: Vec<i64> = new.iter().map(|r| r.producer_id).collect();
    let epoch: Vec<i16> = new.iter().map(|r| r.epoch).collect();
    let detail: Vec<&str> = new.iter().map(|r| r.detail.as_str()).collect();
    let found: Vec<i64> = new.iter().map(|r| r.found_ms).collect();
    let client = c.pool.get().await?;
    client
        .execute(
            "INSERT INTO verify_anomalies (kind, topic, partition, first_offset, last_offset, \
             producer_id, epoch, detail, found_ms, broker_id) \
             SELECT * , $10 FROM unnest($1::text[], $2::text[], $3::int4[], $4::int8[], $5::int8[], \
             $6::int8[], $7::int2[], $8::text[], $9::int8[]) \
             ON CONFLICT DO NOTHING",
            &[
                &kind,
                &topic,
                &partition,
                &first,
                &last,
                &pid,
                &epoch,
                &detail,
                &found,
                &c.config.broker_id,
            ],
        )
        .await?;
    client
        .execute(
            "DELETE FROM verify_anomalies WHERE found_ms < (SELECT found_ms FROM verify_anomalies \
             ORDER BY found_ms DESC OFFSET $1 LIMIT 1)",
            &[&MAX_ANOMALIES],
        )
        .await?;
    Ok(())
}

fn reported(r: &tokio_postgres::Row) -> Option<Reported> {
    Some(Reported {
        kind: Kind::parse(r.get(0))?,
        topic: r.get(1),
        partition: r.get(2),
        first_offset: r.get(3),
        last_offset: r.get(4),
        producer_id: r.get(5),
        epoch: r.get(6),
        detail: r.get(7),
        found_ms: r.get(8),
    })
}

const ANOMALY_COLUMNS: &str =
    "kind, topic, partition, first_offset, last_offset, producer_id, epoch, detail, found_ms";

/// Anomalies found after `after_ms`, oldest first (at most the table's
/// bound).
pub async fn reported_since(c: &Cluster, after_ms: i64) -> Result<Vec<Reported>, ClusterError> {
    let client = c.pool.get().await?;
    let rows = client
        .query(
            &format!(
                "SELECT {ANOMALY_COLUMNS} FROM verify_anomalies WHERE found_ms > $1 \
                 ORDER BY found_ms LIMIT $2"
            ),
            &[&after_ms, &MAX_ANOMALIES],
        )
        .await?;
    Ok(rows.iter().filter_map(reported).collect())
}

/// Every partition's progress, the latest `recent` anomalies and the
/// counts by kind.
pub async fn load(c: &Cluster, recent: i64) -> Result<Saved, ClusterError> {
    let client = c.pool.get().await?;
    let progress = client
        .query(
            "SELECT topic, partition, topic_id, verified_through, log_start_offset, \
             last_stable_offset, passes, remembered_batches, compacted FROM verify_progress \
             ORDER BY topic, partition",
            &[],
        )
        .await?
        .iter()
        .map(|r| Progress {
            topic: r.get(0),
            partition: r.get(1),
            topic_id: r.get(2),
            verified_through: r.get(3),
            log_start_offset: r.get(4),
            last_stable_offset: r.get(5),
            passes: r.get::<_, i64>(6) as u64,
            remembered_batches: r.get::<_, i64>(7) as usize,
            compacted: r.get(8),
        })
        .collect();
    let mut anomalies: Vec<Reported> = if recent > 0 {
        client
            .query(
                &format!(
                    "SELECT {ANOMALY_COLUMNS} FROM verify_anomalies ORDER BY found_ms DESC LIMIT $1"
                ),
                &[&recent],
            )
            .await?
            .iter()
            .filter_map(reported)
            .collect()
    } else {
        Vec::new()
    };
    anomalies.reverse();
    let totals: BTreeMap<String, u64> = client
        .query(
            "SELECT kind, count(*) FROM verify_anomalies GROUP BY kind",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
        .collect();
    Ok(Saved {
        progress,
        anomalies,
        totals,
    })
}

pub async fn forget_topics_but(c: &Cluster, topics: &[String]) -> Result<(), ClusterError> {
    let client = c.pool.get().await?;
    client
        .execute(
            "DELETE FROM verify_progress WHERE NOT (topic = ANY($1))",
            &[&topics],
        )
        .await?;
    Ok(())
}
