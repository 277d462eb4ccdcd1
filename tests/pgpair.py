"""A PostgreSQL primary and its streaming standby of a test's own, that can
fail over again and again: the primary killed (immediate shutdown: no
checkpoint, as a crash), the standby promoted, then a new standby built
from the new primary where the old one was (the way a failover manager
such as Patroni brings the pair back). Each node keeps its address; the
brokers follow a multi-host URL with target_session_attrs=read-write.
Runs as the postgres user (initdb refuses root)."""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from conftest import free_port
from faultproxy import FaultProxy


class Node:
    def __init__(self, data, host, port):
        self.data, self.host, self.port = data, host, port


class PgPair:
    def __init__(self, env, synchronous, hosts=("127.0.0.1", "127.0.0.1")):
        self.bin = env["ONCELOG_TEST_PG_BIN"]
        self.dir = Path(tempfile.mkdtemp(prefix="oncelog-pgpair."))
        os.chmod(self.dir, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        self.nodes = [Node(self.dir / "a", hosts[0], free_port()),
                      Node(self.dir / "b", hosts[1], free_port())]
        self.primary_i = 0
        self.synchronous = synchronous
        self.link = None
        self.failovers = 0

    # the current roles
    p = property(lambda self: self.nodes[self.primary_i])
    s = property(lambda self: self.nodes[1 - self.primary_i])
    primary = property(lambda self: self.p.data)
    standby = property(lambda self: self.s.data)
    p_port = property(lambda self: self.p.port)
    s_port = property(lambda self: self.s.port)

    def run(self, *cmd, check=True, timeout=90):
        if os.geteuid() == 0:
            cmd = ("runuser", "-u", "postgres", "--", *cmd)
        return subprocess.run(cmd, check=check, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)

    def ctl(self, node, *args, start=False):
        opts = []
        if start:
            opts = ["-o", f"-c listen_addresses={node.host} -p {node.port} -k {node.data}"]
        return self.run(f"{self.bin}/pg_ctl", "-D", str(node.data), "-l", f"{node.data}.log", "-w",
                        "-t", "60", *opts, *args)

    def start(self):
        self.run(f"{self.bin}/initdb", "-D", str(self.primary), "-A", "trust", "-U", "postgres",
                 "--no-sync")
        with open(self.primary / "postgresql.conf", "a") as f:
            f.write("wal_level = replica\nmax_wal_senders = 5\nmax_connections = 200\n"
                    "fsync = on\nwal_keep_size = '256MB'\n")
            if self.synchronous:
                f.write("synchronous_standby_names = 'standby1'\nsynchronous_commit = on\n")
        with open(self.primary / "pg_hba.conf", "a") as f:
            f.write("host all all 127.0.0.0/8 trust\nhost replication all 127.0.0.0/8 trust\n")
        self.ctl(self.p, "start", start=True)
        self.build_standby()
        self.sql(self.p, "CREATE DATABASE oncelog")
        return self

    def build_standby(self):
        """A standby of the current primary where the standby node is, its
        stream through a proxy (the network between the two); waits until
        it streams (synchronously when the pair is synchronous)."""
        if self.link is not None:
            self.link.close()
        self.link = FaultProxy(self.p.host, self.p.port, listen_host=self.s.host)
        shutil.rmtree(self.standby, ignore_errors=True)
        self.run(f"{self.bin}/pg_basebackup", "-h", self.p.host, "-p", str(self.p.port), "-U",
                 "postgres", "-D", str(self.standby), "-R", "-X", "stream", "-c", "fast", timeout=300)
        with open(self.standby / "postgresql.auto.conf", "a") as f:
            f.write(f"primary_conninfo = 'host={self.s.host} port={self.link.port} user=postgres "
                    f"application_name=standby1'\n")
        self.ctl(self.s, "start", start=True)
        if self.synchronous and self.failovers:
            self.sql(self.p, "ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
            self.sql(self.p, "SELECT pg_reload_conf()")
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = self.sql(self.p, "SELECT sync_state FROM pg_stat_replication "
                                    "WHERE application_name = 'standby1'")
            if rows and rows[0][0] == want:
                return
            time.sleep(0.2)
        raise AssertionError(f"the standby is not streaming ({want})")

    @property
    def url(self):
        return self.url_of([(n.host, n.port) for n in self.nodes])

    @staticmethod
    def url_of(addresses):
        """The brokers' multi-host URL over `addresses` (host, port)."""
        hosts = ",".join(f"{h}:{p}" for h, p in addresses)
        return f"postgres://postgres@{hosts}/oncelog?target_session_attrs=read-write"

    @staticmethod
    def sql(node_or_port, query, db="postgres"):
        if isinstance(node_or_port, Node):
            host, port = node_or_port.host, node_or_port.port
        else:
            host, port = "127.0.0.1", node_or_port
        with psycopg.connect(f"postgres://postgres@{host}:{port}/{db}", autocommit=True) as c:
            cur = c.execute(query)
            return cur.fetchall() if cur.description else []

    def caught_up(self, timeout=30):
        """Waits until the standby replayed all the primary wrote."""
        lsn = self.sql(self.p, "SELECT pg_current_wal_lsn()::text")[0][0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.sql(self.s, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0][0]
            if done:
                return
            time.sleep(0.1)
        raise AssertionError("the standby did not catch up")

    def fail_over(self):
        """Kills the primary and promotes the standby."""
        self.kill_primary()
        self.promote()

    def kill_primary(self):
        self.ctl(self.p, "stop", "-m", "immediate")

    def promote(self):
        self.run(f"{self.bin}/pg_ctl", "-D", str(self.standby), "-w", "-t", "60", "promote")
        # The standby's copy of the primary's settings names itself as the
        # synchronous standby, which it cannot be: with no other standby
        # left, the new primary commits on its own until a new standby
        # streams (a failover manager such as Patroni does the same).
        self.sql(self.s, "ALTER SYSTEM SET synchronous_standby_names = ''")
        self.sql(self.s, "SELECT pg_reload_conf()")
        self.primary_i = 1 - self.primary_i
        self.failovers += 1

    def restart_primary(self):
        self.ctl(self.p, "restart", "-m", "fast", start=True)

    def stop(self):
        if self.link is not None:
            self.link.close()
        for n in self.nodes:
            if (n.data / "postmaster.pid").exists():
                self.ctl(n, "stop", "-m", "immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
