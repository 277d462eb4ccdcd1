"""ACLs on a real `oncelog serve` (issue #16, second part): Kafka's
`kafka-acls` tool manages them, and principals that authenticate with SCRAM
over SASL_PLAINTEXT are allowed and denied per API as Kafka's authorizer
would, with Kafka's errors.

Each broker has `authorizer.class.name` set, a PLAINTEXT listener on
loopback whose anonymous principal is the super user (the operator's door,
where users and ACLs are made), and a SASL_PLAINTEXT listener the
principals under test use. What is proven, with librdkafka clients:

* kafka-acls adds, lists and removes ACLs (literal and prefixed, the
  --producer and --consumer conveniences); they survive kill -9.
* WRITE on a topic without a TRANSACTIONAL_ID ACL: the transactional
  producer fails with TRANSACTIONAL_ID_AUTHORIZATION_FAILED and nothing is
  written. A PREFIXED TRANSACTIONAL_ID ACL `orders-sink` admits
  `orders-sink-0-7` and, being a plain string prefix as in Kafka, also
  `orders-sink-v2-0-7`; the writer fence (`writer.transactional.id.prefix`)
  tells those two jobs apart.
* A principal with exactly one ACL (READ on one topic): Metadata shows only
  that topic; it may fetch by assignment but not produce, join or commit a
  group, create topics, or describe ACLs; a group ACL lets it commit; a
  DENY overrides an ALLOW.
* A transactional copier needs READ on its input and group, WRITE on its
  output and transactional id; without the group ACL its
  sendOffsetsToTransaction fails with GROUP_AUTHORIZATION_FAILED.
* Without an authorizer the ACL APIs answer SECURITY_DISABLED.
"""

import shutil
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,
                                   AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewTopic, ResourcePatternType, ResourceType)

from clients import create_topic, end_offset, read_all, scrape, unique_topic, value
from conftest import REPO_ROOT, free_port, oncelog_bin, wait_until

KAFKA_LIB = REPO_ROOT / ".tools" / "kafka-lib"
ACL_TOOL = "org.apache.kafka.tools.AclCommand"
WRITER = "writer.transactional.id.prefix"

# Every test runs against local mode and against three cluster brokers,
# whose ACLs and credentials are the cluster's (PostgreSQL rows).
pytestmark = [pytest.mark.timeout(240),
              pytest.mark.parametrize("broker_factory", ["local", "cluster"], indirect=True)]


class AclBroker:
    """One broker, or each broker of a cluster, with the two listeners."""

    def __init__(self, broker_factory, authorizer=True):
        self.b = broker_factory(start=False)
        self.nodes = getattr(self.b, "brokers", [self.b])
        sasl = []
        for n in self.nodes:
            port = free_port()
            sasl.append(f"127.0.0.1:{port}")
            n.overrides["listeners"] = (f"PLAINTEXT://127.0.0.1:{n.port},"
                                        f"SASL_PLAINTEXT://127.0.0.1:{port}")
            if authorizer:
                n.overrides["authorizer.class.name"] = \
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                n.overrides["super.users"] = "User:ANONYMOUS"
        self.b.start()
        self.plain = self.b.bootstrap
        self.sasl = ",".join(sasl)
        self.admin = AdminClient({"bootstrap.servers": self.plain, "broker.address.family": "v4"})

    def settle(self):
        """A cluster's brokers take a change of the ACLs or credentials at
        their next read of the cluster's rows (announced; at the latest
        every 500 ms): wait that long, so the next client may reach any."""
        if len(self.nodes) > 1:
            time.sleep(0.6)

    def user(self, name):
        p = subprocess.run([str(oncelog_bin()), "user", "create", name, "--password", f"{name}-pw",
                            "--mechanism", "SCRAM-SHA-256", "--bootstrap", self.plain],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        self.settle()
        return name

    def conf(self, user, **extra):
        return {"bootstrap.servers": self.sasl, "broker.address.family": "v4",
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": user, "sasl.password": f"{user}-pw", **extra}

    def allow(self, user, rtype, name, op, pattern=ResourcePatternType.LITERAL, deny=False):
        perm = AclPermissionType.DENY if deny else AclPermissionType.ALLOW
        b = AclBinding(rtype, name, pattern, f"User:{user}", "*", op, perm)
        for f in self.admin.create_acls([b]).values():
            f.result(30)
        self.settle()

    def acl_tool(self, *args, check=True):
        if shutil.which("java") is None:
            pytest.fail("java not found on PATH", pytrace=False)
        argv = ["java", "-Xmx256m", "-cp", f"{KAFKA_LIB}/*", ACL_TOOL,
                "--bootstrap-server", self.plain, *args]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if check:
            assert p.returncode == 0, f"kafka-acls {args}: {p.returncode}\n{p.stdout}\n{p.stderr[-2000:]}"
        return p

    def denials(self, rtype):
        """Denials of `rtype` counted by every broker."""
        total = 0
        for n in self.nodes:
            port = int(n.overrides["metrics.listen"].rsplit(":", 1)[1])
            total += value(scrape(port), "oncelog_authorization_denials_total",
                           resource_type=rtype) or 0
        return total


@pytest.fixture
def ab(broker_factory):
    return AclBroker(broker_factory)


def kafka_error(action):
    with pytest.raises(KafkaException) as e:
        action()
    return e.value.args[0]


def txn_write(conf, tid, topic, values):
    p = Producer({**conf, "transactional.id": tid, "message.timeout.ms": 10000})
    p.init_transactions(20)
    p.begin_transaction()
    for v in values:
        p.produce(topic, value=v.encode(), partition=0)
    p.commit_transaction(20)


@pytest.mark.skipif(not sorted(KAFKA_LIB.glob("kafka-tools-[0-9]*.jar")),
                    reason="no kafka-tools jar (test.sh fetches it)")
def test_kafka_acls_adds_lists_and_removes(ab):
    ab.acl_tool("--add", "--allow-principal", "User:alice", "--producer", "--topic", "orders",
                "--transactional-id", "orders-sink", "--resource-pattern-type", "prefixed")
    ab.acl_tool("--add", "--allow-principal", "User:bob", "--consumer", "--topic", "orders",
                "--group", "readers")
    ab.acl_tool("--add", "--deny-principal", "User:mallory", "--operation", "All", "--topic", "*")
    out = ab.acl_tool("--list").stdout
    for want in ["name=orders, patternType=PREFIXED", "name=orders-sink, patternType=PREFIXED",
                 "name=readers, patternType=LITERAL", "principal=User:bob", "operation=READ",
                 "principal=User:mallory", "permissionType=DENY"]:
        assert want in out, f"{want!r} not in:\n{out}"
    ab.b.kill9()
    ab.b.start()
    out = ab.acl_tool("--list", "--topic", "orders", "--resource-pattern-type", "prefixed").stdout
    assert "User:alice" in out and "WRITE" in out, out
    ab.acl_tool("--remove", "--force", "--deny-principal", "User:mallory", "--operation", "All",
                "--topic", "*")
    out = ab.acl_tool("--list").stdout
    assert "mallory" not in out and "User:bob" in out, out


def test_transactional_write_needs_the_transactional_id_acl(ab):
    alice = ab.user("alice")
    topic = unique_topic("orders")
    create_topic(ab.plain, topic)
    ab.allow(alice, ResourceType.TOPIC, topic, AclOperation.WRITE)
    err = kafka_error(lambda: txn_write(ab.conf(alice), "orders-sink-0-7", topic, ["x"]))
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, err
    assert end_offset(ab.plain, topic) == 0
    assert ab.denials("transactional_id") >= 1

    # A PREFIXED ACL: a plain string prefix, as in Kafka.
    ab.allow(alice, ResourceType.TRANSACTIONAL_ID, "orders-sink", AclOperation.WRITE,
             pattern=ResourcePatternType.PREFIXED)
    txn_write(ab.conf(alice), "orders-sink-0-7", topic, ["blue-1"])
    txn_write(ab.conf(alice), "orders-sink-v2-0-7", topic, ["green-1"])
    assert read_all(ab.plain, topic, until="eof", decode=True) == \
        ["blue-1", "green-1"]
    # An id outside the prefix is still refused.
    err = kafka_error(lambda: txn_write(ab.conf(alice), "billing-0-1", topic, ["x"]))
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    # The writer fence tells the two jobs apart: orders-sink-v2 is a writer
    # of its own (Flink's ids end in exactly two number groups).
    p = subprocess.run([str(oncelog_bin()), "topic", "alter-config", topic, "--set",
                        f"{WRITER}=orders-sink", "--bootstrap", ab.plain],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    ab.settle()
    txn_write(ab.conf(alice), "orders-sink-0-8", topic, ["blue-2"])
    err = kafka_error(lambda: txn_write(ab.conf(alice), "orders-sink-v2-0-8", topic, ["green-2"]))
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, err
    assert read_all(ab.plain, topic, until="eof", decode=True) == \
        ["blue-1", "green-1", "blue-2"]


def test_a_principal_with_one_acl(ab):
    bob = ab.user("bob")
    mine, other = unique_topic("mine"), unique_topic("other")
    for t in (mine, other):
        create_topic(ab.plain, t)
    p = Producer({"bootstrap.servers": ab.plain, "broker.address.family": "v4"})
    p.produce(mine, b"m0", partition=0)
    p.produce(other, b"o0", partition=0)
    assert p.flush(20) == 0
    ab.allow(bob, ResourceType.TOPIC, mine, AclOperation.READ)
    conf = ab.conf(bob)

    # Metadata: only the topic bob may describe.
    a = AdminClient(conf)
    topics = set(a.list_topics(timeout=15).topics)
    assert mine in topics and other not in topics, topics
    # Fetch by assignment: allowed on his topic (the other one is not even
    # in his metadata; a fetch refused is shown with the DENY below).
    assert read_all(ab.sasl, mine, until="eof", decode=True, **conf) == ["m0"]
    # Produce: denied, nothing written.
    errs = []
    pr = Producer({**conf, "message.timeout.ms": 5000})
    pr.produce(mine, b"nope", partition=0, on_delivery=lambda err, m: errs.append(err))
    pr.flush(10)
    assert errs and errs[0] is not None and errs[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errs
    assert end_offset(ab.plain, mine) == 1
    # A group: denied until a group ACL.
    def consume_in_group():
        """Subscribes in group `bobs`, reads the record and commits; the
        first error the group reports is raised."""
        c = Consumer({**conf, "group.id": "bobs", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest"})
        try:
            c.subscribe([mine])
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(m.error())
                c.commit(message=m, asynchronous=False)
                return m.value()
            raise AssertionError("nothing read in group bobs")
        finally:
            c.close()
    err = kafka_error(consume_in_group)
    assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, err
    ab.allow(bob, ResourceType.GROUP, "bobs", AclOperation.READ)
    assert consume_in_group() == b"m0"
    # Creating topics and describing ACLs need cluster (or topic) rights.
    fs = a.create_topics([NewTopic(unique_topic("bobs-new"), 1, 1)])
    err = kafka_error(lambda: [f.result(15) for f in fs.values()])
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    b = AclBinding(ResourceType.TOPIC, other, ResourcePatternType.LITERAL, "User:bob", "*",
                   AclOperation.READ, AclPermissionType.ALLOW)
    err = kafka_error(lambda: [f.result(15) for f in a.create_acls([b]).values()])
    assert err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, err
    # Altering the topic's configs needs ALTER_CONFIGS on it.
    res = ConfigResource("topic", mine, incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
    err = kafka_error(lambda: a.incremental_alter_configs([res])[res].result(15))
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    # DescribeAcls is refused too (CLUSTER_AUTHORIZATION_FAILED), but
    # librdkafka drops that response's error code and shows an empty list;
    # the super user sees the ACLs.
    every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    assert a.describe_acls(every).result(15) == []
    assert len(ab.admin.describe_acls(every).result(15)) == 2
    # A DENY of READ overrides the ALLOW (DESCRIBE, implied by the ALLOW,
    # stays: the topic is still in his metadata, and the fetch is refused).
    ab.allow(bob, ResourceType.TOPIC, mine, AclOperation.READ, deny=True)
    with pytest.raises(KafkaException) as e:
        read_all(ab.sasl, mine, until="eof", decode=True, **conf)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert ab.denials("topic") >= 3 and ab.denials("group") >= 1 and ab.denials("cluster") >= 1


def test_transactional_copier_needs_its_group_acl(ab):
    copier = ab.user("copier")
    src, dst = unique_topic("src"), unique_topic("dst")
    for t in (src, dst):
        create_topic(ab.plain, t)
    p = Producer({"bootstrap.servers": ab.plain, "broker.address.family": "v4"})
    for i in range(3):
        p.produce(src, f"in-{i}".encode(), partition=0)
    assert p.flush(20) == 0
    ab.allow(copier, ResourceType.TOPIC, src, AclOperation.READ)
    ab.allow(copier, ResourceType.TOPIC, dst, AclOperation.WRITE)
    ab.allow(copier, ResourceType.TRANSACTIONAL_ID, "copier-", AclOperation.WRITE,
             pattern=ResourcePatternType.PREFIXED)

    def copy_once(group):
        prod = Producer({**ab.conf(copier), "transactional.id": "copier-1"})
        prod.init_transactions(20)
        prod.begin_transaction()
        for v in read_all(ab.sasl, src, until="eof", decode=True, **ab.conf(copier)):
            prod.produce(dst, value=v.encode(), partition=0)
        meta = Consumer({**ab.conf(copier), "group.id": group}).consumer_group_metadata()
        prod.send_offsets_to_transaction([TopicPartition(src, 0, 3)], meta, 20)
        prod.commit_transaction(20)

    err = kafka_error(lambda: copy_once("copiers"))
    assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, err
    ab.allow(copier, ResourceType.GROUP, "copiers", AclOperation.READ)
    copy_once("copiers")
    assert read_all(ab.plain, dst, until="eof", decode=True) == \
        ["in-0", "in-1", "in-2"]
    c = Consumer({"bootstrap.servers": ab.plain, "group.id": "copiers", "broker.address.family": "v4"})
    assert c.committed([TopicPartition(src, 0)], timeout=15)[0].offset == 3
    c.close()


def test_without_an_authorizer_acls_are_refused(broker_factory):
    nb = AclBroker(broker_factory, authorizer=False)
    b = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:a", "*",
                   AclOperation.READ, AclPermissionType.ALLOW)
    err = kafka_error(lambda: [f.result(15) for f in nb.admin.create_acls([b]).values()])
    assert err.code() == KafkaError.SECURITY_DISABLED, err
