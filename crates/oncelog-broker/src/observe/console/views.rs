//! The console's JSON views, each built from the broker's live state on
//! request: nothing here is kept or written. Lists are paged on the server
//! (a page is at most [`MAX_PER_PAGE`] rows), so a broker with 10,000
//! partitions or thousands of transactional ids sends the browser one
//! screenful.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;
use serde_json::{json, Value};

use crate::backend::{self, Scope};
use crate::machines::txn_coordinator::{TxnMeta, TxnState};
use crate::machines::writers::{prefix_of, WRITER_PREFIX_CONFIG};
use crate::observe::txn_history::{Epoch, EventKind};
use crate::Broker;
use oncelog_log::now_ms;

pub const MAX_PER_PAGE: usize = 200;
const DEFAULT_PER_PAGE: usize = 50;

/// Which page of a list the browser asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paging {
    pub page: usize,
    pub per_page: usize,
}

impl Paging {
    /// `page` counts from 1; out-of-range values are clamped.
    pub fn new(page: &str, per_page: &str) -> Self {
        let page = page.parse::<usize>().unwrap_or(1).max(1);
        let per_page = per_page
            .parse::<usize>()
            .unwrap_or(DEFAULT_PER_PAGE)
            .clamp(1, MAX_PER_PAGE);
        Self { page, per_page }
    }

    /// The page's rows of `rows` and the page header. A page past the end
    /// is the last page.
    pub fn slice<T: Serialize>(&self, rows: Vec<T>) -> Value {
        let total = rows.len();
        let pages = total.div_ceil(self.per_page).max(1);
        let page = self.page.min(pages);
        let from = (page - 1) * self.per_page;
        let rows: Vec<T> = rows.into_iter().skip(from).take(self.per_page).collect();
        json!({ "page": page, "pages": pages, "per_page": self.per_page, "total": total, "rows": rows })
    }
}

/// One partition's offsets.
#[derive(Debug, Clone, Serialize)]
struct PartitionRow {
    partition: i32,
    high_watermark: i64,
    last_stable_offset: i64,
    lso_gap: i64,
    log_start_offset: i64,
    /// Bytes of its log segments (none in cluster mode: objects are shared).
    size_bytes: Option<u64>,
    /// Open transactions here (first offset, producer id, epoch, id).
    open: Vec<OpenTxn>,
}

#[derive(Debug, Clone, Serialize)]
struct OpenTxn {
    first_offset: i64,
    producer_id: i64,
    producer_epoch: i16,
    transactional_id: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
struct TopicRow {
    topic: String,
    partitions: usize,
    high_watermark: i64,
    lso_gap: i64,
    max_lso_gap: i64,
    pinned_partitions: usize,
    size_bytes: Option<u64>,
    writer_prefix: Option<String>,
    writers: Vec<WriterSeen>,
    cutover: Option<Value>,
    compacted: bool,
}

#[derive(Debug, Clone, Serialize)]
struct WriterSeen {
    prefix: String,
    last_commit_ms: i64,
}

fn cutover_json(c: &crate::machines::cutover::Cutover) -> Value {
    json!({
        "from": c.from, "to": c.to, "phase": format!("{:?}", c.phase), "done": c.done,
        "started_ms": c.started_ms, "drain_deadline_ms": c.drain_deadline_ms, "ended_ms": c.ended_ms,
        "aborted_at_deadline": c.aborted_at_deadline,
    })
}

/// Every partition with its offsets, by topic (all of the cluster's in
/// cluster mode, whichever broker serves the page).
async fn partitions_by_topic(b: &Arc<Broker>) -> BTreeMap<String, Vec<backend::PartitionRow>> {
    let mut out: BTreeMap<String, Vec<backend::PartitionRow>> = BTreeMap::new();
    for r in b.logs().statuses(Scope::All).await {
        out.entry(r.topic.clone()).or_default().push(r);
    }
    for rows in out.values_mut() {
        rows.sort_by_key(|r| r.partition);
    }
    out
}

/// Every topic's cut-over as the console shows it (none when the store
/// cannot be read: logged there).
async fn cutovers(b: &Arc<Broker>) -> BTreeMap<String, Value> {
    b.cutover_store()
        .all()
        .await
        .unwrap_or_default()
        .iter()
        .map(|c| (c.topic.clone(), cutover_json(c)))
        .collect()
}

/// The transactions open at a partition: (first offset, producer id,
/// epoch), lowest first offset first.
async fn open_at(b: &Arc<Broker>, topic: &str, partition: i32) -> Vec<(i64, i64, i16)> {
    let mut open: Vec<(i64, i64, i16)> = b
        .logs()
        .producers(topic, partition)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(pid, e)| e.current_txn_first_offset.map(|f| (f, pid, e.epoch)))
        .collect();
    open.sort();
    open
}

/// Each producer id's transactional id, from the coordinator's state.
fn ids_by_producer(metas: &BTreeMap<String, TxnMeta>) -> HashMap<i64, String> {
    metas
        .values()
        .map(|m| (m.producer_id, m.transactional_id.clone()))
        .collect()
}

/// `GET /v1/console/overview?page=&per_page=&q=&sort=name|gap|size`: the
/// broker's health and rates, and its topics (paged, filtered by a
/// substring of the name): in cluster mode every topic of the cluster.
pub async fn overview(b: &Arc<Broker>, paging: Paging, q: &str, sort: &str) -> Value {
    let now = now_ms();
    let catalogue = b.catalogue();
    let live = catalogue.live_writers(now).await;
    let cutovers = cutovers(b).await;
    let mut offsets = partitions_by_topic(b).await;
    let mut rows = Vec::new();
    let (mut partitions, mut pinned, mut gap_total) = (0usize, 0usize, 0i64);
    for meta in catalogue.topics().await {
        let parts = offsets.remove(&meta.name).unwrap_or_default();
        let mut row = TopicRow {
            topic: meta.name.clone(),
            partitions: parts.len(),
            high_watermark: 0,
            lso_gap: 0,
            max_lso_gap: 0,
            pinned_partitions: 0,
            size_bytes: Some(0),
            writer_prefix: b.topics.topic_config(&meta, WRITER_PREFIX_CONFIG),
            writers: live
                .get(&meta.name)
                .map(|v| {
                    v.iter()
                        .map(|(p, t)| WriterSeen {
                            prefix: p.clone(),
                            last_commit_ms: *t,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            cutover: cutovers.get(&meta.name).cloned(),
            compacted: b.topics.cleanup_policy(&meta).compact,
        };
        for s in &parts {
            let gap = s.high_watermark - s.last_stable_offset;
            row.high_watermark += s.high_watermark;
            row.lso_gap += gap;
            row.max_lso_gap = row.max_lso_gap.max(gap);
            row.pinned_partitions += usize::from(gap > 0);
            row.size_bytes = row.size_bytes.zip(s.size_bytes).map(|(a, b)| a + b);
        }
        partitions += row.partitions;
        pinned += row.pinned_partitions;
        gap_total += row.lso_gap;
        rows.push(row);
    }
    let topics = rows.len();
    let q = q.to_lowercase();
    rows.retain(|r| q.is_empty() || r.topic.to_lowercase().contains(&q));
    match sort {
        "gap" => rows.sort_by(|a, b| b.lso_gap.cmp(&a.lso_gap).then(a.topic.cmp(&b.topic))),
        "size" => rows.sort_by(|a, b| b.size_bytes.cmp(&a.size_bytes).then(a.topic.cmp(&b.topic))),
        _ => rows.sort_by(|a, b| a.topic.cmp(&b.topic)),
    }
    let txns = b.txns();
    let (open, oldest) = txns.open_transactions().await;
    let stats = b.txn.stats();
    let parked = txns
        .parked(Scope::All)
        .await
        .map(|(p, _)| p)
        .unwrap_or_default();
    let syncs = b.syncer.stats.latency.count();
    let fsync_mean_ms = if syncs == 0 {
        0.0
    } else {
        b.syncer.stats.latency.sum() * 1000.0 / syncs as f64
    };
    json!({
        "now_ms": now,
        "broker": {
            "version": env!("CARGO_PKG_VERSION"),
            "node_id": b.config.node_id,
            "started_ms": b.samples.started_ms(),
            "listeners": b.config.listeners.iter().map(|l| json!({
                "name": l.name, "protocol": l.protocol.name(), "address": l.bind.to_string(),
            })).collect::<Vec<_>>(),
            "connections": b.connections.open(),
            "open_transactions": open,
            "oldest_open_transaction_ms": oldest,
            "parked_transactions": parked.len(),
            "stuck_transactions": b.txn.stuck_count(),
            "commits": stats.commits,
            "aborts": stats.aborts,
            "fsyncs": b.syncer.stats.latency.count(),
            "fsync_mean_ms": fsync_mean_ms,
            "history_since_ms": txns.with_histories(now, |h| h.since_ms()).await.unwrap_or(now),
        },
        "samples": b.samples.recent(),
        "totals": { "topics": topics, "partitions": partitions, "pinned_partitions": pinned, "lso_gap": gap_total },
        "topics": paging.slice(rows),
    })
}

/// `GET /v1/console/topic?topic=T&page=&only=pinned`: a topic's partitions.
pub async fn topic(
    b: &Arc<Broker>,
    name: &str,
    paging: Paging,
    only_pinned: bool,
) -> Option<Value> {
    let meta = b.catalogue().topic(name).await.ok().flatten()?;
    let parts = partitions_by_topic(b)
        .await
        .remove(name)
        .unwrap_or_default();
    let ids = ids_by_producer(&coordinator_state(b).await);
    let mut rows: Vec<PartitionRow> = Vec::new();
    for s in parts {
        let gap = s.high_watermark - s.last_stable_offset;
        if only_pinned && gap == 0 {
            continue;
        }
        // a transaction open here holds the LSO below the high watermark
        let open = if gap > 0 {
            open_at(b, name, s.partition)
                .await
                .into_iter()
                .map(|(first, pid, epoch)| OpenTxn {
                    first_offset: first,
                    producer_id: pid,
                    producer_epoch: epoch,
                    transactional_id: ids.get(&pid).cloned(),
                })
                .collect()
        } else {
            Vec::new()
        };
        rows.push(PartitionRow {
            partition: s.partition,
            high_watermark: s.high_watermark,
            last_stable_offset: s.last_stable_offset,
            lso_gap: gap,
            log_start_offset: s.log_start_offset,
            size_bytes: s.size_bytes,
            open,
        });
    }
    let now = now_ms();
    Some(json!({
        "topic": meta.name,
        "configs": meta.configs,
        "writer_prefix": b.topics.topic_config(&meta, WRITER_PREFIX_CONFIG),
        "cutover": cutovers(b).await.remove(&meta.name),
        "writers": b.catalogue().live_writers(now).await.remove(&meta.name).unwrap_or_default()
            .into_iter().map(|(p, t)| WriterSeen { prefix: p, last_commit_ms: t }).collect::<Vec<_>>(),
        "partitions": paging.slice(rows),
    }))
}

/// The epoch entry of an id's history that holds `pid` at `epoch` (who
/// got it), else its latest of `pid`.
fn holder(epochs: &[Epoch], pid: i64, epoch: i16) -> Option<Epoch> {
    epochs
        .iter()
        .rev()
        .find(|e| e.producer_id == pid && e.epoch == epoch)
        .or_else(|| epochs.iter().rev().find(|e| e.producer_id == pid))
        .cloned()
}

/// The coordinator's state of every transactional id, by id.
/// (every one of the cluster's in cluster mode; none when it cannot be
/// read: logged there).
async fn coordinator_state(b: &Arc<Broker>) -> BTreeMap<String, TxnMeta> {
    b.txns()
        .list_in(Scope::All)
        .await
        .map(|(all, _)| all)
        .unwrap_or_default()
        .into_iter()
        .map(|m| (m.transactional_id.clone(), m))
        .collect()
}

/// The transactional ids whose transactions are parked now.
async fn parked_ids(b: &Arc<Broker>) -> HashSet<String> {
    b.txns()
        .parked(Scope::All)
        .await
        .map(|(p, _)| p)
        .unwrap_or_default()
        .into_iter()
        .map(|p| p.transactional_id)
        .collect()
}

/// Who got `pid` at `epoch` of `id`, from its history (in cluster mode the
/// cluster's).
async fn holder_of(b: &Arc<Broker>, id: &str, pid: i64, epoch: i16) -> Option<Epoch> {
    let h = b.txns().history(id).await.ok()?;
    let epochs: Vec<Epoch> = serde_json::from_value(h.get("epochs")?.clone()).ok()?;
    holder(&epochs, pid, epoch)
}

/// What an operator can do about a transaction that pins an LSO.
fn resolution(
    kind: &str,
    id: Option<&str>,
    topic: &str,
    partition: i32,
    pid: i64,
    epoch: i16,
) -> Value {
    match (kind, id) {
        ("parked", Some(id)) => json!({
            "advice": "Parked past its timeout under the two-phase commit policy: it waits for its producer (a Flink job re-commits it after a restore). If that job will not come back, commit it (its records become visible) or abort it, naming its producer id and epoch.",
            "actions": [
                {"action": "resolve", "outcome": "commit", "label": "Commit", "params": {"id": id, "producer_id": pid, "epoch": epoch, "outcome": "commit"},
                 "cli": format!("oncelog txn commit {id} --producer-id {pid} --producer-epoch {epoch}")},
                {"action": "resolve", "outcome": "abort", "label": "Abort", "params": {"id": id, "producer_id": pid, "epoch": epoch, "outcome": "abort"},
                 "cli": format!("oncelog txn abort {id} --producer-id {pid} --producer-epoch {epoch}")},
            ],
        }),
        ("orphan", _) => json!({
            "advice": "A hanging transaction: open at this partition, but its coordinator holds no open transaction of this producer. Nothing will end it but an abort marker here.",
            "actions": [
                {"action": "abort", "label": "Abort at the partition", "params": {"topic": topic, "partition": partition, "producer_id": pid, "epoch": epoch},
                 "cli": format!("oncelog txn abort {topic} {partition} --producer-id {pid} --producer-epoch {epoch}")},
            ],
        }),
        ("completing", _) => json!({
            "advice": "Being committed or aborted: its markers are on their way (a stuck transaction is retried until its markers are durable).",
            "actions": [],
        }),
        _ => json!({
            "advice": "Open: it ends when its producer commits or aborts, or at its timeout. Aborting it now fences its producer (its next request fails with PRODUCER_FENCED).",
            "actions": [
                {"action": "abort", "label": "Abort (fences the producer)", "params": {"topic": topic, "partition": partition, "producer_id": pid, "epoch": epoch},
                 "cli": format!("oncelog txn abort {topic} {partition} --producer-id {pid} --producer-epoch {epoch}")},
            ],
        }),
    }
}

/// `GET /v1/console/stuck?page=`: every partition whose last stable offset
/// trails its high watermark, with the transaction that pins it (the open
/// transaction with the lowest first offset), its age, its producer and
/// client, and what would resolve it. Most records held back first.
pub async fn stuck(b: &Arc<Broker>, paging: Paging) -> Value {
    let now = now_ms();
    let metas = coordinator_state(b).await;
    let ids = ids_by_producer(&metas);
    let parked = parked_ids(b).await;
    let mut rows = Vec::new();
    for (topic, parts) in partitions_by_topic(b).await {
        for s in parts {
            let gap = s.high_watermark - s.last_stable_offset;
            if gap <= 0 {
                continue;
            }
            let index = s.partition;
            let open = open_at(b, &topic, index).await;
            let mut pin = None;
            if let Some(&(first, pid, epoch)) = open.first() {
                let id = ids.get(&pid).cloned();
                let meta = id.as_ref().and_then(|i| metas.get(i));
                let held = meta.is_some_and(|m| {
                    m.producer_id == pid
                        && m.state != TxnState::Empty
                        && !matches!(m.state, TxnState::CompleteCommit | TxnState::CompleteAbort)
                        && m.partitions.contains(&(topic.clone(), index))
                });
                let kind = match meta.map(|m| m.state) {
                    _ if !held => "orphan",
                    _ if id.as_ref().is_some_and(|i| parked.contains(i)) => "parked",
                    Some(TxnState::PrepareCommit | TxnState::PrepareAbort) => "completing",
                    _ => "open",
                };
                let who = match id.as_deref() {
                    Some(i) => holder_of(b, i, pid, epoch).await,
                    None => None,
                };
                pin = Some(json!({
                    "first_offset": first,
                    "producer_id": pid,
                    "producer_epoch": epoch,
                    "transactional_id": id,
                    "writer": id.as_deref().map(prefix_of),
                    "state": meta.map(|m| m.state.name()),
                    "kind": kind,
                    "started_ms": meta.map(|m| m.start_ms),
                    "age_ms": meta.filter(|m| m.start_ms > 0).map(|m| now - m.start_ms),
                    "timeout_ms": meta.map(|m| m.timeout_ms),
                    "partitions": meta.map(|m| m.partitions.iter().map(|(t, i)| format!("{t}-{i}")).collect::<Vec<_>>()),
                    "client_id": who.as_ref().and_then(|w| w.client_id.clone()),
                    "peer": who.as_ref().and_then(|w| w.peer.clone()),
                    "records_held": s.high_watermark - first,
                    "resolution": resolution(kind, id.as_deref(), &topic, index, pid, epoch),
                }));
            }
            rows.push(json!({
                "topic": topic, "partition": index,
                "high_watermark": s.high_watermark, "last_stable_offset": s.last_stable_offset, "lso_gap": gap,
                "open_transactions": open.len(),
                "pinned_by": pin,
            }));
        }
    }
    rows.sort_by(|a, b| {
        b["lso_gap"]
            .as_i64()
            .cmp(&a["lso_gap"].as_i64())
            .then_with(|| a["topic"].as_str().cmp(&b["topic"].as_str()))
            .then_with(|| a["partition"].as_i64().cmp(&b["partition"].as_i64()))
    });
    json!({ "now_ms": now, "partitions": paging.slice(rows) })
}

/// A transactional id's lane on the timeline.
#[derive(Debug, Clone, Serialize)]
struct Lane {
    transactional_id: String,
    writer: String,
    state: Option<&'static str>,
    producer_id: Option<i64>,
    producer_epoch: Option<i16>,
    partitions: Vec<String>,
    started_ms: Option<i64>,
    timeout_ms: Option<i32>,
    parked: bool,
    fences: usize,
    last_event_ms: i64,
    events: Vec<crate::observe::txn_history::Event>,
}

fn is_open(state: TxnState) -> bool {
    matches!(
        state,
        TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
    )
}

/// `GET /v1/console/transactions?prefix=&topic=&window_ms=&page=`: one
/// lane per transactional id (the coordinator's ids and those with recent
/// history) with its events in the window, open transactions first, then
/// the most recently active. `prefix` matches the writer (the job) or the
/// start of the id; `topic` an id whose transaction or events name it.
pub async fn transactions(
    b: &Arc<Broker>,
    paging: Paging,
    prefix: &str,
    topic: &str,
    window_ms: i64,
) -> Value {
    let now = now_ms();
    let since = now - window_ms.clamp(1_000, 24 * 3_600_000);
    let parked = parked_ids(b).await;
    let metas = coordinator_state(b).await;
    let topic_part = format!("{topic}-");
    let names_topic = |parts: &[String]| parts.iter().any(|p| p.starts_with(&topic_part));
    let mut writers: BTreeMap<String, usize> = BTreeMap::new();
    let txns = b.txns();
    let histories = txns.with_histories(since, |h| {
        let mut ids: Vec<&String> = metas.keys().collect();
        let extra: Vec<&String> = h
            .iter()
            .map(|(k, _)| k)
            .filter(|k| !metas.contains_key(*k))
            .collect();
        ids.extend(extra);
        let mut out = Vec::new();
        for id in ids {
            let writer = prefix_of(id).to_string();
            *writers.entry(writer.clone()).or_default() += 1;
            if !prefix.is_empty() && writer != prefix && !id.starts_with(prefix) {
                continue;
            }
            let m = metas.get(id);
            let hist = h.get(id);
            let events: Vec<crate::observe::txn_history::Event> = hist
                .map(|x| {
                    x.events
                        .iter()
                        .filter(|e| e.last_time_ms >= since)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            let partitions: Vec<String> = m
                .map(|m| {
                    m.partitions
                        .iter()
                        .map(|(t, i)| format!("{t}-{i}"))
                        .collect()
                })
                .unwrap_or_default();
            if !topic.is_empty()
                && !names_topic(&partitions)
                && !events.iter().any(|e| names_topic(&e.partitions))
            {
                continue;
            }
            let last_event_ms = hist
                .and_then(|x| x.events.back().map(|e| e.last_time_ms))
                .or(m.map(|m| m.update_ms))
                .unwrap_or(0);
            out.push(Lane {
                transactional_id: id.clone(),
                writer,
                state: m.map(|m| m.state.name()),
                producer_id: m.map(|m| m.producer_id),
                producer_epoch: m.map(|m| m.epoch),
                partitions,
                started_ms: m.filter(|m| is_open(m.state)).map(|m| m.start_ms),
                timeout_ms: m.map(|m| m.timeout_ms),
                parked: parked.contains(id),
                fences: hist.map_or(0, |x| x.fences.len()),
                last_event_ms,
                events,
            });
        }
        (out, h.since_ms())
    });
    let (mut lanes, history_since_ms) = histories.await.unwrap_or_else(|_| (Vec::new(), now));
    lanes.sort_by(|a, b| {
        let open = |l: &Lane| l.started_ms.is_some();
        open(b)
            .cmp(&open(a))
            .then(b.last_event_ms.cmp(&a.last_event_ms))
            .then(a.transactional_id.cmp(&b.transactional_id))
    });
    let mut top: Vec<(String, usize)> = writers.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(50);
    json!({
        "now_ms": now,
        "since_ms": since,
        "history_since_ms": history_since_ms,
        "writers": top.into_iter().map(|(w, n)| json!({"writer": w, "ids": n})).collect::<Vec<_>>(),
        "lanes": paging.slice(lanes),
    })
}

/// `GET /v1/console/transaction?id=`: one transactional id: the
/// coordinator's state, where its open transaction begins at each
/// partition, and its history (epochs with who got them, fences, events
/// with their partitions — a commit's and an abort's are where its markers
/// went).
pub async fn transaction(b: &Arc<Broker>, id: &str) -> Value {
    let txns = b.txns();
    let meta = txns
        .describe(&[id.to_string()])
        .await
        .ok()
        .and_then(|mut v| v.pop().flatten());
    let parked = txns
        .parked(Scope::All)
        .await
        .map(|(p, _)| p)
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.transactional_id == id);
    let mut partitions: Vec<Value> = Vec::new();
    if let Some(m) = &meta {
        for (t, i) in &m.partitions {
            let first = open_at(b, t, *i)
                .await
                .into_iter()
                .find(|(_, pid, _)| *pid == m.producer_id)
                .map(|(f, _, _)| f);
            let bounds = b.logs().bounds(t, *i).await.ok();
            partitions.push(json!({
                "topic": t, "partition": i,
                "first_offset": first,
                "high_watermark": bounds.map(|(hw, _)| hw),
                "last_stable_offset": bounds.map(|(_, lso)| lso),
            }));
        }
    }
    let history = txns.history(id).await.unwrap_or_else(|_| json!({}));
    // Where the recent ends' markers went: each partition's own record of
    // the markers it wrote (the nearest in time to the end).
    let events: Vec<crate::observe::txn_history::Event> = history
        .get("events")
        .and_then(|e| serde_json::from_value(e.clone()).ok())
        .unwrap_or_default();
    let ends = events
        .iter()
        .filter(|e| matches!(e.event, EventKind::Commit | EventKind::Abort))
        .rev()
        .take(10);
    let mut markers = Vec::new();
    for e in ends {
        let commit = e.event == EventKind::Commit;
        for name in &e.partitions {
            let Some((t, i)) = name.rsplit_once('-') else {
                continue;
            };
            let Ok(i) = i.parse::<i32>() else {
                continue;
            };
            let m = b
                .logs()
                .recent_markers(t, i)
                .await
                .into_iter()
                .filter(|m| m.producer_id == e.producer_id && m.commit == commit)
                .min_by_key(|m| (m.time_ms - e.time_ms).abs());
            markers.push(json!({
                "time_ms": e.time_ms, "commit": commit, "producer_id": e.producer_id, "epoch": e.epoch,
                "partition": name,
                "first_offset": m.and_then(|m| m.first_offset),
                "marker_offset": m.map(|m| m.marker_offset),
            }));
        }
    }
    json!({
        "transactional_id": id,
        "writer": prefix_of(id),
        "markers": markers,
        "now_ms": now_ms(),
        "known": meta.is_some(),
        "state": meta.as_ref().map(|m| m.state.name()),
        "producer_id": meta.as_ref().map(|m| m.producer_id),
        "producer_epoch": meta.as_ref().map(|m| m.epoch),
        "timeout_ms": meta.as_ref().map(|m| m.timeout_ms),
        "started_ms": meta.as_ref().filter(|m| is_open(m.state)).map(|m| m.start_ms),
        "updated_ms": meta.as_ref().map(|m| m.update_ms),
        "two_phase": meta.as_ref().is_some_and(|m| m.two_phase),
        "parked": parked,
        "partitions": partitions,
        "history": history,
    })
}

/// A consumer-protocol assignment's topic-partitions (version first; a
/// newer version is read as the newest known, whose fields it starts
/// with). Empty when the bytes do not decode.
fn assignment(raw: &bytes::Bytes) -> Vec<(String, Vec<i32>)> {
    use bytes::Buf;
    use kafka_protocol::messages::consumer_protocol_assignment::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::{Decodable, Message};
    if raw.len() < 2 {
        return Vec::new();
    }
    let mut buf = raw.clone();
    let version = buf.get_i16();
    if version < 0 {
        return Vec::new();
    }
    let version = version.min(ConsumerProtocolAssignment::VERSIONS.max);
    let Ok(a) = ConsumerProtocolAssignment::decode(&mut buf, version) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<i32>)> = a
        .assigned_partitions
        .iter()
        .map(|tp| {
            let mut ps = tp.partitions.clone();
            ps.sort_unstable();
            (tp.topic.0.to_string(), ps)
        })
        .collect();
    out.sort();
    out
}

/// `GET /v1/console/groups?page=&q=`: consumer groups with their state,
/// members and total lag against the LSO and the high watermark (in
/// cluster mode every group of the cluster, as its coordinator last saw
/// it).
pub async fn groups(b: &Arc<Broker>, paging: Paging, q: &str) -> Value {
    let q = q.to_lowercase();
    let store = b.group_store();
    let mut rows = Vec::new();
    for (g, snap) in store.snapshots(Scope::All).await.unwrap_or_default() {
        if !q.is_empty() && !g.to_lowercase().contains(&q) {
            continue;
        }
        let pending = store.pending(&g).await.map(|p| p.len()).unwrap_or(0);
        let lag = b.group_lag(&g).await;
        rows.push(json!({
            "group": g,
            "protocol_type": snap.as_ref().map_or("", |s| s.protocol_type.as_str()),
            "state": snap.as_ref().map_or("Empty", |s| s.state.as_str()),
            "members": snap.as_ref().map_or(0, |s| s.members.len()),
            "generation": snap.as_ref().map_or(0, |s| s.generation),
            "partitions": lag.len(),
            "lag_committed": lag.iter().map(|r| r.lag_committed.max(0)).sum::<i64>(),
            "lag_uncommitted": lag.iter().map(|r| r.lag_uncommitted.max(0)).sum::<i64>(),
            "pending_transactional_offsets": pending,
        }));
    }
    json!({ "groups": paging.slice(rows) })
}

/// `GET /v1/console/group?group=G`: members and their assignments,
/// committed offsets with lag against the LSO and the high watermark, and
/// offsets pending in open transactions (by producer and transactional id).
pub async fn group(b: &Arc<Broker>, id: &str, paging: Paging) -> Option<Value> {
    let store = b.group_store();
    let snap = store.snapshot(id).await.ok().flatten();
    let lag = b.group_lag(id).await;
    if snap.is_none() && lag.is_empty() {
        return None;
    }
    let members: Vec<Value> = snap
        .as_ref()
        .map(|s| {
            s.members
                .iter()
                .map(|m| {
                    json!({
                        "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                        "client_id": m.client_id, "client_host": m.client_host,
                        "session_timeout_ms": m.session_timeout_ms,
                        "assignment": assignment(&bytes::Bytes::from(m.assignment.clone())).into_iter()
                            .map(|(t, ps)| json!({"topic": t, "partitions": ps})).collect::<Vec<_>>(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let offsets: Vec<Value> = lag
        .iter()
        .map(|r| {
            json!({
                "topic": r.topic, "partition": r.partition, "committed": r.committed,
                "last_stable_offset": r.last_stable_offset, "high_watermark": r.high_watermark,
                "lag_committed": r.lag_committed, "lag_uncommitted": r.lag_uncommitted,
            })
        })
        .collect();
    let pending = store.pending(id).await.unwrap_or_default();
    let ids = if pending.is_empty() {
        HashMap::new()
    } else {
        ids_by_producer(&coordinator_state(b).await)
    };
    let pending: Vec<Value> = pending
        .into_iter()
        .map(|(pid, t, p, o)| {
            json!({
                "producer_id": pid, "transactional_id": ids.get(&pid),
                "topic": t, "partition": p, "offset": o,
            })
        })
        .collect();
    Some(json!({
        "group": id,
        "state": snap.as_ref().map_or("Empty", |s| s.state.as_str()),
        "generation": snap.as_ref().map_or(0, |s| s.generation),
        "protocol": snap.as_ref().map(|s| s.protocol.as_str()).filter(|p| !p.is_empty()),
        "leader": snap.as_ref().map(|s| s.leader.as_str()).filter(|l| !l.is_empty()),
        "members": members,
        "lag_committed": lag.iter().map(|r| r.lag_committed.max(0)).sum::<i64>(),
        "lag_uncommitted": lag.iter().map(|r| r.lag_uncommitted.max(0)).sum::<i64>(),
        "offsets": paging.slice(offsets),
        "pending": pending,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paging_clamps_and_slices() {
        let p = Paging::new("3", "2");
        let v = p.slice((0..5).collect::<Vec<i32>>());
        assert_eq!(v["rows"], json!([4]));
        assert_eq!(v["pages"], 3);
        assert_eq!(v["total"], 5);
        // past the end: the last page; junk: page 1 of the default size
        let v = Paging::new("99", "2").slice((0..5).collect::<Vec<i32>>());
        assert_eq!(v["page"], 3);
        let p = Paging::new("x", "-1");
        assert_eq!(
            p,
            Paging {
                page: 1,
                per_page: DEFAULT_PER_PAGE
            }
        );
        assert_eq!(Paging::new("0", "100000").per_page, MAX_PER_PAGE);
        let v = Paging::new("1", "10").slice(Vec::<i32>::new());
        assert_eq!(
            (v["page"].as_u64(), v["pages"].as_u64()),
            (Some(1), Some(1))
        );
    }

    #[test]
    fn assignments_decode_or_are_empty() {
        assert!(assignment(&bytes::Bytes::new()).is_empty());
        assert!(assignment(&bytes::Bytes::from_static(&[0, 0, 0xff])).is_empty());
        // version 0: one topic "t" with partitions 2 and 1, no user data
        let raw: &[u8] = &[
            0, 0, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 1, 0xff, 0xff, 0xff,
            0xff,
        ];
        assert_eq!(
            assignment(&bytes::Bytes::copy_from_slice(raw)),
            vec![("t".to_string(), vec![1, 2])]
        );
    }
}
