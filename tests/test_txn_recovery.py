"""A crash in every coordinator state: the transaction completes the right way
after the restart and the last stable offset catches up. The crash is a
failpoint (ONCELOG_FAILPOINTS) that aborts the broker process at that step."""

import pytest
from confluent_kafka import KafkaException

from clients import create_topic, lso, read_partition, txn_producer, unique_topic
from conftest import wait_until


@pytest.mark.parametrize("point,commit,markers", [
    ("txn-after-prepare-commit", True, 1),
    ("txn-after-prepare-abort", False, 1),
    # Markers written, Complete not yet: recovery writes them again (a
    # second marker for a closed transaction is harmless; readers skip it).
    ("txn-after-markers", True, 2),
])
def test_crash_between_prepare_and_complete(broker_factory, monkeypatch, point, commit, markers):
    monkeypatch.setenv("ONCELOG_FAILPOINTS", point)
    b = broker_factory()
    topic = unique_topic("crash")
    create_topic(b.bootstrap, topic, partitions=3)
    txn_id = "crash-" + topic
    p = txn_producer(b.bootstrap, txn_id)
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(30):
        p.produce(topic, value=b"v%02d" % i, partition=i % 3)
    p.flush(30)
    with pytest.raises(KafkaException):
        if commit:
            p.commit_transaction(5)
        else:
            p.abort_transaction(5)
    wait_until(lambda: not b.alive, 10, what="the failpoint to stop the broker")
    assert f'failpoint="{point}"' in b.log_text()

    monkeypatch.delenv("ONCELOG_FAILPOINTS")
    b.start()
    for part in range(3):
        wait_until(lambda: lso(b.bootstrap, topic, part) == 10 + markers, 20,
                   what=f"LSO of partition {part} to catch up")
    if point != "txn-after-markers":
        assert "re-driving transaction markers after restart" in b.log_text(since_last_start=True)
    values = []
    for part in range(3):
        values += [v for _, v in read_partition(b.bootstrap, topic, part, 0, "read_committed", 10 + markers)]
    if commit:
        assert sorted(values) == [b"v%02d" % i for i in range(30)]
    else:
        assert values == []
    # The id is usable again: a new producer commits on top.
    q = txn_producer(b.bootstrap, txn_id)
    q.init_transactions(30)
    q.begin_transaction()
    q.produce(topic, value=b"after", partition=0)
    q.commit_transaction(30)
    got = read_partition(b.bootstrap, topic, 0, 0, "read_committed", 12 + markers)
    assert got[-1][1] == b"after"
