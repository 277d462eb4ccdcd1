"""Apache Kafka's own `kafka-transactions` tool (kafka-transactions.sh, class
org.apache.kafka.tools.TransactionsCommand from kafka-tools 4.x) run as an
operator would, against a real `oncelog serve`: list, describe,
describe-producers, find-hanging and abort, on a transaction a librdkafka
producer leaves open and on an orphan (a transaction open at a partition whose
coordinator state was lost).

The jars come from bench/kafka/pom.xml into .tools/kafka-lib (test.sh fetches
them); the module is skipped only when kafka-tools is not there.

What find-hanging reports, as in Kafka: an open transaction at a partition
(DescribeProducers) whose last write is older than --max-transaction-timeout
minutes, and which the coordinator does not describe as writing to that
partition. A transaction the coordinator tracks is never hanging (the
coordinator times it out itself), so it is tested on an orphan; the records are
written with a CreateTime five minutes in the past, which is what the
partition's LastTimestamp (the batch's max timestamp, as in Kafka) reports, so
the one-minute minimum of --max-transaction-timeout needs no waiting.
"""

import shutil
import subprocess
import time

import pytest
from confluent_kafka import KafkaException, Producer

from clients import (admin_committed, cli, create_topic, flush_all, group_conf, lso, producer_config,
                     read_partition, txn_producer, unique_topic)
from conftest import REPO_ROOT, both_modes

KAFKA_LIB = REPO_ROOT / ".tools" / "kafka-lib"
TOOL = "org.apache.kafka.tools.TransactionsCommand"
TOOL_TIMEOUT_S = 90

# kafka-tools-4.4.0.jar (not kafka-tools-api-*, which the broker brings)
if not sorted(KAFKA_LIB.glob("kafka-tools-[0-9]*.jar")):
    pytest.skip(f"no kafka-tools jar in {KAFKA_LIB}: fetch it with "
                "`mvn -q -B -f bench/kafka/pom.xml dependency:copy-dependencies` (test.sh does)",
                allow_module_level=True)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def tool(broker, tmp_path):
    """Run `kafka-transactions --bootstrap-server <broker> ARGS...`; returns
    the CompletedProcess. The admin client's own timeouts are kept below the
    subprocess timeout so that a broker that does not answer shows up as the
    tool's error message rather than as a killed JVM."""
    if shutil.which("java") is None:
        pytest.fail("java not found on PATH", pytrace=False)
    config = tmp_path / "admin.properties"
    config.write_text("default.api.timeout.ms=30000\nrequest.timeout.ms=10000\n")

    def run(*args, check=True):
        argv = ["java", "-Xmx256m", "-cp", f"{KAFKA_LIB}/*", TOOL,
                "--bootstrap-server", broker.bootstrap, "--command-config", str(config), *args]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
        if check:
            assert p.returncode == 0, (
                f"kafka-transactions {' '.join(args)} exited {p.returncode}\n"
                f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p
    return run


def rows(stdout):
    """The tool's table (a header line, then one line per row, columns padded
    and separated by tabs) as a list of {header: value}."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, f"no table in the tool's output: {stdout!r}"
    header = [c.strip() for c in lines[0].split("\t")]
    out = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("\t")]
        assert len(cells) == len(header), f"row {line!r} does not match header {header}"
        out.append(dict(zip(header, cells)))
    return out


def node_id(broker):
    info, _ = cli(broker, "cluster", "info")
    assert len(info["brokers"]) == 1, info
    return info["brokers"][0]["node_id"]


def test_list_describe_and_abort_an_open_transaction(broker, tool):
    """list / describe / describe-producers show the transaction a librdkafka
    producer left open; find-hanging does not report it (its coordinator
    tracks it); abort --start-offset ends it through the coordinator, the LSO
    moves to the high watermark, and read_committed readers skip it."""
    topic = unique_topic("kt-open")
    create_topic(broker.bootstrap, topic, partitions=2)
    txn_id = "kt-writer-" + topic
    p = txn_producer(broker.bootstrap, txn_id, **{"transaction.timeout.ms": 300000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=b"open-%d" % i, partition=0)
    p.flush(30)
    plain = Producer(producer_config(broker.bootstrap))
    for i in range(2):
        plain.produce(topic, value=b"plain-%d" % i, partition=0)
    flush_all(plain)
    assert lso(broker.bootstrap, topic, 0) == 0, "the open transaction pins the LSO"
    node = node_id(broker)

    listed = [r for r in rows(tool("list").stdout) if r["TransactionalId"] == txn_id]
    assert len(listed) == 1, listed
    assert listed[0]["TransactionState"] == "Ongoing" and listed[0]["Coordinator"] == str(node), listed
    pid = int(listed[0]["ProducerId"])
    pattern = rows(tool("list", "--transactional-id-pattern", "kt-writer-.*").stdout)
    assert [r["TransactionalId"] for r in pattern] == [txn_id]

    desc = rows(tool("describe", "--transactional-id", txn_id).stdout)
    assert len(desc) == 1, desc
    d = desc[0]
    assert d["TransactionState"] == "Ongoing", d
    assert d["TopicPartitions"] == f"{topic}-0", d
    assert (int(d["ProducerId"]), d["CoordinatorId"]) == (pid, str(node)), d
    assert d["TransactionTimeoutMs"] == "300000", d
    assert int(d["CurrentTransactionStartTimeMs"]) > 0 and int(d["TransactionDurationMs"]) >= 0, d
    epoch = int(d["ProducerEpoch"])

    producers = rows(tool("describe-producers", "--topic", topic, "--partition", "0").stdout)
    mine = [r for r in producers if int(r["ProducerId"]) == pid]
    assert len(mine) == 1, producers
    assert int(mine[0]["ProducerEpoch"]) == epoch, mine
    assert mine[0]["CurrentTransactionStartOffset"] == "0", mine
    assert mine[0]["LastSequence"] == "2", mine
    assert int(mine[0]["LastTimestamp"]) > 0, mine
    # Partition 1 has no producers at all.
    assert rows(tool("describe-producers", "--topic", topic, "--partition", "1").stdout) == []
    # Not hanging: the coordinator says this transaction writes to topic-0.
    hanging = rows(tool("find-hanging", "--broker-id", str(node), "--max-transaction-timeout", "0").stdout)
    assert hanging == [], hanging

    no_such = tool("describe", "--transactional-id", "no-such-" + topic, check=False)
    assert no_such.returncode == 1 and "could not be found" in no_such.stderr, no_such.stderr

    tool("abort", "--topic", topic, "--partition", "0", "--start-offset", "0")

    # 3 records + 2 plain records + the ABORT marker.
    assert lso(broker.bootstrap, topic, 0) == 6, "the LSO moves to the high watermark"
    got = read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 6)
    assert [v for _, v in got] == [b"plain-0", b"plain-1"]
    raw = read_partition(broker.bootstrap, topic, 0, 0, "read_uncommitted", 6)
    assert [v for _, v in raw] == [b"open-0", b"open-1", b"open-2", b"plain-0", b"plain-1"]
    after = rows(tool("describe", "--transactional-id", txn_id).stdout)[0]
    assert after["TransactionState"] == "CompleteAbort", after
    assert int(after["ProducerEpoch"]) == epoch + 1, "the abort fenced the producer"
    assert after["CurrentTransactionStartTimeMs"] == "None" and after["TopicPartitions"] == "", after
    producers = rows(tool("describe-producers", "--topic", topic, "--partition", "0").stdout)
    assert [r["CurrentTransactionStartOffset"] for r in producers if int(r["ProducerId"]) == pid] == ["None"]
    missing = tool("abort", "--topic", topic, "--partition", "0", "--start-offset", "0", check=False)
    assert missing.returncode == 1 and "Could not find any open transactions" in missing.stderr, missing.stderr
    assert "aborted by an administrator" in broker.log_text()
    with pytest.raises(KafkaException):
        p.commit_transaction(10)


def test_find_hanging_and_abort_an_orphaned_transaction(broker, tool):
    """An orphan (open at its partition, its coordinator state lost) whose
    last write is five minutes old is what find-hanging reports, by broker id
    and by topic/partition, and only past --max-transaction-timeout; a
    transaction the coordinator tracks, as old, is not reported. abort
    --start-offset writes the ABORT marker at the partition and readers
    resume."""
    topic = unique_topic("kt-orphan")
    create_topic(broker.bootstrap, topic, partitions=2)
    five_min_ago = int(time.time() * 1000) - 5 * 60_000
    lost = txn_producer(broker.bootstrap, "kt-lost-" + topic)
    lost.init_transactions(30)
    lost.begin_transaction()
    for i in range(2):
        lost.produce(topic, value=b"orphan-%d" % i, partition=0, timestamp=five_min_ago)
    lost.flush(30)
    broker.stop()
    shutil.rmtree(broker.data_dir / "internal" / "__transaction_state-0")
    broker.start()
    plain = Producer(producer_config(broker.bootstrap))
    plain.produce(topic, value=b"after", partition=0)
    flush_all(plain)
    assert lso(broker.bootstrap, topic, 0) == 0, "the orphan pins the LSO"
    # A transaction its coordinator tracks, its last write as old.
    live = txn_producer(broker.bootstrap, "kt-live-" + topic, **{"transaction.timeout.ms": 300000})
    live.init_transactions(30)
    live.begin_transaction()
    live.produce(topic, value=b"live", partition=1, timestamp=five_min_ago)
    live.flush(30)
    node = node_id(broker)

    producers = rows(tool("describe-producers", "--topic", topic, "--partition", "0").stdout)
    open_ = [r for r in producers if r["CurrentTransactionStartOffset"] != "None"]
    assert len(open_) == 1 and open_[0]["CurrentTransactionStartOffset"] == "0", producers
    assert int(open_[0]["LastTimestamp"]) == five_min_ago, open_
    orphan_pid = open_[0]["ProducerId"]
    assert "kt-lost-" + topic not in {r["TransactionalId"] for r in rows(tool("list").stdout)}

    for scope in (["--broker-id", str(node)], ["--topic", topic], ["--topic", topic, "--partition", "0"]):
        hanging = rows(tool("find-hanging", *scope, "--max-transaction-timeout", "1").stdout)
        assert [(h["Topic"], h["Partition"], h["ProducerId"], h["StartOffset"]) for h in hanging] == [
            (topic, "0", orphan_pid, "0")], (scope, hanging)
        assert hanging[0]["LastTimestamp"] == str(five_min_ago), hanging
        assert int(hanging[0]["Duration(min)"]) >= 5, hanging
    # Not past the default --max-transaction-timeout of 15 minutes.
    assert rows(tool("find-hanging", "--broker-id", str(node)).stdout) == []

    tool("abort", "--topic", topic, "--partition", "0", "--start-offset", "0")

    # 2 orphan records + 1 plain record + the ABORT marker.
    assert lso(broker.bootstrap, topic, 0) == 4, "the LSO moves to the high watermark"
    got = read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 4)
    assert [v for _, v in got] == [b"after"]
    assert rows(tool("find-hanging", "--broker-id", str(node), "--max-transaction-timeout", "1").stdout) == []
    producers = rows(tool("describe-producers", "--topic", topic, "--partition", "0").stdout)
    assert all(r["CurrentTransactionStartOffset"] == "None" for r in producers), producers
    assert "orphaned transaction" in broker.log_text()
    # The tracked transaction was left alone.
    assert lso(broker.bootstrap, topic, 1) == 0
    live.abort_transaction(30)
    assert lso(broker.bootstrap, topic, 1) == 2


def test_force_terminate_transaction(broker, tool):
    """forceTerminateTransaction (KIP-939; an InitProducerId from the admin
    client) aborts the open transaction of a transactional id and fences its
    producer."""
    topic = unique_topic("kt-force")
    create_topic(broker.bootstrap, topic)
    txn_id = "kt-force-" + topic
    p = txn_producer(broker.bootstrap, txn_id, **{"transaction.timeout.ms": 300000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"doomed", partition=0)
    p.flush(30)
    before = rows(tool("describe", "--transactional-id", txn_id).stdout)[0]
    assert before["TransactionState"] == "Ongoing", before

    tool("forceTerminateTransaction", "--transactionalId", txn_id)

    after = rows(tool("describe", "--transactional-id", txn_id).stdout)[0]
    assert after["TransactionState"] == "CompleteAbort", after
    assert (after["ProducerId"], int(after["ProducerEpoch"])) == (before["ProducerId"], int(before["ProducerEpoch"]) + 1)
    assert lso(broker.bootstrap, topic, 0) == 2
    assert read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 2) == []
    with pytest.raises(KafkaException):
        p.commit_transaction(10)


@both_modes()
def test_kafka_consumer_groups_delete_offsets(broker, tmp_path):
    """Kafka's own `kafka-consumer-groups --delete-offsets` (OffsetDelete
    through the Java admin client): one partition's committed offset goes,
    the other stays, and the tool reports a group that does not exist."""
    from confluent_kafka import Consumer, TopicPartition
    bs = broker.bootstrap
    topic = unique_topic("kt-odel")
    create_topic(bs, topic, partitions=2)
    group = "kt-odel-" + topic
    c = Consumer(group_conf(bs, group))
    c.commit(offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 4)], asynchronous=False)
    c.close()
    config = tmp_path / "admin.properties"
    config.write_text("default.api.timeout.ms=30000\nrequest.timeout.ms=10000\n")

    def groups_tool(*args):
        return subprocess.run(["java", "-Xmx256m", "-cp", f"{KAFKA_LIB}/*",
                               "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                               "--bootstrap-server", bs, "--command-config", str(config), *args],
                              capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)

    p = groups_tool("--delete-offsets", "--group", group, "--topic", f"{topic}:0")
    assert p.returncode == 0, (p.stdout, p.stderr)
    lines = [line.split() for line in p.stdout.splitlines() if line.startswith(topic)]
    assert lines == [[topic, "0", "Successful"]], p.stdout
    assert admin_committed(bs, group, topic, [0, 1]) == {1: 4}

    p = groups_tool("--delete-offsets", "--group", "never-" + group, "--topic", topic)
    assert "does not exist" in p.stdout + p.stderr, (p.stdout, p.stderr)


@both_modes()
def test_kafka_configs_describes_and_alters_a_topic_and_describes_the_broker(broker, tmp_path):
    """Kafka's own `kafka-configs` (DescribeConfigs and IncrementalAlterConfigs
    through the Java admin client): a topic's configs given at creation are
    its own, the rest are the broker's defaults; --alter adds and deletes
    them; the broker's settings are answered for its id; the tool says a
    topic that does not exist does not."""
    from clients import admin
    from confluent_kafka.admin import NewTopic
    bs = broker.bootstrap
    topic = unique_topic("kt-configs")
    a = admin(bs)
    fs = a.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact",
                                                        "retention.ms": "3600000"})])
    [f.result(30) for f in fs.values()]
    config = tmp_path / "admin.properties"
    config.write_text("default.api.timeout.ms=30000\nrequest.timeout.ms=10000\n")

    def configs_tool(*args):
        return subprocess.run(["java", "-Xmx256m", "-cp", f"{KAFKA_LIB}/*", "org.apache.kafka.tools.ConfigCommand",
                               "--bootstrap-server", bs, "--command-config", str(config), *args],
                              capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)

    p = configs_tool("--describe", "--all", "--entity-type", "topics", "--entity-name", topic)
    assert p.returncode == 0, (p.stdout, p.stderr)
    got = {}
    for line in p.stdout.splitlines():
        line = line.strip()
        if "=" in line and " sensitive=" in line:
            key, rest = line.split("=", 1)
            got[key] = rest.split(" sensitive=")[0]
    assert got.get("cleanup.policy") == "compact", p.stdout
    assert got.get("retention.ms") == "3600000", p.stdout
    assert "segment.bytes" in got and "max.message.bytes" in got, p.stdout

    # Only the configs the topic was given (not the defaults).
    p = configs_tool("--describe", "--entity-type", "topics", "--entity-name", topic)
    assert p.returncode == 0, (p.stdout, p.stderr)
    own = sorted(line.strip().split("=", 1)[0] for line in p.stdout.splitlines()
                 if " sensitive=" in line)
    assert own == ["cleanup.policy", "retention.ms"], p.stdout

    p = configs_tool("--alter", "--entity-type", "topics", "--entity-name", topic,
                     "--add-config", "retention.ms=7200000,segment.ms=600000",
                     "--delete-config", "cleanup.policy")
    assert p.returncode == 0, (p.stdout, p.stderr)
    p = configs_tool("--describe", "--entity-type", "topics", "--entity-name", topic)
    own = sorted(line.strip().split(" sensitive=")[0] for line in p.stdout.splitlines()
                 if " sensitive=" in line)
    assert own == ["retention.ms=7200000", "segment.ms=600000"], p.stdout
    p = configs_tool("--alter", "--entity-type", "topics", "--entity-name", topic,
                     "--add-config", "retention.ms=soon")
    assert p.returncode != 0 and "InvalidConfig" in p.stdout + p.stderr, (p.stdout, p.stderr)

    # The admin client asks the broker named for its own settings: any of a cluster's.
    info, _ = cli(broker, "cluster", "info")
    some_broker = str(info["brokers"][-1]["node_id"])
    p = configs_tool("--describe", "--all", "--entity-type", "brokers", "--entity-name", some_broker)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "log.retention.ms=" in p.stdout or "num.partitions=" in p.stdout, p.stdout

    p = configs_tool("--describe", "--entity-type", "topics", "--entity-name", "never-" + topic)
    assert "never-" + topic in p.stdout + p.stderr and "exist" in p.stdout + p.stderr, (p.stdout, p.stderr)
