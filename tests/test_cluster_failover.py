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

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer

import kafka_wire as kw
from clients import create_topic, producer_config, read_all
from cluster_env import Cluster
from conftest import free_port
from faultproxy import FaultProxy

pytestmark = pytest.mark.timeout(240)


class PgPair:
    """A primary and its streaming standby, on loopback ports, as the
    postgres user (initdb refuses root)."""

    def __init__(self, env, synchronous):
        self.bin = env["ONCELOG_TEST_PG_BIN"]
        self.dir = Path(tempfile.mkdtemp(prefix="oncelog-pgpair."))
        os.chmod(self.dir, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        self.primary, self.standby = self.dir / "primary", self.dir / "standby"
        self.p_port, self.s_port = free_port(), free_port()
        self.synchronous = synchronous

    def run(self, *cmd, check=True, timeout=90):
        if os.geteuid() == 0:
            cmd = ("runuser", "-u", "postgres", "--", *cmd)
        return subprocess.run(cmd, check=check, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)

    def ctl(self, data, *args, port=None):
        opts = []
        if port is not None:
            opts = ["-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {data}"]
        return self.run(f"{self.bin}/pg_ctl", "-D", str(data), "-l", f"{data}.log", "-w", "-t", "60",
                        *opts, *args)

    def start(self):
        self.run(f"{self.bin}/initdb", "-D", str(self.primary), "-A", "trust", "-U", "postgres",
                 "--no-sync")
        with open(self.primary / "postgresql.conf", "a") as f:
            f.write("wal_level = replica\nmax_wal_senders = 5\nmax_connections = 200\n"
                    "fsync = on\nwal_keep_size = '256MB'\n")
            if self.synchronous:
                f.write("synchronous_standby_names = 'standby1'\nsynchronous_commit = on\n")
        self.ctl(self.primary, "start", port=self.p_port)
        # the standby streams through a proxy: the network between the two
        self.link = FaultProxy("127.0.0.1", self.p_port)
        self.run(f"{self.bin}/pg_basebackup", "-h", "127.0.0.1", "-p", str(self.p_port), "-U",
                 "postgres", "-D", str(self.standby), "-R", "-X", "stream")
        with open(self.standby / "postgresql.auto.conf", "a") as f:
            f.write(f"primary_conninfo = 'host=127.0.0.1 port={self.link.port} user=postgres "
                    f"application_name=standby1'\n")
        self.ctl(self.standby, "start", port=self.s_port)
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = self.sql(self.p_port, "SELECT sync_state FROM pg_stat_replication "
                                         "WHERE application_name = 'standby1'")
            if rows and rows[0][0] == want:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the standby is not streaming ({want})")
        self.sql(self.p_port, "CREATE DATABASE oncelog")
        return self

    @property
    def url(self):
        return (f"postgres://postgres@127.0.0.1:{self.p_port},127.0.0.1:{self.s_port}/oncelog"
                "?target_session_attrs=read-write")

    @staticmethod
    def sql(port, query, db="postgres"):
        with psycopg.connect(f"postgres://postgres@127.0.0.1:{port}/{db}", autocommit=True) as c:
            cur = c.execute(query)
            return cur.fetchall() if cur.description else []

    def caught_up(self, timeout=30):
        """Waits until the standby replayed all the primary wrote."""
        lsn = self.sql(self.p_port, "SELECT pg_current_wal_lsn()::text")[0][0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.sql(self.s_port, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0][0]
            if done:
                return
            time.sleep(0.1)
        raise AssertionError("the standby did not catch up")

    def fail_over(self):
        """Kills the primary (immediate: no shutdown checkpoint) and
        promotes the standby."""
        self.kill_primary()
        self.promote()

    def kill_primary(self):
        self.ctl(self.primary, "stop", "-m", "immediate")

    def promote(self):
        self.run(f"{self.bin}/pg_ctl", "-D", str(self.standby), "-w", "-t", "60", "promote")
        # The standby's copy of the primary's settings names itself as the
        # synchronous standby, which it cannot be: with no other standby
        # left, the new primary commits on its own (a failover manager
        # such as Patroni does the same).
        self.sql(self.s_port, "ALTER SYSTEM SET synchronous_standby_names = ''")
        self.sql(self.s_port, "SELECT pg_reload_conf()")

    def stop(self):
        self.link.close()
        for d in (self.primary, self.standby):
            if (d / "postmaster.pid").exists():
                self.ctl(d, "stop", "-m", "immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


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
        errors = []
        stop = threading.Event()

        def load():
            p = Producer(producer_config(cl.bootstrap, enable_idempotence=True, linger_ms=2))

            def done(err, m):
                if err is None:
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
        rows = PgPair.sql(pg_pair.s_port, "SELECT p.partition, p.next_offset FROM partitions p "
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
        rows = PgPair.sql(pg_pair.s_port, "SELECT p.next_offset FROM partitions p "
                                          "JOIN topics t ON t.id = p.topic_id "
                                          "WHERE t.name = 'ledger' AND p.partition = 0", db="oncelog")
        assert rows == [(10,)], rows
        assert read_all(b.bootstrap, "ledger", 1, decode=True) == \
            [f"a-{i}" for i in range(10)] + [f"c-{i}" for i in range(5)]
    finally:
        cl.cleanup()
