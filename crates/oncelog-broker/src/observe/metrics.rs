//! Metrics in the Prometheus text format, served at `/metrics` by the
//! broker's HTTP listener ([`crate::observe::http`]). Label cardinality is bounded: partitions and groups are what the operator
//! created; fence and zombie-write counters keep at most
//! [`crate::coordinators::txn_service::MAX_FENCE_LABELS`] transactional ids.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::Broker;
use oncelog_log::now_ms;

/// Escapes a label value (backslash, quote, newline).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// (topic, partition, high watermark, LSO, log start, size in bytes)
type Row = (String, i32, i64, i64, i64, Option<u64>);

/// (metric name, help, value of a partition row, if it has one)
type Gauge = (&'static str, &'static str, fn(&Row) -> Option<i64>);

/// The whole exposition.
pub async fn render(b: &Arc<Broker>) -> String {
    let mut out = String::with_capacity(4096);
    render_partitions(&mut out, b).await;
    render_transactions(&mut out, b).await;
    render_clients(&mut out, b);
    render_durations(&mut out, b);
    render_group_lag(&mut out, b).await;
    render_cleaner(&mut out, b);
    if let Some(front) = b.front() {
        front.render_metrics(&mut out);
    }
    out
}

/// Every partition's offsets and size.
async fn render_partitions(out: &mut String, b: &Arc<Broker>) {
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
        family(out, name, "gauge", help);
        for r in &rows {
            let Some(v) = get(r) else { continue };
            let _ = writeln!(
                out,
                "{name}{{topic=\"{}\",partition=\"{}\"}} {v}",
                esc(&r.0),
                r.1,
            );
        }
    }
}

/// Open, parked and stuck transactions, cut-overs, fences and zombie writes.
async fn render_transactions(out: &mut String, b: &Arc<Broker>) {
    let (open, oldest) = b.txns().open_transactions().await;
    family(
        out,
        "oncelog_transactions_open",
        "gauge",
        "Transactions currently open.",
    );
    let _ = writeln!(out, "oncelog_transactions_open {open}");
    family(
        out,
        "oncelog_transaction_oldest_open_age_seconds",
        "gauge",
        "Age of the oldest open transaction (0 when none).",
    );
    let age = oldest.map_or(0.0, |t| (now_ms() - t).max(0) as f64 / 1000.0);
    let _ = writeln!(out, "oncelog_transaction_oldest_open_age_seconds {age}");
    // (cut-over, open transactions of the old writer it waits for)
    let cutovers = crate::coordinators::cutover::with_waiting(&b.cutover_store())
        .await
        .unwrap_or_else(|e| {
            tracing::debug!(error = %e, "metrics: the cut-overs could not be read");
            Vec::new()
        });
    family(
        out,
        "oncelog_cutover_phase",
        "gauge",
        "Each topic's latest cut-over (oncelog cutover): 1 for its phase (Draining, Switched, RolledBack); done=\"true\" once the old writer is fenced.",
    );
    for (c, _) in &cutovers {
        let _ = writeln!(
            out,
            "oncelog_cutover_phase{{topic=\"{}\",from=\"{}\",to=\"{}\",phase=\"{:?}\",done=\"{}\"}} 1",
            esc(&c.topic),
            esc(&c.from),
            esc(&c.to),
            c.phase,
            c.done
        );
    }
    family(
        out,
        "oncelog_cutover_waiting_transactions",
        "gauge",
        "Open transactions of the old writer a draining cut-over waits for.",
    );
    for (c, n) in cutovers
        .iter()
        .filter(|(c, _)| c.phase == crate::machines::cutover::Phase::Draining)
    {
        let _ = writeln!(
            out,
            "oncelog_cutover_waiting_transactions{{topic=\"{}\"}} {n}",
            esc(&c.topic),
        );
    }
    // In a cluster, those this broker coordinates (sum across brokers).
    let (parked, now) = b
        .txns()
        .parked(crate::backend::Scope::Mine)
        .await
        .unwrap_or_else(|_| (Vec::new(), now_ms()));
    family(
        out,
        "oncelog_transactions_parked",
        "gauge",
        "Transactions kept open past their timeout under transaction.two.phase.commit.prefixes.",
    );
    let _ = writeln!(out, "oncelog_transactions_parked {}", parked.len());
    family(
        out,
        "oncelog_transaction_oldest_parked_age_seconds",
        "gauge",
        "How long the oldest parked transaction has been parked (0 when none).",
    );
    let age = parked
        .first()
        .map_or(0.0, |p| (now - p.parked_since_ms).max(0) as f64 / 1000.0);
    let _ = writeln!(out, "oncelog_transaction_oldest_parked_age_seconds {age}");
    family(
        out,
        "oncelog_transactions_stuck",
        "gauge",
        "Transactions whose markers have failed to be written several times in a row (retried until durable).",
    );
    let _ = writeln!(out, "oncelog_transactions_stuck {}", b.txn.stuck_count());
    let stats = b.txn.stats();
    family(
        out,
        "oncelog_transactions_completed_total",
        "counter",
        "Transactions completed, by result.",
    );
    let _ = writeln!(
        out,
        "oncelog_transactions_completed_total{{result=\"commit\"}} {}",
        stats.commits
    );
    let _ = writeln!(
        out,
        "oncelog_transactions_completed_total{{result=\"abort\"}} {}",
        stats.aborts
    );
    family(
        out,
        "oncelog_transaction_fences_total",
        "counter",
        "Producers fenced, by transactional id and cause (newer_producer, timeout, administrator).",
    );
    for ((id, cause), n) in &stats.fences {
        let _ = writeln!(
            out,
            "oncelog_transaction_fences_total{{transactional_id=\"{}\",cause=\"{cause}\"}} {n}",
            esc(id)
        );
    }
    family(
        out,
        "oncelog_rejected_zombie_writes_total",
        "counter",
        "Transactional produce batches refused: a fenced producer's late write, or a partition outside its producer's open transaction.",
    );
    for (id, n) in &stats.zombie_writes {
        let _ = writeln!(
            out,
            "oncelog_rejected_zombie_writes_total{{transactional_id=\"{}\"}} {n}",
            esc(id)
        );
    }
}

/// Writers per topic, authentications, connections, ACL denials, ACLs and users.
fn render_clients(out: &mut String, b: &Arc<Broker>) {
    family(out, "oncelog_topic_transactional_writers", "gauge",
        "Distinct transactional-id prefixes that committed to a topic within the last minute (more than one: outputs add up).");
    for (topic, prefixes) in b.writers.live(now_ms()) {
        let _ = writeln!(
            out,
            "oncelog_topic_transactional_writers{{topic=\"{}\"}} {}",
            esc(&topic),
            prefixes.len()
        );
    }
    family(out, "oncelog_authentications_total", "counter",
        "SASL authentications by listener, mechanism and result (success or failure; a failure closes its connection).");
    for ((listener, mechanism, result), n) in b.auth_stats.snapshot() {
        let _ = writeln!(
            out,
            "oncelog_authentications_total{{listener=\"{}\",mechanism=\"{}\",result=\"{result}\"}} {n}",
            esc(&listener),
            esc(&mechanism)
        );
    }
    family(
        out,
        "oncelog_connections",
        "gauge",
        "Client connections open now.",
    );
    let _ = writeln!(out, "oncelog_connections {}", b.connections.open());
    family(out, "oncelog_connections_refused_total", "counter",
        "Connections refused or closed early: over max.connections or max.connections.per.ip, or not authenticated within connections.max.unauthenticated.ms.");
    for (why, n) in b.connections.refused() {
        let _ = writeln!(
            out,
            "oncelog_connections_refused_total{{reason=\"{why}\"}} {n}"
        );
    }
    family(
        out,
        "oncelog_authorization_denials_total",
        "counter",
        "Requests (or parts of requests) the authorizer refused, by resource type.",
    );
    for (t, n) in b.authz.denials.snapshot() {
        let _ = writeln!(
            out,
            "oncelog_authorization_denials_total{{resource_type=\"{t}\"}} {n}"
        );
    }
    family(
        out,
        "oncelog_acls",
        "gauge",
        "ACLs stored (enforced when authorizer.class.name is set).",
    );
    let _ = writeln!(out, "oncelog_acls {}", b.authz.count());
    family(
        out,
        "oncelog_scram_users",
        "gauge",
        "Users with SCRAM credentials.",
    );
    let _ = writeln!(out, "oncelog_scram_users {}", b.users.count());
}

/// Orphans found, transaction durations, request latency, fsyncs and bytes appended.
fn render_durations(out: &mut String, b: &Arc<Broker>) {
    family(out, "oncelog_transaction_orphans_found_total", "counter",
        "Partition-side open transactions the coordinator did not know, found by the healing check.");
    let _ = writeln!(
        out,
        "oncelog_transaction_orphans_found_total {}",
        b.orphans.load(std::sync::atomic::Ordering::Relaxed)
    );
    family(
        out,
        "oncelog_transaction_duration_seconds",
        "histogram",
        "Transaction duration, first partition added to markers written, by result.",
    );
    for (i, result) in ["commit", "abort"].iter().enumerate() {
        b.txn.durations[i].render(
            out,
            "oncelog_transaction_duration_seconds",
            &format!("result=\"{result}\""),
        );
    }
    family(out, "oncelog_request_latency_seconds", "histogram",
        "Time from a request's arrival to its response being ready, by API (produce includes fsync; fetch includes long-poll waits).");
    for (k, h) in b.request_latency.iter().enumerate() {
        if h.count() == 0 {
            continue;
        }
        let api = kafka_protocol::messages::ApiKey::try_from(k as i16)
            .map(|a| format!("{a:?}"))
            .unwrap_or_else(|_| k.to_string());
        h.render(
            out,
            "oncelog_request_latency_seconds",
            &format!("api=\"{api}\""),
        );
    }
    let sync_stats = &b.syncer.stats;
    family(
        out,
        "oncelog_fsync_latency_seconds",
        "histogram",
        "Duration of one group-commit fdatasync.",
    );
    sync_stats
        .latency
        .render(out, "oncelog_fsync_latency_seconds", "");
    family(
        out,
        "oncelog_fsync_bytes",
        "histogram",
        "Bytes made durable by one group-commit fdatasync.",
    );
    sync_stats.bytes.render(out, "oncelog_fsync_bytes", "");
    let (syncs, bytes) = b.io_counters();
    family(
        out,
        "oncelog_fsync_total",
        "counter",
        "fdatasync calls made by group commit.",
    );
    let _ = writeln!(out, "oncelog_fsync_total {syncs}");
    family(
        out,
        "oncelog_appended_bytes_total",
        "counter",
        "Record-batch bytes appended by producers.",
    );
    let _ = writeln!(out, "oncelog_appended_bytes_total {bytes}");
}

/// Each group's read_committed lag.
async fn render_group_lag(out: &mut String, b: &Arc<Broker>) {
    family(
        out,
        "oncelog_group_lag",
        "gauge",
        "Records between a group's committed offset and the last stable offset.",
    );
    for (group, _, _) in b.group_store().list().await.unwrap_or_default() {
        for r in b.group_lag(&group).await {
            if r.lag_committed >= 0 {
                let _ = writeln!(
                    out,
                    "oncelog_group_lag{{group=\"{}\",topic=\"{}\",partition=\"{}\"}} {}",
                    esc(&group),
                    esc(&r.topic),
                    r.partition,
                    r.lag_committed
                );
            }
        }
    }
}

/// The log cleaner's totals and each compacted partition's dirt.
fn render_cleaner(out: &mut String, b: &Broker) {
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
        family(out, name, "counter", help);
        let _ = writeln!(out, "{name} {v}");
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
        family(out, name, "counter", help);
        let _ = writeln!(out, "{name} {:.3}", ms as f64 / 1000.0);
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
        family(out, name, "gauge", help);
        for (part, s) in &statuses {
            let (topic, index) = part.rsplit_once('-').unwrap_or((part.as_str(), "0"));
            let _ = writeln!(
                out,
                "{name}{{topic=\"{}\",partition=\"{index}\"}} {}",
                esc(topic),
                f(s)
            );
        }
    }
}
