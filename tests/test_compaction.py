"""Compacted topics (S8), DeleteRecords, the key rule of compacted topics and
LogAppendTime, against a real broker with librdkafka clients.

S8: transactional writers put the same order ids into a compacted topic,
committing and aborting; the cleaner runs several times, once killed in the
middle of its swap; a read_committed reader must see exactly the last
committed value per key and never an aborted value, before, during and
after cleaning."""

import json
import random
import threading
import time
import urllib.request

import pytest
import kafka_wire
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from clients import (DeliveryTracker, cli, consumer_config, create_topic, flush_all, lso,
                     producer_config, read_partition, txn_producer, unique_topic, watermarks)
from conftest import both_modes, wait_until

COMPACT = {"cleanup.policy": "compact", "segment.bytes": "8192",
           "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0"}
FAST_CLEANER = {"log.cleaner.backoff.ms": "100"}


def cleaner_state(b, topic, partition=0):
    if b.mode == "cluster":
        # The compaction job's per-partition row, and the job's last error.
        rows = b.sql("SELECT c.passes, c.aborted_records_removed, c.first_dirty "
                     "FROM compaction_state c JOIN topics t ON t.id = c.topic_id "
                     "WHERE t.name = %s AND c.partition = %s", topic, partition)
        if not rows:
            return {}
        job = b.sql("SELECT last_error FROM job_leases WHERE job = 'compaction'")
        return {"passes": rows[0][0], "aborted_records_removed": rows[0][1],
                "first_dirty_offset": rows[0][2], "last_error": job[0][0] if job else None}
    with urllib.request.urlopen(f"{b.metrics_url}/v1/cleaner", timeout=10) as r:
        return json.load(r)["partitions"].get(f"{topic}-{partition}", {})


def aborted_records_removed(b, topic):
    if b.mode == "cluster":
        return cleaner_state(b, topic).get("aborted_records_removed", 0)
    metrics = urllib.request.urlopen(f"{b.metrics_url}/metrics", timeout=10).read().decode()
    removed = [line for line in metrics.splitlines()
               if line.startswith("oncelog_cleaner_aborted_records_removed_total ")]
    return int(removed[0].split()[1]) if removed else 0


def wait_for_pass(b, topic, after, timeout=60):
    """Waits until the partition has had more than `after` cleaning passes."""
    wait_until(lambda: cleaner_state(b, topic).get("passes", 0) > after, timeout,
               what=f"a cleaning pass of {topic} after pass {after}")
    return cleaner_state(b, topic)["passes"]


def read_keyed(bootstrap, topic, isolation="read_committed", timeout=60):
    """(offset, key, value) of every record up to the partition's end for
    `isolation` (LSO for read_committed, high watermark otherwise)."""
    end = lso(bootstrap, topic, 0) if isolation == "read_committed" else \
        watermarks(bootstrap, topic, 0)[1]
    return read_partition(bootstrap, topic, 0, 0, isolation, end, timeout, keys=True)


def last_per_key(records):
    view = {}
    for _, k, v in sorted(records, key=lambda r: r[0]):
        view[k] = v
    return view


class Orders:
    """Two transactional writers of order ids; one transaction at a time, so
    log order is commit order and the expected view is exact."""

    def __init__(self, b, topic, seed):
        self.topic = topic
        self.rng = random.Random(seed)
        self.writers = [txn_producer(b.bootstrap, f"{topic}-writer-{i}") for i in range(2)]
        for w in self.writers:
            w.init_transactions(30)
        self.expected = {}
        self.aborted = set()
        self.committed_records = 0

    def round(self, n, tag):
        for t in range(n):
            w = self.writers[self.rng.randrange(2)]
            w.begin_transaction()
            vals = {}
            for _ in range(self.rng.randint(1, 6)):
                k = b"order-%03d" % self.rng.randrange(40)
                v = b"%s|%s-%d|" % (k, tag.encode(), t) + b"x" * 150
                w.produce(self.topic, key=k, value=v, partition=0)
                vals[k] = v
            if self.rng.random() < 0.3:
                # On disk first, so the cleaner has aborted records to remove.
                w.flush(30)
                w.abort_transaction(30)
                self.aborted |= set(vals.values())
            else:
                w.commit_transaction(30)
                self.expected.update(vals)
                self.committed_records += len(vals)

    def check(self, b, what):
        recs = read_keyed(b.bootstrap, self.topic)
        seen_aborted = [v for _, _, v in recs if v in self.aborted]
        assert not seen_aborted, f"{what}: aborted values surfaced: {seen_aborted[:3]}"
        assert last_per_key(recs) == self.expected, what
        return recs


@both_modes("broker_factory")
def test_s8_transactional_writers_compacted_read_committed_exact(broker_factory):
    b = broker_factory(FAST_CLEANER)
    topic = unique_topic("s8")
    create_topic(b.bootstrap, topic, 1, config=COMPACT)
    orders = Orders(b, topic, seed=8)
    stop = threading.Event()
    violations = []

    def reader():
        # A read_committed reader that keeps reading while the cleaner runs.
        while not stop.is_set():
            try:
                for _, _, v in read_keyed(b.bootstrap, topic):
                    if v in orders.aborted:
                        violations.append(v)
            except AssertionError as e:
                violations.append(repr(e))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    passes = 0
    try:
        for r in range(5):
            orders.round(25, f"r{r}")
            passes = wait_for_pass(b, topic, passes)
    finally:
        stop.set()
        t.join(60)
    assert not violations, violations[:3]
    recs = orders.check(b, "after five rounds of cleaning")
    # The cleaner did remove superseded records: far fewer than were committed.
    assert len(recs) < orders.committed_records / 2, (len(recs), orders.committed_records)
    assert watermarks(b.bootstrap, topic, 0)[0] == 0, "the log start offset must not move"
    state = cleaner_state(b, topic)
    assert state["passes"] >= 5 and state["last_error"] is None, state
    assert aborted_records_removed(b, topic) > 0, "aborted records were stored and are gone"

    # An open transaction and the LSO are untouched by cleaning.
    orders.round(10, "before-open")
    w = orders.writers[0]
    w.begin_transaction()
    w.produce(topic, key=b"order-001", value=b"order-001|open", partition=0)
    w.flush(30)
    pinned = lso(b.bootstrap, topic, 0)
    passes = wait_for_pass(b, topic, passes)
    assert lso(b.bootstrap, topic, 0) == pinned
    w.commit_transaction(30)
    orders.expected[b"order-001"] = b"order-001|open"
    orders.check(b, "after committing the transaction that was open while cleaning")

    # Restart: the cleaned log, its producer state and its view survive.
    b.kill9()
    b.start()
    orders.check(b, "after kill -9 and restart")
    orders.round(10, "after-restart")
    orders.check(b, "writing on after the restart")


@pytest.mark.parametrize("point", ["cleaner-before-swap", "cleaner-after-swap"])
def test_kill9_mid_clean_loses_nothing(broker_factory, point):
    b = broker_factory(FAST_CLEANER)
    # Only the first start carries the failpoint.
    b.env["ONCELOG_FAILPOINTS"] = point
    b.stop()
    b.start()
    topic = unique_topic("s8crash")
    # A compaction lag keeps the cleaner away until everything is written.
    create_topic(b.bootstrap, topic, 1, config={**COMPACT, "min.compaction.lag.ms": "3600000"})
    orders = Orders(b, topic, seed=len(point))
    orders.round(40, "pre")
    orders.check(b, "before cleaning")
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "0",
                    incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)
    wait_until(lambda: not b.alive, 60, what=f"the failpoint {point} to stop the broker")
    assert f'failpoint="{point}"' in b.log_text()
    b.env.pop("ONCELOG_FAILPOINTS")
    b.start()
    orders.check(b, f"after a crash at {point}")
    left = [p.name for p in b.partition_dir(topic, 0).iterdir()
            if p.name.endswith((".cleaned", ".swap"))]
    assert not left, left
    passes = wait_for_pass(b, topic, 0)
    assert passes >= 1
    recs = orders.check(b, f"cleaned after the crash at {point}")
    assert len(recs) < orders.committed_records


@both_modes("broker_factory")
def test_idempotent_producer_writes_on_after_cleaning_and_restart(broker_factory):
    b = broker_factory(FAST_CLEANER)
    topic = unique_topic("idem")
    create_topic(b.bootstrap, topic, 1, config=COMPACT)
    p = Producer(producer_config(b.bootstrap, **{"enable.idempotence": True, "linger.ms": 1}))
    tracker = DeliveryTracker()
    for i in range(2000):
        p.produce(topic, key=b"k%d" % (i % 10), value=b"v%d" % i + b"y" * 100, partition=0,
                  on_delivery=tracker)
        if i % 50 == 0:
            p.flush(30)
    flush_all(p)
    wait_for_pass(b, topic, 0)
    b.kill9()
    b.start()
    # The producer goes on with its producer id and next sequence: its last
    # batch survived the cleaning, so the broker still knows it.
    for i in range(2000, 2100):
        p.produce(topic, key=b"k%d" % (i % 10), value=b"v%d" % i, partition=0, on_delivery=tracker)
    flush_all(p)
    assert not tracker.failed, tracker.failed[:3]
    view = last_per_key(read_keyed(b.bootstrap, topic, "read_uncommitted"))
    assert view == {b"k%d" % k: b"v%d" % (2090 + k) for k in range(10)}
    assert "OUT_OF_ORDER" not in b.log_text(since_last_start=True).upper().replace(" ", "_")


@both_modes("broker_factory")
def test_tombstones_go_after_delete_retention(broker_factory):
    b = broker_factory(FAST_CLEANER)
    topic = unique_topic("tomb")
    create_topic(b.bootstrap, topic, 1, config=COMPACT)
    p = Producer(producer_config(b.bootstrap, **{"linger.ms": 1}))
    for round_ in range(30):
        for k in range(10):
            p.produce(topic, key=b"k%d" % k, value=b"x" * 200, partition=0)
        p.flush(30)
    p.produce(topic, key=b"k3", value=None, partition=0)
    p.flush(30)
    passes = 0
    # The tombstone stays while the pass that cleaned it is the newest clean
    # segment, then goes (delete.retention.ms=0); more data moves things on.
    for round_ in range(6):
        for _ in range(5):
            for k in range(10):
                if k != 3:
                    p.produce(topic, key=b"k%d" % k, value=b"z" * 200, partition=0)
            p.flush(30)
        passes = wait_for_pass(b, topic, passes)
        if b"k3" not in last_per_key(read_keyed(b.bootstrap, topic, "read_uncommitted")):
            break
    view = last_per_key(read_keyed(b.bootstrap, topic, "read_uncommitted"))
    assert b"k3" not in view, "the tombstone and every k3 record are gone"
    assert set(view) == {b"k%d" % k for k in range(10) if k != 3}


@both_modes("broker_factory")
def test_a_tombstone_with_an_old_timestamp_stays_for_delete_retention(broker_factory):
    """The delete horizon is the broker's time of writing (or cleaning),
    never the record's own timestamp: a tombstone stamped two days ago by
    its producer still reaches readers for delete.retention.ms."""
    b = broker_factory(FAST_CLEANER)
    topic = unique_topic("oldtomb")
    create_topic(b.bootstrap, topic, 1, config={**COMPACT, "delete.retention.ms": "3600000"})
    p = Producer(producer_config(b.bootstrap, **{"linger.ms": 1}))
    for _ in range(20):
        for k in range(5):
            p.produce(topic, key=b"k%d" % k, value=b"v" * 200, partition=0)
        p.flush(30)
    old = int(time.time() * 1000) - 2 * 86400 * 1000
    p.produce(topic, key=b"k3", value=None, partition=0, timestamp=old)
    p.flush(30)
    passes = wait_for_pass(b, topic, 0)
    for _ in range(3):
        # Enough to close a segment in local mode, so a pass has more to do.
        for _ in range(10):
            for k in (0, 1, 2, 4):
                p.produce(topic, key=b"k%d" % k, value=b"w" * 200, partition=0)
            p.flush(30)
        passes = wait_for_pass(b, topic, passes)
    # A pass that began before the last writes leaves them to the next one:
    # superseded records go within a few more passes (on a busy machine too).
    recs = wait_until(lambda: (lambda r: r if len(r) < 40 else None)(
        read_keyed(b.bootstrap, topic, "read_uncommitted")), 30, interval=0.5,
        what="superseded records to be removed")
    view = last_per_key(recs)
    assert b"k3" in view and view[b"k3"] is None, "the tombstone was removed before delete.retention.ms"
    assert [v for _, k, v in recs if k == b"k3"] == [None], "older k3 values are gone"


@both_modes()
def test_compacted_topic_refuses_records_without_a_key(broker):
    topic = unique_topic("nokey")
    create_topic(broker.bootstrap, topic, 1, config={"cleanup.policy": "compact"})
    plain = unique_topic("plain")
    create_topic(broker.bootstrap, plain, 1)
    for compression in ["none", "gzip", "snappy", "lz4", "zstd"]:
        p = Producer(producer_config(broker.bootstrap, **{"compression.type": compression,
                                                          "linger.ms": 1}))
        tracker = DeliveryTracker()
        p.produce(topic, value=b"no key", partition=0, on_delivery=tracker)
        p.flush(30)
        p.produce(topic, key=b"k", value=b"keyed", partition=0, on_delivery=tracker)
        p.produce(plain, value=b"no key is fine here", partition=0, on_delivery=tracker)
        flush_all(p)
        assert len(tracker.failed) == 1, (compression, tracker.failed)
        err = tracker.failed[0][0]
        assert "INVALID_RECORD" in str(err) or "Broker: Invalid record" in str(err), (compression, err)
        assert len(tracker.acked) == 2, compression
    assert "without a key in a compacted topic" in broker.log_text()


@both_modes()
def test_keyless_records_in_one_batch_fail_alone(broker):
    """librdkafka's test 0011 (variation 0): one batch of 100 records, every
    tenth without a key: the broker names the 10 in its record errors, so
    they fail with INVALID_RECORD and the other 90 with
    _INVALID_DIFFERENT_RECORD (the batch is all or nothing)."""
    topic = unique_topic("nokey-batch")
    create_topic(broker.bootstrap, topic, 1, config={"cleanup.policy": "delete,compact"})
    p = Producer(producer_config(broker.bootstrap, **{"linger.ms": 500, "batch.num.messages": 1000}))
    tracker = DeliveryTracker()
    for i in range(100):
        key = None if i % 10 == 0 else b"key-%d" % i
        p.produce(topic, key=key, value=b"message %d" % i, partition=0, on_delivery=tracker)
    flush_all(p)
    codes = [err.code() for err, _ in tracker.failed]
    assert codes.count(KafkaError.INVALID_RECORD) == 10, codes
    assert codes.count(KafkaError._INVALID_DIFFERENT_RECORD) == 90, codes
    assert not tracker.acked
    assert watermarks(broker.bootstrap, topic, 0) == (0, 0)


@both_modes("broker_factory")
def test_delete_records(broker_factory):
    b = broker_factory({"log.segment.bytes": "4096"})
    topic = unique_topic("delrec")
    create_topic(b.bootstrap, topic, 2)
    p = Producer(producer_config(b.bootstrap, **{"linger.ms": 1}))
    for i in range(400):
        p.produce(topic, value=b"%04d" % i + b"d" * 100, partition=i % 2)
        if i % 20 == 0:
            p.flush(30)
    flush_all(p)
    segs_before = len(b.segment_files(topic, 0)) if b.mode == "local" else None
    admin = AdminClient({"bootstrap.servers": b.bootstrap})

    def delete(tp_offsets):
        fs = admin.delete_records([TopicPartition(topic, p_, o) for p_, o in tp_offsets])
        return {tp.partition: f for tp, f in fs.items()}

    res = delete([(0, 150), (1, -1)])
    assert res[0].result(30).low_watermark == 150
    assert res[1].result(30).low_watermark == 200  # -1: the high watermark
    assert watermarks(b.bootstrap, topic, 0)[0] == 150
    if b.mode == "local":
        assert len(b.segment_files(topic, 0)) < segs_before
    else:
        # The batch index keeps no batch wholly below the start.
        [(lowest,)] = b.sql("SELECT min(x.last_offset) FROM batches x JOIN topics t "
                            "ON t.id = x.topic_id WHERE t.name = %s AND x.partition = 0", topic)
        assert lowest >= 150, lowest
    # Reading below the start is out of range; at it, the records are there.
    c = Consumer(consumer_config(b.bootstrap, **{"auto.offset.reset": "error"}))
    c.assign([TopicPartition(topic, 0, 150)])
    m = c.poll(15)
    assert m is not None and not m.error() and m.offset() == 150
    assert m.value().startswith(b"%04d" % 300)
    c.close()
    # Twice is the same as once; lower is no change; past the end is refused.
    assert delete([(0, 150)])[0].result(30).low_watermark == 150
    assert delete([(0, 10)])[0].result(30).low_watermark == 150
    with pytest.raises(KafkaException) as e:
        delete([(0, 10_000)])[0].result(30)
    assert e.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
    # kill -9: the start offset is durable.
    b.kill9()
    b.start()
    assert watermarks(b.bootstrap, topic, 0)[0] == 150
    assert watermarks(b.bootstrap, topic, 1)[0] == 200
    # Refused on a compact-only topic and on the internal topics.
    compacted = unique_topic("delrec-compact")
    create_topic(b.bootstrap, compacted, 1, config={"cleanup.policy": "compact"})
    p.produce(compacted, key=b"k", value=b"v", partition=0)
    flush_all(p)
    fs = admin.delete_records([TopicPartition(compacted, 0, 1)])
    with pytest.raises(KafkaException) as e:
        list(fs.values())[0].result(30)
    assert e.value.args[0].code() == KafkaError.POLICY_VIOLATION
    assert watermarks(b.bootstrap, compacted, 0) == (0, 1)
    # librdkafka needs the partition's leader from Metadata, so the internal
    # topic is asked for on the wire: DeleteRecords v0.
    for internal in ["__consumer_offsets", "__transaction_state"]:
        assert delete_records_v0(b, internal, 0, 0) == (17, -1)  # INVALID_TOPIC_EXCEPTION


def delete_records_v0(b, topic, partition, offset):
    """(error code, low watermark) of a raw DeleteRecords v0 request."""
    body = (kafka_wire.i32(1) + kafka_wire.string(topic) + kafka_wire.i32(1)
            + kafka_wire.i32(partition) + kafka_wire.i64(offset) + kafka_wire.i32(10000))
    with kafka_wire.Conn(b.host, b.port) as c:
        c.send(kafka_wire.frame(kafka_wire.request_header_v1(21, 0, 7) + body))
        r = kafka_wire.Reader(c.recv_response(7))
    r.i32()  # throttle
    assert r.i32() == 1 and r.string() == topic and r.i32() == 1
    assert r.i32() == partition
    low = r.i64()
    return r.i16(), low


@both_modes()
def test_log_append_time(broker):
    topic = unique_topic("lat")
    create_topic(broker.bootstrap, topic, 1, config={"message.timestamp.type": "LogAppendTime"})
    p = Producer(producer_config(broker.bootstrap))
    p.produce(topic, value=b"v", partition=0, timestamp=1000)
    flush_all(p)
    c = Consumer(consumer_config(broker.bootstrap))
    c.assign([TopicPartition(topic, 0, 0)])
    m = c.poll(15)
    c.close()
    import time
    ts_type, ts = m.timestamp()
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME
    assert ts_type == TIMESTAMP_LOG_APPEND_TIME
    assert abs(ts - time.time() * 1000) < 60_000


def test_topic_describe_shows_cleaner_state(broker_factory):
    b = broker_factory(FAST_CLEANER)
    topic = unique_topic("desc")
    create_topic(b.bootstrap, topic, 1, config=COMPACT)
    p = Producer(producer_config(b.bootstrap, **{"linger.ms": 1}))
    for i in range(300):
        p.produce(topic, key=b"k%d" % (i % 5), value=b"w" * 100, partition=0)
        if i % 20 == 0:
            p.flush(30)
    flush_all(p)
    wait_for_pass(b, topic, 0)
    desc, _ = cli(b, "topic", "describe", topic, admin=b.metrics_url)
    row = desc["partitions"][0]
    assert row["cleaner"]["passes"] >= 1
    assert row["cleaner"]["first_dirty_offset"] > 0
    text, _ = cli(b, "topic", "describe", topic, admin=b.metrics_url, json_out=False, check=False)
    assert "CLEANED-TO" in text and "DIRTY-RATIO" in text
    metrics = urllib.request.urlopen(f"{b.metrics_url}/metrics", timeout=10).read().decode()
    assert "oncelog_cleaner_passes_total" in metrics
    assert f'oncelog_cleaner_dirty_ratio{{topic="{topic}",partition="0"}}' in metrics


@both_modes()
def test_record_timestamps_out_of_range_are_refused(broker):
    """KIP-937 as Kafka 4 does it: a CreateTime record more than
    message.timestamp.after.max.ms (default one hour) in the future, or more
    than message.timestamp.before.max.ms in the past, is INVALID_TIMESTAMP."""
    import time
    topic = unique_topic("ts")
    create_topic(broker.bootstrap, topic, 1, config={"message.timestamp.before.max.ms": "86400000"})
    now = int(time.time() * 1000)
    p = Producer(producer_config(broker.bootstrap, **{"linger.ms": 1}))
    tracker = DeliveryTracker()
    for ts, value in [(now, b"now"), (now + 2 * 3600_000, b"future"), (now - 2 * 86400_000, b"old"),
                      (now + 600_000, b"soon")]:
        p.produce(topic, value=value, partition=0, timestamp=ts, on_delivery=tracker)
        p.flush(30)
    flush_all(p)
    assert sorted(v for _, _, v, _ in tracker.acked) == [b"now", b"soon"]
    assert sorted((e.code(), v) for e, v in tracker.failed) == [
        (KafkaError.INVALID_TIMESTAMP, b"future"), (KafkaError.INVALID_TIMESTAMP, b"old")]
