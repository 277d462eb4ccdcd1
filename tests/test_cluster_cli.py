"""The CLI against three cluster-mode brokers gives one answer through any of
them (issue #34, point 4): `group list` and `txn list` ask every broker
(each lists what it coordinates), `group describe` and `txn describe` ask
the coordinator, wherever the bootstrap broker is. And an HTTP endpoint of
another cluster is refused instead of being shown as this cluster's."""

import pytest
from confluent_kafka import TopicPartition

from clients import cli, create_topic, group_consumer, produce, txn_producer
from conftest import wait_until

pytestmark = pytest.mark.timeout(180)


def test_group_and_txn_commands_answer_alike_through_every_broker(cluster_factory):
    cl = cluster_factory(store="file", n=3)
    create_topic(cl.bootstrap, "cli-in", 2)
    produce(cl.bootstrap, "cli-in", [b"a", b"b", b"c"], partition=0)
    groups = [f"cli-g{i}" for i in range(4)]
    for g in groups:
        c = group_consumer(cl.bootstrap, g)
        try:
            c.commit(offsets=[TopicPartition("cli-in", 0, 2)], asynchronous=False)
        finally:
            c.close()
    txns = [f"cli-t{i}" for i in range(4)]
    held = []
    for t in txns:
        p = txn_producer(cl.bootstrap, t)
        p.init_transactions(30)
        p.begin_transaction()
        p.produce("cli-in", b"open", partition=1)
        p.flush(30)
        held.append(p)  # open until the test ends
    # One id fenced by a newer producer: its history (served from PostgreSQL
    # by every broker's HTTP port) must name the fence alike everywhere.
    zombie = txn_producer(cl.bootstrap, "cli-fenced", **{"client.id": "zombie"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce("cli-in", b"z", partition=0)
    zombie.flush(30)
    fencer = txn_producer(cl.bootstrap, "cli-fenced", **{"client.id": "fencer"})
    fencer.init_transactions(30)
    fenced = []
    for b in cl.brokers:
        d = wait_until(lambda: (lambda d: d if d["history"] and d["history"]["fences"] else None)(
            cli(b, "txn", "describe", "cli-fenced", admin=b.metrics_url)[0]),
            10, what="the fence in the history")
        fenced.append(d)
    assert [(f["cause"], f["old_epoch"], f["new_epoch"], f["client_id"])
            for f in fenced[0]["history"]["fences"]] == [("newer_producer", 0, 1, "fencer")], fenced[0]
    assert fenced[0]["history"]["persisted"] is True
    for i, d in enumerate(fenced[1:], start=2):
        assert d == fenced[0], (i, {k: (v, fenced[0].get(k)) for k, v in d.items() if v != fenced[0].get(k)})
    answers = []
    for b in cl.brokers:
        glist, _ = cli(b, "group", "list")
        gdesc = {g: cli(b, "group", "describe", g)[0] for g in groups}
        tlist, _ = cli(b, "txn", "list")
        tdesc = {t: cli(b, "txn", "describe", t)[0] for t in txns}
        answers.append((glist, gdesc, tlist, tdesc))
    glist, gdesc, tlist, tdesc = answers[0]
    assert sorted(g["group"] for g in glist) == groups, glist
    assert sorted(t["transactional_id"] for t in tlist) == sorted(txns + ["cli-fenced"]), tlist
    for g in groups:
        assert [(o["topic"], o["partition"], o["committed"]) for o in gdesc[g]["offsets"]] == \
            [("cli-in", 0, 2)], gdesc[g]
    for t in txns:
        assert tdesc[t]["state"] == "Ongoing" and tdesc[t]["partitions"] == ["cli-in-1"], tdesc[t]
    for i, other in enumerate(answers[1:], start=2):
        o_glist, o_gdesc, o_tlist, o_tdesc = other
        assert o_glist == glist, f"broker {i}"
        assert o_tlist == tlist, f"broker {i}"
        for g in groups:
            assert o_gdesc[g]["offsets"] == gdesc[g]["offsets"], f"broker {i}: {g}"
        for t in txns:
            strip = lambda d: {k: v for k, v in d.items() if not k.startswith("history")}  # noqa: E731
            assert strip(o_tdesc[t]) == strip(tdesc[t]), f"broker {i}: {t}"
    for p in held:
        p.abort_transaction(30)


def test_an_http_endpoint_of_another_cluster_is_refused(cluster_factory, broker_factory):
    cl = cluster_factory(store="file", n=2)
    local = broker_factory()
    create_topic(cl.bootstrap, "cli-cut", 1)
    metrics = lambda b: f"http://{b.overrides['metrics.listen']}"  # noqa: E731
    # a cluster broker's endpoint answers for the cluster, through either broker
    for b in cl.brokers:
        for a in cl.brokers:
            got, _ = cli(b, "cutover", "status", admin=metrics(a))
    # the local broker's endpoint is another cluster's
    out, p = cli(cl.brokers[0], "cutover", "status", admin=metrics(local), check=False)
    assert p.returncode != 0
    assert "is the HTTP endpoint of cluster" in p.stderr and cl.brokers[0].bootstrap in p.stderr, p.stderr
    out, p = cli(local, "txn", "history", "some-id", admin=metrics(cl.brokers[1]), check=False)
    assert p.returncode != 0 and "is the HTTP endpoint of cluster" in p.stderr, p.stderr
