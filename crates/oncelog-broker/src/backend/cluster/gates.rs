//! The writer fences and cut-overs a coordinator decision in cluster mode
//! checks ([`super::txn::run`] reads them in the decision's PostgreSQL
//! transaction), and what a decision refused is answered with.

use std::collections::HashMap;

use super::ClusterError;
use crate::machines::cutover::{check_commit, check_write, protects, Cutover, Gate};
use crate::machines::txn_coordinator::{CoordError, Effect, TxnMeta, TxnState};
use crate::machines::writers::WRITER_PREFIX_CONFIG;

/// Why a decision wrote nothing: the coordinator's refusal, or the writer
/// fence's or a cut-over's ([`Gate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Coord(#[from] CoordError),
    #[error(transparent)]
    Gate(#[from] Gate),
    /// Not the topic's writer at all (S6; local mode's pre-check).
    #[error("{0}")]
    SecondWriter(String),
}

/// A topic's writer fence as a decision sees it.
#[derive(Debug, Default, Clone)]
struct TopicGate {
    writer: Option<String>,
    cutover: Option<Cutover>,
}

/// The writer fences and cut-overs of the topics one decision touches, read
/// in its PostgreSQL transaction (the cut-over rows held `FOR SHARE`).
#[derive(Debug, Default, Clone)]
pub struct Gates {
    topics: HashMap<String, TopicGate>,
}

impl Gates {
    /// Reads the gates of `topics` (the offsets topic has none).
    pub async fn load(
        tx: &tokio_postgres::Transaction<'_>,
        topics: &[String],
    ) -> Result<Self, ClusterError> {
        let mut names: Vec<&str> = topics
            .iter()
            .map(String::as_str)
            .filter(|t| *t != crate::coordinators::groups::OFFSETS_TOPIC)
            .collect();
        names.sort_unstable();
        names.dedup();
        let mut out = Self::default();
        if names.is_empty() {
            return Ok(out);
        }
        let parse = |v: serde_json::Value| -> Result<Cutover, ClusterError> {
            serde_json::from_value(v)
                .map_err(|e| ClusterError::Invariant(format!("a cutovers row: {e}")))
        };
        let mut unfinished: Vec<uuid::Uuid> = Vec::new();
        for r in tx
            .query(
                "SELECT t.name, t.configs->>$2, c.topic_id, c.cutover FROM topics t \
                 LEFT JOIN cutovers c ON c.topic_id = t.id WHERE t.name = ANY($1)",
                &[&names, &WRITER_PREFIX_CONFIG],
            )
            .await?
        {
            let cutover = r
                .get::<_, Option<serde_json::Value>>(3)
                .map(parse)
                .transpose()?;
            if cutover.as_ref().is_some_and(|c| !c.done) {
                unfinished.push(r.get(2));
            }
            out.topics.insert(
                r.get(0),
                TopicGate {
                    writer: r.get(1),
                    cutover,
                },
            );
        }
        if unfinished.is_empty() {
            // No cut-over in progress: a finished one changes only by a new
            // start, and a start committed after this read makes this
            // decision one that came before it (the switch still waits for every
            // old-writer transaction it can see holding the topic, and
            // refuses their commits after it).
            return Ok(out);
        }
        unfinished.sort();
        // The lock first, the configs after it: a switch that committed
        // while this waited for the row is then seen whole.
        for r in tx
            .query(
                "SELECT t.name, c.cutover FROM cutovers c JOIN topics t ON t.id = c.topic_id \
                 WHERE c.topic_id = ANY($1) ORDER BY c.topic_id FOR SHARE OF c",
                &[&unfinished],
            )
            .await?
        {
            out.topics.entry(r.get(0)).or_default().cutover = Some(parse(r.get(1))?);
        }
        for r in tx
            .query(
                "SELECT name, configs->>$2 FROM topics WHERE id = ANY($1)",
                &[&unfinished, &WRITER_PREFIX_CONFIG],
            )
            .await?
        {
            out.topics.entry(r.get(0)).or_default().writer = r.get(1);
        }
        Ok(out)
    }

    fn of(&self, topic: &str) -> (Option<&Cutover>, Option<&str>) {
        self.topics
            .get(topic)
            .map_or((None, None), |g| (g.cutover.as_ref(), g.writer.as_deref()))
    }

    /// May `id` add partitions of these topics to `m`'s transaction? A
    /// writer the topic refuses even in a transaction that holds it is a
    /// second writer (S6); one refused only as new is the cut-over's.
    pub fn check_adds<'t>(
        &self,
        m: Option<&TxnMeta>,
        id: &str,
        topics: impl IntoIterator<Item = &'t str>,
    ) -> Result<(), Refusal> {
        let open = m.filter(|m| m.state == TxnState::Ongoing);
        for t in topics {
            if t == crate::coordinators::groups::OFFSETS_TOPIC {
                continue;
            }
            let holds = open.is_some_and(|m| m.partitions.iter().any(|(h, _)| h == t));
            let (c, w) = self.of(t);
            if let Err(g) = check_write(c, w, id, true) {
                return Err(Refusal::SecondWriter(g.to_string()));
            }
            check_write(c, w, id, holds)?;
        }
        Ok(())
    }

    /// May `id` commit what `effects` commit (the topics of the
    /// transaction they move to PrepareCommit)?
    pub fn check_commit(&self, id: &str, effects: &[Effect]) -> Result<(), Gate> {
        let Some((p, _)) = crate::machines::txn_coordinator::transition(effects) else {
            return Ok(());
        };
        if p.state != TxnState::PrepareCommit {
            return Ok(());
        }
        for (t, _) in &p.partitions {
            if t == crate::coordinators::groups::OFFSETS_TOPIC {
                continue;
            }
            let (c, w) = self.of(t);
            check_commit(c, w, id)?;
        }
        Ok(())
    }

    /// The topic being cut over that `m`'s open transaction holds as the
    /// old writer's: such a transaction ends only by its own EndTxn or at
    /// the drain deadline, never by a new producer or its timeout.
    pub fn protected<'m>(&self, m: &'m TxnMeta) -> Option<&'m str> {
        if m.state != TxnState::Ongoing {
            return None;
        }
        m.partitions
            .iter()
            .map(|(t, _)| t.as_str())
            .find(|t| protects(self.of(t).0, &m.transactional_id))
    }
}
