"""The `oncelog` client commands run as a user would, against a live broker:
tables for people and --json for scripts; S4 seen through the CLI
(find-hanging, then abort, and read_committed readers resume)."""

import json
import subprocess
import time

from confluent_kafka import Consumer, TopicPartition

from clients import consumer_config, unique_topic
from conftest import oncelog_bin
from test_transactions import txn_producer


def cli(broker, *args, json_out=True, check=True):
    argv = [str(oncelog_bin()), *args, "--bootstrap", broker.bootstrap] + (["--json"] if json_out else [])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check:
        assert p.returncode == 0, f"{argv} exited {p.returncode}: {p.stderr}"
    return (json.loads(p.stdout) if json_out and p.returncode == 0 else p.stdout), p


def test_topic_commands(broker):
    topic = unique_topic("cli")
    out, _ = cli(broker, "topic", "create", topic, "--partitions", "3", "--config", "retention.ms=60000")
    assert out == {"created": topic, "partitions": 3}
    listed, _ = cli(broker, "topic", "list")
    assert {"topic": topic, "partitions": 3} in listed
    table, _ = cli(broker, "topic", "list", json_out=False)
    assert table.splitlines()[0].split() == ["TOPIC", "PARTITIONS"]
    assert any(line.split() == [topic, "3"] for line in table.splitlines())
    desc, _ = cli(broker, "topic", "describe", topic)
    assert [p["partition"] for p in desc["partitions"]] == [0, 1, 2]
    assert all(p["high_watermark"] == 0 and p["last_stable_offset"] == 0 for p in desc["partitions"])
    _, p = cli(broker, "topic", "describe", "no-such-topic", check=False)
    assert p.returncode != 0 and "UnknownTopicOrPartition" in p.stderr
    out, _ = cli(broker, "topic", "delete", topic)
    assert out == {"deleted": topic}
    info, _ = cli(broker, "cluster", "info")
    assert info["brokers"][0]["port"] == broker.port
    assert any(a["api"] == "InitProducerId" for a in info["apis"])


def test_s4_through_the_cli(broker):
    topic = unique_topic("cli-s4")
    cli(broker, "topic", "create", topic, "--partitions", "2")
    old = txn_producer(broker.bootstrap, "fare-writer-7-a3f9")
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, value=b"orphan", partition=1)
    old.flush(30)
    time.sleep(0.3)
    hanging, _ = cli(broker, "txn", "find-hanging", "--min-age-ms", "100")
    assert [h["transactional_id"] for h in hanging] == ["fare-writer-7-a3f9"]
    assert hanging[0]["partitions"] == [f"{topic}-1"] and hanging[0]["age_ms"] >= 100
    table, _ = cli(broker, "txn", "find-hanging", "--min-age-ms", "100", json_out=False)
    assert table.splitlines()[0].split()[0] == "TRANSACTIONAL-ID" and f"{topic}-1" in table
    producers, _ = cli(broker, "txn", "producers", topic, "1")
    assert len(producers) == 1 and producers[0]["current_txn_start_offset"] == 0
    listed, _ = cli(broker, "txn", "list", "--state", "Ongoing")
    assert [t["transactional_id"] for t in listed] == ["fare-writer-7-a3f9"]
    p = producers[0]
    cli(broker, "txn", "abort", topic, "1", "--producer-id", str(p["producer_id"]),
        "--producer-epoch", str(p["epoch"]))
    desc, _ = cli(broker, "txn", "describe", "fare-writer-7-a3f9")
    assert desc["state"] == "CompleteAbort" and desc["producer_epoch"] == p["epoch"] + 1
    after, _ = cli(broker, "topic", "describe", topic)
    assert after["partitions"][1]["last_stable_offset"] == after["partitions"][1]["high_watermark"] == 2
    assert cli(broker, "txn", "find-hanging", "--min-age-ms", "0")[0] == []


def test_group_commands_show_lag(broker_factory):
    b = broker_factory({"group.initial.rebalance.delay.ms": 0})
    topic = unique_topic("cli-g")
    cli(b, "topic", "create", topic, "--partitions", "2")
    from confluent_kafka import Producer
    from clients import flush_all, producer_config
    p = Producer(producer_config(b.bootstrap))
    for i in range(10):
        p.produce(topic, value=b"v", partition=i % 2)
    flush_all(p)
    c = Consumer(consumer_config(b.bootstrap, **{"group.id": "cli-group"}))
    c.commit(offsets=[TopicPartition(topic, 0, 2), TopicPartition(topic, 1, 5)], asynchronous=False)
    c.close()
    groups, _ = cli(b, "group", "list")
    assert {"group": "cli-group", "state": "Empty", "protocol_type": ""} in groups
    desc, _ = cli(b, "group", "describe", "cli-group")
    lag = {(o["topic"], o["partition"]): (o["committed"], o["lag"]) for o in desc["offsets"]}
    assert lag == {(topic, 0): (2, 3), (topic, 1): (5, 0)}
    table, _ = cli(b, "group", "describe", "cli-group", json_out=False)
    assert "LAG" in table.splitlines()[1]
