"""Metadata and FindCoordinator, one handler over both backends (issue #34:
cluster mode had its own copies, which served the coordinators' internal
names as ordinary topics). Both requests by hand, so that every field of
the answer is seen, against local mode and against each of three cluster
brokers: the same codes, the same brokers, the same cluster id and the same
coordinator whichever broker is asked."""

from confluent_kafka.admin import AdminClient, NewTopic

from clients import unique_topic
from conftest import both_modes
from kafka_wire import (API_FIND_COORDINATOR, API_METADATA, Conn, Reader, compact_array,
                        compact_string, frame, i8, i32, request_header_v1, request_header_v2,
                        string, uvarint)

UNKNOWN_TOPIC, INVALID_TOPIC, INVALID_REQUEST = 3, 17, 42


def metadata_v4(host, port, topics, allow_auto_create):
    """Metadata v4 for `topics` (None: every topic). Returns (brokers
    {id: (host, port)}, cluster_id, controller_id, {name: (error_code,
    {partition: (error_code, leader)})})."""
    cid = 31
    body = i32(-1) if topics is None else i32(len(topics)) + b"".join(string(t) for t in topics)
    body += i8(1 if allow_auto_create else 0)
    with Conn(host, port, timeout=30) as c:
        c.send(frame(request_header_v1(API_METADATA, 4, cid) + body))
        r = Reader(c.recv_response(cid))
    r.i32()                                   # throttle_time_ms
    brokers = {}
    for _ in range(r.i32()):
        node, bhost, bport = r.i32(), r.string(), r.i32()
        r.string()                            # rack
        brokers[node] = (bhost, bport)
    cluster_id, controller = r.string(), r.i32()
    out = {}
    for _ in range(r.i32()):
        code, name = r.i16(), r.string()
        r.take(1)                             # is_internal
        parts = {}
        for _ in range(r.i32()):
            pcode, index, leader = r.i16(), r.i32(), r.i32()
            for _ in range(2):                # replicas, isr
                for _ in range(r.i32()):
                    r.i32()
            parts[index] = (pcode, leader)
        out[name] = (code, parts)
    assert r.remaining() == 0, "trailing bytes in Metadata v4"
    return brokers, cluster_id, controller, out


def find_coordinators_v4(host, port, key_type, keys):
    """FindCoordinator v4 (the batched, flexible version). Returns {key:
    (error_code, node_id, host, port)}."""
    cid = 32
    body = i8(key_type) + compact_array([compact_string(k) for k in keys]) + uvarint(0)
    with Conn(host, port, timeout=30) as c:
        c.send(frame(request_header_v2(API_FIND_COORDINATOR, 4, cid) + body))
        r = Reader(c.recv_response(cid))
    r.tagged()                                # response header v1
    r.i32()                                   # throttle_time_ms

    def coordinator():
        key, node = r.compact_string(), r.i32()
        chost, cport, code = r.compact_string(), r.i32(), r.i16()
        r.compact_string()                    # error_message
        r.tagged()
        return key, (code, node, chost, cport)
    got = dict(r.array(coordinator))
    r.tagged()
    return got


def every_broker(broker):
    return getattr(broker, "brokers", None) or [broker]


@both_modes()
def test_metadata_answers_alike_through_every_broker(broker):
    t = unique_topic("md")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(t, num_partitions=3, replication_factor=1)])[t].result(30)
    missing = unique_topic("md-missing")
    answers = []
    for b in every_broker(broker):
        brokers, cluster_id, controller, topics = metadata_v4(
            b.host, b.port, [t, missing, "__consumer_offsets", "__transaction_state"],
            allow_auto_create=False)
        assert len(brokers) == (1 if broker.mode == "local" else 3), brokers
        assert (b.host, b.port) in brokers.values(), (b.port, brokers)
        assert controller in brokers and cluster_id
        assert topics[missing] == (UNKNOWN_TOPIC, {}), topics
        # the coordinators' logs are not topics, in either mode
        assert topics["__consumer_offsets"][0] == INVALID_TOPIC, topics
        assert topics["__transaction_state"][0] == INVALID_TOPIC, topics
        code, parts = topics[t]
        assert code == 0 and sorted(parts) == [0, 1, 2], topics[t]
        assert all(pcode == 0 and leader in brokers for pcode, leader in parts.values()), parts
        answers.append((brokers, cluster_id, parts))
    # every broker names the same brokers, cluster and leaders
    assert all(a == answers[0] for a in answers), answers
    # a missing topic was not created by asking for it without auto-create
    _, _, _, all_topics = metadata_v4(broker.host, broker.port, None, allow_auto_create=False)
    assert t in all_topics and missing not in all_topics, sorted(all_topics)


@both_modes("broker_factory")
def test_metadata_auto_creates_only_where_allowed(broker_factory):
    broker = broker_factory({"num.partitions": 2})
    t = unique_topic("md-auto")
    _, _, _, topics = metadata_v4(broker.host, broker.port, [t], allow_auto_create=True)
    code, parts = topics[t]
    assert code == 0 and sorted(parts) == [0, 1], topics
    # internal names are never auto-created
    _, _, _, topics = metadata_v4(broker.host, broker.port, ["__consumer_offsets"],
                                  allow_auto_create=True)
    assert topics["__consumer_offsets"][0] == INVALID_TOPIC, topics
    off = broker_factory({"auto.create.topics.enable": "false"})
    other = unique_topic("md-off")
    _, _, _, topics = metadata_v4(off.host, off.port, [other], allow_auto_create=True)
    assert topics[other][0] == UNKNOWN_TOPIC, topics


@both_modes()
def test_find_coordinator_names_one_broker_through_every_broker(broker):
    groups = [unique_topic("fc-g") for _ in range(4)]
    txns = [unique_topic("fc-t") for _ in range(4)]
    brokers, _, _, _ = metadata_v4(broker.host, broker.port, [], allow_auto_create=False)
    seen = []
    for b in every_broker(broker):
        got = {}
        for key_type, keys in ((0, groups), (1, txns)):
            for key, (code, node, chost, cport) in find_coordinators_v4(
                    b.host, b.port, key_type, keys).items():
                assert code == 0 and brokers.get(node) == (chost, cport), (key, code, node, brokers)
                got[key] = node
        assert sorted(got) == sorted(groups + txns), got
        seen.append(got)
    assert all(s == seen[0] for s in seen), seen
    bad = find_coordinators_v4(broker.host, broker.port, 7, ["x"])
    assert bad == {"x": (INVALID_REQUEST, -1, "", -1)}, bad
