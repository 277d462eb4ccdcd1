"""Cluster mode under faults of the network between its hosts: a broker cut
off from PostgreSQL while its clients still reach it (tests/faultproxy.py
stands between that broker and PostgreSQL)."""

import threading
import time

import pytest

import kafka_wire as kw
from faultproxy import FaultProxy, via


NOT_COORDINATOR = 16
UNKNOWN_MEMBER_ID = 25
LEASE_MS = 3000


@pytest.fixture
def cut_off_cluster(cluster_factory):
    """Two brokers; broker 1 reaches PostgreSQL only through a FaultProxy."""
    from urllib.parse import urlsplit
    cl = cluster_factory(store="file", n=2, start=False,
                         overrides={"cluster.lease.ms": LEASE_MS,
                                    "group.initial.rebalance.delay.ms": 0})
    u = urlsplit(cl.db)
    proxy = FaultProxy(u.hostname or "127.0.0.1", u.port or 5432)
    cl.by_id(1).overrides["cluster.postgres"] = via(cl.db, proxy)
    cl.start()
    yield cl, proxy
    proxy.close()


def test_a_coordinator_cut_off_from_postgresql_stops_answering_before_another_claims_the_group(
        cut_off_cluster):
    """Broker 1 coordinates a group; PostgreSQL becomes unreachable from it
    (both ways) while its member still reaches it. It must stop answering
    for the group before its lease can end, so that when broker 2 claims
    the group (after the lease ended, in PostgreSQL's clock) the group never
    has two live generations: the member's last good heartbeat through
    broker 1 comes before broker 2's claim, and broker 1 refuses a rejoin
    from then on. After the heal broker 1 serves under a new session and
    sends the member to the new coordinator."""
    cl, proxy = cut_off_cluster
    b1, b2 = cl.by_id(1), cl.by_id(2)
    m = kw.WireMember(b1.host, b1.port, "billing", session_timeout_ms=30000)
    assert m.join() == 0 and m.sync() == 0
    assert cl.sql("SELECT broker_id FROM group_owners WHERE group_id = 'billing'") == [(1,)]
    first_generation = m.generation

    beats = []          # (sent, received, code) of the member's heartbeats to broker 1
    stop = threading.Event()

    def beat():
        while not stop.is_set():
            sent = time.monotonic()
            try:
                code = m.heartbeat()
            except (OSError, ValueError, ConnectionError):
                code = None
            beats.append((sent, time.monotonic(), code))
            stop.wait(0.1)

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    time.sleep(1.0)
    assert beats and all(c == 0 for (_, _, c) in beats), beats

    cut_at = time.monotonic()
    proxy.partition()
    # a new member through broker 2: NOT_COORDINATOR while broker 1's lease
    # lives in PostgreSQL, then broker 2 claims the group
    n = kw.WireMember(b2.host, b2.port, "billing", session_timeout_ms=30000)
    claim_sent = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        sent = time.monotonic()
        code = n.join()
        if code == 0:
            claim_sent = sent
            break
        assert code == NOT_COORDINATOR, code
        time.sleep(0.1)
    assert claim_sent is not None, "broker 2 never claimed the group"
    assert n.sync() == 0
    assert cl.sql("SELECT broker_id FROM group_owners WHERE group_id = 'billing'") == [(2,)]

    # the old coordinator refuses a rejoin of its member
    rejoin = kw.WireMember(b1.host, b1.port, "billing", session_timeout_ms=30000)
    rejoin.member_id = m.member_id
    assert rejoin.join() == NOT_COORDINATOR
    rejoin.close()
    time.sleep(0.5)
    stop.set()
    t.join(10)

    good = [rcv for (_, rcv, c) in beats if c == 0]
    refused = [(s, c) for (s, _, c) in beats if c not in (0, None)]
    assert good and refused, beats
    last_good = max(good)
    # broker 1 stopped answering for the group before broker 2 took it
    assert last_good < claim_sent, (last_good - cut_at, claim_sent - cut_at)
    # and it did so by its own deadline, before its lease could end
    assert last_good - cut_at < LEASE_MS / 1000, last_good - cut_at
    assert all(c == NOT_COORDINATOR for (_, c) in refused), refused
    assert claim_sent - cut_at >= LEASE_MS / 1000 * 0.75, claim_sent - cut_at
    assert "stops coordinating groups" in b1.log_text()

    # heal: broker 1 is fenced, registers anew and sends the member onwards
    proxy.heal()
    deadline = time.monotonic() + 20
    while "registering a new session" not in b1.log_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "registering a new session" in b1.log_text(), b1.log_tail(40)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            code = m.heartbeat()
        except (OSError, ValueError, ConnectionError):
            code = None
        if code is not None and code != 0:
            break
        time.sleep(0.2)
    assert code == NOT_COORDINATOR, code
    # the new coordinator does not know the old generation's member
    old = kw.WireMember(b2.host, b2.port, "billing")
    old.member_id, old.generation = m.member_id, first_generation
    assert old.heartbeat() == UNKNOWN_MEMBER_ID
    assert n.heartbeat() == 0
    for x in (m, n, old):
        x.close()


def test_a_hung_put_fails_its_flush_and_the_producers_retry_lands_once(cluster_factory):
    """The object store stops answering (its link cut, as a SIGSTOPped
    server): a PUT past cluster.put.timeout.ms fails its flush with a
    retriable error, said in the log, instead of holding every later flush
    behind it; after the heal the idempotent producer's retry lands once."""
    from urllib.parse import urlsplit
    from confluent_kafka import Producer
    from clients import create_topic, producer_config, read_all
    cl = cluster_factory(store="s3", n=1, start=False,
                         overrides={"cluster.put.timeout.ms": 1500})
    s3 = urlsplit(cl.env["ONCELOG_TEST_S3_ENDPOINT"])
    proxy = FaultProxy(s3.hostname, s3.port)
    try:
        b = cl.by_id(1)
        b.env["AWS_ENDPOINT"] = via(cl.env["ONCELOG_TEST_S3_ENDPOINT"], proxy)
        cl.start()
        create_topic(b.bootstrap, "fares", 1)
        p = Producer(producer_config(b.bootstrap, enable_idempotence=True))
        p.produce("fares", value=b"before")
        assert p.flush(30) == 0

        proxy.partition()
        cut_at = time.monotonic()
        p.produce("fares", value=b"during")
        deadline = time.monotonic() + 20
        while "cluster.put.timeout.ms" not in b.log_text() and time.monotonic() < deadline:
            p.poll(0.2)
        assert "cluster.put.timeout.ms" in b.log_text(), b.log_tail(30)
        assert time.monotonic() - cut_at < 10
        assert len(p) == 1          # not acknowledged while the store hangs
        proxy.heal()
        assert p.flush(60) == 0
        assert read_all(b.bootstrap, "fares", 0, decode=True) == ["before", "during"]
    finally:
        proxy.close()


def test_a_partition_whose_next_offset_went_back_is_not_served(cluster_factory):
    """PostgreSQL comes back without commits the broker saw acknowledged (an
    asynchronous standby promoted, a backup restored; here the rows are
    rolled back by hand): the partition's next offset is below what the
    broker handed out. The broker refuses to produce to it or read it, says
    why, and hands out no offset twice; other partitions go on."""
    cl = cluster_factory(store="file", n=1)
    b = cl.by_id(1)
    from clients import create_topic
    create_topic(b.bootstrap, "ledger", 2)

    def produce(partition, n):
        with kw.Conn(b.host, b.port) as c:
            batch = kw.encode_batch([(None, f"r{i}".encode(), ()) for i in range(n)])
            c.send(kw.produce_request(3, 1, "ledger", partition, batch))
            (codes, _) = kw.parse_produce_v3_response(c.recv_response(1))
        return codes[("ledger", partition)]

    assert produce(0, 10)[:2] == (0, 0)
    assert produce(0, 10)[:2] == (0, 10)
    assert produce(1, 5)[:2] == (0, 0)
    # the database loses the second commit of partition 0
    cl.sql("DELETE FROM batches b USING topics t WHERE b.topic_id = t.id "
           "AND t.name = 'ledger' AND b.partition = 0 AND b.base_offset >= 10 RETURNING 1")
    cl.sql("UPDATE partitions p SET next_offset = 10 FROM topics t "
           "WHERE p.topic_id = t.id AND t.name = 'ledger' AND p.partition = 0 RETURNING 1")

    code, _, _ = produce(0, 3)
    assert code == 56, code                                 # KAFKA_STORAGE_ERROR
    assert cl.sql("SELECT p.next_offset FROM partitions p JOIN topics t ON t.id = p.topic_id "
                  "WHERE t.name = 'ledger' AND p.partition = 0") == [(10,)]
    with kw.Conn(b.host, b.port) as c:
        c.send(kw.fetch_v4_request(2, "ledger", 0, 0))
        fetched = kw.parse_fetch_v4_response(c.recv_response(2))
    assert fetched[0] == 56, fetched
    assert "the database lost acknowledged commits" in b.log_text()
    # the other partition is served
    assert produce(1, 5)[:2] == (0, 5)
