//! Consumer groups in cluster mode: which broker coordinates a group, and
//! the group's committed offsets, in PostgreSQL.
//!
//! A group is coordinated by the broker named in its `group_owners` row
//! while that broker's session is live (its lease, PostgreSQL's clock). The
//! first request for a group whose owner is gone claims it for the broker
//! it reached; the membership itself (JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup) is worked out in the coordinator's memory by local mode's
//! machine, started afresh at each claim (members rejoin, as after a
//! coordinator move in Kafka). Offsets are rows: every commit holds the
//! committing broker's row (its fencing token) and the group's owner row
//! `FOR SHARE`, so a paused former coordinator commits nothing once the
//! group moved. Transactional offsets (TxnOffsetCommit) are rows of their
//! producer, pending until the transaction's end makes them the group's
//! committed offsets or drops them, in the end's own PostgreSQL transaction.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use super::session::check_fence;
use super::{Cluster, ClusterError};
use crate::coordinators::groups::{FetchedOffset, OffsetMeta, OFFSETS_TOPIC};
use crate::error::ErrorCode;
use crate::machines::txn_coordinator::{verify_write, ProducerView, TxnMeta, VerifyError};

/// Who coordinates a group, from this broker's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This broker, since before this request.
    Held,
    /// This broker, from this request on: its membership starts afresh.
    Claimed,
    /// Another broker, whose session is live.
    Elsewhere(i32),
}

/// The groups this broker coordinates in its current session.
#[derive(Default)]
pub struct Ownership {
    held: Mutex<Option<(i64, HashSet<String>)>>,
    /// One claim at a time on this broker: two requests for a group that
    /// nobody holds must not both start its membership afresh.
    claiming: tokio::sync::Mutex<()>,
}

impl Ownership {
    fn holds(&self, session: i64, group: &str) -> bool {
        match &*self.held.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((s, groups)) => *s == session && groups.contains(group),
            None => false,
        }
    }

    fn remember(&self, session: i64, group: &str) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *held {
            Some((s, groups)) if *s == session => {
                groups.insert(group.to_string());
            }
            _ => *held = Some((session, HashSet::from([group.to_string()]))),
        }
    }

    /// Stops holding `group` (it was deleted; the next request claims it).
    pub fn release(&self, group: &str) {
        if let Some((_, groups)) = &mut *self.held.lock().unwrap_or_else(|p| p.into_inner()) {
            groups.remove(group);
        }
    }

    /// The groups held in `session`.
    pub fn held(&self, session: i64) -> HashSet<String> {
        match &*self.held.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((s, groups)) if *s == session => groups.clone(),
            _ => HashSet::new(),
        }
    }

    /// Whether this broker coordinates `group`, claiming it when its owner's
    /// session is over (or it has none).
    pub async fn coordinate(&self, cluster: &Cluster, group: &str) -> Result<Claim, ClusterError> {
        let session = cluster.session.session();
        cluster.session.check_live()?;
        if self.holds(session, group) {
            return Ok(Claim::Held);
        }
        let _one = self.claiming.lock().await;
        if self.holds(session, group) {
            return Ok(Claim::Held);
        }
        let claim = claim(cluster, group, session).await?;
        if matches!(claim, Claim::Held | Claim::Claimed) {
            self.remember(session, group);
        }
        Ok(claim)
    }
}

/// Claims `group` for this broker's `session` unless another live session
/// holds it; one PostgreSQL transaction holding this broker's row.
async fn claim(cluster: &Cluster, group: &str, session: i64) -> Result<Claim, ClusterError> {
    let me = cluster.config.broker_id;
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    check_fence(&*tx, me, session).await?;
    let row = tx
        .query_opt(
            "SELECT o.broker_id, o.session, \
               EXISTS (SELECT 1 FROM brokers b WHERE b.id = o.broker_id \
                 AND b.session = o.session AND b.lease_expires_at > clock_timestamp()) \
             FROM group_owners o WHERE o.group_id = $1 FOR UPDATE",
            &[&group],
        )
        .await?;
    let claim = match row {
        Some(r) => {
            let (owner, owner_session, live): (i32, i64, bool) = (r.get(0), r.get(1), r.get(2));
            if owner == me && owner_session == session {
                Claim::Held
            } else if live {
                Claim::Elsewhere(owner)
            } else {
                tx.execute(
                    "UPDATE group_owners SET broker_id = $2, session = $3 WHERE group_id = $1",
                    &[&group, &me, &session],
                )
                .await?;
                tracing::info!(
                    group,
                    previous = owner,
                    previous_session = owner_session,
                    "cluster: took over the coordination of a group whose coordinator is gone"
                );
                Claim::Claimed
            }
        }
        None => {
            let inserted = tx
                .execute(
                    "INSERT INTO group_owners (group_id, broker_id, session) VALUES ($1, $2, $3) \
                     ON CONFLICT (group_id) DO NOTHING",
                    &[&group, &me, &session],
                )
                .await?;
            if inserted == 1 {
                Claim::Claimed
            } else {
                // Another broker inserted it meanwhile (and its session is live).
                let r = tx
                    .query_one(
                        "SELECT broker_id FROM group_owners WHERE group_id = $1",
                        &[&group],
                    )
                    .await?;
                Claim::Elsewhere(r.get(0))
            }
        }
    };
    tx.commit().await?;
    Ok(claim)
}

/// The live broker coordinating `group`, if any.
pub async fn owner(cluster: &Cluster, group: &str) -> Result<Option<i32>, ClusterError> {
    let client = cluster.pool.get().await?;
    let row = client
        .query_opt(
            "SELECT o.broker_id FROM group_owners o JOIN brokers b \
               ON b.id = o.broker_id AND b.session = o.session \
             WHERE o.group_id = $1 AND b.lease_expires_at > clock_timestamp()",
            &[&group],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Commits `offsets` of `group` (the last of duplicates wins), if this
/// broker's session is live and still coordinates the group.
pub async fn commit_offsets(
    cluster: &Cluster,
    group: &str,
    offsets: &[(String, i32, OffsetMeta)],
) -> Result<(), ClusterError> {
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    check_coordinator(&tx, cluster, group).await?;
    let rows = Columns::of(offsets);
    tx.execute(
        "INSERT INTO group_offsets \
           (group_id, topic, partition, offset_value, leader_epoch, metadata, commit_ms) \
         SELECT $1, u.t, u.p, u.o, u.e, u.m, u.c FROM unnest($2::text[], $3::integer[], \
           $4::bigint[], $5::integer[], $6::text[], $7::bigint[]) AS u(t, p, o, e, m, c) \
         ON CONFLICT (group_id, topic, partition) DO UPDATE SET \
           offset_value = EXCLUDED.offset_value, leader_epoch = EXCLUDED.leader_epoch, \
           metadata = EXCLUDED.metadata, commit_ms = EXCLUDED.commit_ms",
        &[
            &group,
            &rows.topics,
            &rows.partitions,
            &rows.values,
            &rows.epochs,
            &rows.metadata,
            &rows.times,
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Offsets as columns for `unnest`, the last of duplicates kept.
struct Columns {
    topics: Vec<String>,
    partitions: Vec<i32>,
    values: Vec<i64>,
    epochs: Vec<i32>,
    metadata: Vec<Option<String>>,
    times: Vec<i64>,
}

impl Columns {
    fn of(offsets: &[(String, i32, OffsetMeta)]) -> Self {
        let mut last: BTreeMap<(&str, i32), &OffsetMeta> = BTreeMap::new();
        for (t, p, m) in offsets {
            last.insert((t.as_str(), *p), m);
        }
        let mut c = Columns {
            topics: Vec::with_capacity(last.len()),
            partitions: Vec::with_capacity(last.len()),
            values: Vec::with_capacity(last.len()),
            epochs: Vec::with_capacity(last.len()),
            metadata: Vec::with_capacity(last.len()),
            times: Vec::with_capacity(last.len()),
        };
        for ((t, p), m) in last {
            c.topics.push(t.to_string());
            c.partitions.push(p);
            c.values.push(m.offset);
            c.epochs.push(m.leader_epoch);
            c.metadata.push(m.metadata.clone());
            c.times.push(m.commit_ms);
        }
        c
    }
}

/// Every group the cluster knows (an owner row or offsets), with its owner
/// while the owner's session is live and whether it has committed or
/// pending offsets.
pub async fn all_groups(
    cluster: &Cluster,
) -> Result<Vec<(String, Option<i32>, bool)>, ClusterError> {
    let client = cluster.pool.get().await?;
    let rows = client
        .query(
            "SELECT g.group_id, b.id, \
               EXISTS (SELECT 1 FROM group_offsets x WHERE x.group_id = g.group_id) \
               OR EXISTS (SELECT 1 FROM group_pending_offsets x WHERE x.group_id = g.group_id) \
             FROM (SELECT group_id FROM group_owners UNION SELECT group_id FROM group_offsets \
                   UNION SELECT group_id FROM group_pending_offsets) g \
             LEFT JOIN group_owners o ON o.group_id = g.group_id \
             LEFT JOIN brokers b ON b.id = o.broker_id AND b.session = o.session \
               AND b.lease_expires_at > clock_timestamp() \
             ORDER BY g.group_id",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// Whether `group` has committed offsets.
pub async fn has_offsets(cluster: &Cluster, group: &str) -> Result<bool, ClusterError> {
    let client = cluster.pool.get().await?;
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM group_offsets WHERE group_id = $1)",
            &[&group],
        )
        .await?;
    Ok(row.get(0))
}

/// DeleteGroups' durable part: the group's committed offsets and then its
/// owner row go, under this broker's fencing token and the owner row (so a
/// broker that lost the group deletes nothing). Returns how many offsets
/// went. The caller then [`Ownership::release`]s the group.
pub async fn delete_offsets(cluster: &Cluster, group: &str) -> Result<u64, ClusterError> {
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    let (me, session) = check_coordinator(&tx, cluster, group).await?;
    let n = tx
        .execute("DELETE FROM group_offsets WHERE group_id = $1", &[&group])
        .await?;
    tx.execute(
        "DELETE FROM group_owners WHERE group_id = $1 AND broker_id = $2 AND session = $3",
        &[&group, &me, &session],
    )
    .await?;
    tx.execute(
        "DELETE FROM group_membership WHERE group_id = $1",
        &[&group],
    )
    .await?;
    tx.commit().await?;
    Ok(n)
}

/// What [`delete_partition_offsets`] did.
pub struct OffsetsDeleted {
    /// The group had committed or pending offsets before.
    pub group_had_offsets: bool,
    /// Committed and pending rows deleted.
    pub deleted: u64,
    /// The group had no members and is left without offsets: its owner
    /// row went too. The caller then [`Ownership::release`]s the group.
    pub group_gone: bool,
}

/// OffsetDelete's durable part: the committed offsets of `partitions` and
/// any pending transactional offsets of them, under this broker's fencing
/// token and the group's owner row. With `no_members`, a group left
/// without offsets loses its owner row too.
pub async fn delete_partition_offsets(
    cluster: &Cluster,
    group: &str,
    partitions: &[(String, i32)],
    no_members: bool,
) -> Result<OffsetsDeleted, ClusterError> {
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    let (me, session) = check_coordinator(&tx, cluster, group).await?;
    let had = has_any_offsets(&tx, group).await?;
    let topics: Vec<&str> = partitions.iter().map(|(t, _)| t.as_str()).collect();
    let parts: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
    let mut deleted = 0;
    for table in ["group_offsets", "group_pending_offsets"] {
        deleted += tx
            .execute(
                &format!(
                    "DELETE FROM {table} WHERE group_id = $1 AND (topic, partition) IN \
                     (SELECT * FROM unnest($2::text[], $3::integer[]))"
                ),
                &[&group, &topics, &parts],
            )
            .await?;
    }
    let mut gone = false;
    if no_members {
        let left = has_any_offsets(&tx, group).await?;
        if !left {
            tx.execute(
                "DELETE FROM group_owners WHERE group_id = $1 AND broker_id = $2 AND session = $3",
                &[&group, &me, &session],
            )
            .await?;
            gone = true;
        }
    }
    tx.commit().await?;
    Ok(OffsetsDeleted {
        group_had_offsets: had,
        deleted,
        group_gone: gone,
    })
}

/// Offsets retention for groups no live broker coordinates (so none has
/// members): their committed offsets older than `retention_ms` by
/// PostgreSQL's clock go, except where a transaction's offsets for the
/// same partition are pending. A broker claiming such a group meanwhile
/// does not matter: its members' commits are new rows, which a
/// re-checked old row no longer matches. Returns how many went.
pub async fn expire_unowned_offsets(
    cluster: &Cluster,
    retention_ms: i64,
) -> Result<u64, ClusterError> {
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    check_fence(&*tx, cluster.config.broker_id, cluster.session.session()).await?;
    let n = tx
        .execute(
            "DELETE FROM group_offsets o \
             WHERE o.commit_ms < (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $1 \
               AND NOT EXISTS (SELECT 1 FROM group_owners g JOIN brokers b \
                     ON b.id = g.broker_id AND b.session = g.session \
                    AND b.lease_expires_at > clock_timestamp() \
                   WHERE g.group_id = o.group_id) \
               AND NOT EXISTS (SELECT 1 FROM group_pending_offsets p \
                   WHERE p.group_id = o.group_id AND p.topic = o.topic \
                     AND p.partition = o.partition)",
            &[&retention_ms],
        )
        .await?;
    tx.commit().await?;
    Ok(n)
}

/// Offsets retention for `groups`, which this broker coordinates and which
/// have no members here: as [`expire_unowned_offsets`], under this broker's
/// fencing token and only while it still owns each group.
pub async fn expire_owned_offsets(
    cluster: &Cluster,
    groups: &[String],
    retention_ms: i64,
) -> Result<u64, ClusterError> {
    if groups.is_empty() {
        return Ok(0);
    }
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    let (me, session) = (cluster.config.broker_id, cluster.session.session());
    check_fence(&*tx, me, session).await?;
    let n = tx
        .execute(
            "DELETE FROM group_offsets o \
             WHERE o.group_id = ANY($2) \
               AND o.commit_ms < (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $1 \
               AND EXISTS (SELECT 1 FROM group_owners g WHERE g.group_id = o.group_id \
                   AND g.broker_id = $3 AND g.session = $4) \
               AND NOT EXISTS (SELECT 1 FROM group_pending_offsets p \
                   WHERE p.group_id = o.group_id AND p.topic = o.topic \
                     AND p.partition = o.partition)",
            &[&retention_ms, &groups, &me, &session],
        )
        .await?;
    tx.commit().await?;
    Ok(n)
}

/// Whether `group` has committed or pending offsets, inside `tx`.
async fn has_any_offsets(
    tx: &tokio_postgres::Transaction<'_>,
    group: &str,
) -> Result<bool, ClusterError> {
    Ok(tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM group_offsets WHERE group_id = $1) \
               OR EXISTS (SELECT 1 FROM group_pending_offsets WHERE group_id = $1)",
            &[&group],
        )
        .await?
        .get(0))
}

/// Inside `tx`: this broker's session is live (its fencing token) and still
/// owns `group` (the owner row, `FOR SHARE`). Returns (broker id, session).
async fn check_coordinator(
    tx: &tokio_postgres::Transaction<'_>,
    cluster: &Cluster,
    group: &str,
) -> Result<(i32, i64), ClusterError> {
    let me = cluster.config.broker_id;
    let session = cluster.session.session();
    check_fence(tx, me, session).await?;
    check_owner(tx, group, me, session).await?;
    Ok((me, session))
}

/// Holds the group's owner row `FOR SHARE` if this broker's session (held by
/// [`check_fence`] before) still coordinates it.
async fn check_owner(
    tx: &tokio_postgres::Transaction<'_>,
    group: &str,
    me: i32,
    session: i64,
) -> Result<(), ClusterError> {
    let owns = tx
        .query_opt(
            "SELECT 1 FROM group_owners WHERE group_id = $1 AND broker_id = $2 AND session = $3 \
             FOR SHARE",
            &[&group, &me, &session],
        )
        .await?;
    match owns {
        Some(_) => Ok(()),
        None => Err(ClusterError::NotCoordinator(group.to_string())),
    }
}

/// TxnOffsetCommit: `offsets` become pending in the transaction of
/// `transactional_id`, if (`producer_id`, `epoch`) is its current producer
/// and the group's offsets were added to its ongoing transaction
/// (AddOffsetsToTxn). The transactions row is held `FOR SHARE`, so the
/// transaction's EndTxn (which holds it `FOR UPDATE`) either sees these
/// offsets or comes first and refuses them.
pub async fn txn_commit_offsets(
    cluster: &Cluster,
    group: &str,
    transactional_id: &str,
    producer_id: i64,
    epoch: i16,
    offsets: &[(String, i32, OffsetMeta)],
) -> Result<Result<(), VerifyError>, ClusterError> {
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    check_coordinator(&tx, cluster, group).await?;
    let row = tx
        .query_opt(
            "SELECT meta FROM transactions WHERE transactional_id = $1 FOR SHARE",
            &[&transactional_id],
        )
        .await?;
    let meta: Option<TxnMeta> = row
        .map(|r| {
            serde_json::from_value(r.get::<_, serde_json::Value>(0))
                .map_err(|e| ClusterError::Invariant(format!("a transactions row: {e}")))
        })
        .transpose()?;
    let view = meta
        .as_ref()
        .filter(|m| m.producer_id == producer_id)
        .map(ProducerView::of);
    if meta.as_ref().is_some_and(|m| m.producer_id != producer_id) {
        // The id has a newer producer: this one is fenced.
        return Ok(Err(VerifyError::StaleEpoch));
    }
    if let Err(e) = verify_write(view.as_ref(), epoch, OFFSETS_TOPIC, 0) {
        return Ok(Err(e));
    }
    let rows = Columns::of(offsets);
    tx.execute(
        "INSERT INTO group_pending_offsets (producer_id, group_id, topic, partition, \
           offset_value, leader_epoch, metadata, commit_ms) \
         SELECT $1, $2, u.t, u.p, u.o, u.e, u.m, u.c FROM unnest($3::text[], $4::integer[], \
           $5::bigint[], $6::integer[], $7::text[], $8::bigint[]) AS u(t, p, o, e, m, c) \
         ON CONFLICT (producer_id, group_id, topic, partition) DO UPDATE SET \
           offset_value = EXCLUDED.offset_value, leader_epoch = EXCLUDED.leader_epoch, \
           metadata = EXCLUDED.metadata, commit_ms = EXCLUDED.commit_ms",
        &[
            &producer_id,
            &group,
            &rows.topics,
            &rows.partitions,
            &rows.values,
            &rows.epochs,
            &rows.metadata,
            &rows.times,
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(Ok(()))
}

/// Inside an EndTxn's (or a timeout's, or an InitProducerId's abort)
/// PostgreSQL transaction: the producer's pending offsets become the
/// committed ones of their groups, or are dropped.
pub async fn complete_offsets(
    tx: &tokio_postgres::Transaction<'_>,
    producer_id: i64,
    commit: bool,
) -> Result<(), ClusterError> {
    if commit {
        tx.execute(
            "INSERT INTO group_offsets \
               (group_id, topic, partition, offset_value, leader_epoch, metadata, commit_ms) \
             SELECT group_id, topic, partition, offset_value, leader_epoch, metadata, commit_ms \
             FROM group_pending_offsets WHERE producer_id = $1 \
             ON CONFLICT (group_id, topic, partition) DO UPDATE SET \
               offset_value = EXCLUDED.offset_value, leader_epoch = EXCLUDED.leader_epoch, \
               metadata = EXCLUDED.metadata, commit_ms = EXCLUDED.commit_ms",
            &[&producer_id],
        )
        .await?;
    }
    tx.execute(
        "DELETE FROM group_pending_offsets WHERE producer_id = $1",
        &[&producer_id],
    )
    .await?;
    Ok(())
}

/// OffsetFetch from the rows: `wanted` partitions, or (`None`) every
/// partition the group committed, sorted.
pub async fn fetch_offsets(
    cluster: &Cluster,
    group: &str,
    wanted: Option<Vec<(String, Vec<i32>)>>,
    require_stable: bool,
) -> Result<Vec<FetchedOffset>, ClusterError> {
    let client = cluster.pool.get().await?;
    // KIP-447: with `require_stable`, a partition with offsets pending in an
    // open transaction is answered UNSTABLE_OFFSET_COMMIT (the client asks
    // again), so a new owner never starts from an offset about to change.
    let unstable: HashSet<(String, i32)> = if require_stable {
        client
            .query(
                "SELECT DISTINCT topic, partition FROM group_pending_offsets WHERE group_id = $1",
                &[&group],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    } else {
        HashSet::new()
    };
    let rows = client
        .query(
            "SELECT topic, partition, offset_value, leader_epoch, metadata FROM group_offsets \
             WHERE group_id = $1",
            &[&group],
        )
        .await?;
    let mut stored: BTreeMap<(String, i32), FetchedOffset> = BTreeMap::new();
    for r in rows {
        let (topic, partition): (String, i32) = (r.get(0), r.get(1));
        stored.insert(
            (topic.clone(), partition),
            FetchedOffset {
                topic,
                partition,
                offset: r.get(2),
                leader_epoch: r.get(3),
                metadata: r.get(4),
                error: ErrorCode::None,
            },
        );
    }
    for ((topic, partition), f) in stored.iter_mut() {
        if unstable.contains(&(topic.clone(), *partition)) {
            *f = unstable_offset(topic, *partition);
        }
    }
    Ok(match wanted {
        None => stored.into_values().collect(),
        Some(ts) => ts
            .into_iter()
            .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
            .map(|(topic, partition)| {
                if unstable.contains(&(topic.clone(), partition)) {
                    return unstable_offset(&topic, partition);
                }
                stored
                    .get(&(topic.clone(), partition))
                    .cloned()
                    .unwrap_or(FetchedOffset {
                        topic,
                        partition,
                        offset: -1,
                        leader_epoch: -1,
                        metadata: Some(String::new()),
                        error: ErrorCode::None,
                    })
            })
            .collect(),
    })
}

fn unstable_offset(topic: &str, partition: i32) -> FetchedOffset {
    FetchedOffset {
        topic: topic.to_string(),
        partition,
        offset: -1,
        leader_epoch: -1,
        metadata: None,
        error: ErrorCode::UnstableOffsetCommit,
    }
}
