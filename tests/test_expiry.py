"""Expiry of idle state, in both modes: a transactional id idle (no open
transaction) past `transactional.id.expiration.ms` is forgotten, and a
partition forgets a producer id idle past `producer.id.expiration.ms`;
neither ever forgets one with an open transaction. A forgotten id starts
again from InitProducerId, and nothing committed is lost.

In cluster mode the ids are `transactions` rows and the producers
`producers` rows in PostgreSQL, removed by a leased job on one broker;
every broker then answers alike.
"""

import time

import pytest

from clients import cli, create_topic, read_all, txn_producer, unique_topic
from conftest import both_modes, wait_until

EXPIRE_MS = 2500
SETTINGS = {
    "transactional.id.expiration.ms": EXPIRE_MS,
    "producer.id.expiration.ms": EXPIRE_MS,
    "log.retention.check.interval.ms": 500,
}


def listed(b):
    """{transactional id: state} as `oncelog txn list` shows them."""
    return {t["transactional_id"]: t["state"] for t in cli(b, "txn", "list")[0]}


def producer_ids(b, topic):
    return {p["producer_id"] for p in cli(b, "txn", "producers", topic, "0")[0]}


@pytest.mark.timeout(120)
@both_modes("broker_factory")
def test_idle_ids_and_producers_expire_open_ones_never(broker_factory):
    b = broker_factory(SETTINGS)
    topic = unique_topic("expiry")
    create_topic(b.bootstrap, topic)
    idle_id, open_id = "idle-" + topic, "open-" + topic

    # One committed transaction, then idle.
    idle = txn_producer(b.bootstrap, idle_id)
    idle.init_transactions(30)
    idle.begin_transaction()
    idle.produce(topic, value=b"kept", partition=0)
    idle.commit_transaction(30)
    # One transaction left open far past the expiration (its timeout is long).
    held = txn_producer(b.bootstrap, open_id, **{"transaction.timeout.ms": 60000})
    held.init_transactions(30)
    held.begin_transaction()
    held.produce(topic, value=b"late", partition=0)
    held.flush(30)
    both = producer_ids(b, topic)
    assert len(both) == 2, both
    assert listed(b) == {idle_id: "CompleteCommit", open_id: "Ongoing"}

    wait_until(lambda: idle_id not in listed(b), 30, interval=0.5, what="the idle id to expire")
    wait_until(lambda: len(producer_ids(b, topic)) == 1, 30, interval=0.5,
               what="the idle producer to expire")
    # Well past the expiration, the open transaction and its producer stay.
    time.sleep(EXPIRE_MS / 1000 + 1)
    assert listed(b) == {open_id: "Ongoing"}
    assert len(producer_ids(b, topic)) == 1 and producer_ids(b, topic) < both
    history = cli(b, "txn", "history", idle_id, "--admin", b.metrics_url)[0]
    assert [e["event"] for e in history["events"]][-1] == "expired", history["events"]

    # The open transaction commits, and the forgotten id starts again.
    held.commit_transaction(30)
    again = txn_producer(b.bootstrap, idle_id)
    again.init_transactions(30)
    again.begin_transaction()
    again.produce(topic, value=b"again", partition=0)
    again.commit_transaction(30)
    assert listed(b)[idle_id] == "CompleteCommit"
    assert sorted(read_all(b.bootstrap, topic)) == [b"again", b"kept", b"late"]
