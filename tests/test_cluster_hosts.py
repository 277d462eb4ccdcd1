"""Cluster mode between hosts: brokers, PostgreSQL, the S3 server and the
clients each on their own loopback address (brokers and clients with their
own uid) in a private network namespace, PostgreSQL 2 ms and the S3 server
20 ms away, links cut by nftables rules (tests/hosts.py). Needs root, which
CI has."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hosts
from conftest import REPO_ROOT, oncelog_bin

pytestmark = pytest.mark.skipif(hosts.missing() is not None, reason=str(hosts.missing()))

MIXED = ("pg-partition", "pg-failover", "clock-jump", "client-partition", "broker-kill",
         "store-partition", "pg-partition-oneway", "broker-pause")


def namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("oncelog-")}


def test_exactly_once_copier_audit_between_hosts_under_a_mixed_schedule(tmp_path):
    """`oncelog audit --workload copier` against three brokers on hosts of
    their own while one fault after another hits one broker: cut off from
    PostgreSQL both ways and one way, from the S3 server and from its
    clients (nftables rules on its uid: connections open before the cut are
    cut too), its wall clock stepped minutes forward or back, kill -9 and a
    pause past its lease; and PostgreSQL failed over to its synchronous
    standby (a new standby built after). Every input record is copied exactly once, no
    aborted or torn transaction is read, no offset is issued twice, and the
    namespace and its rules are gone afterwards."""
    before = namespaces()
    report = tmp_path / "report.json"
    cmd = [sys.executable, str(REPO_ROOT / "tests" / "cluster_audit.py"), "--netns",
           "--pg-delay-ms", "2", "--s3-delay-ms", "20", "--workload", "copier",
           "--duration", "75", "--seed", "11", "--faults", ",".join(MIXED),
           "--report", str(report), "--", "--records", "6000", "--quiet-ms", "2500,4500"]
    env = {"ONCELOG_BIN": str(oncelog_bin())}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400,
                          env={**__import__("os").environ, **env})
    out = proc.stdout + proc.stderr
    tail = out[-4000:]
    assert proc.returncode == 0, tail
    assert re.search(r"hosts: running in network namespace oncelog-\d+-\d+", out), tail
    m = re.search(r"cluster faults injected: \d+ \(([^)]*)\)", out)
    assert m and set(m.group(1).split(", ")) == set(MIXED), tail
    assert re.search(r"broker \d's clock [+-]\d+ s", out), tail
    assert "PostgreSQL failed over to 127.0.0.21:" in out, tail
    data = json.loads(report.read_text())
    assert data["plain_writes"] == 6000 and data["txns_committed"] >= 40, data
    assert all(v == 0 for v in data["anomalies"].values()), data["anomalies"]
    assert namespaces() <= before, "the run's namespace was left behind"
    # the brokers' logs say nothing went back (a false alarm of the
    # next-offset check under PostgreSQL's latency was found here once)
    assert "a partition went back" not in out, tail
