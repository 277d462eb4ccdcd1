"""Idempotent producers: InitProducerId, duplicate batches answered with their
original offsets, out-of-order and stale-epoch batches refused, and the
producer state surviving restarts (from the log and from roll snapshots)."""

import struct

from confluent_kafka import Consumer, Producer, TopicPartition

import kafka_wire as kw
from clients import (DeliveryTracker, consumer_config, create_topic, flush_all, producer_config, read_all,
                     unique_topic)
from conftest import both_modes, wait_until

API_INIT_PRODUCER_ID = 22


def init_producer_id(conn, cid=1):
    """InitProducerId v1 (non-flexible) with a null transactional id."""
    body = kw.nullable_string(None) + kw.i32(60000)
    conn.send(kw.frame(kw.request_header_v1(API_INIT_PRODUCER_ID, 1, cid) + body))
    r = kw.Reader(conn.recv_response(cid))
    _throttle = r.i32()
    err = r.i16()
    pid = r.i64()
    epoch = r.i16()
    return err, pid, epoch


def produce(conn, topic, batch, cid):
    conn.send(kw.produce_request(3, cid, topic, 0, batch))
    out, _ = kw.parse_produce_v3_response(conn.recv_response(cid))
    err, base, _ = out[(topic, 0)]
    return err, base


def idem_batch(pid, epoch, seq, n, tag=b"x"):
    return kw.encode_batch([(b"k", tag + bytes([i]), ()) for i in range(n)],
                           producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_duplicates_out_of_order_and_stale_epochs(broker):
    topic = unique_topic("idem")
    create_topic(broker.bootstrap, topic)
    with kw.Conn(broker.host, broker.port) as conn:
        err, pid, epoch = init_producer_id(conn)
        assert err == 0 and pid >= 0 and epoch == 0
        err2, pid2, _ = init_producer_id(conn, 2)
        assert err2 == 0 and pid2 != pid, "each idempotent producer gets a fresh id"

        b0 = idem_batch(pid, 0, 0, 3, b"a")
        assert produce(conn, topic, b0, 10) == (0, 0)
        b1 = idem_batch(pid, 0, 3, 2, b"b")
        assert produce(conn, topic, b1, 11) == (0, 3)
        # A retry of either batch is answered with its original offset, not appended again.
        assert produce(conn, topic, b0, 12) == (0, 0)
        assert produce(conn, topic, b1, 13) == (0, 3)
        # A gap in the sequence: OUT_OF_ORDER_SEQUENCE_NUMBER (45).
        assert produce(conn, topic, idem_batch(pid, 0, 9, 1), 14)[0] == 45
        # A new epoch must start at 0; then the old epoch is stale (47, never 90).
        assert produce(conn, topic, idem_batch(pid, 1, 5, 1), 15)[0] == 45
        assert produce(conn, topic, idem_batch(pid, 1, 0, 1, b"c"), 16) == (0, 5)
        assert produce(conn, topic, idem_batch(pid, 0, 5, 1), 17)[0] == 47
        # Another producer is independent.
        assert produce(conn, topic, idem_batch(pid2, 0, 0, 1, b"d"), 18) == (0, 6)
    got = read_all(broker.bootstrap, topic, until=7, offsets=True)
    assert list(got) == list(range(7))
    assert list(got.values()) == [b"a\x00", b"a\x01", b"a\x02", b"b\x00", b"b\x01", b"c\x00", b"d\x00"]


def test_duplicate_detection_survives_restarts_and_rolls(broker_factory):
    # Small segments: many rolls, so the state comes back from a snapshot plus a replay.
    b = broker_factory(log_segment_bytes=4096)
    topic = unique_topic("idem-restart")
    create_topic(b.bootstrap, topic)
    with kw.Conn(b.host, b.port) as conn:
        _, pid, _ = init_producer_id(conn)
        batches = []
        seq = 0
        for i in range(60):
            batch = idem_batch(pid, 0, seq, 3, b"%03d" % i + b"p" * 100)
            err, base = produce(conn, topic, batch, 100 + i)
            assert (err, base) == (0, seq)
            batches.append((batch, base))
            seq += 3
    assert len(b.segment_files(topic, 0)) > 3
    snapshots = list(b.partition_dir(topic, 0).glob("*.snapshot"))
    assert snapshots, "segment rolls should leave producer snapshots"

    for restart in ("sigterm", "kill9"):
        if restart == "sigterm":
            b.restart()
        else:
            b.kill9()
            b.start()
        with kw.Conn(b.host, b.port) as conn:
            # The last five batches are still recognised after the restart.
            for batch, base in batches[-5:]:
                assert produce(conn, topic, batch, 500) == (0, base)
            # And the sequence continues where it was.
            assert produce(conn, topic, idem_batch(pid, 0, seq + 1, 1), 501)[0] == 45
    with kw.Conn(b.host, b.port) as conn:
        assert produce(conn, topic, idem_batch(pid, 0, seq, 1, b"end"), 502) == (0, seq)
    got = read_all(b.bootstrap, topic, until=seq + 1, offsets=True)
    assert list(got) == list(range(seq + 1)), "no duplicate slipped in"


@both_modes()
def test_librdkafka_idempotent_producer_across_restart(broker):
    """librdkafka with enable.idempotence=true: InitProducerId, sequences,
    in-flight retries across a broker restart; every message exactly once."""
    topic = unique_topic("idem-rd")
    create_topic(broker.bootstrap, topic, partitions=3)
    p = Producer(producer_config(broker.bootstrap, **{"enable.idempotence": True,
                                                      "max.in.flight.requests.per.connection": 5,
                                                      "linger.ms": 2}))
    tr = DeliveryTracker()
    n = 30000
    for i in range(n):
        if i == n // 2:
            p.flush(30)
            broker.kill9()
            broker.start()
        while True:
            try:
                p.produce(topic, key=b"%d" % (i % 97), value=b"v%06d" % i, on_delivery=tr)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    flush_all(p, 60)
    assert not tr.failed, tr.failed[:3]
    assert len(tr.acked) == n
    c = Consumer(consumer_config(broker.bootstrap))
    c.assign([TopicPartition(topic, i, 0) for i in range(3)])
    seen = {}
    try:
        def done():
            for m in c.consume(1000, timeout=0.5):
                assert m.error() is None, m.error()
                seen.setdefault(m.value(), []).append((m.partition(), m.offset()))
            return sum(len(v) for v in seen.values()) >= n
        wait_until(done, 60, what=f"{n} records")
    finally:
        c.close()
    dups = {v: at for v, at in seen.items() if len(at) > 1}
    assert not dups, f"{len(dups)} duplicated values, e.g. {list(dups.items())[:3]}"
    assert len(seen) == n


def test_lost_acks_are_retried_without_duplicates(broker_factory, monkeypatch):
    """The broker dies after making a batch durable but before answering;
    librdkafka retries it after the restart, and the retry is recognised as a
    duplicate from the producer state rebuilt from the log."""
    monkeypatch.setenv("ONCELOG_FAILPOINTS", "produce-before-ack")
    b = broker_factory()
    topic = unique_topic("lost-ack")
    create_topic(b.bootstrap, topic)
    monkeypatch.delenv("ONCELOG_FAILPOINTS")
    p = Producer(producer_config(b.bootstrap, **{"enable.idempotence": True, "linger.ms": 20,
                                                 "message.timeout.ms": 60000}))
    tr = DeliveryTracker()
    for i in range(2000):
        p.produce(topic, value=b"v%05d" % i, partition=0, on_delivery=tr)
    p.poll(0.5)
    wait_until(lambda: not b.alive, 20, what="the failpoint to stop the broker before its first ack")
    assert not tr.acked, "nothing was acknowledged before the crash"
    b.start()
    flush_all(p, 60)
    assert not tr.failed and len(tr.acked) == 2000
    got = read_all(b.bootstrap, topic, until=2000)
    assert got == [b"v%05d" % i for i in range(2000)], "no duplicate, no gap"
    assert [o for _, o, _, _ in sorted(tr.acked, key=lambda a: a[1])] == list(range(2000))
