"""The Apache Kafka Java client (kafka-clients 4.x) against the broker.

The client jars are fetched by test.sh into .tools/java-lib with
`mvn -f tests/java/pom.xml dependency:copy-dependencies`; this module runs the
same command if they are missing, then compiles JavaClientCheck.java with javac.
"""

import subprocess

import pytest

from clients import consume_confluent, create_topic, unique_topic
from conftest import both_modes, REPO_ROOT
from jvm import compile_against

JAVA_DIR = REPO_ROOT / "tests" / "java"
LIB_DIR = REPO_ROOT / ".tools" / "java-lib"


@pytest.fixture(scope="module")
def java_classpath(tmp_path_factory):
    return compile_against(tmp_path_factory, JAVA_DIR, LIB_DIR, "kafka-clients-4.", "java-classes")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("compression,partitions,n", [
    ("none", 3, 20000),
    ("gzip", 2, 3000),
    ("snappy", 2, 3000),
    ("lz4", 2, 3000),
    ("zstd", 2, 3000),
])
@both_modes()
def test_java_client_produce_and_consume(broker, java_classpath, compression, partitions, n):
    topic = unique_topic(f"java-{compression}")
    create_topic(broker.bootstrap, topic, partitions=partitions)
    proc = subprocess.run(
        ["java", "-Xmx512m", "-cp", java_classpath, "JavaClientCheck",
         broker.bootstrap, topic, str(partitions), str(n), compression],
        capture_output=True, timeout=240)
    out = proc.stdout.decode()
    err = proc.stderr.decode()
    result = [line for line in out.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and result and result[-1].startswith("RESULT ok"), \
        f"java exited {proc.returncode}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
    assert result[-1] == f"RESULT ok produced={n} consumed={n} compression={compression}"

    # What the Java client wrote is also what librdkafka reads.
    got = consume_confluent(broker.bootstrap, topic, list(range(partitions)))
    assert sum(len(v) for v in got.values()) == n
    for p, recs in got.items():
        for r in recs:
            i = int(r.key.decode().removeprefix("jkey-"))
            assert i % partitions == p and r.headers == [("seq", f"h-{i}".encode())], r
            assert r.value.startswith(f"java-value-{i};".encode()), r


@pytest.mark.timeout(300)
@both_modes()
def test_java_client_transactions_and_fencing(broker, java_classpath):
    """The Java client (idempotence on by default) commits and aborts
    transactions across partitions, and a zombie with the same transactional
    id is fenced by a newer instance; read_committed sees only the committed."""
    topic = unique_topic("java-txn")
    create_topic(broker.bootstrap, topic, partitions=3)
    proc = subprocess.run(
        ["java", "-Xmx512m", "-cp", java_classpath, "JavaTxnCheck",
         broker.bootstrap, topic, "3", "java-txn-" + topic],
        capture_output=True, timeout=240)
    out = proc.stdout.decode()
    err = proc.stderr.decode()
    result = [line for line in out.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and result and result[-1].startswith("RESULT ok"), \
        f"java exited {proc.returncode}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
    assert "committed=101 all=202" in result[-1], result[-1]
