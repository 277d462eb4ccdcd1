"""Flink-grade exactly-once on the wire: prepared transactions that outlive
their timeout, and re-commits after a restart (SCENARIOS.md S9).

Flink's KafkaSink pre-commits a transaction at a checkpoint (records written,
acknowledged, not committed) and commits it only when the checkpoint is
complete, possibly after a restart, with the producer id and epoch it
checkpointed (FLINK-BRIEF.md). These tests play that producer by hand on the
wire (tests/txn_wire.py), so each step is exact:

* without the park policy a transaction past its timeout is aborted and the
  late commit fails: the records are lost, which is what Kafka does;
* under `transaction.two.phase.commit.prefixes` it is parked (listed, counted
  in /metrics, reported in the log, pinning the last stable offset, across a
  broker kill -9), and the late commit makes every record visible once;
* a re-commit of a committed transaction answers success, in the classic
  protocol after a KIP-890 commit too (what Flink's committer sends on every
  restore), while a commit of an aborted one and a zombie's end stay refused;
* an operator resolves a parked transaction by producer id and epoch, and a
  mismatch is refused;
* `transaction.two.phase.commit.max.park.ms` bounds the park.

Every test runs in both modes: one broker, and three `--cluster` brokers
whose coordinator state lives in PostgreSQL (a kill -9 there is of all
three).
"""

import json
import time

import pytest

import txn_wire as tw
from clients import cli, create_topic, metric, unique_topic
from conftest import both_modes, wait_until

TIMEOUT_MS = 2000


def committed_values(broker, topic):
    """Everything read_committed shows up to the last stable offset (read
    with `oncelog consume`)."""
    out, _ = cli(broker, "consume", topic, "--format", "json", "--timeout-ms", "20000",
                 json_out=False)
    return [json.loads(line)["value"].encode() for line in out.splitlines() if line.strip()]


def described_lso(broker, topic):
    """Partition 0's last stable offset as `oncelog topic describe` shows it."""
    out, _ = cli(broker, "topic", "describe", topic)
    return out["partitions"][0]["last_stable_offset"]


def parked_ids(broker):
    listed, _ = cli(broker, "txn", "list", admin=broker.metrics_url)
    return {t["transactional_id"] for t in listed if t["state"] == "Parked"}


def past_timeout():
    # The timeout, one reaper pass (1 s) and some slack.
    time.sleep(TIMEOUT_MS / 1000 + 2.0)


VALUES = [b"order-1", b"order-2", b"order-3"]


@both_modes()
def test_without_the_policy_a_late_commit_loses_the_checkpoint(broker):
    """What Kafka does to Flink today: the broker aborts the prepared
    transaction at its timeout; the commit after the restart is refused."""
    topic = unique_topic("s9-lost")
    create_topic(broker.bootstrap, topic)
    txn = "orders-sink-0-7"
    pid, epoch = tw.prepared_transaction(broker.bootstrap, txn, TIMEOUT_MS, topic, VALUES)
    past_timeout()
    assert parked_ids(broker) == set()
    err, _, _ = tw.end_txn(broker.bootstrap, txn, pid, epoch, commit=True)
    assert err in (tw.PRODUCER_FENCED, tw.INVALID_PRODUCER_EPOCH), err
    assert committed_values(broker, topic) == []
    assert "transaction timed out; aborting it" in broker.log_text()


@both_modes("broker_factory")
def test_a_parked_transaction_survives_its_timeout_and_a_broker_crash_then_commits(broker_factory):
    b = broker_factory(overrides={"transaction.two.phase.commit.prefixes": "orders-sink"})
    topic = unique_topic("s9-parked")
    create_topic(b.bootstrap, topic)
    txn = "orders-sink-0-7"
    other = "fare-writer-3"  # not under the policy: aborted as usual
    pid, epoch = tw.prepared_transaction(b.bootstrap, txn, TIMEOUT_MS, topic, VALUES)
    opid, oepoch = tw.prepared_transaction(b.bootstrap, other, TIMEOUT_MS, topic, [b"other"])
    past_timeout()
    assert parked_ids(b) == {txn}
    assert metric(b, "oncelog_transactions_parked") == 1
    assert metric(b, "oncelog_transaction_oldest_parked_age_seconds") > 0
    assert "transaction parked past its timeout" in b.log_text()
    # It pins the last stable offset: nothing after its first record is stable.
    assert described_lso(b, topic) == 0
    assert committed_values(b, topic) == []

    b.kill9()
    b.restart()
    wait_until(lambda: parked_ids(b) == {txn}, 10, what="the transaction parked again after the restart")

    # The restored job commits with the identity it checkpointed.
    err, _, _ = tw.end_txn(b.bootstrap, txn, pid, epoch, commit=True)
    assert err == tw.NONE, err
    assert parked_ids(b) == set()
    assert committed_values(b, topic) == VALUES
    # The other id was aborted at its timeout, as without the policy.
    err, _, _ = tw.end_txn(b.bootstrap, other, opid, oepoch, commit=True)
    assert err in (tw.PRODUCER_FENCED, tw.INVALID_PRODUCER_EPOCH), err
    # Flink commits again on a second restore: success, nothing changes.
    err, _, _ = tw.end_txn(b.bootstrap, txn, pid, epoch, commit=True)
    assert err == tw.NONE, err
    err, _, _ = tw.end_txn(b.bootstrap, txn, pid, epoch, commit=False)
    assert err != tw.NONE
    assert committed_values(b, topic) == VALUES


@both_modes()
def test_recommit_after_a_transaction_version_2_commit_is_a_success(broker):
    """The ERROR Flink's KafkaCommitter logs on every restore: the commit
    went through EndTxn v5 (epoch bumped), the re-commit comes with the old
    epoch. Only the identity that committed gets success; a commit of an
    aborted transaction and a fenced producer's end stay refused."""
    bs = broker.bootstrap.split(",")[0]  # one broker: the raw requests go to one address
    topic = unique_topic("recommit")
    create_topic(broker.bootstrap, topic)
    txn = "orders-sink-1-9"
    pid, epoch = tw.prepared_transaction(bs, txn, 60000, topic, VALUES)
    err, npid, nepoch = tw.end_txn(bs, txn, pid, epoch, commit=True, version=5)
    assert (err, npid, nepoch) == (tw.NONE, pid, epoch + 1)
    for version in (1, 5):
        err, _, _ = tw.end_txn(bs, txn, pid, epoch, commit=True, version=version)
        assert err == tw.NONE, (version, err)
        # The other outcome is never "already done".
        err, _, _ = tw.end_txn(bs, txn, pid, epoch, commit=False, version=version)
        assert err != tw.NONE, version
    assert committed_values(broker, topic) == VALUES

    # An aborted transaction: its abort repeats fine, its commit fails.
    aborted = "orders-sink-2-9"
    apid, aepoch = tw.prepared_transaction(bs, aborted, 60000, topic, [b"x"])
    assert tw.end_txn(bs, aborted, apid, aepoch, commit=False, version=5)[0] == tw.NONE
    for version in (1, 5):
        assert tw.end_txn(bs, aborted, apid, aepoch, commit=False, version=version)[0] == tw.NONE
        assert tw.end_txn(bs, aborted, apid, aepoch, commit=True, version=version)[0] != tw.NONE

    # A zombie: a new instance took the id over; the old one's commit and
    # abort of its committed transaction are refused now.
    err, pid2, epoch2 = tw.init_producer_id(bs, txn, 60000)
    assert (err, pid2) == (tw.NONE, pid) and epoch2 > epoch + 1
    for version in (1, 5):
        for commit in (True, False):
            err, _, _ = tw.end_txn(bs, txn, pid, epoch, commit=commit, version=version)
            assert err in (tw.PRODUCER_FENCED, tw.INVALID_PRODUCER_EPOCH), (version, commit, err)
    assert committed_values(broker, topic) == VALUES


@both_modes("broker_factory")
def test_an_operator_resolves_a_parked_transaction_by_producer_id_and_epoch(broker_factory):
    b = broker_factory(overrides={"transaction.two.phase.commit.prefixes": "orders-sink"})
    topic = unique_topic("s9-operator")
    create_topic(b.bootstrap, topic)
    txn = "orders-sink-0-11"
    pid, epoch = tw.prepared_transaction(b.bootstrap, txn, TIMEOUT_MS, topic, VALUES)
    past_timeout()
    assert parked_ids(b) == {txn}
    # The wrong epoch or producer id changes nothing.
    _, p = cli(b, "txn", "commit", txn, "--producer-id", str(pid), "--producer-epoch", str(epoch + 1), check=False)
    assert p.returncode != 0 and "refused" in p.stderr and "nothing was changed" in p.stderr, p.stderr
    _, p = cli(b, "txn", "abort", txn, "--producer-id", str(pid + 1000), "--producer-epoch", str(epoch), check=False)
    assert p.returncode != 0 and "nothing was changed" in p.stderr, p.stderr
    assert parked_ids(b) == {txn}
    out, _ = cli(b, "txn", "commit", txn, "--producer-id", str(pid), "--producer-epoch", str(epoch))
    assert out["committed"]["transactional_id"] == txn
    assert committed_values(b, topic) == VALUES
    # Run twice: success, nothing changes; the producer's own late commit too.
    cli(b, "txn", "commit", txn, "--producer-id", str(pid), "--producer-epoch", str(epoch))
    assert tw.end_txn(b.bootstrap, txn, pid, epoch, commit=True)[0] == tw.NONE
    # Aborting what was committed is refused.
    _, p = cli(b, "txn", "abort", txn, "--producer-id", str(pid), "--producer-epoch", str(epoch), check=False)
    assert p.returncode != 0
    assert committed_values(b, topic) == VALUES

    # An operator abort of another parked transaction: gone for good.
    txn2 = "orders-sink-1-11"
    pid2, epoch2 = tw.prepared_transaction(b.bootstrap, txn2, TIMEOUT_MS, topic, [b"late"])
    past_timeout()
    assert parked_ids(b) == {txn2}
    cli(b, "txn", "abort", txn2, "--producer-id", str(pid2), "--producer-epoch", str(epoch2))
    assert parked_ids(b) == set()
    assert tw.end_txn(b.bootstrap, txn2, pid2, epoch2, commit=True)[0] != tw.NONE
    assert committed_values(b, topic) == VALUES


@both_modes("broker_factory")
def test_the_maximum_park_time_ends_a_park(broker_factory):
    b = broker_factory(overrides={"transaction.two.phase.commit.prefixes": "orders-*",
                                  "transaction.two.phase.commit.max.park.ms": "5000"})
    topic = unique_topic("s9-max-park")
    create_topic(b.bootstrap, topic)
    txn = "orders-anything"
    pid, epoch = tw.prepared_transaction(b.bootstrap, txn, TIMEOUT_MS, topic, VALUES)
    past_timeout()
    assert txn in parked_ids(b)
    wait_until(lambda: "reached the maximum park time" in b.log_text(), 15, what="the park to end")
    wait_until(lambda: parked_ids(b) == set(), 10, what="the parked transaction to be aborted")
    assert tw.end_txn(b.bootstrap, txn, pid, epoch, commit=True)[0] != tw.NONE
    assert committed_values(b, topic) == []
    wait_until(lambda: described_lso(b, topic) == 4, 10, what="the LSO to pass the abort marker")


@both_modes("broker_factory")
def test_the_fault_that_holds_commits_is_scoped_to_its_prefix(broker_factory):
    """The S9 Flink test keeps a job's commits pending with this fault; it
    must hold only the named ids, and only commits."""
    b = broker_factory(start=False)
    for one in getattr(b, "brokers", [b]):
        one.env["ONCELOG_FAULTS"] = "end-txn-unavailable:held-"
    b.start()
    topic = unique_topic("fault")
    create_topic(b.bootstrap, topic)
    pid, epoch = tw.prepared_transaction(b.bootstrap, "held-0-1", 60000, topic, [b"a"])
    assert tw.end_txn(b.bootstrap, "held-0-1", pid, epoch, commit=True)[0] == tw.COORDINATOR_LOAD_IN_PROGRESS
    assert tw.end_txn(b.bootstrap, "held-0-1", pid, epoch, commit=False)[0] == tw.NONE
    pid, epoch = tw.prepared_transaction(b.bootstrap, "free-0-1", 60000, topic, [b"b"])
    assert tw.end_txn(b.bootstrap, "free-0-1", pid, epoch, commit=True)[0] == tw.NONE
    assert committed_values(b, topic) == [b"b"]


@both_modes()
@pytest.mark.parametrize("prefix", ["orders-sink-2", "app-0_1"])
def test_an_ambiguous_writer_prefix_is_refused(broker, prefix):
    topic = unique_topic("ambiguous")
    create_topic(broker.bootstrap, topic)
    _, p = cli(broker, "topic", "alter-config", topic, "--set", f"writer.transactional.id.prefix={prefix}", check=False)
    assert p.returncode != 0 and "ambiguous" in p.stderr, p.stderr


@both_modes("broker_factory")
def test_kip939_two_phase_commit_on_the_wire(broker_factory):
    """InitProducerId v6 (KIP-939), for the day a client library ships it:
    `enable2Pc` parks the producer's transactions at their timeout without
    any prefix policy; `keepPreparedTxn` on restart keeps the prepared
    transaction, fences the old producer and lets the new one commit it."""
    off = broker_factory()
    assert tw.max_version(off.bootstrap, tw.API_INIT_PRODUCER_ID) == 5
    err = tw.init_producer_id_v6(off.bootstrap, "two-pc", 60000, enable_2pc=True, keep_prepared=False)[0]
    assert err == tw.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    b = broker_factory(overrides={"transaction.two.phase.commit.enable": "true"})
    assert tw.max_version(b.bootstrap, tw.API_INIT_PRODUCER_ID) == 6
    topic = unique_topic("kip939")
    create_topic(b.bootstrap, topic)
    txn = "payments"  # no park policy names it: enable2Pc alone parks it
    err, pid, epoch, opid, oepoch = tw.init_producer_id_v6(b.bootstrap, txn, TIMEOUT_MS, True, False)
    assert (err, opid, oepoch) == (tw.NONE, -1, -1)
    assert tw.add_partition(b.bootstrap, txn, pid, epoch, topic, 0) == tw.NONE
    assert tw.produce(b.bootstrap, txn, pid, epoch, topic, 0, VALUES, 0)[0] == tw.NONE
    past_timeout()
    assert parked_ids(b) == {txn}
    b.kill9()
    b.restart()
    # keepPreparedTxn with KIP-360's expected identity is refused.
    err = tw.init_producer_id_v6(b.bootstrap, txn, TIMEOUT_MS, True, True, pid, epoch)[0]
    assert err == 42  # INVALID_REQUEST
    err, npid, nepoch, opid, oepoch = tw.init_producer_id_v6(b.bootstrap, txn, TIMEOUT_MS, True, True)
    assert (err, npid, nepoch, opid, oepoch) == (tw.NONE, pid, epoch + 1, pid, epoch)
    assert parked_ids(b) == {txn}
    # The old producer is fenced; the new one commits what the old prepared.
    assert tw.end_txn(b.bootstrap, txn, pid, epoch, commit=True)[0] in (tw.PRODUCER_FENCED, tw.INVALID_PRODUCER_EPOCH)
    assert tw.end_txn(b.bootstrap, txn, npid, nepoch, commit=True)[0] == tw.NONE
    assert committed_values(b, topic) == VALUES
    # Without keepPreparedTxn a restart aborts what was open, as always.
    err, pid, epoch, _, _ = tw.init_producer_id_v6(b.bootstrap, txn, 60000, True, False)
    assert tw.add_partition(b.bootstrap, txn, pid, epoch, topic, 0) == tw.NONE
    assert tw.produce(b.bootstrap, txn, pid, epoch, topic, 0, [b"dropped"], 0)[0] == tw.NONE
    err, _, _, opid, _ = tw.init_producer_id_v6(b.bootstrap, txn, 60000, True, False)
    assert (err, opid) == (tw.NONE, -1)
    assert committed_values(b, topic) == VALUES
