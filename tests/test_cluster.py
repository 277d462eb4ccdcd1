"""Cluster mode (docs/cluster.md): three `oncelog serve --cluster` brokers over
one real PostgreSQL server and one object store (s3proxy, a real S3 server,
or a shared directory), driven by third-party clients with the bootstrap list
of all three.

What is checked: every broker serves every partition and lists the live
brokers; librdkafka's idempotent producer and kafka-python see one log; a
broker killed with SIGKILL mid-stream loses nothing acknowledged and its
clients' retries on other brokers are not duplicated (producer state is in
PostgreSQL rows); a broker paused past its lease gets nothing committed; a
restart of PostgreSQL is survived by retries; consumer groups move with
their coordinator and keep their offsets; transactional offsets are pending
until the transaction ends (librdkafka's exactly-once copier, and `oncelog
audit`'s copier under cluster faults).
"""

import os
import signal
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KTopicPartition

from clients import (OP_TIMEOUT_S, admin, consumer_config, group_consumer, producer_config,
                     txn_producer)

from confluent_kafka.admin import NewTopic

pytestmark = pytest.mark.timeout(300)


def create(bootstrap, topic, partitions):
    a = admin(bootstrap)  # kept alive until the answer is in
    fs = a.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
        operation_timeout=OP_TIMEOUT_S)
    fs[topic].result(OP_TIMEOUT_S)


def read_partitions(bootstrap, topic, partitions, want, timeout=60):
    """Every record of the partitions (from offset 0) until `want` are read."""
    c = Consumer(consumer_config(bootstrap))
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append((m.partition(), m.offset(), m.value()))
        # a little longer: nothing more may come (no duplicates past `want`)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.offset(), m.value()))
        return got
    finally:
        c.close()


class Acks:
    def __init__(self):
        self.acked = []
        self.failed = []
        self.lock = threading.Lock()

    def __call__(self, err, msg):
        with self.lock:
            if err is not None:
                self.failed.append((err, msg.value()))
            else:
                self.acked.append((msg.partition(), msg.offset(), msg.value()))


def check_log_is_exactly(acked, got):
    """The log holds each acknowledged record once, at its acknowledged offset."""
    assert len(set(acked)) == len(acked)
    values = [v for (_, _, v) in got]
    dups = {v for v in values if values.count(v) > 1} if len(values) != len(set(values)) else set()
    assert not dups, f"{len(dups)} records are in the log twice, e.g. {sorted(dups)[:3]}"
    assert sorted(got) == sorted(acked), \
        f"log has {len(got)} records, {len(acked)} were acknowledged; " \
        f"missing {sorted(set(acked) - set(got))[:5]}"


@pytest.mark.parametrize("store", ["s3", "file"])
def test_three_brokers_serve_one_log(cluster_factory, store):
    cl = cluster_factory(store=store)
    create(cl.by_id(1).bootstrap, "fares", 6)
    md = admin(cl.by_id(3).bootstrap).list_topics(timeout=OP_TIMEOUT_S)
    assert sorted(md.brokers) == [1, 2, 3]
    leaders = {p.leader for p in md.topics["fares"].partitions.values()}
    assert len(leaders) >= 2, f"six partitions all led by {leaders}: no spread"

    acks = Acks()
    p = Producer(producer_config(cl.bootstrap, enable_idempotence=True, linger_ms=2))
    for i in range(3000):
        p.produce("fares", key=str(i % 97).encode(), value=f"fare-{i}".encode(), on_delivery=acks)
        p.poll(0)
    assert p.flush(60) == 0
    assert not acks.failed, acks.failed[:3]
    assert len(acks.acked) == 3000
    # every broker serves every partition: read through each one alone
    for b in cl.brokers:
        check_log_is_exactly(acks.acked, read_partitions(b.bootstrap, "fares", 6, 3000))

    # kafka-python, another client, writes and reads the same log
    kp = KafkaProducer(bootstrap_servers=cl.bootstrap, acks="all")
    futs = [kp.send("fares", value=f"kp-{i}".encode(), partition=i % 6) for i in range(60)]
    kmeta = [f.get(timeout=30) for f in futs]
    kp.close()
    kc = KafkaConsumer(bootstrap_servers=cl.by_id(2).bootstrap, enable_auto_commit=False,
                       consumer_timeout_ms=3000)
    kc.assign([KTopicPartition("fares", q) for q in range(6)])
    for q in range(6):
        kc.seek(KTopicPartition("fares", q), 0)
    seen = {(r.partition, r.offset): r.value for r in kc}
    kc.close()
    assert len(seen) == 3060
    for m, i in zip(kmeta, range(60)):
        assert seen[(m.partition, m.offset)] == f"kp-{i}".encode()
    # the rows say what the clients saw
    rows = cl.sql("SELECT sum(next_offset) FROM partitions")
    assert rows[0][0] == 3060


def test_kill9_of_a_broker_loses_nothing_and_retries_are_not_duplicated(cluster_factory):
    cl = cluster_factory(store="s3", overrides={"cluster.lease.ms": 2000})
    create(cl.by_id(1).bootstrap, "rides", 6)
    md = admin(cl.bootstrap).list_topics(timeout=OP_TIMEOUT_S)
    by_leader = {}
    for pid, pm in md.topics["rides"].partitions.items():
        by_leader.setdefault(pm.leader, []).append(pid)
    victim = max(by_leader, key=lambda k: len(by_leader[k]))

    acks = Acks()
    p = Producer(producer_config(cl.bootstrap, enable_idempotence=True, linger_ms=5,
                                 message_timeout_ms=60000, retry_backoff_ms=100))
    stop = threading.Event()
    sent = [0]

    def produce():
        i = 0
        while not stop.is_set() and i < 40000:
            try:
                p.produce("rides", value=f"ride-{i}".encode(), partition=i % 6, on_delivery=acks)
                i += 1
            except BufferError:
                p.poll(0.05)
            if i % 100 == 0:
                p.poll(0)
                time.sleep(0.01)
        sent[0] = i

    t = threading.Thread(target=produce)
    t.start()
    time.sleep(2.0)
    cl.by_id(victim).kill9()
    time.sleep(2.5)
    cl.by_id(victim).start()
    time.sleep(2.0)
    stop.set()
    t.join(30)
    assert p.flush(90) == 0
    assert not acks.failed, f"{len(acks.failed)} failed, e.g. {acks.failed[:3]}"
    assert len(acks.acked) == sent[0] > 1000
    check_log_is_exactly(acks.acked, read_partitions(cl.bootstrap, "rides", 6, sent[0]))
    log = cl.by_id(victim).log_text()
    assert "cluster mode: registered" in log and log.count("==== test harness: start") == 2
    # the restarted broker is a new session of its id
    assert cl.sql("SELECT session FROM brokers WHERE id = %s", victim)[0][0] == 2


def test_a_broker_paused_past_its_lease_commits_nothing_late(cluster_factory):
    cl = cluster_factory(store="file", n=2, overrides={"cluster.lease.ms": 1200})
    create(cl.by_id(1).bootstrap, "zombies", 1)
    paused = cl.by_id(1)
    # A producer that talks to the paused broker only.
    acks = Acks()
    p = Producer(producer_config(paused.bootstrap, enable_idempotence=True, linger_ms=1,
                                 message_timeout_ms=30000))
    for i in range(50):
        p.produce("zombies", value=f"early-{i}".encode(), on_delivery=acks)
    assert p.flush(30) == 0
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        for i in range(50):
            p.produce("zombies", value=f"paused-{i}".encode(), on_delivery=acks)
        p.poll(0.2)
        time.sleep(3.0)  # past the lease, by PostgreSQL's clock
        lease = cl.sql("SELECT lease_expires_at < clock_timestamp() FROM brokers WHERE id = 1")
        assert lease[0][0], "the paused broker's lease did not end"
        # the other broker goes on alone
        other = Producer(producer_config(cl.by_id(2).bootstrap, linger_ms=1))
        other.produce("zombies", value=b"other")
        assert other.flush(30) == 0
        md = admin(cl.by_id(2).bootstrap).list_topics(timeout=OP_TIMEOUT_S)
        assert sorted(md.brokers) == [2], "a broker past its lease is still listed"
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    assert p.flush(60) == 0
    assert not acks.failed, acks.failed[:3]
    got = read_partitions(cl.by_id(2).bootstrap, "zombies", 1, 101)
    # everything acknowledged is there once; the broker re-registered before
    # it acknowledged anything more (a new session)
    values = [v for (_, _, v) in got]
    assert len(values) == len(set(values)) == 101
    assert sorted(acks.acked) == sorted(g for g in got if g[2] != b"other")
    log = paused.log_text()
    assert "lease ended before it was renewed" in log or "is fenced" in log, \
        "the paused broker never noticed that its session ended"
    assert cl.sql("SELECT session FROM brokers WHERE id = 1")[0][0] >= 2


def read_values(bootstrap, topic, partitions, isolation, settle=2.0):
    """Every value readable from the partitions under an isolation level,
    reading until nothing new came for `settle` seconds."""
    c = Consumer(consumer_config(bootstrap, isolation_level=isolation))
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = []
        quiet_since = time.monotonic()
        deadline = time.monotonic() + 60
        while time.monotonic() - quiet_since < settle and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m.value())
            quiet_since = time.monotonic()
        return got
    finally:
        c.close()


def test_transactions_commit_abort_and_fence_a_zombie_across_brokers(cluster_factory):
    cl = cluster_factory(store="s3")
    create(cl.by_id(1).bootstrap, "fares-txn", 3)
    a = txn_producer(cl.bootstrap, "fare-writer")
    a.init_transactions(30)
    a.begin_transaction()
    for i in range(30):
        a.produce("fares-txn", value=f"c1-{i}".encode(), partition=i % 3)
    a.commit_transaction(30)
    a.begin_transaction()
    for i in range(10):
        a.produce("fares-txn", value=f"ab-{i}".encode(), partition=i % 3)
    a.flush(30)
    a.abort_transaction(30)

    # The zombie: A opens a transaction and writes; B, the same id, starts.
    a.begin_transaction()
    for i in range(5):
        a.produce("fares-txn", value=f"zombie-{i}".encode(), partition=i % 3)
    a.flush(30)
    b = txn_producer(cl.bootstrap, "fare-writer")
    b.init_transactions(30)  # fences A and aborts its open transaction
    b.begin_transaction()
    for i in range(7):
        b.produce("fares-txn", value=f"b-{i}".encode(), partition=i % 3)
    b.commit_transaction(30)
    with pytest.raises(Exception) as fenced:
        a.produce("fares-txn", value=b"zombie-late", partition=0)
        a.commit_transaction(15)
    assert "fenced" in str(fenced.value).lower() or "epoch" in str(fenced.value).lower(), \
        fenced.value

    committed = sorted(read_values(cl.by_id(2).bootstrap, "fares-txn", 3, "read_committed"))
    assert committed == sorted([f"c1-{i}".encode() for i in range(30)]
                               + [f"b-{i}".encode() for i in range(7)])
    everything = read_values(cl.by_id(3).bootstrap, "fares-txn", 3, "read_uncommitted")
    assert len(everything) == 30 + 10 + 5 + 7
    # each ended transaction left one marker per partition: no PREPARE state,
    # all markers of a transaction from one PostgreSQL transaction
    markers = cl.sql("SELECT count(*) FROM batches WHERE control")[0][0]
    assert markers == 4 * 3
    assert cl.sql("SELECT count(*) FROM producers WHERE txn_first_offset IS NOT NULL")[0][0] == 0
    state = cl.sql("SELECT meta->>'state', (meta->>'epoch')::int FROM transactions")
    assert state == [("CompleteCommit", 1)]


def test_a_transaction_past_its_timeout_is_aborted_and_the_lso_moves(cluster_factory):
    cl = cluster_factory(store="file", n=2)
    create(cl.by_id(1).bootstrap, "slow", 1)
    stuck = txn_producer(cl.by_id(1).bootstrap, "stuck-writer", transaction_timeout_ms=2000,
                         message_timeout_ms=2000)
    stuck.init_transactions(30)
    stuck.begin_transaction()
    stuck.produce("slow", value=b"never", partition=0)
    stuck.flush(30)
    later = Producer(producer_config(cl.by_id(2).bootstrap, enable_idempotence=True))
    later.produce("slow", value=b"after", partition=0)
    assert later.flush(30) == 0
    # Pinned by the open transaction, then freed by the timeout abort (run by
    # whichever broker looks first).
    assert read_values(cl.by_id(2).bootstrap, "slow", 1, "read_committed", settle=0.5) == []
    deadline = time.monotonic() + 20
    got = []
    while time.monotonic() < deadline and got != [b"after"]:
        got = read_values(cl.by_id(2).bootstrap, "slow", 1, "read_committed", settle=0.5)
    assert got == [b"after"]
    assert cl.sql("SELECT count(*) FROM aborted_txns")[0][0] == 1
    logs = cl.by_id(1).log_text() + cl.by_id(2).log_text()
    assert "transaction timed out; aborting it and fencing its producer" in logs
    # counted once, by the broker that aborted it, as local mode counts it
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    fences = 0
    for b in cl.brokers:
        with urllib.request.urlopen(b.metrics_url + "/metrics", timeout=10) as r:
            for fam in text_string_to_metric_families(r.read().decode()):
                fences += sum(x.value for x in fam.samples if x.name == "oncelog_transaction_fences_total"
                              and x.labels == {"transactional_id": "stuck-writer", "cause": "timeout"})
    assert fences == 1


def metric_sum(brokers, name):
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    total = 0
    for b in brokers:
        with urllib.request.urlopen(b.metrics_url + "/metrics", timeout=10) as r:
            for fam in text_string_to_metric_families(r.read().decode()):
                total += sum(x.value for x in fam.samples if x.name == name)
    return total


def test_caught_up_consumers_are_answered_from_memory_and_see_every_commit(cluster_factory):
    """A fetch at a partition's end, as its broker last read it, asks
    PostgreSQL nothing; every commit (data, and the markers that move the
    LSO, written by whichever broker coordinates the transaction) still
    reaches the waiting consumer through the commit's announcement. The
    remembered ends are trusted here for ten minutes, so a commit that did
    not invalidate one would hold a consumer for longer than this test."""
    cl = cluster_factory(store="file", n=2, overrides={"cluster.fetch.end.fresh.ms": "600000"})
    create(cl.by_id(1).bootstrap, "tail", 2)
    committed_c = Consumer(consumer_config(cl.bootstrap, isolation_level="read_committed"))
    uncommitted_c = Consumer(consumer_config(cl.bootstrap, isolation_level="read_uncommitted"))
    w = txn_producer(cl.bootstrap, "tail-writer")
    w.init_transactions(30)
    try:
        for c in (committed_c, uncommitted_c):
            c.assign([TopicPartition("tail", p, 0) for p in range(2)])
            assert c.poll(1.0) is None
        time.sleep(2)  # both caught up and long-polling
        before = metric_sum(cl.brokers, "oncelog_cluster_fetch_ends_from_memory_total")
        reads_before = metric_sum(cl.brokers, "oncelog_cluster_fetch_partitions_read_total")
        time.sleep(3)
        answered = metric_sum(cl.brokers, "oncelog_cluster_fetch_ends_from_memory_total") - before
        read = metric_sum(cl.brokers, "oncelog_cluster_fetch_partitions_read_total") - reads_before
        assert answered > 0 and read == 0, (answered, read)

        def wait_for(c, want, seconds=60):
            got, deadline = [], time.monotonic() + seconds
            while len(got) < len(want) and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is not None:
                    assert m.error() is None, m.error()
                    got.append(m.value())
            assert sorted(got) == sorted(want)

        for round_ in range(5):
            # an open transaction: read_uncommitted sees it, read_committed not yet
            w.begin_transaction()
            vals = [f"r{round_}-p{p}".encode() for p in range(2)]
            for p, v in enumerate(vals):
                w.produce("tail", value=v, partition=p)
            w.flush(30)
            wait_for(uncommitted_c, vals)
            assert committed_c.poll(0.5) is None
            if round_ % 2:
                w.abort_transaction(30)
                continue
            w.commit_transaction(30)
            # the markers moved the LSO; the read_committed consumer, long
            # polling at the old LSO, gets the data
            wait_for(committed_c, vals)
        assert committed_c.poll(1.0) is None
    finally:
        committed_c.close()
        uncommitted_c.close()


def test_audit_under_cluster_faults(private_cluster_services, tmp_path):
    """`oncelog audit` (zombie workload: transactional writers, worker kill -9,
    paused workers whose successors must fence them) against three brokers
    while PostgreSQL restarts, the S3 server stops for seconds, a broker is
    killed with SIGKILL and another paused past its lease. The long run is
    `tests/cluster_audit.py --duration 150` (README)."""
    from cluster_audit import run_audit
    faults = ("pg-restart", "store-outage", "broker-kill", "broker-pause")
    rc, report, done, _ = run_audit(tmp_path, private_cluster_services, 40, tmp_path / "report.json",
                                    faults=faults, seed=7)
    assert rc == 0, report.get("_output", "")[-3000:]
    assert set(done) == set(faults), f"only {done} were injected"
    assert report["txns_committed"] >= 100, report
    assert all(v == 0 for v in report["anomalies"].values()), report["anomalies"]


def test_exactly_once_copier_audit_under_cluster_faults(private_cluster_services, tmp_path):
    """`oncelog audit --workload copier` (Kafka's transactional copier: group
    members consuming read_committed, copying in transactions that carry
    their offsets; worker kill -9 and zombies) against three brokers under
    the same cluster faults: every input record is copied exactly once and
    the group's offsets never run ahead of the copies, while groups move
    between coordinators."""
    from cluster_audit import run_audit
    faults = ("pg-restart", "store-outage", "broker-kill", "broker-pause")
    rc, report, done, _ = run_audit(tmp_path, private_cluster_services, 45, tmp_path / "report.json",
                                    faults=faults, workload="copier", seed=3,
                                    extra=("--records", "6000", "--quiet-ms", "2500,4500"))
    assert rc == 0, report.get("_output", "")[-3000:]
    assert set(done) == set(faults), f"only {done} were injected"
    assert report["plain_writes"] == 6000 and report["txns_committed"] >= 40, report
    assert all(v == 0 for v in report["anomalies"].values()), report["anomalies"]


def test_exactly_once_copier_audit_under_network_partitions(cluster_services, tmp_path):
    """`oncelog audit --workload copier` against three brokers while one at a
    time is cut off: from PostgreSQL both ways for longer than its lease
    (its groups move to another coordinator, which must not overlap with it
    answering for them), from PostgreSQL one way, from the S3 server (hung
    PUTs and GETs), and from its clients. Every input record is copied
    exactly once and the group's offsets never run ahead of the copies."""
    from cluster_audit import PARTITIONS, run_audit
    rc, report, done, _ = run_audit(tmp_path, cluster_services, 50, tmp_path / "report.json",
                                    faults=PARTITIONS, workload="copier", seed=5,
                                    extra=("--records", "6000", "--quiet-ms", "2500,4500"))
    assert rc == 0, report.get("_output", "")[-3000:]
    assert set(done) == set(PARTITIONS), f"only {done} were injected"
    assert report["plain_writes"] == 6000 and report["txns_committed"] >= 40, report
    assert all(v == 0 for v in report["anomalies"].values()), report["anomalies"]


def poll_until(consumers, want, timeout=60):
    """Polls every consumer in turn until `want` records are read in all."""
    got = {i: [] for i in range(len(consumers))}
    deadline = time.monotonic() + timeout
    while sum(len(v) for v in got.values()) < want and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                got[i].append((m.partition(), m.offset(), m.value()))
    return got


def test_a_consumer_group_moves_with_its_coordinator_and_keeps_its_offsets(cluster_factory):
    """Two librdkafka consumers share a group through the broker coordinating
    it (claimed in PostgreSQL); offsets they commit are rows. The
    coordinator is killed with SIGKILL: a new member finds the group's new
    coordinator and starts exactly after what was committed; kafka-python
    reads the same committed offsets."""
    cl = cluster_factory(store="s3", overrides={"cluster.lease.ms": 2000})
    create(cl.by_id(1).bootstrap, "orders", 6)
    p = Producer(producer_config(cl.bootstrap, enable_idempotence=True))
    for i in range(600):
        p.produce("orders", value=f"o-{i}".encode(), partition=i % 6)
    assert p.flush(60) == 0

    a = group_consumer(cl.bootstrap, "billing")
    b = group_consumer(cl.bootstrap, "billing")
    a.subscribe(["orders"])
    b.subscribe(["orders"])
    got = poll_until([a, b], 600)
    values = [v for rs in got.values() for (_, _, v) in rs]
    assert sorted(values) == sorted(f"o-{i}".encode() for i in range(600)), \
        f"read {len(values)} of 600, {len(values) - len(set(values))} twice"
    # both members had partitions, none shared by both
    parts = [{p for (p, _, _) in got[i]} for i in (0, 1)]
    assert parts[0] and parts[1] and not (parts[0] & parts[1]), parts
    for c in (a, b):
        c.commit(asynchronous=False)
    owner = cl.sql("SELECT broker_id FROM group_owners WHERE group_id = 'billing'")
    assert len(owner) == 1
    coordinator = owner[0][0]
    rows = cl.sql("SELECT partition, offset_value FROM group_offsets "
                  "WHERE group_id = 'billing' AND topic = 'orders' ORDER BY partition")
    assert rows == [(q, 100) for q in range(6)], rows
    ad = admin(cl.by_id(coordinator).bootstrap)  # kept alive until the answer is in
    g = ad.describe_consumer_groups(["billing"])["billing"].result(OP_TIMEOUT_S)
    assert len(g.members) == 2 and g.coordinator.id == coordinator
    a.close()
    b.close()

    cl.by_id(coordinator).kill9()
    for i in range(600, 900):
        p.produce("orders", value=f"o-{i}".encode(), partition=i % 6)
    assert p.flush(60) == 0
    c = group_consumer(cl.bootstrap, "billing")
    c.subscribe(["orders"])
    after = poll_until([c], 300)[0]
    # a little longer: nothing before the committed offsets comes again
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        m = c.poll(0.1)
        if m is not None and m.error() is None:
            after.append((m.partition(), m.offset(), m.value()))
    assert sorted(v for (_, _, v) in after) == sorted(f"o-{i}".encode() for i in range(600, 900))
    c.commit(asynchronous=False)
    c.close()
    moved = cl.sql("SELECT broker_id FROM group_owners WHERE group_id = 'billing'")[0][0]
    assert moved != coordinator
    rows = cl.sql("SELECT partition, offset_value FROM group_offsets "
                  "WHERE group_id = 'billing' AND topic = 'orders' ORDER BY partition")
    assert rows == [(q, 150) for q in range(6)], rows

    # kafka-python asks the new coordinator for the same offsets
    live = [x for x in cl.brokers if x.proc is not None and x.proc.poll() is None]
    kc = KafkaConsumer(bootstrap_servers=[x.bootstrap for x in live], group_id="billing",
                       enable_auto_commit=False)
    try:
        for q in range(6):
            assert kc.committed(KTopicPartition("orders", q)) == 150
    finally:
        kc.close()

    # `oncelog cluster info` from the database: the killed broker's lease is
    # over, the group's coordinator is live, the store answers.
    info = cluster_info(cl, "--object-store", cl.store)
    by_id = {b["id"]: b for b in info["brokers"]}
    assert not by_id[coordinator]["live"] and by_id[coordinator]["lease_left_ms"] < 0, by_id
    assert all(b["live"] for i, b in by_id.items() if i != coordinator), by_id
    assert info["groups"] == [{"group": "billing", "coordinator": moved,
                               "session": by_id[moved]["session"], "live": True}]
    assert info["topics"] == 1 and info["partitions"] == 6 and info["offsets"] == 900
    assert info["object_store"]["ok"], info["object_store"]
    assert info["open_transactions"] == 0 and info["pending_transactional_offsets"] == 0


def cluster_info(cl, *args, db=None):
    """`oncelog cluster info --postgres … --json`, with the S3 credentials."""
    import json
    import subprocess
    from cluster_env import s3_broker_env
    from conftest import oncelog_bin
    env = {**os.environ, **s3_broker_env(cl.env)}
    r = subprocess.run([str(oncelog_bin()), "cluster", "info", "--postgres", db or cl.db,
                        "--json", *args], capture_output=True, text=True, timeout=60, env=env)
    if db is not None:
        return r
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_cluster_info_refuses_a_database_that_is_not_a_cluster_and_writes_nothing(
        cluster_services):
    import psycopg
    from cluster_env import fresh_database
    db = fresh_database(cluster_services)

    class Bare:
        env = cluster_services

    r = cluster_info(Bare, db=db)
    assert r.returncode == 1 and "is not an oncelog cluster's database" in r.stderr, r.stderr
    with psycopg.connect(db) as c:
        n = c.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0]
    assert n == 0, "cluster info created tables"


def test_read_process_write_with_transactional_offsets_across_brokers(cluster_factory):
    """librdkafka's exactly-once copier against three brokers: a group
    consumer (read_committed) and a transactional producer that sends the
    consumer's offsets in each transaction. The offsets are pending rows
    until EndTxn: an aborted transaction leaves the committed offsets and
    the output as they were; while a transaction holds pending offsets a
    read_committed consumer's OffsetFetch is UNSTABLE (KIP-447) and it
    cannot start; a zombie with the old epoch cannot commit offsets."""
    from confluent_kafka import KafkaException
    cl = cluster_factory(store="s3")
    create(cl.by_id(1).bootstrap, "in", 3)
    create(cl.by_id(2).bootstrap, "out", 3)
    # the broker's own names are not a client's: `__consumer_offsets` stands
    # for a group's offsets inside transactions
    from confluent_kafka import KafkaError
    ad = admin(cl.by_id(3).bootstrap)
    for internal in ("__consumer_offsets", "__transaction_state"):
        fs = ad.create_topics([NewTopic(internal, num_partitions=1, replication_factor=1)],
                              operation_timeout=OP_TIMEOUT_S)
        with pytest.raises(KafkaException) as refused:
            fs[internal].result(OP_TIMEOUT_S)
        assert refused.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, refused.value
    assert cl.sql("SELECT count(*) FROM topics WHERE name IN "
                  "('__consumer_offsets', '__transaction_state')")[0][0] == 0
    p = Producer(producer_config(cl.bootstrap, enable_idempotence=True))
    for i in range(300):
        p.produce("in", value=f"v-{i}".encode(), partition=i % 3)
    assert p.flush(60) == 0

    def consumer():
        c = group_consumer(cl.bootstrap, "copier", **{"isolation.level": "read_committed"})
        c.subscribe(["in"])
        return c

    def copier_producer():
        tp = txn_producer(cl.bootstrap, "copier-1", linger_ms=5)
        tp.init_transactions(OP_TIMEOUT_S)
        return tp

    c = consumer()
    tp = copier_producer()
    copied = 0
    aborted_once = False
    deadline = time.monotonic() + 90
    while copied < 300 and time.monotonic() < deadline:
        msgs = [m for m in c.consume(50, 0.5) if m.error() is None]
        if not msgs:
            continue
        tp.begin_transaction()
        for m in msgs:
            tp.produce("out", value=b"copy-" + m.value(), partition=m.partition())
        tp.send_offsets_to_transaction(c.position(c.assignment()),
                                       c.consumer_group_metadata(), OP_TIMEOUT_S)
        if not aborted_once:
            aborted_once = True
            tp.abort_transaction(OP_TIMEOUT_S)
            assert cl.sql("SELECT count(*) FROM group_pending_offsets")[0][0] == 0
            assert cl.sql("SELECT count(*) FROM group_offsets WHERE group_id = 'copier'")[0][0] == 0
            # back to what is committed (nothing yet: the beginning)
            for tpart in c.assignment():
                c.seek(TopicPartition(tpart.topic, tpart.partition, 0))
            continue
        tp.commit_transaction(OP_TIMEOUT_S)
        copied += len(msgs)
    assert copied == 300, copied
    rows = cl.sql("SELECT partition, offset_value FROM group_offsets "
                  "WHERE group_id = 'copier' AND topic = 'in' ORDER BY partition")
    assert rows == [(q, 100) for q in range(3)], rows
    assert cl.sql("SELECT count(*) FROM group_pending_offsets")[0][0] == 0
    out = read_partitions(cl.bootstrap, "out", 3, 300)
    values = sorted(v for (_, _, v) in out)
    assert values == sorted(f"copy-v-{i}".encode() for i in range(300)), \
        f"{len(values)} copies, {len(values) - len(set(values))} twice"
    c.close()

    # An open transaction with pending offsets: a new member cannot start
    # from the offset about to change (UNSTABLE_OFFSET_COMMIT until the end).
    for i in range(300, 330):
        p.produce("in", value=f"v-{i}".encode(), partition=i % 3)
    assert p.flush(60) == 0
    meta_c = consumer()
    msgs = []
    deadline = time.monotonic() + 30
    while len(msgs) < 30 and time.monotonic() < deadline:
        msgs += [m for m in meta_c.consume(30, 0.5) if m.error() is None]
    assert len(msgs) == 30
    tp.begin_transaction()
    tp.send_offsets_to_transaction(meta_c.position(meta_c.assignment()),
                                   meta_c.consumer_group_metadata(), OP_TIMEOUT_S)
    assert cl.sql("SELECT count(*) FROM group_pending_offsets")[0][0] == 3
    other = group_consumer(cl.bootstrap, "copier-watch", **{"isolation.level": "read_committed"})
    with offsets_unstable(other, cl, "copier") as unstable:
        assert unstable, "OffsetFetch answered while offsets were pending"
    # A zombie: a new producer with the same id fences the open one; the
    # transaction is aborted and its pending offsets dropped.
    tp2 = copier_producer()
    assert cl.sql("SELECT count(*) FROM group_pending_offsets")[0][0] == 0
    with pytest.raises(KafkaException):
        tp.commit_transaction(OP_TIMEOUT_S)
    rows = cl.sql("SELECT partition, offset_value FROM group_offsets "
                  "WHERE group_id = 'copier' AND topic = 'in' ORDER BY partition")
    assert rows == [(q, 100) for q in range(3)], rows
    with offsets_unstable(other, cl, "copier") as unstable:
        assert not unstable, "OffsetFetch refused with nothing pending"
    meta_c.close()
    other.close()
    del tp2


class offsets_unstable:
    """Whether `consumer` (read_committed) cannot fetch `group`'s committed
    offsets while they are pending: asks with a short timeout."""

    def __init__(self, consumer, cl, group):
        self.consumer, self.cl, self.group = consumer, cl, group

    def __enter__(self):
        from confluent_kafka import Consumer as C, KafkaException
        probe = C({"bootstrap.servers": self.cl.bootstrap, "broker.address.family": "v4",
                   "group.id": self.group, "isolation.level": "read_committed",
                   "enable.auto.commit": False})
        try:
            probe.committed([TopicPartition("in", 0)], timeout=3)
            return False
        except KafkaException:
            return True
        finally:
            probe.close()

    def __exit__(self, *exc):
        return False


def test_the_console_is_served_in_cluster_mode(cluster_factory):
    """Every console page of one cluster broker answers (its views and
    actions: test_console.py, through three brokers), and /metrics too."""
    import urllib.request
    c = cluster_factory(n=1, overrides={"console.actions.enable": "true"})
    http = "http://" + c.brokers[0].overrides["metrics.listen"]
    for path in ("/", "/v1/console/overview", "/v1/console/stuck", "/v1/console/transactions",
                 "/v1/console/groups", "/v1/console/transaction?id=x"):
        with urllib.request.urlopen(http + path, timeout=10) as r:
            assert r.status == 200, path
    with urllib.request.urlopen(http + "/metrics", timeout=10) as r:
        assert r.status == 200 and "oncelog_" in r.read().decode()


def test_metadata_lists_only_the_brokers_on_the_clients_listener(cluster_factory):
    """Two brokers; only broker 1 has a second listener, INTERNAL. A client
    that came in on INTERNAL is told only of broker 1 (broker 2's PLAINTEXT
    address is not for it), every partition is led by broker 1 and a
    transactional id's coordinator is broker 1; a client on PLAINTEXT sees
    both. Writes through either listener land in one log."""
    from conftest import free_port
    cl = cluster_factory(store="file", n=2, start=False)
    internal = free_port()
    b1 = cl.by_id(1)
    b1.overrides["listeners"] = (f"PLAINTEXT://127.0.0.1:{b1.port},"
                                 f"INTERNAL://127.0.0.1:{internal}")
    b1.overrides["listener.security.protocol.map"] = "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT"
    cl.start()
    create(cl.bootstrap, "by-listener", 4)
    inside = f"127.0.0.1:{internal}"

    md = admin(cl.bootstrap).list_topics(timeout=OP_TIMEOUT_S)
    assert sorted(md.brokers) == [1, 2]
    md = admin(inside).list_topics(timeout=OP_TIMEOUT_S)
    assert sorted(md.brokers) == [1]
    assert (md.brokers[1].host, md.brokers[1].port) == ("127.0.0.1", internal)
    assert {p.leader for p in md.topics["by-listener"].partitions.values()} == {1}
    assert all(p.error is None for p in md.topics["by-listener"].partitions.values())

    # a transaction through INTERNAL: its coordinator must be reachable
    t = txn_producer(inside, "listener-writer")
    t.init_transactions(30)
    t.begin_transaction()
    for i in range(8):
        t.produce("by-listener", value=f"in-{i}".encode(), partition=i % 4)
    t.commit_transaction(30)
    p = Producer(producer_config(cl.bootstrap, enable_idempotence=True))
    for i in range(8):
        p.produce("by-listener", value=f"out-{i}".encode(), partition=i % 4)
    assert p.flush(30) == 0
    got = sorted(read_values(cl.by_id(2).bootstrap, "by-listener", 4, "read_committed"))
    assert got == sorted([f"in-{i}".encode() for i in range(8)]
                         + [f"out-{i}".encode() for i in range(8)])

