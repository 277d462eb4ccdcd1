"""/metrics (Prometheus text format, parsed with prometheus_client's parser)
and /health: the LSO gap opens and closes with a transaction; open
transactions and their age; fences per transactional id and cause;
commit/abort counts; consumer-group lag."""

import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from clients import (consumer_config, create_topic, flush_all, producer_config, read_partition,
                     scrape, txn_producer, unique_topic, value)
from conftest import both_modes, free_port, wait_until


def scrape_all(brokers):
    """Every broker's /metrics, summed by sample: in a cluster each
    partition, transaction and group is reported by one broker (the one
    Metadata or FindCoordinator names), a counter by the broker that
    counted."""
    total = {}
    for b in brokers:
        for k, v in scrape(b.metrics_url).items():
            total[k] = total.get(k, 0) + v
    return total


@both_modes("broker_factory")
def test_metrics_show_lso_gap_fences_and_lag(broker_factory):
    b = broker_factory()
    brokers = getattr(b, "brokers", None) or [b]
    for x in brokers:
        with urllib.request.urlopen(f"{x.metrics_url}/health", timeout=10) as r:
            assert r.read() == b"ok\n"
    topic = unique_topic("m")
    create_topic(b.bootstrap, topic)
    p = txn_producer(b.bootstrap, "metrics-" + topic)
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=b"t%d" % i, partition=0)
    p.flush(30)
    plain = Producer(producer_config(b.bootstrap))
    for i in range(3):
        plain.produce(topic, value=b"p%d" % i, partition=0)
    flush_all(plain)

    m = scrape_all(brokers)
    assert value(m, "oncelog_partition_high_watermark", topic=topic, partition=0) == 8
    assert value(m, "oncelog_partition_last_stable_offset", topic=topic, partition=0) == 0
    assert value(m, "oncelog_partition_lso_gap", topic=topic, partition=0) == 8
    assert value(m, "oncelog_transactions_open") == 1
    assert value(m, "oncelog_transaction_oldest_open_age_seconds") >= 0

    # A newer producer with the same id fences the first: counted with its cause.
    q = txn_producer(b.bootstrap, "metrics-" + topic)
    q.init_transactions(30)
    m = scrape_all(brokers)
    assert value(m, "oncelog_transaction_fences_total", transactional_id="metrics-" + topic,
                 cause="newer_producer") == 1
    assert value(m, "oncelog_transactions_completed_total", result="abort") == 1
    assert value(m, "oncelog_partition_lso_gap", topic=topic, partition=0) == 0
    assert value(m, "oncelog_transactions_open") == 0

    q.begin_transaction()
    q.produce(topic, value=b"c", partition=0)
    q.commit_transaction(30)
    c = Consumer(consumer_config(b.bootstrap, **{"group.id": "lagging"}))
    c.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    c.close()
    m = scrape_all(brokers)
    assert value(m, "oncelog_transactions_completed_total", result="commit") == 1
    hw = value(m, "oncelog_partition_high_watermark", topic=topic, partition=0)
    assert value(m, "oncelog_group_lag", group="lagging", topic=topic, partition=0) == hw - 2
    if b.mode == "local":
        assert value(m, "oncelog_fsync_total") > 0


@both_modes("broker_factory")
def test_s6_second_writer_is_reported_and_can_be_refused(broker_factory):
    """S6: two jobs with different transactional-id prefixes both commit to
    one topic: reported in the log and in /metrics (in a cluster, by the
    broker that coordinated the later commit, which reads every broker's
    record). With writer.transactional.id.prefix set, the second job fails
    loudly and nothing of it becomes visible."""
    from confluent_kafka import KafkaException

    b = broker_factory()
    ports = [int(x.overrides["metrics.listen"].rsplit(":", 1)[1])
             for x in getattr(b, "brokers", [b])]
    topic = unique_topic("orders")
    create_topic(b.bootstrap, topic)
    for txn_id in ("orders-sink-0", "orders-sink-v2-0"):
        p = txn_producer(b.bootstrap, txn_id)
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, value=txn_id.encode(), partition=0)
        p.commit_transaction(30)
    # A cluster records a commit's writers just after answering it.
    warn = wait_until(lambda: [x for x in b.log_text().splitlines()
                               if "more than one transactional writer" in x], 10,
                      what="the second-writer warning")
    assert topic in warn[0] and "orders-sink-v2" in warn[0], warn
    assert max(value(scrape(port), "oncelog_topic_transactional_writers", topic=topic) or 0
               for port in ports) == 2

    guarded = unique_topic("orders-guarded")
    create_topic(b.bootstrap, guarded, config={"writer.transactional.id.prefix": "orders-sink"})
    ok = txn_producer(b.bootstrap, "orders-sink-1")
    ok.init_transactions(30)
    ok.begin_transaction()
    ok.produce(guarded, value=b"v1", partition=0)
    ok.commit_transaction(30)
    second = txn_producer(b.bootstrap, "orders-sink-v2-1")
    second.init_transactions(30)
    second.begin_transaction()
    second.produce(guarded, value=b"v2", partition=0)
    try:
        second.flush(10)
    except (KafkaException, SystemError):
        pass
    import pytest
    with pytest.raises(KafkaException) as e:
        second.commit_transaction(10)
    assert "authoriz" in str(e.value).lower() or "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in str(e.value), str(e.value)
    assert "second transactional writer refused" in b.log_text()
    got = read_partition(b.bootstrap, guarded, 0, 0, "read_uncommitted", 2)
    assert [v for _, v in got] == [b"v1"], "nothing of the second writer entered the log"


@both_modes("broker_factory")
def test_s2_fencing_loop_seen_through_metrics(broker_factory):
    """S2 through the tools: replicas sharing one transactional id fence each
    other in a loop; the fence counter for that id rises scrape after scrape
    (cause newer_producer; in a cluster, summed over the brokers) and the
    broker log names the id."""
    import threading
    import time
    from confluent_kafka import KafkaException
    b = broker_factory()
    ports = [int(x.overrides["metrics.listen"].rsplit(":", 1)[1])
             for x in getattr(b, "brokers", [b])]
    topic = unique_topic("m-s2")
    create_topic(b.bootstrap, topic)
    tid = "fare-writer-" + topic

    def fences():
        return sum(value(scrape(port), "oncelog_transaction_fences_total",
                         transactional_id=tid, cause="newer_producer") or 0 for port in ports)

    deadline = time.monotonic() + 6
    inits = [0]
    lock = threading.Lock()

    def replica():
        while time.monotonic() < deadline:
            p = txn_producer(b.bootstrap, tid, **{"transaction.timeout.ms": 5000,
                                                  "message.timeout.ms": 5000})
            try:
                p.init_transactions(10)
                with lock:
                    inits[0] += 1
                while time.monotonic() < deadline:
                    p.begin_transaction()
                    p.produce(topic, value=b"x", partition=0)
                    p.commit_transaction(10)
            except (KafkaException, SystemError):
                pass

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        samples.append(fences())
        time.sleep(1)
    for t in threads:
        t.join(30)
    samples.append(fences())
    assert samples == sorted(samples), f"a counter never goes down: {samples}"
    assert samples[-1] >= 3 and samples[-1] > samples[0], samples
    # Every init after the first that found a previous producer fenced it.
    assert samples[-1] <= inits[0]
    alarms = [x for x in b.log_text().splitlines() if "WARN" in x and tid in x and "fenced" in x]
    assert alarms, "the log names the fenced id"


def test_latency_histograms(broker_factory):
    """Request latency per API, fsync latency and bytes per sync, and
    transaction durations are Prometheus histograms whose buckets add up."""
    port = free_port()
    b = broker_factory({"metrics.listen": f"127.0.0.1:{port}"})
    topic = unique_topic("m-h")
    create_topic(b.bootstrap, topic)
    p = Producer(producer_config(b.bootstrap))
    for i in range(200):
        p.produce(topic, value=b"v" * 1000, partition=0)
    flush_all(p)
    t = txn_producer(b.bootstrap, "hist-" + topic)
    t.init_transactions(30)
    for commit in (True, True, False):
        t.begin_transaction()
        t.produce(topic, value=b"t", partition=0)
        t.flush(30)
        (t.commit_transaction if commit else t.abort_transaction)(30)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    for name in ["oncelog_request_latency_seconds", "oncelog_fsync_latency_seconds",
                 "oncelog_fsync_bytes", "oncelog_transaction_duration_seconds"]:
        assert fams[name].type == "histogram", name

    def hist(name, **labels):
        got = {}
        for s in fams[name].samples:
            if all(s.labels.get(k) == v for k, v in labels.items()):
                got.setdefault(s.name[len(name):], []).append((s.labels.get("le"), s.value))
        return got

    produce = hist("oncelog_request_latency_seconds", api="Produce")
    count = produce["_count"][0][1]
    assert count >= 1
    buckets = produce["_bucket"]
    assert buckets[-1] == ("+Inf", count)
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    assert hist("oncelog_request_latency_seconds", api="EndTxn")["_count"][0][1] == 3
    assert hist("oncelog_transaction_duration_seconds", result="commit")["_count"][0][1] == 2
    assert hist("oncelog_transaction_duration_seconds", result="abort")["_count"][0][1] == 1
    syncs = value(scrape(port), "oncelog_fsync_total")
    assert hist("oncelog_fsync_latency_seconds")["_count"][0][1] >= 1
    assert hist("oncelog_fsync_latency_seconds")["_count"][0][1] <= syncs
    sizes = hist("oncelog_fsync_bytes")
    assert sizes["_sum"][0][1] > 0
