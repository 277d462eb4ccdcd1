"""log.cache.keep.bytes: after each fdatasync the broker drops the synced
part of a partition's active segment from the page cache, except its last N
bytes, and reads of the dropped data still return every record (from disk).
With -1 the kernel keeps it all, as with Kafka."""

import os
import shutil
import subprocess

import pytest
from confluent_kafka import Producer

from clients import (DeliveryTracker, consume_confluent, create_topic, produce_and_flush, producer_config,
                     unique_topic)

MIB = 1 << 20
N, SIZE = 40_000, 1024  # about 41 MiB in one partition


def resident_bytes(path):
    """Bytes of `path` in the page cache, by util-linux fincore (mincore)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def fill(b):
    topic = unique_topic("cache")
    create_topic(b.bootstrap, topic, partitions=1)
    p = Producer(producer_config(b.bootstrap, **{"linger.ms": 20, "batch.size": 1_000_000}))
    tr = DeliveryTracker()
    payload = os.urandom(SIZE)
    produce_and_flush(p, topic, ({"value": payload, "partition": 0} for _ in range(N)), tr)
    assert not tr.failed and len(tr.acked) == N
    [seg] = [s for s in b.segment_files(topic, 0)]
    assert seg.stat().st_size > N * SIZE
    return topic, seg


@pytest.fixture
def need_fincore(tmp_path):
    if not shutil.which("fincore"):
        pytest.skip("util-linux fincore is not installed")
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip()
    if fs == "tmpfs":
        pytest.skip("on tmpfs the page cache is the storage; nothing can be dropped")


def test_synced_data_is_dropped_from_the_page_cache_except_the_tail(broker_factory, need_fincore):
    keep = 4 * MIB
    b = broker_factory({"log.cache.keep.bytes": keep})
    topic, seg = fill(b)
    res = resident_bytes(seg)
    # the kept tail, plus up to 1 MiB left by rounding, plus the last sync's bytes
    assert res <= keep + 3 * MIB, f"{res / MIB:.1f} MiB of {seg.stat().st_size / MIB:.1f} MiB still cached"
    got = consume_confluent(b.bootstrap, topic, [0])[0]
    assert [r.offset for r in got] == list(range(N))
    assert all(len(r.value) == SIZE for r in got)


def test_minus_one_leaves_the_page_cache_to_the_kernel(broker_factory, need_fincore):
    b = broker_factory({"log.cache.keep.bytes": -1})
    _topic, seg = fill(b)
    assert resident_bytes(seg) >= 0.9 * seg.stat().st_size
