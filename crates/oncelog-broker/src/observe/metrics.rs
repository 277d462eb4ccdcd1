//! Metrics in the Prometheus text format, served at `/metrics` by the
//! broker's HTTP listener ([`crate::observe::http`]) and written by
//! [`crate::observe::exposition`]. Label cardinality is bounded: partitions
//! and groups are what the operator created; fence and zombie-write
//! counters keep at most
//! [`crate::coordinators::txn_service::MAX_FENCE_LABELS`] transactional ids.

use std::sync::Arc;

use crate::observe::exposition::Scrape;
use crate::Broker;
use oncelog_log::now_ms;

/// (topic, partition, high watermark, LSO, log start, size in bytes)
type Row = (String, i32, i64, i64, i64, Option<u64>);

/// (metric name, help, value of a partition row, if it has one)
type Gauge = (&'static str, &'static str, fn(&Row) -> Option<i64>);

/// The whole exposition.
pub async fn render(b: &Arc<Broker>) -> String {
    let mut out = Scrape::default();
    render_partitions(&mut out, b).await;
    render_transactions(&mut out, b).await;
    render_clients(&mut out, b);
    render_durations(&mut out, b);
    render_group_lag(&mut out, b).await;
    render_cleaner(&mut out, b);
    b.verify.render(&mut out);
    if let Some(front) = b.front() {
        front.render_metrics(&mut out);
    }
    out.encode()
}

/// Every partition's offsets and size.
async fn render_partitions(out: &mut Scrape, b: &Arc<Broker>) {
    let rows: Vec<Row> = b
        .logs()
        .statuses(crate::backend::Scope::Mine)
        .await
        .into_iter()
        .map(|p| {
            (
                p.topic,
                p.partition,
                p.high_watermark,
                p.last_stable_offset,
                p.log_start_offset,
                p.size_bytes,
            )
        })
        .collect();
    let gauges: [Gauge; 5] = [
        (
            "oncelog_partition_high_watermark",
            "Offset after the last durable record.",
            |r| Some(r.2),
        ),
        (
            "oncelog_partition_last_stable_offset",
            "Offset read_committed consumers can read up to.",
            |r| Some(r.3),
        ),
        (
            "oncelog_partition_lso_gap",
            "High watermark minus last stable offset (records held back by open transactions).",
            |r| Some(r.2 - r.3),
        ),
        (
            "oncelog_partition_log_start_offset",
            "First offset still in the log.",
            |r| Some(r.4),
        ),
        (
            "oncelog_partition_size_bytes",
            "Bytes of log segments (local mode).",
            |r| r.5.map(|n| n as i64),
        ),
    ];
    for (name, help, get) in gauges {
        let mut family = out.gauge(name, help);
        for r in &rows {
            let Some(v) = get(r) else { continue };
            family.int(&[("topic", &r.0), ("partition", &r.1.to_string())], v);
        }
    }
}

/// Open, parked and stuck transactions, cut-overs, fences and zombie writes.
async fn render_transactions(out: &mut Scrape, b: &Arc<Broker>) {
    let (open, oldest) = b.txns().open_transactions().await;
    out.gauge("oncelog_transactions_open", "Transactions currently open.")
        .int(&[], open as i64);
    let age = oldest.map_or(0.0, |t| (now_ms() - t).max(0) as f64 / 1000.0);
    out.gauge(
        "oncelog_transaction_oldest_open_age_seconds",
        "Age of the oldest open transaction (0 when none).",
    )
    .float(&[], age);
    render_cutovers(out, b).await;
    // In a cluster, those this broker coordinates (sum across brokers).
    let (parked, now) = b
        .txns()
        .parked(crate::backend::Scope::Mine)
        .await
        .unwrap_or_else(|_| (Vec::new(), now_ms()));
    out.gauge(
        "oncelog_transactions_parked",
        "Transactions kept open past their timeout under transaction.two.phase.commit.prefixes.",
    )
    .int(&[], parked.len() as i64);
    let age = parked
        .first()
        .map_or(0.0, |p| (now - p.parked_since_ms).max(0) as f64 / 1000.0);
    out.gauge(
        "oncelog_transaction_oldest_parked_age_seconds",
        "How long the oldest parked transaction has been parked (0 when none).",
    )
    .float(&[], age);
    out.gauge(
        "oncelog_transactions_stuck",
        "Transactions whose markers have failed to be written several times in a row (retried until durable).",
    )
    .int(&[], b.txn.stuck_count() as i64);
    let stats = b.txn.stats();
    out.counter(
        "oncelog_transactions_completed_total",
        "Transactions completed, by result.",
    )
    .int(&[("result", "commit")], stats.commits as i64)
    .int(&[("result", "abort")], stats.aborts as i64);
    let mut fences = out.counter(
        "oncelog_transaction_fences_total",
        "Producers fenced, by transactional id and cause (newer_producer, timeout, administrator).",
    );
    for ((id, cause), n) in &stats.fences {
        fences.int(&[("transactional_id", id), ("cause", cause)], *n as i64);
    }
    let mut zombies = out.counter(
        "oncelog_rejected_zombie_writes_total",
        "Transactional produce batches refused: a fenced producer's late write, or a partition outside its producer's open transaction.",
    );
    for (id, n) in &stats.zombie_writes {
        zombies.int(&[("transactional_id", id)], *n as i64);
    }
}

/// Each topic's latest cut-over, and the transactions a draining one waits for.
async fn render_cutovers(out: &mut Scrape, b: &Arc<Broker>) {
    // (cut-over, open transactions of the old writer it waits for)
    let cutovers = crate::coordinators::cutover::with_waiting(&b.cutover_store())
        .await
        .unwrap_or_else(|e| {
            tracing::debug!(error = %e, "metrics: the cut-overs could not be read");
            Vec::new()
        });
    let mut phases = out.gauge(
        "oncelog_cutover_phase",
        "Each topic's latest cut-over (oncelog cutover): 1 for its phase (Draining, Switched, RolledBack); done=\"true\" once the old writer is fenced.",
    );
    for (c, _) in &cutovers {
        let phase = format!("{:?}", c.phase);
        let done = c.done.to_string();
        let l = [
            ("topic", c.topic.as_str()),
            ("from", &c.from),
            ("to", &c.to),
            ("phase", &phase),
            ("done", &done),
        ];
        phases.int(&l, 1);
    }
    let mut waiting = out.gauge(
        "oncelog_cutover_waiting_transactions",
        "Open transactions of the old writer a draining cut-over waits for.",
    );
    for (c, n) in cutovers
        .iter()
        .filter(|(c, _)| c.phase == crate::machines::cutover::Phase::Draining)
    {
        waiting.int(&[("topic", &c.topic)], *n as i64);
    }
}

/// Writers per topic, authentications, connections, ACL denials, ACLs and users.
fn render_clients(out: &mut Scrape, b: &Arc<Broker>) {
    let mut writers = out.gauge("oncelog_topic_transactional_writers",
        "Distinct transactional-id prefixes that committed to a topic within the last minute (more than one: outputs add up).");
    for (topic, prefixes) in b.writers.live(now_ms()) {
        writers.int(&[("topic", &topic)], prefixes.len() as i64);
    }
    let mut auths = out.counter("oncelog_authentications_total",
        "SASL authentications by listener, mechanism and result (success or failure; a failure closes its connection).");
    for ((listener, mechanism, result), n) in b.auth_stats.snapshot() {
        let l = [
            ("listener", listener.as_str()),
            ("mechanism", &mechanism),
            ("result", result),
        ];
        auths.int(&l, n as i64);
    }
    let f = &b.fetch_stats;
    out.counter("oncelog_fetch_rounds_total",
        "Fetch rounds: reads of every partition of a Fetch request (its first, and again after a wake-up that found one of its partitions moved).")
        .int(&[], f.rounds.load(std::sync::atomic::Ordering::Relaxed) as i64);
    out.counter("oncelog_fetch_wakeups_skipped_total",
        "Long-poll wake-ups that read nothing: new data, but none in the waiting Fetch's partitions.")
        .int(&[], f.wakeups_skipped.load(std::sync::atomic::Ordering::Relaxed) as i64);
    out.gauge("oncelog_connections", "Client connections open now.")
        .int(&[], b.connections.open() as i64);
    let mut refused = out.counter("oncelog_connections_refused_total",
        "Connections refused or closed early: over max.connections or max.connections.per.ip, or not authenticated within connections.max.unauthenticated.ms.");
    for (why, n) in b.connections.refused() {
        refused.int(&[("reason", why)], n as i64);
    }
    let mut denials = out.counter(
        "oncelog_authorization_denials_total",
        "Requests (or parts of requests) the authorizer refused, by resource type.",
    );
    for (t, n) in b.authz.denials.snapshot() {
        denials.int(&[("resource_type", &t.to_string())], n as i64);
    }
    out.gauge(
        "oncelog_acls",
        "ACLs stored (enforced when authorizer.class.name is set).",
    )
    .int(&[], b.authz.count() as i64);
    out.gauge("oncelog_scram_users", "Users with SCRAM credentials.")
        .int(&[], b.users.count() as i64);
}

/// Orphans found, transaction durations, request latency, fsyncs and bytes appended.
fn render_durations(out: &mut Scrape, b: &Arc<Broker>) {
    out.counter("oncelog_transaction_orphans_found_total",
        "Partition-side open transactions the coordinator did not know, found by the healing check.")
        .int(&[], b.orphans.load(std::sync::atomic::Ordering::Relaxed) as i64);
    let mut durations = out.histogram(
        "oncelog_transaction_duration_seconds",
        "Transaction duration, first partition added to markers written, by result.",
    );
    for (i, result) in ["commit", "abort"].iter().enumerate() {
        durations.histogram(&[("result", result)], &b.txn.durations[i]);
    }
    let mut latency = out.histogram("oncelog_request_latency_seconds",
        "Time from a request's arrival to its response being ready, by API (produce includes fsync; fetch includes long-poll waits).");
    for (k, h) in b.request_latency.iter().enumerate() {
        if h.count() == 0 {
            continue;
        }
        let api = kafka_protocol::messages::ApiKey::try_from(k as i16)
            .map(|a| format!("{a:?}"))
            .unwrap_or_else(|_| k.to_string());
        latency.histogram(&[("api", &api)], h);
    }
    let sync_stats = &b.syncer.stats;
    out.histogram(
        "oncelog_fsync_latency_seconds",
        "Duration of one group-commit fdatasync.",
    )
    .histogram(&[], &sync_stats.latency);
    out.histogram(
        "oncelog_fsync_bytes",
        "Bytes made durable by one group-commit fdatasync.",
    )
    .histogram(&[], &sync_stats.bytes);
    let (syncs, bytes) = b.io_counters();
    out.counter(
        "oncelog_fsync_total",
        "fdatasync calls made by group commit.",
    )
    .int(&[], syncs as i64);
    out.counter(
        "oncelog_appended_bytes_total",
        "Record-batch bytes appended by producers.",
    )
    .int(&[], bytes as i64);
}

/// Each group's read_committed lag.
async fn render_group_lag(out: &mut Scrape, b: &Arc<Broker>) {
    let groups = b.group_store().list().await.unwrap_or_default();
    let mut rows = Vec::new();
    for (group, _, _) in groups {
        for r in b.group_lag(&group).await {
            if r.lag_committed >= 0 {
                rows.push((group.clone(), r));
            }
        }
    }
    let mut lag = out.gauge(
        "oncelog_group_lag",
        "Records between a group's committed offset and the last stable offset.",
    );
    for (group, r) in rows {
        let partition = r.partition.to_string();
        lag.int(
            &[
                ("group", &group),
                ("topic", &r.topic),
                ("partition", &partition),
            ],
            r.lag_committed,
        );
    }
}

/// The log cleaner's totals and each compacted partition's dirt.
fn render_cleaner(out: &mut Scrape, b: &Broker) {
    use std::sync::atomic::Ordering::Relaxed;
    let t = &b.cleaner.totals;
    let counters: [(&str, &str, u64); 6] = [
        (
            "oncelog_cleaner_passes_total",
            "Cleaning passes finished.",
            t.passes.load(Relaxed),
        ),
        (
            "oncelog_cleaner_errors_total",
            "Cleaning passes that failed (the partition is left as it was).",
            t.errors.load(Relaxed),
        ),
        (
            "oncelog_cleaner_read_bytes_total",
            "Bytes the cleaner read (throughput: this over busy seconds).",
            t.bytes_read.load(Relaxed),
        ),
        (
            "oncelog_cleaner_written_bytes_total",
            "Bytes of cleaned segments written.",
            t.bytes_written.load(Relaxed),
        ),
        (
            "oncelog_cleaner_removed_records_total",
            "Records the cleaner removed (superseded, tombstones, aborted).",
            t.records_removed.load(Relaxed),
        ),
        (
            "oncelog_cleaner_aborted_records_removed_total",
            "Records of aborted transactions the cleaner removed.",
            t.aborted_records_removed.load(Relaxed),
        ),
    ];
    for (name, help, v) in counters {
        out.counter(name, help).int(&[], v as i64);
    }
    for (name, help, ms) in [
        (
            "oncelog_cleaner_busy_seconds_total",
            "Time spent cleaning.",
            t.busy_ms.load(Relaxed),
        ),
        (
            "oncelog_cleaner_throttled_seconds_total",
            "Time cleaners slept for log.cleaner.io.max.bytes.per.second.",
            t.throttled_ms.load(Relaxed),
        ),
    ] {
        out.counter(name, help).float(&[], ms as f64 / 1000.0);
    }
    let statuses = b.cleaner.statuses();
    type Field = fn(&crate::backend::local::compaction::CleanerStatus) -> f64;
    let gauges: [(&str, &str, Field); 3] = [
        (
            "oncelog_cleaner_dirty_bytes",
            "Bytes of a compacted partition's cleanable log not cleaned yet (the backlog).",
            |s| s.dirty_bytes as f64,
        ),
        (
            "oncelog_cleaner_dirty_ratio",
            "Dirty share of a compacted partition's cleanable log.",
            |s| s.dirty_ratio,
        ),
        (
            "oncelog_cleaner_first_dirty_offset",
            "Where the last cleaning pass stopped.",
            |s| s.first_dirty_offset as f64,
        ),
    ];
    for (name, help, f) in gauges {
        let mut family = out.gauge(name, help);
        for (part, s) in &statuses {
            let (topic, index) = part.rsplit_once('-').unwrap_or((part.as_str(), "0"));
            family.float(&[("topic", topic), ("partition", index)], f(s));
        }
    }
}
