//! Cut-over: handing a topic from one writer to another (scenario S10).
//!
//! The writer fence (`writer.transactional.id.prefix`) lets one writer
//! commit to a topic. Moving a topic from the blue job's writer to the green
//! job's by editing that config races: blue may still have a transaction in
//! flight, or still be running. A cut-over is the hand-over as a state
//! machine, kept by the backend (`cutovers.json` in a data directory, a
//! `cutovers` row in a cluster) and driven by [`crate::coordinators::cutover`]:
//!
//! 1. **Draining** (`oncelog cutover start TOPIC --from BLUE --to GREEN`): no
//!    transaction of BLUE may add a partition of the topic any more (the
//!    refusal names the cut-over, so a still-running blue job fails loudly);
//!    BLUE's transactions that already hold one may still commit or abort.
//!    GREEN may write, but its commits are held (CONCURRENT_TRANSACTIONS,
//!    which clients retry) while any BLUE transaction holds the topic. At the
//!    drain deadline those are aborted.
//! 2. **Switched**, in one durable step taken while no BLUE transaction holds
//!    the topic: from then on the topic's writer is GREEN. Every BLUE
//!    transactional id is then fenced (epoch bump, its open transaction
//!    aborted) and the topic config is set to GREEN; both are re-done at
//!    start until done (`fenced`).
//! 3. **RolledBack** (`oncelog cutover rollback`, only while draining): BLUE
//!    is the writer again; GREEN's open transactions on the topic can no
//!    longer commit, and are aborted (their producers fenced) so they do not
//!    pin the topic's last stable offset until their timeout.
//!
//! Why no interval has commits of both writers: a commit of a transaction
//! that holds the topic is checked under its transactional id's lock, in
//! the same critical section that persists its PrepareCommit; so is every
//! add of a partition. The switch takes the lock of every BLUE id and
//! persists `Switched` only when none of them holds the topic. So each BLUE
//! commit to the topic was persisted before the switch (it held the topic
//! while the switch waited), and no BLUE transaction can hold the topic
//! after it (adds are refused from the start of the drain, commits after
//! the switch). GREEN commits to the topic are refused while draining and
//! allowed only once `Switched` is durable. Hence every BLUE commit precedes
//! every GREEN commit.

use serde::{Deserialize, Serialize};

pub use crate::error::Gate;
use crate::machines::txn_coordinator::TxnMeta;
use crate::machines::writers::{prefix_of, WRITER_PREFIX_CONFIG};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Draining,
    Switched,
    RolledBack,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cutover {
    pub topic: String,
    pub from: String,
    pub to: String,
    pub phase: Phase,
    pub started_ms: i64,
    /// When the drain stops waiting and aborts BLUE's open transactions.
    pub drain_deadline_ms: i64,
    /// When it switched or rolled back.
    pub ended_ms: i64,
    /// After the switch: every BLUE id fenced and the topic config set.
    /// After a rollback: GREEN's transactions holding the topic aborted.
    pub done: bool,
    /// BLUE transactions the drain deadline aborted.
    pub aborted_at_deadline: Vec<String>,
}

impl Cutover {
    fn refusal(&self, id: &str) -> Gate {
        Gate::Refused(format!(
            "topic {} is being cut over from writer {:?} to {:?} (oncelog cutover, started at {} ms): no new transaction of {:?} may write it; transactional id {id:?} was refused",
            self.topic, self.from, self.to, self.started_ms, self.from
        ))
    }
}

/// May transactional id `id` add a partition of `topic` to its transaction
/// (`holds`: its open transaction already holds one — then it is no new
/// writer)? `config` is the topic's `writer.transactional.id.prefix`.
pub fn check_write(
    c: Option<&Cutover>,
    config: Option<&str>,
    id: &str,
    holds: bool,
) -> Result<(), Gate> {
    let writer = prefix_of(id);
    let allowed = match c {
        Some(c) if c.phase == Phase::Draining => {
            if writer == c.from && !holds {
                return Err(c.refusal(id));
            }
            if writer == c.to || writer == c.from {
                return Ok(());
            }
            Some(c.from.as_str())
        }
        // Until the topic config is set (`done`), the switch decides; after
        // it, the config does (an operator may change it again).
        Some(c) if c.phase == Phase::Switched && !c.done => Some(c.to.as_str()),
        // Until the new writer's transactions holding the topic are aborted
        // (`done`), the rolled-back writer may not write or commit, even on
        // a topic with no writer config (a held commit it retries).
        Some(c) if c.phase == Phase::RolledBack && !c.done => Some(c.from.as_str()),
        _ => config,
    };
    match allowed {
        Some(p) if !p.is_empty() && writer != p => Err(Gate::Refused(format!(
            "topic allows transactional writes only from writer {p:?} ({WRITER_PREFIX_CONFIG}); {id:?} is writer {writer:?}"
        ))),
        _ => Ok(()),
    }
}

/// Must `id`'s open transaction holding the topic be kept from an abort by
/// a new InitProducerId? While draining, the old writer's transactions that
/// hold the topic end only by EndTxn from their own identity (a restored
/// job's committer) or at the drain deadline: a restarting old job probing
/// its transactional ids must not abort the very transaction a savepoint
/// holds for the new job to commit.
pub fn protects(c: Option<&Cutover>, id: &str) -> bool {
    c.is_some_and(|c| c.phase == Phase::Draining && prefix_of(id) == c.from)
}

/// May `id` commit a transaction that holds a partition of the topic?
pub fn check_commit(c: Option<&Cutover>, config: Option<&str>, id: &str) -> Result<(), Gate> {
    if let Some(c) = c.filter(|c| c.phase == Phase::Draining) {
        let writer = prefix_of(id);
        if writer == c.to {
            return Err(Gate::Held(format!(
                "topic {} is being cut over from {:?} to {:?}: commits of {:?} wait until the transactions of {:?} have ended",
                c.topic, c.from, c.to, c.to, c.from
            )));
        }
    }
    check_write(c, config, id, true)
}

/// A request to start a cut-over, checked against the topic's state.
pub fn plan_start(
    existing: Option<&Cutover>,
    topic: &str,
    config: Option<&str>,
    from: &str,
    to: &str,
    now: i64,
    drain_timeout_ms: i64,
) -> Result<Cutover, String> {
    if from == to {
        return Err("--from and --to name the same writer".into());
    }
    for p in [from, to] {
        if p.is_empty() {
            return Err("a writer prefix must not be empty".into());
        }
        crate::machines::writers::check_prefix(p)?;
    }
    if let Some(c) = existing.filter(|c| c.phase == Phase::Draining) {
        return Err(format!(
            "topic {topic} is already being cut over from {:?} to {:?}; roll it back first",
            c.from, c.to
        ));
    }
    if let Some(c) = existing.filter(|c| c.phase != Phase::Draining && !c.done) {
        return Err(format!(
            "topic {topic}'s cut-over from {:?} to {:?} is still finishing ({:?}: fencing and the topic config); try again in a moment",
            c.from, c.to, c.phase
        ));
    }
    if let Some(p) = config.filter(|p| !p.is_empty()) {
        if p != from {
            return Err(format!(
                "topic {topic}'s writer is {p:?} ({WRITER_PREFIX_CONFIG}), not {from:?}"
            ));
        }
    }
    if drain_timeout_ms <= 0 {
        return Err("the drain timeout must be positive".into());
    }
    Ok(Cutover {
        topic: topic.to_string(),
        from: from.to_string(),
        to: to.to_string(),
        phase: Phase::Draining,
        started_ms: now,
        drain_deadline_ms: now.saturating_add(drain_timeout_ms),
        ended_ms: -1,
        done: false,
        aborted_at_deadline: Vec::new(),
    })
}

/// A rollback of the topic's cut-over at `now`: only while draining.
pub fn plan_rollback(cur: Option<&Cutover>, topic: &str, now: i64) -> Result<Cutover, String> {
    match cur {
        Some(c) if c.phase == Phase::Draining => {
            let mut n = c.clone();
            n.phase = Phase::RolledBack;
            n.ended_ms = now;
            Ok(n)
        }
        Some(c) if c.phase == Phase::Switched => Err(format!(
            "topic {topic} was already switched to {:?} at {} ms; start a cut-over back instead",
            c.to, c.ended_ms
        )),
        _ => Err(format!("topic {topic} has no cut-over in progress")),
    }
}

/// `oncelog cutover rollback`: only while draining.
pub fn status_json(topic: &str, c: Option<&Cutover>, waiting: &[TxnMeta]) -> serde_json::Value {
    let Some(c) = c else {
        return serde_json::json!({ "topic": topic, "phase": "None" });
    };
    let waiting: Vec<serde_json::Value> = waiting
        .iter()
        .map(|m| serde_json::json!({"transactional_id": m.transactional_id, "producer_id": m.producer_id, "producer_epoch": m.epoch, "state": m.state.name()}))
        .collect();
    let mut v = serde_json::to_value(c).unwrap_or_default();
    v["waiting_for"] = serde_json::Value::Array(waiting);
    v
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `orders` draining from `orders-sink` to `orders-green`.
    pub(crate) fn draining() -> Cutover {
        plan_start(
            None,
            "orders",
            Some("orders-sink"),
            "orders-sink",
            "orders-green",
            1000,
            60_000,
        )
        .unwrap()
    }

    #[test]
    fn start_is_checked() {
        let c = draining();
        assert_eq!((c.phase, c.drain_deadline_ms), (Phase::Draining, 61_000));
        assert!(plan_start(None, "t", None, "a", "a", 0, 1).is_err());
        assert!(plan_start(None, "t", Some("other"), "a", "b", 0, 1)
            .unwrap_err()
            .contains("not \"a\""));
        assert!(plan_start(
            Some(&c),
            "orders",
            Some("orders-sink"),
            "orders-sink",
            "orders-green",
            0,
            1
        )
        .unwrap_err()
        .contains("already being cut over"));
        assert!(plan_start(None, "t", None, "a", "b-2", 0, 1)
            .unwrap_err()
            .contains("ambiguous"));
        assert!(plan_start(None, "t", None, "a", "b", 0, 0).is_err());
        // Unset writer config: any writer may be handed over from.
        assert!(plan_start(None, "t", None, "a", "b", 0, 1).is_ok());
        let mut rolled = c.clone();
        rolled.phase = Phase::RolledBack;
        rolled.done = true;
        assert!(plan_start(
            Some(&rolled),
            "orders",
            Some("orders-sink"),
            "orders-sink",
            "orders-green",
            0,
            1
        )
        .is_ok());
    }

    #[test]
    fn writes_while_draining() {
        let c = draining();
        let cfg = Some("orders-sink");
        // Blue: only a transaction that already holds the topic.
        let refused = check_write(Some(&c), cfg, "orders-sink-0-7", false).unwrap_err();
        assert!(
            matches!(&refused, Gate::Refused(m) if m.contains("being cut over")),
            "{refused}"
        );
        assert!(check_write(Some(&c), cfg, "orders-sink-0-7", true).is_ok());
        // Green writes; its commits are held.
        assert!(check_write(Some(&c), cfg, "orders-green-1-3", false).is_ok());
        assert!(matches!(
            check_commit(Some(&c), cfg, "orders-green-1-3"),
            Err(Gate::Held(_))
        ));
        assert!(check_commit(Some(&c), cfg, "orders-sink-0-7").is_ok());
        // Anybody else is refused as before.
        assert!(matches!(
            check_write(Some(&c), cfg, "intruder-0-1", false),
            Err(Gate::Refused(_))
        ));
        assert!(matches!(
            check_commit(Some(&c), cfg, "intruder-0-1"),
            Err(Gate::Refused(_))
        ));
    }

    #[test]
    fn draining_protects_the_old_writers_open_transactions() {
        let mut c = draining();
        assert!(protects(Some(&c), "orders-sink-0-5"));
        assert!(!protects(Some(&c), "orders-green-0-5"));
        assert!(!protects(None, "orders-sink-0-5"));
        c.phase = Phase::Switched;
        assert!(!protects(Some(&c), "orders-sink-0-5"));
    }

    #[test]
    fn after_the_switch_green_is_the_writer_until_the_config_says_so() {
        let mut c = draining();
        c.phase = Phase::Switched;
        let cfg = Some("orders-sink");
        assert!(check_write(Some(&c), cfg, "orders-green-1-3", false).is_ok());
        assert!(check_commit(Some(&c), cfg, "orders-green-1-3").is_ok());
        assert!(check_write(Some(&c), cfg, "orders-sink-0-7", true).is_err());
        assert!(check_commit(Some(&c), cfg, "orders-sink-0-7").is_err());
        // Done: the topic config (set to green by the switch, or changed by
        // an operator since) decides again.
        c.done = true;
        assert!(check_write(Some(&c), Some("orders-green"), "orders-green-1-3", false).is_ok());
        assert!(check_write(Some(&c), Some("purple"), "purple-0", false).is_ok());
        assert!(check_write(Some(&c), Some("purple"), "orders-green-1-3", false).is_err());
    }

    #[test]
    fn a_new_cutover_waits_until_the_last_one_is_done() {
        let mut c = draining();
        c.phase = Phase::Switched;
        let err = plan_start(
            Some(&c),
            "orders",
            Some("orders-sink"),
            "orders-sink",
            "x",
            0,
            1,
        )
        .unwrap_err();
        assert!(err.contains("still finishing"), "{err}");
        c.done = true;
        assert!(plan_start(
            Some(&c),
            "orders",
            Some("orders-green"),
            "orders-green",
            "x",
            0,
            1
        )
        .is_ok());
        c.phase = Phase::RolledBack;
        c.done = false;
        assert!(plan_start(
            Some(&c),
            "orders",
            Some("orders-sink"),
            "orders-sink",
            "x",
            0,
            1
        )
        .is_err());
    }

    #[test]
    fn after_a_rollback_blue_is_the_writer_again() {
        let mut c = draining();
        c.phase = Phase::RolledBack;
        let cfg = Some("orders-sink");
        assert!(check_write(Some(&c), cfg, "orders-sink-0-7", false).is_ok());
        assert!(check_commit(Some(&c), cfg, "orders-green-1-3").is_err());
        assert!(check_write(None, None, "anyone", false).is_ok());
        // No writer config: green is still refused until the rollback is done.
        assert!(check_commit(Some(&c), None, "orders-green-1-3").is_err());
        c.done = true;
        assert!(check_commit(Some(&c), None, "orders-green-1-3").is_ok());
    }
}
