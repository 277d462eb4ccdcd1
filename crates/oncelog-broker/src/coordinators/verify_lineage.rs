//! Pipeline lineage, live ([`oncelog_verify::lineage`]): for
//! consume-transform-produce jobs that commit their input offsets in their
//! transactions (Kafka Streams, transactional copiers, franz-go's
//! GroupTransactSession). Written once over the group store, the
//! transaction store and [`crate::backend::lineage::LineageStore`].
//!
//! * A TxnOffsetCommit of group G (transactional id T) moving G's offset on
//!   an input partition from its committed P to N is an **offer** of the
//!   range `[P, N)`, with the topics T's transaction wrote so far as its
//!   outputs. A group with no committed offset there starts its lineage at
//!   N (where it began reading is not known).
//! * The offer is **settled** once G's committed offset there is N (its
//!   transaction committed): at G's next offer, or by the verification's
//!   round, which asks the group store. An offer whose transaction aborted
//!   is replaced by the next one, or dropped after [`OFFER_TTL_MS`].
//! * A job of several stages (Kafka Streams through a repartition topic)
//!   reaches its output through topics it consumes itself, so a range's
//!   outputs include the group's **sinks**: the topics its transactions
//!   wrote that it does not consume (as far as this broker, G's
//!   coordinator, has seen).
//! * A settled range is judged against the ranges already committed on its
//!   input partition: `double_processing` (another group, same output
//!   topic) or `recommitted_range` (the same group, no reset in between),
//!   each reported once at `error!` naming both groups, both writers, the
//!   ranges and the output topics; then it is recorded.
//! * A non-transactional OffsetCommit, an OffsetDelete or a DeleteGroups is
//!   an operator's reset: the group's ranges there are forgotten. (Flink
//!   commits its source offsets that way, so it has no lineage; its output
//!   is checked by business key instead.)
//!
//! Ranges are kept for [`KEEP_MS`].

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use oncelog_log::now_ms;
use oncelog_verify::lineage::{judge, Consumed, Overlap};
use oncelog_verify::scan::{Finding, Kind};

use crate::coordinators::groups::FetchedOffset;
use crate::machines::group::OffsetMeta;
use crate::Broker;

/// An offer not settled by then is dropped (its transaction aborted).
pub const OFFER_TTL_MS: i64 = 300_000;

/// Committed ranges are kept this long.
pub const KEEP_MS: i64 = 86_400_000;

/// How far the history's clock may trail this broker's (a cluster's
/// history is stamped by the broker that ended the transaction).
const CLOCK_SKEW_MS: i64 = 1_000;

/// Offers wait this long before a round asks whether they committed.
const SETTLE_AFTER_MS: i64 = 500;

#[derive(Debug, Clone)]
struct Offer {
    writer: String,
    from: i64,
    to: i64,
    start_known: bool,
    outputs: BTreeSet<String>,
    at_ms: i64,
}

type Key = (String, String, i32);

/// Offers not settled yet, by (group, input topic, partition), and what
/// each group was seen to consume and write.
#[derive(Default)]
pub struct Pending {
    offers: std::sync::Mutex<HashMap<Key, Offer>>,
    groups: std::sync::Mutex<HashMap<String, Topics>>,
}

/// Groups whose topics are remembered (the least recently seen go first).
const MAX_GROUPS: usize = 10_000;

#[derive(Debug, Default, Clone)]
struct Topics {
    consumed: BTreeSet<String>,
    written: BTreeSet<String>,
    seen_ms: i64,
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Offer>> {
        self.offers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note(&self, group: &str, consumed: &BTreeSet<String>, written: &BTreeSet<String>, now: i64) {
        let mut g = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        if !g.contains_key(group) && g.len() >= MAX_GROUPS {
            if let Some(oldest) = g
                .iter()
                .min_by_key(|(_, t)| t.seen_ms)
                .map(|(k, _)| k.clone())
            {
                g.remove(&oldest);
            }
        }
        let t = g.entry(group.to_string()).or_default();
        t.consumed.extend(consumed.iter().cloned());
        t.written.extend(written.iter().cloned());
        t.seen_ms = now;
    }

    /// Other groups' offers on `topic`'s `partition` overlapping
    /// `[from, to)` (their transactions may commit any moment).
    fn offered_by_others(
        &self,
        group: &str,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
    ) -> Vec<Consumed> {
        let offers: Vec<(String, Offer)> = self
            .lock()
            .iter()
            .filter(|((g, t, p), o)| {
                g != group && t == topic && *p == partition && o.from < to && from < o.to
            })
            .map(|((g, _, _), o)| (g.clone(), o.clone()))
            .collect();
        offers
            .into_iter()
            .map(|(g, o)| Consumed {
                outputs: self.effective(&g, &o.outputs),
                group: g,
                writer: o.writer,
                from: o.from,
                to: o.to,
                start_known: o.start_known,
                at_ms: o.at_ms,
            })
            .collect()
    }

    /// `outputs` and, when one of them is a topic `group` consumes itself
    /// (a stage of the same job), the group's sinks.
    fn effective(&self, group: &str, outputs: &BTreeSet<String>) -> BTreeSet<String> {
        let g = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        let mut eff = outputs.clone();
        if let Some(t) = g.get(group) {
            if outputs.iter().any(|o| t.consumed.contains(o)) {
                eff.extend(t.written.difference(&t.consumed).cloned());
            }
        }
        eff
    }

    /// Forgets `group`'s offers (on `partitions`, or all).
    fn reset(&self, group: &str, partitions: Option<&[(String, i32)]>) {
        self.lock().retain(|(g, t, p), _| {
            g != group || partitions.is_some_and(|ps| !ps.iter().any(|(pt, pp)| pt == t && pp == p))
        });
    }
}

/// G's TxnOffsetCommit was accepted: `committed` are G's committed offsets
/// of those partitions before it.
pub async fn offered(
    b: &Arc<Broker>,
    group: &str,
    transactional_id: &str,
    outputs: BTreeSet<String>,
    committed: &[FetchedOffset],
    offsets: &[(String, i32, OffsetMeta)],
) {
    let now = now_ms();
    let consumed: BTreeSet<String> = offsets.iter().map(|(t, _, _)| t.clone()).collect();
    b.lineage_pending.note(group, &consumed, &outputs, now);
    let mut confirmed = Vec::new();
    {
        let mut g = b.lineage_pending.lock();
        for (topic, partition, meta) in offsets {
            let before = committed
                .iter()
                .find(|f| &f.topic == topic && f.partition == *partition)
                .map_or(-1, |f| f.offset);
            let key = (group.to_string(), topic.clone(), *partition);
            if let Some(old) = g.remove(&key) {
                if before == old.to {
                    confirmed.push((key.clone(), old));
                }
            }
            g.insert(
                key,
                Offer {
                    writer: transactional_id.to_string(),
                    from: before.max(0),
                    to: meta.offset,
                    start_known: before >= 0,
                    outputs: outputs.clone(),
                    at_ms: now,
                },
            );
        }
    }
    for (key, offer) in confirmed {
        settle(b, key, offer).await;
    }
}

/// The topics `transactional_id`'s open transaction wrote so far (its
/// partitions but the offsets topic's).
pub async fn outputs_of(b: &Arc<Broker>, transactional_id: &str) -> BTreeSet<String> {
    match b.txns().describe(&[transactional_id.to_string()]).await {
        Ok(metas) => metas
            .into_iter()
            .flatten()
            .next()
            .map(|m| crate::backend::lineage::outputs(&m.partitions))
            .unwrap_or_default(),
        Err(_) => BTreeSet::new(),
    }
}

/// The lineage fence: with `verify.lineage.enforce=true` on a topic
/// another group's committed transactions wrote, G's TxnOffsetCommit is
/// refused (why, `Some`) when it would commit part of that group's input
/// and G's transaction writes that topic. A group with no committed offset
/// is taken to have consumed its input from the start, so a second job is
/// refused from its first transaction into the topic; the same group
/// (redeployed, scaled out) never is. A client may add its output
/// partitions after its offsets: when the transaction names none yet, the
/// fence waits up to [`OUTPUTS_WAIT_MS`] for them, then takes it as
/// writing the protected topic.
pub async fn gate(
    b: &Arc<Broker>,
    group: &str,
    transactional_id: &str,
    outputs: &BTreeSet<String>,
    committed: &[FetchedOffset],
    offsets: &[(String, i32, OffsetMeta)],
) -> Option<String> {
    let store = b.lineage_store();
    let mut enforced_cache: HashMap<String, bool> = HashMap::new();
    // (input topic, partition, the range G would commit, the other
    // group's range, its protected topics)
    let mut conflicts = Vec::new();
    for (topic, partition, meta) in offsets {
        let before = committed
            .iter()
            .find(|f| &f.topic == topic && f.partition == *partition)
            .map_or(-1, |f| f.offset);
        let (from, to) = (before.max(0), meta.offset);
        let mut others = store.overlapping(topic, *partition, from, to).await;
        others.extend(
            b.lineage_pending
                .offered_by_others(group, topic, *partition, from, to),
        );
        for e in others {
            if e.group == group {
                continue;
            }
            let mut protected = Vec::new();
            for t in &e.outputs {
                if enforced(b, &mut enforced_cache, t).await {
                    protected.push(t.clone());
                }
            }
            if !protected.is_empty() {
                conflicts.push((topic.clone(), *partition, from, to, e, protected));
            }
        }
    }
    if conflicts.is_empty() {
        return None;
    }
    let mut mine = b.lineage_pending.effective(group, outputs);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(OUTPUTS_WAIT_MS);
    while mine.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        mine = b
            .lineage_pending
            .effective(group, &outputs_of(b, transactional_id).await);
    }
    for (topic, partition, from, to, e, protected) in conflicts {
        let shared: Vec<String> = protected
            .into_iter()
            .filter(|t| mine.is_empty() || mine.contains(t))
            .collect();
        if shared.is_empty() {
            continue;
        }
        let why = format!(
            "lineage fence (verify.lineage.enforce on {}): group {group} (writer {transactional_id}) would commit [{from}, {to}) of {topic}-{partition}, of which group {} (writer {}) committed [{}, {}) into that topic",
            shared.join(", "), e.group, e.writer, e.from, e.to
        );
        let f = Finding {
            kind: Kind::DoubleProcessing,
            first_offset: from.max(e.from),
            last_offset: to.min(e.to) - 1,
            producer_id: -1,
            epoch: -1,
            detail: format!("{why}; refused"),
        };
        b.verify.report(&topic, partition, &f, now_ms());
        return Some(why);
    }
    None
}

/// How long the lineage fence waits for a transaction's output partitions.
pub const OUTPUTS_WAIT_MS: u64 = 1_000;

async fn enforced(b: &Arc<Broker>, cache: &mut HashMap<String, bool>, topic: &str) -> bool {
    if let Some(v) = cache.get(topic) {
        return *v;
    }
    let v = matches!(b.catalogue().topic(topic).await, Ok(Some(meta))
        if meta.configs.get("verify.lineage.enforce").map(String::as_str) == Some("true"));
    cache.insert(topic.to_string(), v);
    v
}

/// An operator's reset of `group`'s offsets (on `partitions`, or all).
pub async fn reset(b: &Arc<Broker>, group: &str, partitions: Option<&[(String, i32)]>) {
    b.lineage_pending.reset(group, partitions);
    b.lineage_store().reset(group, partitions).await;
}

/// One round of the verification: settles the offers whose transactions
/// committed, drops stale ones, forgets old ranges.
pub async fn round(b: &Arc<Broker>, expire: bool) {
    let now = now_ms();
    let due: Vec<(Key, Offer)> = {
        let mut g = b.lineage_pending.lock();
        g.retain(|_, o| now - o.at_ms < OFFER_TTL_MS);
        g.iter()
            .filter(|(_, o)| now - o.at_ms >= SETTLE_AFTER_MS)
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect()
    };
    let mut by_group: HashMap<String, Vec<(Key, Offer)>> = HashMap::new();
    for (k, o) in due {
        by_group.entry(k.0.clone()).or_default().push((k, o));
    }
    let groups = b.group_store();
    for (group, offers) in by_group {
        let mut topics: HashMap<String, Vec<i32>> = HashMap::new();
        for ((_, t, p), _) in &offers {
            topics.entry(t.clone()).or_default().push(*p);
        }
        let Ok(committed) = groups
            .fetch_offsets(&group, Some(topics.into_iter().collect()), false)
            .await
        else {
            continue;
        };
        for (key, offer) in offers {
            let now_committed = committed
                .iter()
                .find(|f| f.topic == key.1 && f.partition == key.2)
                .map_or(-1, |f| f.offset);
            if now_committed != offer.to {
                continue;
            }
            // still the same offer (not replaced meanwhile)?
            let taken = {
                let mut g = b.lineage_pending.lock();
                match g.get(&key) {
                    Some(o) if o.at_ms == offer.at_ms && o.to == offer.to => g.remove(&key),
                    _ => None,
                }
            };
            if let Some(offer) = taken {
                settle(b, key, offer).await;
            }
        }
    }
    if expire {
        b.lineage_store().expire(now - KEEP_MS).await;
    }
    b.lineage_store().persist();
}

/// The topics `writer`'s transaction committed at or after `since_ms`
/// wrote, as the coordinator's history of its commit records them (a
/// client may add its output partitions after its offsets).
async fn committed_outputs(b: &Arc<Broker>, writer: &str, since_ms: i64) -> BTreeSet<String> {
    b.txns()
        .with_histories(since_ms, |h| {
            h.get(writer)
                .and_then(|ih| {
                    ih.events.iter().find(|e| {
                        e.event == crate::observe::txn_history::EventKind::Commit
                            && e.time_ms >= since_ms
                    })
                })
                .map(|e| {
                    e.partitions
                        .iter()
                        .filter_map(|tp| tp.rsplit_once('-').map(|(t, _)| t.to_string()))
                        .filter(|t| t != crate::coordinators::groups::OFFSETS_TOPIC)
                        .collect()
                })
                .unwrap_or_default()
        })
        .await
        .unwrap_or_default()
}

/// A committed range, judged and recorded.
async fn settle(b: &Arc<Broker>, (group, topic, partition): Key, offer: Offer) {
    if offer.from >= offer.to {
        return;
    }
    let outputs = if offer.outputs.is_empty() {
        let found = committed_outputs(b, &offer.writer, offer.at_ms - CLOCK_SKEW_MS).await;
        b.lineage_pending
            .note(&group, &BTreeSet::new(), &found, now_ms());
        found
    } else {
        offer.outputs
    };
    let outputs = b.lineage_pending.effective(&group, &outputs);
    let c = Consumed {
        group,
        writer: offer.writer,
        from: offer.from,
        to: offer.to,
        start_known: offer.start_known,
        outputs,
        at_ms: now_ms(),
    };
    let store = b.lineage_store();
    let before = store.overlapping(&topic, partition, c.from, c.to).await;
    let now = now_ms();
    for o in judge(&c, &before, false) {
        let (kind, e, detail) = match &o {
            Overlap::DoubleProcessing(e, shared) => (
                Kind::DoubleProcessing,
                *e,
                format!(
                    "double processing of {topic}-{partition}: group {} (writer {}) committed [{}, {}) into {}; group {} (writer {}) had committed [{}, {}) of it into the same topic{} {}",
                    c.group, c.writer, c.from, c.to, join(&c.outputs),
                    e.group, e.writer, e.from, e.to,
                    if shared.len() > 1 { "s" } else { "" }, shared.join(", ")
                ),
            ),
            Overlap::Recommitted(e) => (
                Kind::RecommittedRange,
                *e,
                format!(
                    "group {} committed [{}, {}) of {topic}-{partition} again (writer {}); it had committed [{}, {}) (writer {}) with no offset reset since",
                    c.group, c.from, c.to, c.writer, e.from, e.to, e.writer
                ),
            ),
        };
        let f = Finding {
            kind,
            first_offset: c.from.max(e.from),
            last_offset: c.to.min(e.to) - 1,
            producer_id: -1,
            epoch: -1,
            detail,
        };
        b.verify.report(&topic, partition, &f, now);
    }
    store.add(&topic, partition, c).await;
}

fn join(s: &BTreeSet<String>) -> String {
    if s.is_empty() {
        return "(no output known)".to_string();
    }
    s.iter().cloned().collect::<Vec<_>>().join(", ")
}
