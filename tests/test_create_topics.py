"""CreateTopics, one handler over both backends (issue #34: its refusals and
its answer's configs were local mode's only). CreateTopics v7 by hand, so
that every field of the answer is seen: the same refusals with the same
codes in local mode and on three cluster brokers, and from v5 the topic's
configs with their sources, its id, partitions and replication factor."""

from confluent_kafka.admin import AdminClient

from clients import unique_topic
from conftest import both_modes
from kafka_wire import create_topics_v7

INVALID_TOPIC, TOPIC_EXISTS, INVALID_PARTITIONS = 17, 36, 37
INVALID_RF, INVALID_ASSIGNMENT, INVALID_CONFIG, INVALID_REQUEST = 38, 39, 40, 42
SOURCE_TOPIC, SOURCE_DEFAULT = 1, 5


@both_modes()
def test_create_topics_refuses_alike_and_answers_with_configs(broker):
    ids = sorted(AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=30).brokers)
    n = len(ids)
    assert n == (1 if broker.mode == "local" else 3)
    t = unique_topic("ct")
    asked = [
        {"name": f"{t}-a", "partitions": 2, "configs": {"retention.ms": "60000"}},
        {"name": f"{t}-dup"}, {"name": f"{t}-dup"},
        {"name": f"{t}-rf-many", "replication_factor": n + 1},
        {"name": f"{t}-rf-zero", "replication_factor": 0},
        {"name": f"{t}-rf-all", "partitions": 1, "replication_factor": n},
        {"name": f"{t}-asg-stranger", "assignments": {0: [999]}},
        {"name": f"{t}-asg-gap", "assignments": {1: [ids[0]]}},
        {"name": f"{t}-asg-twice", "assignments": {0: [ids[0], ids[0]]}},
        {"name": f"{t}-asg-and-count", "partitions": 1, "assignments": {0: [ids[0]]}},
        {"name": f"{t}-asg", "assignments": {0: [ids[0]], 1: [ids[-1]]}},
        {"name": "__consumer_offsets"},
        {"name": "bad/name"},
        {"name": f"{t}-p0", "partitions": 0},
        {"name": f"{t}-cfg", "configs": {"cleanup.policy": "shred"}},
    ]
    got = create_topics_v7(broker.host, broker.port, asked)
    codes = [(g["name"], g["error_code"]) for g in got]
    assert codes == [
        (f"{t}-a", 0),
        (f"{t}-dup", INVALID_REQUEST), (f"{t}-dup", INVALID_REQUEST),
        (f"{t}-rf-many", INVALID_RF),
        (f"{t}-rf-zero", INVALID_RF),
        (f"{t}-rf-all", 0),
        (f"{t}-asg-stranger", INVALID_ASSIGNMENT),
        (f"{t}-asg-gap", INVALID_ASSIGNMENT),
        (f"{t}-asg-twice", INVALID_ASSIGNMENT),
        (f"{t}-asg-and-count", INVALID_REQUEST),
        (f"{t}-asg", 0),
        ("__consumer_offsets", INVALID_TOPIC),
        ("bad/name", INVALID_TOPIC),
        (f"{t}-p0", INVALID_PARTITIONS),
        (f"{t}-cfg", INVALID_CONFIG),
    ], codes
    rf = next(g for g in got if g["name"] == f"{t}-rf-many")
    assert f"larger than the {n} available broker" in rf["error_message"], rf
    a = got[0]
    assert a["num_partitions"] == 2 and a["replication_factor"] == 1 and int(a["topic_id"], 16) != 0
    assert a["configs"]["retention.ms"] == ("60000", SOURCE_TOPIC)
    assert a["configs"]["cleanup.policy"] == ("delete", SOURCE_DEFAULT)
    assert next(g for g in got if g["name"] == f"{t}-asg")["num_partitions"] == 2
    for g in got:
        if g["error_code"]:
            assert not g["configs"] and g["error_message"], g  # no configs (null or empty)
    # again: it exists; validate_only creates nothing
    again = create_topics_v7(broker.host, broker.port, [{"name": f"{t}-a"}])
    assert again[0]["error_code"] == TOPIC_EXISTS
    dry = create_topics_v7(broker.host, broker.port, [{"name": f"{t}-dry", "partitions": 3}],
                           validate_only=True)
    assert dry[0]["error_code"] == 0 and dry[0]["num_partitions"] == 3
    listed = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=30).topics
    assert f"{t}-a" in listed and f"{t}-asg" in listed and f"{t}-rf-all" in listed
    assert f"{t}-dry" not in listed and f"{t}-dup" not in listed and f"{t}-cfg" not in listed


@both_modes()
def test_delete_topics_alike_and_takes_the_groups_offsets(broker):
    """DeleteTopics, one handler in both modes: a deleted topic's committed
    offsets go with it (a topic made again under its name starts afresh);
    an unknown topic and the broker's own are refused."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import NewTopic

    from clients import committed_offsets, group_consumer
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    t = unique_topic("dt")
    for f in a.create_topics([NewTopic(t, 1, 1)]).values():
        f.result(30)
    c = group_consumer(broker.bootstrap, f"{t}-g")
    try:
        c.commit(offsets=[TopicPartition(t, 0, 0)], asynchronous=False)
    finally:
        c.close()
    assert committed_offsets(broker.bootstrap, f"{t}-g", t, [0]) == {0: 0}
    for f in a.delete_topics([t]).values():
        f.result(30)
    codes = {}
    for name, f in a.delete_topics([t, "__consumer_offsets"]).items():
        try:
            f.result(30)
            codes[name] = "ok"
        except KafkaException as e:
            codes[name] = e.args[0].name()
    assert codes == {t: "UNKNOWN_TOPIC_OR_PART",
                     "__consumer_offsets": "TOPIC_AUTHORIZATION_FAILED"}, codes
    for f in a.create_topics([NewTopic(t, 1, 1)]).values():
        f.result(30)
    assert committed_offsets(broker.bootstrap, f"{t}-g", t, [0]) == {0: -1001}


@both_modes()
def test_create_partitions_alike_and_every_broker_sees_them(broker):
    """CreatePartitions, one handler in both modes (cluster mode did not
    serve it): a topic grows and its new partitions take records; a count
    that is not an increase, one past max.partitions.per.topic, an
    assignment naming a stranger and the broker's own topics are refused;
    validate_only changes nothing; every broker names the new partitions."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewPartitions, NewTopic

    from clients import produce, read_all
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    t = unique_topic("cp")
    a.create_topics([NewTopic(t, 2, 1)])[t].result(30)

    def grow(count, **kw):
        validate = kw.pop("validate_only", False)
        f = a.create_partitions([NewPartitions(t if "topic" not in kw else kw.pop("topic"),
                                               count, **kw)],
                                validate_only=validate)
        try:
            list(f.values())[0].result(30)
            return "ok", ""
        except KafkaException as e:
            return e.args[0].name(), e.args[0].str()

    assert grow(5, validate_only=True) == ("ok", "")
    assert grow(4) == ("ok", "")
    code, why = grow(4)
    assert code == "INVALID_PARTITIONS" and "would not be an increase" in why, (code, why)
    code, why = grow(100000)
    assert code == "INVALID_PARTITIONS" and "max.partitions.per.topic" in why, (code, why)
    code, _ = grow(5, replica_assignment=[[999]])
    assert code == "INVALID_REPLICA_ASSIGNMENT", code
    assert grow(4, topic="__consumer_offsets")[0] == "TOPIC_AUTHORIZATION_FAILED"
    for b in getattr(broker, "brokers", None) or [broker]:
        seen = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(t, timeout=30)
        assert sorted(seen.topics[t].partitions) == [0, 1, 2, 3], (b.port, seen.topics[t])
    produce(broker.bootstrap, t, [b"on-three"], partition=3)
    assert read_all(broker.bootstrap, t, 3) == [b"on-three"]
