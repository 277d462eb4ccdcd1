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
//! group moved.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use super::session::check_fence;
use super::{Cluster, ClusterError};
use crate::error::ErrorCode;
use crate::groups::{FetchedOffset, OffsetMeta};

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
        if !cluster.session.is_live() {
            return Err(ClusterError::Fenced {
                broker_id: cluster.config.broker_id,
                session,
            });
        }
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
    let me = cluster.config.broker_id;
    let session = cluster.session.session();
    let mut last: BTreeMap<(&str, i32), &OffsetMeta> = BTreeMap::new();
    for (t, p, m) in offsets {
        last.insert((t.as_str(), *p), m);
    }
    let mut topics = Vec::with_capacity(last.len());
    let mut partitions = Vec::with_capacity(last.len());
    let mut values = Vec::with_capacity(last.len());
    let mut epochs = Vec::with_capacity(last.len());
    let mut metadata: Vec<Option<String>> = Vec::with_capacity(last.len());
    let mut times = Vec::with_capacity(last.len());
    for ((t, p), m) in last {
        topics.push(t.to_string());
        partitions.push(p);
        values.push(m.offset);
        epochs.push(m.leader_epoch);
        metadata.push(m.metadata.clone());
        times.push(m.commit_ms);
    }
    let mut client = cluster.pool.get().await?;
    let tx = client.transaction().await?;
    check_fence(&*tx, me, session).await?;
    let owns = tx
        .query_opt(
            "SELECT 1 FROM group_owners WHERE group_id = $1 AND broker_id = $2 AND session = $3 \
             FOR SHARE",
            &[&group, &me, &session],
        )
        .await?;
    if owns.is_none() {
        return Err(ClusterError::NotCoordinator(group.to_string()));
    }
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
            &topics,
            &partitions,
            &values,
            &epochs,
            &metadata,
            &times,
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// OffsetFetch from the rows: `wanted` partitions, or (`None`) every
/// partition the group committed, sorted.
pub async fn fetch_offsets(
    cluster: &Cluster,
    group: &str,
    wanted: Option<Vec<(String, Vec<i32>)>>,
) -> Result<Vec<FetchedOffset>, ClusterError> {
    let client = cluster.pool.get().await?;
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
    Ok(match wanted {
        None => stored.into_values().collect(),
        Some(ts) => ts
            .into_iter()
            .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
            .map(|(topic, partition)| {
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
