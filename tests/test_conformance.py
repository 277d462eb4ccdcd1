"""Differential conformance: the same client-side scenarios run against
oncelog and against Apache Kafka 4.x (single-node KRaft, jars from Maven
Central in .tools/kafka-lib, fetched by test.sh), and what clients observe
— offsets, the errors they report, what each isolation level sees — must
match.

Known, deliberate difference (SCENARIOS.md S1): when a new producer fences an
open transaction, oncelog answers InitProducerId with the fencing epoch once
the abort is durable; Kafka answers CONCURRENT_TRANSACTIONS and bumps the epoch
again on the retry. librdkafka hides the retry, so nothing in these
observations differs; the epochs themselves are compared only on oncelog
(test_transactions.py::test_s1_zombie_fare_writer_is_fenced).
"""

import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from clients import end_offset, read_partition, txn_producer
from jvm import create_topic_with_leaders, kafka_reference


@pytest.fixture(scope="module")
def kafka(tmp_path_factory):
    k = kafka_reference(tmp_path_factory, "768m")
    yield k
    k.stop()


@pytest.fixture(scope="module")
def oncelog(module_broker_factory):
    return module_broker_factory({"group.initial.rebalance.delay.ms": 0})


create = create_topic_with_leaders


def end_offsets(bootstrap, topic, partitions, isolation):
    return [end_offset(bootstrap, topic, p, isolation) for p in range(partitions)]


def read(bootstrap, topic, partition, start, end, isolation):
    # the consumer's position is unset until it reads a record: an empty
    # range is read as empty
    if end <= start:
        return []
    return read_partition(bootstrap, topic, partition, start, isolation, end)


def scenario_s1(bootstrap):
    topic = "fares"
    create(bootstrap, topic, 3)
    plain = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(40):
        plain.produce(topic, value=b"fare-%d" % i, partition=2)
    assert plain.flush(30) == 0
    a = txn_producer(bootstrap, "fare-writer-7")
    a.init_transactions(60)
    a.begin_transaction()
    got_a = []
    a.produce(topic, value=b"trip-9001", partition=2, on_delivery=lambda e, m: got_a.append((e, m.offset())))
    a.flush(30)
    b = txn_producer(bootstrap, "fare-writer-7")
    b.init_transactions(60)
    b.begin_transaction()
    got_b = []
    b.produce(topic, value=b"trip-9001", partition=2, on_delivery=lambda e, m: got_b.append((e, m.offset())))
    b.commit_transaction(60)
    zombie_errors = []
    a.produce(topic, value=b"trip-9002", partition=2, on_delivery=lambda e, m: zombie_errors.append(e))
    try:
        a.flush(30)
    except (KafkaException, SystemError) as e:
        zombie_errors.append(e)
    try:
        a.commit_transaction(30)
        commit_outcome = "committed"
    except KafkaException as e:
        err = e.args[0]
        commit_outcome = f"fatal={err.fatal()} fenced={'fenced' in err.str().lower()}"
    ends_c = end_offsets(bootstrap, topic, 3, "read_committed")
    ends_u = end_offsets(bootstrap, topic, 3, "read_uncommitted")
    return {
        "a_delivered": [(e is None, o) for e, o in got_a],
        "b_delivered": [(e is None, o) for e, o in got_b],
        "zombie_send_failed": bool(zombie_errors) and zombie_errors[0] is not None,
        "zombie_commit": commit_outcome,
        "end_offsets_committed": ends_c,
        "end_offsets_uncommitted": ends_u,
        "read_committed_from_40": read(bootstrap, topic, 2, 40, ends_c[2], "read_committed"),
        "read_uncommitted_from_40": read(bootstrap, topic, 2, 40, ends_u[2], "read_uncommitted"),
    }


def scenario_visibility(bootstrap):
    topic = "visibility"
    create(bootstrap, topic, 2)
    p = txn_producer(bootstrap, "visibility-writer")
    p.init_transactions(60)
    for r in range(4):
        p.begin_transaction()
        for i in range(6):
            p.produce(topic, value=b"r%d-%d" % (r, i), partition=i % 2)
        if r % 2 == 0:
            p.commit_transaction(60)
        else:
            p.flush(30)
            p.abort_transaction(60)
    # An open transaction at the end pins the last stable offset.
    p.begin_transaction()
    p.produce(topic, value=b"open", partition=0)
    p.flush(30)
    ends_c = end_offsets(bootstrap, topic, 2, "read_committed")
    ends_u = end_offsets(bootstrap, topic, 2, "read_uncommitted")
    obs = {
        "end_offsets_committed": ends_c,
        "end_offsets_uncommitted": ends_u,
        "committed": [read(bootstrap, topic, i, 0, ends_c[i], "read_committed") for i in range(2)],
        "uncommitted": [read(bootstrap, topic, i, 0, ends_u[i], "read_uncommitted") for i in range(2)],
    }
    p.commit_transaction(60)
    obs["end_offsets_after_commit"] = end_offsets(bootstrap, topic, 2, "read_committed")
    return obs


def scenario_idempotent(bootstrap):
    topic = "idempotent"
    create(bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2})
    offsets = []
    for i in range(500):
        p.produce(topic, value=b"i%d" % i, on_delivery=lambda e, m: offsets.append((e is None, m.offset())))
    p.flush(30)
    return {"offsets": sorted(offsets), "end": end_offsets(bootstrap, topic, 1, "read_committed")}


def scenario_offsets_in_transaction(bootstrap):
    """send_offsets_to_transaction: committed with the transaction, gone with its abort."""
    topic = "copy-in"
    create(bootstrap, topic, 1)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "copier", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.subscribe([topic])
    deadline = time.monotonic() + 60
    while not c.assignment() and time.monotonic() < deadline:
        c.poll(0.2)
    assert c.assignment(), "no assignment"
    p = txn_producer(bootstrap, "copier-txn")
    p.init_transactions(60)
    tp = [TopicPartition(topic, 0, 7)]
    p.begin_transaction()
    p.send_offsets_to_transaction(tp, c.consumer_group_metadata(), 30)
    p.commit_transaction(60)
    after_commit = [(x.partition, x.offset) for x in c.committed([TopicPartition(topic, 0)], timeout=15)]
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 9)], c.consumer_group_metadata(), 30)
    p.abort_transaction(60)
    after_abort = [(x.partition, x.offset) for x in c.committed([TopicPartition(topic, 0)], timeout=15)]
    c.close()
    return {"after_commit": after_commit, "after_abort": after_abort}


SCENARIOS = [scenario_s1, scenario_visibility, scenario_idempotent, scenario_offsets_in_transaction]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_same_observations_as_apache_kafka(kafka, oncelog, scenario):
    theirs = scenario(kafka.bootstrap)
    ours = scenario(oncelog.bootstrap)
    assert ours == theirs, f"oncelog differs from Apache Kafka {kafka.version}:\noncelog: {ours}\nkafka:   {theirs}"
