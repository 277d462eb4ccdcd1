"""Second-writer detection (S6) seen by real Kafka Streams exactly_once_v2
apps (tests/streams/StreamsEosApp.java, the app of tests/test_streams.py).

A Streams v2 transactional id is `<application.id>-<process UUID>-<thread>`:
a redeploy on a fresh state dir, or a second instance, is a new process UUID
and so a new transactional id, but the same writer (the application). The
broker must read it so:

1. one app redeployed (kill -9, fresh state dir) and scaled out to two
   instances raises no "more than one transactional writer" warning, and its
   output is exact;
2. with `writer.transactional.id.prefix=<app A>` on the output topic, A
   writes and a second app B writing that topic is refused with nothing of
   it committed;
3. without that config, A and B writing one output topic raise exactly one
   warning, for that topic, naming both applications (so the warning the
   first test looks for can fire, and B's records do land when unguarded);
4. live verification's pipeline lineage (docs/exactly-once.md, "Verified
   live"): test 1 raises no lineage alert, and an app B reading A's input
   into A's output is reported as double processing naming both apps.
"""

import json
import re
import shutil
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from clients import cli, create_topic, produce, scrape, unique_topic, value
from conftest import wait_until
from test_streams import (BROKER_TROUBLE, INPUT_PARTITIONS, OUTPUT_PARTITIONS, Observer,
                          StreamsApp, expected_error, list_topics, streams_classpath,  # noqa: F401
                          workload)

N = 900                      # input records per app; test 1 feeds them in three phases
B_KEYS = "b-region-"         # app B's output keys (A's are "region-<n>")
SECOND_WRITER = "more than one transactional writer"
# The broker's refusal lines: the add of a partition to the transaction
# (AddPartitionsToTxn, or under transaction version 2 the add a Produce
# implies) is where the writer fence refuses first.
REFUSED = ("transactional write refused", "second transactional writer refused")
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


class App(StreamsApp):
    """StreamsApp with extra JVM options (e.g. B's output key prefix)."""

    def __init__(self, classpath, bootstrap, app_id, state_dir, input_topic, output_topic,
                 log_path, jvm_args=()):
        super().__init__(classpath, bootstrap, app_id, state_dir, input_topic, output_topic,
                         log_path)
        self.argv[1:1] = list(jvm_args)
        self.app_id, self.state_dir, self.input_topic = app_id, state_dir, input_topic

    def process_uuid(self):
        """The process UUID of the current run, from its stream thread's name
        (client id `<application.id>-<process UUID>`)."""
        m = re.search(re.escape(self.app_id) + f"-({UUID})-StreamThread-",
                      self.log_text(this_run=True))
        return m and m.group(1)


def app_id(name):
    # Ends in letters: an id ending in -N would be read as a numbered producer.
    return f"{unique_topic(name)}-app"


def only(totals, prefix):
    return {k: v for k, v in totals.items() if k.startswith(prefix)}


def committed_keys(bootstrap, topic):
    """Every key of `topic` a read_committed consumer sees, up to the LSO."""
    c = Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                  "group.id": "writers-test-reader", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(OUTPUT_PARTITIONS)])
    keys, at_end = [], set()
    deadline = time.monotonic() + 30
    try:
        while len(at_end) < OUTPUT_PARTITIONS:
            assert time.monotonic() < deadline, f"{topic}: no end of partitions {at_end}"
            for m in c.consume(1000, timeout=0.5):
                if m.error():
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    at_end.add(m.partition())
                else:
                    keys.append(m.key().decode())
    finally:
        c.close()
    return keys


def writer_warnings(broker):
    """(topic, sorted writers, line) of each second-writer warning."""
    out = []
    for ln in broker.log_text().splitlines():
        if SECOND_WRITER in ln:
            t = re.search(r'\btopic="?([^"\s]+)', ln)
            p = re.search(r"prefixes=\[([^\]]*)\]", ln)
            writers = sorted(x.strip().strip('"') for x in p.group(1).split(",")) if p else None
            out.append((t and t.group(1), writers, ln))
    return out


def refusals(broker, app=None):
    """Refusal lines, all or those of `app`'s transactional ids (the reason
    text names the allowed writer too, so match the id field)."""
    mine = re.compile(r'transactional_id="?' + re.escape(app) + "-") if app else None
    return [ln for ln in broker.log_text().splitlines()
            if any(r in ln for r in REFUSED) and (mine is None or mine.search(ln))]


def app_errors(app):
    """Streams log lines pointing at trouble (as tests/test_streams.py reads them)."""
    return [ln for ln in app.log_text().splitlines()
            if (" ERROR " in ln and not expected_error(ln)) or BROKER_TROUBLE.search(ln)]


def own_topics(b, app):
    """The app's internal topics (Streams creates them)."""
    mine = [f"{app}-by-region-repartition", f"{app}-region-sums-changelog"]
    topics = list_topics(b.bootstrap)
    assert all(t in topics for t in mine), sorted(topics)
    return mine


def live_writers(b, topics):
    """/metrics: how many writers committed to each topic in the last minute."""
    m = scrape(int(b.overrides["metrics.listen"].rsplit(":", 1)[1]))
    return {t: value(m, "oncelog_topic_transactional_writers", topic=t) for t in topics}


def start_broker(broker_factory):
    b = broker_factory({"group.initial.rebalance.delay.ms": 0})
    for one in getattr(b, "brokers", [b]):
        print(f"oncelog log: {one.log_path}")
    return b


def lineage_alerts(b):
    """Live verification's lineage findings (/v1/verify)."""
    with urllib.request.urlopen(f"{b.metrics_url}/v1/verify", timeout=10) as r:
        found = json.load(r)["anomalies"]
    return [a for a in found if a["kind"] in ("double_processing", "recommitted_range")]


def txn_states(b, app):
    return {t["transactional_id"]: t["state"] for t in cli(b, "txn", "list")[0]
            if t["transactional_id"].startswith(app + "-")}


@pytest.mark.timeout(240)
def test_redeploy_and_scale_out_are_one_writer(broker_factory, streams_classpath, tmp_path):
    """App A killed, redeployed on a fresh state dir, then run as two
    instances: three transactional ids, one writer, exact output."""
    b = start_broker(broker_factory)
    a = app_id("wa")
    inp, out = unique_topic("sw-in"), unique_topic("sw-out")
    create_topic(b.bootstrap, inp, INPUT_PARTITIONS)
    create_topic(b.bootstrap, out, OUTPUT_PARTITIONS)
    records, expected = workload(N)
    thirds = [N // 3, 2 * N // 3, N]

    first = App(streams_classpath, b.bootstrap, a, tmp_path / "state-1", inp, out, tmp_path / "a1.log")
    second = App(streams_classpath, b.bootstrap, a, tmp_path / "state-2", inp, out, tmp_path / "a2.log")
    obs = Observer(b.bootstrap, a, inp, out)
    apps = (first, second)

    def tail():
        return "\n".join(f"---- {x.log_path}:\n{x.log_tail(40)}" for x in apps if x.runs) \
            + f"\nbroker warnings: {[w[2] for w in writer_warnings(b)]}"

    def exact_at(n, *live):
        """All of the first n input records committed, and the output's
        totals are exactly theirs."""
        want = workload(n)[1]

        def check():
            for x in live:
                assert x.alive, f"Streams app exited with {x.proc.returncode}\n{tail()}"
            return obs.committed_input() == n and only(obs.read_output(0.3), "region-") == want
        wait_until(check, 90, interval=0.1, what=f"exact totals of the first {n} records",
                   on_timeout=lambda: f"want {want}\n got {obs.totals}\n"
                                      f"committed input {obs.committed_input()}\n{tail()}")

    uuids = []
    try:
        # Deploy, let it commit a third of the input, then kill -9 it.
        produce(b.bootstrap, inp, records[:thirds[0]], enable_idempotence=True)
        first.start()
        exact_at(thirds[0], first)
        uuids.append(first.process_uuid())
        first.kill9("committed, idle")
        # Redeploy on a fresh state dir: a new process UUID.
        shutil.rmtree(first.state_dir)
        produce(b.bootstrap, inp, records[thirds[0]:thirds[1]], enable_idempotence=True)
        first.start()
        exact_at(thirds[1], first)
        uuids.append(first.process_uuid())
        # Scale out: a second instance with its own state dir.
        second.start()
        wait_until(second.running, 60, interval=0.2, what="the second instance to reach RUNNING",
                   on_timeout=tail)
        uuids.append(second.process_uuid())
        produce(b.bootstrap, inp, records[thirds[1]:], enable_idempotence=True)
        exact_at(N, first, second)
        assert only(obs.totals, "region-") == expected
        topics = own_topics(b, a) + [out]
        warnings = writer_warnings(b)
        assert not warnings, "\n".join(w[2] for w in warnings)
        live = live_writers(b, topics)
        assert live == {t: 1 for t in topics}, live

        assert all(uuids) and len(set(uuids)) == 3, f"process UUIDs {uuids}\n{tail()}"
        ids = [f"{a}-{u}-1" for u in uuids]
        # The scaled-out instance committed too (ListTransactions states).
        states = wait_until(lambda: (s := txn_states(b, a)).get(ids[2]) == "CompleteCommit" and s,
                            30, interval=0.5, what=f"{ids[2]} to commit",
                            on_timeout=lambda: f"{txn_states(b, a)}\n{tail()}")
        print(f"Kafka Streams transactional ids: {states}")
        assert set(ids) <= set(states), states
        assert not writer_warnings(b), "\n".join(w[2] for w in writer_warnings(b))
        time.sleep(2)  # a verification round settles the last commits
        assert lineage_alerts(b) == [], lineage_alerts(b)
        for x in apps:
            assert x.alive, tail()
            assert not app_errors(x), "\n".join(app_errors(x)[:20]) + "\n" + tail()
    finally:
        for x in apps:
            x.kill9("test teardown")
        obs.close()


def two_apps(broker_factory, streams_classpath, tmp_path, guarded):
    """A broker, apps A and B each with its own input (written), and one
    output topic for both; if `guarded`, only A may write it."""
    b = start_broker(broker_factory)
    a, bb = app_id("wa"), app_id("wb")
    in_a, in_b, out = unique_topic("sw-in-a"), unique_topic("sw-in-b"), unique_topic("sw-out")
    create_topic(b.bootstrap, in_a, INPUT_PARTITIONS)
    create_topic(b.bootstrap, in_b, INPUT_PARTITIONS)
    create_topic(b.bootstrap, out, OUTPUT_PARTITIONS,
                 config={"writer.transactional.id.prefix": a} if guarded else None)
    records, expected = workload(N)
    produce(b.bootstrap, in_a, records, enable_idempotence=True)
    produce(b.bootstrap, in_b, records, enable_idempotence=True)
    app_a = App(streams_classpath, b.bootstrap, a, tmp_path / "state-a", in_a, out, tmp_path / "a.log")
    app_b = App(streams_classpath, b.bootstrap, bb, tmp_path / "state-b", in_b, out, tmp_path / "b.log",
                jvm_args=[f"-DStreamsEosApp.keyPrefix={B_KEYS}"])
    expected_b = {B_KEYS + k.removeprefix("region-"): v for k, v in expected.items()}
    return b, app_a, app_b, out, expected, expected_b


def logs(*apps):
    return "\n".join(f"---- {x.log_path}:\n{x.log_tail(30)}" for x in apps if x.runs)


@pytest.mark.timeout(180)
def test_single_writer_topic_admits_the_app_and_refuses_another(broker_factory, streams_classpath,
                                                                tmp_path):
    """writer.transactional.id.prefix=A on the output: A writes, B is refused
    and none of its records is committed there."""
    b, app_a, app_b, out, expected, _ = two_apps(broker_factory, streams_classpath, tmp_path, True)
    a, bb = app_a.app_id, app_b.app_id
    admin = AdminClient({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4"})
    desc = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, out)])
    configs = next(iter(desc.values())).result(30)
    assert configs["writer.transactional.id.prefix"].value == a
    obs = Observer(b.bootstrap, a, app_a.input_topic, out)
    try:
        app_a.start()
        app_b.start()

        def a_exact():
            assert not refusals(b, a), "app A refused:\n" + "\n".join(refusals(b, a)[:5])
            assert app_a.alive, logs(app_a, app_b)
            return obs.committed_input() == N and only(obs.read_output(0.3), "region-") == expected
        wait_until(a_exact, 90, interval=0.1, what="app A's exact output",
                   on_timeout=lambda: f"want {expected}\n got {obs.totals}\n{logs(app_a, app_b)}")
        refused = wait_until(lambda: refusals(b, bb), 60, interval=0.2,
                             what="the broker to refuse app B", on_timeout=lambda: logs(app_a, app_b))
        assert out in refused[0], refused
        print(f"refusal: {refused[0]}")
        # B is told it is not authorized.
        wait_until(lambda: "TransactionalIdAuthorization" in app_b.log_text(), 30, interval=0.2,
                   what="app B to see TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
                   on_timeout=lambda: logs(app_b))

        keys = committed_keys(b.bootstrap, out)
        assert [k for k in keys if k.startswith(B_KEYS)] == [], "app B's records were committed"
        assert set(keys) == set(expected), sorted(set(keys))
        assert not refusals(b, a)
        # B never committed to the guarded topic, so it has one writer.
        assert not writer_warnings(b), "\n".join(w[2] for w in writer_warnings(b))
        assert not app_errors(app_a), "\n".join(app_errors(app_a)[:20])
    finally:
        app_a.kill9("test teardown")
        app_b.kill9("test teardown")
        obs.close()


@pytest.mark.timeout(180)
def test_two_apps_on_one_unguarded_topic_are_reported(broker_factory, streams_classpath, tmp_path):
    """A and B both write an output without the config: both outputs land,
    and the broker warns once, for that topic, naming A and B."""
    b, app_a, app_b, out, expected, expected_b = two_apps(broker_factory, streams_classpath,
                                                          tmp_path, False)
    a, bb = app_a.app_id, app_b.app_id
    obs_a = Observer(b.bootstrap, a, app_a.input_topic, out)
    obs_b = Observer(b.bootstrap, bb, app_b.input_topic, out)
    try:
        app_a.start()
        app_b.start()

        def both_exact():
            assert app_a.alive and app_b.alive, logs(app_a, app_b)
            totals = obs_a.read_output(0.3)
            return (obs_a.committed_input() == N and obs_b.committed_input() == N
                    and only(totals, "region-") == expected and only(totals, B_KEYS) == expected_b)
        wait_until(both_exact, 120, interval=0.1, what="both apps' exact output",
                   on_timeout=lambda: f"got {obs_a.totals}\n{logs(app_a, app_b)}")
        warnings = wait_until(lambda: writer_warnings(b), 10, interval=0.2,
                              what="the second-writer warning")
        # One warning, for the shared topic only (not for either app's own
        # repartition and changelog topics), naming both applications.
        assert [(t, w) for t, w, _ in warnings] == [(out, sorted([a, bb]))], \
            "\n".join(w[2] for w in warnings)
        print(f"warning: {warnings[0][2]}")
        topics = own_topics(b, a) + own_topics(b, bb) + [out]
        live = live_writers(b, topics)
        assert live == {t: 2 if t == out else 1 for t in topics}, live
        assert not refusals(b), "no topic here refuses anyone"
        for x in (app_a, app_b):
            assert not app_errors(x), "\n".join(app_errors(x)[:20])
    finally:
        app_a.kill9("test teardown")
        app_b.kill9("test teardown")
        obs_a.close()
        obs_b.close()


def same_input_apps(broker_factory, streams_classpath, tmp_path, tag, out_config):
    """A broker, one input (its first half written) and one output (with
    `out_config`), and apps A and B both reading that input into that output
    (B's output keys prefixed)."""
    b = start_broker(broker_factory)
    a, bb = app_id(f"{tag}a"), app_id(f"{tag}b")
    inp, out = unique_topic(f"{tag}-in"), unique_topic(f"{tag}-out")
    create_topic(b.bootstrap, inp, INPUT_PARTITIONS)
    create_topic(b.bootstrap, out, OUTPUT_PARTITIONS, config=out_config)
    records, expected = workload(N)
    produce(b.bootstrap, inp, records[:N // 2], enable_idempotence=True)
    app_a = App(streams_classpath, b.bootstrap, a, tmp_path / "state-a", inp, out, tmp_path / "a.log")
    app_b = App(streams_classpath, b.bootstrap, bb, tmp_path / "state-b", inp, out, tmp_path / "b.log",
                jvm_args=[f"-DStreamsEosApp.keyPrefix={B_KEYS}"])
    return b, app_a, app_b, inp, out, records, expected


@pytest.mark.timeout(180)
def test_a_second_app_on_the_same_input_and_output_is_double_processing(broker_factory,
                                                                       streams_classpath, tmp_path):
    """App B (another application.id) reads A's input into A's output: each
    is exactly once on its own, together every record is processed twice.
    Live verification reports it as double processing of A's input
    partitions, naming both applications (their groups and writers)."""
    b, app_a, app_b, inp, out, records, _ = same_input_apps(broker_factory, streams_classpath,
                                                            tmp_path, "d", None)
    a, bb = app_a.app_id, app_b.app_id
    obs = Observer(b.bootstrap, a, inp, out)
    try:
        app_a.start()
        wait_until(lambda: obs.committed_input() == N // 2, 90, interval=0.2,
                   what="app A to commit the first half", on_timeout=lambda: logs(app_a))
        assert lineage_alerts(b) == []
        app_b.start()
        # B's first commit (its lineage starts where that commit ends: where
        # it began reading is not known), then both process the rest
        obs_b = Observer(b.bootstrap, bb, inp, out)
        try:
            wait_until(lambda: obs_b.committed_input() == N // 2, 90, interval=0.2,
                       what="app B to commit the first half", on_timeout=lambda: logs(app_b))
        finally:
            obs_b.close()
        rest = records[N // 2:]
        for i in range(0, len(rest), len(rest) // 4):
            produce(b.bootstrap, inp, rest[i:i + len(rest) // 4], enable_idempotence=True)
            time.sleep(0.5)
        alerts = wait_until(lambda: [x for x in lineage_alerts(b) if x["topic"] == inp], 90,
                            interval=0.5, what="double processing of the input to be reported",
                            on_timeout=lambda: logs(app_a, app_b))
        print(f"lineage: {alerts[0]['detail']}")
        for x in alerts:
            assert x["kind"] == "double_processing", x
            d = x["detail"]
            assert f"group {a} (writer {a}-" in d and f"group {bb} (writer {bb}-" in d, d
            assert out in d, d
    finally:
        app_a.kill9("test teardown")
        app_b.kill9("test teardown")
        obs.close()


@pytest.mark.timeout(180)
def test_the_lineage_fence_refuses_a_second_app_and_the_output_stays_exact(broker_factory,
                                                                          streams_classpath,
                                                                          tmp_path):
    """verify.lineage.enforce=true on the output: app B (another
    application.id, any transactional ids) reading A's input into A's output
    is refused at its transactional offset commit, none of its records is
    committed, and A's output stays exact."""
    b, app_a, app_b, inp, out, records, expected = same_input_apps(
        broker_factory, streams_classpath, tmp_path, "f", {"verify.lineage.enforce": "true"})
    obs = Observer(b.bootstrap, app_a.app_id, inp, out)
    try:
        app_a.start()
        wait_until(lambda: obs.committed_input() == N // 2, 90, interval=0.2,
                   what="app A to commit the first half", on_timeout=lambda: logs(app_a))
        time.sleep(1.5)  # a verification round settles A's last commit
        app_b.start()
        produce(b.bootstrap, inp, records[N // 2:], enable_idempotence=True)

        def a_exact():
            assert app_a.alive, logs(app_a, app_b)
            return obs.committed_input() == N and only(obs.read_output(0.3), "region-") == expected
        wait_until(a_exact, 90, interval=0.1, what="app A's exact output",
                   on_timeout=lambda: f"want {expected}\n got {obs.totals}\n{logs(app_a, app_b)}")
        wait_until(lambda: "TransactionalIdAuthorization" in app_b.log_text(), 60, interval=0.2,
                   what="app B to be refused", on_timeout=lambda: logs(app_b))
        assert "lineage fence" in b.log_text()
        # B's refused transactions end at their timeout; none of B's records
        # is ever committed
        time.sleep(12)
        keys = committed_keys(b.bootstrap, out)
        assert [k for k in keys if k.startswith(B_KEYS)] == [], "app B's records were committed"
        assert only(obs.read_output(0.3), "region-") == expected
    finally:
        app_a.kill9("test teardown")
        app_b.kill9("test teardown")
        obs.close()
