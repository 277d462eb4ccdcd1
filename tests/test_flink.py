"""Real Apache Flink (2.2, flink-connector-kafka 5.0.0-2.2) writing through
KafkaSink with DeliveryGuarantee.EXACTLY_ONCE into oncelog: the exactly-once
acceptance of the seed stories' Flink job (SCENARIOS.md S9, S10).

tests/flink/OrdersEnrichJob.java runs, in a MiniCluster inside one JVM, a
KafkaSource (read_committed) on `orders` -> a map adding "amount_eur" and
"enriched" -> KafkaSink(EXACTLY_ONCE, transactional-id prefix given per run)
into `orders_enriched`, with exactly-once checkpoints every second or two
kept on disk (a new JVM restores from the latest one, or from a savepoint).
The driver speaks a line protocol on stdout/stdin (CHECKPOINT n, SAVEPOINT
path, STATUS s; `savepoint DIR`, `quit`); Flink's own logging goes to a log
file per job, which the tests read. A TaskManager that dies of a fatal
error is replaced inside the JVM, as a supervisor restarts a TaskManager
process. A feeder produces N orders (keyed "o-000123", value {"order_id",
"amount" in integer cents}) at a steady rate with an idempotent producer,
so the job always has work in flight. The check reads the output
read_committed with librdkafka: every order id exactly once and the sum of
amounts equal to the input's.

What each test proves:

(a) test_kill9_flink_and_broker_exactly_once: kill -9 of the broker while
    Flink runs (Flink's own restart strategy rides it out), then kill -9 of
    the Flink JVM right after a checkpoint committed, kill -9 of the broker
    again, and both restarted, Flink in a new JVM from the latest retained
    checkpoint. The output is the input exactly once.
(c) test_recommit_after_restore_logs_no_committer_error: in that same run,
    the restored job re-commits the transactions of the checkpoint it
    restored, which the broker had already committed before the kill (the
    test checks that they were, and that the re-commit happened). Flink
    treats PRODUCER_FENCED there as data loss and logs an ERROR from
    KafkaCommitter; the broker must answer success, so there must be none.
(b) test_job_down_longer_than_transaction_timeout[abort|park] (S9): the
    broker's test fault `end-txn-unavailable:PREFIX` makes every EndTxn
    commit of the job answer COORDINATOR_LOAD_IN_PROGRESS, so a checkpoint
    completes but its transactions stay open. The Flink JVM is killed, the
    broker restarted without the fault, and Flink comes back only after the
    transaction timeout (10 s). Without a park policy the broker aborts the
    transactions at their timeout, as Kafka does: the restored job's commit
    is refused, Flink logs the loss, and the output misses those orders
    (asserted: the loss is visible, nothing is doubled). With
    `transaction.two.phase.commit.prefixes=PREFIX` the transactions are
    parked instead (shown by `oncelog txn list` while Flink is down), the
    restored job commits them, and the output is exact. The park case runs
    against one broker and against three `--cluster` brokers (all killed
    and restarted together, the coordinator's state in PostgreSQL).
(d) test_blue_green_cutover_exactly_once (S10): blue (prefix orders-sink,
    the topic's configured writer) runs while orders flow. Right after one
    of blue's checkpoints, once each subtask's current transaction has
    written, `oncelog cutover start` freezes blue and a savepoint of blue is
    taken at once, blue still running: the savepoint pre-commits those
    transactions (a freeze lets them end) and green, restored from it,
    commits them, as Flink commits a restored checkpoint's transactions.
    Blue's next transaction is refused with an error naming the cut-over, and
    blue fails loudly, again after each restart: restored from its own last
    checkpoint, blue would abort the savepoint's transactions as lingering
    ones (InitProducerId on their ids); while the cut-over drains that is
    refused, and their timeout does not abort them either, so they wait for
    green's committer. (Flink's connector answers a fatal producer error by
    failing its TaskManager: aborting a producer in a fatal state while the
    writer closes throws; the driver starts a new TaskManager, as a
    supervisor would.) Green (prefix orders-green)
    starts from the savepoint, `oncelog cutover status` reports the switch,
    and downstream every order is counted exactly once: nothing doubled,
    nothing lost.
(e) test_shadow_topic_diff: blue into orders_enriched and green into
    orders_shadow from the same start; `oncelog diff --key order_id --sum
    amount` reports them equal (exit 0), then reports a planted extra record
    and a changed amount in the shadow (exit 1).

The jars are fetched by test.sh into .tools/flink-lib with
`mvn -f tests/flink/pom.xml dependency:copy-dependencies`; the fixture runs
the same command if they are missing, then compiles the job with javac once
per module. One Flink JVM runs at a time except in (d), where blue and green
overlap by design.
"""

import json
import re
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from clients import cli, create_topic, verify_report
from conftest import REPO_ROOT, _die_with_parent, wait_until
from jvm import compile_against

FLINK_DIR = REPO_ROOT / "tests" / "flink"
LIB_DIR = REPO_ROOT / ".tools" / "flink-lib"
FLINK_HEAP = "512m"
PARTITIONS = 2                 # of orders and of the outputs; also the job's parallelism
GROUP = "orders-enrich"
BLUE, GREEN = "orders-sink", "orders-green"

# Flink's own logging (slf4j-simple, to stderr = the job's log file). The
# committer logs each commit at DEBUG ("Committing Kafka transaction <id>"),
# which (c) uses to see the re-commit happen.
LOG_PROPS = {
    "org.slf4j.simpleLogger.defaultLogLevel": "info",
    "org.slf4j.simpleLogger.showDateTime": "true",
    "org.slf4j.simpleLogger.dateTimeFormat": "HH:mm:ss.SSS",
    "org.slf4j.simpleLogger.log.org.apache.flink.connector.kafka.sink.internal.KafkaCommitter": "debug",
    "org.slf4j.simpleLogger.log.org.apache.kafka.clients.producer.ProducerConfig": "warn",
    "org.slf4j.simpleLogger.log.org.apache.kafka.clients.consumer.ConsumerConfig": "warn",
    "org.slf4j.simpleLogger.log.org.apache.kafka.clients.admin.AdminClientConfig": "warn",
    "org.slf4j.simpleLogger.log.org.apache.kafka.common.utils.AppInfoParser": "warn",
    "org.slf4j.simpleLogger.log.org.apache.flink.metrics.MetricGroup": "error",
}
COMMITTER = "org.apache.flink.connector.kafka.sink.internal.KafkaCommitter"
COMMITTER_ERROR = re.compile(r"\bERROR " + re.escape(COMMITTER) + r"\b")


# ------------------------------------------------------------------ the job

@pytest.fixture(scope="module")
def flink_classpath(tmp_path_factory):
    return compile_against(tmp_path_factory, FLINK_DIR, LIB_DIR, "flink-connector-kafka-", "flink-classes")


class FlinkJob:
    """One Flink JVM at a time for one logical job (its checkpoint dir and
    log survive restarts). Reads the driver's protocol lines from stdout;
    Flink's log (stderr) is appended to `log_path` with a marker per run."""

    def __init__(self, classpath, workdir, name, bootstrap, prefix, output="orders_enriched",
                 group=GROUP, interval_ms=1000, txn_timeout_ms=60000, extra=None):
        self.classpath = classpath
        self.name = name
        self.dir = Path(workdir) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir = self.dir / "checkpoints"
        self.log_path = self.dir / "flink.log"
        self.args = {
            "bootstrap": bootstrap, "input": "orders", "output": output, "prefix": prefix,
            "group": group, "checkpoint-dir": str(self.checkpoint_dir),
            "interval-ms": interval_ms, "txn-timeout-ms": txn_timeout_ms,
            "parallelism": PARTITIONS,
        }
        self.args.update(extra or {})
        self.proc = None
        self.runs = 0
        self.run_offset = 0
        self.lines = []           # (run, monotonic time, line) of every run
        self.cond = threading.Condition()

    def argv(self, restore):
        props = [f"-D{k}={v}" for k, v in LOG_PROPS.items()]
        args = [f"{k}={v}" for k, v in self.args.items()]
        if restore:
            args.append(f"restore={restore}")
        return (["java", f"-Xmx{FLINK_HEAP}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
                + props + ["-cp", self.classpath, "OrdersEnrichJob"] + args)

    def start(self, restore=None):
        assert not self.alive, f"{self.name} already running"
        self.runs += 1
        argv = self.argv(restore)
        with open(self.log_path, "ab") as log:
            log.write(f"==== test harness: {self.name} start #{self.runs}"
                      f"{' from ' + str(restore) if restore else ''}\n".encode())
            log.flush()
            self.run_offset = log.tell()
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, cwd=str(self.dir), preexec_fn=_die_with_parent)
        threading.Thread(target=self._read, args=(self.proc, self.runs),
                         name=f"{self.name}-stdout", daemon=True).start()
        return self

    def _read(self, proc, run):
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self.cond:
                self.lines.append((run, time.monotonic(), line))
                self.cond.notify_all()
        with self.cond:
            self.lines.append((run, time.monotonic(), "EXIT"))
            self.cond.notify_all()

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self, why):
        """SIGKILL to this JVM's PID only."""
        if self.proc is None:
            return
        if self.alive:
            self.proc.kill()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
        with open(self.log_path, "ab") as log:
            log.write(f"==== test harness: kill -9 pid {self.proc.pid} ({why})\n".encode())

    def quit(self, timeout=30):
        if not self.alive:
            return
        try:
            self.send("quit")
            self.proc.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.kill9("did not quit in time")

    def send(self, command):
        self.proc.stdin.write((command + "\n").encode())
        self.proc.stdin.flush()

    # -- protocol lines
    def events(self, prefix, run=None):
        """Lines of `run` (default: the current one) starting with `prefix`."""
        run = self.runs if run is None else run
        with self.cond:
            return [line for r, _t, line in self.lines if r == run and line.startswith(prefix)]

    def checkpoints(self, run=None):
        return [int(line.split()[1]) for line in self.events("CHECKPOINT ", run)]

    def restarts(self, run=None):
        return len(self.events("STATUS RESTARTING", run))

    def taskmanagers_lost(self, run=None):
        return len(self.events("TASKMANAGER-LOST", run))

    def wait_line(self, regex, timeout, what, after=0, exit_ok=False):
        """Waits for a line of the current run matching `regex`, among those
        after the first `after` lines of the run; returns the match."""
        pattern = re.compile(regex)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                mine = [line for r, _t, line in self.lines if r == self.runs]
                for line in mine[after:]:
                    m = pattern.search(line)
                    if m:
                        return m
                    if line == "EXIT" and not exit_ok:
                        try:
                            status = self.proc.wait(5)
                        except subprocess.TimeoutExpired:
                            status = None
                        pytest.fail(f"{self.name} JVM exited (status {status}) while "
                                    f"waiting for {what}; its lines: {mine[-10:]}\n{self.log_tail()}",
                                    pytrace=False)
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"timed out after {timeout}s waiting for {what} from {self.name}; "
                                f"last lines: {mine[-10:]}\n{self.log_tail()}", pytrace=False)
                self.cond.wait(min(left, 1.0))

    def line_count(self):
        with self.cond:
            return sum(1 for r, _t, _l in self.lines if r == self.runs)

    def wait_checkpoint(self, timeout, what="a checkpoint", after=None):
        """Waits for a CHECKPOINT line after the first `after` lines of the run
        (default: from now on); returns its id."""
        after = self.line_count() if after is None else after
        return int(self.wait_line(r"^CHECKPOINT (\d+)$", timeout, what, after=after).group(1))

    def savepoint(self, directory, timeout=120):
        after = self.line_count()
        self.send(f"savepoint {directory}")
        m = self.wait_line(r"^SAVEPOINT(-FAILED)? (.*)$", timeout, "the savepoint", after=after)
        if m.group(1):
            pytest.fail(f"{self.name}: savepoint failed: {m.group(2)}\n{self.log_tail()}", pytrace=False)
        return m.group(2)

    def stop_with_savepoint(self, directory, timeout=120):
        """Flink's stop-with-savepoint: the sources stop, a last savepoint
        is taken and committed, the job ends and its JVM exits. Returns the
        savepoint's path."""
        after = self.line_count()
        self.send(f"stop-with-savepoint {directory}")
        m = self.wait_line(r"^SAVEPOINT(-FAILED)? (.*)$", timeout, "the stop-with-savepoint", after=after,
                           exit_ok=True)
        if m.group(1):
            pytest.fail(f"{self.name}: stop-with-savepoint failed: {m.group(2)}\n{self.log_tail()}",
                        pytrace=False)
        self.wait_line(r"^STOPPED$", timeout, "the job to stop", after=after, exit_ok=True)
        self.proc.wait(timeout)
        return m.group(2)

    def latest_checkpoint(self):
        """The newest completed checkpoint on disk (chk-N holding _metadata),
        as (N, path), or None."""
        best = None
        for meta in self.checkpoint_dir.glob("*/chk-*/_metadata"):
            n = int(meta.parent.name.split("-", 1)[1])
            if best is None or n > best[0]:
                best = (n, meta.parent)
        return best

    # -- the log
    def log_text(self, this_run=False):
        try:
            with open(self.log_path, "rb") as f:
                if this_run:
                    f.seek(self.run_offset)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines=40):
        """The last lines of the log, stack frames left out."""
        kept = [ln[:500] for ln in self.log_text().splitlines()
                if not ln.startswith("\tat ") and not ln.startswith("\t... ")]
        return f"---- {self.log_path} (tail):\n" + "\n".join(kept[-lines:])


@pytest.fixture
def flink_jobs(flink_classpath, tmp_path):
    """Makes FlinkJobs; kills whatever JVM is still running at teardown."""
    jobs = []

    def make(*args, **kw):
        job = FlinkJob(flink_classpath, tmp_path, *args, **kw)
        jobs.append(job)
        return job
    yield make
    for job in jobs:
        job.kill9("test teardown")
        print(f"---- {job.name}: {job.runs} runs, log {job.log_path}")


# ---------------------------------------------------------------- the orders

def make_orders(n):
    """[(order id, amount in cents)]: distinct ids, varied positive amounts."""
    return [(f"o-{i:06d}", 100 + (i * 7919) % 99_900) for i in range(n)]


class OrderFeeder(threading.Thread):
    """Produces the orders at a steady rate with an idempotent producer that
    rides out broker restarts (long message timeout)."""

    def __init__(self, bootstrap, orders, seconds, topic="orders"):
        super().__init__(name="order-feeder", daemon=True)
        self.bootstrap, self.orders, self.seconds, self.topic = bootstrap, orders, seconds, topic
        self.errors = []
        self.produced = 0
        self.done = threading.Event()
        self.stop = threading.Event()

    def run(self):
        try:
            p = Producer({"bootstrap.servers": self.bootstrap, "broker.address.family": "v4",
                          "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                          "message.timeout.ms": 180_000})

            def report(err, _msg):
                if err is not None:
                    self.errors.append(str(err))
            t0 = time.monotonic()
            for i, (oid, amount) in enumerate(self.orders):
                if self.stop.is_set():
                    return
                value = json.dumps({"order_id": oid, "amount": amount})
                while True:
                    try:
                        p.produce(self.topic, key=oid, value=value, on_delivery=report)
                        break
                    except BufferError:
                        p.poll(0.05)
                self.produced = i + 1
                p.poll(0)
                delay = t0 + (i + 1) * self.seconds / len(self.orders) - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            left = p.flush(180)
            if left:
                self.errors.append(f"{left} orders undelivered after flush")
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))
        finally:
            self.done.set()

    def finish(self, timeout):
        assert self.done.wait(timeout), "the order feeder did not finish"
        assert not self.errors, f"order feeder errors: {self.errors[:5]}"


def read_committed(bootstrap, topic, timeout=30):
    """Every committed record of `topic` (read_committed, up to the last
    stable offset), as [(partition, offset, key, value)]."""
    c = Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                  "group.id": "flink-test-verifier", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50})
    try:
        md = c.list_topics(topic, timeout=15).topics[topic]
        parts = sorted(md.partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        at_end, out = set(), []
        deadline = time.monotonic() + timeout
        while len(at_end) < len(parts):
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic}: partitions {sorted(set(parts) - at_end)} "
                                     f"never reached their end in {timeout}s")
            for m in c.consume(500, timeout=0.2):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                        continue
                    raise AssertionError(f"reading {topic}: {m.error()}")
                at_end.discard(m.partition())
                out.append((m.partition(), m.offset(), m.key().decode() if m.key() else None,
                            m.value().decode()))
        return out
    finally:
        c.close()


class Tally:
    """What the output holds, against the orders that went in."""

    def __init__(self, records, orders):
        self.records = records
        self.expected = dict(orders)
        self.counts = Counter()
        self.total = 0
        self.malformed = []
        for part, off, key, value in records:
            try:
                v = json.loads(value)
                oid, amount = v["order_id"], v["amount"]
                ok = (key == oid and v.get("enriched") is True
                      and v.get("amount_eur") == f"{amount // 100}.{amount % 100:02d}")
            except (ValueError, KeyError, TypeError):
                ok, oid, amount = False, None, 0
            if not ok:
                self.malformed.append(f"{part}@{off} {key}={value}")
            self.counts[oid] += 1
            self.total += amount
        self.missing = sorted(set(self.expected) - set(self.counts))
        self.doubled = sorted(k for k, n in self.counts.items() if n > 1)
        self.extra = sorted(k for k in self.counts if k not in self.expected)
        self.expected_total = sum(self.expected.values())

    @property
    def distinct(self):
        return len(set(self.counts) & set(self.expected))

    @property
    def exact(self):
        return (not self.missing and not self.doubled and not self.extra and not self.malformed
                and self.total == self.expected_total)

    def __str__(self):
        return (f"{len(self.records)} records, {self.distinct}/{len(self.expected)} orders; "
                f"missing {len(self.missing)} {self.missing[:8]}; doubled {len(self.doubled)} "
                f"{[(k, self.counts[k]) for k in self.doubled[:8]]}; extra {self.extra[:8]}; "
                f"malformed {self.malformed[:3]}; sum {self.total} vs input {self.expected_total}")


def tally(bootstrap, orders, topic="orders_enriched"):
    return Tally(read_committed(bootstrap, topic), orders)


def wait_output(bootstrap, orders, at_least, timeout, what, jobs=(), topic="orders_enriched"):
    """Waits until `topic` holds at least `at_least` distinct orders; fails
    early if a job's JVM died."""
    last = [None]

    def check():
        for job in jobs:
            if not job.alive:
                pytest.fail(f"{job.name} JVM exited ({job.proc.returncode}) while waiting for "
                            f"{what}\n{job.log_tail()}", pytrace=False)
        last[0] = tally(bootstrap, orders, topic)
        return last[0] if last[0].distinct >= at_least else None
    return wait_until(check, timeout, interval=0.5, what=what,
                      on_timeout=lambda: f"output: {last[0]}\n"
                                         + "\n".join(j.log_tail(30) for j in jobs))


def settle(bootstrap, orders, job, group, timeout, topic="orders_enriched"):
    """Once the feeder is done: waits until `job` has consumed every order
    (its group's committed offsets, which the source commits when a
    checkpoint completes, reach the end of `orders`) and two more of its
    checkpoints have completed, so everything it read is committed
    downstream. Returns the tally of `topic`; the caller asserts on it."""
    def consumed():
        if not job.alive:
            pytest.fail(f"{job.name} JVM exited ({job.proc.returncode}) while waiting for it to "
                        f"consume the orders\n{job.log_tail()}", pytrace=False)
        got, ends = committed_input_offsets(bootstrap, group)
        return got == ends and sum(ends) == len(orders)
    wait_until(consumed, timeout, interval=0.5, what=f"{job.name} to consume all {len(orders)} orders",
               on_timeout=lambda: f"committed/end offsets {committed_input_offsets(bootstrap, group)}\n"
                                  + job.log_tail())
    job.wait_checkpoint(30, "a checkpoint after consuming every order")
    job.wait_checkpoint(30, "a second checkpoint after consuming every order")
    return tally(bootstrap, orders, topic)


def committed_input_offsets(bootstrap, group):
    c = Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                  "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition("orders", p) for p in range(PARTITIONS)], timeout=10)
        ends = [c.get_watermark_offsets(TopicPartition("orders", p), timeout=10, cached=False)[1]
                for p in range(PARTITIONS)]
        return [tp.offset for tp in got], ends
    finally:
        c.close()


# ------------------------------------------------------------ the broker side

# Live verification of the output's business key (docs/exactly-once.md).
UNIQUE_ORDERS = {"verify.unique.key": "/order_id"}


def verify_status(broker, topic="orders_enriched"):
    """Live verification's record of `topic` (/v1/verify)."""
    s = verify_report(broker, topic)
    s["partitions"] = list(s["partitions"].values())
    return s


def txn_states(broker, prefix):
    """{transactional id: state} of the ids Flink made with `prefix` (open
    transactions parked past their timeout show as Parked: the list asks the
    broker's HTTP port which those are)."""
    rows, _ = cli(broker, "txn", "list", admin=broker.metrics_url)
    pattern = re.compile(re.escape(prefix) + r"-\d+-\d+$")
    return {r["transactional_id"]: r["state"] for r in rows if pattern.match(r["transactional_id"])}


def checkpoint_of(txn_id):
    return int(txn_id.rsplit("-", 1)[1])


def make_topics(broker, extra=(), enriched_config=None):
    create_topic(broker.bootstrap, "orders", PARTITIONS)
    create_topic(broker.bootstrap, "orders_enriched", PARTITIONS, config=enriched_config)
    for topic in extra:
        create_topic(broker.bootstrap, topic, PARTITIONS)


# ------------------------------------------------------------ (a) and (c)

A_ORDERS = 600
A_FEED_SECONDS = 40


@pytest.fixture(scope="module")
def kill9_run(module_broker_factory, flink_classpath, tmp_path_factory):
    """Runs scenario (a) once; (a) and (c) assert on what it saw."""
    t0 = time.monotonic()
    broker = module_broker_factory({"verify.scrub.interval.ms": "2000"})
    make_topics(broker, enriched_config=UNIQUE_ORDERS)
    orders = make_orders(A_ORDERS)
    job = FlinkJob(flink_classpath, tmp_path_factory.mktemp("flink-kill9"), "job",
                   broker.bootstrap, BLUE)
    feeder = OrderFeeder(broker.bootstrap, orders, A_FEED_SECONDS)
    seen = {}
    try:
        feeder.start()
        job.start()
        job.wait_checkpoint(60, "the first checkpoint")
        wait_output(broker.bootstrap, orders, A_ORDERS // 5, 60, "20% of the orders committed", [job])

        # 1. The broker dies under the running job, and comes back.
        broker.kill9()
        broker.start()
        wait_output(broker.bootstrap, orders, A_ORDERS // 2, 90,
                    "50% of the orders committed after the broker's restart", [job])
        seen["restarts_in_first_jvm"] = job.restarts()

        # 2. Right after a checkpoint completed (and so was committed), the
        # JVM dies; then the broker dies too. Both come back.
        job.wait_checkpoint(30, "a checkpoint after the broker's restart")
        time.sleep(0.3)
        job.kill9("right after a checkpoint")
        n, path = job.latest_checkpoint()
        seen["restored_checkpoint"] = n
        states = txn_states(broker, BLUE)
        seen["states_at_kill"] = states
        seen["committed_in_restored"] = sorted(
            t for t, s in states.items() if checkpoint_of(t) == n and s == "CompleteCommit")
        broker.kill9()
        broker.start()
        job.start(restore=str(path))
        seen["restored_line"] = job.wait_line(r"^RESTORED (\d+)$", 60, "the restore").group(1)

        feeder.finish(A_FEED_SECONDS + 120)
        seen["tally"] = settle(broker.bootstrap, orders, job, GROUP, 120)
        seen["alive_at_end"] = job.alive
        seen["log"] = job.log_text()
        seen["restored_log"] = job.log_text(this_run=True)
        seen["log_tail"] = job.log_tail()
        seen["broker_log"] = broker.log_path
        seen["seconds"] = time.monotonic() - t0
        time.sleep(3)  # a verification round past the last commit
        seen["verify"] = verify_status(broker)
        yield seen
    finally:
        feeder.stop.set()
        job.kill9("end of scenario (a)")
        print(f"---- scenario (a): Flink log {job.log_path}, broker log {broker.log_path}")


@pytest.mark.timeout(420)
def test_kill9_flink_and_broker_exactly_once(kill9_run):
    seen = kill9_run
    t = seen["tally"]
    print(f"(a) took {seen['seconds']:.1f}s; restored from checkpoint {seen['restored_checkpoint']}; "
          f"{seen['restarts_in_first_jvm']} in-JVM restarts; output {t}")
    assert seen["restored_line"] == str(seen["restored_checkpoint"])
    assert t.exact, f"output is not the input exactly once: {t}\n{seen['log_tail']}"
    assert seen["alive_at_end"], seen["log_tail"]
    # live verification, business keys included: no false alarm across the
    # kills, the restore and its re-commits
    v = seen["verify"]
    assert v["anomalies"] == [], v["anomalies"]
    assert any(u["topic"] == "orders_enriched" and u["keys"] == A_ORDERS for u in v["unique"]), v["unique"]


@pytest.mark.timeout(420)
def test_recommit_after_restore_logs_no_committer_error(kill9_run):
    seen = kill9_run
    n = seen["restored_checkpoint"]
    committed = seen["committed_in_restored"]
    assert committed, (f"precondition: no transaction of checkpoint {n} was committed when the JVM "
                       f"was killed, so the restore re-committed nothing; states: {seen['states_at_kill']}")
    recommitted = set(re.findall(r"Committing Kafka transaction (\S+)", seen["restored_log"]))
    assert set(committed) & recommitted, (
        f"the restored job did not re-commit {committed} (it committed {sorted(recommitted)[:10]})")
    errors = [ln for ln in seen["log"].splitlines()
              if COMMITTER_ERROR.search(ln) or "already fenced" in ln]
    assert not errors, (
        "KafkaCommitter logged errors (re-commit of an already committed transaction refused):\n"
        + "\n".join(errors[:10]))


# ------------------------------------------------------------------ (b) S9

S9_PREFIX = "orders-s9"
S9_ORDERS = 300
S9_FEED_SECONDS = 20
S9_TXN_TIMEOUT_MS = 10_000


def set_fault(broker, fault):
    """Sets (or with None clears) ONCELOG_FAULTS for the broker's next
    start; for a cluster, each broker's."""
    for one in getattr(broker, "brokers", [broker]):
        if fault is None:
            one.env.pop("ONCELOG_FAULTS", None)
        else:
            one.env["ONCELOG_FAULTS"] = fault


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy,broker_factory",
                         [("abort", "local"), ("park", "local"), ("park", "cluster")],
                         indirect=["broker_factory"])
def test_job_down_longer_than_transaction_timeout(policy, broker_factory, flink_jobs):
    t0 = time.monotonic()
    overrides = {}
    if policy == "park":
        overrides["transaction.two.phase.commit.prefixes"] = S9_PREFIX
    broker = broker_factory(overrides, start=False)
    set_fault(broker, f"end-txn-unavailable:{S9_PREFIX}")
    broker.start()
    make_topics(broker)
    orders = make_orders(S9_ORDERS)
    job = flink_jobs("job", broker.bootstrap, S9_PREFIX, txn_timeout_ms=S9_TXN_TIMEOUT_MS)
    feeder = OrderFeeder(broker.bootstrap, orders, S9_FEED_SECONDS)
    feeder.start()
    job.start()

    # A checkpoint completes whose transactions hold orders; their commit
    # is refused (retriably) by the fault, so they stay open. (A healthy
    # commit lands within milliseconds of the checkpoint: open for 3 s is
    # stuck.)
    first_seen = {}

    def stuck():
        latest = job.latest_checkpoint()
        if latest is None:
            return None
        states = txn_states(broker, S9_PREFIX)
        now = time.monotonic()
        for t, s in states.items():
            if s == "Ongoing" and checkpoint_of(t) <= latest[0]:
                first_seen.setdefault(t, now)
            else:
                first_seen.pop(t, None)
        return sorted(t for t, since in first_seen.items() if now - since >= 3) or None
    stuck_ids = wait_until(stuck, 60, interval=0.5,
                           what="a completed checkpoint whose transactions stay open (EndTxn refused)",
                           on_timeout=lambda: f"states {txn_states(broker, S9_PREFIX)}\n"
                                              f"{job.log_tail()}")
    before = tally(broker.bootstrap, orders)
    job.kill9("its commits never landed")
    n, path = job.latest_checkpoint()
    print(f"[{policy}] stuck transactions {stuck_ids}; restoring checkpoint {n}; output so far: {before}")

    broker.stop()
    set_fault(broker, None)
    broker.start()

    # Flink stays down past the transaction timeout: the broker aborts the
    # stuck transactions, or parks them.
    def timed_out():
        states = txn_states(broker, S9_PREFIX)
        mine = {t: states.get(t) for t in stuck_ids}
        if policy == "park":
            return mine if all(s == "Parked" for s in mine.values()) else None
        return mine if all(s in ("CompleteAbort", "PrepareAbort", "Empty") for s in mine.values()) else None
    after_timeout = wait_until(timed_out, 3 * S9_TXN_TIMEOUT_MS / 1000 + 20, interval=0.5,
                               what=f"the stuck transactions to be {'parked' if policy == 'park' else 'aborted'}",
                               on_timeout=lambda: f"states: {txn_states(broker, S9_PREFIX)}")
    print(f"[{policy}] after the timeout, with Flink down: {after_timeout}")

    job.start(restore=str(path))
    job.wait_line(r"^RESTORED (\d+)$", 60, "the restore")
    feeder.finish(S9_FEED_SECONDS + 60)

    t = settle(broker.bootstrap, orders, job, GROUP, 90)
    restored_log = job.log_text(this_run=True)
    committer_errors = [ln for ln in restored_log.splitlines() if COMMITTER_ERROR.search(ln)]
    print(f"[{policy}] took {time.monotonic() - t0:.1f}s; output {t}")

    assert not t.doubled and not t.extra and not t.malformed, str(t)
    if policy == "abort":
        # What Kafka does: the transactions were aborted at their timeout,
        # the re-commit is refused, the orders they held are gone.
        assert t.missing, f"no order was lost although the transactions were aborted: {t}"
        assert t.total == t.expected_total - sum(dict(orders)[k] for k in t.missing), str(t)
        assert any(any(i in ln for i in stuck_ids) for ln in committer_errors), (
            "Flink did not log the refused commit of the aborted transactions:\n"
            + "\n".join(committer_errors[:10]) + "\n" + job.log_tail())
    else:
        assert t.exact, f"parked transactions were not committed after the restore: {t}\n{job.log_tail()}"
        assert not committer_errors, "\n".join(committer_errors[:10])
        # The parked transactions ended committed (t.exact says their orders
        # are there once). The restored job may since have reused their ids
        # (InitProducerId: Empty, then Ongoing), so no later state but a
        # parked or aborted one is wrong.
        final = txn_states(broker, S9_PREFIX)
        assert not any(final.get(i) in ("Parked", "PrepareAbort", "CompleteAbort")
                       for i in stuck_ids), final


# ------------------------------------------------------------------ (d) S10

D_ORDERS = 600
D_FEED_SECONDS = 40
D_BLUE_INTERVAL_MS = 3000


def cutover_status(broker):
    return cli(broker, "cutover", "status", "orders_enriched", admin=broker.metrics_url)[0]


def switched_to(status, prefix):
    """Whether `cutover status --json` says the topic was handed to `prefix`
    and the old writer is fenced."""
    return status.get("phase") == "Switched" and status.get("to") == prefix \
        and status.get("done") is True


@pytest.mark.timeout(300)
def test_blue_green_cutover_exactly_once(broker_factory, flink_jobs, tmp_path):
    t0 = time.monotonic()
    broker = broker_factory()
    make_topics(broker, enriched_config={"writer.transactional.id.prefix": BLUE, **UNIQUE_ORDERS})
    orders = make_orders(D_ORDERS)
    blue = flink_jobs("blue", broker.bootstrap, BLUE, interval_ms=D_BLUE_INTERVAL_MS)
    feeder = OrderFeeder(broker.bootstrap, orders, D_FEED_SECONDS)
    feeder.start()
    blue.start()
    blue.wait_checkpoint(60, "blue's first checkpoint")
    wait_output(broker.bootstrap, orders, D_ORDERS // 4, 60, "a quarter of the orders from blue", [blue])

    # Freeze blue, then take the savepoint green starts from. The freeze
    # lets blue's transactions that already hold the topic go on (those are
    # the savepoint's); a blue transaction that has not written yet may not
    # start to. So: right after one of blue's checkpoints (the next periodic
    # one is D_BLUE_INTERVAL_MS away), once each subtask's current
    # transaction has written (state Ongoing), start the cut-over and take
    # the savepoint at once.
    savepoint = None
    for _attempt in range(5):
        k = blue.wait_checkpoint(30, "a checkpoint of blue")
        current = [f"{BLUE}-{s}-{k + 1}" for s in range(PARTITIONS)]
        deadline = time.monotonic() + D_BLUE_INTERVAL_MS / 2000
        while time.monotonic() < deadline:
            states = txn_states(broker, BLUE)
            if all(states.get(t) == "Ongoing" for t in current):
                break
            time.sleep(0.05)
        else:
            continue
        if blue.checkpoints()[-1] != k:
            continue
        cli(broker, "cutover", "start", "orders_enriched", "--from", BLUE, "--to", GREEN,
            "--drain-timeout-ms", "120000", admin=broker.metrics_url, json_out=False)
        savepoint = blue.savepoint(tmp_path / "savepoints")
        break
    assert savepoint, "blue's transactions never all held the topic right after a checkpoint"
    print(f"cut-over started after blue's checkpoint {k}; blue's savepoint {savepoint}; "
          f"status {cutover_status(broker)}")

    # Blue is not stopped: its next transaction is refused and it fails,
    # again after each restart.
    wait_until(lambda: blue.restarts() >= 2, 90, interval=0.5,
               what="blue to fail and restart twice after the cut-over", on_timeout=blue.log_tail)

    restarts_before_green = blue.restarts()
    green = flink_jobs("green", broker.bootstrap, GREEN, group=GROUP + "-green", interval_ms=1000)
    green.start(restore=savepoint)
    restored = int(green.wait_line(r"^RESTORED (\d+)$", 60, "green's restore from the savepoint").group(1))
    savepoint_txns = [f"{BLUE}-{s}-{restored}" for s in range(PARTITIONS)]
    status = wait_until(lambda: (lambda s: s if switched_to(s, GREEN) else None)(cutover_status(broker)),
                        120, interval=1.0, what="cutover status to report the switch to green",
                        on_timeout=lambda: f"status: {cutover_status(broker)}\n{green.log_tail()}")
    print(f"cutover status: {status}")

    feeder.finish(D_FEED_SECONDS + 60)
    t = settle(broker.bootstrap, orders, green, GROUP + "-green", 120)
    print(f"(d) took {time.monotonic() - t0:.1f}s; blue restarted {blue.restarts()} times "
          f"({blue.taskmanagers_lost()} TaskManagers lost); output {t}")
    green_errors = [ln for ln in green.log_text().splitlines() if COMMITTER_ERROR.search(ln)]
    if not t.exact:
        # Say what became of the savepoint's transactions (blue's, committed
        # by green on restore) and who ended them.
        states = txn_states(broker, BLUE)
        enders = [ln for ln in broker.log_text().splitlines()
                  if any(f'"{i}"' in ln or f"={i} " in ln for i in savepoint_txns)
                  and re.search(r"abort|fenc|refus", ln)]
        pytest.fail(f"downstream is not the input exactly once: {t}\n"
                    f"the savepoint's transactions {savepoint_txns}: "
                    f"{ {i: states.get(i) for i in savepoint_txns} }\n"
                    f"broker log about them:\n" + "\n".join(enders[:12])
                    + "\ngreen's committer errors:\n" + "\n".join(ln[:400] for ln in green_errors[:4]),
                    pytrace=False)

    blue_log = blue.log_text()
    refusals = [ln for ln in blue_log.splitlines() if re.search(r"cut[- ]?over", ln, re.I)
                and re.search(r"Exception|ERROR|WARN", ln)]
    assert refusals, f"blue's log does not name the cut-over in its failure:\n{blue.log_tail()}"
    assert blue.restarts() > restarts_before_green, "blue stopped failing while green ran"
    assert not green_errors, "\n".join(green_errors[:10])
    # the hand-over through a savepoint doubled nothing, and live
    # verification says so
    dups = [a for a in verify_status(broker)["anomalies"] if a["kind"] == "duplicate_key"]
    assert dups == [], dups
    blue.kill9("end of the test")
    green.quit()


# ------------------------------------------------------------------ (e) shadow

E_ORDERS = 300
E_FEED_SECONDS = 10


def diff(broker, *args):
    _, p = cli(broker, "diff", "orders_enriched", "orders_shadow", "--key", "order_id",
               "--sum", "amount", "--json", *args, json_out=False, check=False)
    assert p.returncode in (0, 1), f"oncelog diff exited {p.returncode}: {p.stdout}\n{p.stderr}"
    return p.returncode, json.loads(p.stdout)


@pytest.mark.timeout(300)
def test_shadow_topic_diff(broker_factory, flink_jobs):
    t0 = time.monotonic()
    broker = broker_factory()
    make_topics(broker, extra=["orders_shadow"])
    orders = make_orders(E_ORDERS)
    feeder = OrderFeeder(broker.bootstrap, orders, E_FEED_SECONDS)
    feeder.start()
    blue = flink_jobs("blue", broker.bootstrap, BLUE, group=GROUP + "-blue")
    blue.start()
    feeder.finish(E_FEED_SECONDS + 60)
    t = settle(broker.bootstrap, orders, blue, GROUP + "-blue", 90)
    assert t.exact, str(t)
    blue.quit()

    # Green from the same start (earliest: its group has no offsets), into
    # the shadow topic.
    green = flink_jobs("green", broker.bootstrap, GREEN, output="orders_shadow",
                       group=GROUP + "-green")
    green.start()
    t = settle(broker.bootstrap, orders, green, GROUP + "-green", 90, topic="orders_shadow")
    assert t.exact, str(t)
    green.quit()

    rc, out = diff(broker)
    assert rc == 0 and out["equal"] is True, out
    assert out["a"]["keys"] == out["b"]["keys"] == E_ORDERS, out
    assert out["sums"]["amount"]["equal"] is True, out

    # Plant two differences in the shadow: one extra order, one changed amount.
    p = Producer({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4",
                  "enable.idempotence": True})
    oid, amount = orders[7]
    p.produce("orders_shadow", key="o-999999", value=json.dumps(
        {"order_id": "o-999999", "amount": 123, "amount_eur": "1.23", "enriched": True}))
    p.produce("orders_shadow", key=oid, value=json.dumps(
        {"order_id": oid, "amount": amount + 1, "amount_eur": "x", "enriched": True}))
    assert p.flush(30) == 0
    rc, out = diff(broker)
    print(f"(e) took {time.monotonic() - t0:.1f}s; diff after planting: {out}")
    assert rc == 1 and out["equal"] is False, out
    assert out["extra"]["count"] == 1 and out["extra"]["examples"][0]["key"] == "o-999999", out
    assert out["mismatch"]["count"] == 1 and out["mismatch"]["examples"][0]["key"] == oid, out
    assert int(out["sums"]["amount"]["difference"]) == 123 + amount + 1, out


# ------------------------------------------------- (f) on a 3-broker cluster

F_ORDERS = 400
F_FEED_SECONDS = 25


@pytest.mark.timeout(360)
def test_flink_exactly_once_on_a_cluster(cluster_factory, flink_jobs, tmp_path):
    """(f) The job of (a) against three `oncelog serve --cluster` brokers
    over PostgreSQL and S3 (bootstrap list of all three): one broker is
    killed with -9 under the running job and restarted; then, right after a
    checkpoint, the JVM is killed and the job restored from that checkpoint
    (its committer commits the restored transactions again: an idempotent
    re-commit); then it is stopped with a savepoint and the next version
    starts from it with the same transactional-id prefix (a hand-over with
    one prefix). Downstream every order is counted exactly once, and live
    verification (verify.unique.key=/order_id on the output) raises no
    false alarm through any of it."""
    t0 = time.monotonic()
    cl = cluster_factory(overrides={"verify.scrub.interval.ms": "2000"})
    bs = cl.bootstrap
    make_topics(cl, enriched_config=UNIQUE_ORDERS)
    orders = make_orders(F_ORDERS)
    job = flink_jobs("job", bs, BLUE)
    feeder = OrderFeeder(bs, orders, F_FEED_SECONDS)
    try:
        feeder.start()
        job.start()
        job.wait_checkpoint(60, "the first checkpoint")
        wait_output(bs, orders, F_ORDERS // 5, 60, "20% of the orders committed", [job])

        victim = cl.by_id(2)
        victim.kill9()
        victim.start()
        wait_output(bs, orders, F_ORDERS // 2, 90,
                    "50% of the orders committed after a broker's kill -9", [job])

        job.wait_checkpoint(30, "a checkpoint after the broker's restart")
        time.sleep(0.3)
        job.kill9("right after a checkpoint")
        n, path = job.latest_checkpoint()
        job.start(restore=str(path))
        assert job.wait_line(r"^RESTORED (\d+)$", 60, "the restore").group(1) == str(n)

        # the hand-over of a new version, one prefix: stop-with-savepoint,
        # then a new JVM from that savepoint
        wait_output(bs, orders, F_ORDERS * 2 // 3, 90, "two thirds of the orders committed", [job])
        savepoint = job.stop_with_savepoint(tmp_path / "savepoints")
        job.start(restore=savepoint)
        handed = job.wait_line(r"^RESTORED (\d+)$", 60, "the restore from the savepoint").group(1)

        feeder.finish(F_FEED_SECONDS + 120)
        t = settle(bs, orders, job, GROUP, 120)
        print(f"(f) took {time.monotonic() - t0:.1f}s; restored from checkpoint {n}, "
              f"then from savepoint {handed}; output {t}")
        assert t.exact, f"output is not the input exactly once: {t}\n{job.log_tail()}"
        errors = [ln for ln in job.log_text().splitlines()
                  if COMMITTER_ERROR.search(ln) or "already fenced" in ln]
        assert not errors, "KafkaCommitter logged errors:\n" + "\n".join(errors[:10])
        assert job.alive, job.log_tail()
        time.sleep(3)  # a verification round past the last commit
        v = verify_status(cl)
        assert v["anomalies"] == [], v["anomalies"]
        assert any(u["topic"] == "orders_enriched" and u["keys"] == F_ORDERS for u in v["unique"]), v["unique"]
    finally:
        feeder.stop.set()
        job.kill9("end of scenario (f)")


# ------------------------------------------------ (f) the seed, found live

S_ORDERS = 200
S_FEED_SECONDS = 15
V2 = "orders-sink-v2"


@pytest.mark.timeout(300)
def test_two_jobs_doubling_orders_are_found_by_business_key(broker_factory, flink_jobs):
    """The seed's second story (SCENARIOS.md S11), found live: v1
    (orders-sink) and v2 (orders-sink-v2, its own consumer group) both run on
    the same input into the same output, with no writer fence, so every
    order both commit is doubled. With verify.unique.key=/order_id on the
    output, the broker reports the first doubled order within 10 s, each one
    once, naming both writers: as many reports as doubled orders."""
    broker = broker_factory()
    make_topics(broker, enriched_config=UNIQUE_ORDERS)
    orders = make_orders(S_ORDERS)
    v1 = flink_jobs("v1", broker.bootstrap, BLUE)
    v2 = flink_jobs("v2", broker.bootstrap, V2, group=GROUP + "-v2")
    feeder = OrderFeeder(broker.bootstrap, orders, S_FEED_SECONDS)
    feeder.start()
    v1.start()
    v2.start()
    first_doubled = None
    first_alert = None

    def watch():
        nonlocal first_doubled, first_alert
        t = tally(broker.bootstrap, orders)
        alerts = [a for a in verify_status(broker)["anomalies"] if a["kind"] == "duplicate_key"]
        if t.doubled and first_doubled is None:
            first_doubled = time.time()
        if alerts and first_alert is None:
            first_alert = min(a["found_ms"] for a in alerts) / 1000
        return first_doubled and first_alert
    wait_until(watch, 120, interval=0.5, what="a doubled order and its alert",
               on_timeout=lambda: v1.log_tail(20) + v2.log_tail(20))
    print(f"first doubled order read at {first_doubled:.1f}, first alert at {first_alert:.1f} "
          f"({first_alert - first_doubled:+.1f} s)")
    assert first_alert - first_doubled <= 10

    feeder.finish(S_FEED_SECONDS + 60)
    settle(broker.bootstrap, orders, v1, GROUP, 120)
    t = settle(broker.bootstrap, orders, v2, GROUP + "-v2", 120)
    assert t.doubled, f"precondition: both jobs committed the orders: {t}"

    def reported():
        alerts = [a for a in verify_status(broker)["anomalies"] if a["kind"] == "duplicate_key"]
        return alerts if len(alerts) >= len(t.doubled) else None
    alerts = wait_until(reported, 15, interval=0.5, what="every doubled order to be reported")
    time.sleep(2)
    alerts = [a for a in verify_status(broker)["anomalies"] if a["kind"] == "duplicate_key"]
    assert len(alerts) == len(t.doubled), (len(alerts), len(t.doubled))
    assert sorted(a["detail"].split()[1] for a in alerts) == t.doubled
    for a in alerts:
        writers = re.findall(r"\(writer (\S+),", a["detail"])
        assert sorted(writers) == sorted([BLUE, V2]), a["detail"]
    print(f"{len(alerts)} doubled orders reported, e.g. {alerts[0]['detail']}")
    v1.quit()
    v2.quit()
