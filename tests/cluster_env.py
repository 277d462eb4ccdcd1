"""Cluster mode's test harness: PostgreSQL and s3proxy (from the run's
environment, or started here through scripts/services.sh), a fresh database
per cluster, and N `oncelog serve --cluster` brokers over it."""

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest

from conftest import REPO_ROOT, Broker, free_port, oncelog_bin

SERVICES = REPO_ROOT / "scripts" / "services.sh"


def services_env(own=False):
    """ONCELOG_TEST_* from test.sh's run, or (always, with own) from
    services started now (stopped and removed by the returned callback).
    Their directory is a new one in the system's temp dir: PostgreSQL runs
    as its own user, who cannot enter pytest's temp dirs (0700)."""
    if not own and os.environ.get("ONCELOG_TEST_PG") and os.environ.get("ONCELOG_TEST_S3_ENDPOINT"):
        return dict(os.environ), lambda: None
    where = tempfile.mkdtemp(prefix="oncelog-services.")
    try:
        out = subprocess.run(["bash", str(SERVICES), "start", where], check=True,
                             capture_output=True, text=True, timeout=120).stdout
    except subprocess.CalledProcessError as e:
        shutil.rmtree(where, ignore_errors=True)
        raise AssertionError(f"scripts/services.sh start failed:\n{e.stderr}") from None
    env = dict(os.environ)
    for line in out.splitlines():
        for part in line.removeprefix("export ").split():
            k, _, v = part.partition("=")
            env[k] = v

    def stop():
        subprocess.run(["bash", str(SERVICES), "stop", where], check=False, timeout=120)
        shutil.rmtree(where, ignore_errors=True)
    return env, stop


def fresh_database(env):
    admin = env["ONCELOG_TEST_PG"]
    name = f"c_{uuid.uuid4().hex}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return admin.rsplit("/", 1)[0] + "/" + name


def s3_store(env):
    return f"s3://{env['ONCELOG_TEST_S3_BUCKET']}/c-{uuid.uuid4().hex}"


def s3_broker_env(env):
    return {
        "AWS_ENDPOINT": env["ONCELOG_TEST_S3_ENDPOINT"],
        "AWS_ACCESS_KEY_ID": env["ONCELOG_TEST_S3_KEY"],
        "AWS_SECRET_ACCESS_KEY": env["ONCELOG_TEST_S3_SECRET"],
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


class Cluster:
    """N brokers (node ids 1..N) over one database and one object store.
    Answers the parts of `Broker`'s interface a test of either mode uses:
    the bootstrap list of all brokers, host/port of the first, the logs of
    all, and stop/start/kill of all."""

    mode = "cluster"

    def __init__(self, base_dir, env, db, store, n=3, overrides=None):
        self.db = db
        self.store = store
        self.env = env
        self.brokers = []
        # Every listener and metrics port distinct: they are all drawn before
        # any broker binds, so the kernel may hand one out twice.
        ports = set()

        def port():
            while (p := free_port()) in ports:
                pass
            ports.add(p)
            return p

        for i in range(1, n + 1):
            root = Path(base_dir) / f"cbroker{i}"
            opts = {"node.id": i, "cluster.postgres": db, "cluster.object.store": store,
                    "metrics.listen": f"127.0.0.1:{port()}"}
            opts.update(overrides or {})
            b = Broker(oncelog_bin(), root / "data", port(), root / "broker.log", opts)
            if store.startswith("s3://"):
                b.env.update(s3_broker_env(env))
            self.brokers.append(b)

    @property
    def bootstrap(self):
        return ",".join(b.bootstrap for b in self.brokers)

    def start(self):
        for b in self.brokers:
            if not b.alive:
                b.start()
        return self

    def by_id(self, node_id):
        return self.brokers[node_id - 1]

    @property
    def host(self):
        return self.brokers[0].host

    @property
    def port(self):
        return self.brokers[0].port

    @property
    def address(self):
        return (self.host, self.port)

    @property
    def alive(self):
        return all(b.alive for b in self.brokers)

    def stop(self):
        for b in self.brokers:
            if b.alive:
                b.stop()

    def kill9(self):
        for b in self.brokers:
            b.kill9()

    def restart(self):
        self.stop()
        return self.start()

    @property
    def metrics_url(self):
        """The first broker's HTTP listener: its admin endpoints answer for
        the whole cluster (its /metrics for that broker only)."""
        return self.brokers[0].metrics_url

    def stored_logs(self, topic, partition):
        """The partition's batches as stored (in objects), as the brokers
        serve them: read_uncommitted, markers included, base offsets set."""
        import kafka_wire as kw
        return [kw.fetch_raw(self.host, self.port, topic, partition)]

    def log_text(self, since_last_start=False):
        return "\n".join(b.log_text(since_last_start) for b in self.brokers)

    def log_tail(self, lines=60):
        return "\n".join(f"-- broker {i + 1}\n{b.log_tail(lines)}"
                         for i, b in enumerate(self.brokers))

    def sql(self, query, *args):
        with psycopg.connect(self.db, autocommit=True) as c:
            return c.execute(query, args).fetchall()

    def cleanup(self):
        for b in self.brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.kill9()
        for b in self.brokers:
            if b.starts:
                print(f"---- {b} log tail ----\n{b.log_tail(30)}")


@pytest.fixture(scope="session")
def cluster_services():
    env, stop = services_env()
    yield env
    stop()


@pytest.fixture
def private_cluster_services():
    """PostgreSQL and an S3 server of this test's own, for a test that
    restarts or stops them: the shared ones serve every other test running
    beside it."""
    env, stop = services_env(own=True)
    yield env
    stop()


@pytest.fixture
def cluster_factory(tmp_path, cluster_services):
    made = []

    def make(store="s3", n=3, overrides=None, start=True):
        url = s3_store(cluster_services) if store == "s3" else \
            f"file://{tmp_path / f'objects{len(made)}'}"
        c = Cluster(tmp_path / f"cluster{len(made)}", cluster_services,
                    fresh_database(cluster_services), url, n, overrides)
        made.append(c)
        return c.start() if start else c

    yield make
    for c in made:
        c.cleanup()
