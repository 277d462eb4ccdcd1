"""Crash and corruption: what was acknowledged survives kill -9, and a torn or
corrupted log tail is detected at startup, cut back to the last good batch, and
reported, while every earlier batch is still served."""

import hashlib
import re
import time

import pytest

from clients import (DeliveryTracker, Producer, assert_dense, consume_confluent,
                     create_topic, flush_all, producer_config, unique_topic,
                     watermarks)
import kafka_wire


def assert_no_panic(broker):
    text = broker.log_text()
    assert "panicked" not in text, f"broker log shows a panic:\n{broker.log_tail(80)}"


# ----------------------------------------------------------- (a) kill -9

@pytest.mark.timeout(600)
def test_kill9_during_produce_keeps_every_acknowledged_message(broker_factory):
    b = broker_factory()
    topic = unique_topic("kill9")
    parts = [0, 1, 2]
    create_topic(b.bootstrap, topic, partitions=3)

    acked = {}          # (partition, offset) -> value
    attempted = set()   # every value ever handed to the producer
    rounds = 3
    for rnd in range(rounds):
        tracker = DeliveryTracker()
        p = Producer(producer_config(b.bootstrap, linger_ms=2, message_timeout_ms=20000,
                                     queue_buffering_max_messages=100000))
        kill_after = 20000 + 5000 * rnd
        killed_at = None
        i = 0
        deadline = time.monotonic() + 120
        # Produce until enough acknowledgements came back, kill the broker
        # while requests are in flight, and keep producing a little longer.
        while True:
            value = b"r%d-%07d-" % (rnd, i) + b"x" * (i % 200)
            attempted.add(value)
            while True:
                try:
                    p.produce(topic, value=value, key=b"k%d" % (i % 97), partition=i % 3,
                              on_delivery=tracker)
                    break
                except BufferError:
                    p.poll(0.01)
            p.poll(0)
            i += 1
            if killed_at is None and len(tracker.acked) >= kill_after:
                b.kill9()
                killed_at = i
            if killed_at is not None and i >= killed_at + 2000:
                break
            assert time.monotonic() < deadline, \
                f"round {rnd}: only {len(tracker.acked)} acknowledgements after 120 s"
        assert not b.alive
        # Nothing more can be acknowledged: drop what is queued or in flight.
        p.purge()
        p.flush(30)
        assert p.flush(0) == 0
        for part, off, value, _ in tracker.acked:
            assert (part, off) not in acked, \
                f"{topic}-{part}@{off} acknowledged twice (earlier data lost and its offset reused?)"
            acked[(part, off)] = value
        del p

        b.start()
        assert_no_panic(b)
        got = consume_confluent(b.bootstrap, topic, parts, timeout=120)
        for part in parts:
            assert_dense(got[part], 0, f"after kill -9 #{rnd + 1}, {topic}-{part}")
            for r in got[part]:
                assert r.value in attempted, f"{topic}-{part}@{r.offset}: unknown value {r.value[:40]!r}"
        missing = [(part, off) for (part, off) in acked
                   if off >= len(got[part])]
        assert not missing, (f"after kill -9 #{rnd + 1}: {len(missing)} acknowledged messages lost, "
                             f"e.g. {sorted(missing)[:5]}; high watermarks "
                             f"{ {q: len(got[q]) for q in parts} }")
        wrong = [(part, off) for (part, off), v in acked.items() if got[part][off].value != v]
        assert not wrong, (f"after kill -9 #{rnd + 1}: {len(wrong)} acknowledged offsets hold another "
                           f"value, e.g. {sorted(wrong)[:5]}")


# ------------------------------------------------ (b), (c) torn / corrupt tail

DROP_LINE = re.compile(r"bytes_dropped\s*=\s*(\d+)")


def recovery_lines(broker, topic, partition):
    """Startup log lines that report a truncation of topic-partition."""
    out = []
    for line in broker.log_text(since_last_start=True).splitlines():
        if "truncated" not in line or "bytes_dropped" not in line:
            continue
        if f"{topic}-{partition}" in line or (
                topic in line and re.search(rf"partition\s*=\s*{partition}\b", line)):
            out.append(line)
    return out


def fill_partitions(b, topic):
    """~3 MB into partition 0 (several 1 MiB segments), a little into
    partition 1, then a final small batch into partition 0."""
    tracker = DeliveryTracker()
    p = Producer(producer_config(b.bootstrap, linger_ms=5))
    for i in range(6000):
        p.produce(topic, value=b"p0-%06d-" % i + b"v" * 500, partition=0, on_delivery=tracker)
        if i % 3 == 0:
            p.produce(topic, value=b"p1-%06d" % i, partition=1, on_delivery=tracker)
        p.poll(0)
    flush_all(p)
    for i in range(5):
        p.produce(topic, value=b"last-%d-" % i + b"z" * 200, partition=0, on_delivery=tracker)
    flush_all(p)
    assert not tracker.failed, tracker.failed[:3]
    acked = {0: {}, 1: {}}
    for part, off, value, _ in tracker.acked:
        acked[part][off] = value
    return acked


@pytest.mark.timeout(300)
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_tail_is_cut_back_at_startup(broker_factory, damage):
    b = broker_factory({"log.segment.bytes": 1048576})
    topic = unique_topic(f"tail-{damage}")
    create_topic(b.bootstrap, topic, partitions=2)
    acked = fill_partitions(b, topic)
    n0, n1 = len(acked[0]), len(acked[1])
    assert sorted(acked[0]) == list(range(n0)) and sorted(acked[1]) == list(range(n1))
    b.stop()

    segs = b.segment_files(topic, 0)
    assert len(segs) >= 2, f"expected several segments with log.segment.bytes=1 MiB, got {segs}"
    last = segs[-1]
    data = last.read_bytes()
    batches = list(kafka_wire.walk_batches(data))
    assert batches, f"{last}: no complete batch"
    assert batches[-1].pos + batches[-1].size == len(data), \
        f"{last}: after a clean shutdown the file has {len(data)} bytes, batches end at " \
        f"{batches[-1].pos + batches[-1].size}"
    assert all(x.crc_ok for x in batches), f"{last}: bad CRC before any damage"
    victim = batches[-1]
    assert victim.last_offset == n0 - 1, f"last batch {victim} does not end at offset {n0 - 1}"
    others = {s: hashlib.sha256(s.read_bytes()).hexdigest()
              for s in segs[:-1] + b.segment_files(topic, 1)}

    if damage == "truncate":
        cut = 7
        assert victim.size > kafka_wire.BATCH_HEADER_LEN + cut
        with open(last, "r+b") as f:
            f.truncate(len(data) - cut)
        expected_dropped = victim.size - cut
    else:
        pos = victim.pos + victim.size - 3       # inside the last record's value
        assert pos >= victim.pos + kafka_wire.BATCH_HEADER_LEN + 20
        with open(last, "r+b") as f:
            f.seek(pos)
            f.write(bytes([data[pos] ^ 0x5A]))
        expected_dropped = victim.size

    b.start()
    assert_no_panic(b)
    # The report may be written when the partition is opened: give it a moment.
    deadline = time.monotonic() + 10
    while not recovery_lines(b, topic, 0) and time.monotonic() < deadline:
        watermarks(b.bootstrap, topic, 0)
        time.sleep(0.1)
    lines = recovery_lines(b, topic, 0)
    assert lines, (f"no startup log line with 'truncated', 'bytes_dropped' and {topic}-0; "
                   f"log since start:\n{b.log_text(since_last_start=True)[-4000:]}")
    dropped = [int(m.group(1)) for m in (DROP_LINE.search(x) for x in lines) if m]
    assert dropped == [expected_dropped], \
        f"expected one report of bytes_dropped={expected_dropped}, got lines:\n" + "\n".join(lines)
    # On disk: the damaged file is cut at the last good batch, the rest untouched.
    assert last.stat().st_size == victim.pos, \
        f"{last} is {last.stat().st_size} bytes after recovery, expected {victim.pos}"
    for s, digest in others.items():
        assert hashlib.sha256(s.read_bytes()).hexdigest() == digest, f"{s} changed by recovery"

    # Everything before the damaged batch is served, nothing after it.
    keep = victim.base_offset
    assert watermarks(b.bootstrap, topic, 0) == (0, keep)
    assert watermarks(b.bootstrap, topic, 1) == (0, n1)
    got = consume_confluent(b.bootstrap, topic, [0, 1])
    assert_dense(got[0], 0, f"{topic}-0 after recovery")
    assert [r.value for r in got[0]] == [acked[0][o] for o in range(keep)]
    assert [r.value for r in got[1]] == [acked[1][o] for o in range(n1)]
    tail = consume_confluent(b.bootstrap, topic, [0], start=keep - 3)[0]
    assert [r.offset for r in tail] == [keep - 3, keep - 2, keep - 1]
    assert not recovery_lines(b, topic, 1), "undamaged partition 1 reported as truncated"

    # New writes continue right after the last good batch.
    tracker = DeliveryTracker()
    p = Producer(producer_config(b.bootstrap))
    for i in range(10):
        p.produce(topic, value=b"after-%d" % i, partition=0, on_delivery=tracker)
    flush_all(p)
    assert not tracker.failed
    assert sorted(off for _, off, _, _ in tracker.acked) == list(range(keep, keep + 10))
    got = consume_confluent(b.bootstrap, topic, [0])[0]
    assert_dense(got, 0, f"{topic}-0 after new writes")
    assert [r.value for r in got[keep:]] == [b"after-%d" % i for i in range(10)]
    assert [r.value for r in got[:keep]] == [acked[0][o] for o in range(keep)]
