//! The group store: who coordinates a group, its committed and pending
//! offsets. Membership is the coordinator's, in memory in both modes
//! (`crate::coordinators::groups`); the offsets are in the data directory's offsets log
//! in local mode and in PostgreSQL in cluster mode, where a group is
//! coordinated by the broker that holds its owner row.

use std::collections::HashMap;
use std::sync::Arc;

use super::Scope;
use crate::backend::cluster::front::Front;
use crate::backend::cluster::groups::{self as cg, Claim};
use crate::backend::cluster::ClusterError;
use crate::coordinators::groups::{FetchedOffset, GroupSnapshot, OffsetMeta, OFFSETS_TOPIC};
use crate::error::ErrorCode;
use crate::machines::txn_coordinator::VerifyError;
use crate::Broker;

/// The group coordinator's store.
pub enum Groups<'a> {
    Local(&'a Arc<Broker>),
    Cluster(&'a Arc<Broker>, &'a Arc<Front>),
}

impl Broker {
    /// This broker's group store.
    pub fn group_store(self: &Arc<Self>) -> Groups<'_> {
        match &self.mode {
            crate::Mode::Cluster(front) => Groups::Cluster(self, front),
            crate::Mode::Local => Groups::Local(self),
        }
    }
}

/// The code a failed cluster-mode group step is answered with.
fn storage_code(front: &Front, group: &str, e: &ClusterError) -> ErrorCode {
    match e {
        ClusterError::NotCoordinator(_)
        | ClusterError::Fenced { .. }
        | ClusterError::LeaseUnproven { .. } => ErrorCode::NotCoordinator,
        e => {
            crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, *e, group, error = %e, "cluster: group coordination failed");
            ErrorCode::CoordinatorNotAvailable
        }
    }
}

impl Groups<'_> {
    fn broker(&self) -> &Arc<Broker> {
        match self {
            Groups::Local(b) | Groups::Cluster(b, _) => b,
        }
    }

    /// Whether this broker coordinates `group`: `Ok(())`, or the code to
    /// answer (NOT_COORDINATOR sends the client to FindCoordinator). On
    /// one node it coordinates every group. In cluster mode a fresh claim
    /// of the group's owner row starts its membership afresh.
    pub async fn coordinate(&self, group: &str) -> Result<(), ErrorCode> {
        match self {
            Groups::Local(_) => Ok(()),
            Groups::Cluster(b, front) => {
                if group.is_empty() {
                    return Err(ErrorCode::InvalidGroupId);
                }
                match front.groups.coordinate(&front.cluster, group).await {
                    Ok(Claim::Held) => Ok(()),
                    Ok(Claim::Claimed) => {
                        b.groups.forget_membership(group).await;
                        Ok(())
                    }
                    Ok(Claim::Elsewhere(_)) => Err(ErrorCode::NotCoordinator),
                    Err(e) => Err(storage_code(front, group, &e)),
                }
            }
        }
    }

    /// OffsetCommit of a member (`generation` -1 and no member: a simple
    /// consumer's) on the coordinator.
    pub async fn commit(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        offsets: Vec<(String, i32, OffsetMeta)>,
    ) -> ErrorCode {
        let parts: Vec<(String, i32)> = offsets.iter().map(|(t, p, _)| (t.clone(), *p)).collect();
        let code = self
            .commit_offsets(group, generation, member_id, instance_id, offsets)
            .await;
        if code == ErrorCode::None {
            // an operator's (or a non-transactional consumer's) reset
            crate::coordinators::verify_lineage::reset(self.broker(), group, Some(&parts)).await;
        }
        code
    }

    async fn commit_offsets(
        &self,
        group: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        offsets: Vec<(String, i32, OffsetMeta)>,
    ) -> ErrorCode {
        match self {
            Groups::Local(b) => {
                b.groups
                    .commit(group, generation, member_id, instance_id, offsets)
                    .await
            }
            Groups::Cluster(b, front) => {
                let code = b
                    .groups
                    .check_member(group, generation, member_id, instance_id)
                    .await;
                if code != ErrorCode::None {
                    return code;
                }
                match cg::commit_offsets(&front.cluster, group, &offsets).await {
                    Ok(()) => ErrorCode::None,
                    Err(e) => storage_code(front, group, &e),
                }
            }
        }
    }

    /// TxnOffsetCommit: the offsets are pending in the transaction of
    /// producer `pid` (of `transactional_id`, at `epoch`) until its end; a
    /// member id (KIP-447) must be of the group's current generation.
    #[allow(clippy::too_many_arguments)]
    pub async fn txn_commit(
        &self,
        group: &str,
        transactional_id: &str,
        pid: i64,
        epoch: i16,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        offsets: Vec<(String, i32, OffsetMeta)>,
    ) -> ErrorCode {
        let b = self.broker();
        let outputs = if b.config.verify_enable {
            crate::coordinators::verify_lineage::outputs_of(b, transactional_id).await
        } else {
            Default::default()
        };
        let committed = if b.config.verify_enable {
            let mut topics: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
            for (t, p, _) in &offsets {
                topics.entry(t.clone()).or_default().push(*p);
            }
            self.fetch_offsets(group, Some(topics.into_iter().collect()), false)
                .await
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if b.config.verify_enable {
            if let Some(why) = crate::coordinators::verify_lineage::gate(
                b,
                group,
                transactional_id,
                &outputs,
                &committed,
                &offsets,
            )
            .await
            {
                tracing::warn!(group, transactional_id, "TxnOffsetCommit refused: {why}");
                return ErrorCode::TransactionalIdAuthorizationFailed;
            }
        }
        let code = self
            .txn_commit_offsets(
                group,
                transactional_id,
                pid,
                epoch,
                (generation, member_id, instance_id),
                offsets.clone(),
            )
            .await;
        if code == ErrorCode::None && b.config.verify_enable {
            crate::coordinators::verify_lineage::offered(
                b,
                group,
                transactional_id,
                outputs,
                &committed,
                &offsets,
            )
            .await;
        }
        code
    }

    async fn txn_commit_offsets(
        &self,
        group: &str,
        transactional_id: &str,
        pid: i64,
        epoch: i16,
        (generation, member_id, instance_id): (i32, &str, Option<&str>),
        offsets: Vec<(String, i32, OffsetMeta)>,
    ) -> ErrorCode {
        let verified = |v: Result<(), VerifyError>| match v {
            Ok(()) => ErrorCode::None,
            Err(VerifyError::StaleEpoch) => ErrorCode::InvalidProducerEpoch,
            Err(VerifyError::NotInTransaction) => ErrorCode::InvalidTxnState,
        };
        match self {
            Groups::Local(b) => {
                let verify = || verified(b.txn.verify(pid, epoch, OFFSETS_TOPIC, 0));
                b.groups
                    .txn_commit(
                        group,
                        pid,
                        generation,
                        member_id,
                        instance_id,
                        offsets,
                        verify,
                    )
                    .await
            }
            Groups::Cluster(b, front) => {
                if !member_id.is_empty() {
                    let code = b
                        .groups
                        .check_member(group, generation, member_id, instance_id)
                        .await;
                    if !matches!(code, ErrorCode::None | ErrorCode::RebalanceInProgress) {
                        return code;
                    }
                }
                match cg::txn_commit_offsets(
                    &front.cluster,
                    group,
                    transactional_id,
                    pid,
                    epoch,
                    &offsets,
                )
                .await
                {
                    Ok(v) => verified(v),
                    Err(e) => storage_code(front, group, &e),
                }
            }
        }
    }

    /// OffsetFetch: the committed offsets of `topics` (`None`: all the
    /// group has); with `require_stable` (KIP-447), a partition with
    /// offsets pending in an open transaction is UNSTABLE_OFFSET_COMMIT.
    pub async fn fetch_offsets(
        &self,
        group: &str,
        topics: Option<Vec<(String, Vec<i32>)>>,
        require_stable: bool,
    ) -> Result<Vec<FetchedOffset>, ErrorCode> {
        match self {
            Groups::Local(b) => Ok(b.groups.fetch_offsets(group, topics, require_stable).await),
            Groups::Cluster(_, front) => {
                cg::fetch_offsets(&front.cluster, group, topics, require_stable)
                    .await
                    .map_err(|e| storage_code(front, group, &e))
            }
        }
    }

    /// The groups this broker coordinates, as (id, protocol type, state).
    /// In cluster mode the ones FindCoordinator names this broker for
    /// (their live owner, else the rendezvous choice), so that an admin
    /// client that asks every broker lists each group once; one with only
    /// committed offsets (a simple consumer's) is Empty.
    pub async fn list(&self) -> Result<Vec<(String, String, &'static str)>, ErrorCode> {
        match self {
            Groups::Local(b) => Ok(b.groups.list().await),
            Groups::Cluster(b, front) => {
                let me = front.cluster.config.broker_id;
                let live: Vec<i32> = front.live_now().await.iter().map(|x| x.id).collect();
                let all = cg::all_groups(&front.cluster).await.map_err(|e| {
                    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: ListGroups could not read the groups");
                    ErrorCode::CoordinatorNotAvailable
                })?;
                let held = front.groups.held(front.cluster.session.session());
                let memory: HashMap<String, (String, &'static str)> = b
                    .groups
                    .list()
                    .await
                    .into_iter()
                    .map(|(id, ptype, st)| (id, (ptype, st)))
                    .collect();
                // A group with neither offsets nor members here is gone
                // (its owner row outlived its last offsets, e.g. those of
                // a deleted topic), as Kafka drops an empty group without
                // offsets.
                Ok(all
                    .into_iter()
                    .filter(|(g, owner, _)| {
                        owner
                            .filter(|o| live.contains(o))
                            .or_else(|| crate::machines::placement::rendezvous(g.as_bytes(), &live))
                            == Some(me)
                    })
                    .filter_map(|(g, _, has_offsets)| {
                        match memory.get(&g).filter(|_| held.contains(&g)) {
                            Some((_, "Empty")) | None if !has_offsets => None,
                            Some((ptype, st)) => Some((g, ptype.clone(), *st)),
                            None => Some((g, String::new(), "Empty")),
                        }
                    })
                    .collect())
            }
        }
    }

    /// Every group of [`Scope`] as (id, its snapshot if any): this broker's
    /// ([`Groups::list`]) or, with [`Scope::All`], the cluster's. A group
    /// this broker coordinates is shown as its memory has it; another as
    /// its coordinator last wrote it (a moment after each change); one with only offsets has no
    /// snapshot (Empty).
    pub async fn snapshots(
        &self,
        scope: Scope,
    ) -> Result<Vec<(String, Option<GroupSnapshot>)>, ErrorCode> {
        let mut out = Vec::new();
        match (self, scope) {
            (Groups::Local(b), _) => {
                for (g, _, _) in b.groups.list().await {
                    let s = b.groups.snapshot(&g).await;
                    out.push((g, s));
                }
            }
            (Groups::Cluster(..), Scope::Mine) => {
                for (g, _, _) in self.list().await? {
                    let s = self.snapshot(&g).await?;
                    out.push((g, s));
                }
            }
            (Groups::Cluster(b, front), Scope::All) => {
                let unavailable = |e: ClusterError| {
                    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: the groups could not be read");
                    ErrorCode::CoordinatorNotAvailable
                };
                let all = cg::all_groups(&front.cluster).await.map_err(unavailable)?;
                let mut rows = crate::backend::cluster::membership::all(&front.cluster)
                    .await
                    .map_err(unavailable)?;
                let held = front.groups.held(front.cluster.session.session());
                for (g, _, has_offsets) in all {
                    let s = if held.contains(&g) {
                        b.groups.snapshot(&g).await
                    } else {
                        rows.remove(&g)
                    };
                    // a group with neither offsets nor members is gone
                    if !has_offsets && s.as_ref().is_none_or(|s| s.members.is_empty()) {
                        continue;
                    }
                    out.push((g, s));
                }
            }
        }
        Ok(out)
    }

    /// `group` as its coordinator sees it (see [`Groups::snapshots`]).
    pub async fn snapshot(&self, group: &str) -> Result<Option<GroupSnapshot>, ErrorCode> {
        match self {
            Groups::Local(b) => Ok(b.groups.snapshot(group).await),
            Groups::Cluster(b, front) => {
                if front
                    .groups
                    .held(front.cluster.session.session())
                    .contains(group)
                {
                    return Ok(b.groups.snapshot(group).await);
                }
                crate::backend::cluster::membership::all(&front.cluster)
                    .await
                    .map(|mut all| all.remove(group))
                    .map_err(|e| storage_code(front, group, &e))
            }
        }
    }

    /// The offsets committed in open transactions of `group`: (producer
    /// id, topic, partition, offset), sorted.
    pub async fn pending(&self, group: &str) -> Result<Vec<(i64, String, i32, i64)>, ErrorCode> {
        match self {
            Groups::Local(b) => Ok(b.groups.pending_offsets(group).await),
            Groups::Cluster(_, front) => {
                crate::backend::cluster::membership::pending(&front.cluster, group)
                    .await
                    .map_err(|e| storage_code(front, group, &e))
            }
        }
    }

    /// The state DescribeGroups gives a group the coordinator has no
    /// membership of: Dead, or in cluster mode Empty when it has committed
    /// offsets (a simple consumer's, or members gone before a coordinator
    /// move), as Kafka's coordinator has it.
    pub async fn state_without_members(&self, group: &str) -> Result<&'static str, ErrorCode> {
        match self {
            Groups::Local(_) => Ok("Dead"),
            Groups::Cluster(_, front) => match cg::has_offsets(&front.cluster, group).await {
                Ok(true) => Ok("Empty"),
                Ok(false) => Ok("Dead"),
                Err(e) => Err(storage_code(front, group, &e)),
            },
        }
    }

    /// DeleteGroups of one group: refused with members (NON_EMPTY_GROUP);
    /// otherwise its committed offsets go and its membership is forgotten.
    /// A group with neither members nor offsets is GROUP_ID_NOT_FOUND.
    pub async fn delete(&self, group: &str) -> ErrorCode {
        let code = self.delete_group(group).await;
        if code == ErrorCode::None {
            crate::coordinators::verify_lineage::reset(self.broker(), group, None).await;
        }
        code
    }

    async fn delete_group(&self, group: &str) -> ErrorCode {
        match self {
            Groups::Local(b) => b.groups.delete(group).await,
            Groups::Cluster(b, front) => match b.groups.member_count(group).await {
                Some(n) if n > 0 => ErrorCode::NonEmptyGroup,
                known => match cg::delete_offsets(&front.cluster, group).await {
                    Ok(n) => {
                        // The owner row went too: the next request claims anew.
                        front.groups.release(group);
                        b.groups.forget_membership(group).await;
                        if n == 0 && known.is_none() {
                            ErrorCode::GroupIdNotFound
                        } else {
                            tracing::info!(group = %group, offsets = n, "group deleted");
                            ErrorCode::None
                        }
                    }
                    Err(e) => storage_code(front, group, &e),
                },
            },
        }
    }

    /// OffsetDelete of `partitions` (of existing topics): the group's rule
    /// ([`crate::coordinators::groups::Group::offset_delete_codes`]) on its membership;
    /// a group with no members known may lose any offset. One code per
    /// partition, or one for the whole request. In cluster mode the rows go
    /// in one PostgreSQL transaction (pending transactional offsets of the
    /// same partitions with them), and a group left with no members and no
    /// offsets loses its owner row (it is gone, as in Kafka).
    pub async fn delete_offsets(
        &self,
        group: &str,
        partitions: &[(String, i32)],
    ) -> Result<Vec<ErrorCode>, ErrorCode> {
        let codes = self.delete_partition_offsets(group, partitions).await?;
        let deleted: Vec<(String, i32)> = partitions
            .iter()
            .zip(&codes)
            .filter(|(_, c)| **c == ErrorCode::None)
            .map(|(tp, _)| tp.clone())
            .collect();
        crate::coordinators::verify_lineage::reset(self.broker(), group, Some(&deleted)).await;
        Ok(codes)
    }

    async fn delete_partition_offsets(
        &self,
        group: &str,
        partitions: &[(String, i32)],
    ) -> Result<Vec<ErrorCode>, ErrorCode> {
        match self {
            Groups::Local(b) => b.groups.delete_offsets(group, partitions).await,
            Groups::Cluster(b, front) => {
                let decided = b
                    .groups
                    .with_group(group, |g| {
                        (g.offset_delete_codes(partitions), g.members.is_empty())
                    })
                    .await;
                let known_members = decided.is_some();
                let (codes, no_members) = match decided {
                    Some((codes, no_members)) => (codes?, no_members),
                    None => (vec![ErrorCode::None; partitions.len()], true),
                };
                let eligible: Vec<(String, i32)> = partitions
                    .iter()
                    .zip(&codes)
                    .filter(|(_, c)| **c == ErrorCode::None)
                    .map(|(tp, _)| tp.clone())
                    .collect();
                match cg::delete_partition_offsets(&front.cluster, group, &eligible, no_members)
                    .await
                {
                    Ok(cg::OffsetsDeleted {
                        group_had_offsets,
                        group_gone,
                        deleted,
                    }) => {
                        if !known_members && !group_had_offsets {
                            return Err(ErrorCode::GroupIdNotFound);
                        }
                        if group_gone {
                            front.groups.release(group);
                            b.groups.forget_membership(group).await;
                        }
                        tracing::info!(
                            group,
                            partitions = eligible.len(),
                            rows = deleted,
                            "committed offsets deleted"
                        );
                        Ok(codes)
                    }
                    Err(e) => Err(storage_code(front, group, &e)),
                }
            }
        }
    }
}
