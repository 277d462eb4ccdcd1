"""Live verification (docs/exactly-once.md, "Verified live"): the broker
reads back what it committed and checks it from the bytes alone, and
against the coordinator's committed transactions, in both modes.

A sound log, written by transactional (committing and aborting),
idempotent and plain producers, with DeleteRecords, is verified through
its last stable offset with nothing reported. Planted faults are each
reported with their exact offsets: a COMMIT marker removed from storage,
a committed batch changed with its CRC fixed up, and a transaction whose
COMMIT the broker wrote to one of its two partitions only."""

import json
import struct
import time
import urllib.request

import pytest
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import kafka_wire as kw
from clients import (cli, verify_report, consumer_config, create_topic, end_offset, producer_config, read_partition,
                     txn_producer, unique_topic)
from conftest import both_modes, wait_until

FAST = {"verify.scrub.interval.ms": "300"}
CONTROL = 0x20


def brokers_of(b):
    return getattr(b, "brokers", [b])


def status(b):
    return verify_report(b)


def settled(b, topics, passes=1):
    """Every partition of `topics` verified through its LSO, after `passes`
    passes since the call."""
    start = {k: p["passes"] for k, p in status(b)["partitions"].items()}

    # the partitions' LSOs now (the record may lag by a round)
    lsos = {}

    def done():
        s = status(b)["partitions"]
        ps = [p for (t, _), p in s.items() if t in topics]
        for p in ps:
            k = (p["topic"], p["partition"])
            if k not in lsos:
                lsos[k] = end_offset(b.bootstrap, *k)
        return ps and all(p["verified_through"] == p["last_stable_offset"] == lsos[(p["topic"], p["partition"])]
                          and p["passes"] >= start.get((p["topic"], p["partition"]), 0) + passes
                          for p in ps)
    wait_until(done, 60, interval=0.3, what=f"verification of {topics} to settle",
               on_timeout=lambda: print(json.dumps(list(status(b)["partitions"].values()), indent=1)))


def anomalies(b, kind=None):
    return [a for a in status(b)["anomalies"] if kind is None or a["kind"] == kind]


def write_transactions(b, topic, txn_id, rounds, partitions=2, abort_every=3):
    p = txn_producer(b.bootstrap, txn_id)
    p.init_transactions(30)
    for r in range(rounds):
        p.begin_transaction()
        for i in range(6):
            p.produce(topic, key=f"k{i}", value=f"{txn_id}-{r}-{i}", partition=i % partitions)
        p.flush(30)
        if r % abort_every == abort_every - 1:
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)


@both_modes("broker_factory")
def test_a_sound_log_is_verified_through_its_lso_with_nothing_to_report(broker_factory):
    b = broker_factory(FAST)
    topic, plain = unique_topic("v-sound"), unique_topic("v-plain")
    create_topic(b.bootstrap, topic, 2)
    create_topic(b.bootstrap, plain, 1)
    write_transactions(b, topic, "v-sound-a", 6)
    idem = Producer(producer_config(b.bootstrap, **{"enable.idempotence": True}))
    for i in range(300):
        idem.produce(topic, value=f"i{i}", partition=i % 2)
        idem.produce(plain, value=f"p{i}")
    idem.flush(30)
    write_transactions(b, topic, "v-sound-b", 4)
    # DeleteRecords moves a log start past what was verified
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    fs = admin.delete_records([TopicPartition(topic, 0, 20)])
    for f in fs.values():
        f.result(30)
    write_transactions(b, topic, "v-sound-a", 3)
    settled(b, {topic, plain}, passes=2)
    for one in brokers_of(b):
        # exit status 0: nothing found
        table, _ = cli(one, "verify", "status", admin=one.metrics_url, json_out=False)
        assert "no anomalies" in table, table
    s = status(b)
    assert s["anomalies"] == [], s["anomalies"]
    assert all(n == 0 for n in s["anomalies_total"].values()), s["anomalies_total"]
    p0 = s["partitions"][(topic, 0)]
    assert p0["log_start_offset"] == 20 and p0["verified_through"] > 20
    metrics = "\n".join(urllib.request.urlopen(f"{one.metrics_url}/metrics", timeout=10).read().decode()
                        for one in brokers_of(b))
    verified = [line for line in metrics.splitlines()
                if line.startswith("oncelog_verified_offset{") and f'topic="{topic}"' in line]
    assert len(verified) == 2, verified
    assert 'oncelog_verify_anomalies_total{kind="digest_changed"} 0' in metrics


def stored_batches(b, topic, partition):
    """[(BatchInfo, bytes)] of the partition as stored, base offsets set."""
    data = b.stored_logs(topic, partition)
    data = b"".join(data) if isinstance(data, list) else data
    return [(x, data[x.pos:x.pos + x.size]) for x in kw.walk_batches(data)]


def varint(data, pos):
    shift = z = 0
    while True:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7


def is_commit(batch):
    # the control record's key: version (int16), type (int16; COMMIT = 1)
    _, pos = varint(batch, 61)  # record length
    pos += 1  # attributes
    _, pos = varint(batch, pos)  # timestamp delta
    _, pos = varint(batch, pos)  # offset delta
    klen, pos = varint(batch, pos)
    return klen >= 4 and struct.unpack_from(">h", batch, pos + 2)[0] == 1


def changed(batch):
    """The batch with its last value byte changed and its CRC fixed up."""
    out = bytearray(batch)
    out[-2] ^= 0x01
    struct.pack_into(">I", out, 17, kw.crc32c(bytes(out[21:])))
    return bytes(out)


def plant_changed_batch(b, topic, partition, info, batch):
    new = changed(batch)
    if b.mode == "cluster":
        row = b.sql("SELECT b.object_key, b.position, b.inline_data IS NOT NULL FROM batches b "
                    "JOIN topics t ON t.id = b.topic_id WHERE t.name = %s AND b.partition = %s "
                    "AND b.base_offset = %s", topic, partition, info.base_offset)[0]
        key, position, inline = row
        if inline:
            # stored with the client's base offset: keep the stored one
            stored = b.sql("SELECT b.inline_data FROM batches b JOIN topics t ON t.id = b.topic_id "
                           "WHERE t.name = %s AND b.partition = %s AND b.base_offset = %s",
                           topic, partition, info.base_offset)[0][0]
            b.sql("UPDATE batches b SET inline_data = %s FROM topics t WHERE t.id = b.topic_id "
                  "AND t.name = %s AND b.partition = %s AND b.base_offset = %s RETURNING 1",
                  bytes(stored[:8]) + new[8:], topic, partition, info.base_offset)
        else:
            root = Path(b.store.removeprefix("file://"))
            [path] = [f for f in root.rglob("*") if f.is_file() and str(f).endswith(key)]
            with open(path, "r+b") as f:
                f.seek(position + 8)
                f.write(new[8:])
    else:
        seg = b.segment_files(topic, partition)[0]
        data = open(seg, "rb").read()
        at = data.index(batch)
        with open(seg, "r+b") as f:
            f.seek(at)
            f.write(new)


def plant_removed_marker(b, topic, partition, info, batch):
    if b.mode == "cluster":
        b.sql("DELETE FROM batches b USING topics t WHERE t.id = b.topic_id AND t.name = %s "
              "AND b.partition = %s AND b.base_offset = %s AND b.control RETURNING b.base_offset",
              topic, partition, info.base_offset)
        return b
    b.stop()
    for seg in b.segment_files(topic, partition):
        data = open(seg, "rb").read()
        if batch in data:
            at = data.index(batch)
            open(seg, "wb").write(data[:at] + data[at + len(batch):])
    d = b.partition_dir(topic, partition)
    for f in d.iterdir():
        if f.suffix in (".index", ".timeindex", ".snapshot"):
            f.unlink()
    b.start()
    return b


def test_planted_faults_are_reported_with_their_offsets(broker_factory):
    planted_faults(broker_factory(FAST))


def test_planted_faults_are_reported_with_their_offsets_in_a_cluster(cluster_factory):
    # objects in files, to change one at rest
    planted_faults(cluster_factory(store="file", overrides=FAST))


def planted_faults(b):
    topic = unique_topic("v-plant")
    create_topic(b.bootstrap, topic, 2)
    # the same producer's transactions follow each other, so a removed
    # COMMIT leaves the log readable and only its offset missing
    write_transactions(b, topic, "v-plant", 6, abort_every=100)
    settled(b, {topic})
    assert anomalies(b) == []

    # 1. a committed batch's bytes changed, its CRC fixed up (at rest)
    batches = stored_batches(b, topic, 0)
    data = [(i, x) for i, x in batches if not i.attributes & CONTROL]
    info, batch = data[2]
    plant_changed_batch(b, topic, 0, info, batch)
    wait_until(lambda: anomalies(b, "digest_changed"), 30, interval=0.3,
               what="the changed batch to be reported")
    [a] = anomalies(b, "digest_changed")
    assert (a["topic"], a["partition"], a["first_offset"], a["last_offset"]) == \
        (topic, 0, info.base_offset, info.last_offset), a
    assert f"verify: the batch at {info.base_offset}..={info.last_offset}" in \
        "\n".join(one.log_text() for one in brokers_of(b))

    # 2. a COMMIT marker removed from storage
    commits = [(i, x) for i, x in stored_batches(b, topic, 1) if i.attributes & CONTROL and is_commit(x)]
    info, batch = commits[2]
    b = plant_removed_marker(b, topic, 1, info, batch)
    wait_until(lambda: anomalies(b, "offset_gap"), 30, interval=0.3,
               what="the removed marker to be reported")
    [a] = anomalies(b, "offset_gap")
    assert (a["topic"], a["partition"], a["first_offset"], a["last_offset"]) == \
        (topic, 1, info.base_offset, info.base_offset), a
    # the CLI names them, and exits 1
    reports = []
    for one in brokers_of(b):
        out, p = cli(one, "verify", "status", topic, admin=one.metrics_url, json_out=False, check=False)
        assert p.returncode in (0, 1), p.stderr
        reports.append((p.returncode, out))
    assert any(rc == 1 and "offset_gap" in out and f"{topic}-1" in out for rc, out in reports), reports


@both_modes("broker_factory")
def test_a_commit_written_to_one_of_two_partitions_is_commit_missing(broker_factory):
    b = broker_factory(FAST, start=False)
    for one in brokers_of(b):
        one.env["ONCELOG_FAULTS"] = "commit-one-partition:v-torn"
    b.start()
    topic = unique_topic("v-torn")
    create_topic(b.bootstrap, topic, 2)
    p = txn_producer(b.bootstrap, "v-torn-1")
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(4):
        p.produce(topic, value=f"torn-{i}", partition=i % 2)
    p.flush(30)
    p.commit_transaction(30)
    started = time.time()
    wait_until(lambda: anomalies(b, "commit_missing"), 40, interval=0.5,
               what="the missing COMMIT to be reported")
    [a] = anomalies(b, "commit_missing")
    # the COMMIT went to the first partition the transaction added
    assert a["topic"] == topic and a["producer_id"] >= 0, a
    assert a["first_offset"] == 0, a
    assert "v-torn-1" in a["detail"], a
    print(f"commit_missing reported {time.time() - started:.1f} s after the commit")


@both_modes("broker_factory")
def test_a_business_key_committed_twice_names_both_writers(broker_factory):
    """The seed's doubled orders: two writers (transactional ids of two
    prefixes) commit the same order ids; each doubled order is reported once,
    naming both. Aborted records and idempotent re-sends never count."""
    b = broker_factory(FAST)
    topic = unique_topic("v-orders")
    create_topic(b.bootstrap, topic, 3, config={"verify.unique.key": "/order_id"})

    def write(txn_id, orders, commit=True):
        p = txn_producer(b.bootstrap, txn_id)
        p.init_transactions(30)
        p.begin_transaction()
        for o in orders:
            p.produce(topic, key=o, value=json.dumps({"order_id": o, "fare": 12.5}))
        p.produce(topic, value=b"not json")  # no key: not checked
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)

    write("orders-sink-0", [f"o-{i}" for i in range(40)])
    write("orders-sink-v2-0", [f"o-{i}" for i in range(30, 60)], commit=False)  # aborted: nothing
    settled(b, {topic})
    assert anomalies(b) == []
    started = time.time()
    write("orders-sink-v2-0", [f"o-{i}" for i in range(35, 55)])  # o-35..o-39 doubled
    wait_until(lambda: len(anomalies(b, "duplicate_key")) >= 5, 15, interval=0.2,
               what="the doubled orders to be reported")
    print(f"first duplicates reported {time.time() - started:.1f} s after the commit")
    time.sleep(2)
    dups = anomalies(b, "duplicate_key")
    assert len(dups) == 5, [d["detail"] for d in dups]
    assert sorted(d["detail"].split()[1] for d in dups) == [f"o-{i}" for i in range(35, 40)]
    for d in dups:
        assert "transactional id orders-sink-0 (writer orders-sink" in d["detail"], d
        assert "again at" in d["detail"] and "transactional id orders-sink-v2-0" in d["detail"], d
    s = status(b)
    assert s["anomalies_total"]["duplicate_key"] == 5
    [u] = [u for u in s["unique"] if u["topic"] == topic]
    assert u["keys"] == 55 and u["evicted"] == 0, u


def copy(b, group, txn_id, src, dst, batch=40, idle_s=2.0, **producer):
    """A transactional copier (consume-transform-produce): copies what
    `group` has not yet committed of `src` into `dst`, committing its input
    offsets in each transaction, until `src` has been idle for idle_s."""
    c = Consumer(consumer_config(b.bootstrap, **{"group.id": group, "enable.auto.commit": False,
                                                 "auto.offset.reset": "earliest"}))
    p = txn_producer(b.bootstrap, txn_id, **producer)
    p.init_transactions(30)
    c.subscribe([src])
    copied, idle_since = 0, None
    deadline = time.time() + 30
    try:
        while idle_since is None or time.time() - idle_since < idle_s:
            msgs = [m for m in c.consume(batch, timeout=0.5) if not m.error()]
            if idle_since is None and c.assignment():
                idle_since = time.time()  # joined: from now on, idle means done
            assert time.time() < deadline or idle_since, "the copier never joined its group"
            if not msgs:
                continue
            idle_since = time.time()
            p.begin_transaction()
            for m in msgs:
                p.produce(dst, key=m.key(), value=b"out:" + m.value(), partition=m.partition())
            p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
            p.commit_transaction(30)
            copied += len(msgs)
    finally:
        c.close()
    return copied


@both_modes("broker_factory")
def test_pipeline_lineage_names_two_groups_doing_the_same_work(broker_factory):
    """Consume-transform-produce copiers that commit their input offsets in
    their transactions: one group going on (restarted, and reset by an
    operator) is fine, and so is another group into another output; a second
    group copying the same input into the same output is double processing,
    reported naming both groups and writers, on each input partition."""
    b = broker_factory(FAST)
    src, dst, other = unique_topic("v-in"), unique_topic("v-out"), unique_topic("v-other")
    for t in (src, dst, other):
        create_topic(b.bootstrap, t, 2)
    feed = Producer(producer_config(b.bootstrap))

    def produce(n, tag):
        for i in range(n):
            feed.produce(src, key=f"k{i}", value=f"{tag}-{i}", partition=i % 2)
        feed.flush(30)

    produce(200, "a")
    assert copy(b, "lin-a", "lin-a-0", src, dst) == 200
    produce(100, "b")
    assert copy(b, "lin-a", "lin-a-1", src, dst) == 100  # the group goes on, from another instance
    # an operator resets group a to the start; it copies everything again
    c = Consumer(consumer_config(b.bootstrap, **{"group.id": "lin-a", "enable.auto.commit": False}))
    c.commit(offsets=[TopicPartition(src, p, 0) for p in range(2)], asynchronous=False)
    c.close()
    assert copy(b, "lin-a", "lin-a-0", src, dst) == 300
    assert copy(b, "lin-c", "lin-c-0", src, other) == 300  # fan-out into another topic
    time.sleep(2.5)  # a round settles the last offers
    assert anomalies(b) == [], anomalies(b)

    # a second group doing the same work into the same output
    assert copy(b, "lin-b", "lin-b-0", src, dst) == 300
    wait_until(lambda: {a["partition"] for a in anomalies(b, "double_processing")} == {0, 1}, 15,
               interval=0.3, what="double processing to be reported on both input partitions",
               on_timeout=lambda: anomalies(b))
    for a in anomalies(b, "double_processing"):
        assert a["topic"] == src, a
        d = a["detail"]
        assert "group lin-b (writer lin-b-0)" in d and "group lin-a (writer lin-a-0)" in d, d
        assert f"into {dst}" in d and f"same topic {dst}" in d, d
    assert anomalies(b, "recommitted_range") == []


@both_modes("broker_factory")
def test_the_lineage_fence_refuses_a_second_group_and_the_output_stays_exact(broker_factory):
    """verify.lineage.enforce=true on the output: a second group copying the
    same input into it, after a kill -9 of the broker(s), is refused at its
    first transactional offset commit (TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    whatever its transactional id), nothing of it is committed, and the
    first group goes on."""
    b = broker_factory(FAST)
    src, dst = unique_topic("v-fin"), unique_topic("v-fout")
    create_topic(b.bootstrap, src, 2)
    create_topic(b.bootstrap, dst, 2, config={"verify.lineage.enforce": "true"})
    feed = Producer(producer_config(b.bootstrap))
    for i in range(200):
        feed.produce(src, value=f"a-{i}", partition=i % 2)
    feed.flush(30)
    assert copy(b, "fence-a", "fence-a-0", src, dst) == 200
    time.sleep(2.5)  # a round settles a's last commit, and local mode writes it down
    # the fence holds across a kill -9 of the broker
    b.kill9()
    b.start()
    with pytest.raises(KafkaException) as refused:
        copy(b, "fence-b", "fence-b-0", src, dst, transaction_timeout_ms=3000, message_timeout_ms=3000)
    assert "authoriz" in str(refused.value).lower(), refused.value
    # recorded within a round of the verification
    wait_until(lambda: [a for a in anomalies(b, "double_processing") if "refused" in a["detail"]],
               10, interval=0.2, what="the refusal to be recorded")
    [a] = [a for a in anomalies(b, "double_processing") if "refused" in a["detail"]][:1]
    assert "lineage fence" in a["detail"] and "group fence-b" in a["detail"], a
    assert "TxnOffsetCommit refused: lineage fence" in "\n".join(one.log_text() for one in brokers_of(b))

    # b's open transaction is aborted at its timeout; the output is a's copy
    def stable():
        return all(end_offset(b.bootstrap, dst, p) == end_offset(b.bootstrap, dst, p, "read_uncommitted")
                   for p in range(2))
    wait_until(stable, 30, interval=0.5, what="b's transaction to be aborted")
    values = []
    for p in range(2):
        end = end_offset(b.bootstrap, dst, p)
        values += [v for _, v in read_partition(b.bootstrap, dst, p, 0, "read_committed", end)]
    assert sorted(values) == sorted(f"out:a-{i}".encode() for i in range(200))
    # the same group goes on, from another instance
    for i in range(200, 260):
        feed.produce(src, value=f"a-{i}", partition=i % 2)
    feed.flush(30)
    assert copy(b, "fence-a", "fence-a-1", src, dst) == 60


@both_modes("broker_factory")
def test_progress_and_findings_are_kept_across_a_kill9(broker_factory):
    """The record survives the broker: after kill -9 and a start, each
    partition goes on from where it was verified through (the log is not
    read again: no pass is due), the anomaly found before is shown and
    counted once and not reported again. In a cluster every broker answers
    for every partition."""
    b = broker_factory({"verify.scrub.interval.ms": "3600000"})
    topic, orders = unique_topic("v-kept"), unique_topic("v-kept-orders")
    create_topic(b.bootstrap, topic, 2)
    create_topic(b.bootstrap, orders, 1, config={"verify.unique.key": "record-key"})
    write_transactions(b, topic, "v-kept-a", 40, abort_every=100)
    for tid in ("v-kept-one", "v-kept-two"):
        p = txn_producer(b.bootstrap, tid)
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(orders, key="order-7", value=tid)
        p.commit_transaction(30)
    wait_until(lambda: anomalies(b, "duplicate_key"), 20, interval=0.3, what="the doubled key")
    settled(b, {topic, orders}, passes=0)
    before = status(b)
    for one in brokers_of(b):
        # each broker answers for every partition
        assert {(topic, 0), (topic, 1), (orders, 0)} <= set(verify_report(one)["partitions"]), one
    time.sleep(6)  # local mode writes its progress down every 5 s
    size = sum(len(x) for q in (0, 1) for x in b.stored_logs(topic, q))
    b.kill9()
    b.start()
    write_transactions(b, topic, "v-kept-a", 2, abort_every=100)
    settled(b, {topic, orders}, passes=0)
    after = status(b)
    for q in (0, 1):
        assert after["partitions"][(topic, q)]["verified_through"] > \
            before["partitions"][(topic, q)]["verified_through"]
    # only what came since was read back (the business keys' topic is read
    # again for its window: a few hundred bytes)
    read_back = sum(json.load(urllib.request.urlopen(f"{one.metrics_url}/v1/verify", timeout=10))
                    ["scrubbed_bytes"] for one in brokers_of(b))
    assert read_back < size / 2, (read_back, size)
    [dup] = anomalies(b, "duplicate_key")
    assert "order-7" in dup["detail"], dup
    assert after["anomalies_total"]["duplicate_key"] == 1, after["anomalies_total"]
    assert "verify:" not in b.log_text(since_last_start=True)
