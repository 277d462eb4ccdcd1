"""Retention by size and by time, what a fetch below the log start offset
gets, and ListOffsets by timestamp across segments."""

import random
import time

import pytest

from clients import (Consumer, DeliveryTracker, KafkaError, Producer,
                     TopicPartition, consume_confluent, consumer_config,
                     create_topic, flush_all, kp_consumer, producer_config,
                     txn_producer, unique_topic, watermarks)
from conftest import wait_until
import kafka_wire

SEGMENT_BYTES = 65536
RETENTION_BYTES = 200000


def produce_timed(b, topic, n, base_ts, step_ms=10, size=1000, tag=b"m"):
    """n messages to partition 0 with timestamps base_ts + i * step_ms."""
    tracker = DeliveryTracker()
    # Batches well below the segment size, so segments hold many batches and
    # retention works at a granularity finer than the data set.
    p = Producer(producer_config(b.bootstrap, linger_ms=5, batch_size=16384))
    values = []
    for i in range(n):
        v = b"%s-%06d-" % (tag, i) + bytes([65 + i % 26]) * size
        values.append(v)
        p.produce(topic, value=v, partition=0, timestamp=base_ts + i * step_ms, on_delivery=tracker)
        p.poll(0)
    flush_all(p)
    assert not tracker.failed, tracker.failed[:3]
    return values, sorted(off for _, off, _, _ in tracker.acked)


def disk_state(b, topic):
    """Segment bases and total bytes on disk. The broker's retention pass may
    delete a segment between the listing and its stat; list again then."""
    for _ in range(50):
        segs = b.segment_files(topic, 0)
        try:
            return [int(s.stem) for s in segs], sum(s.stat().st_size for s in segs)
        except FileNotFoundError:
            time.sleep(0.05)
    raise AssertionError("segment files kept vanishing while being listed")


def offsets_for_times_confluent(b, topic, ts):
    c = Consumer(consumer_config(b.bootstrap))
    try:
        [tp] = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=30)
        assert tp.error is None, tp.error
        return tp.offset
    finally:
        c.close()


def expect_offset_out_of_range_confluent(b, topic, offset):
    c = Consumer(consumer_config(b.bootstrap, auto_offset_reset="error"))
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is None:
                pytest.fail(f"fetch at {offset} returned a record at offset {msg.offset()}")
            err = msg.error()
            assert err.code() == KafkaError._AUTO_OFFSET_RESET, f"unexpected error {err}"
            assert "out of range" in err.str().lower(), f"unexpected error text {err.str()!r}"
            return
        pytest.fail(f"no OFFSET_OUT_OF_RANGE for a fetch at offset {offset} within 30 s")
    finally:
        c.close()


def expect_offset_out_of_range_kafka_python(b, topic, offset):
    from kafka import TopicPartition as KTP
    from kafka.errors import OffsetOutOfRangeError
    c = kp_consumer(b.bootstrap)
    try:
        tp = KTP(topic, 0)
        c.assign([tp])
        c.seek(tp, offset)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                recs = c.poll(timeout_ms=500)
            except OffsetOutOfRangeError as e:
                assert e.args and e.args[0] == {tp: offset}, e.args
                return
            assert not recs, f"fetch at {offset} returned records: {recs}"
        pytest.fail(f"kafka-python saw no OffsetOutOfRangeError at offset {offset} within 30 s")
    finally:
        c.close()


@pytest.mark.timeout(300)
def test_size_retention_deletes_old_segments_and_fetch_below_start_is_out_of_range(broker_factory):
    b = broker_factory({"log.segment.bytes": SEGMENT_BYTES,
                        "log.retention.bytes": RETENTION_BYTES,
                        "log.retention.check.interval.ms": 300})
    topic = unique_topic("ret-size")
    create_topic(b.bootstrap, topic, partitions=1)
    base_ts = (int(time.time()) - 3600) * 1000
    n = 2000
    values, offsets = produce_timed(b, topic, n, base_ts)          # ~2 MB
    assert offsets == list(range(n))

    lo = wait_until(lambda: watermarks(b.bootstrap, topic, 0)[0], 60, interval=0.2,
                    what="the log start offset to move past 0")
    assert lo > 0

    def settled():
        bases, size = disk_state(b, topic)
        lo, hi = watermarks(b.bootstrap, topic, 0)
        return (size <= RETENTION_BYTES + SEGMENT_BYTES and bases and lo == bases[0], (bases, size, lo, hi))

    deadline = time.monotonic() + 30
    ok, state = settled()
    while not ok and time.monotonic() < deadline:
        time.sleep(0.2)
        ok, state = settled()
    bases, size, lo, hi = state
    assert ok, (f"retention did not settle: segments {bases}, {size} bytes on disk "
                f"(limit {RETENTION_BYTES} + one {SEGMENT_BYTES}-byte segment), log start {lo}")
    assert hi == n
    # Retention keeps at least retention.bytes worth of the newest data.
    assert size >= RETENTION_BYTES - SEGMENT_BYTES, f"only {size} bytes kept"

    expect_offset_out_of_range_confluent(b, topic, 0)
    expect_offset_out_of_range_confluent(b, topic, lo - 1)
    expect_offset_out_of_range_kafka_python(b, topic, lo - 1)

    got = consume_confluent(b.bootstrap, topic, [0], start=lo)[0]
    assert [r.offset for r in got] == list(range(lo, n))
    assert [r.value for r in got] == values[lo:]
    assert [r.ts for r in got] == [base_ts + 10 * i for i in range(lo, n)]

    # ListOffsets by timestamp on what is left.
    for k in (lo, lo + 1, (lo + n) // 2, n - 1):
        ts = base_ts + 10 * k
        assert offsets_for_times_confluent(b, topic, ts) == k
        assert offsets_for_times_confluent(b, topic, ts - 5) == k
    assert offsets_for_times_confluent(b, topic, base_ts - 60000) == lo
    assert offsets_for_times_confluent(b, topic, base_ts + 10 * n + 60000) == -1


@pytest.mark.timeout(300)
def test_list_offsets_by_timestamp_across_segments(broker_factory):
    b = broker_factory({"log.segment.bytes": SEGMENT_BYTES})
    topic = unique_topic("ts-lookup")
    create_topic(b.bootstrap, topic, partitions=1)
    base_ts = (int(time.time()) - 3600) * 1000
    n = 3000
    _, offsets = produce_timed(b, topic, n, base_ts, size=300)
    assert offsets == list(range(n))
    assert len(b.segment_files(topic, 0)) >= 5, "expected the data to span several segments"

    from kafka import TopicPartition as KTP
    kc = kp_consumer(b.bootstrap)
    try:
        tp = KTP(topic, 0)
        rng = random.Random(7)
        probes = sorted(set([0, 1, n - 1] + [rng.randrange(n) for _ in range(40)]))
        for k in probes:
            ts = base_ts + 10 * k
            assert offsets_for_times_confluent(b, topic, ts) == k, f"timestamp of offset {k}"
            assert offsets_for_times_confluent(b, topic, ts - 9) == k, f"just before offset {k}"
            found = kc.offsets_for_times({tp: ts}, timeout_ms=30000)[tp]
            assert found is not None and (found.offset, found.timestamp) == (k, ts), found
        assert offsets_for_times_confluent(b, topic, 0) == 0
        assert offsets_for_times_confluent(b, topic, base_ts + 10 * n) == -1
        assert kc.offsets_for_times({tp: base_ts + 10 * n}, timeout_ms=30000)[tp] is None
        assert kc.beginning_offsets([tp])[tp] == 0
        assert kc.end_offsets([tp])[tp] == n
    finally:
        kc.close()


@pytest.mark.timeout(300)
def test_time_retention_deletes_only_expired_segments(broker_factory):
    retention_ms = 3600 * 1000
    b = broker_factory({"log.segment.bytes": SEGMENT_BYTES,
                        "log.retention.ms": retention_ms,
                        "log.retention.check.interval.ms": 300})
    topic = unique_topic("ret-time")
    create_topic(b.bootstrap, topic, partitions=1)
    now_ms = int(time.time() * 1000)
    old_values, old_offsets = produce_timed(b, topic, 500, now_ms - 2 * retention_ms, tag=b"old")
    new_values, new_offsets = produce_timed(b, topic, 500, now_ms, tag=b"new")
    assert old_offsets + new_offsets == list(range(1000))

    def first_segment_has_young_data():
        bases, _ = disk_state(b, topic)
        lo, _ = watermarks(b.bootstrap, topic, 0)
        if not bases or lo != bases[0] or lo == 0:
            return None
        first = b.segment_files(topic, 0)[0]
        try:
            data = first.read_bytes()
        except FileNotFoundError:
            return None  # a retention pass is deleting it right now
        batches = list(kafka_wire.walk_batches(data))
        if max(x.max_timestamp for x in batches) < int(time.time() * 1000) - retention_ms:
            return None
        return lo

    lo = wait_until(first_segment_has_young_data, 60, interval=0.2,
                    what="expired segments to be deleted up to the first one with young data")
    assert 0 < lo <= 500, f"log start offset {lo}: young records were deleted or nothing was"
    got = consume_confluent(b.bootstrap, topic, [0], start=lo)[0]
    assert [r.value for r in got] == (old_values + new_values)[lo:]
    expect_offset_out_of_range_confluent(b, topic, lo - 1)


# Cluster mode: retention is a job one broker holds a lease for; batches go
# from the index (their objects with the collector), never past the LSO.

def stored_bytes(cl, topic):
    return cl.sql("SELECT coalesce(sum(b.length), 0)::bigint, count(*) FROM batches b "
                  "JOIN topics t ON t.id = b.topic_id WHERE t.name = %s", topic)[0]


def job_holder(cl, job):
    rows = cl.sql("SELECT broker_id, runs FROM job_leases WHERE job = %s "
                  "AND expires_at > clock_timestamp()", job)
    return rows[0] if rows else None


@pytest.mark.timeout(300)
def test_cluster_retention_by_time_and_size_and_its_lease_moves_on(cluster_factory):
    cl = cluster_factory(store="s3", overrides={"log.retention.check.interval.ms": 300,
                                                "cluster.lease.ms": 2000})
    now_ms = int(time.time() * 1000)
    # By time: 500 records two hours old, then 500 new; retention.ms one hour.
    timed = unique_topic("cret-time")
    create_topic(cl.bootstrap, timed, partitions=1, config={"retention.ms": str(3600 * 1000)})
    old_values, _ = produce_timed(cl, timed, 500, now_ms - 2 * 3600 * 1000, tag=b"old")
    new_values, offsets = produce_timed(cl, timed, 500, now_ms, tag=b"new")
    assert offsets == list(range(500, 1000))
    lo = wait_until(lambda: watermarks(cl.bootstrap, timed, 0)[0] or None, 60, interval=0.2,
                    what="time retention to move the log start")
    assert lo == 500, f"log start {lo}: only the old batches are past retention.ms"
    got = consume_confluent(cl.bootstrap, timed, [0], start=lo)[0]
    assert [r.value for r in got] == new_values
    expect_offset_out_of_range_confluent(cl, timed, lo - 1)
    assert cl.sql("SELECT count(*) FROM batches b JOIN topics t ON t.id = b.topic_id "
                  "WHERE t.name = %s AND b.last_offset < %s", timed, lo)[0][0] == 0

    # By size: ~2 MB against retention.bytes 200 kB.
    sized = unique_topic("cret-size")
    create_topic(cl.bootstrap, sized, partitions=1, config={"retention.bytes": str(RETENTION_BYTES)})
    values, _ = produce_timed(cl, sized, 2000, now_ms)

    def settled():
        size, _ = stored_bytes(cl, sized)
        lo = watermarks(cl.bootstrap, sized, 0)[0]
        return (lo, size) if lo > 0 and size < RETENTION_BYTES + 20000 else None
    lo, size = wait_until(settled, 60, interval=0.2, what="size retention to settle")
    # At least retention.bytes of the newest data is kept (batches are <= 16 kB).
    assert size >= RETENTION_BYTES, size
    got = consume_confluent(cl.bootstrap, sized, [0], start=lo)[0]
    assert [r.value for r in got] == values[lo:]

    # One broker holds the job; killed, another takes it over and goes on.
    holder, _ = wait_until(lambda: job_holder(cl, "retention"), 30, what="a retention holder")
    cl.by_id(holder).kill9()
    moved = wait_until(lambda: (job_holder(cl, "retention") or (holder,))[0] != holder or None,
                       60, interval=0.3, what="another broker to take the retention job over")
    assert moved
    again = unique_topic("cret-after")
    create_topic(cl.bootstrap, again, partitions=1, config={"retention.ms": str(3600 * 1000)})
    produce_timed(cl, again, 100, now_ms - 2 * 3600 * 1000, tag=b"old")
    produce_timed(cl, again, 10, int(time.time() * 1000), tag=b"new")
    assert wait_until(lambda: watermarks(cl.bootstrap, again, 0)[0] == 100 or None, 60,
                      interval=0.2, what="retention under the new holder")


@pytest.mark.timeout(300)
def test_cluster_retention_never_passes_an_open_transaction(cluster_factory):
    cl = cluster_factory(store="file", n=2, overrides={"log.retention.check.interval.ms": 200})
    topic = unique_topic("cret-txn")
    create_topic(cl.bootstrap, topic, partitions=1, config={"retention.ms": "1000"})
    old = int(time.time() * 1000) - 3600 * 1000
    produce_timed(cl, topic, 50, old, tag=b"before")
    p = txn_producer(cl.bootstrap, f"{topic}-writer")
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(20):
        p.produce(topic, value=b"open-%d" % i, partition=0, timestamp=old)
    p.flush(30)
    # Everything is past retention.ms, but the open transaction starts at 50.
    assert wait_until(lambda: watermarks(cl.bootstrap, topic, 0)[0] == 50 or None, 60,
                      interval=0.2, what="retention up to the open transaction")
    time.sleep(1.5)
    assert watermarks(cl.bootstrap, topic, 0)[0] == 50, "retention passed the LSO"
    p.commit_transaction(30)
    # Decided: the data goes too, up to the commit marker (its timestamp is now).
    assert wait_until(lambda: watermarks(cl.bootstrap, topic, 0)[0] == 70 or None, 60,
                      interval=0.2, what="retention after the commit")
