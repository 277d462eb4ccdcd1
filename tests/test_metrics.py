"""/metrics (Prometheus text format, parsed with prometheus_client's parser)
and /health: the LSO gap opens and closes with a transaction; open
transactions and their age; fences per transactional id and cause;
commit/abort counts; consumer-group lag."""

import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from clients import consumer_config, create_topic, flush_all, producer_config, unique_topic
from conftest import free_port
from test_transactions import txn_producer


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))))


def test_metrics_show_lso_gap_fences_and_lag(broker_factory):
    port = free_port()
    b = broker_factory({"metrics.listen": f"127.0.0.1:{port}"})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
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

    m = scrape(port)
    assert value(m, "oncelog_partition_high_watermark", topic=topic, partition=0) == 8
    assert value(m, "oncelog_partition_last_stable_offset", topic=topic, partition=0) == 0
    assert value(m, "oncelog_partition_lso_gap", topic=topic, partition=0) == 8
    assert value(m, "oncelog_transactions_open") == 1
    assert value(m, "oncelog_transaction_oldest_open_age_seconds") >= 0

    # A newer producer with the same id fences the first: counted with its cause.
    q = txn_producer(b.bootstrap, "metrics-" + topic)
    q.init_transactions(30)
    m = scrape(port)
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
    m = scrape(port)
    assert value(m, "oncelog_transactions_completed_total", result="commit") == 1
    hw = value(m, "oncelog_partition_high_watermark", topic=topic, partition=0)
    assert value(m, "oncelog_group_lag", group="lagging", topic=topic, partition=0) == hw - 2
    assert value(m, "oncelog_fsync_total") > 0


def test_s6_second_writer_is_reported_and_can_be_refused(broker_factory):
    """S6: two jobs with different transactional-id prefixes both commit to
    one topic: reported in the log and in /metrics. With
    writer.transactional.id.prefix set, the second job fails loudly and
    nothing of it becomes visible."""
    from confluent_kafka import KafkaException

    from test_transactions import read_partition

    port = free_port()
    b = broker_factory({"metrics.listen": f"127.0.0.1:{port}"})
    topic = unique_topic("orders")
    create_topic(b.bootstrap, topic)
    for txn_id in ("orders-sink-0", "orders-sink-v2-0"):
        p = txn_producer(b.bootstrap, txn_id)
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, value=txn_id.encode(), partition=0)
        p.commit_transaction(30)
    warn = [x for x in b.log_text().splitlines() if "more than one transactional writer" in x]
    assert warn and topic in warn[0] and "orders-sink-v2" in warn[0], warn
    assert value(scrape(port), "oncelog_topic_transactional_writers", topic=topic) == 2

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
