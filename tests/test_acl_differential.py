"""The same ACL table on Apache Kafka 4.4 (single-node KRaft with
StandardAuthorizer, SCRAM over SASL_PLAINTEXT) and on oncelog: every call a
principal makes through librdkafka must get the same answer from both.

Each broker has a PLAINTEXT listener whose anonymous principal is the super
user (where the topics, the user and the ACLs are made) and a
SASL_PLAINTEXT listener where `dana` (SCRAM-SHA-256) makes the calls. The
table (one principal, allow and deny, literal and prefixed, four resource
types) and the calls are below; the answers are error names ("ok" for none),
compared call by call.
"""

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                   ConfigResource, NewTopic, ResourcePatternType, ResourceType,
                                   ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion)

from conftest import free_port
from jvm import kafka_ref

pytestmark = pytest.mark.timeout(300)

L, P = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
TABLE = [
    (ResourceType.TOPIC, "diff-", P, AclOperation.WRITE, ALLOW),
    (ResourceType.TOPIC, "diff-read", L, AclOperation.READ, ALLOW),
    (ResourceType.TOPIC, "diff-secret", L, AclOperation.WRITE, DENY),
    (ResourceType.GROUP, "diff-g", L, AclOperation.READ, ALLOW),
    (ResourceType.TRANSACTIONAL_ID, "diff-tx", P, AclOperation.WRITE, ALLOW),
    (ResourceType.TOPIC, "diff-conf", L, AclOperation.DESCRIBE_CONFIGS, ALLOW),
]
TOPICS = ["diff-a", "diff-read", "diff-secret", "diff-conf", "other-x"]


def setup(plain):
    a = AdminClient({"bootstrap.servers": plain, "broker.address.family": "v4"})
    for f in a.create_topics([NewTopic(t, 1, 1) for t in TOPICS]).values():
        f.result(60)
    up = UserScramCredentialUpsertion("dana", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192),
                                      b"dana-pw")
    for f in a.alter_user_scram_credentials([up]).values():
        f.result(30)
    acls = [AclBinding(t, n, p, "User:dana", "*", op, perm) for t, n, p, op, perm in TABLE]
    for f in a.create_acls(acls).values():
        f.result(30)
    p = Producer({"bootstrap.servers": plain, "broker.address.family": "v4"})
    p.produce("diff-read", b"r0", partition=0)
    assert p.flush(30) == 0
    # Kafka applies SCRAM users and ACLs through its metadata log: a moment.
    time.sleep(2)



def code_of(fn):
    """The call's error name, "ok", or the answer the call worked out itself."""
    try:
        got = fn()
        return got if isinstance(got, str) else "ok"
    except KafkaException as e:
        return KafkaError(e.args[0].code()).name()


def calls(sasl):
    conf = {"bootstrap.servers": sasl, "broker.address.family": "v4",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "dana", "sasl.password": "dana-pw"}
    out = {}

    def produce(topic, idempotent=False):
        got = []
        p = Producer({**conf, "enable.idempotence": idempotent, "message.timeout.ms": 8000,
                      "acks": "all"})
        p.produce(topic, b"v", partition=0, on_delivery=lambda e, m: got.append(e))
        p.flush(12)
        if not got:
            return "no delivery report"
        return "ok" if got[0] is None else got[0].name()
    for t in ("diff-a", "diff-secret", "other-x"):
        out[f"produce {t}"] = produce(t)
    out["idempotent produce diff-a"] = produce("diff-a", idempotent=True)

    def txn(tid, topic):
        # A refused AddPartitionsToTxn fails the transaction and its records.
        # Which of the two commit_transaction reports first is a race inside
        # librdkafka (with either broker): the refusal itself, or _INCONSISTENT
        # ("N message(s) failed delivery (see individual delivery reports)").
        # In the second case the broker's answer is in the delivery report.
        got = []
        p = Producer({**conf, "transactional.id": tid, "message.timeout.ms": 8000})
        p.init_transactions(15)
        p.begin_transaction()
        p.produce(topic, b"t", partition=0, on_delivery=lambda e, m: got.append(e))
        try:
            p.commit_transaction(15)
            return "ok"
        except KafkaException as e:
            code = e.args[0].code()
            if code == KafkaError._INCONSISTENT:
                p.poll(0)
                failed = [d for d in got if d is not None]
                assert failed, f"{tid}: commit says records failed, yet no delivery report did"
                return failed[0].name()
            return KafkaError(code).name()
    out["txn diff-tx-1 -> diff-a"] = code_of(lambda: txn("diff-tx-1", "diff-a"))
    out["txn other-tx -> diff-a"] = code_of(lambda: txn("other-tx", "diff-a"))
    out["txn diff-tx-2 -> other-x"] = code_of(lambda: txn("diff-tx-2", "other-x"))

    a = AdminClient(conf)
    out["metadata"] = ",".join(sorted(t for t in a.list_topics(timeout=20).topics if t in TOPICS))

    def consume(group, topic):
        c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
        try:
            c.subscribe([topic])
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is None:
                    continue
                if m.error():
                    raise KafkaException(m.error())
                c.commit(message=m, asynchronous=False)
                return
            raise AssertionError("nothing read")
        finally:
            c.close()
    out["consume diff-read in diff-g"] = code_of(lambda: consume("diff-g", "diff-read"))
    out["consume diff-read in other-g"] = code_of(lambda: consume("other-g", "diff-read"))

    out["create topic diff-new"] = code_of(
        lambda: [f.result(20) for f in a.create_topics([NewTopic("diff-new", 1, 1)]).values()])
    out["delete topic diff-a"] = code_of(lambda: [f.result(20) for f in a.delete_topics(["diff-a"]).values()])
    for t in ("diff-conf", "diff-a"):
        out[f"describe configs {t}"] = code_of(
            lambda t=t: [f.result(20) for f in a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t)]).values()])
    out["create acl"] = code_of(lambda: [f.result(20) for f in a.create_acls([AclBinding(
        ResourceType.TOPIC, "x", L, "User:dana", "*", AclOperation.ALL, ALLOW)]).values()])
    up = UserScramCredentialUpsertion("eve", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"pw")
    out["alter scram"] = code_of(lambda: [f.result(20) for f in a.alter_user_scram_credentials([up]).values()])
    return out


@pytest.fixture(scope="module")
def kafka_answers(tmp_path_factory):
    why = kafka_ref.unavailable()
    if why:
        pytest.fail(f"Apache Kafka reference broker unavailable: {why}", pytrace=False)
    port, sasl_port = free_port(), free_port()
    k = kafka_ref.KafkaBroker(str(tmp_path_factory.mktemp("kafka-acl")), port=port, heap="512m", configs={
        "listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port},CONTROLLER://127.0.0.1:{{controller}}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        "transaction.state.log.num.partitions": "1",
        "offsets.topic.num.partitions": "1",
    })
    k.extra["listeners"] = k.extra["listeners"].replace("{controller}", str(k.controller_port))
    k.start()
    try:
        setup(k.bootstrap)
        yield calls(f"127.0.0.1:{sasl_port}")
    finally:
        k.stop()


def test_same_answers_as_kafka(kafka_answers, broker_factory):
    sasl_port = free_port()
    b = broker_factory(start=False)
    b.overrides.update({
        "listeners": f"PLAINTEXT://127.0.0.1:{b.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
    })
    b.start()
    setup(b.bootstrap)
    ours = calls(f"127.0.0.1:{sasl_port}")
    print("call".ljust(36), "kafka".ljust(36), "oncelog")
    for k in kafka_answers:
        print(k.ljust(36), str(kafka_answers[k]).ljust(36), ours.get(k))
    differ = {k: (kafka_answers[k], ours.get(k)) for k in kafka_answers if kafka_answers[k] != ours.get(k)}
    assert not differ, f"answers differ (kafka, oncelog): {differ}"
    # The table denies as well as allows.
    assert sum(v != "ok" for v in ours.values()) >= 6
