"""Interval-flush mode (log.flush.interval.ms > 0): produce is acknowledged
after the write, partitions are synced on the interval, and a clean restart
keeps everything."""

from confluent_kafka import Producer

from clients import DeliveryTracker, create_topic, produce_and_flush, producer_config, unique_topic, watermarks


def test_interval_flush_mode_serves_and_persists(broker_factory):
    b = broker_factory(log_flush_interval_ms=50)
    assert 'mode="interval-flush"' in b.log_text()
    topic = unique_topic("interval")
    create_topic(b.bootstrap, topic, partitions=2)
    p = Producer(producer_config(b.bootstrap))
    tr = DeliveryTracker()
    produce_and_flush(p, topic, [{"value": b"m%05d" % i, "partition": i % 2} for i in range(5000)], tr)
    assert not tr.failed and len(tr.acked) == 5000
    assert watermarks(b.bootstrap, topic, 0)[1] == 2500
    b.restart()
    assert watermarks(b.bootstrap, topic, 0)[1] == 2500
    assert watermarks(b.bootstrap, topic, 1)[1] == 2500
