"""Third-party clients against a real broker: librdkafka (confluent-kafka) and
kafka-python must agree byte for byte on what was written."""

import random
import time

import pytest

from clients import (DeliveryTracker, Producer, Rec, assert_dense, admin,
                     consume_confluent, consume_kafka_python, create_topic,
                     flush_all, kp_consumer, kp_producer, producer_config,
                     topic_metadata, unique_topic, wait_for_topic, watermarks)
from conftest import both_modes, wait_until
import kafka_wire

# Recent timestamps, so no time-based retention default can touch the data.
BASE_TS = (int(time.time()) - 3600) * 1000
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def make_message(rng, i, keyed=True):
    """A deterministic message with awkward corners: empty and null values,
    binary bytes, repeated and null-valued header keys, no headers at all."""
    if i % 997 == 0:
        value = None
    elif i % 1009 == 0:
        value = b""
    else:
        value = rng.randbytes(rng.randint(1, 300))
    if i % 13 == 0:
        headers = None
    else:
        headers = [("seq", str(i).encode()), ("bin", rng.randbytes(8))]
        if i % 7 == 0:
            headers.append(("seq", b"dup"))
        if i % 11 == 0:
            headers.append(("nullv", None))
    key = f"key-{i % 5000}".encode() if keyed else None
    return {"key": key, "value": value, "headers": headers, "timestamp": BASE_TS + i}


def expected_rec(offset, m):
    return Rec(offset, m["key"], m["value"], list(m["headers"] or []), 0, m["timestamp"])


def produce_tracked(producer, topic, messages):
    """Produce messages in order; return {partition: [(offset, index)]} sorted
    by offset, failing on any delivery error."""
    acked = []
    failed = []

    def cb_for(i):
        def cb(err, msg):
            if err is not None:
                failed.append((i, err))
            else:
                acked.append((msg.partition(), msg.offset(), i))
        return cb

    for i, m in enumerate(messages):
        kwargs = {k: v for k, v in m.items() if v is not None or k == "value"}
        while True:
            try:
                producer.produce(topic, on_delivery=cb_for(i), **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    flush_all(producer, timeout=120)
    assert not failed, f"{len(failed)} delivery failures, first: {failed[:3]}"
    assert len(acked) == len(messages)
    by_part = {}
    for p, off, i in acked:
        by_part.setdefault(p, []).append((off, i))
    for p in by_part:
        by_part[p].sort()
    return by_part


def check_partition(topic, p, got, produced, messages, reader):
    """got: [Rec] read back; produced: [(offset, index)] from delivery reports."""
    offsets = [off for off, _ in produced]
    assert offsets == list(range(len(offsets))), \
        f"{topic}-{p}: acknowledged offsets are not dense from 0"
    indexes = [i for _, i in produced]
    assert indexes == sorted(indexes), \
        f"{topic}-{p}: acknowledged offsets are not in produce order"
    assert len(got) == len(produced), \
        f"{reader} read {len(got)} records from {topic}-{p}, {len(produced)} were acknowledged"
    assert_dense(got, 0, f"{reader} {topic}-{p}")
    for rec, (off, i) in zip(got, produced):
        want = expected_rec(off, messages[i])
        if rec != want:
            pytest.fail(f"{reader} {topic}-{p} offset {off} differs:\n got  {rec!r}\n want {want!r}")


@pytest.mark.timeout(600)
def test_100k_keyed_messages_librdkafka_to_kafka_python(broker):
    topic = unique_topic("keyed")
    create_topic(broker.bootstrap, topic, partitions=3)
    rng = random.Random(20240101)
    n = 100_000
    messages = [make_message(rng, i) for i in range(n)]

    p = Producer(producer_config(broker.bootstrap, queue_buffering_max_messages=200000))
    produced = produce_tracked(p, topic, messages)
    assert sorted(produced) == [0, 1, 2], f"keys landed only in partitions {sorted(produced)}"

    for part in range(3):
        lo, hi = watermarks(broker.bootstrap, topic, part)
        assert (lo, hi) == (0, len(produced[part])), f"{topic}-{part} watermarks {(lo, hi)}"

    got = consume_kafka_python(broker.bootstrap, topic, [0, 1, 2], timeout=300)
    for part in range(3):
        check_partition(topic, part, got[part], produced[part], messages, "kafka-python")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
@both_modes()
def test_librdkafka_compressed_batches_read_back(broker, codec):
    topic = unique_topic(f"c-{codec}")
    create_topic(broker.bootstrap, topic, partitions=2)
    rng = random.Random(codec)
    n = 5000
    messages = []
    for i in range(n):
        m = make_message(rng, i)
        if m["value"]:
            # compressible payloads, so librdkafka really sends compressed batches
            m["value"] = (b"fare-%08d;" % i) * rng.randint(1, 30) + m["value"][:8]
        messages.append(m)

    p = Producer(producer_config(broker.bootstrap, compression_type=codec, linger_ms=20))
    produced = produce_tracked(p, topic, messages)

    # The broker stores client batches as they came: the codec survives on disk.
    for part in sorted(produced):
        compressed_records = 0
        for seg in broker.stored_logs(topic, part):
            for b in kafka_wire.walk_batches(seg):
                c = b.attributes & kafka_wire.ATTR_COMPRESSION_MASK
                assert c in (0, CODEC_IDS[codec]), f"{topic}-{part}: batch {b} has codec {c}, produced {codec}"
                if c:
                    compressed_records += b.record_count
        assert compressed_records >= len(produced[part]) // 2, \
            f"{topic}-{part}: only {compressed_records} of {len(produced[part])} records in {codec} batches"

    parts = sorted(produced)
    got_kp = consume_kafka_python(broker.bootstrap, topic, parts)
    got_ck = consume_confluent(broker.bootstrap, topic, parts)
    for part in parts:
        check_partition(topic, part, got_kp[part], produced[part], messages, "kafka-python")
        check_partition(topic, part, got_ck[part], produced[part], messages, "confluent-kafka")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
@both_modes()
def test_kafka_python_producer_read_by_librdkafka(broker, codec):
    topic = unique_topic(f"kp-{codec or 'none'}")
    create_topic(broker.bootstrap, topic, partitions=1)
    rng = random.Random(str(codec))
    n = 2000
    messages = []
    for i in range(n):
        m = make_message(rng, i)
        if m["value"]:
            m["value"] = (b"kp-%06d;" % i) * rng.randint(1, 20)
        if m["headers"]:
            # kafka-python cannot send a null header value
            m["headers"] = [(k, b"" if v is None else v) for k, v in m["headers"]]
        messages.append(m)

    prod = kp_producer(broker.bootstrap, compression_type=codec)
    futures = []
    for m in messages:
        futures.append(prod.send(topic, key=m["key"], value=m["value"], partition=0,
                                 headers=m["headers"] or [], timestamp_ms=m["timestamp"]))
    prod.flush(timeout=60)
    offsets = [f.get(timeout=60).offset for f in futures]
    prod.close(timeout=10)
    assert offsets == list(range(n)), "kafka-python acknowledged offsets are not dense from 0 in order"

    got = consume_confluent(broker.bootstrap, topic, [0])[0]
    assert len(got) == n
    for i, rec in enumerate(got):
        want = expected_rec(i, messages[i])
        if rec != want:
            pytest.fail(f"offset {i} differs:\n got  {rec!r}\n want {want!r}")


@pytest.mark.timeout(120)
def test_metadata_lists_topics_and_broker(broker):
    topics = {unique_topic("md-a"): 1, unique_topic("md-b"): 3, unique_topic("md-c"): 5}
    for t, n in topics.items():
        create_topic(broker.bootstrap, t, partitions=n)

    md = topic_metadata(broker.bootstrap)
    assert set(md.brokers) == {0}, f"brokers {md.brokers}"
    b0 = md.brokers[0]
    assert (b0.host, b0.port) == ("127.0.0.1", broker.port), f"broker 0 advertises {b0.host}:{b0.port}"
    for t, n in topics.items():
        assert t in md.topics, f"{t} missing from metadata: {sorted(md.topics)}"
        tm = md.topics[t]
        assert tm.error is None, f"{t}: {tm.error}"
        assert sorted(tm.partitions) == list(range(n))
        for pm in tm.partitions.values():
            assert pm.leader == 0 and list(pm.replicas) == [0] and list(pm.isrs) == [0], pm

    c = kp_consumer(broker.bootstrap)
    try:
        listed = c.topics()
        for t, n in topics.items():
            assert t in listed, f"kafka-python does not list {t}: {sorted(listed)}"
            assert c.partitions_for_topic(t) == set(range(n))
    finally:
        c.close()


@pytest.mark.timeout(120)
def test_produce_to_unknown_topic_auto_creates_it(broker_factory):
    b = broker_factory({"auto.create.topics.enable": "true", "num.partitions": 3})
    topic = unique_topic("auto")
    tracker = DeliveryTracker()
    p = Producer(producer_config(b.bootstrap))
    for i in range(30):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 3, on_delivery=tracker)
    flush_all(p)
    assert not tracker.failed, tracker.failed[:3]
    assert len(tracker.acked) == 30

    wait_for_topic(b.bootstrap, topic, 3)
    got = consume_confluent(b.bootstrap, topic, [0, 1, 2])
    for part in range(3):
        want = [b"v%d" % i for i in range(part, 30, 3)]
        assert [r.value for r in got[part]] == want
        assert_dense(got[part], 0, f"{topic}-{part}")


@pytest.mark.timeout(120)
@both_modes()
def test_delete_topic_then_recreate_starts_empty(broker):
    topic = unique_topic("del")
    create_topic(broker.bootstrap, topic, partitions=2)
    tracker = DeliveryTracker()
    p = Producer(producer_config(broker.bootstrap))
    for i in range(200):
        p.produce(topic, value=b"old-%d" % i, partition=i % 2, on_delivery=tracker)
    flush_all(p)
    assert len(tracker.acked) == 200 and not tracker.failed

    a = admin(broker.bootstrap)
    a.delete_topics([topic], operation_timeout=30)[topic].result(30)
    wait_until(lambda: topic not in topic_metadata(broker.bootstrap).topics, 30,
               what=f"{topic} to disappear from metadata")

    create_topic(broker.bootstrap, topic, partitions=1)
    assert watermarks(broker.bootstrap, topic, 0) == (0, 0), "recreated topic is not empty"
    tracker = DeliveryTracker()
    p.produce(topic, value=b"new", partition=0, on_delivery=tracker)
    flush_all(p)
    assert [(part, off) for part, off, _, _ in tracker.acked] == [(0, 0)]
    got = consume_confluent(broker.bootstrap, topic, [0])[0]
    assert [(r.offset, r.value) for r in got] == [(0, b"new")]
