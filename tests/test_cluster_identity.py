"""A cluster-mode broker cannot join the wrong cluster or take a live
broker's place (issue #34, point 3).

* `node.id` is unique among live brokers: a second broker given a live
  broker's id refuses to start and names it, and the first goes on with
  its session; a broker killed -9 is restarted with its id (its row is taken
  over once nobody renews the lease); a clean stop frees the id at once.
* Without `node.id` a broker is assigned one the cluster never used.
* A broker paused past its lease whose id was taken meanwhile stops when it
  wakes instead of taking the id back (two brokers with one id used to
  steal each other's session every few seconds).
* The object store is bound to its cluster: a broker given another store
  (an empty directory, or another cluster's) refuses to start.
* A port in use stops a broker before it registers.
"""

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer

from clients import admin, create_topic, read_all
from cluster_env import Cluster, fresh_database
from conftest import Broker, free_port, oncelog_bin

pytestmark = pytest.mark.timeout(180)


def extra_broker(cl, base, node_id=None, store=None, **overrides):
    """A broker over `cl`'s database (and store, unless given), not started."""
    opts = {"cluster.postgres": cl.db, "cluster.object.store": store or cl.store,
            "metrics.listen": f"127.0.0.1:{free_port()}", **overrides}
    if node_id is not None:
        opts["node.id"] = node_id
    root = Path(base)
    return Broker(oncelog_bin(), root / "data", free_port(), root / "broker.log", opts)


def run_to_exit(b, timeout=60):
    """Starts `b`, expecting it to refuse: (exit status, its log)."""
    b._spawn()
    try:
        rc = b.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        b.kill9()
        raise AssertionError(f"the broker did not stop; log:\n{b.log_tail()}") from None
    return rc, b.log_text()


def produce_one(bootstrap, topic, value=b"x"):
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    p.produce(topic, value)
    assert p.flush(30) == 0


def test_a_live_brokers_node_id_is_refused(cluster_factory, tmp_path):
    cl = cluster_factory(store="file", n=1)
    session = cl.sql("SELECT session FROM brokers WHERE id = 1")[0][0]
    twin = extra_broker(cl, tmp_path / "twin", node_id=1)
    rc, log = run_to_exit(twin)
    assert rc != 0
    assert f"node.id 1 is held by a live broker at 127.0.0.1:{cl.by_id(1).port}" in log, log
    # the first broker kept its session and serves
    assert cl.sql("SELECT session FROM brokers WHERE id = 1")[0][0] == session
    create_topic(cl.bootstrap, "still-here", 1)
    produce_one(cl.bootstrap, "still-here")
    assert read_all(cl.bootstrap, "still-here") == [b"x"]


def test_a_killed_broker_restarts_with_its_id_and_a_stopped_one_at_once(cluster_factory):
    cl = cluster_factory(store="file", n=1, overrides={"cluster.lease.ms": 4000})
    b = cl.by_id(1)
    b.kill9()
    b.start(timeout=30)
    log = b.log_text(since_last_start=True)
    assert "taking over node.id 1 from the broker at" in log, log
    assert cl.sql("SELECT session FROM brokers WHERE id = 1")[0][0] == 2
    b.stop()
    started = time.monotonic()
    b.start()
    assert time.monotonic() - started < 10
    log = b.log_text(since_last_start=True)
    assert "watching whether" not in log, log
    assert cl.sql("SELECT session FROM brokers WHERE id = 1")[0][0] == 3


def test_brokers_without_a_node_id_are_assigned_new_ones(cluster_services, tmp_path):
    cl = Cluster(tmp_path / "c", cluster_services, fresh_database(cluster_services),
                 f"file://{tmp_path / 'objects'}", n=2, overrides={"node.id": ""})
    try:
        cl.start()
        rows = cl.sql("SELECT id FROM brokers WHERE lease_expires_at > clock_timestamp() ORDER BY id")
        assert [r[0] for r in rows] == [1, 2], rows
        md = admin(cl.bootstrap).list_topics(timeout=30)
        assert sorted(md.brokers) == [1, 2]
        for b in cl.brokers:
            assert "the cluster assigned this broker node.id" in b.log_text()
        # a restarted broker without node.id is a new node; the old id is not reused
        cl.brokers[0].stop()
        cl.brokers[0].start()
        ids = [r[0] for r in cl.sql(
            "SELECT id FROM brokers WHERE lease_expires_at > clock_timestamp() ORDER BY id")]
        assert ids == [2, 3], ids
    finally:
        cl.cleanup()


def test_a_broker_whose_id_was_taken_while_paused_stops(cluster_factory, tmp_path):
    cl = cluster_factory(store="file", n=1, overrides={"cluster.lease.ms": 1200})
    old = cl.by_id(1)
    os.kill(old.pid, signal.SIGSTOP)
    try:
        time.sleep(2.0)  # past the lease
        new = extra_broker(cl, tmp_path / "new", node_id=1, **{"cluster.lease.ms": 1200})
        new.start()
    finally:
        os.kill(old.pid, signal.SIGCONT)
    try:
        old.proc.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the replaced broker goes on; log:\n{old.log_tail()}") from None
    assert old.proc.returncode != 0
    assert f"node.id 1 was taken over by another broker at 127.0.0.1:{new.port}" in old.log_text()
    # the new one keeps the id and serves
    time.sleep(2.0)
    assert new.alive
    assert cl.sql("SELECT host || ':' || port FROM brokers WHERE id = 1")[0][0] == new.bootstrap
    create_topic(new.bootstrap, "after", 1)
    produce_one(new.bootstrap, "after")
    new.stop()


def test_a_broker_given_another_object_store_refuses_to_start(cluster_factory, tmp_path):
    cl = cluster_factory(store="file", n=1)
    create_topic(cl.bootstrap, "bound", 1)
    produce_one(cl.bootstrap, "bound")
    # an empty directory
    rc, log = run_to_exit(extra_broker(cl, tmp_path / "b2", node_id=2,
                                       store=f"file://{tmp_path / 'elsewhere'}"))
    assert rc != 0 and "has no marker of cluster" in log, log
    # another cluster's store
    other = cluster_factory(store="file", n=1)
    assert other.store != cl.store
    rc, log = run_to_exit(extra_broker(cl, tmp_path / "b3", node_id=3, store=other.store))
    assert rc != 0 and "belongs to cluster" in log, log
    assert [r[0] for r in cl.sql("SELECT id FROM brokers ORDER BY id")] == [1]
    # the right store is still taken
    ok = extra_broker(cl, tmp_path / "b4", node_id=4).start()
    produce_one(ok.bootstrap, "bound", b"y")
    assert read_all(cl.bootstrap, "bound") == [b"x", b"y"]
    ok.stop()


def test_a_port_in_use_stops_a_broker_before_it_registers(cluster_factory, tmp_path):
    cl = cluster_factory(store="file", n=1)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        port = holder.getsockname()[1]
        b = extra_broker(cl, tmp_path / "clash", node_id=9, **{"metrics.listen": f"127.0.0.1:{port}"})
        rc, log = run_to_exit(b)
        assert rc != 0 and f"address 127.0.0.1:{port} is already in use" in log, log
        assert cl.sql("SELECT count(*) FROM brokers WHERE id = 9")[0][0] == 0
    finally:
        holder.close()


class Diskless(Broker):
    """A broker started with the cluster recipe's flags alone: no --data-dir."""

    def argv(self):
        a = super().argv()
        i = a.index("--data-dir")
        return a[:i] + a[i + 2:]


def test_three_brokers_from_the_recipe_alone(cluster_services, tmp_path):
    """docs/cluster.md's recipe: `--cluster`, `--object-store`, `--listen`
    and `--metrics-listen`, nothing else (no data directory, no node.id):
    three brokers on one host start, are assigned ids, serve, and write
    nothing on local disk: not where they were started, not in the
    temporary directory, not even after kill -9."""
    db = fresh_database(cluster_services)
    store = f"file://{tmp_path / 'objects'}"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    brokers = []
    try:
        for i in range(3):
            root = tmp_path / f"b{i}"
            b = Diskless(oncelog_bin(), root / "cwd" / "unused", free_port(), root / "broker.log",
                         {"cluster.postgres": db, "cluster.object.store": store})
            b.env["TMPDIR"] = str(tmpdir)
            brokers.append(b.start())
        with psycopg.connect(db, autocommit=True) as c:
            ids = [r[0] for r in c.execute(
                "SELECT id FROM brokers WHERE lease_expires_at > clock_timestamp() ORDER BY id")]
        assert ids == [1, 2, 3]
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_topic(bootstrap, "recipe", 3)
        for b in brokers:
            produce_one(b.bootstrap, "recipe", b.bootstrap.encode())
        got = [v for p in range(3) for v in read_all(bootstrap, "recipe", partition=p)]
        assert sorted(got) == sorted(b.bootstrap.encode() for b in brokers)

        def nothing_on_local_disk():
            for b in brokers:
                assert "cluster mode: no data directory" in b.log_text(), b.log_tail()
                # the harness makes (and runs it beside) b.data_dir, which it does not get
                assert [p.name for p in b.data_dir.parent.iterdir()] == ["unused"]
                assert list(b.data_dir.iterdir()) == [], "the broker wrote where it was started"
            assert list(tmpdir.iterdir()) == [], "a broker wrote in the temporary directory"

        nothing_on_local_disk()
        brokers[0].stop()
        brokers[1].kill9()
        nothing_on_local_disk()
    finally:
        for b in brokers:
            b.kill9()
