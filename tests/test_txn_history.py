"""What an operator debugging a zombie producer sees, with real librdkafka
clients against a real broker: `oncelog txn describe` shows every epoch and
every fence of a transactional id (cause, old -> new epoch, the fencing
client's client.id and address; served from the broker's HTTP port), the
zombie's late write is refused, logged with its transactional id and counted
in /metrics; `oncelog txn abort` of nothing fails with "nothing open";
`oncelog group describe` shows members and their decoded assignments and
fails for an unknown group.

Every test runs in both modes: in cluster mode the history is the
cluster's (rows in PostgreSQL), so any broker's HTTP port answers it."""

import json
import re
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaException

from clients import cli, consumer_config, create_topic, metric, txn_producer, unique_topic
from conftest import both_modes, free_port, wait_until

PEER = re.compile(r"^127\.0\.0\.1:\d+$")


def describe(b, tid, json_out=True):
    return cli(b, "txn", "describe", tid, "--admin", b.admin, json_out=json_out)[0]


@pytest.fixture
def hb(broker_factory):
    """A broker whose HTTP port (metrics and histories) is a free port; a
    cluster (each broker has its own), asked through its first broker."""
    if getattr(broker_factory, "__name__", "") == "make":  # cluster mode
        b = broker_factory({"group.initial.rebalance.delay.ms": 0})
        b.admin = b.metrics_url
        return b
    port = free_port()
    b = broker_factory({"metrics.listen": f"127.0.0.1:{port}",
                        "group.initial.rebalance.delay.ms": 0})
    b.admin = f"http://127.0.0.1:{port}"
    return b


def in_cluster(b):
    return getattr(b, "mode", "local") == "cluster"


def settled_history(b, tid, ready):
    """`oncelog txn describe` once its history satisfies `ready`: in cluster
    mode each broker writes its notes a moment after the event (the
    history is eventually the same through every broker)."""
    return wait_until(lambda: (lambda d: d if ready(d["history"]) else None)(describe(b, tid)),
                      10, interval=0.2, what=f"the history of {tid}")


def late_write(p, topic):
    """The zombie's write after it was fenced: must fail (librdkafka may
    raise the fatal error out of flush)."""
    errors = []
    p.produce(topic, value=b"late", partition=0, on_delivery=lambda err, msg: errors.append(err))
    try:
        p.flush(30)
    except (KafkaException, SystemError) as e:
        errors.append(e)
    assert errors and errors[0] is not None, "the zombie's late write was accepted"


def rejected_lines(b, tid):
    return [x for x in b.log_text().splitlines()
            if "produce rejected" in x and f'transactional_id="{tid}"' in x]


@pytest.mark.timeout(120)
@both_modes("broker_factory")
def test_two_fences_by_newer_producers(hb):
    topic = unique_topic("zh")
    create_topic(hb.bootstrap, topic)
    tid = "fare-writer-" + topic
    a = txn_producer(hb.bootstrap, tid, **{"client.id": "writer-a"})
    a.init_transactions(30)
    a.begin_transaction()
    a.produce(topic, value=b"trip-9001", partition=0)
    a.flush(30)

    b = txn_producer(hb.bootstrap, tid, **{"client.id": "fencer-b"})
    b.init_transactions(30)
    late_write(a, topic)

    # The refusal names the transactional id and is counted once per batch.
    lines = rejected_lines(hb, tid)
    assert len(lines) >= 1, hb.log_tail()
    assert "epoch=0" in lines[0] and "older than the current epoch 1" in lines[0], lines[0]
    assert metric(hb, "oncelog_rejected_zombie_writes_total", transactional_id=tid) == len(lines)

    b.begin_transaction()
    b.produce(topic, value=b"trip-9002", partition=0)
    b.flush(30)
    c = txn_producer(hb.bootstrap, tid, **{"client.id": "fencer-c"})
    c.init_transactions(30)

    d = settled_history(hb, tid, lambda h: len(h["fences"]) == 2 and len(h["events"]) == 8
                        and h["events"][4]["count"] == len(lines))
    assert (d["state"], d["producer_epoch"]) == ("CompleteAbort", 2)
    h = d["history"]
    assert h["tracked"] is True and h["persisted"] is in_cluster(hb)
    fences = h["fences"]
    assert [(f["cause"], f["old_epoch"], f["new_epoch"], f["client_id"], f["open_transaction"],
             f["aborted_partitions"]) for f in fences] == [
        ("newer_producer", 0, 1, "fencer-b", True, [f"{topic}-0"]),
        ("newer_producer", 1, 2, "fencer-c", True, [f"{topic}-0"]),
    ]
    assert all(PEER.match(f["peer"]) for f in fences), fences
    assert fences[0]["peer"] != fences[1]["peer"], "two clients, two connections"
    assert fences[0]["time_ms"] <= fences[1]["time_ms"]
    assert all(f["producer_id"] == d["producer_id"] for f in fences)

    epochs = h["epochs"]
    assert [(e["epoch"], e["via"], e["client_id"], e["ended_by"]) for e in epochs] == [
        (0, "init", "writer-a", "newer_producer"),
        (1, "newer_producer", "fencer-b", "newer_producer"),
        (2, "newer_producer", "fencer-c", None),
    ]
    assert epochs[1]["peer"] == fences[0]["peer"] and epochs[2]["peer"] == fences[1]["peer"]
    assert all(PEER.match(e["peer"]) for e in epochs)

    kinds = [(e["event"], e["epoch"], e.get("old_epoch")) for e in h["events"]]
    assert kinds == [
        ("init", 0, None), ("begin", 0, None),
        ("fence", 1, 0), ("abort", 1, None), ("rejected_write", 0, None),
        ("begin", 1, None),
        ("fence", 2, 1), ("abort", 2, None),
    ], kinds
    rejected = h["events"][4]
    assert rejected["partitions"] == [f"{topic}-0"] and rejected["count"] == len(lines)
    # the zombie's late write names the zombie's own client
    assert rejected["client_id"] == "writer-a" and PEER.match(rejected["peer"]), rejected
    assert h["events"][1]["client_id"] == "writer-a" and h["events"][5]["client_id"] == "fencer-b"

    table = describe(hb, tid, json_out=False)
    fence_rows = [x.split() for x in table.splitlines() if "newer_producer" in x and "fencer-" in x
                  and ("0 -> 1" in x or "1 -> 2" in x)]
    assert len(fence_rows) >= 2, table
    if in_cluster(hb):
        assert "history kept in the cluster's database since" in table
    else:
        assert "history kept in memory since" in table

    hist = cli(hb, "txn", "history", tid, "--admin", hb.admin)[0]
    assert hist["events"] == h["events"]
    hist_table = cli(hb, "txn", "history", tid, "--admin", hb.admin, json_out=False)[0]
    assert hist_table.splitlines()[0].split()[:3] == ["TIME", "EVENT", "PRODUCER-ID"]
    assert sum("rejected_write" in x for x in hist_table.splitlines()) == 1


@pytest.mark.timeout(120)
@both_modes("broker_factory")
def test_timeout_fence_and_the_late_write_after_it(hb):
    topic = unique_topic("zt")
    create_topic(hb.bootstrap, topic)
    tid = "slow-" + topic
    p = txn_producer(hb.bootstrap, tid, **{"client.id": "slow-writer", "transaction.timeout.ms": 1500,
                                          "message.timeout.ms": 1500})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"slow", partition=0)
    p.flush(30)
    wait_until(lambda: describe(hb, tid)["state"] == "CompleteAbort", 20, interval=0.3,
               what="the timeout abort")
    h = settled_history(hb, tid, lambda h: len(h["events"]) == 4)["history"]
    assert [(f["cause"], f["old_epoch"], f["new_epoch"], f["client_id"], f["peer"], f["open_transaction"])
            for f in h["fences"]] == [("timeout", 0, 1, None, None, True)]
    assert [(e["epoch"], e["via"], e["client_id"]) for e in h["epochs"]] == [
        (0, "init", "slow-writer"), (1, "timeout", None)]
    assert [e["event"] for e in h["events"]] == ["init", "begin", "fence", "abort"]
    assert metric(hb, "oncelog_transaction_fences_total", transactional_id=tid, cause="timeout") == 1
    assert metric(hb, "oncelog_rejected_zombie_writes_total", transactional_id=tid) is None

    late_write(p, topic)
    n = len(rejected_lines(hb, tid))
    assert n >= 1
    assert metric(hb, "oncelog_rejected_zombie_writes_total", transactional_id=tid) == n


@both_modes("broker_factory")
def test_history_unavailable_still_describes(hb):
    topic = unique_topic("zu")
    create_topic(hb.bootstrap, topic)
    tid = "plain-" + topic
    p = txn_producer(hb.bootstrap, tid)
    p.init_transactions(30)
    closed = f"http://127.0.0.1:{free_port()}"
    d = cli(hb, "txn", "describe", tid, "--admin", closed)[0]
    assert (d["state"], d["producer_epoch"], d["history"]) == ("Empty", 0, None)
    assert closed.removeprefix("http://") in d["history_unavailable"]
    table = cli(hb, "txn", "describe", tid, "--admin", closed, json_out=False)[0]
    assert table.splitlines()[1].split()[:2] == [tid, "Empty"]
    assert "history: unavailable" in table
    r = cli(hb, "txn", "history", tid, "--admin", closed, check=False)[1]
    assert r.returncode == 1 and r.stderr.startswith("error: GET "), r.stderr
    # An id the broker never saw has an empty history, not an error.
    d = cli(hb, "txn", "describe", tid, "--admin", hb.admin)[0]
    assert d["history"]["tracked"] is True
    unknown = urllib.request.urlopen(f"{hb.admin}/v1/transactions/no%2Fsuch/history", timeout=10)
    body = json.loads(unknown.read())
    assert (body["transactional_id"], body["tracked"], body["events"]) == ("no/such", False, [])


@both_modes("broker_factory")
def test_abort_of_nothing_open_fails(hb):
    topic = unique_topic("za")
    create_topic(hb.bootstrap, topic)
    _, r = cli(hb, "txn", "abort", topic, "0", "--producer-id", "424242", "--producer-epoch", "0",
               check=False)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("error: nothing open: producer 424242"), r.stderr

    tid = "hanging-" + topic
    p = txn_producer(hb.bootstrap, tid)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"x", partition=0)
    p.flush(30)
    [prod] = cli(hb, "txn", "producers", topic, "0")[0]
    args = ("txn", "abort", topic, "0", "--producer-id", str(prod["producer_id"]),
            "--producer-epoch", str(prod["epoch"]))
    done = cli(hb, *args)[0]
    assert done["aborted"] == {"topic": topic, "partition": 0, "producer_id": prod["producer_id"],
                               "transactional_id": tid}
    again = cli(hb, *args, check=False)[1]
    assert again.returncode == 1 and "nothing open" in again.stderr, again.stderr
    h = settled_history(hb, tid, lambda h: len(h["fences"]) == 1)["history"]
    assert [(f["cause"], f["old_epoch"], f["new_epoch"], f["client_id"]) for f in h["fences"]] == [
        ("administrator", 0, 1, "oncelog-cli")]
    assert PEER.match(h["fences"][0]["peer"])


@pytest.mark.timeout(120)
@both_modes("broker_factory")
def test_group_describe_shows_members_and_assignments(hb):
    topic = unique_topic("zg")
    create_topic(hb.bootstrap, topic, partitions=2)
    group = "g-" + topic
    c = Consumer(consumer_config(hb.bootstrap, **{"group.id": group, "client.id": "member-x",
                                                  "group.instance.id": "inst-1",
                                                  "auto.offset.reset": "earliest",
                                                  "session.timeout.ms": 10000}))
    try:
        c.subscribe([topic])
        wait_until(lambda: (c.poll(0.2), len(c.assignment()) == 2)[1], 30, what="an assignment")
        d = cli(hb, "group", "describe", group)[0]
        assert (d["state"], d["protocol_type"], d["protocol"]) == ("Stable", "consumer", "range")
        assert d["members"] == [{
            "member_id": c.memberid(), "client_id": "member-x", "host": "/127.0.0.1",
            "instance_id": "inst-1", "assignment": [{"topic": topic, "partitions": [0, 1]}],
        }]
        table = cli(hb, "group", "describe", group, json_out=False)[0]
        lines = table.splitlines()
        assert lines[1].split() == ["MEMBER-ID", "CLIENT-ID", "HOST", "INSTANCE-ID", "ASSIGNMENT"]
        assert lines[2].split() == [c.memberid(), "member-x", "/127.0.0.1", "inst-1",
                                    f"{topic}-0,{topic}-1"]
    finally:
        c.close()


@both_modes("broker_factory")
def test_group_describe_of_unknown_group_fails(hb):
    r = cli(hb, "group", "describe", "no-such-group", check=False)[1]
    assert (r.returncode, r.stdout, r.stderr) == (1, "", "error: group no-such-group does not exist\n")
    r = cli(hb, "group", "describe", "no-such-group", json_out=False, check=False)[1]
    assert (r.returncode, r.stderr) == (1, "error: group no-such-group does not exist\n")
