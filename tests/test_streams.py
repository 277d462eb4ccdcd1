"""Kafka Streams 4.4 with processing.guarantee=exactly_once_v2, killed and
restarted mid-stream, against oncelog and (differentially) Apache Kafka 4.4.

tests/streams/StreamsEosApp.java sums integer amounts per region (account
number mod 7): the groupBy goes through a repartition topic, the sums live in
a state store with a changelog topic, the running totals go to an output topic.
While a producer feeds the input, the app is killed with SIGKILL twice and
restarted with the same application.id and state dir, and once its state dir
is deleted before the restart (so it restores from the changelog). Exactly
once means the last committed total per region (read_committed) ends up equal
to the sum computed here: nothing counted twice, nothing lost.

The jars are fetched by test.sh into .tools/streams-lib with
`mvn -f tests/streams/pom.xml dependency:copy-dependencies`; the fixture runs
the same command if they are missing, then compiles the app with javac. The
Apache Kafka reference broker comes from .tools/kafka-lib (bench/kafka_ref.py).
"""

import os
import re
import shutil
import subprocess
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from clients import unique_topic, watermarks
from conftest import wait_until, REPO_ROOT, _die_with_parent
from jvm import create_topic_with_leaders, compile_against, kafka_reference


STREAMS_DIR = REPO_ROOT / "tests" / "streams"
LIB_DIR = REPO_ROOT / ".tools" / "streams-lib"

N_RECORDS = 30_000
ACCOUNTS = 500
REGIONS = 7
INPUT_PARTITIONS = 3
OUTPUT_PARTITIONS = 3
PRODUCE_SECONDS = 50          # the input trickles in while the app is killed
STREAMS_HEAP = "256m"

# Lines of the Streams log that point at the broker misbehaving, even at WARN.
BROKER_TROUBLE = re.compile(
    r"UnsupportedVersion|UNSUPPORTED_VERSION|UnknownServerException|UNKNOWN_SERVER_ERROR"
    r"|unexpected error|Unexpected error|CorruptRecord|InvalidRecord|IllegalState"
    r"|does not support|not supported|Unknown API|unknown api|SchemaException")


# ERROR lines Streams writes by design after a kill -9 under EOS: a task whose
# store has no checkpoint is "corrupted", wiped and restored from the changelog.
EXPECTED_ERROR = re.compile(r"(org\.apache\.kafka\.streams\.errors\.)?TaskCorruptedException: Tasks \[[0-9_, ]+\] are corrupted and hence "
                            r"need to be re-initialized")


def expected_error(line):
    """An ERROR line that only reports corrupted tasks (nothing else failed)."""
    rest = EXPECTED_ERROR.sub("", line)
    return rest != line and "Exception" not in rest


@pytest.fixture(scope="module")
def streams_classpath(tmp_path_factory):
    return compile_against(tmp_path_factory, STREAMS_DIR, LIB_DIR, "kafka-streams-4.", "streams-classes")


@pytest.fixture(scope="module")
def kafka(tmp_path_factory):
    k = kafka_reference(tmp_path_factory, "384m")
    yield k
    print(f"---- Apache Kafka log: {k.log_path}")
    k.stop()


create_topic = create_topic_with_leaders


def workload(n_records=N_RECORDS):
    """The input records and the final total per region they must sum to."""
    records = []
    expected = {}
    for i in range(n_records):
        acct = (i * 7919) % ACCOUNTS
        amount = 1 + (i * 31) % 97                # positive: a running total
        records.append((f"acct-{acct}", str(amount)))  # only grows
        region = f"region-{acct % REGIONS}"
        expected[region] = expected.get(region, 0) + amount
    return records, expected


class Feeder(threading.Thread):
    """Produces the input at a bounded rate (idempotent, acks=all), so the
    app is busy with open transactions whenever it is killed."""

    def __init__(self, bootstrap, topic, records, seconds):
        super().__init__(name="feeder", daemon=True)
        self.bootstrap, self.topic, self.records, self.seconds = bootstrap, topic, records, seconds
        self.errors = []
        self.done = threading.Event()
        self.stop = threading.Event()

    def run(self):
        try:
            p = Producer({"bootstrap.servers": self.bootstrap, "broker.address.family": "v4",
                          "enable.idempotence": True, "acks": "all", "linger.ms": 5})

            def report(err, _msg):
                if err is not None:
                    self.errors.append(err)
            chunk = 100
            chunks = (len(self.records) + chunk - 1) // chunk
            t0 = time.monotonic()
            for c in range(chunks):
                if self.stop.is_set():
                    return
                for key, value in self.records[c * chunk:(c + 1) * chunk]:
                    while True:
                        try:
                            p.produce(self.topic, key=key, value=value, on_delivery=report)
                            break
                        except BufferError:
                            p.poll(0.05)
                p.poll(0)
                delay = t0 + (c + 1) * self.seconds / chunks - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            left = p.flush(60)
            if left:
                self.errors.append(f"{left} records undelivered after flush")
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))
        finally:
            self.done.set()


class StreamsApp:
    """The Streams JVM: one process at a time, all runs appended to one log."""

    def __init__(self, classpath, bootstrap, app_id, state_dir, input_topic, output_topic, log_path):
        self.argv = ["java", f"-Xmx{STREAMS_HEAP}", "-XX:+UseSerialGC", "-cp", classpath,
                     "StreamsEosApp", bootstrap, app_id, str(state_dir), input_topic,
                     output_topic, str(REGIONS)]
        self.log_path = log_path
        self.proc = None
        self.runs = 0
        self.run_offset = 0   # where the current run's output starts in the log

    def start(self):
        assert not self.alive
        self.runs += 1
        with open(self.log_path, "ab") as log:
            log.write(f"==== test harness: start #{self.runs}\n".encode())
            log.flush()
            self.run_offset = log.tell()
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, preexec_fn=_die_with_parent)

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self, why):
        if self.proc is None:
            return
        if self.alive:
            self.proc.kill()   # SIGKILL to this PID only
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
        with open(self.log_path, "ab") as log:
            log.write(f"==== test harness: kill -9 pid {self.proc.pid} ({why})\n".encode())

    def log_text(self, this_run=False):
        try:
            with open(self.log_path, "rb") as f:
                if this_run:
                    f.seek(self.run_offset)
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines=80):
        return "\n".join(self.log_text().splitlines()[-lines:])

    def running(self):
        """The current run reached RUNNING (logged by the app's state listener)."""
        if not self.alive:
            pytest.fail(f"Streams app exited with {self.proc.returncode}; log tail:\n"
                        f"{self.log_tail()}", pytrace=False)
        return "-> RUNNING" in self.log_text(this_run=True)


class Observer:
    """Reads progress from the broker: the app's committed input offsets and
    the output topic's last committed total per region."""

    def __init__(self, bootstrap, app_id, input_topic, output_topic):
        self.input_topic = input_topic
        self.offsets = Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                                 "group.id": app_id, "enable.auto.commit": False})
        self.out = Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                             "group.id": f"{app_id}-verifier", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "auto.offset.reset": "error",
                             "fetch.wait.max.ms": 100})
        self.out.assign([TopicPartition(output_topic, p, 0) for p in range(OUTPUT_PARTITIONS)])
        self.totals = {}
        self.records_read = 0

    def committed_input(self):
        tps = [TopicPartition(self.input_topic, p) for p in range(INPUT_PARTITIONS)]
        try:
            got = self.offsets.committed(tps, timeout=10)
        except Exception:  # noqa: BLE001 - coordinator moving, retried by the caller
            return 0
        return sum(max(tp.offset, 0) for tp in got)

    def read_output(self, seconds=0.5):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for m in self.out.consume(1000, timeout=0.2):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(f"output consumer: {m.error()}")
                self.totals[m.key().decode()] = int(m.value().decode())
                self.records_read += 1
        return self.totals

    def close(self):
        self.offsets.close()
        self.out.close()


def list_topics(bootstrap):
    a = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    return a.list_topics(timeout=15).topics


@pytest.mark.timeout(420)
@pytest.mark.parametrize("which", ["oncelog", "kafka", "cluster"])
def test_streams_exactly_once_v2_survives_kill9_and_state_loss(which, request, broker_factory,
                                                                 streams_classpath, tmp_path):
    t_start = time.monotonic()
    if which == "cluster":
        # Three `oncelog serve --cluster` brokers over PostgreSQL and S3.
        cl = request.getfixturevalue("cluster_factory")(
            overrides={"group.initial.rebalance.delay.ms": 0})
        bootstrap = cl.bootstrap
    elif which == "oncelog":
        b = broker_factory({"group.initial.rebalance.delay.ms": 0}, start=False)
        if os.environ.get("ONCELOG_STREAMS_DEBUG"):
            b.env["ONCELOG_LOG"] = "debug"
        b.start()
        bootstrap = b.bootstrap
        print(f"oncelog log: {b.log_path}")
    else:
        bootstrap = request.getfixturevalue("kafka").bootstrap

    input_topic = unique_topic("streams-in")
    output_topic = unique_topic("streams-out")
    app_id = unique_topic("eos-sums")
    create_topic(bootstrap, input_topic, INPUT_PARTITIONS)
    create_topic(bootstrap, output_topic, OUTPUT_PARTITIONS)
    records, expected = workload()

    state_dir = tmp_path / "streams-state"
    log_path = tmp_path / "streams.log"
    app = StreamsApp(streams_classpath, bootstrap, app_id, state_dir, input_topic,
                     output_topic, log_path)
    feeder = Feeder(bootstrap, input_topic, records, PRODUCE_SECONDS)
    obs = Observer(bootstrap, app_id, input_topic, output_topic)
    print(f"Streams log: {log_path}")

    def tail():
        return f"Streams log tail ({log_path}):\n{app.log_tail()}"

    def progress_at_least(n):
        def check():
            if not app.alive:
                pytest.fail(f"Streams app exited with {app.proc.returncode}\n{tail()}", pytrace=False)
            return obs.committed_input() >= n
        return check

    try:
        feeder.start()
        app.start()
        # 1: kill -9 mid-stream, restart on the same state dir.
        wait_until(progress_at_least(N_RECORDS // 5), 60, interval=0.2,
                   what="the app to commit 20% of the input", on_timeout=tail)
        app.kill9("mid-stream, state dir kept")
        app.start()
        # 2: once the restarted app is running and has made progress, kill -9
        # again and delete its state dir: the restart restores from the changelog.
        wait_until(app.running, 60, interval=0.2, what="the restarted app to reach RUNNING", on_timeout=tail)
        wait_until(progress_at_least(N_RECORDS * 11 // 20), 60, interval=0.2,
                   what="the app to commit 55% of the input", on_timeout=tail)
        app.kill9("mid-stream, state dir deleted before the restart")
        shutil.rmtree(state_dir)
        app.start()

        assert feeder.done.wait(PRODUCE_SECONDS + 60), "the feeder did not finish"
        assert not feeder.errors, feeder.errors

        def converged():
            if not app.alive:
                pytest.fail(f"Streams app exited with {app.proc.returncode}\n{tail()}", pytrace=False)
            totals = obs.read_output()
            return totals == expected and obs.committed_input() == N_RECORDS

        wait_until(converged, 120, what="the output totals to match the input", interval=0.1,
                      on_timeout=lambda: f"expected {expected}\n     got {obs.totals}\n"
                                         f"committed input {obs.committed_input()} of {N_RECORDS}\n"
                                         + tail())
        # It stays exact: a few more commit intervals change nothing.
        time.sleep(2)
        assert obs.read_output(1.0) == expected, tail()
        assert app.alive, tail()
        print(f"[{which}] converged after {time.monotonic() - t_start:.1f}s; "
              f"{obs.records_read} output records read; {app.runs} runs")

        text = app.log_text()
        last_run = app.log_text(this_run=True)
        assert "-> RUNNING" in last_run, tail()
        # The run after the state dir was deleted rebuilt the store from the changelog.
        assert re.search(r"Finished restoring changelog \S+-region-sums-changelog-\d+ to store "
                         r"region-sums with a total number of [1-9]", last_run), tail()
        errors = [ln for ln in text.splitlines()
                  if (" ERROR " in ln and not expected_error(ln)) or BROKER_TROUBLE.search(ln)]
        assert not errors, "Streams logged errors:\n" + "\n".join(errors[:40]) + "\n" + tail()

        # Streams purges the repartition topic (DeleteRecords) after commits.
        topics = list_topics(bootstrap)
        repart = [t for t in topics if t.startswith(app_id) and t.endswith("-repartition")]
        changelog = [t for t in topics if t.startswith(app_id) and t.endswith("-changelog")]
        assert len(repart) == 1 and len(changelog) == 1, sorted(topics)
        parts = sorted(topics[repart[0]].partitions)

        def purged():
            marks = [watermarks(bootstrap, repart[0], p) for p in parts]
            return marks if any(low > 0 for low, _high in marks) else None
        marks = wait_until(purged, 30, what=f"{repart[0]}'s log start offset to move above 0",
                              interval=1.0, on_timeout=tail)
        print(f"[{which}] {repart[0]} (log start, high watermark): {marks}")
    finally:
        feeder.stop.set()
        app.kill9("test teardown")
        obs.close()
        print(f"[{which}] test took {time.monotonic() - t_start:.1f}s")

