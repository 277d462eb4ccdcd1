//! Fault injection for crash and storage-fault tests, from environment
//! variables read once; nothing is injected when they are unset.

/// Failpoints for crash tests: when `ONCELOG_FAILPOINTS` (a comma-separated
/// list, read once) names `name`, the process aborts on the spot, as a power
/// cut would stop it. Unset in normal operation.
pub fn fail_point(name: &str) {
    static POINTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let points = POINTS.get_or_init(|| {
        std::env::var("ONCELOG_FAILPOINTS")
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    });
    if points.iter().any(|p| p == name) {
        tracing::error!(failpoint = name, "failpoint hit: aborting the process");
        std::process::abort();
    }
}

/// Injected storage faults for tests, from `ONCELOG_FAULTS`
/// (comma-separated). `marker-error:TOPIC:N` makes the first N transaction
/// marker writes to TOPIC's partitions fail as a storage error would, so a
/// test can watch a transaction get stuck and recover while others go on.
/// Unset (the default), nothing is injected.
pub fn injected_marker_error(topic: &str) -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static FAULTS: std::sync::OnceLock<Vec<(String, AtomicU64)>> = std::sync::OnceLock::new();
    let faults = FAULTS.get_or_init(|| {
        std::env::var("ONCELOG_FAULTS")
            .unwrap_or_default()
            .split(',')
            .filter_map(|f| {
                let rest = f.trim().strip_prefix("marker-error:")?;
                let (t, n) = rest.rsplit_once(':')?;
                Some((t.to_string(), AtomicU64::new(n.parse().ok()?)))
            })
            .collect()
    });
    faults.iter().any(|(t, left)| {
        t == topic
            && left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
    })
}

/// `ONCELOG_FAULTS=end-txn-unavailable:PREFIX`: EndTxn(commit) of a
/// transactional id starting with PREFIX is answered
/// COORDINATOR_LOAD_IN_PROGRESS (retriable) for as long as the broker runs,
/// so a test can have a framework's commits stay pending (scenario S9: the
/// job goes down between its checkpoint and its commit).
pub fn injected_end_txn_unavailable(transactional_id: &str) -> bool {
    static PREFIXES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    prefixed(&PREFIXES, "end-txn-unavailable:", transactional_id)
}

/// Whether `ONCELOG_FAULTS` (read once into `cell`) has a `KIND:PREFIX`
/// whose PREFIX starts `transactional_id`.
fn prefixed(cell: &std::sync::OnceLock<Vec<String>>, kind: &str, transactional_id: &str) -> bool {
    cell.get_or_init(|| {
        std::env::var("ONCELOG_FAULTS")
            .unwrap_or_default()
            .split(',')
            .filter_map(|f| f.trim().strip_prefix(kind).map(str::to_string))
            .collect()
    })
    .iter()
    .any(|p| transactional_id.starts_with(p.as_str()))
}

/// `ONCELOG_FAULTS=commit-one-partition:PREFIX`: the COMMIT markers of a
/// transaction whose id starts with PREFIX go to its first partition only
/// (the others keep the transaction open, and the coordinator completes it
/// all the same): the fault live verification must report as
/// `commit_missing`. Returns the partitions to write markers to.
pub fn marker_partitions(
    transactional_id: &str,
    commit: bool,
    partitions: Vec<(String, i32)>,
) -> Vec<(String, i32)> {
    static PREFIXES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let hit = prefixed(&PREFIXES, "commit-one-partition:", transactional_id);
    if !hit || !commit || partitions.len() < 2 {
        return partitions;
    }
    let mut kept = partitions;
    let dropped = kept.split_off(1);
    tracing::warn!(transactional_id, kept = ?kept, dropped = ?dropped,
        "injected fault commit-one-partition: COMMIT markers left out");
    kept
}
