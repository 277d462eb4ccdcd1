"""`oncelog cutover` with real clients: S10, the enforced blue/green hand-over
(SCENARIOS.md S10).

The writer fence (`writer.transactional.id.prefix`) lets one writer commit to
a topic; moving a topic from blue's writer to green's by editing that config
races with blue's transactions still in flight. The cut-over is the hand-over
as a durable state machine (the broker's `cutover` module). What is proven
here, with librdkafka producers and read_committed consumers against a real
`oncelog serve`:

1. The hand-over. While draining, blue's transaction that already holds the
   topic is waited for (status and metrics name it), green writes but its
   commit is held until blue's has ended; then the broker switches by
   itself, green's held commit goes through, the topic's writer config is
   green, read_committed sees blue's records strictly before green's and
   nothing else, and blue, fenced by the switch, cannot write any more.
2. A blue transaction that starts after the cut-over is refused loudly (the
   broker log names the cut-over), while one that already held the topic
   commits.
3. Durability. The draining state survives kill -9; after restart the drain
   deadline aborts blue's open transaction and the broker switches; green
   then commits normally and nothing of blue's aborted work is visible.
4. The operator's doors. Starting a cut-over that is already running, or one
   on a topic that cannot have one (unknown, internal, same writer twice,
   an ambiguous prefix, --from not the topic's writer) fails with a clear
   message and creates no state; two concurrent starts: exactly one wins;
   rollback while draining makes blue the writer again and green's open
   transaction uncommittable; rollback twice or after a switch fails.

Every assertion could fail on a broker that got the hand-over wrong: both
writers committing in one interval, green's commit let through early, blue
writing after the switch, state lost on a crash, or a refused request that
still changed something.
"""

import subprocess
import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource

from clients import (admin, cli, create_topic, end_offset, read_partition, scrape, txn_producer,
                     unique_topic, value)
from conftest import oncelog_bin, wait_until

WRITER = "writer.transactional.id.prefix"
HOLDS = 60000           # a drain long enough never to end by itself in a test
FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
          KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}


# ------------------------------------------------------------------ helpers

def cutover(broker, *args, check=True):
    """Runs `oncelog cutover ... --json`; returns (parsed output, process)."""
    return cli(broker, "cutover", *args, admin=broker.metrics_url, check=check, timeout=30)


def refused(broker, *args, says):
    """A `cutover` command that must fail with a message containing `says`."""
    _, p = cutover(broker, *args, check=False)
    assert p.returncode != 0, f"{args} succeeded: {p.stdout}"
    assert says in p.stderr, f"{args}: expected {says!r} in: {p.stderr}"
    return p


def status(broker, topic):
    return cutover(broker, "status", topic)[0]


def metrics(broker):
    return scrape(int(broker.overrides["metrics.listen"].rsplit(":", 1)[1]))


def producer(broker, txn_id, **extra):
    p = txn_producer(broker.bootstrap, txn_id, **{"transaction.timeout.ms": 60000, **extra})
    p.init_transactions(30)
    return p


def write(p, topic, name, n):
    """Produces n keyed records named `name-i` into the open transaction and flushes."""
    failed = []

    def report(err, _msg):
        if err is not None:
            failed.append(err)
    for i in range(n):
        p.produce(topic, key=f"{name}-k{i}".encode(), value=f"{name}-{i}".encode(), partition=0,
                  on_delivery=report)
    left = p.flush(30)
    return left, failed


def read(broker, topic, isolation="read_committed", until="read_uncommitted", timeout=20):
    """(offset, key, value) of every record of partition 0 until the
    consumer's position reaches the high watermark (markers included), so a
    read_committed read also waits for every open transaction to end; with
    until="read_committed" only up to the last stable offset."""
    hw = end_offset(broker.bootstrap, topic, isolation=until)
    if hw == 0:
        return []
    return read_partition(broker.bootstrap, topic, 0, 0, isolation, hw, timeout, keys=True)


def values(records):
    return [v.decode() for _, _, v in records]


def topic_writer(broker, topic):
    res = ConfigResource("topic", topic)
    a = admin(broker.bootstrap)   # kept alive until the answer is in
    cfg = a.describe_configs([res])[res].result(30)
    entry = cfg.get(WRITER)
    return entry.value if entry is not None else None


def fatal_error(action):
    """Runs action(), which must fail with a KafkaException; returns its KafkaError."""
    with pytest.raises(KafkaException) as e:
        action()
    return e.value.args[0]


def committer(p, timeout=40):
    """commit_transaction in a thread (retried while librdkafka calls the
    error retriable); returns (thread, result dict)."""
    result = {}

    def run():
        deadline = time.monotonic() + timeout
        while True:
            try:
                p.commit_transaction(timeout)
                result["ok"] = time.monotonic()
                return
            except KafkaException as e:
                err = e.args[0]
                if err.retriable() and time.monotonic() < deadline:
                    result["retries"] = result.get("retries", 0) + 1
                    time.sleep(0.1)
                    continue
                result["error"] = err
                return
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def history(broker, txn_id):
    """The broker's recent events of a transactional id (`oncelog txn history`)."""
    return cli(broker, "txn", "history", txn_id, admin=broker.metrics_url, timeout=30)[0]["events"]


def log_lines(broker, needle):
    return [line for line in broker.log_text().splitlines() if needle in line]


def phase_metric(broker, topic, frm, to, phase, done):
    return value(metrics(broker), "oncelog_cutover_phase",
                 **{"topic": topic, "from": frm, "to": to, "phase": phase, "done": done})


# -------------------------------------------------------------------- tests

def test_hand_over_from_blue_to_green(broker):
    topic = unique_topic("s10")
    create_topic(broker.bootstrap, topic, config={WRITER: "blue"})
    blue = producer(broker, "blue-0")
    blue.begin_transaction()
    assert write(blue, topic, "blue", 10) == (0, [])

    st, _ = cutover(broker, "start", topic, "--from", "blue", "--to", "green",
                    "--drain-timeout-ms", str(HOLDS))
    assert (st["phase"], st["from"], st["to"], st["done"]) == ("Draining", "blue", "green", False), st
    assert st["drain_deadline_ms"] - st["started_ms"] == HOLDS, st
    assert [w["transactional_id"] for w in st["waiting_for"]] == ["blue-0"], st
    assert st["waiting_for"][0]["state"] == "Ongoing", st
    assert phase_metric(broker, topic, "blue", "green", "Draining", "false") == 1
    assert value(metrics(broker), "oncelog_cutover_waiting_transactions", topic=topic) == 1
    # `topic describe` shows it too.
    d, _ = cli(broker, "topic", "describe", topic, admin=broker.metrics_url, timeout=30)
    assert d["cutover"]["phase"] == "Draining", d

    green = producer(broker, "green-0")
    green.begin_transaction()
    assert write(green, topic, "green", 10) == (0, [])
    thread, result = committer(green)
    time.sleep(2.0)
    assert thread.is_alive() and "ok" not in result and "error" not in result, \
        f"green's commit ended while blue's transaction was open: {result}"
    st = status(broker, topic)
    assert st["phase"] == "Draining" and [w["transactional_id"] for w in st["waiting_for"]] == ["blue-0"], st
    assert end_offset(broker.bootstrap, topic, isolation="read_committed") == 0 and \
        read(broker, topic, until="read_committed") == [], "nothing is committed yet"

    blue.commit_transaction(30)
    blue_committed = time.monotonic()
    st = wait_until(lambda: (lambda s: s if s["phase"] == "Switched" and s["done"] else None)(
        status(broker, topic)), 10, interval=0.2, what="the switch",
        on_timeout=lambda: f"{status(broker, topic)}\n{broker.log_tail(20)}")
    assert st["ended_ms"] >= st["started_ms"] and st["waiting_for"] == [] and \
        st["aborted_at_deadline"] == [], st
    thread.join(20)
    assert "ok" in result, f"green's held commit did not go through: {result}"
    assert result["ok"] > blue_committed
    assert topic_writer(broker, topic) == "green"
    assert phase_metric(broker, topic, "blue", "green", "Switched", "true") == 1
    assert value(metrics(broker), "oncelog_cutover_waiting_transactions", topic=topic) is None

    # Every blue commit precedes the switch, which precedes every green commit.
    blue_commits = [e["time_ms"] for e in history(broker, "blue-0") if e["event"] == "commit"]
    green_commits = [e["time_ms"] for e in history(broker, "green-0") if e["event"] == "commit"]
    assert len(blue_commits) == 1 and len(green_commits) == 1, (blue_commits, green_commits)
    assert blue_commits[0] <= st["ended_ms"] <= green_commits[0], (blue_commits, st, green_commits)
    assert any(e["event"] == "fence" and e.get("cause") == "cutover" for e in history(broker, "blue-0"))

    got = read(broker, topic)
    assert [(k.decode(), v.decode()) for _, k, v in got] == \
        [(f"{w}-k{i}", f"{w}-{i}") for w in ("blue", "green") for i in range(10)]
    blue_offsets = [o for o, _, v in got if v.startswith(b"blue-")]
    green_offsets = [o for o, _, v in got if v.startswith(b"green-")]
    assert max(blue_offsets) < min(green_offsets)

    # Blue, fenced by the switch and no longer the topic's writer, can write no more.
    def late_blue():
        blue.begin_transaction()
        blue.produce(topic, key=b"late", value=b"blue-late", partition=0)
        blue.flush(10)
        blue.commit_transaction(10)
    err = fatal_error(late_blue)
    assert err.fatal() and err.code() in FENCED, err
    assert all(v != b"blue-late" for _, _, v in read(broker, topic, "read_uncommitted"))
    assert len(read(broker, topic)) == 20

    log = broker.log_text()
    marks = [log.find(s) for s in ("cut-over started", "cut-over switched", "cut-over done")]
    assert -1 not in marks and marks == sorted(marks), marks
    assert "cut-over drain deadline reached" not in log
    # A hand-over is not a second writer.
    assert "more than one transactional writer" not in log

    # Done: the topic config decides again; an operator may name another writer.
    cli(broker, "topic", "alter-config", topic, "--set", f"{WRITER}=purple", json_out=False, timeout=30)
    purple = producer(broker, "purple-0")
    purple.begin_transaction()
    assert write(purple, topic, "purple", 1) == (0, [])
    purple.commit_transaction(30)
    assert values(read(broker, topic))[-1] == "purple-0"


def test_new_blue_transaction_is_refused_open_one_commits(broker):
    topic = unique_topic("s10-new")
    create_topic(broker.bootstrap, topic, config={WRITER: "blue"})
    open_one = producer(broker, "blue-0")
    open_one.begin_transaction()
    assert write(open_one, topic, "blue", 3) == (0, [])
    cutover(broker, "start", topic, "--from", "blue", "--to", "green", "--drain-timeout-ms", str(HOLDS))

    late = producer(broker, "blue-1")

    def late_transaction():
        late.begin_transaction()
        late.produce(topic, key=b"late", value=b"late-0", partition=0)
        late.flush(10)
        late.commit_transaction(10)
    err = fatal_error(late_transaction)
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and err.fatal(), err
    why = [line for line in log_lines(broker, "transactional write refused") if "blue-1" in line]
    assert why and "is being cut over" in why[0] and "green" in why[0], why
    st = status(broker, topic)
    assert st["phase"] == "Draining" and [w["transactional_id"] for w in st["waiting_for"]] == ["blue-0"], st

    open_one.commit_transaction(30)
    wait_until(lambda: status(broker, topic)["phase"] == "Switched", 10, interval=0.2, what="the switch")
    assert values(read(broker, topic)) == ["blue-0", "blue-1", "blue-2"]
    assert values(read(broker, topic, "read_uncommitted")) == ["blue-0", "blue-1", "blue-2"], \
        "nothing of the refused transaction entered the log"


def test_draining_keeps_blues_open_transaction_for_its_own_commit(broker):
    """While draining, blue's transaction that holds the topic (the one a
    savepoint hands to green's committer) ends only by its own EndTxn or at
    the drain deadline: a restarting blue instance's InitProducerId on the
    same id (which would abort it) is refused loudly, its transaction
    timeout passes without an abort, and the commit by its own identity
    then goes through."""
    topic = unique_topic("s10-keep")
    create_topic(broker.bootstrap, topic, config={WRITER: "blue"})
    blue = producer(broker, "blue-0", **{"transaction.timeout.ms": 2000, "message.timeout.ms": 2000})
    blue.begin_transaction()
    assert write(blue, topic, "blue", 4) == (0, [])
    cutover(broker, "start", topic, "--from", "blue", "--to", "green", "--drain-timeout-ms", str(HOLDS))

    restarted = txn_producer(broker.bootstrap, "blue-0")
    err = fatal_error(lambda: restarted.init_transactions(30))
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, err
    why = [line for line in log_lines(broker, "InitProducerId refused") if "blue-0" in line]
    assert why and "being cut over" in why[0], why

    # Well past the 2 s timeout (the reaper looks every second or so).
    time.sleep(5)
    st = status(broker, topic)
    assert st["phase"] == "Draining", st
    assert [(w["transactional_id"], w["state"]) for w in st["waiting_for"]] == [("blue-0", "Ongoing")], st
    assert not [line for line in log_lines(broker, "transaction timed out") if "blue-0" in line]

    blue.commit_transaction(30)
    wait_until(lambda: status(broker, topic)["phase"] == "Switched", 10, interval=0.2, what="the switch")
    assert values(read(broker, topic)) == ["blue-0", "blue-1", "blue-2", "blue-3"]


def test_without_a_cutover_the_timeout_aborts_as_before(broker):
    """The control: the same transaction on a topic not being cut over is
    aborted at its timeout, and a new instance's InitProducerId succeeds."""
    topic = unique_topic("s10-keep-control")
    create_topic(broker.bootstrap, topic, config={WRITER: "blue"})
    blue = producer(broker, "blue-0", **{"transaction.timeout.ms": 2000, "message.timeout.ms": 2000})
    blue.begin_transaction()
    assert write(blue, topic, "blue", 4) == (0, [])
    wait_until(lambda: [line for line in log_lines(broker, "transaction timed out") if "blue-0" in line],
               15, interval=0.2, what="the timeout abort")
    restarted = producer(broker, "blue-0")
    restarted.begin_transaction()
    assert write(restarted, topic, "again", 1) == (0, [])
    restarted.commit_transaction(30)
    assert values(read(broker, topic)) == ["again-0"]


def test_draining_survives_kill9_and_the_deadline_aborts_blue(broker):
    topic = unique_topic("s10-crash")
    create_topic(broker.bootstrap, topic, config={WRITER: "blue"})
    blue = producer(broker, "blue-0")
    blue.begin_transaction()
    assert write(blue, topic, "blue", 5) == (0, [])
    drain_ms = 6000
    before, _ = cutover(broker, "start", topic, "--from", "blue", "--to", "green",
                        "--drain-timeout-ms", str(drain_ms))
    broker.kill9()
    broker.start()

    st = status(broker, topic)
    assert st["phase"] == "Draining", (st, broker.log_tail(20))
    for k in ("from", "to", "started_ms", "drain_deadline_ms"):
        assert st[k] == before[k], (k, st, before)
    assert [w["transactional_id"] for w in st["waiting_for"]] == ["blue-0"], st

    st = wait_until(lambda: (lambda s: s if s["phase"] == "Switched" and s["done"] else None)(
        status(broker, topic)), drain_ms / 1000 + 10, interval=0.3, what="the switch after the deadline",
        on_timeout=lambda: f"{status(broker, topic)}\n{broker.log_tail(20)}")
    assert st["aborted_at_deadline"] == ["blue-0"], st
    assert st["ended_ms"] >= before["drain_deadline_ms"], st
    assert log_lines(broker, "cut-over drain deadline reached")
    assert read(broker, topic) == [], "blue's aborted records are not visible read_committed"
    assert topic_writer(broker, topic) == "green"

    green = producer(broker, "green-0")
    green.begin_transaction()
    assert write(green, topic, "green", 5) == (0, [])
    green.commit_transaction(30)
    assert values(read(broker, topic)) == [f"green-{i}" for i in range(5)]

    # Blue's client still thinks its transaction open; committing it now fails.
    err = fatal_error(lambda: blue.commit_transaction(10))
    assert err.fatal() and err.code() in FENCED, err
    assert values(read(broker, topic)) == [f"green-{i}" for i in range(5)]


def test_operator_doors(broker):
    # Starts that must not create anything.
    plain = unique_topic("s10-doors")
    create_topic(broker.bootstrap, plain, config={WRITER: "blue"})
    refused(broker, "start", "no-such-topic-s10", "--from", "blue", "--to", "green", says="unknown topic")
    for internal in ("__consumer_offsets", "__transaction_state"):
        refused(broker, "start", internal, "--from", "blue", "--to", "green", says="internal topic")
    refused(broker, "start", plain, "--from", "blue", "--to", "blue", says="same writer")
    refused(broker, "start", plain, "--from", "blue", "--to", "green-2", says="ambiguous")
    refused(broker, "start", plain, "--from", "red", "--to", "green", says='writer is "blue"')
    refused(broker, "start", plain, "--from", "blue", "--to", "green", "--drain-timeout-ms", "0",
            says="must be positive")
    for t in (plain, "no-such-topic-s10", "__consumer_offsets", "__transaction_state"):
        assert status(broker, t)["phase"] == "None", t
    assert cutover(broker, "status")[0] == {"cutovers": []}
    assert not (broker.data_dir / "cutovers.json").exists()
    assert topic_writer(broker, plain) == "blue"
    refused(broker, "rollback", plain, says="no cut-over in progress")

    # Concurrent starts: exactly one wins; a repeated start changes nothing.
    topic = unique_topic("s10-rb")
    create_topic(broker.bootstrap, topic, config={WRITER: "blue"})
    blue = producer(broker, "blue-0")
    blue.begin_transaction()
    assert write(blue, topic, "blue", 2) == (0, [])
    argv = [str(oncelog_bin()), "cutover", "start", topic, "--from", "blue", "--to", "green",
            "--drain-timeout-ms", str(HOLDS), "--bootstrap", broker.bootstrap,
            "--admin", broker.metrics_url, "--json"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=30) + (p.returncode,) for p in procs]
    assert sorted(rc == 0 for _, _, rc in outs) == [False, True], outs
    loser = next(err for _, err, rc in outs if rc != 0)
    assert "already being cut over" in loser, loser
    first = status(broker, topic)
    assert first["phase"] == "Draining" and first["to"] == "green", first
    refused(broker, "start", topic, "--from", "blue", "--to", "teal", "--drain-timeout-ms", "1000",
            says="already being cut over")
    assert status(broker, topic) == first
    # A long timeout: the rollback itself must abort green's open
    # transaction, or it would hold back read_committed readers of the
    # topic until it timed out.
    green = producer(broker, "green-0", **{"transaction.timeout.ms": 60000})
    green.begin_transaction()
    assert write(green, topic, "green", 2) == (0, [])

    # Rollback while draining: blue is the writer again, green cannot commit.
    st, _ = cutover(broker, "rollback", topic)
    assert st["phase"] == "RolledBack" and st["ended_ms"] >= st["started_ms"], st
    wait_until(lambda: status(broker, topic)["done"], 10, interval=0.2,
               what="green's open transaction aborted by the rollback")
    assert phase_metric(broker, topic, "blue", "green", "RolledBack", "true") == 1
    err = fatal_error(lambda: green.commit_transaction(10))
    assert err.code() in (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, *FENCED), err
    blue.commit_transaction(30)
    blue.begin_transaction()
    assert write(blue, topic, "blue-again", 1) == (0, [])
    blue.commit_transaction(30)
    assert values(read(broker, topic)) == ["blue-0", "blue-1", "blue-again-0"]
    assert topic_writer(broker, topic) == "blue"
    refused(broker, "rollback", topic, says="no cut-over in progress")
    assert status(broker, topic)["phase"] == "RolledBack"
    assert "cut-over rolled back" in broker.log_text()

    # After a switch there is nothing to roll back.
    navy = unique_topic("s10-sw")
    create_topic(broker.bootstrap, navy, config={WRITER: "navy"})
    st, _ = cutover(broker, "start", navy, "--from", "navy", "--to", "teal", "--wait-ms", "10000")
    assert st["phase"] == "Switched", st
    refused(broker, "rollback", navy, says="already switched")
    wait_until(lambda: status(broker, navy)["done"], 10, interval=0.2, what="the switch done")
    assert status(broker, navy)["phase"] == "Switched"
    assert topic_writer(broker, navy) == "teal"
    refused(broker, "start", navy, "--from", "navy", "--to", "teal", says='writer is "teal"')


# ------------------------------------------------------------ cluster mode

def cutovers_holder(cl):
    """The broker holding the cut-overs job's lease (it drives every cut-over)."""
    rows = cl.sql("SELECT broker_id FROM job_leases WHERE job = 'cutovers'")
    return cl.by_id(rows[0][0]) if rows else None


def test_cluster_hand_over_across_brokers(cluster_factory):
    """S10 on three brokers over one PostgreSQL: the cut-over is started
    through broker 2, read through broker 3, driven by whichever broker
    holds the cut-overs job, and the checks are made in the decisions'
    PostgreSQL transactions, so they hold whichever broker a client's
    coordinator is. Then: concurrent starts through two brokers (one wins),
    kill -9 of the driving broker mid-drain (the deadline still aborts blue,
    another broker switches), and a rollback that leaves green's open
    transaction uncommittable."""
    cl = cluster_factory(store="file", n=3, overrides={"cluster.lease.ms": 2000})
    b1, b2, b3 = cl.brokers
    topic = unique_topic("s10c")
    create_topic(cl.bootstrap, topic, config={WRITER: "blue"})
    blue = producer(cl, "blue-0")
    blue.begin_transaction()
    assert write(blue, topic, "blue", 10) == (0, [])

    st, _ = cutover(b2, "start", topic, "--from", "blue", "--to", "green",
                    "--drain-timeout-ms", str(HOLDS))
    assert (st["phase"], st["from"], st["to"], st["done"]) == ("Draining", "blue", "green", False), st
    assert st["drain_deadline_ms"] - st["started_ms"] == HOLDS, st
    st = status(b3, topic)
    assert [(w["transactional_id"], w["state"]) for w in st["waiting_for"]] == [("blue-0", "Ongoing")], st
    refused(b1, "start", topic, "--from", "blue", "--to", "teal", says="already being cut over")
    # Every broker's /metrics shows the cluster's cut-over.
    assert phase_metric(b3, topic, "blue", "green", "Draining", "false") == 1
    assert value(metrics(b1), "oncelog_cutover_waiting_transactions", topic=topic) == 1

    # A new blue transaction is refused loudly; a restarting blue instance
    # may not take blue-0 (that would abort the transaction being waited for).
    late = producer(cl, "blue-1")

    def late_transaction():
        late.begin_transaction()
        late.produce(topic, key=b"late", value=b"late-0", partition=0)
        late.flush(10)
        late.commit_transaction(10)
    err = fatal_error(late_transaction)
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and err.fatal(), err
    why = [line for line in log_lines(cl, "transactional write refused") if "blue-1" in line]
    assert why and "is being cut over" in why[0], why
    restarted = txn_producer(cl.bootstrap, "blue-0")
    err = fatal_error(lambda: restarted.init_transactions(30))
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, err

    # Green writes; its commit is held while blue-0 holds the topic.
    green = producer(cl, "green-0")
    green.begin_transaction()
    assert write(green, topic, "green", 10) == (0, [])
    thread, result = committer(green)
    time.sleep(2.0)
    assert thread.is_alive() and "ok" not in result and "error" not in result, \
        f"green's commit ended while blue's transaction was open: {result}"
    assert end_offset(cl.bootstrap, topic, isolation="read_committed") == 0

    blue.commit_transaction(30)
    st = wait_until(lambda: (lambda s: s if s["phase"] == "Switched" and s["done"] else None)(
        status(b1, topic)), 15, interval=0.2, what="the switch",
        on_timeout=lambda: f"{status(b1, topic)}\n{cl.log_tail(20)}")
    assert st["waiting_for"] == [] and st["aborted_at_deadline"] == [], st
    thread.join(30)
    assert "ok" in result, f"green's held commit did not go through: {result}"
    assert topic_writer(cl, topic) == "green"
    assert phase_metric(b2, topic, "blue", "green", "Switched", "true") == 1
    got = read(cl, topic)
    assert [v.decode() for _, _, v in got] == [f"{w}-{i}" for w in ("blue", "green") for i in range(10)]
    assert values(read(cl, topic, "read_uncommitted")) == values(got), "the refused transaction wrote nothing"

    def late_blue():
        blue.begin_transaction()
        blue.produce(topic, key=b"late", value=b"blue-late", partition=0)
        blue.flush(10)
        blue.commit_transaction(10)
    err = fatal_error(late_blue)
    assert err.fatal() and err.code() in FENCED, err
    assert len(read(cl, topic)) == 20
    log = cl.log_text()
    assert "cut-over switched" in log and "cut-over done" in log
    assert "more than one transactional writer" not in log

    # Concurrent starts through two brokers: exactly one wins.
    t2 = unique_topic("s10c-crash")
    create_topic(cl.bootstrap, t2, config={WRITER: "blue"})
    blue2 = producer(cl, "blue-2")
    blue2.begin_transaction()
    assert write(blue2, t2, "blue", 5) == (0, [])
    drain_ms = 5000
    procs = [subprocess.Popen([str(oncelog_bin()), "cutover", "start", t2, "--from", "blue", "--to", "green",
                               "--drain-timeout-ms", str(drain_ms), "--bootstrap", cl.bootstrap,
                               "--admin", b.metrics_url, "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for b in (b1, b3)]
    outs = [p.communicate(timeout=30) + (p.returncode,) for p in procs]
    assert sorted(rc == 0 for _, _, rc in outs) == [False, True], outs
    assert "already being cut over" in next(err for _, err, rc in outs if rc != 0)
    before = status(b2, t2)

    # kill -9 of the broker driving the cut-overs, mid-drain.
    holder = wait_until(lambda: cutovers_holder(cl), 10, what="the cut-overs job's holder")
    holder.kill9()
    holder.start()
    st = wait_until(lambda: (lambda s: s if s["phase"] == "Switched" and s["done"] else None)(
        status(b2, t2)), drain_ms / 1000 + 20, interval=0.3, what="the switch after the deadline",
        on_timeout=lambda: f"{status(b2, t2)}\n{cl.log_tail(20)}")
    assert st["aborted_at_deadline"] == ["blue-2"], st
    assert st["ended_ms"] >= before["drain_deadline_ms"], (st, before)
    assert log_lines(cl, "cut-over drain deadline reached")
    assert read(cl, t2) == [], "blue's aborted records are not visible read_committed"
    green2 = producer(cl, "green-2")
    green2.begin_transaction()
    assert write(green2, t2, "green", 3) == (0, [])
    green2.commit_transaction(30)
    assert values(read(cl, t2)) == ["green-0", "green-1", "green-2"]
    err = fatal_error(lambda: blue2.commit_transaction(10))
    assert err.fatal() and err.code() in FENCED, err

    # Rollback while draining: blue writes again; green's open transaction
    # is aborted by it and cannot commit.
    t3 = unique_topic("s10c-rb")
    create_topic(cl.bootstrap, t3, config={WRITER: "blue"})
    # blue's open transaction holds the topic, so the drain cannot end (and
    # the cut-overs job switch) before the rollback
    blue3 = producer(cl, "blue-3")
    blue3.begin_transaction()
    assert write(blue3, t3, "blue", 2) == (0, [])
    cutover(b3, "start", t3, "--from", "blue", "--to", "green", "--drain-timeout-ms", str(HOLDS))
    green3 = producer(cl, "green-3")
    green3.begin_transaction()
    assert write(green3, t3, "green", 2) == (0, [])
    st, _ = cutover(b1, "rollback", t3)
    assert st["phase"] == "RolledBack", st
    wait_until(lambda: status(b2, t3)["done"], 15, interval=0.2, what="the rollback done")
    err = fatal_error(lambda: green3.commit_transaction(10))
    assert err.code() in (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, *FENCED), err
    blue3.commit_transaction(30)
    assert values(read(cl, t3)) == ["blue-0", "blue-1"]
    assert topic_writer(cl, t3) == "blue"
    refused(b2, "rollback", t3, says="no cut-over in progress")
    # The operator's doors, through a cluster broker.
    refused(b1, "start", "__consumer_offsets", "--from", "blue", "--to", "green", says="internal topic")
    refused(b1, "start", "no-such-topic-s10c", "--from", "blue", "--to", "green", says="unknown topic")
    assert sorted(c["topic"] for c in cutover(b2, "status")[0]["cutovers"]) == sorted([topic, t2, t3])
