"""kcat (librdkafka's command-line client, Debian's build) against the broker."""

import json
import os
import shutil
import subprocess
import time

import pytest

from clients import create_topic, unique_topic

KCAT = shutil.which("kcat")


@pytest.fixture(autouse=True)
def need_kcat():
    if KCAT is None:
        msg = "kcat not found on PATH (test.sh installs the Debian package `kcat`)"
        if os.environ.get("CI"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)


def kcat(*args, stdin=None, timeout=60):
    proc = subprocess.run([KCAT, *args], input=stdin, capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"kcat {' '.join(args)} exited {proc.returncode}\nstdout: "
                    f"{proc.stdout[-2000:]!r}\nstderr: {proc.stderr[-2000:]!r}")
    return proc.stdout.decode()


@pytest.mark.timeout(120)
def test_kcat_metadata_lists_broker_and_topic(broker):
    topic = unique_topic("kcat-md")
    create_topic(broker.bootstrap, topic, partitions=3)

    text = kcat("-b", broker.bootstrap, "-L")
    assert f"broker 0 at 127.0.0.1:{broker.port}" in text, text
    assert f'topic "{topic}" with 3 partitions' in text, text

    md = json.loads(kcat("-b", broker.bootstrap, "-L", "-J", "-t", topic))
    assert [(b["id"], b["name"]) for b in md["brokers"]] == [(0, f"127.0.0.1:{broker.port}")], md
    [t] = md["topics"]
    assert t["topic"] == topic and "error" not in t, t
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2]
    assert all(p["leader"] == 0 for p in t["partitions"]), t


@pytest.mark.timeout(120)
def test_kcat_produce_then_consume(broker):
    topic = unique_topic("kcat")
    create_topic(broker.bootstrap, topic, partitions=3)
    n = 1000
    lines = "".join(f"k{i}:line {i} {'x' * (i % 50)}\n" for i in range(n))
    before_ms = int(time.time() * 1000)
    kcat("-P", "-b", broker.bootstrap, "-t", topic, "-p", "1", "-K", ":",
         "-X", "acks=all", "-X", "enable.idempotence=false", stdin=lines.encode())

    out = kcat("-C", "-b", broker.bootstrap, "-t", topic, "-p", "1", "-o", "beginning",
               "-e", "-q", "-f", "%o\t%k\t%s\n")
    got = [line.split("\t") for line in out.splitlines()]
    want = [[str(i), f"k{i}", f"line {i} {'x' * (i % 50)}"] for i in range(n)]
    assert got == want

    # The other partitions stay empty; reading from a given offset works.
    for p in (0, 2):
        assert kcat("-C", "-b", broker.bootstrap, "-t", topic, "-p", str(p), "-o", "beginning",
                    "-e", "-q", "-f", "%o\n") == ""
    tail = kcat("-C", "-b", broker.bootstrap, "-t", topic, "-p", "1", "-o", "990",
                "-e", "-q", "-f", "%o\n")
    assert tail.split() == [str(i) for i in range(990, n)]

    # Offsets by timestamp: before everything -> 0; after everything -> end (-1).
    q = kcat("-Q", "-b", broker.bootstrap, "-t", f"{topic}:1:{before_ms - 60000}")
    assert f"{topic} [1] offset 0" in q, q
    q = kcat("-Q", "-b", broker.bootstrap, "-t", f"{topic}:1:{int(time.time() * 1000) + 3600000}")
    assert f"{topic} [1] offset -1" in q, q
