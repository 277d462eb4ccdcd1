"""Cluster mode against a PostgreSQL that requires TLS, as managed services
do (issue #34, point 5): a server of this module's own with `ssl=on` and a
pg_hba.conf that admits TLS connections only, its certificate from a
throwaway CA and naming `localhost` (not 127.0.0.1).

* A broker over `sslmode=verify-full` registers, takes a transaction and
  serves it read_committed (the pool and the LISTEN connection both over
  TLS: the server admits nothing else), and `oncelog cluster info` reads
  the cluster through the same URL.
* The server's certificate is checked as libpq would: a CA that did not sign
  it, or a host the certificate does not name, is refused with rustls's
  reason, by `cluster info` and by a broker's start; `verify-ca` takes the
  unnamed address, `require` without a root takes any certificate, and
  `disable` is turned away by the server.
"""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer

from clients import create_topic, read_all, unique_topic
from cluster_env import Cluster
from conftest import free_port, oncelog_bin
from pki import make_ca, make_cert

pytestmark = pytest.mark.timeout(240)

DB = "oncelog_tls"


def pg_bin():
    if os.environ.get("ONCELOG_TEST_PG_BIN"):
        return Path(os.environ["ONCELOG_TEST_PG_BIN"])
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    assert found, "no PostgreSQL server (apt-get install postgresql)"
    return found[-1]


def as_pg(cmd):
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def tls_pg():
    """(port, pki dir) of a PostgreSQL that takes TLS connections only."""
    where = Path(tempfile.mkdtemp(prefix="oncelog-pgtls."))
    os.chmod(where, 0o755)
    pki = where / "pki"
    pki.mkdir()
    make_ca(pki, "ca")
    make_ca(pki, "stranger-ca")
    make_cert(pki, "server", "ca", "/CN=localhost", san="DNS:localhost")
    os.chmod(pki / "server.key", 0o600)
    if os.geteuid() == 0:
        shutil.chown(where, "postgres")
        for p in pki.iterdir():
            shutil.chown(p, "postgres")
        shutil.chown(pki, "postgres")
    data = where / "pg"
    subprocess.run(as_pg([str(pg_bin() / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                          "--no-sync"]), check=True, capture_output=True, timeout=120)
    (data / "pg_hba.conf").write_text("local all all trust\nhostssl all all 127.0.0.1/32 trust\n")
    port = free_port()
    opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c ssl=on "
            f"-c ssl_cert_file={pki / 'server.pem'} -c ssl_key_file={pki / 'server.key'} "
            f"-c max_connections=100 -c fsync=off")
    subprocess.run(as_pg([str(pg_bin() / "pg_ctl"), "-D", str(data), "-l", str(where / "pg.log"),
                          "-w", "-t", "60", "-o", opts, "start"]),
                   check=True, capture_output=True, timeout=120)
    try:
        with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres sslmode=require",
                             autocommit=True) as c:
            c.execute(f"CREATE DATABASE {DB}")
        yield port, pki
    finally:
        subprocess.run(as_pg([str(pg_bin() / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       check=False, capture_output=True, timeout=120)
        shutil.rmtree(where, ignore_errors=True)


def url(port, pki, mode, host="localhost", root="ca"):
    u = f"postgres://postgres@{host}:{port}/{DB}?hostaddr=127.0.0.1&sslmode={mode}"
    return u + (f"&sslrootcert={pki / (root + '.pem')}" if root else "")


def cluster_info(pg_url, *more):
    return subprocess.run([str(oncelog_bin()), "cluster", "info", "--postgres", pg_url, *more],
                          capture_output=True, text=True, timeout=60)


def test_a_broker_over_verify_full(tls_pg, tmp_path):
    port, pki = tls_pg
    pg_url = url(port, pki, "verify-full")
    c = Cluster(tmp_path / "c", {}, pg_url, f"file://{tmp_path / 'objects'}", n=1).start()
    try:
        topic = unique_topic("pgtls")
        create_topic(c.bootstrap, topic, partitions=1)
        p = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": "pgtls-tx"})
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(5):
            p.produce(topic, f"v{i}".encode(), partition=0)
        p.commit_transaction(30)
        got = read_all(c.bootstrap, topic, until=5)
        assert got == [f"v{i}".encode() for i in range(5)]
        # Every connection of the broker's is a TLS one (the server admits no other).
        with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname={DB} sslmode=require") as pc:
            plain, tls = pc.execute(
                "SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl) "
                "FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                "WHERE a.datname = %s AND a.pid <> pg_backend_pid()", (DB,)).fetchone()
        assert plain == 0 and tls >= 2, (plain, tls)
        info = cluster_info(pg_url, "--json")
        assert info.returncode == 0, info.stderr
        got = json.loads(info.stdout)
        assert [b["id"] for b in got["brokers"]] == [1] and got["topics"] == 1, got
        assert got["open_transactions"] == 0 and got["offsets"] == 6, got  # 5 records and a marker
    finally:
        c.cleanup()


@pytest.mark.parametrize("mode,host,root,refusal", [
    ("verify-full", "localhost", "stranger-ca", "UnknownIssuer"),
    ("verify-ca", "localhost", "stranger-ca", "UnknownIssuer"),
    ("verify-full", "127.0.0.1", "ca", "certificate not valid for name \"127.0.0.1\""),
    ("verify-full", "localhost", None, "needs sslrootcert"),
    ("disable", "localhost", None, "no encryption"),
    ("verify-ca", "127.0.0.1", "ca", None),
    ("require", "127.0.0.1", None, None),
    ("prefer", "localhost", None, None),
])
def test_the_servers_certificate_is_checked_as_libpq_does(tls_pg, mode, host, root, refusal):
    port, pki = tls_pg
    out = cluster_info(url(port, pki, mode, host, root))
    said = out.stdout + out.stderr
    if refusal is None:
        # Connected: the database has no cluster yet, or has the one the other test made.
        assert out.returncode == 0 or "not an oncelog cluster's database" in said, said
    else:
        assert out.returncode != 0 and refusal in said, said


def test_a_broker_refuses_to_start_on_a_certificate_it_cannot_trust(tls_pg, tmp_path):
    port, pki = tls_pg
    proc = subprocess.run(
        [str(oncelog_bin()), "serve", "--data-dir", str(tmp_path / "data"), "--listen",
         f"127.0.0.1:{free_port()}", "-o", f"metrics.listen=127.0.0.1:{free_port()}", "-o", "node.id=7",
         "--cluster", url(port, pki, "verify-full", root="stranger-ca"),
         "--object-store", f"file://{tmp_path / 'objects'}"],
        capture_output=True, text=True, timeout=90)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "UnknownIssuer" in said, said
