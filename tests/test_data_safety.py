"""Nothing a client or an operator types destroys durable state.

Every test here first gives a real broker durable state: acknowledged
records, a group's committed offsets and a committed transaction. It then
tries a destructive action (through the `oncelog` CLI and through at least
one third-party client), restarts the broker, and checks that all of that
state is still there, byte for byte.
"""

import json
import shutil
import socket
import subprocess
import time
import uuid
from collections import namedtuple
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewPartitions, NewTopic)

import kafka_wire as w
from clients import (admin, cli, committed_offsets, consumer_config, create_topic, producer_config,
                     read_all, txn_producer, unique_topic)
from conftest import free_port, oncelog_bin, wait_until

INTERNAL = ("__consumer_offsets", "__transaction_state")
KCAT = shutil.which("kcat")

Seed = namedtuple("Seed", "topic records group offsets txn_id")


def seed(broker):
    """Acknowledged records, committed offsets and a committed transaction."""
    topic = unique_topic("safe")
    create_topic(broker.bootstrap, topic, partitions=2)
    records = {}  # (partition, offset) -> value

    def on_delivery(err, msg):
        assert err is None, err
        records[(msg.partition(), msg.offset())] = msg.value()

    p = Producer(producer_config(broker.bootstrap, enable_idempotence=True))
    for i in range(40):
        p.produce(topic, value=f"plain-{i}".encode(), partition=i % 2, on_delivery=on_delivery)
    assert p.flush(30) == 0
    txn_id = f"safe-writer-{uuid.uuid4().hex[:6]}"
    tp = txn_producer(broker.bootstrap, txn_id)
    tp.init_transactions(30)
    tp.begin_transaction()
    for i in range(6):
        tp.produce(topic, value=f"txn-{i}".encode(), partition=i % 2, on_delivery=on_delivery)
    tp.commit_transaction(30)
    assert len(records) == 46
    group = f"safe-group-{uuid.uuid4().hex[:6]}"
    offsets = {0: 7, 1: 3}
    c = Consumer(consumer_config(broker.bootstrap, **{"group.id": group}))
    c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
             asynchronous=False)
    c.close()
    return Seed(topic, records, group, offsets, txn_id)


def verify(broker, s):
    """Every acknowledged record, the committed offsets and the transactional id are there."""
    got = {}
    for partition in (0, 1):
        for off, v in read_all(broker.bootstrap, s.topic, partition, offsets=True).items():
            got[(partition, off)] = v
    assert got == s.records
    assert committed_offsets(broker.bootstrap, s.group, s.topic, s.offsets) == s.offsets
    listed, _ = cli(broker, "txn", "list")
    assert s.txn_id in [t["transactional_id"] for t in listed]


# live verification's record (verify.json, verify-lineage.json and their
# temporary files): written by the broker each few seconds, not topic state
VERIFY_RECORD = ("verify.json", "verify-lineage.json")


def entries(d):
    """The data directory's top-level entries, live verification's record
    left out."""
    return sorted(p.name for p in Path(d).iterdir() if not p.name.startswith(VERIFY_RECORD))


def kafka_code(excinfo):
    return excinfo.value.args[0].code()


# ------------------------------------------------------------ 1. internal topics

@pytest.mark.timeout(240)
def test_internal_topics_refuse_every_client(broker):
    s = seed(broker)
    a = admin(broker.bootstrap)
    for name in INTERNAL:
        # the oncelog CLI
        _, r = cli(broker, "topic", "create", name, json_out=False, check=False)
        assert r.returncode != 0 and "internal topic" in r.stderr, r.stderr
        assert "InvalidTopicException" in r.stderr, r.stderr
        _, r = cli(broker, "topic", "delete", name, json_out=False, check=False)
        assert r.returncode != 0 and "internal topic" in r.stderr, r.stderr
        _, r = cli(broker, "topic", "alter-config", name, "--set", "retention.ms=1",
                   json_out=False, check=False)
        assert r.returncode != 0 and "internal topic" in r.stderr, r.stderr
        _, r = cli(broker, "produce", name, stdin="boom\n", json_out=False, check=False)
        assert r.returncode != 0, r.stdout
        # confluent-kafka's admin client
        with pytest.raises(KafkaException) as e:
            a.create_topics([NewTopic(name, 1, 1)])[name].result(30)
        assert kafka_code(e) == KafkaError.TOPIC_EXCEPTION and "internal topic" in str(e.value)
        with pytest.raises(KafkaException) as e:
            a.delete_topics([name])[name].result(30)
        assert kafka_code(e) == KafkaError.TOPIC_AUTHORIZATION_FAILED, e.value
        with pytest.raises(KafkaException) as e:
            a.create_partitions([NewPartitions(name, 4)])[name].result(30)
        assert kafka_code(e) == KafkaError.TOPIC_AUTHORIZATION_FAILED, e.value
        res = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as e:
            list(a.incremental_alter_configs([res]).values())[0].result(30)
        assert kafka_code(e) == KafkaError.TOPIC_AUTHORIZATION_FAILED, e.value
        # confluent-kafka's producer: Metadata (the auto-create path), then Produce
        # (librdkafka refuses at once when its metadata already says the
        # topic is invalid, or reports it in the delivery report)
        errors = []
        p = Producer(producer_config(broker.bootstrap, message_timeout_ms=5000))
        try:
            p.produce(name, value=b"boom", on_delivery=lambda err, msg: errors.append(err))
            p.flush(20)
        except KafkaException as e:
            errors.append(e.args[0])
        assert len(errors) == 1 and errors[0] is not None, errors
        assert errors[0].code() in (KafkaError.TOPIC_EXCEPTION, KafkaError._UNKNOWN_TOPIC), errors
        # kcat, which auto-creates what it produces to
        if KCAT:
            r = subprocess.run([KCAT, "-b", broker.bootstrap, "-P", "-t", name,
                                "-X", "message.timeout.ms=5000"],
                               input=b"boom\n", capture_output=True, timeout=60)
            assert r.returncode == 1 and b"Delivery failed for message: Broker: Invalid topic" \
                in r.stderr, r.stderr
            r = subprocess.run([KCAT, "-b", broker.bootstrap, "-L", "-t", name],
                               capture_output=True, timeout=60)
            assert f'topic "{name}" with 0 partitions: Broker: Invalid topic'.encode() in r.stdout, r
        # a raw Produce to partition 0, with no Metadata first
        with w.Conn(broker.host, broker.port) as conn:
            conn.send(w.produce_request(3, 7, name, 0, w.encode_batch([(None, b"boom", [])])))
            out, _ = w.parse_produce_v3_response(conn.recv_response(7))
        assert out[(name, 0)][0] == 17  # INVALID_TOPIC_EXCEPTION
        # Metadata does not serve it as a topic nor create it
        md = a.list_topics(topic=name, timeout=30)
        assert md.topics[name].error is not None
    assert entries(broker.data_dir / "internal") == ["__consumer_offsets-0", "__transaction_state-0"]
    assert not any(n.startswith("__") for n in entries(broker.data_dir)), entries(broker.data_dir)
    assert "produce to an internal topic refused" in broker.log_text()
    broker.restart()
    verify(broker, s)


@pytest.mark.timeout(180)
def test_an_older_layout_is_moved_and_loses_nothing(broker):
    s = seed(broker)
    broker.stop()
    # The layout before internal/: the coordinators' logs beside the topics,
    # and a catalogue in which a client once auto-created __consumer_offsets.
    for name in ("__consumer_offsets-0", "__transaction_state-0"):
        (broker.data_dir / "internal" / name).rename(broker.data_dir / name)
    (broker.data_dir / "internal").rmdir()
    # What a client's produce to the auto-created topic left in the shared
    # directory: a record the group coordinator never wrote.
    log_dir = broker.data_dir / "__consumer_offsets-0"
    segment = sorted(log_dir.glob("*.log"))[-1]
    batches = list(w.walk_batches(segment.read_bytes()))
    assert batches, "the offsets log should hold the seeded commit"
    with open(segment, "ab") as f:
        f.write(w.encode_batch([(None, b"a client's record", [])],
                               base_offset=batches[-1].last_offset + 1))
    cat = json.loads((broker.data_dir / "topics.json").read_text())
    cat["topics"].append({"name": "__consumer_offsets", "id": str(uuid.uuid4()),
                          "partitions": 1, "configs": {}})
    (broker.data_dir / "topics.json").write_text(json.dumps(cat))
    broker.start()
    verify(broker, s)
    # The marker lets the offsets log skip records a client may have written.
    assert entries(broker.data_dir / "internal") == [
        "__consumer_offsets-0", "__consumer_offsets-0.client-written", "__transaction_state-0"]
    assert not (broker.data_dir / "__consumer_offsets-0").exists()
    log = broker.log_text(since_last_start=True)
    assert "internal log moved to the internal/ directory" in log
    assert "dropping a client-created topic with an internal name" in log
    assert "skipped records of the offsets log that the broker did not write" in log
    broker.restart()
    verify(broker, s)


# ------------------------------------------------------------ 2. one broker per data dir

@pytest.mark.timeout(180)
def test_a_second_broker_on_the_same_directory_exits_at_once(broker):
    s = seed(broker)
    t0 = time.monotonic()
    r = subprocess.run([str(oncelog_bin()), "serve", "--data-dir", str(broker.data_dir),
                        "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen", ""],
                       capture_output=True, text=True, timeout=30)
    assert time.monotonic() - t0 < 10
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: "), r.stderr
    assert f"pid {broker.pid}" in r.stderr and "in use" in r.stderr, r.stderr
    assert "backtrace" not in r.stderr.lower() and "Error {" not in r.stderr
    # The first broker goes on acknowledging, through two clients.
    cli(broker, "produce", s.topic, "--partition", "0", "--json", json_out=False,
        stdin="after-1\nafter-2\n")
    p = Producer(producer_config(broker.bootstrap))
    acked = []
    p.produce(s.topic, value=b"after-3", partition=1,
              on_delivery=lambda err, msg: acked.append((msg.partition(), msg.offset())))
    assert p.flush(30) == 0 and len(acked) == 1
    # kill -9: the kernel drops the lock with the process.
    broker.kill9()
    broker.start()
    got0 = read_all(broker.bootstrap, s.topic, 0, offsets=True)
    assert [v for v in got0.values() if v.startswith(b"after")] == [b"after-1", b"after-2"]
    assert read_all(broker.bootstrap, s.topic, 1, offsets=True)[acked[0][1]] == b"after-3"
    s.records.update({(0, o): v for o, v in got0.items() if v.startswith(b"after")})
    s.records[acked[0]] = b"after-3"
    verify(broker, s)


# ------------------------------------------------------------ 3. all or nothing

@pytest.mark.timeout(240)
def test_partition_limits_are_checked_up_front(broker):
    s = seed(broker)
    before = entries(broker.data_dir)
    _, r = cli(broker, "topic", "create", "huge", "--partitions", "100000",
               json_out=False, check=False)
    assert r.returncode != 0 and "max.partitions.per.topic" in r.stderr, r.stderr
    a = admin(broker.bootstrap)
    with pytest.raises(KafkaException) as e:
        a.create_topics([NewTopic("huge2", 20000, 1)])["huge2"].result(30)
    assert kafka_code(e) == KafkaError.INVALID_PARTITIONS and "max.partitions.per.topic" in str(e.value)
    with pytest.raises(KafkaException) as e:
        a.create_partitions([NewPartitions(s.topic, 50000)])[s.topic].result(30)
    assert kafka_code(e) == KafkaError.INVALID_PARTITIONS
    assert entries(broker.data_dir) == before
    broker.restart()
    assert entries(broker.data_dir) == before
    verify(broker, s)


@pytest.mark.timeout(180)
def test_the_broker_wide_partition_limit(broker_factory):
    b = broker_factory({"max.partitions": 12})
    s = seed(b)  # 2 partitions
    cli(b, "topic", "create", "eight", "--partitions", "8", json_out=False)
    before = entries(b.data_dir)
    _, r = cli(b, "topic", "create", "three", "--partitions", "3", json_out=False, check=False)
    assert r.returncode != 0 and "max.partitions 12" in r.stderr, r.stderr
    _, r = cli(b, "topic", "add-partitions", "eight", "--count", "11", json_out=False, check=False)
    assert r.returncode != 0 and "max.partitions 12" in r.stderr, r.stderr
    a = admin(b.bootstrap)
    with pytest.raises(KafkaException) as e:
        a.create_partitions([NewPartitions("eight", 11)])["eight"].result(30)
    assert kafka_code(e) == KafkaError.INVALID_PARTITIONS and "max.partitions 12" in str(e.value)
    assert entries(b.data_dir) == before
    cli(b, "topic", "add-partitions", "eight", "--count", "10", json_out=False)
    b.restart()
    assert partitions_of(b, "eight") == 10
    verify(b, s)


@pytest.mark.timeout(240)
def test_open_files_budget_refuses_instead_of_leaving_orphans(broker_factory):
    b = broker_factory(start=False)
    b.nofile = 400
    b.start()
    assert "this broker may open 400 files" in b.log_text()
    s = seed(b)
    before = entries(b.data_dir)
    _, r = cli(b, "topic", "create", "many", "--partitions", "300", json_out=False, check=False)
    # the broker's up-front refusal, not the "Too many open files" of a half-made topic
    assert r.returncode != 0 and "raise its open files limit" in r.stderr, r.stderr
    a = admin(b.bootstrap)
    with pytest.raises(KafkaException) as e:
        a.create_topics([NewTopic("many2", 300, 1)])["many2"].result(30)
    assert kafka_code(e) == KafkaError.INVALID_PARTITIONS and "open files" in str(e.value)
    assert entries(b.data_dir) == before
    cli(b, "topic", "create", "some", "--partitions", "20", json_out=False)
    b.restart()
    assert entries(b.data_dir) == sorted(before + [f"some-{p}" for p in range(20)])
    verify(b, s)


def crash_at(broker, failpoint, *cli_args):
    """Restarts the broker with a failpoint, runs a CLI command that makes it
    abort there, and restarts it without the failpoint."""
    broker.stop()
    broker.env["ONCELOG_FAILPOINTS"] = failpoint
    broker.start()
    cli(broker, *cli_args, json_out=False, check=False)
    wait_until(lambda: not broker.alive, 20, what=f"the broker to abort at {failpoint}")
    assert f"failpoint hit" in broker.log_text(since_last_start=True)
    broker.env.pop("ONCELOG_FAILPOINTS")
    broker.start()


def partitions_of(broker, topic):
    md = admin(broker.bootstrap).list_topics(timeout=30)
    t = md.topics.get(topic)
    return None if t is None else len(t.partitions)


@pytest.mark.timeout(300)
def test_create_and_delete_are_atomic_across_kill(broker):
    s = seed(broker)
    base = entries(broker.data_dir)
    # Killed before the catalogue write: no trace after the restart.
    crash_at(broker, "topic-create-staged", "topic", "create", "half", "--partitions", "8")
    assert partitions_of(broker, "half") is None
    assert entries(broker.data_dir) == base
    # Killed after it: the next start completes the topic, all 8 partitions.
    for fp, name in (("topic-create-committed", "whole"), ("topic-installed", "whole2")):
        crash_at(broker, fp, "topic", "create", name, "--partitions", "8")
        assert partitions_of(broker, name) == 8
        assert {f"{name}-{p}" for p in range(8)} <= set(entries(broker.data_dir))
        assert not (broker.data_dir / "staging").exists()
        for p in range(8):
            cli(broker, "produce", name, "--partition", str(p), json_out=False, stdin=f"r{p}\n")
    # Adding partitions: all or none, the same way.
    crash_at(broker, "topic-add-partitions-staged", "topic", "add-partitions", "whole", "--count", "12")
    assert partitions_of(broker, "whole") == 8
    assert not any(n in entries(broker.data_dir) for n in ("whole-8", "staging"))
    crash_at(broker, "topic-add-partitions-committed", "topic", "add-partitions", "whole", "--count", "12")
    assert partitions_of(broker, "whole") == 12
    assert {f"whole-{p}" for p in range(12)} <= set(entries(broker.data_dir))
    # A delete killed before its catalogue write leaves the topic whole.
    crash_at(broker, "topic-delete-staged", "topic", "delete", s.topic)
    assert partitions_of(broker, s.topic) == 2
    verify(broker, s)
    # Killed after it: the topic is gone, and so are its files.
    crash_at(broker, "topic-delete-committed", "topic", "delete", "whole")
    assert partitions_of(broker, "whole") is None
    assert not any(n.startswith("whole-") for n in entries(broker.data_dir))
    assert not (broker.data_dir / "staging").exists()
    # And a finished delete really removes every partition, also after a restart.
    cli(broker, "topic", "delete", "whole2", json_out=False)
    broker.restart()
    assert not any(n.startswith("whole2-") for n in entries(broker.data_dir))
    assert not (broker.data_dir / "staging").exists()
    verify(broker, s)


@pytest.mark.timeout(240)
def test_delete_and_recreate_under_produce_load(broker_factory):
    """A producer keeps writing to a topic while it is deleted and created
    again: nothing of the old topic's in-flight writes may land in, or cut
    back, the new one, and what the new one acknowledged survives a restart."""
    import threading
    # no auto-create: the producer's metadata refreshes must not re-create it
    broker = broker_factory({"auto.create.topics.enable": "false"})
    s = seed(broker)
    topic = unique_topic("churn")
    create_topic(broker.bootstrap, topic, partitions=2)
    acked = []  # (partition, offset, value, monotonic time)
    stop = threading.Event()

    def on_delivery(err, msg):
        if err is None:
            acked.append((msg.partition(), msg.offset(), msg.value(), time.monotonic()))

    def produce():
        p = Producer(producer_config(broker.bootstrap, linger_ms=1,
                                     message_timeout_ms=20000, retries=1000000))
        i = 0
        while not stop.is_set():
            try:
                p.produce(topic, value=f"r{i}".encode(), partition=i % 2, on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            p.poll(0.001)
        p.flush(30)

    t = threading.Thread(target=produce)
    t.start()
    try:
        for _ in range(3):
            time.sleep(0.5)
            cli(broker, "topic", "delete", topic, json_out=False)
            cli(broker, "topic", "create", topic, "--partitions", "2", json_out=False)
            created = time.monotonic()
        time.sleep(1.0)
    finally:
        stop.set()
        t.join(60)
    before = {p: read_all(broker.bootstrap, topic, p, offsets=True) for p in (0, 1)}
    broker.restart()
    after = {p: read_all(broker.bootstrap, topic, p, offsets=True) for p in (0, 1)}
    assert after == before
    # Everything acknowledged well after the last re-creation is there, at its offset.
    late = [(p, o, v) for p, o, v, at in acked if at > created + 0.5]
    assert late, "the producer got no acknowledgement from the re-created topic"
    for p, o, v in late:
        assert after[p].get(o) == v, (p, o, v)
    # The new topic's offsets are dense from 0: no stray segment of an old one.
    for p in (0, 1):
        assert sorted(after[p]) == list(range(len(after[p]))), sorted(after[p])[:10]
    verify(broker, s)


# ------------------------------------------------------------ 4. settings

def serve_once(*args, timeout=30):
    return subprocess.run([str(oncelog_bin()), "serve", *args], capture_output=True,
                          text=True, timeout=timeout)


def assert_clean_error(r, code, *needles):
    assert r.returncode == code, (r.returncode, r.stderr)
    # log lines may come first; the failure is the last line, on its own
    assert r.stderr.strip().splitlines()[-1].startswith("error: "), r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)
    assert "backtrace" not in r.stderr.lower() and "Error {" not in r.stderr, r.stderr
    assert "panicked" not in r.stderr, r.stderr


@pytest.mark.timeout(240)
def test_settings_are_validated_at_start(broker, tmp_path):
    s = seed(broker)
    broker.stop()
    d = ["--data-dir", str(broker.data_dir), "--listen", f"127.0.0.1:{free_port()}",
         "--metrics-listen", ""]
    assert_clean_error(serve_once(*d, "-o", "transaction.version=3"), 2,
                       "transaction.version", "must be 1 or 2")
    assert_clean_error(serve_once(*d, "-o", "message.max.bytes=0"), 2,
                       "message.max.bytes", "must be positive")
    assert_clean_error(serve_once(*d, "-o", "log.retention.ms=-7"), 2, "log.retention.ms")
    assert_clean_error(serve_once(*d, "-o", "transaction.max.timeout.ms=-1"), 2,
                       "transaction.max.timeout.ms")
    assert_clean_error(serve_once(*d, "-o", "log.retention.msec=1000"), 2,
                       "unknown setting `log.retention.msec`", "did you mean `log.retention.ms`?")
    cfg = tmp_path / "oncelog.toml"
    cfg.write_text('"transaction.versoin" = 2\n')
    assert_clean_error(serve_once(*d, "-c", str(cfg)), 2, "did you mean `transaction.version`?")
    assert_clean_error(serve_once(*d, "-o", "novalue"), 2, "KEY=VALUE")
    # Files and ports: exit 1 with the cause.
    plain = tmp_path / "a-file"
    plain.write_text("not a directory")
    assert_clean_error(serve_once("--data-dir", str(plain), "--metrics-listen", "",
                                  "--listen", f"127.0.0.1:{free_port()}"), 1, "is not a directory")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_clean_error(serve_once("--data-dir", str(broker.data_dir), "--metrics-listen", "",
                                      "--listen", f"127.0.0.1:{port}"),
                           1, "already in use", f"port {port}")
        assert_clean_error(serve_once(*d[:4], "--metrics-listen", f"127.0.0.1:{port}"),
                           1, "metrics", "already in use", f"port {port}")
    broker.start()
    verify(broker, s)


# ------------------------------------------------------------ 5. reasons reach the client

@pytest.mark.timeout(180)
def test_errors_carry_their_reason(broker):
    s = seed(broker)
    a = admin(broker.bootstrap)
    with pytest.raises(KafkaException) as e:
        a.create_topics([NewTopic("bad name!", 1, 1)])["bad name!"].result(30)
    assert kafka_code(e) == KafkaError.TOPIC_EXCEPTION
    assert "only ASCII letters, digits" in str(e.value), e.value
    _, r = cli(broker, "topic", "create", "bad name!", json_out=False, check=False)
    assert r.returncode != 0 and "only ASCII letters, digits" in r.stderr, r.stderr
    with pytest.raises(KafkaException) as e:
        a.create_topics([NewTopic(s.topic, 1, 1)])[s.topic].result(30)
    assert kafka_code(e) == KafkaError.TOPIC_ALREADY_EXISTS and "already exists" in str(e.value)
    with pytest.raises(KafkaException) as e:
        a.create_partitions([NewPartitions(s.topic, 1)])[s.topic].result(30)
    assert "would not be an increase" in str(e.value), e.value
    with pytest.raises(KafkaException) as e:
        a.delete_topics(["no-such-topic"])["no-such-topic"].result(30)
    assert kafka_code(e) == KafkaError.UNKNOWN_TOPIC_OR_PART
    _, r = cli(broker, "topic", "delete", "no-such-topic", json_out=False, check=False)
    assert r.returncode != 0 and "does not exist" in r.stderr, r.stderr
    # The writer fence: AddPartitionsToTxn has no error_message field in any
    # version, so a classic-protocol client gets the code and the broker's
    # log names the allowed prefix.
    fenced = unique_topic("fenced")
    create_topic(broker.bootstrap, fenced, config={"writer.transactional.id.prefix": "orders-sink"})
    tp = txn_producer(broker.bootstrap, "other-job-1")
    tp.init_transactions(30)
    tp.begin_transaction()
    tp.produce(fenced, value=b"x")
    with pytest.raises(KafkaException) as e:
        tp.flush(30)
        tp.commit_transaction(30)
    assert kafka_code(e) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, e.value
    assert 'only from writer \\"orders-sink\\"' in broker.log_text() or \
        'only from writer "orders-sink"' in broker.log_text(), broker.log_tail()
    broker.restart()
    verify(broker, s)
