"""Altering a topic's configs after creation, in both modes: librdkafka's
IncrementalAlterConfigs (SET, DELETE, APPEND, SUBTRACT, validate_only),
kafka-python's older AlterConfigs (the topic's configs replaced by the ones
sent), refusals that change nothing, alterations surviving kill -9, several
alterations at once through different brokers losing none, and a changed
config taking effect on every broker (the writer fence, S6)."""

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ConfigSource)

from clients import admin, create_topic, txn_producer, unique_topic
from conftest import both_modes

SET, DELETE, APPEND, SUBTRACT = (AlterConfigOpType.SET, AlterConfigOpType.DELETE,
                                 AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT)
WRITER = "writer.transactional.id.prefix"


def nodes(broker):
    """Each broker of a cluster, or the one broker of local mode."""
    return getattr(broker, "brokers", [broker])


def own_configs(bootstrap, topic):
    """The configs the topic holds itself (not the broker's defaults)."""
    res = ConfigResource("topic", topic)
    a = admin(bootstrap)  # kept until the answer: a dropped client ends its requests
    got = a.describe_configs([res])[res].result(30)
    return {k: e.value for k, e in got.items()
            if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}


def alter(bootstrap, name, *ops, validate_only=False):
    res = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, op, v in ops])
    a = admin(bootstrap)
    fs = a.incremental_alter_configs([res], validate_only=validate_only, request_timeout=30)
    return fs[res].result(30)


def alter_error(bootstrap, name, *ops, **kw):
    with pytest.raises(KafkaException) as e:
        alter(bootstrap, name, *ops, **kw)
    return e.value.args[0]


@both_modes()
def test_incremental_alter_configs_changes_what_every_broker_answers(broker):
    topic = unique_topic("cfg")
    create_topic(broker.bootstrap, topic, config={"retention.ms": "3600000"})
    first = nodes(broker)[0].bootstrap
    alter(first, topic, ("retention.ms", SET, "7200000"), ("cleanup.policy", APPEND, "compact"))
    want = {"retention.ms": "7200000", "cleanup.policy": "delete,compact"}
    for n in nodes(broker):
        assert own_configs(n.bootstrap, topic) == want, n

    # validate_only checks and changes nothing
    alter(first, topic, ("retention.ms", SET, "1"), validate_only=True)
    err = alter_error(first, topic, ("retention.ms", SET, "soon"), validate_only=True)
    assert err.code() == KafkaError.INVALID_CONFIG, err
    # a bad value among good ones: the resource is refused whole
    err = alter_error(first, topic, ("segment.ms", SET, "60000"), ("retention.ms", SET, "soon"))
    assert err.code() == KafkaError.INVALID_CONFIG and "retention.ms" in err.str(), err
    err = alter_error(first, topic, ("no.such.config", SET, "1"))
    assert err.code() == KafkaError.INVALID_CONFIG, err
    err = alter_error(first, topic, ("retention.ms", APPEND, "1"))
    assert err.code() == KafkaError.INVALID_CONFIG, err
    assert own_configs(broker.bootstrap, topic) == want

    # the topic's own value goes, the default answers again
    last = nodes(broker)[-1].bootstrap
    alter(last, topic, ("retention.ms", DELETE, None), ("cleanup.policy", SUBTRACT, "delete"))
    want = {"cleanup.policy": "compact"}
    assert own_configs(first, topic) == want

    # refusals: a topic that does not exist, the broker's own topic
    err = alter_error(first, "never-" + topic, ("retention.ms", SET, "1"))
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, err
    err = alter_error(first, "__consumer_offsets", ("retention.ms", SET, "1"))
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    # what was acknowledged survives kill -9 of every broker
    alter(first, topic, ("min.compaction.lag.ms", SET, "5000"))
    broker.kill9()
    broker.start()
    assert own_configs(broker.bootstrap, topic) == {**want, "min.compaction.lag.ms": "5000"}


@both_modes()
def test_alterations_at_once_through_different_brokers_lose_none(broker):
    """Each alteration reads the topic's configs and writes them back: two
    at once must each see the other's (a lost update would drop a key)."""
    topic = unique_topic("cfg-race")
    create_topic(broker.bootstrap, topic)
    keys = ["retention.ms", "segment.ms", "min.compaction.lag.ms", "delete.retention.ms",
            "retention.bytes", "max.compaction.lag.ms"]
    rounds = 6
    errors = []

    def writer(i, key):
        bs = nodes(broker)[i % len(nodes(broker))].bootstrap
        try:
            for r in range(rounds):
                alter(bs, topic, (key, SET, str(100000 + 1000 * i + r)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((key, e))

    threads = [threading.Thread(target=writer, args=(i, k)) for i, k in enumerate(keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    want = {k: str(100000 + 1000 * i + rounds - 1) for i, k in enumerate(keys)}
    for n in nodes(broker):
        assert own_configs(n.bootstrap, topic) == want, n


@both_modes()
def test_a_writer_fence_set_after_creation_holds_on_every_broker(broker):
    """S6 on a topic created without a writer: once the fence is set, every
    broker refuses another prefix's transactions; once it is removed, they
    are accepted again."""
    topic = unique_topic("cfg-s6")
    create_topic(broker.bootstrap, topic)
    alter(nodes(broker)[0].bootstrap, topic, (WRITER, SET, "blue-job"))
    # every broker's copy of the catalogue follows (announced, and read
    # again at least every 500 ms)
    time.sleep(1)
    for i, n in enumerate(nodes(broker)):
        p = txn_producer(n.bootstrap, f"green-job-{i}")
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, value=b"green")
        with pytest.raises(KafkaException) as e:
            p.flush(30)
            p.commit_transaction(30)
        assert e.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, e.value
    p = txn_producer(broker.bootstrap, "blue-job-1")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"blue")
    p.commit_transaction(30)

    alter(nodes(broker)[-1].bootstrap, topic, (WRITER, DELETE, None))
    time.sleep(1)
    p = txn_producer(broker.bootstrap, "green-job-9")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"green")
    p.commit_transaction(30)


@both_modes()
def test_kafka_python_alter_configs_replaces_a_topics_configs(broker):
    """kafka-python's AlterConfigs path (the older API): the configs sent
    become the topic's; what is left out returns to its default."""
    from kafka.admin import ConfigResource as KpResource, ConfigResourceType, KafkaAdminClient
    topic = unique_topic("cfg-kp")
    create_topic(broker.bootstrap, topic, config={"cleanup.policy": "compact",
                                                  "retention.ms": "3600000"})
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)
    try:
        # the client sends the modified keys it read first, with the new value
        r = a.alter_configs([KpResource(ConfigResourceType.TOPIC, topic,
                                        configs={"retention.ms": "7200000"})],
                            incremental=False, raise_on_unknown=False)
        assert r == {"topic": {topic: "OK"}}, r
        assert own_configs(broker.bootstrap, topic) == {"cleanup.policy": "compact",
                                                        "retention.ms": "7200000"}
        # a reset by AlterConfigs leaves the key out of what it sends
        r = a.reset_configs([KpResource(ConfigResourceType.TOPIC, topic,
                                        configs=["retention.ms"])],
                            incremental=False, raise_on_unknown=False)
        assert r == {"topic": {topic: "OK"}}, r
        assert own_configs(broker.bootstrap, topic) == {"cleanup.policy": "compact"}
        r = a.alter_configs([KpResource(ConfigResourceType.TOPIC, topic,
                                        configs={"cleanup.policy": "sometimes"})],
                            incremental=False, raise_on_unknown=False)
        assert "InvalidConfig" in r["topic"][topic], r
        r = a.alter_configs([KpResource(ConfigResourceType.TOPIC, "__consumer_offsets",
                                        configs={"retention.ms": "1"})],
                            incremental=False, raise_on_unknown=False)
        assert "TopicAuthorizationFailed" in r["topic"]["__consumer_offsets"], r
        # kafka-python's default: IncrementalAlterConfigs, as the broker offers it
        r = a.alter_configs([KpResource(ConfigResourceType.TOPIC, topic,
                                        configs={"segment.ms": "600000"})],
                            raise_on_unknown=False)
        assert r == {"topic": {topic: "OK"}}, r
        assert own_configs(broker.bootstrap, topic) == {"cleanup.policy": "compact",
                                                        "segment.ms": "600000"}
    finally:
        a.close()


@both_modes()
def test_a_request_of_the_wrong_shape_changes_nothing(broker):
    """What no library builds but the wire allows, sent through kafka-python's
    protocol layer: a config named twice in one resource, a null value on an
    operation other than DELETE, an operation that does not exist, the same
    resource twice (Kafka refuses every copy), a null value in the older
    AlterConfigs. Each is INVALID_REQUEST, and the topic's configs are what
    they were."""
    from kafka.admin import KafkaAdminClient
    from kafka.protocol.admin import AlterConfigsRequest, IncrementalAlterConfigsRequest
    topic = unique_topic("cfg-shape")
    create_topic(broker.bootstrap, topic, config={"retention.ms": "3600000"})
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)

    async def send(req):
        return await a._manager.send(req)

    def codes(req):
        return [(r.resource_name, r.error_code, r.error_message)
                for r in a._manager.run(send, req).responses]

    invalid_request = 42
    try:
        for configs, message in [
            ([("retention.ms", 0, "1"), ("retention.ms", 1, None)], "duplicate config keys"),
            ([("retention.ms", 0, None), ("segment.ms", 1, None)], "Null value not supported for : retention.ms"),
            ([("retention.ms", 7, "1")], "unknown operation 7"),
        ]:
            got = codes(IncrementalAlterConfigsRequest(resources=[(2, topic, configs)],
                                                       validate_only=False))
            assert [(n, c) for n, c, _ in got] == [(topic, invalid_request)], got
            assert message in got[0][2], got
        got = codes(IncrementalAlterConfigsRequest(
            resources=[(2, topic, [("retention.ms", 0, "1")]),
                       (2, topic, [("segment.ms", 0, "1000")])],
            validate_only=False))
        assert [(n, c) for n, c, _ in got] == [(topic, invalid_request)] * 2, got
        got = codes(AlterConfigsRequest(resources=[(2, topic, [("retention.ms", None)])],
                                        validate_only=False))
        assert [(n, c) for n, c, _ in got] == [(topic, invalid_request)], got
        for n in nodes(broker):
            assert own_configs(n.bootstrap, topic) == {"retention.ms": "3600000"}
    finally:
        a.close()
