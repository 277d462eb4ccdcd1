"""PostgreSQL failover under load (docs/SCENARIOS S12, docs/cluster.md
"PostgreSQL settings"): a primary and a streaming standby of the test's
own; the brokers follow a multi-host URL with target_session_attrs=
read-write. The primary is killed (immediate shutdown: no checkpoint, as a
crash) and the standby promoted.

  * synchronous replication: nothing acknowledged is lost, no offset is
    handed out twice;
  * asynchronous replication with the standby behind: the acknowledged
    commits it lacks are lost, and the broker that acknowledged them refuses
    to serve the partitions that went back rather than hand out their
    offsets again."""

import threading
import time

import pytest
from confluent_kafka import Producer

import kafka_wire as kw
from clients import create_topic, producer_config, read_all
from cluster_env import Cluster
from pgpair import PgPair

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def pg_pair(cluster_services, request):
    pair = PgPair(cluster_services, request.param == "sync").start()
    yield pair
    pair.stop()


def brokers(tmp_path, env, pair, n):
    cl = Cluster(tmp_path / "cluster", env, pair.url, f"file://{tmp_path / 'objects'}", n,
                 {"cluster.lease.ms": 4000})
    return cl.start()


@pytest.mark.parametrize("pg_pair", ["sync"], indirect=True)
def test_a_failover_to_a_synchronous_standby_loses_nothing_acknowledged(pg_pair, cluster_services,
                                                                          tmp_path):
    cl = brokers(tmp_path, cluster_services, pg_pair, 2)
    try:
        create_topic(cl.bootstrap, "fares", 3)
        acked = {}          # (partition, offset) -> value
        implicit = []       # (partition, value) acknowledged with no offset
        errors = []
        stop = threading.Event()

        def load():
            p = Producer(producer_config(cl.bootstrap, enable_idempotence=True, linger_ms=2))

            def done(err, m):
                if err is None and m.offset() is None:
                    # librdkafka's implicit ack: a request answered with a
                    # retriable error whose commit did land (the primary died
                    # between COMMIT and its answer) is acknowledged by the
                    # next batch's success, with no offset
                    implicit.append((m.partition(), m.value()))
                elif err is None:
                    key = (m.partition(), m.offset())
                    assert key not in acked, f"offset {key} acknowledged twice"
                    acked[key] = m.value()
                else:
                    errors.append(str(err))
            i = 0
            while not stop.is_set():
                try:
                    p.produce("fares", value=f"f-{i}".encode(), partition=i % 3, on_delivery=done)
                    i += 1
                except BufferError:
                    pass
                p.poll(0.002)
            assert p.flush(120) == 0
        t = threading.Thread(target=load)
        t.start()
        time.sleep(3)
        before = len(acked)
        pg_pair.fail_over()
        time.sleep(8)
        stop.set()
        t.join(150)
        assert not t.is_alive()
        assert before > 0 and len(acked) > before, (before, len(acked))
        assert not errors, errors[:5]
        for q in range(3):
            got = read_all(cl.bootstrap, "fares", q, offsets=True)
            mine = {o: v for (p, o), v in acked.items() if p == q}
            missing = [o for o in mine if got.get(o) != mine[o]]
            assert not missing, f"partition {q}: {len(missing)} acknowledged records lost or moved"
            held = set(got.values())
            lost = [v for (p, v) in implicit if p == q and v not in held]
            assert not lost, f"partition {q}: {len(lost)} implicitly acknowledged records lost"
            assert len(set(got.values())) == len(got), f"partition {q}: a record twice"
        assert "lost acknowledged commits" not in cl.log_text()
    finally:
        cl.cleanup()


@pytest.mark.parametrize("pg_pair", ["async"], indirect=True)
def test_an_asynchronous_failover_loses_commits_and_the_broker_refuses_the_partition(
        pg_pair, cluster_services, tmp_path):
    cl = brokers(tmp_path, cluster_services, pg_pair, 1)
    try:
        b = cl.by_id(1)
        create_topic(b.bootstrap, "ledger", 2)

        def produce(partition, n, tag):
            with kw.Conn(b.host, b.port, timeout=30) as c:
                batch = kw.encode_batch([(None, f"{tag}-{i}".encode(), ()) for i in range(n)])
                c.send(kw.produce_request(3, 1, "ledger", partition, batch))
                (codes, _) = kw.parse_produce_v3_response(c.recv_response(1))
            return codes[("ledger", partition)][:2]

        assert produce(0, 10, "a") == (0, 0)
        assert produce(1, 10, "a") == (0, 0)
        pg_pair.caught_up()
        # the standby is cut off; the primary acknowledges on its own, then
        # dies with what it sent the standby still in the network
        pg_pair.link.partition()
        assert produce(0, 10, "b") == (0, 10)
        pg_pair.kill_primary()
        pg_pair.link.reset()
        pg_pair.promote()

        # what the promoted standby has of partition 0: the first 10
        rows = PgPair.sql(pg_pair.p, "SELECT p.partition, p.next_offset FROM partitions p "
                                          "JOIN topics t ON t.id = p.topic_id "
                                          "WHERE t.name = 'ledger' ORDER BY 1", db="oncelog")
        assert rows == [(0, 10), (1, 10)], rows          # 10 acknowledged records lost
        # the broker, which acknowledged offsets 10..19 of partition 0,
        # refuses it instead of handing them out again; partition 1 goes on
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            code, _ = produce(0, 5, "c")
            assert code != 0, "offsets 10.. were handed out again"
            if "the database lost acknowledged commits" in b.log_text():
                break
            time.sleep(0.5)
        assert "the database lost acknowledged commits" in b.log_text(), b.log_tail(40)
        assert produce(0, 5, "c")[0] == 56                # KAFKA_STORAGE_ERROR
        assert produce(1, 5, "c") == (0, 10)
        rows = PgPair.sql(pg_pair.p, "SELECT p.next_offset FROM partitions p "
                                          "JOIN topics t ON t.id = p.topic_id "
                                          "WHERE t.name = 'ledger' AND p.partition = 0", db="oncelog")
        assert rows == [(10,)], rows
        assert read_all(b.bootstrap, "ledger", 1, decode=True) == \
            [f"a-{i}" for i in range(10)] + [f"c-{i}" for i in range(5)]
    finally:
        cl.cleanup()
