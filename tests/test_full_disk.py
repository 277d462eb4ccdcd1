"""A full disk is an error, not a crash: writes fail with KAFKA_STORAGE_ERROR,
nothing unacknowledged becomes visible, nothing acknowledged is lost, and the
broker accepts writes again once space is freed.

Needs root to mount a small tmpfs as the data directory (CI runs as root).
"""

import os
import subprocess

import pytest
from confluent_kafka import KafkaError, Producer

from clients import read_all
from conftest import Broker, free_port, oncelog_bin


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        if os.geteuid() == 0:
            pytest.fail(f"mount tmpfs failed as root: {r.stderr}")
        pytest.skip(f"cannot mount a small filesystem without root: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def produce_batch(bootstrap, topic, values, timeout=20):
    """Produces values one batch at a time; returns [(value, offset or None, error)]."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                  "retries": 0, "linger.ms": 0, "message.timeout.ms": 10000})
    out = []

    def cb(err, msg):
        out.append((msg.value(), None if err else msg.offset(), err))

    for v in values:
        p.produce(topic, v, partition=0, on_delivery=cb)
        p.flush(timeout)
    assert p.flush(timeout) == 0
    return out


def test_full_disk_is_an_error_and_recovers(small_fs, tmp_path):
    b = Broker(oncelog_bin(), small_fs / "data", free_port(), tmp_path / "broker.log")
    try:
        b.start()
        topic = "fill"
        # Create the topic (auto-create through a first message).
        first = produce_batch(b.bootstrap, topic, [b"hello"])
        assert first[0][1] == 0, first
        # Leave well under 1 MiB free, then write 40 KiB batches until it fails.
        filler = small_fs / "filler"
        st = os.statvfs(small_fs)
        free = st.f_bavail * st.f_frsize
        with open(filler, "wb") as f:
            f.write(b"\0" * max(free - 600 * 1024, 0))
        values = [f"v{i:04d}".encode() + os.urandom(40 * 1024) for i in range(40)]
        results = produce_batch(b.bootstrap, topic, values)
        ok = [(v, off) for v, off, err in results if err is None]
        failed = [err for _, _, err in results if err is not None]
        assert ok, "some writes should fit before the disk is full"
        assert failed, "the disk never filled up"
        codes = {e.code() for e in failed}
        assert codes == {KafkaError.KAFKA_STORAGE_ERROR}, codes
        assert b.alive, "broker died on a full disk"
        assert "No space left" in b.log_text() or "os error 28" in b.log_text(), b.log_tail()

        # Free the space: writes are accepted again, at dense offsets.
        filler.unlink()
        more = produce_batch(b.bootstrap, topic, [b"after-1", b"after-2"])
        assert all(err is None for _, _, err in more), more
        next_off = 1 + len(ok)
        assert [off for _, off, _ in more] == [next_off, next_off + 1], (more, len(ok))

        # Everything acknowledged is there; nothing unacknowledged is.
        got = read_all(b.bootstrap, topic, until=next_off + 2, offsets=True)
        assert sorted(got) == list(range(next_off + 2))
        assert got[0] == b"hello"
        for i, (v, off) in enumerate(ok):
            assert off == i + 1 and got[off] == v
        assert got[next_off] == b"after-1" and got[next_off + 1] == b"after-2"

        # And it all survives a restart.
        b.restart()
        got2 = read_all(b.bootstrap, topic, until=next_off + 2, offsets=True)
        assert got2 == got
    finally:
        if b.alive:
            b.kill9()
