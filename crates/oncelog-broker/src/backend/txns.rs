//! The transaction store: the coordinator's decisions for a transactional
//! id, run in local mode by `txn_service` under the id's lock and in
//! cluster mode by `cluster::txn` inside one PostgreSQL transaction. Both
//! answer with the wire code a refusal is given (PRODUCER_FENCED only
//! where the request version knows it: `fenced_known`).

use std::sync::Arc;

use crate::backend::cluster::front::Front;
use crate::backend::cluster::gates::Gates;
use crate::backend::cluster::txn::{Ran, Refusal};
use crate::backend::cluster::ClusterError;
use crate::coordinators::txn_service::{EndRequest, Init, Parked, TxnError};
use crate::error::{ErrorCode, Gate};
use crate::machines::txn_coordinator::{self as tc, CoordError, TxnMeta, VerifyError};
use crate::observe::txn_history::{FenceCause, Requester};
use crate::Broker;

/// The transaction coordinator's store.
pub enum Txns<'a> {
    Local(&'a Arc<Broker>),
    Cluster(&'a Arc<Broker>, &'a Arc<Front>),
}

impl Broker {
    /// This broker's transaction store.
    pub fn txns(self: &Arc<Self>) -> Txns<'_> {
        match &self.mode {
            crate::Mode::Cluster(front) => Txns::Cluster(self, front),
            crate::Mode::Local => Txns::Local(self),
        }
    }
}

/// The wire code for a local coordinator error; PRODUCER_FENCED only where
/// the request version knows it.
fn txn_error_code(e: &TxnError, fenced_known: bool) -> ErrorCode {
    match e {
        TxnError::Coord(c) => coord_code(*c, fenced_known),
        TxnError::Persist(_) | TxnError::ProducerIds(_) | TxnError::NoAnswer => {
            ErrorCode::CoordinatorNotAvailable
        }
        TxnError::Refused(_) => ErrorCode::TransactionalIdAuthorizationFailed,
    }
}

/// Which transactions a cluster-wide view covers: those this broker
/// coordinates (so that a sum over brokers counts each once: metrics, the
/// log), or all (the same answer through every broker: the admin
/// endpoints). Local mode coordinates all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Mine,
    All,
}

/// Why partitions could not be added to a transaction on a Produce's
/// behalf: the code and message each of them is answered with.
pub type AddRefused = (ErrorCode, String);

const NOT_ADDED: &str = "the partition could not be added to the transaction";

impl Txns<'_> {
    /// A new producer id for an idempotent producer (epoch 0), as Kafka
    /// gives one on every InitProducerId without a transactional id.
    pub async fn new_producer_id(&self) -> Result<i64, ErrorCode> {
        match self {
            Txns::Local(b) => b.producer_ids.next().map_err(|e| {
                tracing::error!(error = %e, "could not allocate a producer id");
                ErrorCode::CoordinatorNotAvailable
            }),
            Txns::Cluster(_, front) => {
                let next = async {
                    let client = front.cluster.pool.get().await.map_err(ClusterError::from)?;
                    let row = client
                        .query_one("SELECT nextval('producer_ids')", &[])
                        .await
                        .map_err(ClusterError::from)?;
                    Ok::<i64, ClusterError>(row.get(0))
                };
                next.await.map_err(|e| {
                    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: could not allocate a producer id");
                    ErrorCode::CoordinatorNotAvailable
                })
            }
        }
    }

    /// InitProducerId for transactional id `id`: a new epoch (or producer
    /// id) that fences the previous one and aborts its open transaction,
    /// unless that transaction holds a topic being cut over. `expected`:
    /// the producer's own identity on a re-initialisation (KIP-360).
    /// `two_phase`: KIP-939's fields (the handler refuses them unless
    /// `transaction.two.phase.commit.enable`).
    pub async fn init_producer_id(
        &self,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
        two_phase: tc::TwoPhase,
        who: &Requester,
        fenced_known: bool,
    ) -> Result<Init, ErrorCode> {
        match self {
            Txns::Local(b) => b
                .txn
                .init_producer_id(b, id, timeout_ms, expected, two_phase, who)
                .await
                .map_err(|e| txn_error_code(&e, fenced_known)),
            Txns::Cluster(b, front) => {
                let tid = id.to_string();
                let f = Box::new(
                    move |m: Option<&TxnMeta>,
                          now: i64,
                          new_pid: &mut dyn FnMut() -> i64,
                          g: &Gates| {
                        // Keeping the prepared transaction aborts nothing.
                        if let Some((m, t)) = m
                            .filter(|_| !two_phase.keep_prepared)
                            .and_then(|m| g.protected(m).map(|t| (m, t)))
                        {
                            tracing::warn!(transactional_id = %tid, topic = t, producer_id = m.producer_id, epoch = m.epoch,
                                "InitProducerId refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): it would abort a transaction holding a topic being cut over");
                            return Err(Gate::Refused(format!(
                                "transactional id {tid:?} has an open transaction holding topic {t:?}, which is being cut over (oncelog cutover): \
                                 it ends only by its own EndTxn (the new writer's restored committer) or at the drain deadline, \
                                 so a new producer may not take the id and abort it"
                            ))
                            .into());
                        }
                        let (effects, _) = tc::decide_init_2pc(
                            m, &tid, timeout_ms, expected, two_phase, now, new_pid,
                        )?;
                        Ok(effects)
                    },
                );
                let asker = expected.unwrap_or((-1, -1));
                let ran = decide(
                    b,
                    front,
                    id,
                    "InitProducerId",
                    &[],
                    f,
                    fenced_known,
                    (asker, who),
                )
                .await?;
                let (pid, epoch) = ran.identity;
                let before = ran.before.as_ref();
                // KIP-939: the open transaction kept, at the next epoch.
                let kept = before
                    .filter(|m| two_phase.keep_prepared && m.state == tc::TxnState::Ongoing)
                    .filter(|_| {
                        ran.ended().is_none()
                            && ran
                                .after()
                                .is_some_and(|a| a.state == tc::TxnState::Ongoing)
                    })
                    .map(|m| (m.producer_id, m.epoch));
                if let Some((kpid, kepoch)) = kept {
                    tracing::info!(transactional_id = id, producer_id = pid, epoch, prepared_producer_id = kpid, prepared_epoch = kepoch,
                        "InitProducerId kept the prepared transaction (KIP-939 keepPreparedTxn); the new producer commits or aborts it");
                }
                match (before, ran.ended()) {
                    (Some(old), Some((f, done))) => {
                        b.txn.fenced_by_init(old, f, who);
                        b.txn.count_completed(false, old.start_ms);
                        b.txn
                            .note_end(f, done, f.epoch, "newer_producer", None, Some(who));
                    }
                    _ => {
                        if let Some(after) = ran.after() {
                            b.txn.note_init(before, after, expected, who);
                        }
                    }
                }
                tracing::debug!(transactional_id = %id, producer_id = pid, epoch, "cluster: producer initialised");
                Ok(Init {
                    producer_id: pid,
                    epoch,
                    kept,
                })
            }
        }
    }

    /// AddPartitionsToTxn: `parts` join the transaction of `id` (producer
    /// `pid` at `epoch`), each topic's writer fence and cut-over checked in
    /// the same step.
    pub async fn add_partitions(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        parts: &[(String, i32)],
        who: &Requester,
        fenced_known: bool,
    ) -> Result<(), ErrorCode> {
        match self {
            Txns::Local(b) => {
                let gate = |t: &str, holds: bool| b.write_gate(t, id, holds);
                b.txn
                    .add_partitions_by(id, pid, epoch, parts, who, &gate)
                    .await
                    .map_err(|e| txn_error_code(&e, fenced_known))
            }
            Txns::Cluster(b, front) => {
                let add = parts.to_vec();
                let names: Vec<String> = parts.iter().map(|(t, _)| t.clone()).collect();
                let tid = id.to_string();
                let f = Box::new(
                    move |m: Option<&TxnMeta>, now: i64, _: &mut dyn FnMut() -> i64, g: &Gates| {
                        let effects = tc::decide_add_partitions(m, pid, epoch, &add, now)?;
                        g.check_adds(m, &tid, add.iter().map(|(t, _)| t.as_str()))?;
                        Ok(effects)
                    },
                );
                let ran = decide(
                    b,
                    front,
                    id,
                    "AddPartitionsToTxn",
                    &names,
                    f,
                    fenced_known,
                    ((pid, epoch), who),
                )
                .await?;
                if let Some(after) = ran.after() {
                    b.txn.note_added(ran.before.as_ref(), after, who);
                }
                Ok(())
            }
        }
    }

    /// AddOffsetsToTxn (and TxnOffsetCommit v5 implicitly): the group
    /// offsets' partition joins the transaction of `id`; EndTxn then
    /// completes the pending offsets instead of writing a marker there.
    pub async fn add_offsets(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        fenced_known: bool,
    ) -> Result<(), ErrorCode> {
        let parts = vec![(crate::coordinators::groups::OFFSETS_TOPIC.to_string(), 0)];
        match self {
            Txns::Local(b) => b
                .txn
                .add_partitions(id, pid, epoch, &parts)
                .await
                .map_err(|e| txn_error_code(&e, fenced_known)),
            Txns::Cluster(b, front) => {
                let f = Box::new(
                    move |m: Option<&TxnMeta>, now: i64, _: &mut dyn FnMut() -> i64, _: &Gates| {
                        Ok(tc::decide_add_partitions(m, pid, epoch, &parts, now)?)
                    },
                );
                let who = Requester::default();
                let ran = decide(
                    b,
                    front,
                    id,
                    "AddOffsetsToTxn",
                    &[],
                    f,
                    fenced_known,
                    ((pid, epoch), &who),
                )
                .await?;
                if let Some(after) = ran.after() {
                    b.txn.note_added(ran.before.as_ref(), after, &who);
                }
                Ok(())
            }
        }
    }

    /// KIP-890 verification (AddPartitionsToTxn v4+ `verify_only`): may
    /// producer `pid` of `id` at `epoch` write a transactional batch to
    /// `topic`-`partition`?
    pub async fn verify(
        &self,
        id: &str,
        pid: i64,
        epoch: i16,
        topic: &str,
        partition: i32,
    ) -> Result<Result<(), VerifyError>, ErrorCode> {
        match self {
            Txns::Local(b) => Ok(b.txn.verify(pid, epoch, topic, partition)),
            Txns::Cluster(_, front) => {
                let meta = crate::backend::cluster::txn::describe(&front.cluster.pool, id)
                    .await
                    .map_err(|e| {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, transactional_id = id, error = %e, "cluster: reading a transaction failed");
                        ErrorCode::CoordinatorNotAvailable
                    })?;
                let view = meta
                    .filter(|m| m.producer_id == pid)
                    .map(|m| tc::ProducerView::of(&m));
                Ok(tc::verify_write(view.as_ref(), epoch, topic, partition))
            }
        }
    }

    /// What the coordinator knows of `id` (DescribeTransactions); `None`
    /// for an id it does not know.
    pub async fn describe(&self, ids: &[String]) -> Result<Vec<Option<TxnMeta>>, ErrorCode> {
        match self {
            Txns::Local(b) => {
                let mut out = Vec::with_capacity(ids.len());
                for id in ids {
                    out.push(b.txn.describe(id).await);
                }
                Ok(out)
            }
            Txns::Cluster(_, front) => {
                let states = crate::backend::cluster::describe::transactions(&front.cluster, Some(ids))
                    .await
                    .map_err(|e| {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: DescribeTransactions could not read the coordinator");
                        ErrorCode::CoordinatorNotAvailable
                    })?;
                Ok(ids
                    .iter()
                    .map(|id| states.iter().find(|m| &m.transactional_id == id).cloned())
                    .collect())
            }
        }
    }

    /// The transactions this broker coordinates (ListTransactions), and
    /// the coordinator's time now (ms). In cluster mode, the ids
    /// FindCoordinator names this broker for, so that an admin client that
    /// asks every broker lists each id once.
    pub async fn list(&self) -> Result<(Vec<TxnMeta>, i64), ErrorCode> {
        self.list_in(Scope::Mine).await
    }

    /// The transactions of [`Scope`]: those this broker coordinates
    /// ([`Txns::list`]), or all of the cluster's (the same answer through
    /// every broker).
    pub async fn list_in(&self, scope: Scope) -> Result<(Vec<TxnMeta>, i64), ErrorCode> {
        match self {
            Txns::Local(b) => Ok((b.txn.list().await, oncelog_log::now_ms())),
            Txns::Cluster(_, front) => {
                let me = front.cluster.config.broker_id;
                let live: Vec<i32> = front.live_now().await.iter().map(|x| x.id).collect();
                let read = async {
                    let all = crate::backend::cluster::describe::transactions(&front.cluster, None)
                        .await?;
                    let now = crate::backend::cluster::describe::now_ms(&front.cluster).await?;
                    Ok::<_, ClusterError>((all, now))
                };
                let (all, now) = read.await.map_err(|e| {
                    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: ListTransactions could not read the coordinator");
                    ErrorCode::CoordinatorNotAvailable
                })?;
                let mine = all
                    .into_iter()
                    .filter(|m| {
                        scope == Scope::All
                            || crate::machines::placement::rendezvous(
                                m.transactional_id.as_bytes(),
                                &live,
                            ) == Some(me)
                    })
                    .collect();
                Ok((mine, now))
            }
        }
    }

    /// An operator's abort of producer `pid`'s transaction (WriteTxnMarkers
    /// ABORT from an admin tool), run as its coordinator's abort: markers on
    /// all of its partitions. `Ok(false)`: no transactional id has this
    /// producer (a hanging transaction, if any, is ended partition by
    /// partition by [`Txns::abort_hanging`]).
    pub async fn admin_abort(&self, pid: i64, who: &Requester) -> Result<bool, ErrorCode> {
        match self {
            Txns::Local(b) => {
                use crate::coordinators::txn_service::AdminAbort;
                match b.txn.admin_abort(b, pid, who).await {
                    Ok(AdminAbort::Aborted) => Ok(true),
                    Ok(AdminAbort::Completing) => Err(ErrorCode::ConcurrentTransactions),
                    Ok(AdminAbort::NotKnown) => Ok(false),
                    // The transaction's id is busy with another change: retriable.
                    Err(TxnError::Coord(_)) => Err(ErrorCode::ConcurrentTransactions),
                    Err(e) => {
                        tracing::error!(producer_id = pid, error = %e, "admin abort failed");
                        Err(ErrorCode::KafkaStorageError)
                    }
                }
            }
            Txns::Cluster(b, front) => {
                use crate::backend::cluster::txn::AdminAbort;
                match crate::backend::cluster::txn::admin_abort(&front.cluster, pid).await {
                    Ok(AdminAbort::Done(aborted)) => {
                        for (old, prepared, done) in &aborted {
                            b.txn.fenced_by_admin(old, prepared, who);
                            b.txn.count_completed(false, old.start_ms);
                            b.txn.note_end(
                                prepared,
                                done,
                                prepared.epoch,
                                "administrator",
                                Some(who),
                                None,
                            );
                        }
                        Ok(true)
                    }
                    Ok(AdminAbort::NotKnown) => Ok(false),
                    Err(e) => {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, producer_id = pid, error = %e, "cluster: admin abort not committed");
                        Err(ErrorCode::ConcurrentTransactions)
                    }
                }
            }
        }
    }

    /// Ends a hanging transaction of producer `pid` on one partition with
    /// an ABORT marker (KIP-664's `--abort` of a transaction no
    /// coordinator knows). Cluster mode has no such transactions (a
    /// partition takes transactional data only for a partition its
    /// coordinator added), so there is nothing to end there.
    pub async fn abort_hanging(
        &self,
        topic: &str,
        partition: i32,
        pid: i64,
        epoch: i16,
        coordinator_epoch: i32,
    ) -> ErrorCode {
        match self {
            Txns::Local(b) => {
                crate::coordinators::txn_service::abort_hanging(
                    b,
                    topic,
                    partition,
                    pid,
                    epoch,
                    coordinator_epoch,
                )
                .await
            }
            Txns::Cluster(..) => {
                tracing::info!(
                    producer_id = pid,
                    topic,
                    partition,
                    "cluster: admin abort of a producer no transactional id has; nothing to abort"
                );
                ErrorCode::None
            }
        }
    }

    /// The history of transactional id `id` as JSON
    /// ([`crate::observe::txn_history::TxnHistory::to_json`]): this broker's memory
    /// in local mode; the cluster's rows, the same through every broker,
    /// in cluster mode.
    pub async fn history(&self, id: &str) -> Result<serde_json::Value, ErrorCode> {
        match self {
            Txns::Local(b) => Ok(b.txn.history_json(id)),
            Txns::Cluster(_, front) => crate::backend::cluster::history::read(&front.cluster, id)
                .await
                .map_err(|e| {
                    crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, transactional_id = id, error = %e, "cluster: the transaction history could not be read");
                    ErrorCode::CoordinatorNotAvailable
                }),
        }
    }

    /// `f` of every id's history (in cluster mode the cluster's notes
    /// since `since_ms`; local mode keeps its own in memory).
    pub async fn with_histories<T>(
        &self,
        since_ms: i64,
        f: impl FnOnce(&crate::observe::txn_history::TxnHistory) -> T,
    ) -> Result<T, ErrorCode> {
        match self {
            Txns::Local(b) => Ok(b.txn.with_history(f)),
            Txns::Cluster(_, front) => {
                match crate::backend::cluster::history::read_since(&front.cluster, since_ms).await {
                    Ok(h) => Ok(f(&h)),
                    Err(e) => {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: the transaction history could not be read");
                        Err(ErrorCode::CoordinatorNotAvailable)
                    }
                }
            }
        }
    }

    /// One pass of the timeout driver: each transaction past its timeout
    /// is aborted and its producer fenced, or parked, as
    /// [`TxnService::on_timeout`](crate::coordinators::txn_service::TxnService::on_timeout)
    /// says (one rule for both modes); parked ones are reported in the log
    /// by their coordinator.
    pub async fn time_out(&self) {
        match self {
            Txns::Local(b) => b.txn.abort_timed_out(b),
            Txns::Cluster(b, front) => {
                let policy = |m: &TxnMeta| b.txn.on_timeout(m);
                match crate::backend::cluster::txn::abort_expired(&front.cluster, &policy).await {
                    Ok(expired) => {
                        // The parked ones this broker coordinates, from the
                        // same read (no second scan of the transactions).
                        let me = front.cluster.config.broker_id;
                        let live: Vec<i32> = front.live().iter().map(|x| x.id).collect();
                        let mine = expired.parked.iter().filter(|m| {
                            crate::machines::placement::rendezvous(
                                m.transactional_id.as_bytes(),
                                &live,
                            ) == Some(me)
                        });
                        b.txn
                            .report_parked(&b.txn.parked_among(mine, expired.now), expired.now);
                        for t in expired.ended {
                            b.txn.count_fence(&t.before.transactional_id, "timeout");
                            b.txn.count_completed(false, t.before.start_ms);
                            b.txn
                                .note_fence(&t.before, &t.prepared, FenceCause::Timeout, None);
                            b.txn.note_end(
                                &t.prepared,
                                &t.done,
                                t.prepared.epoch,
                                "timeout",
                                None,
                                None,
                            );
                        }
                    }
                    Err(e) => {
                        crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: the transaction timeout check failed")
                    }
                }
            }
        }
    }

    /// The transactions parked past their timeout (oldest first), and the
    /// coordinator's time now; `scope` as [`Scope`] says.
    pub async fn parked(&self, scope: Scope) -> Result<(Vec<Parked>, i64), ErrorCode> {
        match self {
            Txns::Local(b) => Ok((b.txn.parked(), oncelog_log::now_ms())),
            Txns::Cluster(b, front) => {
                let (open, now) = match scope {
                    Scope::Mine => self.list().await?,
                    Scope::All => {
                        let read = async {
                            let all = crate::backend::cluster::describe::transactions(
                                &front.cluster,
                                None,
                            )
                            .await?;
                            let now =
                                crate::backend::cluster::describe::now_ms(&front.cluster).await?;
                            Ok::<_, ClusterError>((all, now))
                        };
                        read.await.map_err(|e| {
                            crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, error = %e, "cluster: the parked transactions could not be read");
                            ErrorCode::CoordinatorNotAvailable
                        })?
                    }
                };
                Ok((b.txn.parked_among(&open, now), now))
            }
        }
    }

    /// (open transactions, start time of the oldest in ms) of those this
    /// broker coordinates (in cluster mode, the ids FindCoordinator names
    /// it for, so that each is counted once across the cluster).
    pub async fn open_transactions(&self) -> (usize, Option<i64>) {
        match self {
            Txns::Local(b) => b.txn.open_transactions().await,
            Txns::Cluster(..) => match self.list().await {
                Ok((mine, _)) => {
                    let open: Vec<i64> = mine
                        .iter()
                        .filter(|m| m.state == tc::TxnState::Ongoing)
                        .map(|m| m.start_ms)
                        .collect();
                    (open.len(), open.into_iter().filter(|t| *t >= 0).min())
                }
                Err(_) => (0, None),
            },
        }
    }

    /// EndTxn: commits or aborts the transaction of `req.id` (the writer
    /// fence and a cut-over checked in the step that commits). Returns the
    /// identity the producer's next transaction uses (a new epoch under
    /// transaction version 2).
    pub async fn end_txn(
        &self,
        req: EndRequest<'_>,
        who: &Requester,
        fenced_known: bool,
    ) -> Result<(i64, i16), ErrorCode> {
        match self {
            Txns::Local(b) => b
                .txn
                .end_txn(b, req, who)
                .await
                .map_err(|e| txn_error_code(&e, fenced_known)),
            Txns::Cluster(b, front) => {
                let EndRequest {
                    id,
                    producer_id: pid,
                    epoch,
                    commit,
                    tv2,
                } = req;
                let tid = id.to_string();
                let f = Box::new(
                    move |m: Option<&TxnMeta>,
                          now: i64,
                          new_pid: &mut dyn FnMut() -> i64,
                          g: &Gates| {
                        let effects = tc::decide_end(m, pid, epoch, commit, tv2, now, new_pid)?;
                        // The writer fence and a cut-over, in the step that commits.
                        g.check_commit(&tid, &effects)?;
                        Ok(effects)
                    },
                );
                let what = if commit {
                    "EndTxn(commit)"
                } else {
                    "EndTxn(abort)"
                };
                let ran = decide(
                    b,
                    front,
                    id,
                    what,
                    &[],
                    f,
                    fenced_known,
                    ((pid, epoch), who),
                )
                .await?;
                tracing::debug!(transactional_id = %id, commit, "cluster: transaction ended");
                // The topics a commit wrote to (for the record of each
                // topic's writers).
                let mut topics = Vec::new();
                if let Some((prepared, done)) = ran.ended() {
                    b.txn.count_completed(commit, prepared.start_ms);
                    b.txn
                        .note_end(prepared, done, epoch, "end_txn", Some(who), Some(who));
                    if commit {
                        topics = prepared.partitions.iter().map(|(t, _)| t.clone()).collect();
                    }
                }
                topics.retain(|t| t != crate::coordinators::groups::OFFSETS_TOPIC);
                topics.sort();
                topics.dedup();
                if !topics.is_empty() {
                    let (b, front) = ((*b).clone(), (*front).clone());
                    let writer = crate::machines::writers::prefix_of(id).to_string();
                    tokio::spawn(async move {
                        if let Err(e) = crate::backend::cluster::writers::record_commit(
                            &front.cluster,
                            &front.writers,
                            &b.writers,
                            &topics,
                            &writer,
                            oncelog_log::now_ms(),
                        )
                        .await
                        {
                            tracing::debug!(error = %e, "cluster: recording a topic's writers failed");
                        }
                    });
                }
                Ok(ran.identity)
            }
        }
    }

    /// KIP-890 part 2 (Produce v12): adds `parts` to the transaction of
    /// `tid` (producer `pid` at `epoch`) on the client's behalf, with the
    /// topics' gates (a cut-over's old writer may not add them). Never
    /// PRODUCER_FENCED in a produce answer (INVALID_PRODUCER_EPOCH); the
    /// retriable coordinator states become NOT_ENOUGH_REPLICAS, which every
    /// client retries.
    pub async fn implicit_add(
        &self,
        tid: &str,
        pid: i64,
        epoch: i16,
        parts: &[(String, i32)],
        who: &Requester,
    ) -> Result<(), AddRefused> {
        match self {
            Txns::Local(b) => {
                let gate = |t: &str, holds: bool| b.write_gate(t, tid, holds);
                let e = match b
                    .txn
                    .add_partitions_by(tid, pid, epoch, parts, who, &gate)
                    .await
                {
                    Ok(()) => return Ok(()),
                    Err(e) => e,
                };
                if let TxnError::Refused(why) = e {
                    return Err((ErrorCode::TransactionalIdAuthorizationFailed, why));
                }
                let code = match e {
                    TxnError::Coord(CoordError::ProducerFenced) => ErrorCode::InvalidProducerEpoch,
                    TxnError::Coord(CoordError::ConcurrentTransactions)
                    | TxnError::Persist(_)
                    | TxnError::ProducerIds(_)
                    | TxnError::NoAnswer => ErrorCode::NotEnoughReplicas,
                    TxnError::Coord(_) => ErrorCode::InvalidTxnState,
                    TxnError::Refused(_) => ErrorCode::TransactionalIdAuthorizationFailed,
                };
                tracing::warn!(transactional_id = tid, producer_id = pid, epoch, error = %e,
                    "implicit add to transaction refused");
                if matches!(e, TxnError::Coord(CoordError::ProducerFenced)) {
                    for tp in parts {
                        b.txn
                            .rejected_write(pid, epoch, tp, Some(tid), "producer fenced", who);
                    }
                }
                Err((code, NOT_ADDED.to_string()))
            }
            Txns::Cluster(b, front) => {
                if front.added.covers(tid, pid, epoch, parts) {
                    return Ok(());
                }
                let add = parts.to_vec();
                let names: Vec<String> = parts.iter().map(|(t, _)| t.clone()).collect();
                let id = tid.to_string();
                let f = Box::new(
                    move |m: Option<&TxnMeta>, now: i64, _: &mut dyn FnMut() -> i64, g: &Gates| {
                        let effects = tc::decide_add_partitions(m, pid, epoch, &add, now)?;
                        g.check_adds(m, &id, add.iter().map(|(t, _)| t.as_str()))?;
                        Ok(effects)
                    },
                );
                let declined = match decide(
                    b,
                    front,
                    tid,
                    "Produce",
                    &names,
                    f,
                    false,
                    ((pid, epoch), who),
                )
                .await
                {
                    Ok(ran) => {
                        if let Some(after) = ran.after() {
                            b.txn.note_added(ran.before.as_ref(), after, who);
                        }
                        front.added.note(tid, pid, epoch, parts);
                        return Ok(());
                    }
                    Err(d) => d,
                };
                let code = match declined.code {
                    ErrorCode::InvalidProducerEpoch | ErrorCode::ProducerFenced => {
                        for tp in parts {
                            b.txn
                                .rejected_write(pid, epoch, tp, Some(tid), "producer fenced", who);
                        }
                        ErrorCode::InvalidProducerEpoch
                    }
                    ErrorCode::ConcurrentTransactions | ErrorCode::CoordinatorNotAvailable => {
                        ErrorCode::NotEnoughReplicas
                    }
                    ErrorCode::TransactionalIdAuthorizationFailed => {
                        ErrorCode::TransactionalIdAuthorizationFailed
                    }
                    _ => ErrorCode::InvalidTxnState,
                };
                Err((code, declined.why.unwrap_or_else(|| NOT_ADDED.to_string())))
            }
        }
    }
}

/// The wire code of a coordinator refusal; PRODUCER_FENCED only where the
/// request version knows it (as local mode).
fn coord_code(e: CoordError, fenced_known: bool) -> ErrorCode {
    match e {
        CoordError::ConcurrentTransactions => ErrorCode::ConcurrentTransactions,
        CoordError::ProducerFenced if fenced_known => ErrorCode::ProducerFenced,
        CoordError::ProducerFenced => ErrorCode::InvalidProducerEpoch,
        CoordError::InvalidProducerIdMapping => ErrorCode::InvalidProducerIdMapping,
        CoordError::InvalidTxnState => ErrorCode::InvalidTxnState,
    }
}

/// Why a decision was declined: the wire code, and the reason a gate
/// gave (for an answer's message).
struct Declined {
    code: ErrorCode,
    why: Option<String>,
}

impl From<ErrorCode> for Declined {
    fn from(code: ErrorCode) -> Self {
        Self { code, why: None }
    }
}

impl From<Declined> for ErrorCode {
    fn from(d: Declined) -> Self {
        d.code
    }
}

/// Runs a coordinator decision (with the gates of `topics`); storage
/// failures are retriable (COORDINATOR_NOT_AVAILABLE: the client looks the
/// coordinator up again). `what` names the request in the log lines;
/// `asker` (the identity it came with, and who sent it) goes in the id's
/// history when it is refused as a fenced producer's.
#[allow(clippy::too_many_arguments)]
async fn decide(
    b: &Broker,
    front: &Front,
    id: &str,
    what: &str,
    topics: &[String],
    f: Box<crate::backend::cluster::txn::Decide<'_>>,
    fenced_known: bool,
    asker: ((i64, i16), &Requester),
) -> Result<Ran, Declined> {
    let refused = match crate::backend::cluster::txn::run(&front.cluster, id, topics, f).await {
        Ok(Ok(ran)) => return Ok(ran),
        Ok(Err(r)) => r,
        Err(e) => {
            crate::backend::cluster::outage::cluster_warn!(front.cluster.outage, e, transactional_id = id, error = %e, "cluster: coordinator decision not committed");
            return Err(ErrorCode::CoordinatorNotAvailable.into());
        }
    };
    Err(match refused {
        Refusal::Coord(CoordError::ProducerFenced) => {
            let ((pid, epoch), who) = asker;
            tracing::warn!(
                transactional_id = id,
                producer_id = pid,
                epoch,
                client_id = who.client_id.as_deref().unwrap_or(""),
                peer = %who.peer.map(|p| p.to_string()).unwrap_or_default(),
                "{what} from a fenced producer"
            );
            b.txn.note_fenced_request(id, pid, epoch, what, who);
            coord_code(CoordError::ProducerFenced, fenced_known).into()
        }
        Refusal::Coord(e) => {
            let ((pid, epoch), who) = asker;
            crate::coordinators::txn_service::log_refused(what, id, (pid, epoch), e, None, who);
            coord_code(e, fenced_known).into()
        }
        // As local mode: a held commit is retried by the client.
        Refusal::Gate(Gate::Held(why)) => {
            tracing::debug!(transactional_id = id, request = what, reason = %why, "commit held");
            Declined {
                code: ErrorCode::ConcurrentTransactions,
                why: Some(why),
            }
        }
        Refusal::SecondWriter(why) => {
            tracing::warn!(transactional_id = id, request = what, reason = %why, "second transactional writer refused");
            Declined {
                code: ErrorCode::TransactionalIdAuthorizationFailed,
                why: Some(why),
            }
        }
        Refusal::Gate(Gate::Refused(why)) => {
            tracing::warn!(transactional_id = id, request = what, reason = %why, "transactional write refused");
            Declined {
                code: ErrorCode::TransactionalIdAuthorizationFailed,
                why: Some(why),
            }
        }
    })
}
