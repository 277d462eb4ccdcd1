//! `oncelog diff A B`: compares the committed content of two topics. It is
//! the check in the middle of a blue/green hand-over: run the new job into a
//! shadow topic, compare the shadow with the live output, then switch
//! consumers.
//!
//! Both topics are read read_committed over all their partitions, from the
//! log start (or a window's start) to the last stable offset seen when the
//! run starts, so it ends while writers go on. Records are grouped by a key
//! (the record key, or a top-level field of a JSON value) and, per key, the
//! multisets of values (exact bytes) are compared: which partition or offset
//! a record has, its timestamp and its headers are not compared, so topics
//! with different partition counts or write orders are equal when they hold
//! the same records. Only a hash of each value is kept (127 bits of two
//! independently keyed SipHashes, as in the log cleaner's offset map), so
//! millions of records fit in memory. Sums of numeric fields are exact
//! decimals where the numbers allow.
//!
//! Exit codes follow diff(1): 0 equal, 1 different, 2 trouble.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::io::Write;

use anyhow::{anyhow, bail, Context, Result};
use kafka_protocol::records::Record;
use oncelog_client::consumer::{
    decode_partition, fetch, list_offsets, AbortedTxns, EARLIEST, LATEST,
};
use oncelog_client::{check, Cluster, Leaders, ResponseError};
use serde_json::{json, Value};

/// What `oncelog diff --help` says after the options: what is compared,
/// and the exit codes.
const EXIT_HELP: &str = "\
Records are compared per key as multisets of values (exact bytes): partitions, \
offsets, timestamps and headers are not compared. Both topics are read \
read_committed up to the last stable offset seen at the start.

Exit status: 0 when the topics are equal, 1 when they differ, 2 on an error \
(a missing topic, a broker that cannot be reached, bad arguments).";

/// The arguments of `oncelog diff`.
#[derive(clap::Args)]
#[command(after_help = EXIT_HELP)]
pub struct DiffArgs {
    /// The first topic (the live output, say).
    pub a: String,
    /// The second topic (the shadow output, say).
    pub b: String,
    /// Key records by their record key (shown as UTF-8; invalid bytes as
    /// U+FFFD). Records without a key are unkeyed.
    #[arg(long, conflicts_with = "key")]
    pub key_from_record_key: bool,
    /// Key records by this top-level field of their JSON value (a string is
    /// its text, anything else its JSON). Records whose value is not a JSON
    /// object with this field are unkeyed. One of --key and
    /// --key-from-record-key is required.
    #[arg(
        long,
        value_name = "FIELD",
        required_unless_present = "key_from_record_key"
    )]
    pub key: Option<String>,
    /// Sum this numeric top-level field of JSON values, per topic
    /// (repeatable). A JSON number or a string holding a decimal number
    /// counts; sums are exact decimals (numbers beyond a double's 15
    /// significant digits are exact as far as a double holds them; sums
    /// beyond 38 digits fall back to floating point, compared with a
    /// relative tolerance of 1e-9). Other values are counted as non-numeric.
    #[arg(long = "sum", value_name = "FIELD")]
    pub sums: Vec<String>,
    /// Start of the window, inclusive: @TIMESTAMP_MS (record timestamps) or
    /// an offset (in every partition of both topics; before a log start
    /// means the log start).
    #[arg(long, value_name = "@TIMESTAMP_MS|OFFSET")]
    pub from: Option<String>,
    /// End of the window, exclusive: @TIMESTAMP_MS (record timestamps) or an
    /// offset (in every partition of both topics; past the last stable
    /// offset means the last stable offset).
    #[arg(long, value_name = "@TIMESTAMP_MS|OFFSET")]
    pub to: Option<String>,
    /// Example keys shown per kind of difference.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub max_report: usize,
}

/// Runs `oncelog diff`: prints the comparison (text, or one JSON document
/// with `json_out`) and exits 1 when the topics differ, 2 on an error (after
/// saying it on stderr); returns when they are equal.
pub async fn diff(bootstrap: &str, json_out: bool, args: DiffArgs) -> Result<()> {
    // Trouble exits 2, so that a script can tell it from a difference (1).
    let equal = match run(bootstrap, json_out, &args).await {
        Ok(equal) => equal,
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let _ = std::io::stdout().flush();
    if !equal {
        std::process::exit(1);
    }
    Ok(())
}

/// Reads both topics and reports; true when they are equal.
async fn run(bootstrap: &str, json_out: bool, args: &DiffArgs) -> Result<bool> {
    let keying = match (&args.key, args.key_from_record_key) {
        (Some(f), false) => Keying::Field(f.clone()),
        (None, true) => Keying::RecordKey,
        _ => bail!("give exactly one of --key FIELD and --key-from-record-key"),
    };
    let window = Window {
        from: args
            .from
            .as_deref()
            .map(|s| Bound::parse(s, "--from"))
            .transpose()?,
        to: args
            .to
            .as_deref()
            .map(|s| Bound::parse(s, "--to"))
            .transpose()?,
    };
    let mut c = Cluster::connect(bootstrap).await?;
    // Both topics must exist before either is read.
    let leaders = [
        leaders_of(&mut c, &args.a).await?,
        leaders_of(&mut c, &args.b).await?,
    ];
    let mut cmp = Comparison::new(keying, &args.sums, args.max_report);
    for (side, topic) in [(Side::A, &args.a), (Side::B, &args.b)] {
        let l = &leaders[side as usize];
        read_topic(&mut c, topic, l, &window, |p, r| cmp.observe(side, p, r)).await?;
        cmp.sides[side as usize].partitions = l.len();
    }
    let report = cmp.report(&args.a, &args.b, &window);
    if json_out {
        println!("{}", serde_json::to_string_pretty(&report.json)?);
    } else {
        print!("{}", report.text);
    }
    Ok(report.equal)
}

/// One end of a window: a record timestamp (ms) or an offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bound {
    Time(i64),
    Offset(i64),
}

impl Bound {
    fn parse(s: &str, flag: &str) -> Result<Self> {
        let bad = || anyhow!("{flag} must be @TIMESTAMP_MS or an offset, not {s:?}");
        match s.strip_prefix('@') {
            Some(t) => t.parse().map(Bound::Time).map_err(|_| bad()),
            None => match s.parse::<i64>() {
                Ok(o) if o >= 0 => Ok(Bound::Offset(o)),
                _ => Err(bad()),
            },
        }
    }

    fn json(&self) -> Value {
        match self {
            Bound::Time(t) => json!({ "timestamp_ms": t }),
            Bound::Offset(o) => json!({ "offset": o }),
        }
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::Time(t) => write!(f, "@{t}"),
            Bound::Offset(o) => write!(f, "offset {o}"),
        }
    }
}

/// What part of each topic is compared: `from` inclusive, `to` exclusive.
#[derive(Default)]
struct Window {
    from: Option<Bound>,
    to: Option<Bound>,
}

impl Window {
    /// Whether a record read inside the offset range is in the window.
    fn holds_time(&self, ts: i64) -> bool {
        let after = match self.from {
            Some(Bound::Time(t)) => ts >= t,
            _ => true,
        };
        let before = match self.to {
            Some(Bound::Time(t)) => ts < t,
            _ => true,
        };
        after && before
    }
}

/// Fetches in a row that bring a partition no further before a run gives up
/// (each waits up to 500 ms for data).
const MAX_STALLED_FETCHES: u32 = 40;

/// The partitions of `topic` and their leaders; a topic that does not
/// exist is an error that says so (and is not created).
async fn leaders_of(c: &mut Cluster, topic: &str) -> Result<Leaders> {
    match c.leaders(topic, false).await {
        Ok(l) => Ok(l),
        Err(e) if e.kafka_error() == Some(ResponseError::UnknownTopicOrPartition) => {
            bail!("topic {topic} does not exist")
        }
        Err(e) => Err(e).with_context(|| format!("reading topic {topic}")),
    }
}

/// Reads `topic` (partitions led by `leaders`) read_committed, from
/// `window`'s start up to the last stable offset as it is now (or the
/// window's end offset), and hands each record in the window to `f` with
/// its partition.
async fn read_topic(
    c: &mut Cluster,
    topic: &str,
    leaders: &Leaders,
    window: &Window,
    mut f: impl FnMut(i32, &Record),
) -> Result<()> {
    let parts: Vec<i32> = leaders.keys().copied().collect();
    let starts = list_offsets(c.bootstrap(), topic, &parts, EARLIEST, false).await?;
    let lsos = list_offsets(c.bootstrap(), topic, &parts, LATEST, true).await?;
    let start_of = |p: &i32| starts.get(p).copied().unwrap_or(0);
    let mut end: BTreeMap<i32, i64> = parts
        .iter()
        .map(|p| (*p, lsos.get(p).copied().unwrap_or(0)))
        .collect();
    if let Some(Bound::Offset(o)) = window.to {
        for e in end.values_mut() {
            *e = (*e).min(o);
        }
    }
    let end_of = |p: &i32| end.get(p).copied().unwrap_or(0);
    let mut pos: BTreeMap<i32, i64> = match window.from {
        None => parts.iter().map(|p| (*p, start_of(p))).collect(),
        Some(Bound::Offset(o)) => parts
            .iter()
            .map(|p| {
                if o < start_of(p) {
                    eprintln!(
                        "{topic}-{p}: offset {o} is before the log start ({}: older records were \
                         deleted); comparing from there",
                        start_of(p)
                    );
                }
                (*p, o.max(start_of(p)))
            })
            .collect(),
        // The first offset with a timestamp at or after `t`: every record
        // before it is older (records after it are filtered one by one).
        Some(Bound::Time(t)) => {
            let found = list_offsets(c.bootstrap(), topic, &parts, t, false).await?;
            let into_log = |(p, o): (i32, i64)| {
                let o = if o < 0 {
                    end_of(&p)
                } else {
                    o.max(start_of(&p))
                };
                (p, o)
            };
            found.into_iter().map(into_log).collect()
        }
    };
    let mut aborted: HashMap<i32, AbortedTxns> = HashMap::new();
    let mut stalled: HashMap<i32, u32> = HashMap::new();
    loop {
        let mut by_leader: BTreeMap<i32, Vec<(i32, i64)>> = BTreeMap::new();
        for p in &parts {
            let at = pos.get(p).copied().unwrap_or(0);
            if at < end_of(p) {
                by_leader
                    .entry(*leaders.get(p).unwrap_or(&-1))
                    .or_default()
                    .push((*p, at));
            }
        }
        if by_leader.is_empty() {
            return Ok(());
        }
        for (leader, positions) in by_leader {
            let r = fetch(c, leader, topic, &positions, true).await?;
            for pd in r.responses.iter().flat_map(|t| t.partitions.iter()) {
                let p = pd.partition_index;
                let at = pos.get(&p).copied().unwrap_or(0);
                if pd.error_code == ResponseError::OffsetOutOfRange.code() {
                    bail!(
                        "{topic}-{p}: offset {at} left the log while it was read (retention or \
                         DeleteRecords); run the comparison again"
                    );
                }
                check(pd.error_code, &format!("fetch {topic}-{p}"))?;
                let (recs, next) = decode_partition(pd, at, true, aborted.entry(p).or_default())?;
                let stop = end_of(&p);
                for r in recs.iter().filter(|r| r.offset < stop) {
                    if window.holds_time(r.timestamp) {
                        f(p, r);
                    }
                }
                if next > at {
                    pos.insert(p, next);
                    stalled.remove(&p);
                } else {
                    let n = stalled.entry(p).or_default();
                    *n += 1;
                    if *n >= MAX_STALLED_FETCHES {
                        bail!(
                            "{topic}-{p}: no records between offset {at} and the last stable \
                             offset {stop} after {n} fetches"
                        );
                    }
                }
            }
        }
    }
}

/// The two topics, as indices into per-side arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    A = 0,
    B = 1,
}

/// How a record's key is found.
enum Keying {
    RecordKey,
    Field(String),
}

/// Value hashes carry their side in the top bit: A's are below 2^127, B's
/// at or above it. One vector per key holds both sides.
const SIDE_BIT: u128 = 1 << 127;

/// 127-bit hashes of record values (two independently keyed SipHashes); a
/// null value hashes apart from an empty one. One hasher serves both sides.
struct ValueHasher {
    h1: RandomState,
    h2: RandomState,
}

impl ValueHasher {
    fn new() -> Self {
        Self {
            h1: RandomState::new(),
            h2: RandomState::new(),
        }
    }

    fn hash(&self, value: Option<&[u8]>, side: Side) -> u128 {
        let one = |s: &RandomState| {
            let mut h = s.build_hasher();
            match value {
                None => h.write_u8(0),
                Some(v) => {
                    h.write_u8(1);
                    h.write(v);
                }
            }
            h.finish()
        };
        let h = (((one(&self.h1) as u128) << 64) | one(&self.h2) as u128) & !SIDE_BIT;
        match side {
            Side::A => h,
            Side::B => h | SIDE_BIT,
        }
    }
}

/// The counts of one side.
#[derive(Default)]
struct SideStats {
    partitions: usize,
    records: u64,
    keys: u64,
    unkeyed: u64,
    /// Where the first unkeyed records are (`partition@offset`).
    unkeyed_at: Vec<String>,
    sums: Vec<Sum>,
}

/// Both topics as read so far.
struct Comparison {
    keying: Keying,
    sum_fields: Vec<String>,
    max_report: usize,
    hasher: ValueHasher,
    /// Key → the hashes of its values in both topics (see [`SIDE_BIT`]).
    by_key: HashMap<Box<[u8]>, Vec<u128>>,
    /// The hashes of unkeyed records' values, both topics.
    unkeyed: Vec<u128>,
    sides: [SideStats; 2],
}

impl Comparison {
    fn new(keying: Keying, sum_fields: &[String], max_report: usize) -> Self {
        let side = || SideStats {
            sums: sum_fields.iter().map(|_| Sum::default()).collect(),
            ..SideStats::default()
        };
        Self {
            keying,
            sum_fields: sum_fields.to_vec(),
            max_report,
            hasher: ValueHasher::new(),
            by_key: HashMap::new(),
            unkeyed: Vec::new(),
            sides: [side(), side()],
        }
    }

    /// Counts one record of `side` from partition `p`.
    fn observe(&mut self, side: Side, p: i32, r: &Record) {
        let value = r.value.as_deref();
        let parsed: Option<Value> = match (&self.keying, self.sum_fields.is_empty()) {
            (Keying::RecordKey, true) => None,
            _ => value.and_then(|v| serde_json::from_slice(v).ok()),
        };
        let object = parsed.as_ref().and_then(Value::as_object);
        let key: Option<Vec<u8>> = match &self.keying {
            Keying::RecordKey => r.key.as_deref().map(<[u8]>::to_vec),
            Keying::Field(f) => object
                .and_then(|o| o.get(f))
                .and_then(|v| serde_json::to_vec(v).ok()),
        };
        let h = self.hasher.hash(value, side);
        let max_report = self.max_report;
        let stats = &mut self.sides[side as usize];
        stats.records += 1;
        match key {
            Some(k) => self.by_key.entry(k.into_boxed_slice()).or_default().push(h),
            None => {
                stats.unkeyed += 1;
                if stats.unkeyed_at.len() < max_report {
                    stats.unkeyed_at.push(format!("{p}@{}", r.offset));
                }
                self.unkeyed.push(h);
            }
        }
        for (field, sum) in self.sum_fields.iter().zip(stats.sums.iter_mut()) {
            match object.and_then(|o| o.get(field)) {
                None => sum.absent += 1,
                Some(v) => match number(v) {
                    Some(n) => sum.add(n),
                    None => {
                        sum.non_numeric += 1;
                        if sum.non_numeric_at.len() < max_report {
                            sum.non_numeric_at.push(format!("{p}@{}", r.offset));
                        }
                    }
                },
            }
        }
    }

    /// The verdict, as a JSON document and as text.
    fn report(&mut self, a: &str, b: &str, window: &Window) -> Report {
        for hashes in self.by_key.values_mut() {
            hashes.sort_unstable();
        }
        self.unkeyed.sort_unstable();
        for hashes in self.by_key.values() {
            let split = hashes.partition_point(|h| h & SIDE_BIT == 0);
            self.sides[0].keys += u64::from(split > 0);
            self.sides[1].keys += u64::from(split < hashes.len());
        }
        self.verdict(a, b, window)
    }

    /// [`Comparison::report`] once every hash vector is sorted.
    fn verdict(&self, a: &str, b: &str, window: &Window) -> Report {
        let found = self.findings();
        Report {
            equal: found.equal,
            json: self.verdict_json(a, b, window, &found),
            text: self.verdict_text(a, b, window, &found),
        }
    }

    /// What differs between the two topics (hash vectors sorted).
    fn findings(&self) -> Findings<'_> {
        let (missing, extra, mismatch) = self.differing_keys();
        let split = self.unkeyed.partition_point(|h| h & SIDE_BIT == 0);
        let (ua, ub) = self.unkeyed.split_at(split);
        let unkeyed_equal = same_values(ua, ub);
        let sums: Vec<(String, &Sum, &Sum, bool)> = self
            .sum_fields
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let (sa, sb) = (&self.sides[0].sums[i], &self.sides[1].sums[i]);
                (f.clone(), sa, sb, sa.same_as(sb))
            })
            .collect();
        let equal = missing.is_empty()
            && extra.is_empty()
            && mismatch.is_empty()
            && unkeyed_equal
            && sums.iter().all(|s| s.3);
        Findings {
            equal,
            keys_total: self.by_key.len(),
            missing: self.examples(missing),
            extra: self.examples(extra),
            mismatch: self.examples(mismatch),
            unkeyed_equal,
            sums,
        }
    }

    /// The keys only in A, only in B, and in both with different values.
    fn differing_keys(&self) -> (Vec<Example<'_>>, Vec<Example<'_>>, Vec<Example<'_>>) {
        let mut missing: Vec<Example> = Vec::new();
        let mut extra: Vec<Example> = Vec::new();
        let mut mismatch: Vec<Example> = Vec::new();
        for (k, hashes) in &self.by_key {
            let split = hashes.partition_point(|h| h & SIDE_BIT == 0);
            let (in_a, in_b) = hashes.split_at(split);
            let ex = || Example {
                key: k,
                a: in_a.len(),
                b: in_b.len(),
            };
            if in_b.is_empty() {
                missing.push(ex());
            } else if in_a.is_empty() {
                extra.push(ex());
            } else if !same_values(in_a, in_b) {
                mismatch.push(ex());
            }
        }
        (missing, extra, mismatch)
    }

    /// How many keys `v` holds, and the first ones in the order of their
    /// bytes (at most `max_report`) as examples.
    fn examples(&self, mut v: Vec<Example>) -> Examples {
        v.sort_unstable_by(|x, y| x.key.cmp(y.key));
        let shown = v
            .iter()
            .take(self.max_report)
            .map(|e| (show_key(&self.keying, e.key), e.a, e.b))
            .collect();
        (v.len(), shown)
    }

    /// The verdict as a JSON document.
    fn verdict_json(&self, a: &str, b: &str, window: &Window, found: &Findings) -> Value {
        let [sa, sb] = &self.sides;
        let examples_json = |v: &[(String, usize, usize)]| -> Value {
            v.iter()
                .map(|(k, na, nb)| json!({ "key": k, "a": na, "b": nb }))
                .collect()
        };
        let side_json = |topic: &str, s: &SideStats| {
            json!({
                "topic": topic,
                "partitions": s.partitions,
                "records": s.records,
                "keys": s.keys,
                "unkeyed": s.unkeyed,
                "unkeyed_examples": s.unkeyed_at,
            })
        };
        let sums_json: serde_json::Map<String, Value> = found
            .sums
            .iter()
            .map(|(f, x, y, eq)| {
                let v = json!({
                    "a": x.json(),
                    "b": y.json(),
                    "difference": y.minus(x),
                    "equal": eq,
                });
                (f.clone(), v)
            })
            .collect();
        let (missing, extra, mismatch) = (&found.missing, &found.extra, &found.mismatch);
        json!({
            "equal": found.equal,
            "a": side_json(a, sa),
            "b": side_json(b, sb),
            "key": match &self.keying {
                Keying::RecordKey => json!({ "record_key": true }),
                Keying::Field(f) => json!({ "field": f }),
            },
            "window": {
                "from": window.from.map(|w| w.json()),
                "to": window.to.map(|w| w.json()),
            },
            "keys": found.keys_total,
            "missing": { "count": missing.0, "examples": examples_json(&missing.1) },
            "extra": { "count": extra.0, "examples": examples_json(&extra.1) },
            "mismatch": { "count": mismatch.0, "examples": examples_json(&mismatch.1) },
            "unkeyed_equal": found.unkeyed_equal,
            "sums": sums_json,
        })
    }

    /// The verdict as text for people.
    fn verdict_text(&self, a: &str, b: &str, window: &Window, found: &Findings) -> String {
        let [sa, sb] = &self.sides;
        let mut t = String::new();
        let width = a.len().max(b.len());
        for (label, topic, s) in [("A", a, sa), ("B", b, sb)] {
            let unkeyed = if s.unkeyed > 0 {
                format!(
                    ", {} unkeyed (at {})",
                    s.unkeyed,
                    positions(s.unkeyed, &s.unkeyed_at)
                )
            } else {
                String::new()
            };
            t += &format!(
                "{label} {topic:<width$}  {}, {}{unkeyed} ({})\n",
                counted(s.records, "record"),
                counted(s.keys, "key"),
                counted(s.partitions as u64, "partition"),
            );
        }
        t += &window_text(window);
        t += &differences_text(found);
        t += &sums_text(&found.sums);
        t
    }
}

/// Keys that differ in one way: how many, and the first few as
/// (key as shown, records in A, records in B).
type Examples = (usize, Vec<(String, usize, usize)>);

/// What [`Comparison::verdict`] found.
struct Findings<'a> {
    /// Both topics hold the same records.
    equal: bool,
    /// Keys in either topic.
    keys_total: usize,
    /// Keys only in A.
    missing: Examples,
    /// Keys only in B.
    extra: Examples,
    /// Keys in both, with different values.
    mismatch: Examples,
    unkeyed_equal: bool,
    /// Per summed field: its sums in A and B, and whether they are equal.
    sums: Vec<(String, &'a Sum, &'a Sum, bool)>,
}

/// The window's line of the text verdict (empty without a window).
fn window_text(window: &Window) -> String {
    if let (Some(f), Some(to)) = (window.from, window.to) {
        format!("window: from {f} to {to} (exclusive)\n")
    } else if let Some(f) = window.from {
        format!("window: from {f}\n")
    } else if let Some(to) = window.to {
        format!("window: up to {to} (exclusive)\n")
    } else {
        String::new()
    }
}

/// The text verdict's "equal" line, or its "DIFFERENT" line and examples.
fn differences_text(found: &Findings) -> String {
    if found.equal {
        return format!(
            "equal: {}, the same values for each\n",
            counted(found.keys_total as u64, "key")
        );
    }
    let mut t = format!(
        "DIFFERENT: {} missing from B, {} extra in B, {} with different values{}\n",
        counted(found.missing.0 as u64, "key"),
        counted(found.extra.0 as u64, "key"),
        counted(found.mismatch.0 as u64, "key"),
        if found.unkeyed_equal {
            ""
        } else {
            ", unkeyed records differ"
        }
    );
    let line = |what: &str, (n, shown): &Examples| {
        if *n == 0 {
            return String::new();
        }
        let ks: Vec<String> = shown
            .iter()
            .map(|(k, na, nb)| format!("{k:?} ({na} in A, {nb} in B)"))
            .collect();
        let more = if *n > shown.len() { ", ..." } else { "" };
        format!("  {what}: {}{more}\n", ks.join(", "))
    };
    t += &line("missing from B", &found.missing);
    t += &line("extra in B", &found.extra);
    t += &line("different values", &found.mismatch);
    t
}

/// The text verdict's lines of the summed fields, with where values were
/// not numbers.
fn sums_text(sums: &[(String, &Sum, &Sum, bool)]) -> String {
    let mut t = String::new();
    for (f, x, y, eq) in sums {
        let diff = if *eq {
            "equal".to_string()
        } else {
            format!("difference B - A = {}", y.minus(x))
        };
        t += &format!("sum {f}: A {}, B {} ({diff})\n", x.shown(), y.shown());
        for (label, s) in [("A", x), ("B", y)] {
            if s.non_numeric > 0 {
                t += &format!(
                    "  {label}: {} of {f} not a number (at {})\n",
                    counted(s.non_numeric, "value"),
                    positions(s.non_numeric, &s.non_numeric_at)
                );
            }
        }
    }
    t
}

/// `n` things: "1 key", "2 keys".
fn counted(n: u64, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// The first of `n` positions (`partition@offset`), and "..." for the rest.
fn positions(n: u64, first: &[String]) -> String {
    match (first.is_empty(), n > first.len() as u64) {
        (true, _) => "...".into(),
        (false, true) => format!("{}, ...", first.join(", ")),
        (false, false) => first.join(", "),
    }
}

/// A key as people read it: the record key as UTF-8, a string field's
/// text, any other field's JSON.
fn show_key(keying: &Keying, k: &[u8]) -> String {
    match keying {
        Keying::RecordKey => String::from_utf8_lossy(k).into_owned(),
        Keying::Field(_) => match serde_json::from_slice::<String>(k) {
            Ok(s) => s,
            Err(_) => String::from_utf8_lossy(k).into_owned(),
        },
    }
}

/// A key that differs, with its record counts in A and B.
struct Example<'a> {
    key: &'a [u8],
    a: usize,
    b: usize,
}

/// What [`Comparison::report`] says.
struct Report {
    equal: bool,
    json: Value,
    text: String,
}

/// Whether two sorted runs of side-tagged hashes hold the same values.
fn same_values(a: &[u128], b: &[u128]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x & !SIDE_BIT == y & !SIDE_BIT)
}

/// The relative tolerance for sums that are not exact.
const FLOAT_TOLERANCE: f64 = 1e-9;

/// The sum of one field over one topic.
struct Sum {
    /// The exact sum; `None` once a number or the sum left the decimals
    /// [`Decimal`] holds (then `float` is the sum).
    exact: Option<Decimal>,
    /// The sum in floating point, always kept.
    float: f64,
    numbers: u64,
    non_numeric: u64,
    /// Where the first non-numeric values are (`partition@offset`).
    non_numeric_at: Vec<String>,
    absent: u64,
}

/// A number found in a JSON value.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Number {
    Exact(Decimal),
    Float(f64),
}

impl Default for Sum {
    fn default() -> Self {
        Sum {
            exact: Some(Decimal::default()),
            float: 0.0,
            numbers: 0,
            non_numeric: 0,
            non_numeric_at: Vec::new(),
            absent: 0,
        }
    }
}

impl Sum {
    fn add(&mut self, n: Number) {
        self.numbers += 1;
        let (exact, float) = match n {
            Number::Exact(d) => (Some(d), d.to_f64()),
            Number::Float(f) => (None, f),
        };
        self.float += float;
        self.exact = match (self.exact, exact) {
            (Some(s), Some(d)) => s.checked_add(d),
            _ => None,
        };
    }

    fn same_as(&self, other: &Sum) -> bool {
        match (self.exact, other.exact) {
            (Some(x), Some(y)) => x == y,
            _ => {
                let (x, y) = (self.float, other.float);
                (x - y).abs() <= FLOAT_TOLERANCE * x.abs().max(y.abs())
            }
        }
    }

    fn shown(&self) -> String {
        match self.exact {
            Some(d) => d.to_string(),
            None => format!("{} (floating point)", self.float),
        }
    }

    /// `self - other`, exact when both are.
    fn minus(&self, other: &Sum) -> String {
        match (self.exact, other.exact) {
            (Some(x), Some(y)) => match y.checked_neg().and_then(|y| x.checked_add(y)) {
                Some(d) => d.to_string(),
                None => (self.float - other.float).to_string(),
            },
            _ => (self.float - other.float).to_string(),
        }
    }

    fn json(&self) -> Value {
        json!({
            "sum": match self.exact {
                Some(d) => d.to_string(),
                None => self.float.to_string(),
            },
            "exact": self.exact.is_some(),
            "numbers": self.numbers,
            "non_numeric": self.non_numeric,
            "non_numeric_examples": self.non_numeric_at,
            "absent": self.absent,
        })
    }
}

/// The number a JSON value holds: a JSON number, or a string that is a
/// decimal number. Integers are exact; a JSON fraction is exact in the
/// shortest decimal that reads back as its double (`12.34` is 12.34).
fn number(v: &Value) -> Option<Number> {
    match v {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(Number::Exact(Decimal::from(i128::from(i))))
            } else if let Some(u) = n.as_u64() {
                Some(Number::Exact(Decimal::from(i128::from(u))))
            } else {
                let f = n.as_f64()?;
                Some(match Decimal::parse(&n.to_string()) {
                    Some(Some(d)) => Number::Exact(d),
                    _ => Number::Float(f),
                })
            }
        }
        Value::String(s) => match Decimal::parse(s)? {
            Some(d) => Some(Number::Exact(d)),
            None => s
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(Number::Float),
        },
        _ => None,
    }
}

/// The most digits after the point a [`Decimal`] keeps.
const MAX_SCALE: u32 = 30;

/// An exact decimal: `units` / 10^`scale`, with no trailing zeros after the
/// point (so equal values are equal structs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Decimal {
    units: i128,
    scale: u32,
}

impl From<i128> for Decimal {
    fn from(units: i128) -> Self {
        Decimal { units, scale: 0 }
    }
}

impl Decimal {
    /// `[-+]digits[.digits][e[-+]digits]`: `None` for anything else,
    /// `Some(None)` for a decimal number too large or too fine to be held.
    fn parse(s: &str) -> Option<Option<Decimal>> {
        let (neg, rest) = match s.as_bytes().first()? {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let (mantissa, exp) = match rest.find(['e', 'E']) {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let frac = frac.trim_end_matches('0');
        let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
        if int.len() + frac.len() == 0 || !digits(int) || !digits(frac) {
            return None;
        }
        let exp: i64 = match exp {
            None => 0,
            Some(e) => {
                let e = e.strip_prefix('+').unwrap_or(e);
                let body = e.strip_prefix('-').unwrap_or(e);
                if body.is_empty() || !digits(body) {
                    return None;
                }
                match e.parse() {
                    Ok(e) => e,
                    Err(_) => return Some(None),
                }
            }
        };
        let mut units: i128 = 0;
        for b in int.bytes().chain(frac.bytes()) {
            units = match units
                .checked_mul(10)
                .and_then(|u| u.checked_add(i128::from(b - b'0')))
            {
                Some(u) => u,
                None => return Some(None),
            };
        }
        if units == 0 {
            return Some(Some(Decimal::default()));
        }
        let mut scale = (frac.len() as i64).saturating_sub(exp);
        while scale < 0 {
            units = match units.checked_mul(10) {
                Some(u) => u,
                None => return Some(None),
            };
            scale += 1;
        }
        while scale > 0 && units % 10 == 0 {
            units /= 10;
            scale -= 1;
        }
        if scale > i64::from(MAX_SCALE) {
            return Some(None);
        }
        let units = if neg { -units } else { units };
        Some(Some(Decimal {
            units,
            scale: scale as u32,
        }))
    }

    /// `units` at `scale` (≥ the own scale), if it fits.
    fn units_at(self, scale: u32) -> Option<i128> {
        10i128
            .checked_pow(scale - self.scale)
            .and_then(|m| self.units.checked_mul(m))
    }

    fn checked_add(self, other: Decimal) -> Option<Decimal> {
        let scale = self.scale.max(other.scale);
        let units = self.units_at(scale)?.checked_add(other.units_at(scale)?)?;
        let mut d = Decimal { units, scale };
        while d.scale > 0 && d.units % 10 == 0 {
            d.units /= 10;
            d.scale -= 1;
        }
        Some(d)
    }

    fn checked_neg(self) -> Option<Decimal> {
        Some(Decimal {
            units: self.units.checked_neg()?,
            scale: self.scale,
        })
    }

    fn to_f64(self) -> f64 {
        // Through the decimal text: the nearest double, not two roundings.
        self.to_string().parse().unwrap_or(f64::NAN)
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.units < 0 { "-" } else { "" };
        let abs = self.units.unsigned_abs();
        if self.scale == 0 {
            return write!(f, "{sign}{abs}");
        }
        let m = 10u128.pow(self.scale);
        write!(
            f,
            "{sign}{}.{:0w$}",
            abs / m,
            abs % m,
            w = self.scale as usize
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> Decimal {
        Decimal::parse(s).unwrap().unwrap()
    }

    #[test]
    fn decimals_parse_exactly() {
        assert_eq!(
            dec("12.34"),
            Decimal {
                units: 1234,
                scale: 2
            }
        );
        assert_eq!(
            dec("-0.50"),
            Decimal {
                units: -5,
                scale: 1
            }
        );
        assert_eq!(dec("+7"), Decimal::from(7));
        assert_eq!(dec("1e3"), Decimal::from(1000));
        assert_eq!(
            dec("1.5E-7"),
            Decimal {
                units: 15,
                scale: 8
            }
        );
        assert_eq!(dec(".5"), Decimal { units: 5, scale: 1 });
        assert_eq!(dec("5."), Decimal::from(5));
        assert_eq!(dec(&format!("1.{}", "0".repeat(60))), Decimal::from(1));
        assert_eq!(dec("0e-999"), Decimal::default());
        for bad in [
            "", "-", "abc", "1.2.3", "1e", "1e+", "0x10", " 1", "1,5", "NaN",
        ] {
            assert_eq!(Decimal::parse(bad), None, "{bad:?}");
        }
        // a decimal, but not one we hold
        assert_eq!(Decimal::parse("1e300"), Some(None));
        assert_eq!(Decimal::parse("1e-40"), Some(None));
    }

    #[test]
    fn decimals_add_and_print_exactly() {
        let s = dec("0.1").checked_add(dec("0.2")).unwrap();
        assert_eq!(s, dec("0.3"));
        assert_eq!(s.to_string(), "0.3");
        assert_eq!(
            dec("12.30").checked_add(dec("0.70")).unwrap().to_string(),
            "13"
        );
        assert_eq!(dec("-1.05").to_string(), "-1.05");
        assert_eq!(dec("0.007").to_string(), "0.007");
        assert_eq!(
            dec("-0.5").checked_add(dec("0.25")).unwrap().to_string(),
            "-0.25"
        );
        let big = Decimal::from(i128::MAX);
        assert_eq!(big.checked_add(Decimal::from(1)), None);
    }

    #[test]
    fn json_numbers_are_read_as_written() {
        let n = |s: &str| number(&serde_json::from_str::<Value>(s).unwrap());
        assert_eq!(n("12.34"), Some(Number::Exact(dec("12.34"))));
        assert_eq!(n("-3"), Some(Number::Exact(Decimal::from(-3))));
        assert_eq!(
            n("18446744073709551615"),
            Some(Number::Exact(Decimal::from(u64::MAX as i128)))
        );
        assert_eq!(n("\"99.99\""), Some(Number::Exact(dec("99.99"))));
        assert_eq!(n("1e300"), Some(Number::Float(1e300)));
        assert_eq!(n("\"twelve\""), None);
        assert_eq!(n("null"), None);
        assert_eq!(n("[1]"), None);
    }

    #[test]
    fn sums_fall_back_to_floating_point_with_a_tolerance() {
        let mut a = Sum::default();
        let mut b = Sum::default();
        for x in ["0.1", "0.2"] {
            a.add(Number::Exact(dec(x)));
        }
        b.add(Number::Exact(dec("0.3")));
        assert!(a.same_as(&b));
        assert_eq!(a.shown(), "0.3");
        b.add(Number::Exact(dec("0.01")));
        assert!(!a.same_as(&b));
        assert_eq!(b.minus(&a), "0.01");
        let mut c = Sum::default();
        c.add(Number::Float(1e300));
        let mut d = Sum::default();
        d.add(Number::Float(1e300 * (1.0 + 1e-12)));
        assert!(c.same_as(&d) && !c.json()["exact"].as_bool().unwrap());
        // no numbers at all: equal, zero
        assert!(Sum::default().same_as(&Sum::default()));
        assert_eq!(Sum::default().shown(), "0");
    }

    #[test]
    fn windows_parse_and_filter_by_time() {
        assert_eq!(Bound::parse("@1000", "--from").unwrap(), Bound::Time(1000));
        assert_eq!(Bound::parse("42", "--from").unwrap(), Bound::Offset(42));
        assert!(Bound::parse("-1", "--from").is_err());
        assert!(Bound::parse("@x", "--to").is_err());
        let w = Window {
            from: Some(Bound::Time(10)),
            to: Some(Bound::Time(20)),
        };
        assert!(!w.holds_time(9) && w.holds_time(10) && w.holds_time(19) && !w.holds_time(20));
        assert!(Window::default().holds_time(-1));
    }

    fn record(key: Option<&str>, value: Option<&str>, offset: i64) -> Record {
        Record {
            transactional: false,
            control: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: kafka_protocol::records::TimestampType::Creation,
            offset,
            sequence: -1,
            timestamp: 0,
            key: key.map(|k| bytes::Bytes::from(k.to_string())),
            value: value.map(|v| bytes::Bytes::from(v.to_string())),
            headers: Default::default(),
            delete_horizon: false,
        }
    }

    #[test]
    fn per_key_multisets_are_compared() {
        let mut c = Comparison::new(Keying::Field("id".into()), &["amount".into()], 10);
        let a = [
            r#"{"id":"o1","amount":1.5}"#,
            r#"{"id":"o2","amount":2}"#,
            r#"{"id":"o3","amount":3}"#,
            r#"{"id":"o4","amount":4}"#,
            r#"not json"#,
        ];
        let b = [
            r#"{"id":"o4","amount":4}"#,
            r#"{"id":"o1","amount":1.5}"#,
            r#"{"id":"o2","amount":2.25}"#,
            r#"{"id":"o4","amount":4}"#,
            r#"{"id":"o5","amount":"x"}"#,
            r#"not json"#,
        ];
        for (i, v) in a.iter().enumerate() {
            c.observe(Side::A, 0, &record(None, Some(v), i as i64));
        }
        for (i, v) in b.iter().enumerate() {
            c.observe(Side::B, 1, &record(None, Some(v), i as i64));
        }
        let r = c.report("a", "b", &Window::default());
        assert!(!r.equal);
        let j = &r.json;
        assert_eq!(j["a"]["records"], 5);
        assert_eq!(j["b"]["keys"], 4);
        assert_eq!(
            j["missing"]["examples"],
            json!([{"key": "o3", "a": 1, "b": 0}])
        );
        assert_eq!(
            j["extra"]["examples"],
            json!([{"key": "o5", "a": 0, "b": 1}])
        );
        assert_eq!(
            j["mismatch"]["examples"],
            json!([{"key": "o2", "a": 1, "b": 1}, {"key": "o4", "a": 1, "b": 2}])
        );
        assert_eq!(j["unkeyed_equal"], true);
        assert_eq!(j["a"]["unkeyed_examples"], json!(["0@4"]));
        let s = &j["sums"]["amount"];
        assert_eq!(
            (&s["a"]["sum"], &s["b"]["sum"]),
            (&json!("10.5"), &json!("11.75"))
        );
        assert_eq!(s["difference"], "1.25");
        assert_eq!(s["b"]["non_numeric"], 1);
        assert_eq!(s["a"]["absent"], 1);
        assert!(r
            .text
            .contains("different values: \"o2\" (1 in A, 1 in B), \"o4\" (1 in A, 2 in B)"));
    }

    #[test]
    fn equal_topics_in_any_order_are_equal() {
        let mut c = Comparison::new(Keying::RecordKey, &[], 1);
        for (side, order) in [(Side::A, [0, 1, 2]), (Side::B, [2, 0, 1])] {
            for i in order {
                let v = format!("v{i}");
                c.observe(side, 0, &record(Some("k"), Some(&v), i));
                c.observe(side, 0, &record(None, None, i));
            }
        }
        let r = c.report("a", "b", &Window::default());
        assert!(r.equal, "{}", r.text);
        assert_eq!(r.json["keys"], 1);
        assert_eq!(r.json["a"]["unkeyed"], 3);
        // a null value is not an empty one
        let mut c = Comparison::new(Keying::RecordKey, &[], 1);
        c.observe(Side::A, 0, &record(Some("k"), None, 0));
        c.observe(Side::B, 0, &record(Some("k"), Some(""), 0));
        assert!(!c.report("a", "b", &Window::default()).equal);
    }
}
