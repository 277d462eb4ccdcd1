//! Live verification of exactly-once, written once over the backends
//! ([`crate::backend::Logs`], [`crate::backend::Catalogue`],
//! [`crate::backend::Txns`]), so local and cluster mode check alike. Each
//! broker verifies the partitions it reports (every one in local mode;
//! in a cluster those Metadata names it the leader of, so each partition is
//! verified once across the cluster).
//!
//! Every second, within its byte budget (`verify.scrub.bytes.per.second`),
//! for each partition:
//!
//! * the **frontier** scan reads what became stable since the last round
//!   (read_committed reads, from the log start on the first round; each
//!   read asks for every partition with something new, so a cluster makes
//!   one query for all of them) and hands it to
//!   [`oncelog_verify::scan::Scanner`], which checks it from the bytes
//!   alone; `verified_through` is where it got, short of a transaction
//!   still open there;
//! * every `verify.scrub.interval.ms`, a **pass** reads the partition again
//!   from its log start up to the frontier, scans it afresh and compares
//!   each batch's CRC with what the first scan saw
//!   ([`oncelog_verify::ledger::Ledger`]): committed content that changed
//!   or vanished is `digest_changed`, with its offsets. Retention and
//!   DeleteRecords explain what is gone below the log start; on a
//!   compacted topic the cleaner rewrites batches, so content is not
//!   compared there.
//!
//! Every [`COMMITS_EVERY`] rounds, the coordinator's record of the
//! transactions it committed ([`crate::backend::Txns::with_histories`]) is
//! held against the partitions: one that a committed transaction wrote to
//! and that still holds that producer's transaction open, on two checks
//! [`COMMIT_GRACE_MS`] apart, is `commit_missing` (the marker never came).
//!
//! How far each partition is verified and what was found is recorded
//! ([`crate::backend::verify_record`]): a restarted broker (or a
//! partition's new leader in a cluster) goes on from the offset verified
//! through, and does not report an anomaly again. The batches' CRCs are
//! kept in memory only: after a restart, content is compared from the
//! first pass of the new run on.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncelog_log::now_ms;
use oncelog_verify::ledger::Ledger;
use oncelog_verify::scan::{Aborted, Finding, Kind, Rules, Scanner};

use crate::backend::{Budget, FetchAsk, Logs, PartitionRow, Scope};
use crate::observe::txn_history::EventKind;
use crate::observe::verify::Progress;
use crate::Broker;

/// Bytes asked of one read.
const CHUNK: usize = 1 << 20;

/// A transaction's commit older than this is expected on all its partitions.
pub const COMMIT_GRACE_MS: i64 = 5_000;

/// Rounds (seconds) between checks of the committed transactions.
pub const COMMITS_EVERY: u64 = 5;

/// How far back committed transactions are looked at.
const COMMITS_WINDOW_MS: i64 = 60_000;

/// One partition's verification.
struct Part {
    topic_id: uuid::Uuid,
    compacted: bool,
    frontier: Scanner,
    /// CRC of each batch the frontier verified, with (last offset, pass).
    ledger: Ledger<i64, u32, (i64, u64)>,
    pass: Option<Pass>,
    last_pass_end: Instant,
    passes: u64,
}

/// A pass over the verified log, from its start.
struct Pass {
    scanner: Scanner,
    /// Ledger entries from here on were not passed yet.
    next: i64,
}

/// The byte budget (a token bucket refilled every round).
struct Bucket {
    rate: Option<u64>,
    tokens: i64,
}

impl Bucket {
    fn refill(&mut self) {
        if let Some(r) = self.rate {
            let r = r as i64;
            self.tokens = (self.tokens + r).min(r);
        }
    }
    fn has(&self) -> bool {
        self.rate.is_none() || self.tokens > 0
    }
    fn spend(&mut self, n: usize) {
        self.tokens -= n as i64;
    }
    /// Bytes left this round (any number when unlimited).
    fn available(&self) -> usize {
        match self.rate {
            Some(_) => self.tokens.max(0) as usize,
            None => usize::MAX,
        }
    }
}

/// Runs the verification until the broker goes.
pub async fn run(b: std::sync::Weak<Broker>) {
    let mut resume: HashMap<(String, i32), Progress> = match b.upgrade() {
        Some(b) => b
            .verify_record()
            .restore(&b)
            .await
            .into_iter()
            .map(|p| ((p.topic.clone(), p.partition), p))
            .collect(),
        None => return,
    };
    let mut saved: Vec<(String, i32, i64, u64)> = Vec::new();
    let mut others_since = now_ms();
    let mut parts: HashMap<(String, i32), Part> = HashMap::new();
    let mut turn = 0usize;
    let mut suspects: HashMap<(String, i32, i64), i64> = HashMap::new();
    let mut uniques = super::verify_unique::Uniques::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut round: u64 = 0;
    let mut bucket = None;
    loop {
        tick.tick().await;
        let Some(b) = b.upgrade() else { return };
        let bucket = bucket.get_or_insert(Bucket {
            rate: b.config.verify_scrub_bytes_per_second,
            tokens: 0,
        });
        bucket.refill();
        if round.is_multiple_of(COMMITS_EVERY) {
            // in a cluster: what other brokers reported (a partition's
            // earlier leader) is not reported again here
            let others = b
                .verify_record()
                .reported_since(others_since - 10_000)
                .await;
            if let Some(last) = others.iter().map(|r| r.found_ms).max() {
                others_since = others_since.max(last);
            }
            b.verify
                .already_reported(others.iter().map(crate::observe::verify::Reported::key));
        }
        let (rows, topics) = scrub(&b, &mut parts, &mut resume, bucket, &mut turn).await;
        super::verify_unique::tail(&b, &rows, &topics, &mut uniques).await;
        super::verify_lineage::round(&b, round.is_multiple_of(60)).await;
        round += 1;
        if round.is_multiple_of(COMMITS_EVERY) {
            check_commits(&b, &rows, &mut suspects).await;
        }
        save(&b, &mut saved).await;
        if round.is_multiple_of(60) {
            let names: Vec<String> = topics.into_keys().collect();
            b.verify_record().forget_topics_but(&names).await;
        }
    }
}

/// Records what was found this round, and the progress when it moved
/// since it was last recorded.
async fn save(b: &Arc<Broker>, saved: &mut Vec<(String, i32, i64, u64)>) {
    let now = b.verify.partitions(None);
    let marks: Vec<(String, i32, i64, u64)> = now
        .iter()
        .map(|p| (p.topic.clone(), p.partition, p.verified_through, p.passes))
        .collect();
    let progress = (marks != *saved).then(|| {
        *saved = marks;
        now
    });
    b.verify_record().save(b, progress).await;
}

/// One round over every partition this broker verifies.
async fn scrub(
    b: &Arc<Broker>,
    parts: &mut HashMap<(String, i32), Part>,
    resume: &mut HashMap<(String, i32), Progress>,
    bucket: &mut Bucket,
    turn: &mut usize,
) -> (
    Vec<PartitionRow>,
    HashMap<String, crate::backend::topic::TopicMeta>,
) {
    let logs = b.logs();
    let rows = logs.statuses(Scope::Mine).await;
    let topics: HashMap<String, crate::backend::topic::TopicMeta> = b
        .catalogue()
        .topics()
        .await
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    let keep: HashSet<(String, i32)> = rows
        .iter()
        .map(|r| (r.topic.clone(), r.partition))
        .collect();
    parts.retain(|k, _| keep.contains(k));
    b.verify.retain(&keep);
    let rules = |compacted| Rules {
        compacted,
        producer_expiry_ms: b.config.producer_id_expiration_ms,
    };
    let pass_every = Duration::from_millis(b.config.verify_scrub_interval_ms);
    let mut throttled = false;
    // the partitions verified this round, with their topic's id and policy
    let mut live: Vec<(&PartitionRow, uuid::Uuid, bool)> = Vec::new();
    for row in &rows {
        let Some(meta) = topics.get(&row.topic) else {
            continue;
        };
        let compacted = crate::backend::topic::CleanupPolicy::parse(
            meta.configs
                .get("cleanup.policy")
                .unwrap_or(&b.config.cleanup_policy),
        )
        .compact;
        let key = (row.topic.clone(), row.partition);
        let fresh = || Part {
            topic_id: meta.id,
            compacted,
            frontier: Scanner::starting_at(rules(compacted), row.log_start_offset),
            ledger: Ledger::default(),
            pass: None,
            last_pass_end: Instant::now(),
            passes: 0,
        };
        let part = parts.entry(key.clone()).or_insert_with(|| {
            let mut p = fresh();
            // Recorded before: on from where it was verified through (a
            // transaction open there is read again from its start).
            if let Some(r) = resume.remove(&key).filter(|r| {
                r.topic_id == meta.id.simple().to_string()
                    && r.compacted == compacted
                    && (row.log_start_offset..=row.high_watermark).contains(&r.verified_through)
            }) {
                p.frontier = Scanner::starting_at(rules(compacted), r.verified_through);
                p.passes = r.passes;
            }
            p
        });
        let frontier = part.frontier.next_offset().unwrap_or(row.log_start_offset);
        if part.topic_id != meta.id
            || part.compacted != compacted
            || frontier < row.log_start_offset
        {
            // A new topic of that name, a changed policy, or retention past
            // the frontier: start over from the log start.
            *part = fresh();
        }
        part.ledger.forget_below(&row.log_start_offset);
        live.push((row, meta.id, compacted));
    }
    *turn = turn.wrapping_add(1);
    throttled |= advance_frontiers(b, &logs, &live, parts, bucket, *turn).await;
    for &(row, topic_id, compacted) in &live {
        let Some(part) = parts.get_mut(&(row.topic.clone(), row.partition)) else {
            continue;
        };
        throttled |= advance_pass(b, &logs, row, part, rules(compacted), pass_every, bucket).await;
        let frontier = part.frontier.next_offset().unwrap_or(row.log_start_offset);
        b.verify.progress(Progress {
            topic: row.topic.clone(),
            partition: row.partition,
            topic_id: topic_id.simple().to_string(),
            verified_through: part
                .frontier
                .earliest_open()
                .map_or(frontier, |o| o.min(frontier)),
            log_start_offset: row.log_start_offset,
            last_stable_offset: row.last_stable_offset,
            passes: part.passes,
            remembered_batches: part.ledger.len(),
            compacted,
        });
    }
    if throttled {
        // The round's budget ran out with work left: until the next round.
        b.verify.throttled_ms.fetch_add(1000, Relaxed);
    }
    (rows, topics)
}

/// Committed data read back: (bytes, aborted index, LSO, HW).
type ReadBack = (Vec<u8>, Vec<Aborted>, i64, i64);

/// One read of committed data for each of `asks` (topic, partition,
/// offset), within `max_bytes` in all (the first ask gets a batch anyway):
/// in a cluster, one query for all of them.
async fn read(
    logs: &Logs<'_>,
    asks: &[(&str, i32, i64)],
    max_bytes: usize,
) -> Vec<Option<ReadBack>> {
    let fetch: Vec<FetchAsk<'_>> = asks
        .iter()
        .map(|&(topic, partition, offset)| FetchAsk {
            topic,
            partition,
            offset,
            max_bytes: CHUNK,
        })
        .collect();
    let mut budget = Budget::new(max_bytes.max(1));
    logs.read_at_rest(&fetch, &mut budget)
        .await
        .into_iter()
        .map(|r| {
            let r = r.ok()?;
            let aborted = r
                .aborted
                .iter()
                .map(|a| Aborted {
                    producer_id: a.producer_id,
                    first_offset: a.first_offset,
                    last_offset: a.last_offset,
                })
                .collect();
            Some((
                r.data.ok()?,
                aborted,
                r.last_stable_offset,
                r.high_watermark,
            ))
        })
        .collect()
}

fn report(b: &Broker, row: &PartitionRow, found: &[Finding]) {
    let now = now_ms();
    for f in found {
        b.verify.report(&row.topic, row.partition, f, now);
    }
}

/// Scans what was read back, counted and paid for from the budget.
fn feed(
    b: &Broker,
    scanner: &mut Scanner,
    data: &[u8],
    aborted: &[Aborted],
    bucket: &mut Bucket,
) -> (oncelog_verify::scan::Fed, Vec<Finding>) {
    let mut found = Vec::new();
    let fed = scanner.feed(data, aborted, &mut found);
    b.verify
        .scrubbed_bytes
        .fetch_add(data.len() as u64, Relaxed);
    bucket.spend(data.len());
    (fed, found)
}

/// Bytes one read of many partitions asks for at most.
const READ_MAX: usize = 8 << 20;

/// Verifies what became stable since the last round, on every partition
/// at once: each read asks for all partitions with something new (from
/// the `turn`-th on, so a tight budget reaches each in turn).
/// Returns whether it stopped for the byte budget with work left.
async fn advance_frontiers(
    b: &Broker,
    logs: &Logs<'_>,
    live: &[(&PartitionRow, uuid::Uuid, bool)],
    parts: &mut HashMap<(String, i32), Part>,
    bucket: &mut Bucket,
    turn: usize,
) -> bool {
    let n = live.len();
    let mut done = vec![false; n];
    loop {
        // (index in live, offset) of the partitions still behind their LSO
        let mut todo: Vec<(usize, i64)> = Vec::new();
        for k in 0..n {
            let i = (turn + k) % n;
            if done[i] {
                continue;
            }
            let row = live[i].0;
            let Some(part) = parts.get(&(row.topic.clone(), row.partition)) else {
                done[i] = true;
                continue;
            };
            let at = part.frontier.next_offset().unwrap_or(row.log_start_offset);
            if at >= row.last_stable_offset {
                done[i] = true;
                continue;
            }
            todo.push((i, at));
        }
        if todo.is_empty() {
            return false;
        }
        if !bucket.has() {
            return true;
        }
        let asks: Vec<(&str, i32, i64)> = todo
            .iter()
            .map(|&(i, at)| (live[i].0.topic.as_str(), live[i].0.partition, at))
            .collect();
        let results = read(logs, &asks, bucket.available().min(READ_MAX)).await;
        let mut moved = false;
        for (&(i, at), r) in todo.iter().zip(results) {
            let row = live[i].0;
            let Some(part) = parts.get_mut(&(row.topic.clone(), row.partition)) else {
                continue;
            };
            let Some((data, aborted, lso, hw)) = r else {
                done[i] = true;
                continue;
            };
            if data.is_empty() {
                // past this read's budget (or nothing there): next read
                continue;
            }
            let (fed, found) = feed(b, &mut part.frontier, &data, &aborted, bucket);
            if !part.compacted {
                for &(base, last, crc) in &fed.crcs {
                    part.ledger.see(base, crc, (last, part.passes));
                }
            }
            report(b, row, &found);
            let now_at = part.frontier.next_offset().unwrap_or(at);
            if now_at >= lso {
                part.frontier.reached_stable(lso, hw);
                done[i] = true;
            } else if fed.consumed == 0 || now_at <= at {
                done[i] = true;
            } else {
                moved = true;
            }
        }
        if !moved {
            return false;
        }
    }
}

/// Passes over the verified log again when one is due.
async fn advance_pass(
    b: &Broker,
    logs: &Logs<'_>,
    row: &PartitionRow,
    part: &mut Part,
    rules: Rules,
    every: Duration,
    bucket: &mut Bucket,
) -> bool {
    let frontier = part.frontier.next_offset().unwrap_or(row.log_start_offset);
    if part.pass.is_none() {
        if part.last_pass_end.elapsed() < every || frontier <= row.log_start_offset {
            return false;
        }
        part.pass = Some(Pass {
            scanner: Scanner::starting_at(rules, row.log_start_offset),
            next: row.log_start_offset,
        });
    }
    let Some(pass) = part.pass.as_mut() else {
        return false;
    };
    if pass.next < row.log_start_offset {
        *pass = Pass {
            scanner: Scanner::starting_at(rules, row.log_start_offset),
            next: row.log_start_offset,
        };
    }
    while pass.next < frontier {
        if !bucket.has() {
            return true;
        }
        let at = pass.scanner.next_offset().unwrap_or(pass.next);
        let Some(Some((data, aborted, _, _))) =
            read(logs, &[(&row.topic, row.partition, at)], CHUNK)
                .await
                .pop()
        else {
            return false;
        };
        let (fed, mut found) = feed(b, &mut pass.scanner, &data, &aborted, bucket);
        if !part.compacted {
            compare(
                &mut part.ledger,
                pass,
                &fed.crcs,
                frontier,
                part.passes + 1,
                &mut found,
            );
        }
        pass.next = pass.scanner.next_offset().unwrap_or(at).max(pass.next);
        report(b, row, &found);
        if fed.consumed == 0 || pass.scanner.next_offset().unwrap_or(at) <= at {
            // Unreadable here: reported; the next pass tries again.
            pass.next = frontier;
        }
    }
    part.pass = None;
    part.passes += 1;
    part.last_pass_end = Instant::now();
    false
}

/// Each batch a pass read against what the first scan saw there; batches
/// the first scan saw and the pass stepped over are gone.
fn compare(
    ledger: &mut Ledger<i64, u32, (i64, u64)>,
    pass: &mut Pass,
    crcs: &[(i64, i64, u32)],
    frontier: i64,
    pass_no: u64,
    found: &mut Vec<Finding>,
) {
    let changed = |base: i64, last: i64, detail: String| Finding {
        kind: Kind::DigestChanged,
        first_offset: base,
        last_offset: last,
        producer_id: -1,
        epoch: -1,
        detail,
    };
    for &(base, last, crc) in crcs.iter().filter(|c| c.0 < frontier) {
        let gone: Vec<(i64, i64, u64)> = ledger
            .from(&pass.next)
            .take_while(|(o, _)| **o < base)
            .map(|(o, (_, (l, p)))| (*o, *l, *p))
            .collect();
        for (o, l, p) in gone {
            found.push(changed(
                o,
                l,
                format!("the batch at {o}..={l}, verified in pass {p}, is gone in pass {pass_no} (above the log start, not compacted)"),
            ));
        }
        if let Some(&(old, (_, p))) = ledger.see(base, crc, (last, pass_no)) {
            found.push(changed(
                base,
                last,
                format!("the batch at {base}..={last} had CRC {old:#010x} in pass {p} and has {crc:#010x} in pass {pass_no}"),
            ));
        }
        pass.next = last + 1;
    }
}

/// Committed transactions against the partitions they wrote: see the
/// module's documentation. `suspects`: (topic, partition, producer) →
/// when first seen open after its commit.
async fn check_commits(
    b: &Arc<Broker>,
    rows: &[PartitionRow],
    suspects: &mut HashMap<(String, i32, i64), i64>,
) {
    let now = now_ms();
    // partitions with a transaction open: where a marker may be missing
    let open: HashMap<(&str, i32), &PartitionRow> = rows
        .iter()
        .filter(|r| r.last_stable_offset < r.high_watermark)
        .map(|r| ((r.topic.as_str(), r.partition), r))
        .collect();
    if open.is_empty() {
        suspects.clear();
        return;
    }
    // (transactional id, producer, epoch, commit time, partitions)
    type Committed = (String, i64, i16, i64, Vec<String>);
    let committed: Vec<Committed> = match b
        .txns()
        .with_histories(now - COMMITS_WINDOW_MS, |h| {
            h.iter()
                .filter_map(|(id, ih)| {
                    let e = ih.events.iter().rev().find(|e| {
                        !matches!(e.event, EventKind::FencedRequest | EventKind::RejectedWrite)
                    })?;
                    (e.event == EventKind::Commit && now - e.time_ms >= COMMIT_GRACE_MS).then(
                        || {
                            (
                                id.clone(),
                                e.producer_id,
                                e.epoch,
                                e.time_ms,
                                e.partitions.clone(),
                            )
                        },
                    )
                })
                .collect()
        })
        .await
    {
        Ok(c) => c,
        Err(_) => return,
    };
    let logs = b.logs();
    let mut still = HashMap::new();
    for (id, pid, epoch, at, parts) in &committed {
        for tp in parts {
            let Some((topic, p)) = tp.rsplit_once('-') else {
                continue;
            };
            let Ok(p) = p.parse::<i32>() else { continue };
            let Some(row) = open.get(&(topic, p)) else {
                continue;
            };
            let Ok(producers) = logs.producers(topic, p).await else {
                continue;
            };
            let Some(first) = producers
                .iter()
                .find(|(id, e)| id == pid && e.epoch <= *epoch)
                .and_then(|(_, e)| e.current_txn_first_offset)
            else {
                continue;
            };
            let key = (topic.to_string(), p, *pid);
            let since = suspects.get(&key).copied().unwrap_or(now);
            still.insert(key, since);
            if now - since < COMMIT_GRACE_MS {
                continue;
            }
            let f = Finding {
                kind: Kind::CommitMissing,
                first_offset: first,
                last_offset: row.high_watermark - 1,
                producer_id: *pid,
                epoch: *epoch,
                detail: format!(
                    "transaction {id} (producer {pid}, epoch {epoch}) committed at {at} ms on {}; this partition has no COMMIT marker for it and holds it open from offset {first}",
                    parts.join(", ")
                ),
            };
            b.verify.report(topic, p, &f, now);
        }
    }
    *suspects = still;
}
