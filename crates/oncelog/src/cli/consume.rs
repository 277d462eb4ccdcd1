//! `oncelog consume`: records to stdout, from an offset or a time,
//! read_committed by default, optionally following and committing a
//! standalone group's offsets. Fetching and decoding are the client crate's.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::records::Record;
use oncelog_broker::now_ms;
use oncelog_client::admin::{holding_transaction, TxnHolder};
use oncelog_client::consumer::{
    commit_group, committed_offsets, decode_partition, fetch, list_offsets, AbortedTxns, EARLIEST,
    LATEST,
};
use oncelog_client::{check, Cluster, Leaders, ResponseError};

use super::format::{write_record, FORMATS};
use super::progress::Progress;

#[derive(clap::Args)]
pub struct ConsumeArgs {
    /// Topic to read.
    pub topic: String,
    /// Only this partition (default: all).
    #[arg(long, short = 'p')]
    pub partition: Option<i32>,
    /// Where to start: earliest (or beginning, start), latest (or end), an
    /// offset (one past the end waits there), -N (N records before the end)
    /// or @TIMESTAMP_MS. `-o` as kcat's.
    #[arg(
        long,
        short = 'o',
        default_value = "earliest",
        allow_hyphen_values = true,
        value_name = "POSITION"
    )]
    pub from: String,
    /// The same as --from earliest (kafka-console-consumer's flag).
    #[arg(long, conflicts_with = "from")]
    pub from_beginning: bool,
    /// read_committed (the default) or read_uncommitted.
    #[arg(long, default_value = "read_committed")]
    pub isolation: String,
    /// Start at this group's committed offsets where it has them, and commit
    /// the position reached at the end, on Ctrl-C/SIGTERM and every 5 s
    /// while following (a standalone consumer, no membership).
    #[arg(long, short = 'g')]
    pub group: Option<String>,
    /// Stop after this many records (also kcat's `-c`, `--count`, rpk's `--num`).
    #[arg(
        long,
        short = 'n',
        short_alias = 'c',
        aliases = ["count", "num"],
        value_name = "N"
    )]
    pub max_messages: Option<u64>,
    /// Keep waiting for new records (until Ctrl-C or SIGTERM) instead of
    /// stopping at the end (the last stable offset for read_committed) seen
    /// at the start.
    #[arg(long)]
    pub follow: bool,
    /// Stop after this many milliseconds in any case.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// value (one per line), kv (key TAB value), json (one object per line),
    /// hex or base64 (the value encoded, one per line: safe for binary data).
    #[arg(long, default_value = "value")]
    pub format: String,
    /// Report progress on stderr every second (on by default when stderr is
    /// a terminal and stdout is not).
    #[arg(long)]
    pub progress: bool,
}

/// Where `--from` starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    Earliest,
    Latest,
    /// The first offset at or after this time (ms since the epoch).
    Time(i64),
    /// An offset; a negative one counts back from the end.
    Offset(i64),
}

impl Position {
    /// `earliest`, `beginning` or `start`; `latest` or `end`; an offset;
    /// `-N`; `@TIMESTAMP_MS` (or kcat's `s@TIMESTAMP_MS`).
    fn parse(s: &str) -> Result<Self> {
        Ok(match s.trim() {
            "earliest" | "beginning" | "start" => Self::Earliest,
            "latest" | "end" => Self::Latest,
            x if x.starts_with('@') || x.starts_with("s@") => {
                let ts = x.strip_prefix('s').unwrap_or(x);
                let ts = ts.strip_prefix('@').unwrap_or(ts);
                Self::Time(ts.parse().map_err(|_| {
                    anyhow!("--from @TIMESTAMP_MS: {ts:?} is not a time in ms since the epoch")
                })?)
            }
            x => Self::Offset(x.parse().map_err(|_| {
                anyhow!(
                    "--from must be earliest (or beginning, start), latest (or end), an \
                     offset, -N or @TIMESTAMP_MS, not {x:?}"
                )
            })?),
        })
    }
}

/// The name of the signal (SIGINT or SIGTERM) that asked a run to stop, once one has.
#[derive(Clone, Default)]
struct StopFlag(std::sync::Arc<std::sync::Mutex<Option<&'static str>>>);

impl StopFlag {
    /// Watches SIGINT and SIGTERM from now on (instead of dying of them).
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let flag = Self::default();
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let f = flag.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            };
            if let Ok(mut g) = f.0.lock() {
                *g = Some(name);
            }
        });
        Ok(flag)
    }

    fn get(&self) -> Option<&'static str> {
        self.0.lock().ok().and_then(|g| *g)
    }
}

/// Which open transaction holds `topic`-`p` back at the last stable offset
/// `lso`: the partition's producers (DescribeProducers), and the coordinators'
/// transactions (ListTransactions, DescribeTransactions) for its
/// transactional id. Best effort: a failure becomes part of the sentence.
async fn txn_holding(c: &mut Cluster, leader: i32, topic: &str, p: i32, lso: i64) -> String {
    match holding_transaction(c, leader, topic, p, lso).await {
        Ok(h) => holder_sentence(&h, now_ms()),
        Err(e) => format!(
            "an open transaction (which one could not be told: {:#})",
            anyhow::Error::from(e)
        ),
    }
}

/// What holds a partition back, as the end of a sentence; `now` (ms since
/// the epoch) tells the transaction's age.
fn holder_sentence(h: &TxnHolder, now: i64) -> String {
    match h {
        TxnHolder::Ended => "an open transaction that has ended since (read again to see its \
                             records if it committed)"
            .into(),
        TxnHolder::Open {
            producer_id: pid,
            epoch,
            first_offset: first,
            transactional_id: Some(tid),
            start_time_ms,
        } => {
            let age = match start_time_ms {
                Some(t) => format!(", open for {:.1} s", (now - t).max(0) as f64 / 1000.0),
                None => String::new(),
            };
            format!(
                "the open transaction of transactional id {tid:?} (producer id {pid}, epoch \
                 {epoch}, first offset {first}{age})"
            )
        }
        TxnHolder::Open {
            producer_id: pid,
            epoch,
            first_offset: first,
            transactional_id: None,
            ..
        } => format!(
            "the open transaction of producer id {pid} (epoch {epoch}, first offset {first}; \
             no coordinator names its transactional id: see `oncelog txn find-hanging`)"
        ),
    }
}

/// Moves a start position into the log: before its start to the start,
/// past its end to the end (never back to the start). Says so on stderr.
fn clamp_position(
    topic: &str,
    p: i32,
    o: i64,
    start: i64,
    end: i64,
    follow: bool,
    why: &str,
) -> i64 {
    if o > end {
        let then = if follow {
            "waiting there for new records"
        } else {
            "nothing to read (--follow waits there)"
        };
        eprintln!("{topic}-{p}: {why} {o} is past the end of the log ({end}); {then}");
        end
    } else if o < start {
        eprintln!(
            "{topic}-{p}: {why} {o} is before the log start ({start}: older records were deleted); starting at {start}"
        );
        start
    } else {
        o
    }
}

/// Where each partition starts: the group's committed offset, else
/// `--from`, kept inside the log (`starts`, `hws`: each partition's log
/// start and high watermark).
async fn start_positions(
    c: &mut Cluster,
    a: &ConsumeArgs,
    parts: &[i32],
    from: Position,
    committed_only: bool,
    starts: &BTreeMap<i32, i64>,
    hws: &BTreeMap<i32, i64>,
) -> Result<BTreeMap<i32, i64>> {
    let topic = &a.topic;
    let start_of = |p: &i32| starts.get(p).copied().unwrap_or(0);
    let hw_of = |p: &i32| hws.get(p).copied().unwrap_or(0);
    // Start positions: the group's committed offsets, else --from.
    let mut pos: BTreeMap<i32, i64> = match from {
        Position::Earliest => starts.clone(),
        Position::Latest => {
            list_offsets(c.bootstrap(), topic, parts, LATEST, committed_only).await?
        }
        Position::Time(ts) => {
            let found = list_offsets(c.bootstrap(), topic, parts, ts, false).await?;
            found
                .into_iter()
                .map(|(p, o)| (p, if o < 0 { hw_of(&p) } else { o }))
                .collect()
        }
        Position::Offset(o) => parts
            .iter()
            .map(|p| {
                let o = if o < 0 {
                    (hw_of(p) + o).max(start_of(p))
                } else {
                    clamp_position(topic, *p, o, start_of(p), hw_of(p), a.follow, "offset")
                };
                (*p, o)
            })
            .collect(),
    };
    if let Some(g) = &a.group {
        for (pi, committed) in committed_offsets(c, g, topic, parts).await? {
            let o = clamp_position(
                topic,
                pi,
                committed,
                start_of(&pi),
                hw_of(&pi),
                a.follow,
                &format!("group {g}'s committed offset"),
            );
            pos.insert(pi, o);
        }
    }
    Ok(pos)
}

/// A run that stopped at the last stable offset with the high watermark
/// beyond it: records are held back by an open transaction; says which.
#[allow(clippy::too_many_arguments)]
async fn say_held_back(
    c: &mut Cluster,
    topic: &str,
    parts: &[i32],
    leaders: &BTreeMap<i32, i32>,
    ends: &BTreeMap<i32, i64>,
    hws: &BTreeMap<i32, i64>,
    done: &BTreeSet<i32>,
    pos: &BTreeMap<i32, i64>,
) {
    for p in parts {
        let (lso, hw) = (
            ends.get(p).copied().unwrap_or(0),
            hws.get(p).copied().unwrap_or(0),
        );
        if done.contains(p) && lso < hw && pos.get(p).copied().unwrap_or(0) >= lso {
            let who = txn_holding(c, *leaders.get(p).unwrap_or(&-1), topic, *p, lso).await;
            eprintln!(
                "{topic}-{p}: stopped at the last stable offset {lso} (read_committed); \
                 the high watermark is {hw}: {} offsets are held back by {who}",
                hw - lso
            );
        }
    }
}

/// `--follow` behind an open transaction: says which, once it has held
/// partition `p` for two seconds (`held`: per partition, the last stable
/// offset it waits at, since when, and whether that was said).
async fn say_waiting(
    c: &mut Cluster,
    held: &mut HashMap<i32, (i64, Instant, bool)>,
    (leader, topic, p): (i32, &str, i32),
    pd: &PartitionData,
    at: i64,
) {
    let lso = pd.last_stable_offset;
    if !(lso >= 0 && lso < pd.high_watermark && at >= lso) {
        held.remove(&p);
        return;
    }
    let h = held.entry(p).or_insert((lso, Instant::now(), false));
    if h.0 != lso {
        *h = (lso, Instant::now(), false);
    }
    if !h.2 && h.1.elapsed() >= Duration::from_secs(2) {
        h.2 = true;
        let hw = pd.high_watermark;
        let who = txn_holding(c, leader, topic, p, lso).await;
        eprintln!(
            "{topic}-{p}: waiting at the last stable offset {lso} (read_committed); \
             the high watermark is {hw}: {} offsets are held back by {who}",
            hw - lso
        );
    }
}

/// Checks `--format`, and reads `--isolation` (true: read_committed) and
/// where to start.
fn read_mode(a: &ConsumeArgs) -> Result<(bool, Position)> {
    if !FORMATS.contains(&a.format.as_str()) {
        bail!("--format must be one of {}", FORMATS.join(", "));
    }
    let committed_only = match a.isolation.as_str() {
        "read_committed" => true,
        "read_uncommitted" => false,
        other => bail!("--isolation must be read_committed or read_uncommitted, not {other}"),
    };
    let from = if a.from_beginning {
        Position::Earliest
    } else {
        Position::parse(&a.from)?
    };
    Ok((committed_only, from))
}

/// Whether writing to stdout failed because its reader went away.
fn broken_pipe(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

pub async fn consume(bootstrap: &str, a: ConsumeArgs) -> Result<()> {
    let (committed_only, from) = read_mode(&a)?;
    let deadline = a
        .timeout_ms
        .map(|t| Instant::now() + Duration::from_millis(t));
    let mut c = Cluster::connect(bootstrap).await?;
    let leaders = c.leaders(&a.topic, false).await?;
    let parts: Vec<i32> = match a.partition {
        Some(p) if leaders.contains_key(&p) => vec![p],
        Some(p) => bail!("{} has no partition {p}", a.topic),
        None => leaders.keys().copied().collect(),
    };
    let topic = a.topic.clone();
    let starts = list_offsets(c.bootstrap(), &topic, &parts, EARLIEST, false).await?;
    let hws = list_offsets(c.bootstrap(), &topic, &parts, LATEST, false).await?;
    let pos = start_positions(&mut c, &a, &parts, from, committed_only, &starts, &hws).await?;
    // The end for a run without --follow: the last stable offset (read_committed)
    // or the high watermark, as they are now.
    let ends = if committed_only {
        list_offsets(c.bootstrap(), &topic, &parts, LATEST, true).await?
    } else {
        hws.clone()
    };
    let stop = StopFlag::install()?;
    let stdout = std::io::stdout();
    let to_terminal = stdout.is_terminal();
    // A terminal or a pipe that is followed sees every record at once;
    // otherwise records are flushed after each fetched batch (before any wait).
    let flush_each = to_terminal || a.follow;
    let progress = Progress::new(a.progress, !to_terminal, "consumed");
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut r = Reader {
        a: &a,
        committed_only,
        c,
        parts,
        leaders,
        hws,
        ends,
        stop,
        deadline,
        flush_each,
        limit: a.max_messages.unwrap_or(u64::MAX),
        progress,
        committed_pos: pos.clone(),
        pos,
        done: BTreeSet::new(),
        aborted: HashMap::new(),
        held: HashMap::new(),
        count: 0,
        stopped_by: None,
        stdout_closed: false,
        last_commit: Instant::now(),
    };
    r.run(&mut out).await?;
    match out.flush() {
        Ok(()) => {}
        Err(e) if broken_pipe(&e) => r.stdout_closed = true,
        Err(e) => return Err(e).context("writing to stdout"),
    }
    drop(out);
    r.finish().await
}

/// A consume run while it reads, and what it reached.
struct Reader<'a> {
    a: &'a ConsumeArgs,
    /// read_committed.
    committed_only: bool,
    c: Cluster,
    /// The partitions read.
    parts: Vec<i32>,
    leaders: Leaders,
    /// Each partition's high watermark at the start.
    hws: BTreeMap<i32, i64>,
    /// Where a run without --follow stops, per partition.
    ends: BTreeMap<i32, i64>,
    stop: StopFlag,
    deadline: Option<Instant>,
    /// Flush stdout after every record.
    flush_each: bool,
    /// The most records to write.
    limit: u64,
    progress: Progress,
    /// Each partition's next offset to read.
    pos: BTreeMap<i32, i64>,
    /// The partitions read up to their end (without --follow).
    done: BTreeSet<i32>,
    aborted: HashMap<i32, AbortedTxns>,
    /// --follow: per partition, the last stable offset it waits at behind a
    /// higher high watermark, since when, and whether that was reported.
    held: HashMap<i32, (i64, Instant, bool)>,
    /// Records written.
    count: u64,
    /// The signal that stopped the run, if one did.
    stopped_by: Option<&'static str>,
    stdout_closed: bool,
    /// The positions last committed for the group, and when.
    committed_pos: BTreeMap<i32, i64>,
    last_commit: Instant,
}

impl Reader<'_> {
    /// Writes records to `out` until the limit, the deadline, a signal, the
    /// end (without --follow) or a closed stdout.
    async fn run(&mut self, out: &mut impl Write) -> Result<()> {
        while self.count < self.limit {
            if let Some(sig) = self.stop.get() {
                self.stopped_by = Some(sig);
                break;
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            if !self.a.follow && self.all_done() {
                break;
            }
            self.commit_periodically().await;
            for (leader, positions) in self.by_leader() {
                if self.fetch_from(out, leader, &positions).await?.is_break() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Marks the partitions read up to their end; true once all are.
    fn all_done(&mut self) -> bool {
        for p in &self.parts {
            if self.pos.get(p).copied().unwrap_or(0) >= self.ends.get(p).copied().unwrap_or(0) {
                self.done.insert(*p);
            }
        }
        self.done.len() == self.parts.len()
    }

    /// With --group and --follow: commits the position reached when it
    /// moved, at most every 5 s.
    async fn commit_periodically(&mut self) {
        let a = self.a;
        let (Some(g), true) = (&a.group, a.follow) else {
            return;
        };
        if self.pos != self.committed_pos && self.last_commit.elapsed() >= Duration::from_secs(5) {
            // A failed periodic commit is retried at the next one and
            // at the end; the run goes on.
            match commit_group(&mut self.c, g, &a.topic, &self.pos).await {
                Ok(()) => self.committed_pos = self.pos.clone(),
                Err(e) => eprintln!(
                    "warning: periodic commit of group {g}: {:#}",
                    anyhow::Error::from(e)
                ),
            }
            self.last_commit = Instant::now();
        }
    }

    /// The partitions still to read, with their positions, by leader.
    fn by_leader(&self) -> BTreeMap<i32, Vec<(i32, i64)>> {
        let mut by_leader: BTreeMap<i32, Vec<(i32, i64)>> = BTreeMap::new();
        for p in self.parts.iter().filter(|p| !self.done.contains(p)) {
            by_leader
                .entry(*self.leaders.get(p).unwrap_or(&-1))
                .or_default()
                .push((*p, self.pos.get(p).copied().unwrap_or(0)));
        }
        by_leader
    }

    /// Fetches `positions` from `leader` and writes what came back.
    /// `Break`: the run stops (the limit is reached or stdout closed).
    async fn fetch_from(
        &mut self,
        out: &mut impl Write,
        leader: i32,
        positions: &[(i32, i64)],
    ) -> Result<ControlFlow<()>> {
        let a = self.a;
        let r = fetch(
            &mut self.c,
            leader,
            &a.topic,
            positions,
            self.committed_only,
        )
        .await?;
        for t in &r.responses {
            for pd in &t.partitions {
                if self.read_partition(out, leader, pd).await?.is_break() {
                    return Ok(ControlFlow::Break(()));
                }
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Decodes and writes one partition's fetched records, moving its
    /// position. `Break`: the run stops.
    async fn read_partition(
        &mut self,
        out: &mut impl Write,
        leader: i32,
        pd: &PartitionData,
    ) -> Result<ControlFlow<()>> {
        let a = self.a;
        let topic = &a.topic;
        let p = pd.partition_index;
        let at = self.pos.get(&p).copied().unwrap_or(0);
        if pd.error_code == ResponseError::OffsetOutOfRange.code() {
            self.out_of_range(p, at).await?;
            return Ok(ControlFlow::Continue(()));
        }
        check(pd.error_code, &format!("fetch {topic}-{p}"))?;
        let (recs, next) = decode_partition(
            pd,
            at,
            self.committed_only,
            self.aborted.entry(p).or_default(),
        )?;
        self.pos.insert(p, next.max(at));
        if self.write_records(out, p, &recs)?.is_break() {
            return Ok(ControlFlow::Break(()));
        }
        self.progress.tick(self.count);
        if a.follow && self.committed_only {
            let at = self.pos.get(&p).copied().unwrap_or(0);
            say_waiting(&mut self.c, &mut self.held, (leader, topic, p), pd, at).await;
        }
        Ok(ControlFlow::Continue(()))
    }

    /// A fetch of `p` at `at` was out of range: moves the position into the
    /// log, never back to its start from past its end.
    async fn out_of_range(&mut self, p: i32, at: i64) -> Result<()> {
        let topic = &self.a.topic;
        let s0 = list_offsets(self.c.bootstrap(), topic, &[p], EARLIEST, false).await?;
        let e0 = list_offsets(self.c.bootstrap(), topic, &[p], LATEST, false).await?;
        let (s0, e0) = (
            s0.get(&p).copied().unwrap_or(0),
            e0.get(&p).copied().unwrap_or(0),
        );
        let to = clamp_position(topic, p, at, s0, e0, self.a.follow, "offset");
        if to == at {
            // in range again by now (retention or a write raced the answer)
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.pos.insert(p, to);
        Ok(())
    }

    /// Writes partition `p`'s records up to the limit, then flushes.
    /// `Break`: the limit is reached (the position stays at the first
    /// record not written) or stdout was closed.
    fn write_records(
        &mut self,
        out: &mut impl Write,
        p: i32,
        recs: &[Record],
    ) -> Result<ControlFlow<()>> {
        for r in recs {
            if self.count >= self.limit {
                self.pos.insert(p, r.offset);
                return Ok(ControlFlow::Break(()));
            }
            let written = write_record(out, &self.a.format, &self.a.topic, p, r).and_then(|()| {
                if self.flush_each {
                    out.flush()
                } else {
                    Ok(())
                }
            });
            match written {
                Ok(()) => {}
                Err(e) if broken_pipe(&e) => {
                    self.stdout_closed = true;
                    return Ok(ControlFlow::Break(()));
                }
                Err(e) => return Err(e).context("writing to stdout"),
            }
            self.count += 1;
        }
        match out.flush() {
            Ok(()) => {}
            Err(e) if broken_pipe(&e) => {
                self.stdout_closed = true;
                return Ok(ControlFlow::Break(()));
            }
            Err(e) => return Err(e).context("writing to stdout"),
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Once stdout is flushed: says how the run ended and commits the
    /// group's offsets (unless stdout was closed).
    async fn finish(mut self) -> Result<()> {
        let a = self.a;
        let topic = &a.topic;
        self.progress.done();
        if self.committed_only && !a.follow && self.stopped_by.is_none() && !self.stdout_closed {
            say_held_back(
                &mut self.c,
                topic,
                &self.parts,
                &self.leaders,
                &self.ends,
                &self.hws,
                &self.done,
                &self.pos,
            )
            .await;
        }
        if let Some(sig) = self.stopped_by {
            eprintln!("interrupted ({sig})");
        }
        let count = self.count;
        if self.stdout_closed {
            eprintln!(
                "stdout was closed after {count} records{}",
                if a.group.is_some() {
                    "; offsets not committed"
                } else {
                    ""
                }
            );
            return Ok(());
        }
        eprintln!("consumed {count} records from {topic}");
        if let Some(g) = &a.group {
            commit_group(&mut self.c, g, topic, &self.pos).await?;
            let at: Vec<String> = self
                .pos
                .iter()
                .map(|(p, o)| format!("{topic}-{p} at {o}"))
                .collect();
            eprintln!("committed group {g}: {}", at.join(", "));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_take_the_kafka_tools_names() {
        for (arg, want) in [
            ("earliest", Position::Earliest),
            ("beginning", Position::Earliest),
            ("start", Position::Earliest),
            ("latest", Position::Latest),
            ("end", Position::Latest),
            ("42", Position::Offset(42)),
            ("-5", Position::Offset(-5)),
            ("@1700000000000", Position::Time(1_700_000_000_000)),
            ("s@1700000000000", Position::Time(1_700_000_000_000)),
        ] {
            assert_eq!(Position::parse(arg).unwrap(), want, "{arg}");
        }
        for bad in ["", "first", "@", "@@5", "@soon", "s@x", "1.5"] {
            let e = Position::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("--from"), "{bad}: {e}");
        }
    }

    #[test]
    fn start_positions_stay_in_the_log() {
        assert_eq!(clamp_position("t", 0, 10, 0, 2, true, "offset"), 2);
        assert_eq!(clamp_position("t", 0, 1, 3, 9, false, "offset"), 3);
        assert_eq!(clamp_position("t", 0, 5, 3, 9, false, "offset"), 5);
        assert_eq!(clamp_position("t", 0, 9, 3, 9, false, "offset"), 9);
    }

    #[test]
    fn the_holder_of_a_partition_is_named() {
        assert_eq!(
            holder_sentence(&TxnHolder::Ended, 0),
            "an open transaction that has ended since (read again to see its records if it \
             committed)"
        );
        let open = |tid: Option<&str>, start: Option<i64>| TxnHolder::Open {
            producer_id: 4,
            epoch: 2,
            first_offset: 10,
            transactional_id: tid.map(str::to_string),
            start_time_ms: start,
        };
        assert_eq!(
            holder_sentence(&open(Some("job-1"), Some(1_000)), 3_500),
            "the open transaction of transactional id \"job-1\" (producer id 4, epoch 2, \
             first offset 10, open for 2.5 s)"
        );
        assert_eq!(
            holder_sentence(&open(Some("job-1"), None), 3_500),
            "the open transaction of transactional id \"job-1\" (producer id 4, epoch 2, \
             first offset 10)"
        );
        assert_eq!(
            holder_sentence(&open(None, None), 3_500),
            "the open transaction of producer id 4 (epoch 2, first offset 10; no coordinator \
             names its transactional id: see `oncelog txn find-hanging`)"
        );
    }
}
