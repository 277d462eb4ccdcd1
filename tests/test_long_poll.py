"""Fetch's long poll, in both modes: woken by data in other partitions it
reads nothing again; data in its own partition ends it at once."""

import threading
import time

from confluent_kafka import Producer

import kafka_wire as kw
from clients import create_topic, flush_all, producer_config, scrape, unique_topic, value
from conftest import both_modes


def counters(broker):
    m = scrape(broker.metrics_url)
    return (value(m, "oncelog_fetch_rounds_total"),
            value(m, "oncelog_fetch_wakeups_skipped_total"))


def long_poll(broker, topic, partition, offset, wait_ms):
    """One Fetch v4 of `partition` from `offset`, waiting up to `wait_ms`
    for a byte: (seconds it took, high watermark, records bytes)."""
    with kw.Conn(broker.host, broker.port) as c:
        started = time.monotonic()
        c.send(kw.fetch_v4_request(1, topic, partition, offset, max_wait_ms=wait_ms))
        code, hw, _, data = kw.parse_fetch_v4_response(c.recv_response(1))
        assert code == 0
        return time.monotonic() - started, hw, data


@both_modes("broker_factory")
def test_a_long_poll_reads_again_only_for_its_own_partitions(broker_factory):
    cl = broker_factory()
    brokers = getattr(cl, "brokers", None) or [cl]
    polled = brokers[-1]
    topic = unique_topic("lp")
    create_topic(cl.bootstrap, topic, partitions=2)
    p = Producer(producer_config(cl.bootstrap, linger_ms=0))
    p.produce(topic, value=b"first", partition=0)
    flush_all(p)

    # Partition 0 waits at its end while partition 1 takes 200 writes, one
    # flush each, for the whole wait.
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set() and i < 200:
            p.produce(topic, value=b"other-%d" % i, partition=1)
            p.flush(10)
            i += 1

    rounds0, skipped0 = counters(polled)
    t = threading.Thread(target=writer)
    t.start()
    try:
        took, hw, data = long_poll(polled, topic, 0, 1, 3000)
    finally:
        stop.set()
        t.join(30)
    rounds1, skipped1 = counters(polled)
    assert data == b"" and hw == 1 and took >= 2.9, (took, hw, data)
    assert rounds1 - rounds0 == 1, "the wait read its partition again for another's data"
    assert skipped1 - skipped0 >= 5, (skipped0, skipped1)

    # Its own partition's data ends the wait at once, in one more round.
    def late():
        time.sleep(1.0)
        p.produce(topic, value=b"second", partition=0)
        p.flush(10)

    t = threading.Thread(target=late)
    t.start()
    took, hw, data = long_poll(polled, topic, 0, 1, 20000)
    t.join(30)
    rounds2, _ = counters(polled)
    assert b"second" in data and hw == 2, (hw, data)
    assert took < 10, took
    assert rounds2 - rounds1 == 2, (rounds1, rounds2)
