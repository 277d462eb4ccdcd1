"""PostgreSQL unreachable is said once, with its address, not hundreds of
times a minute (issue #34, point 4): a broker whose PostgreSQL is stopped
for 20 s, while a producer and a consumer keep asking it, logs one line
naming the server, a reminder a minute, and one line when it is back; the
broker then serves again with nothing acknowledged lost."""

import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from clients import create_topic, read_all
from cluster_env import Cluster, fresh_database

pytestmark = pytest.mark.timeout(240)

WARN = re.compile(r"^\S+\s+(WARN|ERROR)\s", re.M)


def pg_ctl(env, *args):
    cmd = [f"{env['ONCELOG_TEST_PG_BIN']}/pg_ctl", "-D", env["ONCELOG_TEST_PG_DIR"], *args]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    subprocess.run(cmd,
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=90)


def test_an_outage_is_said_once_a_minute(private_cluster_services, tmp_path):
    env = private_cluster_services
    data = Path(env["ONCELOG_TEST_PG_DIR"])
    # the server's own options, to start it again as it was
    argv = shlex.split((data / "postmaster.opts").read_text())[1:]
    i = argv.index("-D")
    opts = " ".join(shlex.quote(a) for a in argv[:i] + argv[i + 2:])
    cl = Cluster(tmp_path / "c", env, fresh_database(env), f"file://{tmp_path / 'objects'}", n=1,
                 overrides={"cluster.lease.ms": 3000}).start()
    try:
        b = cl.by_id(1)
        create_topic(cl.bootstrap, "outage", 1)
        p = Producer({"bootstrap.servers": cl.bootstrap, "enable.idempotence": True,
                      "message.timeout.ms": 120000, "linger.ms": 5})
        p.produce("outage", b"before")
        assert p.flush(30) == 0
        before = len(b.log_text())
        pg_ctl(env, "-m", "fast", "-w", "stop")
        try:
            deadline = time.monotonic() + 20
            i = 0
            while time.monotonic() < deadline:
                p.produce("outage", f"during-{i}".encode())
                p.poll(0.5)
                i += 1
        finally:
            pg_ctl(env, "-l", str(data.parent / "pg.log"), "-w", "-t", "60", "-o", opts, "start")
        assert p.flush(90) == 0, "records sent during the outage were not acknowledged after it"
        time.sleep(3)  # a lease renewal after the restart
        said = b.log_text()[before:]
        warnings = WARN.findall(said)
        lines = [l for l in said.splitlines() if WARN.match(l)]
        assert sum("is unreachable" in l for l in lines) == 1, "\n".join(lines)
        assert "127.0.0.1:" in next(l for l in lines if "is unreachable" in l)
        assert len(warnings) <= 6, f"{len(warnings)} warnings in a 20 s outage:\n" + "\n".join(lines)
        assert "is reachable again after" in said, said[-3000:]
        got = read_all(cl.bootstrap, "outage")
        assert got[0] == b"before" and len(got) == 1 + i and len(set(got)) == len(got)
    finally:
        cl.cleanup()
