"""Seed scenarios S3 and S4 and Kafka's own transaction integration cases,
with librdkafka producers and consumers against a real broker."""

import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from clients import (consumer_config, create_topic, flush_all, lso, producer_config, read_partition,
                     txn_producer, unique_topic)
from conftest import both_modes, wait_until


def read_all_committed(bootstrap, topic, partitions, timeout=60):
    """Every read_committed record of every partition, up to the LSO."""
    out = []
    for p in range(partitions):
        end = lso(bootstrap, topic, p)
        if end == 0:
            continue
        out += [(p, o, v) for o, v in read_partition(bootstrap, topic, p, 0, "read_committed", end, timeout)]
    return out


@both_modes()
def test_s3_one_id_per_shard_only_the_restarted_shard_is_fenced(broker):
    topic = unique_topic("s3")
    create_topic(broker.bootstrap, topic, partitions=12)
    shards = [txn_producer(broker.bootstrap, f"fare-writer-{i}") for i in range(12)]
    for p in shards:
        p.init_transactions(30)
    committed = []
    for round_ in range(3):
        for i, p in enumerate(shards):
            p.begin_transaction()
            v = f"shard{i}-round{round_}".encode()
            p.produce(topic, value=v, partition=i)
            p.commit_transaction(30)
            committed.append(v)
    # Shard 7's owner is restarted while its old process has a transaction open.
    shards[7].begin_transaction()
    shards[7].produce(topic, value=b"shard7-lost", partition=7)
    shards[7].flush(30)
    new7 = txn_producer(broker.bootstrap, "fare-writer-7")
    new7.init_transactions(30)
    with pytest.raises(KafkaException):
        shards[7].commit_transaction(10)
    # The other eleven go on without an error.
    for round_ in range(3, 5):
        for i, p in enumerate(shards):
            if i == 7:
                p = new7
            p.begin_transaction()
            v = f"shard{i}-round{round_}".encode()
            p.produce(topic, value=v, partition=i)
            p.commit_transaction(30)
            committed.append(v)
    got = read_all_committed(broker.bootstrap, topic, 12)
    values = [v for _, _, v in got]
    assert sorted(values) == sorted(committed), "every committed record read exactly once"
    assert b"shard7-lost" not in values
    fences = [line for line in broker.log_text().splitlines() if "fenced" in line and "WARN" in line]
    assert fences and all("fare-writer-7" in line for line in fences), fences


@both_modes()
def test_s4_fresh_id_per_start_pins_lso_until_timeout(broker):
    topic = unique_topic("s4")
    create_topic(broker.bootstrap, topic)
    old = txn_producer(broker.bootstrap, "fare-writer-7-a3f9",
                       **{"transaction.timeout.ms": 3000, "message.timeout.ms": 3000})
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, value=b"orphan", partition=0)
    old.flush(30)
    # The old process vanishes without a word; a new one starts with a fresh id.
    new = txn_producer(broker.bootstrap, "fare-writer-7-b812")
    new.init_transactions(30)
    new.begin_transaction()
    new.produce(topic, value=b"fresh", partition=0)
    new.commit_transaction(30)
    assert "fenced" not in broker.log_text(), "a fresh id fences nothing"
    # The orphan pins the last stable offset: read_committed sees nothing yet.
    assert lso(broker.bootstrap, topic, 0) == 0
    # Until the coordinator aborts it after transaction.timeout.ms.
    wait_until(lambda: lso(broker.bootstrap, topic, 0) == 4, 20, interval=0.3,
               what="the timed-out transaction to be aborted")
    assert "transaction timed out" in broker.log_text()
    got = read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 4)
    assert [v for _, v in got] == [b"fresh"]
    # Two idempotent producers (no transactional id) write the same partition freely.
    a = Producer(producer_config(broker.bootstrap, **{"enable.idempotence": True}))
    b = Producer(producer_config(broker.bootstrap, **{"enable.idempotence": True}))
    for i in range(100):
        a.produce(topic, value=b"a%d" % i, partition=0)
        b.produce(topic, value=b"b%d" % i, partition=0)
    flush_all(a)
    flush_all(b)
    got = read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 204)
    assert len(got) == 201 and len({v for _, v in got}) == 201


@both_modes()
def test_fencing_on_add_partitions(broker):
    topic = unique_topic("fence-add")
    create_topic(broker.bootstrap, topic, partitions=2)
    zombie = txn_producer(broker.bootstrap, "fence-add-" + topic)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"z0", partition=0)
    zombie.flush(30)
    fresh = txn_producer(broker.bootstrap, "fence-add-" + topic)
    fresh.init_transactions(30)
    # A partition the zombie has not added yet: AddPartitionsToTxn is fenced.
    errors = []
    zombie.produce(topic, value=b"z1", partition=1, on_delivery=lambda e, m: errors.append(e))
    try:
        zombie.flush(10)
    except (KafkaException, SystemError) as e:
        errors.append(e)
    with pytest.raises(KafkaException) as e:
        zombie.commit_transaction(10)
    assert "fenced" in str(e.value).lower(), str(e.value)
    assert read_all_committed(broker.bootstrap, topic, 2) == []
    assert "AddPartitionsToTxn from a fenced producer" in broker.log_text()


@both_modes()
def test_fencing_after_transaction_timeout(broker):
    topic = unique_topic("fence-timeout")
    create_topic(broker.bootstrap, topic)
    # librdkafka's smallest transaction.timeout.ms is 1000.
    p = txn_producer(broker.bootstrap, "short-" + topic,
                     **{"transaction.timeout.ms": 1000, "message.timeout.ms": 1000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"first", partition=0)
    p.flush(10)
    wait_until(lambda: "transaction timed out" in broker.log_text(), 10, what="the timeout abort")
    errors = []
    p.produce(topic, value=b"second", partition=0, on_delivery=lambda e, m: errors.append(e))
    try:
        p.flush(10)
    except (KafkaException, SystemError) as e:
        errors.append(e)
    with pytest.raises(KafkaException):
        p.commit_transaction(10)
    assert read_all_committed(broker.bootstrap, topic, 1) == [], "nothing of a timed-out transaction is visible"
    line = [x for x in broker.log_text().splitlines() if "timed out" in x][0]
    assert "short-" + topic in line and "new_epoch=1" in line, line


@both_modes()
def test_markers_across_many_partitions(broker):
    topic = unique_topic("wide")
    create_topic(broker.bootstrap, topic, partitions=12)
    p = txn_producer(broker.bootstrap, "wide-" + topic)
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(6000):
        p.produce(topic, value=b"c%05d" % i, partition=i % 12)
    p.commit_transaction(60)
    p.begin_transaction()
    for i in range(6000):
        p.produce(topic, value=b"a%05d" % i, partition=i % 12)
    p.flush(60)
    p.abort_transaction(60)
    got = read_all_committed(broker.bootstrap, topic, 12)
    assert sorted(v for _, _, v in got) == [b"c%05d" % i for i in range(6000)]
    for part in range(12):
        assert lso(broker.bootstrap, topic, part) == 1002, "500 + marker + 500 + marker"


@both_modes()
def test_long_poll_spanning_an_aborted_transaction(broker):
    """A read_committed consumer already waiting in a long poll sees only the
    committed transaction that follows an aborted one."""
    topic = unique_topic("longpoll")
    create_topic(broker.bootstrap, topic)
    c = Consumer(consumer_config(broker.bootstrap, **{"isolation.level": "read_committed",
                                                      "fetch.wait.max.ms": 5000}))
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    stop = time.monotonic() + 20

    def poll():
        while time.monotonic() < stop and len(got) < 3:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.5)
    p = txn_producer(broker.bootstrap, "lp-" + topic)
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=b"aborted-%d" % i, partition=0)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=b"committed-%d" % i, partition=0)
    p.commit_transaction(30)
    t.join(25)
    c.close()
    assert got == [b"committed-0", b"committed-1", b"committed-2"]


@both_modes()
def test_s2_one_id_eight_replicas_fence_each_other(broker):
    """Eight replicas share one transactional id and re-initialise whenever
    they are fenced. They keep fencing each other; every fence is a warning
    naming the id; exactly the records whose commit succeeded are visible."""
    topic = unique_topic("s2")
    create_topic(broker.bootstrap, topic)
    deadline = time.monotonic() + 8
    lock = threading.Lock()
    committed, fenced_seen = [], [0]

    def replica(n):
        seq = 0
        while time.monotonic() < deadline:
            p = txn_producer(broker.bootstrap, "fare-writer", **{"message.timeout.ms": 5000,
                                                                "transaction.timeout.ms": 5000})
            try:
                p.init_transactions(10)
                while time.monotonic() < deadline:
                    v = f"r{n}-{seq}".encode()
                    seq += 1
                    p.begin_transaction()
                    p.produce(topic, value=v, partition=0)
                    p.commit_transaction(10)
                    with lock:
                        committed.append(v)
            except (KafkaException, SystemError):
                with lock:
                    fenced_seen[0] += 1
            finally:
                try:
                    p.flush(0)
                except (KafkaException, SystemError):
                    pass

    threads = [threading.Thread(target=replica, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    alarms = [x for x in broker.log_text().splitlines()
              if "WARN" in x and "fenced" in x and "fare-writer" in x]
    assert len(alarms) >= 8, f"only {len(alarms)} fence warnings"
    assert fenced_seen[0] >= 1
    got = read_all_committed(broker.bootstrap, topic, 1)
    values = sorted(v for _, _, v in got)
    assert values == sorted(committed), "exactly the successfully committed records are visible"
    print(f"S2: {len(committed)} commits, {fenced_seen[0]} fenced replicas, {len(alarms)} fence warnings")


def copy_difference(tag, upto, mine, want, out, broker):
    """What a copy got wrong, in a few lines rather than two long lists: the
    first index where it departs from the input, duplicates, the missing
    range, where the job's records sit in the output, and the broker's log
    lines about the copier's transactional id."""
    first = next((i for i, (a, b) in enumerate(zip(mine, want)) if a != b), min(len(mine), len(want)))
    seen, dups = set(), []
    for v in mine:
        if v in seen:
            dups.append(v)
        seen.add(v)
    missing = [v for v in want if v not in seen]
    extra = [v for v in seen if v not in set(want)]
    offsets = [(o, v) for _, o, v in out if v.startswith(tag.encode() + b":")]
    around = offsets[max(first - 3, 0):first + 3]
    log = [x for x in broker.log_text().splitlines() if "orders-sink-0" in x or "job-" + tag in x][-40:]
    return (f"job {tag}: committed offset {upto}, {len(mine)} records in the output; first departure at "
            f"index {first}; {len(dups)} duplicates (first {dups[:5]}); {len(missing)} missing (first "
            f"{missing[:5]}); {len(extra)} past the committed offset (first {sorted(extra)[:5]}); output "
            f"offsets around the departure {around}; broker log:\n" + "\n".join(log))


@both_modes("broker_factory")
def test_s5_blue_green_with_one_prefix_fences_in_a_loop_and_loses_nothing(broker_factory, tmp_path):
    """Job v1 and job v2 copy the same input with the same transactional id
    (one prefix). Each start fences the other; an orchestrator restarts
    whichever was fenced: a loop. Per job, read_committed output is exactly
    the input up to that job's committed offset, once, in order: nothing in
    flight becomes visible and nothing committed is lost."""
    import subprocess
    import sys as _sys

    from conftest import REPO_ROOT

    b = broker_factory({"group.initial.rebalance.delay.ms": 0})
    src, dst = unique_topic("orders"), unique_topic("orders-enriched")
    create_topic(b.bootstrap, src)
    create_topic(b.bootstrap, dst)
    # Orders keep arriving during the whole run (a job notices it is fenced
    # at its next transaction).
    seed = Producer(producer_config(b.bootstrap))
    feeding = threading.Event()
    fed = [0]

    def feed():
        while not feeding.is_set() and fed[0] < 20000:
            seed.produce(src, value=b"order-%05d" % fed[0], partition=0)
            fed[0] += 1
            if fed[0] % 20 == 0:
                seed.poll(0)
                time.sleep(0.02)
        flush_all(seed)

    feeder = threading.Thread(target=feed)
    feeder.start()

    starts = [0]

    def start(tag):
        starts[0] += 1
        log = tmp_path / f"job-{tag}-{starts[0]}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                [_sys.executable, str(REPO_ROOT / "tests" / "copier.py"), "--bootstrap", b.bootstrap,
                 "--group", f"job-{tag}", "--txn-id", "orders-sink-0", "--input", src, "--output", dst,
                 "--tag", tag, "--max-batch", "50", "--txn-sleep-ms", "10"],
                stdout=f, stderr=f)
        proc.log = log
        return proc

    jobs = {"v1": start("v1")}
    time.sleep(3)
    jobs["v2"] = start("v2")
    fenced = {"v1": 0, "v2": 0}
    end = time.monotonic() + 15
    try:
        while time.monotonic() < end:
            for tag, proc in list(jobs.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                assert rc == 3, (f"job {tag} exited with {rc}, not as fenced; its log:\n"
                                 + "\n".join(proc.log.read_text(errors="replace").splitlines()[-30:]))
                fenced[tag] += 1
                time.sleep(0.3)
                jobs[tag] = start(tag)
            time.sleep(0.1)
    finally:
        feeding.set()
        feeder.join(30)
        for proc in jobs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in jobs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    assert fenced["v1"] + fenced["v2"] >= 3, f"no fencing loop: {fenced}"
    assert fenced["v1"] >= 1 and fenced["v2"] >= 1, fenced
    alarms = [x for x in b.log_text().splitlines() if "WARN" in x and "fenced" in x and "orders-sink-0" in x]
    assert len(alarms) >= 3

    c = Consumer(consumer_config(b.bootstrap))
    committed = {}
    for tag in ("v1", "v2"):
        gc = Consumer(consumer_config(b.bootstrap, **{"group.id": f"job-{tag}"}))
        committed[tag] = gc.committed([TopicPartition(src, 0)], timeout=15)[0].offset
        gc.close()
    c.close()
    out = read_all_committed(b.bootstrap, dst, 1)
    for tag in ("v1", "v2"):
        mine = [v for _, _, v in out if v.startswith(tag.encode() + b":")]
        upto = max(committed[tag], 0)
        want = [tag.encode() + b":order-%05d" % i for i in range(upto)]
        assert mine == want, copy_difference(tag, upto, mine, want, out, b)
    print(f"S5: fenced {fenced}, committed offsets {committed}, {len(out)} output records")


@both_modes("broker_factory")
def test_txn_offset_commit_with_stale_group_metadata_is_fenced(broker_factory):
    """KIP-447: offsets sent to a transaction carry the consumer's generation
    and member id; a stale generation is refused (ILLEGAL_GENERATION), the
    transaction must abort, and the group's offsets do not move."""
    b = broker_factory({"group.initial.rebalance.delay.ms": 0})
    topic = unique_topic("kip447")
    create_topic(b.bootstrap, topic, partitions=2)

    def member():
        c = Consumer(consumer_config(b.bootstrap, **{"group.id": "g447", "isolation.level": "read_committed",
                                                     "auto.offset.reset": "earliest",
                                                     "heartbeat.interval.ms": 200}))
        c.subscribe([topic])
        return c

    c1 = member()
    wait_until(lambda: c1.poll(0.1) is None and len(c1.assignment()) == 2, 20, what="c1 owns both partitions")
    stale = c1.consumer_group_metadata()
    c2 = member()

    def balanced():
        c1.poll(0.05)
        c2.poll(0.05)
        return len(c1.assignment()) == 1 and len(c2.assignment()) == 1
    wait_until(balanced, 30, what="the group to rebalance to two members")

    p = txn_producer(b.bootstrap, "kip447-" + topic)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"x", partition=0)
    with pytest.raises(KafkaException) as e:
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], stale, 10)
    assert e.value.args[0].code() == KafkaError.ILLEGAL_GENERATION, e.value
    p.abort_transaction(30)
    # With current metadata the same commit goes through.
    p.begin_transaction()
    p.produce(topic, value=b"y", partition=0)
    mine = [tp for tp in c1.assignment()][0]
    p.send_offsets_to_transaction([TopicPartition(topic, mine.partition, 1)], c1.consumer_group_metadata(), 10)
    p.commit_transaction(30)
    got = c1.committed([TopicPartition(topic, mine.partition)], timeout=10)[0].offset
    assert got == 1
    c1.close()
    c2.close()


@both_modes()
def test_fencing_after_a_100ms_transaction_timeout_kafka_python(broker):
    """Kafka's case with its numbers (librdkafka refuses timeouts under 1 s,
    kafka-python does not): transaction.timeout.ms=100, sleep, the next send
    is fenced and nothing of the transaction is visible."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KPError

    topic = unique_topic("t100")
    create_topic(broker.bootstrap, topic)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="t100-" + topic,
                      transaction_timeout_ms=100)
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, value=b"first", partition=0).get(timeout=30)
    wait_until(lambda: "transaction timed out" in broker.log_text(), 10, what="the timeout abort")
    with pytest.raises(KPError):
        p.send(topic, value=b"second", partition=0).get(timeout=30)
        p.commit_transaction()
    p.close(timeout=5)
    assert read_all_committed(broker.bootstrap, topic, 1) == []
