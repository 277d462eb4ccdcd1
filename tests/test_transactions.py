"""Transactions with real librdkafka producers: commit and abort, read_committed
readers, zombie fencing (scenario S1), timeouts, and a restart in between."""

import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from clients import (consumer_config, create_topic, flush_all, producer_config, read_partition,
                     txn_producer, unique_topic)
from conftest import both_modes, wait_until


def segment_batches(broker, topic, partition):
    """(base_offset, attributes, producer_id, producer_epoch) of every
    stored batch (segment files; a cluster's objects as served)."""
    import kafka_wire as kw
    out = []
    for data in broker.stored_logs(topic, partition):
        for b in kw.walk_batches(data):
            pid, epoch = struct.unpack_from(">qh", data, b.pos + 43)
            out.append((b.base_offset, b.attributes, pid, epoch))
    return out


@both_modes()
def test_commit_and_abort_read_committed(broker):
    topic = unique_topic("txn")
    create_topic(broker.bootstrap, topic, partitions=2)
    p = txn_producer(broker.bootstrap, "basic-" + topic)
    p.init_transactions(30)
    for round_ in range(6):
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, value=f"r{round_}-{i}".encode(), partition=i % 2)
        if round_ % 2 == 0:
            p.commit_transaction(30)
        else:
            p.flush(30)  # make sure the data is written before it is aborted
            p.abort_transaction(30)
    hw = {}
    c = Consumer(consumer_config(broker.bootstrap))
    for part in (0, 1):
        hw[part] = c.get_watermark_offsets(TopicPartition(topic, part), timeout=10, cached=False)[1]
    c.close()
    # 6 rounds x 5 records + 6 markers per partition.
    assert hw == {0: 36, 1: 36}
    for part in (0, 1):
        committed = read_partition(broker.bootstrap, topic, part, 0, "read_committed", hw[part])
        values = [v.decode() for _, v in committed]
        assert values == [f"r{r}-{i}" for r in (0, 2, 4) for i in range(part, 10, 2)]
        everything = read_partition(broker.bootstrap, topic, part, 0, "read_uncommitted", hw[part])
        assert len(everything) == 30, "read_uncommitted sees aborted data, never markers"


@both_modes()
def test_open_transaction_holds_back_read_committed(broker):
    topic = unique_topic("lso")
    create_topic(broker.bootstrap, topic)
    plain = Producer(producer_config(broker.bootstrap))
    for i in range(5):
        plain.produce(topic, value=b"plain-%d" % i, partition=0)
    flush_all(plain)
    p = txn_producer(broker.bootstrap, "lso-" + topic)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"pending", partition=0)
    p.flush(30)
    for i in range(5, 8):
        plain.produce(topic, value=b"plain-%d" % i, partition=0)
    flush_all(plain)
    c = Consumer(consumer_config(broker.bootstrap, **{"isolation.level": "read_committed"}))
    # ListOffsets latest with read_committed is the last stable offset.
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    c.close()
    assert hi == 5, f"read_committed end offset must stop at the open transaction, got {hi}"
    before = read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 5)
    assert [v for _, v in before] == [b"plain-%d" % i for i in range(5)]
    p.commit_transaction(30)
    after = read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 10)
    assert [v for _, v in after] == [b"plain-%d" % i for i in range(5)] + [b"pending"] + \
        [b"plain-%d" % i for i in range(5, 8)]


@both_modes()
def test_s1_zombie_fare_writer_is_fenced(broker):
    topic = "fares"
    create_topic(broker.bootstrap, topic, partitions=3)
    plain = Producer(producer_config(broker.bootstrap))
    for i in range(40):
        plain.produce(topic, value=b"fare-%d" % i, partition=2)
    flush_all(plain)

    a = txn_producer(broker.bootstrap, "fare-writer-7")
    a.init_transactions(30)
    a.begin_transaction()
    delivered = []
    a.produce(topic, value=b"trip-9001", partition=2,
              on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    a.flush(30)
    assert delivered == [(None, 40)]

    b = txn_producer(broker.bootstrap, "fare-writer-7")
    b.init_transactions(30)
    b.begin_transaction()
    got = []
    b.produce(topic, value=b"trip-9001", partition=2,
              on_delivery=lambda err, msg: got.append((err, msg.offset())))
    b.commit_transaction(30)
    assert got == [(None, 42)]

    # On disk: A's record (epoch 0) at 40, the fencing ABORT marker (epoch 1)
    # at 41, B's record (epoch 1) at 42, its COMMIT marker at 43.
    batches = {off: (attrs, pid, epoch) for off, attrs, pid, epoch in segment_batches(broker, topic, 2)}
    a_pid = batches[40][1]
    assert batches[40] == (0x10, a_pid, 0)
    assert batches[41] == (0x30, a_pid, 1)
    assert batches[42] == (0x10, a_pid, 1)
    assert batches[43] == (0x30, a_pid, 1)

    # The zombie wakes up: its write and its commit are refused; it is fenced (fatal).
    errors = []
    a.produce(topic, value=b"trip-9002", partition=2, on_delivery=lambda err, msg: errors.append(err))
    try:
        a.flush(30)
    except (KafkaException, SystemError) as e:
        # librdkafka raises the fatal error out of the poll that delivers it.
        errors.append(e)
    assert errors and errors[0] is not None
    with pytest.raises(KafkaException) as e:
        a.commit_transaction(10)
    assert e.value.args[0].fatal(), str(e.value)
    assert "fenced" in str(e.value).lower(), str(e.value)
    assert "fenced" in broker.log_text().lower()

    committed = read_partition(broker.bootstrap, topic, 2, 40, "read_committed", 44)
    assert committed == [(42, b"trip-9001")]
    uncommitted = read_partition(broker.bootstrap, topic, 2, 40, "read_uncommitted", 44)
    assert uncommitted == [(40, b"trip-9001"), (42, b"trip-9001")]
    assert not any(v == b"trip-9002" for _, v in uncommitted)

    # Step 10, through kafka-python's KIP-664 admin calls: the partition knows
    # the producer at epoch 1 with no open transaction; the coordinator says
    # CompleteCommit.
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition as KTP
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        producers = admin.describe_producers([KTP(topic, 2)])[KTP(topic, 2)].active_producers
        mine = [x for x in producers if x.producer_id == a_pid]
        assert len(mine) == 1, producers
        assert mine[0].producer_epoch == 1 and mine[0].current_transaction_start_offset == -1, mine[0]
        assert mine[0].last_sequence == 0, mine[0]
        desc = admin.describe_transactions(["fare-writer-7"])["fare-writer-7"]
        assert str(desc.state.value if hasattr(desc.state, "value") else desc.state).lower() in (
            "completecommit", "complete_commit"), desc
        assert (desc.producer_id, desc.producer_epoch) == (a_pid, 1)
        listed = [t for per_broker in admin.list_transactions().values() for t in per_broker]
        assert [(t.transactional_id, t.producer_id) for t in listed] == [("fare-writer-7", a_pid)], listed
        ongoing = [t for per_broker in admin.list_transactions(state_filters=["Ongoing"]).values() for t in per_broker]
        assert ongoing == [], ongoing
    finally:
        admin.close()


@both_modes()
def test_transaction_timeout_aborts_and_fences(broker):
    topic = unique_topic("timeout")
    create_topic(broker.bootstrap, topic)
    p = txn_producer(broker.bootstrap, "slow-" + topic, **{"transaction.timeout.ms": 2000, "message.timeout.ms": 2000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"late", partition=0)
    p.flush(30)
    # The coordinator aborts it after the timeout: read_committed moves on.
    after = read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 2, timeout=20)
    assert after == []
    assert "timed out" in broker.log_text()
    with pytest.raises(KafkaException):
        p.commit_transaction(10)


@both_modes()
def test_transactions_survive_restart(broker):
    topic = unique_topic("txn-restart")
    create_topic(broker.bootstrap, topic)
    txn_id = "restart-" + topic
    p = txn_producer(broker.bootstrap, txn_id)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"committed", partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic, value=b"open-at-crash", partition=0)
    p.flush(30)
    broker.kill9()
    broker.start()
    # The open transaction is still open after the restart (LSO pinned) ...
    c = Consumer(consumer_config(broker.bootstrap, **{"isolation.level": "read_committed"}))
    assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1] == 2
    c.close()
    # ... until a new producer with the same id fences and aborts it.
    q = txn_producer(broker.bootstrap, txn_id)
    q.init_transactions(30)
    q.begin_transaction()
    q.produce(topic, value=b"after", partition=0)
    q.commit_transaction(30)
    got = read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 6)
    assert [v for _, v in got] == [b"committed", b"after"]


@both_modes()
def test_kafka_python_transactions(broker):
    """A third client: kafka-python's transactional producer commits and aborts,
    is fenced by a newer instance, and its read_committed consumer sees only
    what was committed."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaError as KPError
    from kafka.structs import TopicPartition as KTP

    topic = unique_topic("kp-txn")
    create_topic(broker.bootstrap, topic, partitions=2)
    txn_id = "kp-" + topic
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id)
    p.init_transactions()
    p.begin_transaction()
    for i in range(10):
        p.send(topic, value=b"commit-%d" % i, partition=i % 2)
    p.commit_transaction()
    p.begin_transaction()
    for i in range(10):
        p.send(topic, value=b"abort-%d" % i, partition=i % 2)
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    p.send(topic, value=b"zombie", partition=0).get(timeout=30)
    q = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id)
    q.init_transactions()
    q.begin_transaction()
    q.send(topic, value=b"fresh", partition=1)
    q.commit_transaction()
    with pytest.raises(KPError):
        p.send(topic, value=b"zombie-2", partition=0).get(timeout=30)
        p.commit_transaction()
    p.close(timeout=5)
    q.close(timeout=5)

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed",
                      enable_auto_commit=False, group_id=None, consumer_timeout_ms=3000)
    tps = [KTP(topic, 0), KTP(topic, 1)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    got = sorted(m.value for m in c)
    c.close()
    assert got == sorted([b"commit-%d" % i for i in range(10)] + [b"fresh"])


@both_modes()
def test_list_and_describe_open_transactions_kafka_python_admin(broker):
    """KIP-664 ListTransactions filters (state, producer id, duration, id
    pattern) and DescribeTransactions of an open transaction."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaError as KPError

    topic = unique_topic("hang")
    create_topic(broker.bootstrap, topic, partitions=2)
    p = txn_producer(broker.bootstrap, "hang-" + topic)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"x", partition=1)
    p.flush(30)
    q = txn_producer(broker.bootstrap, "done-" + topic)
    q.init_transactions(30)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)

    def ids(**kw):
        return sorted(t.transactional_id for per in admin.list_transactions(**kw).values() for t in per)
    try:
        assert ids() == sorted(["hang-" + topic, "done-" + topic])
        assert ids(state_filters=["Ongoing"]) == ["hang-" + topic]
        assert ids(transactional_id_pattern="hang-.*") == ["hang-" + topic]
        assert ids(transactional_id_pattern="nothing-.*") == []
        time.sleep(0.3)
        assert ids(duration_filter_ms=200) == ["hang-" + topic]
        assert ids(duration_filter_ms=3_600_000) == []
        d = admin.describe_transactions(["hang-" + topic])["hang-" + topic]
        assert d.transaction_start_time_ms > 0
        assert {(tp.topic, tp.partition) for tp in d.topic_partitions} == {(topic, 1)}
        pid = d.producer_id
        assert ids(producer_id_filters=[pid]) == ["hang-" + topic]
        with pytest.raises(KPError):
            admin.describe_transactions(["no-such-id"])
    finally:
        admin.close()
        p.abort_transaction(30)


@both_modes()
def test_s4_through_admin_tools_abort_a_hanging_transaction(broker):
    """S4 seen through an operator's tools (kafka-python's KIP-664 calls):
    the abandoned transaction is found, with the partition it pins, and
    aborted through the coordinator; read_committed readers resume."""
    from kafka.admin import AbortTransactionSpec, KafkaAdminClient
    from kafka.structs import TopicPartition as KTP

    topic = unique_topic("s4-tools")
    create_topic(broker.bootstrap, topic, partitions=2)
    old = txn_producer(broker.bootstrap, "fare-writer-7-a3f9")
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, value=b"orphan", partition=1)
    old.flush(30)
    plain = Producer(producer_config(broker.bootstrap))
    for i in range(3):
        plain.produce(topic, value=b"after-%d" % i, partition=1)
    flush_all(plain)
    c = Consumer(consumer_config(broker.bootstrap, **{"isolation.level": "read_committed"}))
    assert c.get_watermark_offsets(TopicPartition(topic, 1), timeout=10, cached=False)[1] == 0, "LSO pinned"

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        time.sleep(0.2)
        hanging = [t for per in admin.list_transactions(state_filters=["Ongoing"], duration_filter_ms=100).values()
                   for t in per]
        assert [t.transactional_id for t in hanging] == ["fare-writer-7-a3f9"]
        producers = admin.describe_producers([KTP(topic, 1)])[KTP(topic, 1)].active_producers
        open_ = [x for x in producers if x.current_transaction_start_offset >= 0]
        assert len(open_) == 1 and open_[0].current_transaction_start_offset == 0, producers
        spec = AbortTransactionSpec(topic_partition=KTP(topic, 1), producer_id=open_[0].producer_id,
                                    producer_epoch=open_[0].producer_epoch,
                                    coordinator_epoch=open_[0].coordinator_epoch)
        admin.abort_transaction(spec)
        desc = admin.describe_transactions(["fare-writer-7-a3f9"])["fare-writer-7-a3f9"]
        assert desc.producer_epoch == open_[0].producer_epoch + 1, "the abort fenced the producer"
    finally:
        admin.close()
    # Readers resume: the LSO moves past the aborted transaction.
    assert c.get_watermark_offsets(TopicPartition(topic, 1), timeout=10, cached=False)[1] == 5
    c.close()
    got = read_partition(broker.bootstrap, topic, 1, 0, "read_committed", 5)
    assert [v for _, v in got] == [b"after-0", b"after-1", b"after-2"]
    assert "aborted by an administrator" in broker.log_text()
    with pytest.raises(KafkaException):
        old.commit_transaction(10)


def test_orphaned_transaction_is_aborted_at_its_partition(broker):
    """A transaction open at a partition that the coordinator no longer knows
    (its state was lost) pins the LSO; an operator's abort writes the ABORT
    marker at that partition and readers resume."""
    import shutil

    from kafka.admin import AbortTransactionSpec, KafkaAdminClient
    from kafka.structs import TopicPartition as KTP

    topic = unique_topic("orphan")
    create_topic(broker.bootstrap, topic)
    p = txn_producer(broker.bootstrap, "lost-" + topic)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"orphan", partition=0)
    p.flush(30)
    broker.stop()
    shutil.rmtree(broker.data_dir / "internal" / "__transaction_state-0")
    broker.start()
    c = Consumer(consumer_config(broker.bootstrap, **{"isolation.level": "read_committed"}))
    assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1] == 0
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert [t for per in admin.list_transactions().values() for t in per] == []
        st = admin.describe_producers([KTP(topic, 0)])[KTP(topic, 0)].active_producers[0]
        assert st.current_transaction_start_offset == 0
        admin.abort_transaction(AbortTransactionSpec(topic_partition=KTP(topic, 0), producer_id=st.producer_id,
                                                     producer_epoch=st.producer_epoch,
                                                     coordinator_epoch=st.coordinator_epoch))
        st = admin.describe_producers([KTP(topic, 0)])[KTP(topic, 0)].active_producers[0]
        assert st.current_transaction_start_offset == -1
    finally:
        admin.close()
    assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1] == 2
    c.close()
    assert read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 2) == []
    assert "orphaned transaction" in broker.log_text()


def test_orphaned_transaction_is_reported_and_healed(broker_factory):
    """With transaction.auto.heal on, a partition-side open transaction the
    coordinator does not know is found (on two checks in a row), reported,
    and aborted; read_committed readers resume."""
    import shutil

    b = broker_factory({"transaction.heal.check.interval.ms": 300})
    topic = unique_topic("heal")
    create_topic(b.bootstrap, topic)
    p = txn_producer(b.bootstrap, "heal-" + topic)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"orphan", partition=0)
    p.flush(30)
    # A healthy open transaction is not an orphan.
    time.sleep(1.0)
    assert "orphaned transaction" not in b.log_text()
    b.stop()
    shutil.rmtree(b.data_dir / "internal" / "__transaction_state-0")
    b.overrides["transaction.auto.heal"] = "true"
    b.start()
    c = Consumer(consumer_config(b.bootstrap, **{"isolation.level": "read_committed"}))
    wait_until(lambda: c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1] == 2,
               20, interval=0.2, what="the orphan to be healed")
    c.close()
    assert "orphaned transaction found; aborting it" in b.log_text(since_last_start=True)


@both_modes()
def test_add_partitions_v4_verifies_and_adds_in_a_batch(broker):
    """AddPartitionsToTxn v4 (KIP-890 part 1): a batch of transactions, each
    added, or with verify_only checked: a partition in the producer's open
    transaction verifies, one outside it is INVALID_TXN_STATE, a fenced
    epoch INVALID_PRODUCER_EPOCH, and an unknown partition fails its set."""
    import txn_wire as tw
    boot = f"{broker.host}:{broker.port}"  # any broker decides for any id
    t = unique_topic("apv4")
    create_topic(broker.bootstrap, t, partitions=3)
    a, b = unique_topic("apv4-a"), unique_topic("apv4-b")
    err, pa, ea = tw.init_producer_id(boot, a, 60000)
    assert err == tw.NONE, err
    err, pb, eb = tw.init_producer_id(boot, b, 60000)
    assert err == tw.NONE, err
    # a's transaction holds partition 0; b's gets 1 and 2 through v4
    assert tw.add_partition(boot, a, pa, ea, t, 0) == tw.NONE
    top, got = tw.add_partitions_v4(boot, [(b, pb, eb, False, {t: [1, 2]}),
                                           (a, pa, ea, True, {t: [0, 1]})])
    assert top == tw.NONE and got == [
        (b, {(t, 1): tw.NONE, (t, 2): tw.NONE}),
        (a, {(t, 0): tw.NONE, (t, 1): tw.INVALID_TXN_STATE}),
    ], got
    _, got = tw.add_partitions_v4(boot, [(b, pb, eb, True, {t: [1, 2]}),
                                         (a, pa, ea, True, {t: [0, 9]})])
    assert got == [
        (b, {(t, 1): tw.NONE, (t, 2): tw.NONE}),
        (a, {(t, 0): tw.OPERATION_NOT_ATTEMPTED, (t, 9): tw.UNKNOWN_TOPIC_OR_PARTITION}),
    ], got
    # a new producer of a fences the old epoch (and aborts its transaction)
    err, pa2, ea2 = tw.init_producer_id(boot, a, 60000)
    assert err == tw.NONE and (pa2, ea2) != (pa, ea), (err, pa2, ea2)
    _, got = tw.add_partitions_v4(boot, [(a, pa, ea, True, {t: [0]})])
    assert got == [(a, {(t, 0): tw.INVALID_PRODUCER_EPOCH})], got
    # b's transaction ends, and its partitions with it
    assert tw.end_txn(boot, b, pb, eb, commit=True)[0] == tw.NONE
    _, got = tw.add_partitions_v4(boot, [(b, pb, eb, True, {t: [1]})])
    assert got == [(b, {(t, 1): tw.INVALID_TXN_STATE})], got


@both_modes()
def test_a_commit_ahead_of_its_first_record_is_retried_not_fatal(broker):
    """Under transaction version 2 a transaction begins with its first
    produce. A Java producer can send EndTxn just before the batches it is
    flushing (its sender checks for incomplete batches, then takes the EndTxn
    off its queue): with 64 producers on 2 cores that happened a few times a
    minute, and INVALID_TXN_STATE killed the producer. The commit is answered
    CONCURRENT_TRANSACTIONS (retriable) while the transaction could still be
    open; the records then begin it and the retry commits them. Past the
    timeout such a commit is the client error it is, and logged."""
    import txn_wire as tw
    bs = broker.bootstrap.split(",")[0]  # the raw requests go to one broker
    topic = unique_topic("ahead")
    create_topic(broker.bootstrap, topic)
    txn = "ahead-" + topic
    err, pid, epoch = tw.init_producer_id(bs, txn, 3000)
    assert err == tw.NONE, err
    for round_ in range(2):
        # the commit overtakes the records: retriable, nothing ends
        assert tw.end_txn(bs, txn, pid, epoch, commit=True, version=5)[0] == tw.CONCURRENT_TRANSACTIONS
        assert tw.produce_v12(bs, txn, pid, epoch, topic, 0, [b"r%d" % round_], 0)[0] == tw.NONE
        err, npid, nepoch = tw.end_txn(bs, txn, pid, epoch, commit=True, version=5)
        assert (err, npid, nepoch) == (tw.NONE, pid, epoch + 1)
        epoch = nepoch
    assert [v for _, v in read_partition(broker.bootstrap, topic, 0, 0, "read_committed", 4)] == [b"r0", b"r1"]
    # nothing follows the commit: past the timeout it is refused, and logged
    time.sleep(3.2)
    assert tw.end_txn(bs, txn, pid, epoch, commit=True, version=5)[0] == tw.INVALID_TXN_STATE
    wait_until(lambda: "EndTxn(commit) refused" in broker.log_text() or None, 10,
               what="the refusal in the log")
    # the producer can still abort (a bump) and go on
    assert tw.end_txn(bs, txn, pid, epoch, commit=False, version=5)[0] == tw.NONE
