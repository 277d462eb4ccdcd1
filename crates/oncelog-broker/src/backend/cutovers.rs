//! Cut-overs (a topic handed from one transactional writer to another):
//! local mode's store beside the topics, or cluster mode's `cutovers` rows
//! (any broker serves them). The HTTP endpoints and the console call these.

use std::sync::Arc;

use crate::backend::cluster::front::Front;
use crate::coordinators::cutover::Cutover;
use crate::Broker;

/// The cut-over store.
pub enum Cutovers<'a> {
    Local(&'a Arc<Broker>),
    Cluster(&'a Front),
}

/// Why a cut-over request did not change anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CutoverFailure {
    /// The request is wrong for the topic's state (a conflict), and why.
    Refused(String),
    /// The cluster's database did not answer.
    Unavailable(String),
}

impl Broker {
    /// This broker's cut-over store.
    pub fn cutover_store(self: &Arc<Self>) -> Cutovers<'_> {
        match &self.mode {
            crate::Mode::Cluster(front) => Cutovers::Cluster(front),
            crate::Mode::Local => Cutovers::Local(self),
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> CutoverFailure {
    tracing::warn!(error = %e, "cut-over request: the cluster's database did not answer");
    CutoverFailure::Unavailable(format!("the cluster's database did not answer: {e}"))
}

fn failed(e: crate::backend::cluster::cutover::CutoverError) -> CutoverFailure {
    match e {
        crate::backend::cluster::cutover::CutoverError::Refused(why) => {
            CutoverFailure::Refused(why)
        }
        crate::backend::cluster::cutover::CutoverError::Cluster(e) => unavailable(e),
    }
}

impl Cutovers<'_> {
    /// Every topic's latest cut-over.
    pub async fn all(&self) -> Result<Vec<Cutover>, CutoverFailure> {
        match self {
            Cutovers::Local(b) => Ok(b.cutovers.all()),
            Cutovers::Cluster(front) => crate::backend::cluster::cutover::all(&front.cluster.pool)
                .await
                .map_err(unavailable),
        }
    }

    /// What `oncelog cutover status` shows of `topic`: its cut-over with
    /// the old writer's open transactions a drain waits for.
    pub async fn status(&self, topic: &str) -> Result<serde_json::Value, CutoverFailure> {
        match self {
            Cutovers::Local(b) => Ok(crate::coordinators::cutover::status(b.as_ref(), topic)),
            Cutovers::Cluster(front) => {
                crate::backend::cluster::cutover::status(&front.cluster.pool, topic)
                    .await
                    .map_err(unavailable)
            }
        }
    }

    /// Starts handing `topic` from writer `from` to `to`.
    pub async fn start(
        &self,
        topic: &str,
        from: &str,
        to: &str,
        drain_timeout_ms: i64,
    ) -> Result<Cutover, CutoverFailure> {
        match self {
            Cutovers::Local(b) => {
                crate::coordinators::cutover::start(b.as_ref(), topic, from, to, drain_timeout_ms)
                    .map_err(CutoverFailure::Refused)
            }
            Cutovers::Cluster(front) => crate::backend::cluster::cutover::start(
                &front.cluster.pool,
                topic,
                from,
                to,
                drain_timeout_ms,
            )
            .await
            .map_err(failed),
        }
    }

    /// Rolls a draining cut-over of `topic` back.
    pub async fn rollback(&self, topic: &str) -> Result<Cutover, CutoverFailure> {
        match self {
            Cutovers::Local(b) => crate::coordinators::cutover::rollback(b.as_ref(), topic)
                .map_err(CutoverFailure::Refused),
            Cutovers::Cluster(front) => {
                crate::backend::cluster::cutover::rollback(&front.cluster.pool, topic)
                    .await
                    .map_err(failed)
            }
        }
    }
}
