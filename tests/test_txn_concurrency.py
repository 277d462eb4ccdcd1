"""Transactional ids are independent: a transaction whose markers cannot be
written (an injected storage fault at one topic) holds up no other
transactional id. Its commit waits while the markers are retried with a
backoff; meanwhile other producers commit; the stuck transaction shows in
/metrics (`oncelog_transactions_stuck`) and in `oncelog txn history`; once
the fault clears it completes, and read_committed readers see each
transaction's records exactly once. Real librdkafka clients, real broker."""

import threading
import time

import pytest

from clients import cli, create_topic, metric, read_partition, txn_producer, unique_topic
from conftest import free_port, wait_until


@pytest.mark.timeout(180)
def test_stuck_transaction_holds_up_no_other_transactional_id(broker_factory):
    stuck_topic = unique_topic("stuck")
    free_topic = unique_topic("free")
    port = free_port()
    b = broker_factory({"metrics.listen": f"127.0.0.1:{port}"}, start=False)
    b.admin = f"http://127.0.0.1:{port}"
    # The first 6 marker writes at the stuck topic fail: with the doubling
    # backoff that is about 11 s of retries (0.2 + 0.4 + 0.8 + 1.6 + 3.2 + 5 s).
    b.env["ONCELOG_FAULTS"] = f"marker-error:{stuck_topic}:6"
    b.start()
    create_topic(b.bootstrap, stuck_topic, partitions=1)
    create_topic(b.bootstrap, free_topic, partitions=1)

    slow = txn_producer(b.bootstrap, "slow-" + stuck_topic)
    slow.init_transactions(30)
    fast = txn_producer(b.bootstrap, "fast-" + free_topic)
    fast.init_transactions(30)

    slow.begin_transaction()
    slow.produce(stuck_topic, value=b"slow-0", partition=0)
    slow.flush(30)
    slow_done = {}

    def commit_slow():
        t0 = time.monotonic()
        try:
            slow.commit_transaction(60)
            slow_done["ok"] = time.monotonic() - t0
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            slow_done["error"] = repr(e)

    t = threading.Thread(target=commit_slow, daemon=True)
    t.start()

    # While the slow commit is stuck, the other id commits again and again.
    wait_until(lambda: metric(b, "oncelog_transactions_stuck") == 1, 30,
               what="the slow transaction listed as stuck")
    history, _ = cli(b, "txn", "history", "slow-" + stuck_topic, "--admin", b.admin)
    history_text, _ = cli(b, "txn", "history", "slow-" + stuck_topic, "--admin", b.admin,
                          json_out=False)
    fast_commits = 0
    t_fast = time.monotonic()
    while "ok" not in slow_done and "error" not in slow_done and fast_commits < 50:
        fast.begin_transaction()
        fast.produce(free_topic, value=f"fast-{fast_commits}".encode(), partition=0)
        fast.commit_transaction(10)
        fast_commits += 1
    fast_took = time.monotonic() - t_fast
    stuck_seen = metric(b, "oncelog_transactions_stuck")

    t.join(70)
    assert slow_done.get("ok") is not None, slow_done
    assert fast_commits == 50, \
        f"only {fast_commits} commits of another id while one was stuck ({slow_done})"
    assert fast_took < slow_done["ok"], (fast_took, slow_done)
    assert stuck_seen == 1, "the slow transaction completed before the other id's 50 commits"
    stuck = history.get("stuck")
    assert stuck and stuck["partition"] == f"{stuck_topic}-0" and stuck["commit"] is True, history
    assert stuck["tries"] >= 3 and "injected" in stuck["error"], stuck
    assert "STUCK: the COMMIT markers" in history_text, history_text

    # The fault cleared: it completed, it is no longer listed, every record
    # is there once for read_committed.
    wait_until(lambda: metric(b, "oncelog_transactions_stuck") == 0, 10, what="stuck cleared")
    assert cli(b, "txn", "history", "slow-" + stuck_topic, "--admin", b.admin)[0].get("stuck") is None
    got = read_partition(b.bootstrap, stuck_topic, 0, 0, "read_committed", until_offset=2)
    assert [v for _, v in got] == [b"slow-0"]
    got = read_partition(b.bootstrap, free_topic, 0, 0, "read_committed",
                         until_offset=2 * fast_commits)
    assert [v for _, v in got] == [f"fast-{i}".encode() for i in range(fast_commits)]
    log = b.log_text()
    assert "transaction marker not written; retrying" in log
    assert "stuck transaction's markers are durable now" in log
