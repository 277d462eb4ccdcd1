//! Cut-overs (a topic handed from one transactional writer to another):
//! what the driver ([`crate::coordinators::cutover`], written once) needs
//! of a backend. Local mode keeps the cut-overs in the data directory and
//! runs its steps under the transaction coordinator's locks; cluster mode
//! keeps a `cutovers` row per topic and runs each step as one PostgreSQL
//! transaction (any broker serves them).

use std::sync::Arc;

use crate::backend::cluster::cutover as pg;
use crate::backend::cluster::{Cluster, ClusterError};
use crate::machines::cutover::{Cutover, Phase};
use crate::machines::txn_coordinator::TxnMeta;
use crate::Broker;

/// The cut-over store.
pub enum Cutovers<'a> {
    Local(&'a Arc<Broker>),
    Cluster(&'a Cluster),
}

/// Why a cut-over request or step did not change anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CutoverFailure {
    /// The request is wrong for the topic's state (a conflict), and why.
    Refused(String),
    /// The backend did not answer or failed; already logged.
    Unavailable(String),
}

impl std::fmt::Display for CutoverFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CutoverFailure::Refused(why) | CutoverFailure::Unavailable(why) => f.write_str(why),
        }
    }
}

impl Broker {
    /// This broker's cut-over store.
    pub fn cutover_store(self: &Arc<Self>) -> Cutovers<'_> {
        match &self.mode {
            crate::Mode::Cluster(front) => Cutovers::Cluster(&front.cluster),
            crate::Mode::Local => Cutovers::Local(self),
        }
    }
}

/// A failure of the cluster's database, logged once: an outage by the
/// outage reporter (once a minute), anything else here.
fn unavailable(cluster: &Cluster, e: ClusterError) -> CutoverFailure {
    if !cluster.outage.absorb(&e) {
        tracing::warn!(error = %e, "cut-over: the cluster's database failed");
    }
    CutoverFailure::Unavailable(format!("the cluster's database did not answer: {e}"))
}

/// A failure of a local step (a state file could not be written, or the
/// transaction coordinator could not take every lock), logged here.
fn local(what: &str, e: String) -> CutoverFailure {
    tracing::warn!(error = %e, "cut-over: {what} failed");
    CutoverFailure::Unavailable(format!("{what}: {e}"))
}

impl Cutovers<'_> {
    /// The backend's clock (ms): the broker's in local mode, PostgreSQL's
    /// in a cluster (so the brokers' clocks do not matter).
    pub async fn now(&self) -> Result<i64, CutoverFailure> {
        match self {
            Cutovers::Local(_) => Ok(crate::now_ms()),
            Cutovers::Cluster(c) => pg::now(&c.pool).await.map_err(|e| unavailable(c, e)),
        }
    }

    /// Whether the broker's once-a-second timer drives the cut-overs
    /// ([`crate::coordinators::cutover::drive`]): in a cluster, one broker
    /// at a time does, under the job's lease (its scheduler calls the same
    /// driver).
    pub fn driven_by_timer(&self) -> bool {
        matches!(self, Cutovers::Local(_))
    }

    /// Every topic's latest cut-over.
    pub async fn all(&self) -> Result<Vec<Cutover>, CutoverFailure> {
        match self {
            Cutovers::Local(b) => Ok(b.cutovers.all()),
            Cutovers::Cluster(c) => pg::all(&c.pool).await.map_err(|e| unavailable(c, e)),
        }
    }

    /// The topic's latest cut-over.
    pub async fn get(&self, topic: &str) -> Result<Option<Cutover>, CutoverFailure> {
        match self {
            Cutovers::Local(b) => Ok(b.cutovers.get(topic)),
            Cutovers::Cluster(c) => pg::get(&c.pool, topic).await.map_err(|e| unavailable(c, e)),
        }
    }

    /// Replaces the topic's cut-over by what `f` makes of the current one,
    /// given the topic's writer config and the backend's clock; refused
    /// for an unknown or internal topic. Changes of one topic are
    /// serialised.
    pub async fn change(
        &self,
        topic: &str,
        f: impl FnOnce(Option<&Cutover>, Option<&str>, i64) -> Result<Cutover, String> + Send,
    ) -> Result<Cutover, CutoverFailure> {
        match self {
            Cutovers::Local(b) => {
                let config = b.writer_config(topic).map_err(CutoverFailure::Refused)?;
                let mut refused = None;
                let changed = b.cutovers.update(topic, |cur| {
                    match f(cur, config.as_deref(), crate::now_ms()) {
                        Ok(c) => Ok(Some(c)),
                        Err(why) => {
                            refused = Some(why.clone());
                            Err(why)
                        }
                    }
                });
                match (changed, refused) {
                    (Ok(Some(c)), _) => Ok(c),
                    (_, Some(why)) => Err(CutoverFailure::Refused(why)),
                    (Err(e), None) => Err(local("writing the cut-over", e)),
                    (Ok(None), None) => Err(CutoverFailure::Refused("no cut-over".into())),
                }
            }
            Cutovers::Cluster(c) => pg::change(&c.pool, topic, f).await.map_err(|e| match e {
                pg::CutoverError::Refused(why) => CutoverFailure::Refused(why),
                pg::CutoverError::Cluster(e) => unavailable(c, e),
            }),
        }
    }

    /// Changes the topic's cut-over by `f` if it is still in `phase`.
    pub async fn update_if(
        &self,
        topic: &str,
        phase: Phase,
        f: impl FnOnce(&mut Cutover) + Send,
    ) -> Result<(), CutoverFailure> {
        match self {
            Cutovers::Local(b) => b
                .cutovers
                .update_if(topic, phase, f)
                .map_err(|e| local("writing the cut-over", e)),
            Cutovers::Cluster(c) => pg::update_if(&c.pool, topic, phase, f)
                .await
                .map_err(|e| unavailable(c, e)),
        }
    }

    /// The transactions of `writer` that hold a partition of `topic`.
    pub async fn holding(&self, writer: &str, topic: &str) -> Result<Vec<TxnMeta>, CutoverFailure> {
        match self {
            Cutovers::Local(b) => Ok(b.txn.holding(writer, topic)),
            Cutovers::Cluster(c) => pg::holding(&c.pool, writer, topic)
                .await
                .map_err(|e| unavailable(c, e)),
        }
    }

    /// Fences every transactional id of `writer` (only those whose
    /// transaction holds `holding`, when given): an open transaction is
    /// aborted with a bumped epoch, an idle id gets a bumped epoch. How
    /// many were fenced; an error leaves the rest to the next call.
    pub async fn fence_writer(
        &self,
        writer: &str,
        holding: Option<&str>,
        why: &str,
    ) -> Result<usize, CutoverFailure> {
        match self {
            Cutovers::Local(b) => b
                .txn
                .fence_writer(b, writer, holding, why)
                .await
                .map_err(|e| local("fencing the writer", e)),
            Cutovers::Cluster(c) => pg::fence_writer(c, writer, holding, why)
                .await
                .map_err(|e| unavailable(c, e)),
        }
    }

    /// The switch of a draining cut-over: `Switched`, taken only while no
    /// transaction of the old writer holds the topic, with every such
    /// commit before it and every commit of the new writer after it.
    /// `Ok(false)`: not yet (or the cut-over changed meanwhile).
    pub async fn switch(&self, c: &Cutover) -> Result<bool, CutoverFailure> {
        match self {
            Cutovers::Local(b) => {
                let switched = b.txn.switch_when_drained(&c.from, &c.topic, || {
                    b.cutovers
                        .update(&c.topic, |cur| match cur {
                            Some(cur)
                                if cur.phase == Phase::Draining
                                    && (cur.from.as_str(), cur.to.as_str())
                                        == (c.from.as_str(), c.to.as_str()) =>
                            {
                                let mut n = cur.clone();
                                n.phase = Phase::Switched;
                                n.ended_ms = crate::now_ms();
                                Ok(Some(n))
                            }
                            _ => Err("the cut-over changed meanwhile".into()),
                        })
                        .map(|_| ())
                });
                match switched {
                    Ok(done) => Ok(done),
                    Err(e) => {
                        tracing::debug!(topic = %c.topic, error = %e, "cut-over not switched");
                        Ok(false)
                    }
                }
            }
            Cutovers::Cluster(cl) => pg::switch(&cl.pool, c)
                .await
                .map_err(|e| unavailable(cl, e)),
        }
    }

    /// Sets the topic's `writer.transactional.id.prefix` to `writer`.
    pub async fn set_writer(&self, topic: &str, writer: &str) -> Result<(), CutoverFailure> {
        match self {
            Cutovers::Local(b) => b
                .set_writer_config(topic, writer)
                .map_err(|e| local("setting the topic's writer", e)),
            Cutovers::Cluster(c) => pg::set_writer(&c.pool, topic, writer)
                .await
                .map_err(|e| unavailable(c, e)),
        }
    }
}
