"""ListOffsets, one handler over both backends (issue #34: cluster mode had
its own copy, which refused KIP-405's earliest-local spec). ListOffsets v5
by hand, so that offsets, timestamps and codes are all seen: latest and
earliest, the last stable offset for read_committed under an open
transaction, the largest timestamp, lookups by time, and the refusals."""

from confluent_kafka import Producer

from clients import create_topic, producer_config, txn_producer, unique_topic
from conftest import both_modes
from kafka_wire import (API_LIST_OFFSETS, Conn, Reader, frame, i8, i32, i64,
                        request_header_v1, string)

UNKNOWN_TOPIC, INVALID_REQUEST = 3, 42


def list_offsets_v5(host, port, topic, asks, read_committed=False):
    """ListOffsets v5 for (partition, spec) pairs of one topic. Returns one
    (error_code, offset, timestamp) per pair, in order."""
    cid = 41
    parts = b"".join(i32(p) + i32(-1) + i64(spec) for p, spec in asks)
    body = (i32(-1) + i8(1 if read_committed else 0) + i32(1) + string(topic)
            + i32(len(asks)) + parts)
    with Conn(host, port, timeout=30) as c:
        c.send(frame(request_header_v1(API_LIST_OFFSETS, 5, cid) + body))
        r = Reader(c.recv_response(cid))
    r.i32()                                   # throttle_time_ms
    out = []
    for _ in range(r.i32()):
        assert r.string() == topic
        for _ in range(r.i32()):
            r.i32()                           # partition_index
            code, ts, off = r.i16(), r.i64(), r.i64()
            r.i32()                           # leader_epoch
            out.append((code, off, ts))
    assert r.remaining() == 0, "trailing bytes in ListOffsets v5"
    return out


@both_modes()
def test_list_offsets_alike_in_both_modes(broker):
    t = unique_topic("lo")
    create_topic(broker.bootstrap, t, partitions=1)
    base = 1_700_000_000_000
    stamps = [base + 10 * i for i in range(20)]
    stamps[7] = base + 100_000                # the largest, in the middle
    p = Producer(producer_config(broker.bootstrap, linger_ms=0))
    for i, ts in enumerate(stamps):
        p.produce(t, value=b"v%d" % i, partition=0, timestamp=ts)
        p.flush(30)                           # one record per batch
    # an open transaction after them: the LSO stays at 20, the HW moves on
    tp = txn_producer(broker.bootstrap, unique_topic("lo-txn"))
    tp.init_transactions(30)
    tp.begin_transaction()
    tp.produce(t, value=b"open", partition=0, timestamp=base + 200_000)
    tp.flush(30)

    def ask(asks, read_committed=False):
        return list_offsets_v5(broker.host, broker.port, t, asks, read_committed)

    assert ask([(0, -1), (0, -2), (0, -4)]) == [(0, 21, -1), (0, 0, -1), (0, 0, -1)]
    assert ask([(0, -1)], read_committed=True) == [(0, 20, -1)]
    # by time: the first record whose timestamp reaches the one asked
    assert ask([(0, base), (0, base + 15), (0, base + 75), (0, base + 100_001)]) == [
        (0, 0, base), (0, 2, base + 20), (0, 7, base + 100_000), (0, 20, base + 200_000)]
    # read_committed looks only below the LSO
    assert ask([(0, base + 100_001)], read_committed=True) == [(0, -1, -1)]
    # the largest timestamp (KIP-734): as Kafka, none for read_committed
    # while the record that has it is above the LSO
    assert ask([(0, -3)]) == [(0, 20, base + 200_000)]
    assert ask([(0, -3)], read_committed=True) == [(0, -1, -1)]
    # refusals
    assert ask([(0, -7), (5, -1), (-1, -1)]) == [
        (INVALID_REQUEST, -1, -1), (UNKNOWN_TOPIC, -1, -1), (UNKNOWN_TOPIC, -1, -1)]
    assert list_offsets_v5(broker.host, broker.port, unique_topic("lo-none"), [(0, -1)]) == [
        (UNKNOWN_TOPIC, -1, -1)]
    tp.abort_transaction(30)
    assert ask([(0, -1)], read_committed=True) == [(0, 22, -1)]
    # as Kafka's, the largest timestamp counts control batches too: the
    # ABORT marker, stamped now
    [(code, off, ts)] = ask([(0, -3)], read_committed=True)
    assert (code, off) == (0, 21) and ts > base + 200_000, (code, off, ts)


@both_modes()
def test_lookups_by_time_find_the_record_inside_its_batch(broker):
    """One batch of five records: a lookup by time answers the record that
    has the timestamp, not its batch's first (the cluster's batch index
    knows only each batch's largest timestamp; the records are read)."""
    t = unique_topic("lo-batch")
    create_topic(broker.bootstrap, t, partitions=1)
    base = 1_710_000_000_000
    stamps = [base, base + 10, base + 20, base + 90, base + 30]
    p = Producer(producer_config(broker.bootstrap, linger_ms=500, compression_type="none"))
    for i, ts in enumerate(stamps):
        p.produce(t, value=b"r%d" % i, partition=0, timestamp=ts)
    p.flush(30)                               # one batch of five

    def ask(asks):
        return list_offsets_v5(broker.host, broker.port, t, asks)

    assert ask([(0, -1)]) == [(0, 5, -1)]
    assert ask([(0, base + 15), (0, base + 20), (0, base + 31), (0, base + 91)]) == [
        (0, 2, base + 20), (0, 2, base + 20), (0, 3, base + 90), (0, -1, -1)]
    assert ask([(0, -3)]) == [(0, 3, base + 90)]
