"""Thin helpers over confluent-kafka and kafka-python for the integration
tests, and the one home of the small helpers several test modules share:
transactional producers, reading a partition back, end offsets, committed
offsets, the `oncelog` CLI and /metrics.

Records read back by either client are normalised to `Rec` so the tests can
compare what each client saw byte for byte.

tests/conftest.py is imported inside the functions that need it (the CLI
binary, wait_until), never at module level, so conftest may import this
module one day without a cycle.
"""

import json
import os
import subprocess
import time
import urllib.request
import uuid
from collections import namedtuple

import pytest
from confluent_kafka import (Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException,
                             Producer, TopicPartition, TIMESTAMP_CREATE_TIME)
from confluent_kafka.admin import AdminClient, NewTopic

# offset, key, value, headers (list of (str, bytes|None)), timestamp type
# (0 = CreateTime, 1 = LogAppendTime), timestamp ms
Rec = namedtuple("Rec", "offset key value headers ts_type ts")

OP_TIMEOUT_S = 30


def unique_topic(prefix="t"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------- confluent

def producer_config(bootstrap, **extra):
    conf = {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "enable.idempotence": False,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 60000,
    }
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


def consumer_config(bootstrap, **extra):
    # Manual assignment only: the broker has no group coordinator yet, so the
    # group id is a required placeholder that is never joined or committed to.
    conf = {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "group.id": "oncelog-tests-assign-only",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": 100,
    }
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


def admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})


def create_topic(bootstrap, topic, partitions=1, config=None):
    a = admin(bootstrap)
    fs = a.create_topics([NewTopic(topic, num_partitions=partitions,
                                   replication_factor=1, config=config or {})],
                         operation_timeout=OP_TIMEOUT_S)
    fs[topic].result(OP_TIMEOUT_S)
    wait_for_topic(bootstrap, topic, partitions)


def topic_metadata(bootstrap, topic=None):
    return admin(bootstrap).list_topics(topic=topic, timeout=OP_TIMEOUT_S)


def wait_for_topic(bootstrap, topic, partitions, timeout=OP_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        md = topic_metadata(bootstrap)
        t = md.topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions \
                and all(p.leader in md.brokers for p in t.partitions.values()):
            return t
        last = t
        time.sleep(0.1)
    pytest.fail(f"topic {topic} with {partitions} partitions led by listed brokers never "
                f"appeared in metadata; last seen: {last!r}")


class DeliveryTracker:
    """Delivery-report callback that records every acknowledged message."""

    def __init__(self):
        self.acked = []    # (partition, offset, value, key)
        self.failed = []   # (error, value)

    def __call__(self, err, msg):
        if err is not None:
            self.failed.append((err, msg.value()))
        else:
            self.acked.append((msg.partition(), msg.offset(), msg.value(), msg.key()))


def flush_all(producer, timeout=OP_TIMEOUT_S):
    remaining = producer.flush(timeout)
    if remaining:
        pytest.fail(f"{remaining} messages still undelivered after {timeout}s flush")


def txn_producer(bootstrap, txn_id, **extra):
    """A transactional (so idempotent) librdkafka producer; `extra` settings
    (dotted, or with underscores for dots) go over producer_config's."""
    conf = producer_config(bootstrap, **{"transactional.id": txn_id, "enable.idempotence": True,
                                         "linger.ms": 1})
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return Producer(conf)


def produce(bootstrap, topic, records, partition=None, **conf):
    """Writes `records` (bare values, or (key, value) pairs) in order with one
    plain producer (producer_config(bootstrap, **conf)) and flushes; fails on
    any delivery error. partition=None: the partitioner picks."""
    p = Producer(producer_config(bootstrap, **conf))
    failed = []

    def report(err, _msg):
        if err is not None:
            failed.append(err)
    where = {} if partition is None else {"partition": partition}
    for r in records:
        key, value = r if isinstance(r, tuple) else (None, r)
        p.produce(topic, key=key, value=value, on_delivery=report, **where)
    flush_all(p)
    assert not failed, f"delivery to {topic} failed: {failed[:5]}"


def produce_and_flush(producer, topic, messages, tracker, partition=None):
    """messages: iterable of dicts with key/value/headers/timestamp (any may be
    missing). Produces them in order and flushes."""
    for m in messages:
        kwargs = {"on_delivery": tracker}
        if partition is not None:
            kwargs["partition"] = partition
        for k in ("key", "value", "headers", "timestamp", "partition"):
            if k in m:
                kwargs[k] = m[k]
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    flush_all(producer)


def watermarks(bootstrap, topic, partition, timeout=OP_TIMEOUT_S, isolation=None):
    """(log start offset, end offset) of a partition, as ListOffsets answers a
    consumer of `isolation`; None is librdkafka's default, read_committed, so
    the end is the last stable offset unless isolation="read_uncommitted"."""
    extra = {} if isolation is None else {"isolation.level": isolation}
    c = Consumer(consumer_config(bootstrap, **extra))
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout, cached=False)
    finally:
        c.close()


def end_offset(bootstrap, topic, partition=0, isolation="read_committed", timeout=OP_TIMEOUT_S):
    """Where a consumer of `isolation` reads up to: the last stable offset
    (read_committed, librdkafka's default, so also what a consumer built
    without an isolation.level is told) or the high watermark
    (read_uncommitted)."""
    return watermarks(bootstrap, topic, partition, timeout, isolation=isolation)[1]


def lso(bootstrap, topic, partition=0, timeout=OP_TIMEOUT_S):
    """The partition's last stable offset."""
    return end_offset(bootstrap, topic, partition, "read_committed", timeout)


def _norm_headers(h):
    return list(h) if h else []


def consume_confluent(bootstrap, topic, partitions, start=0, end=None, timeout=60, **conf):
    """Read [start, end) of each partition with manual assignment; end defaults
    to the high watermark at call time. Returns {partition: [Rec]}.
    Fails on any consumer error."""
    c = Consumer(consumer_config(bootstrap, **conf))
    try:
        targets = {}
        for p in partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=OP_TIMEOUT_S, cached=False)
            targets[p] = hi if end is None else end
        out = {p: [] for p in partitions}
        todo = {p for p in partitions if targets[p] > start}
        if not todo:
            return out
        c.assign([TopicPartition(topic, p, start) for p in todo])
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                got = {p: len(out[p]) for p in partitions}
                pytest.fail(f"confluent consumer timed out on {topic}: got {got}, targets {targets} from {start}")
            for msg in c.consume(num_messages=1000, timeout=0.5):
                if msg.error():
                    pytest.fail(f"confluent consumer error on {topic}: {msg.error()}")
                p = msg.partition()
                if p not in todo:
                    continue
                ts_type, ts = msg.timestamp()
                out[p].append(Rec(msg.offset(), msg.key(), msg.value(),
                                  _norm_headers(msg.headers()),
                                  0 if ts_type == TIMESTAMP_CREATE_TIME else 1, ts))
                if msg.offset() + 1 >= targets[p]:
                    todo.discard(p)
        return out
    finally:
        c.close()


def assigned_consumer(bootstrap, topic, partition=0, start=0, **extra):
    """A consumer assigned one partition from `start` (no group joined)."""
    c = Consumer(consumer_config(bootstrap, **extra))
    c.assign([TopicPartition(topic, partition, start)])
    return c


def read_all(bootstrap, topic, partition=0, isolation="read_committed", *, until="end",
             offsets=False, decode=False, timeout=OP_TIMEOUT_S, quiet_s=1.5, **conf):
    """Every record of one partition from offset 0, read by an assigned
    consumer under `isolation`: the values in offset order, or with
    offsets=True {offset: value} (an offset read twice fails); decode=True
    gives the values as text. `conf`: more client settings over
    consumer_config's (a principal's SASL settings, say).

    When the partition counts as read (`until`):
      "end"    at an end-of-partition event at or past the partition's end
               for `isolation` (last stable offset / high watermark) as it
               is when the read starts;
      "eof"    at the first end-of-partition event (no ListOffsets request
               of its own: for a principal whose rights are under test);
      "quiet"  once nothing arrived for `quiet_s` seconds (consumer errors
               are skipped; no overall deadline);
      n (int)  once n records were read (whole fetched batches are kept, so
               a record past the n-th that came with them is returned too).

    Otherwise a consumer error raises KafkaException (GROUP_AUTHORIZATION_FAILED
    excepted: librdkafka looks up the group's coordinator even for an
    assigned consumer, and reading needs no group); not done within
    `timeout` seconds fails the test."""
    counted = not isinstance(until, str)
    if not counted and until not in ("end", "eof", "quiet"):
        raise ValueError(f"until={until!r}")
    settings = {"isolation.level": isolation, **conf}
    if until in ("end", "eof"):
        settings["enable.partition.eof"] = True
    c = Consumer(consumer_config(bootstrap, **settings))
    got = []  # (offset, value)
    try:
        end = None
        if until == "end":
            end = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout,
                                          cached=False)[1]
        c.assign([TopicPartition(topic, partition, 0)])
        if until == "quiet":
            last = time.monotonic()
            while time.monotonic() - last < quiet_s:
                m = c.poll(0.1)
                if m is None or m.error():
                    continue
                got.append((m.offset(), m.value()))
                last = time.monotonic()
        else:
            deadline = time.monotonic() + timeout
            done = False
            while not done:
                if time.monotonic() > deadline:
                    pytest.fail(f"reading {topic}-{partition} ({isolation}, until={until!r}): "
                                f"not done within {timeout}s; read {len(got)} records, last "
                                f"{got[-3:]}", pytrace=False)
                for m in c.consume(500, timeout=0.5):
                    err = m.error()
                    if err is None:
                        got.append((m.offset(), m.value()))
                    elif err.code() == KafkaError._PARTITION_EOF:
                        if until == "eof" or (until == "end" and m.offset() >= end):
                            done = True
                            break
                    elif err.code() != KafkaError.GROUP_AUTHORIZATION_FAILED:
                        raise KafkaException(err)
                if counted and len(got) >= until:
                    done = True
    finally:
        c.close()
    if decode:
        got = [(o, v.decode()) for o, v in got]
    if not offsets:
        return [v for _, v in got]
    out = dict(got)
    assert len(out) == len(got), f"{topic}-{partition}: an offset read twice: {[o for o, _ in got]}"
    return out


def read_partition(bootstrap, topic, partition, start, isolation, until_offset, timeout=30,
                   keys=False):
    """(offset, value), or with keys=True (offset, key, value), of every
    record from `start` until the consumer's position reaches
    `until_offset` (markers take offsets but are not records). The position
    is unset until a record is read: a caller that may ask for an empty
    range (until_offset <= start) checks that first."""
    from conftest import wait_until
    c = assigned_consumer(bootstrap, topic, partition, start,
                          **{"isolation.level": isolation, "enable.partition.eof": True})
    out = []
    try:
        def done():
            for m in c.consume(100, timeout=0.3):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(m.error())
                out.append((m.offset(), m.key(), m.value()) if keys else (m.offset(), m.value()))
            pos = c.position([TopicPartition(topic, partition)])[0].offset
            return pos >= until_offset
        wait_until(done, timeout, what=f"position {until_offset} of {topic}-{partition} ({isolation})")
    finally:
        c.close()
    return out


# ------------------------------------------------------------ consumer groups

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 500


def group_conf(bootstrap, group, **extra):
    """A group member's settings: manual commits, earliest, a 6 s session."""
    conf = {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "group.id": group,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
    }
    conf.update(extra)
    return conf


def group_consumer(bootstrap, group, **extra):
    return Consumer(group_conf(bootstrap, group, **extra))


def committed_offsets(bootstrap, group, topic, partitions, metadata=False, timeout=OP_TIMEOUT_S):
    """{partition: committed offset} of `group` as a consumer fetches them
    (OffsetFetch; -1001 where nothing is committed), or with metadata=True
    {partition: (offset, metadata)}. A partition's error fails."""
    c = Consumer(consumer_config(bootstrap, **{"group.id": group}))
    try:
        res = c.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout)
    finally:
        c.close()
    for tp in res:
        assert tp.error is None, tp
    return {tp.partition: (tp.offset, tp.metadata) if metadata else tp.offset for tp in res}


def admin_committed(bootstrap, group, topic, partitions):
    """{partition: committed offset} of `group` through the admin API
    (ListConsumerGroupOffsets); a partition with nothing committed is absent."""
    ad = admin(bootstrap)  # kept until the answer: a collected client cancels its futures
    res = ad.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])]
    )[group].result(30)
    return {tp.partition: tp.offset for tp in res.topic_partitions if tp.offset >= 0}


# -------------------------------------------------------------- kafka-python

def kp_consumer(bootstrap, **extra):
    from kafka import KafkaConsumer
    conf = dict(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        fetch_max_wait_ms=100,
        request_timeout_ms=30000,
        client_id="oncelog-tests-kafka-python",
    )
    conf.update(extra)
    return KafkaConsumer(**conf)


def consume_kafka_python(bootstrap, topic, partitions, start=0, end=None, timeout=120, **extra):
    """Like consume_confluent, with kafka-python (assign + seek)."""
    from kafka import TopicPartition as KTP
    c = kp_consumer(bootstrap, **extra)
    try:
        tps = [KTP(topic, p) for p in partitions]
        if end is None:
            ends = c.end_offsets(tps)
            targets = {tp.partition: ends[tp] for tp in tps}
        else:
            targets = {p: end for p in partitions}
        out = {p: [] for p in partitions}
        todo = [tp for tp in tps if targets[tp.partition] > start]
        if not todo:
            return out
        c.assign(todo)
        for tp in todo:
            c.seek(tp, start)
        pending = {tp.partition for tp in todo}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                got = {p: len(out[p]) for p in partitions}
                pytest.fail(f"kafka-python consumer timed out on {topic}: got {got}, targets {targets} from {start}")
            batches = c.poll(timeout_ms=500, max_records=5000)
            for tp, recs in batches.items():
                for r in recs:
                    if tp.partition not in pending:
                        continue
                    out[tp.partition].append(Rec(r.offset, r.key, r.value,
                                                 _norm_headers(r.headers),
                                                 r.timestamp_type, r.timestamp))
                    if r.offset + 1 >= targets[tp.partition]:
                        pending.discard(tp.partition)
        return out
    finally:
        c.close()


def kp_producer(bootstrap, **extra):
    from kafka import KafkaProducer
    conf = dict(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=False,
        linger_ms=5,
        client_id="oncelog-tests-kafka-python",
    )
    conf.update(extra)
    return KafkaProducer(**conf)


def assert_dense(recs, start, what):
    offsets = [r.offset for r in recs]
    expected = list(range(start, start + len(recs)))
    if offsets != expected:
        first_bad = next(i for i, (a, b) in enumerate(zip(offsets, expected)) if a != b) \
            if len(offsets) == len(expected) else None
        pytest.fail(f"{what}: offsets not dense from {start}: first mismatch at index "
                    f"{first_bad}, got {offsets[:5]}...{offsets[-5:]} ({len(offsets)} records)")


# ------------------------------------------------------- the CLI and /metrics

def cli(broker, *args, json_out=True, check=True, stdin=None, env=None, admin=None, timeout=60):
    """Runs `oncelog <args> --bootstrap <broker> [--json] [--admin <admin>]`;
    returns (the JSON document, or stdout with json_out=False or when the
    command failed; the finished process). check: it must exit 0. stdin:
    text fed to it; env: variables added to the environment."""
    from conftest import oncelog_bin
    argv = [str(oncelog_bin()), *args, "--bootstrap", broker.bootstrap]
    if json_out:
        argv.append("--json")
    if admin is not None:
        argv += ["--admin", admin]
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                       env=None if env is None else {**os.environ, **env})
    if check:
        assert p.returncode == 0, f"{argv} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return (json.loads(p.stdout) if json_out and p.returncode == 0 else p.stdout), p


def scrape(where):
    """Every sample of /metrics as {(name, sorted label pairs): value};
    `where` is a port on 127.0.0.1 or a base URL (a broker's metrics_url)."""
    from prometheus_client.parser import text_string_to_metric_families
    base = f"http://127.0.0.1:{where}" if isinstance(where, int) else where
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    """One sample of a scrape(), None when there is none."""
    return samples.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))))


def metric(broker, name, **labels):
    """One sample of the broker's /metrics now, None when there is none. For
    a cluster, the sum over its brokers (each reports the partitions it
    leads, the transactions and groups it coordinates, what it counted)."""
    if hasattr(broker, "brokers"):
        found = [v for b in broker.brokers
                 if (v := value(scrape(b.metrics_url), name, **labels)) is not None]
        return sum(found) if found else None
    return value(scrape(broker.metrics_url), name, **labels)


__all__ = [
    "Rec", "unique_topic", "producer_config", "consumer_config", "admin",
    "create_topic", "topic_metadata", "wait_for_topic", "DeliveryTracker",
    "flush_all", "txn_producer", "produce", "produce_and_flush", "watermarks",
    "end_offset", "lso", "consume_confluent", "assigned_consumer", "read_all",
    "read_partition", "SESSION_TIMEOUT_MS", "HEARTBEAT_MS", "group_conf",
    "group_consumer", "committed_offsets", "admin_committed",
    "consume_kafka_python", "kp_consumer", "kp_producer", "assert_dense",
    "cli", "scrape", "value", "metric",
    "Producer", "Consumer", "TopicPartition", "KafkaError", "KafkaException",
]


def verify_report(b, topic=None):
    """Live verification's record (/v1/verify) of a broker or a cluster:
    partitions [(topic, partition)] -> progress, the latest anomalies, the
    counts by kind and the business-key indexes. A cluster's brokers each
    answer for the whole cluster (its record is in PostgreSQL): the first
    live one is asked, and only the indexes, each broker's own, are
    gathered from all."""
    q = f"?topic={topic}" if topic else ""
    report = None
    unique = []
    for one in getattr(b, "brokers", [b]):
        if not getattr(one, "alive", True):
            continue
        with urllib.request.urlopen(f"{one.metrics_url}/v1/verify{q}", timeout=10) as r:
            s = json.load(r)
        unique += s["unique"]
        if report is None:
            report = s
        elif not s["cluster_wide"]:
            raise AssertionError("brokers of a cluster answer /v1/verify for themselves only")
    report["partitions"] = {(p["topic"], p["partition"]): p for p in report["partitions"]}
    report["unique"] = unique
    return report
