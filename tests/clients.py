"""Thin helpers over confluent-kafka and kafka-python for the integration tests.

Records read back by either client are normalised to `Rec` so the tests can
compare what each client saw byte for byte.
"""

import time
import uuid
from collections import namedtuple

import pytest
from confluent_kafka import (Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition, TIMESTAMP_CREATE_TIME)
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


def watermarks(bootstrap, topic, partition, timeout=OP_TIMEOUT_S):
    c = Consumer(consumer_config(bootstrap))
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout, cached=False)
    finally:
        c.close()


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


__all__ = [
    "Rec", "unique_topic", "producer_config", "consumer_config", "admin",
    "create_topic", "topic_metadata", "wait_for_topic", "DeliveryTracker",
    "flush_all", "produce_and_flush", "watermarks", "consume_confluent",
    "consume_kafka_python", "kp_consumer", "kp_producer", "assert_dense",
    "Producer", "Consumer", "TopicPartition", "KafkaError", "KafkaException",
]
