"""What the JVM-based tests share: jars fetched with Maven into a .tools
directory (test.sh fetches them; this fetches them too when missing),
sources compiled with javac, and the Apache Kafka reference broker
(bench/kafka_ref.py) for differential tests."""

import shutil
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import REPO_ROOT, wait_until

sys.path.insert(0, str(REPO_ROOT / "bench"))
import kafka_ref  # noqa: E402


def compile_against(tmp_path_factory, src_dir, lib_dir, jar_prefix, name):
    """Fetches the jars of `src_dir`/pom.xml into `lib_dir` if no jar there
    starts with `jar_prefix` (e.g. "kafka-clients-4."), compiles every
    .java file of `src_dir` with -Werror, and returns the classpath."""
    def jars():
        return sorted(lib_dir.glob("*.jar")) if lib_dir.is_dir() else []

    for tool in ("java", "javac"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found on PATH", pytrace=False)
    if not any(j.name.startswith(jar_prefix) for j in jars()):
        if shutil.which("mvn") is None:
            pytest.fail(f"no {jar_prefix}* jar in {lib_dir} and no mvn to fetch it", pytrace=False)
        proc = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(src_dir / "pom.xml"), "dependency:copy-dependencies"],
            capture_output=True, timeout=600)
        assert proc.returncode == 0, f"mvn failed:\n{proc.stdout.decode()[-3000:]}{proc.stderr.decode()[-3000:]}"
    found = jars()
    assert any(j.name.startswith(jar_prefix) for j in found), found
    classes = tmp_path_factory.mktemp(name)
    cp = ":".join(str(j) for j in found)
    proc = subprocess.run(["javac", "-Xlint:all", "-Werror", "-d", str(classes), "-cp", cp]
                          + [str(p) for p in sorted(src_dir.glob("*.java"))],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, f"javac failed:\n{proc.stdout.decode()}{proc.stderr.decode()}"
    return f"{classes}:{cp}"


def kafka_reference(tmp_path_factory, heap):
    """A started single-node Apache Kafka 4.x with one partition per internal
    topic and no initial rebalance delay; the caller stops it."""
    why = kafka_ref.unavailable()
    if why:
        pytest.fail(f"Apache Kafka reference broker unavailable: {why}", pytrace=False)
    k = kafka_ref.KafkaBroker(str(tmp_path_factory.mktemp("kafka")), heap=heap,
                              configs={"transaction.state.log.num.partitions": "1",
                                       "offsets.topic.num.partitions": "1",
                                       "group.initial.rebalance.delay.ms": "0"})
    k.start()
    return k


def create_topic_with_leaders(bootstrap, topic, partitions):
    """Creates `topic` and waits until every partition has a leader (Kafka
    takes a moment after CreateTopics answers)."""
    a = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    a.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(60)

    def ready():
        md = a.list_topics(topic, timeout=10).topics.get(topic)
        return md is not None and md.error is None and len(md.partitions) == partitions \
            and all(p.leader >= 0 for p in md.partitions.values())
    wait_until(ready, 60, interval=0.2, what=f"topic {topic}")
