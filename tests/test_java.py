"""The Apache Kafka Java client (kafka-clients 4.x) against the broker.

The client jars are fetched by test.sh into .tools/java-lib with
`mvn -f tests/java/pom.xml dependency:copy-dependencies`; this module runs the
same command if they are missing, then compiles JavaClientCheck.java with javac.
"""

import shutil
import subprocess

import pytest

from clients import consume_confluent, create_topic, unique_topic
from conftest import REPO_ROOT

JAVA_DIR = REPO_ROOT / "tests" / "java"
LIB_DIR = REPO_ROOT / ".tools" / "java-lib"


def _jars():
    return sorted(LIB_DIR.glob("*.jar")) if LIB_DIR.is_dir() else []


@pytest.fixture(scope="module")
def java_classpath(tmp_path_factory):
    for tool in ("java", "javac"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found on PATH", pytrace=False)
    if not any(j.name.startswith("kafka-clients-") for j in _jars()):
        if shutil.which("mvn") is None:
            pytest.fail(f"no kafka-clients jar in {LIB_DIR} and no mvn to fetch it", pytrace=False)
        proc = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(JAVA_DIR / "pom.xml"), "dependency:copy-dependencies"],
            capture_output=True, timeout=600)
        assert proc.returncode == 0, f"mvn failed:\n{proc.stdout.decode()[-3000:]}{proc.stderr.decode()[-3000:]}"
    jars = _jars()
    assert any(j.name.startswith("kafka-clients-4.") for j in jars), jars
    classes = tmp_path_factory.mktemp("java-classes")
    cp = ":".join(str(j) for j in jars)
    proc = subprocess.run(["javac", "-Xlint:all", "-Werror", "-d", str(classes), "-cp", cp]
                          + [str(p) for p in sorted(JAVA_DIR.glob("*.java"))],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, f"javac failed:\n{proc.stdout.decode()}{proc.stderr.decode()}"
    return f"{classes}:{cp}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("compression,partitions,n", [
    ("none", 3, 20000),
    ("gzip", 2, 3000),
    ("snappy", 2, 3000),
    ("lz4", 2, 3000),
    ("zstd", 2, 3000),
])
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
