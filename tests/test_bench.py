"""The benchmark suite runs end to end (a tiny load, one run) with every load
generator, and its figures are the broker's: every message sent is
acknowledged, the broker's own counters saw the bytes, and the same-run
baseline was measured. Rates are not asserted (speed is for the bench)."""

import json
import subprocess
import sys
import time

import pytest

from clients import consume_confluent, create_topic
from conftest import REPO_ROOT, oncelog_bin


@pytest.mark.parametrize("client", ["python", "native", "wire"])
def test_suite_durable_smoke(tmp_path, client):
    out = tmp_path / "suite.json"
    cmd = [sys.executable, str(REPO_ROOT / "bench" / "suite.py"), "--binary", str(oncelog_bin()),
           "--client", client, "--only", "durable", "--runs", "1", "--seconds", "2", "--warmup", "1",
           "--sizes", "1024", "--partitions", "1,3", "--producers", "1", "--baseline-seconds", "1",
           "--dir", str(tmp_path), "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "durable produce, median of 1 runs" in p.stdout
    d = json.loads(out.read_text())
    assert [(r["size"], r["partitions"]) for r in d["durable"]] == [(1024, 1), (1024, 3)]
    for row in d["durable"]:
        run = row["runs"][0]
        assert run["errors"] == 0, run["last_error"]
        assert run["sent"] > 0 and run["acked"] == run["sent"]
        assert run["msgs_per_s"] > 0
        # the broker's own counters: at least the acknowledged payload was
        # appended, and group commit synced it
        assert run["appended_bytes"] >= run["acked"] * 1024
        assert run["fsyncs"] > 0 and run["bytes_per_sync"] > 0
        assert run["baseline_mb_per_s"] > 0 and run["ratio"] > 0


def run_bench_wire(b, topic, tmp_path, *extra):
    """`oncelog bench-wire` through its line protocol: ready, go, JSON."""
    lat = tmp_path / "lat.f32"
    cmd = [str(oncelog_bin()), "bench-wire", "--bootstrap", b.bootstrap, "--topic", topic,
           "--latency-file", str(lat), "--flush-timeout", "30", *extra]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        p.stdin.write(f"go {time.monotonic() + 0.05!r} 0.0 3.0\n")
        p.stdin.flush()
        out = json.loads(p.stdout.readline())
        assert p.wait(30) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    return out, lat.stat().st_size // 4


def test_bench_wire_batches_are_read_back_by_a_real_consumer(broker, tmp_path):
    """The wire generator builds its record batches itself; a librdkafka
    consumer must read back exactly what it reports as acknowledged, in
    order, with the payload size asked for."""
    topic = "bench-wire"
    create_topic(broker.bootstrap, topic, partitions=3)
    out, n_lat = run_bench_wire(broker, topic, tmp_path, "--partitions", "3", "--size", "100",
                                "--request-bytes", "30000", "--max-msgs", "3000")
    assert out["ok"] and out["unflushed"] == 0
    per_req = out["msgs_per_request"]
    assert per_req == 3 * (30000 // 3 // 116)
    assert out["acked_all"] == out["sent"] >= 3000
    assert n_lat == out["acked_window"] > 0
    got = consume_confluent(broker.bootstrap, topic, [0, 1, 2])
    # the warm-up request plus the measured ones, spread evenly
    for p, recs in got.items():
        assert len(recs) == (out["acked_all"] + per_req) // 3, p
        assert [r.offset for r in recs] == list(range(len(recs)))
        assert {len(r.value) for r in recs} == {100}
        assert all(r.key is None for r in recs)
    assert broker.alive


def test_bench_wire_fixed_rate_keeps_its_rate(broker, tmp_path):
    topic = "bench-wire-rate"
    create_topic(broker.bootstrap, topic, partitions=1)
    out, n_lat = run_bench_wire(broker, topic, tmp_path, "--rate", "2000", "--linger-ms", "10")
    assert out["ok"] and out["acked_all"] == out["sent"]
    # 3 s at 2000 msgs/s in requests of 20 messages
    assert out["msgs_per_request"] == 20
    assert 5400 <= out["acked_window"] <= 6020, out


def test_suite_ack_section_smoke(tmp_path):
    out = tmp_path / "suite.json"
    cmd = [sys.executable, str(REPO_ROOT / "bench" / "suite.py"), "--binary", str(oncelog_bin()),
           "--only", "ack", "--runs", "1", "--seconds", "2", "--warmup", "1", "--producers", "1",
           "--baseline-seconds", "1", "--dir", str(tmp_path), "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "produce ack latency at 50% load, median of 1 runs" in p.stdout
    run = json.loads(out.read_text())["ack"]["runs"][0]
    assert run["errors"] == 0 and run["acked"] == run["sent"] > 0
    assert run["peak_msgs_per_s"] > 0 and run["target_msgs_per_s"] == pytest.approx(run["peak_msgs_per_s"] / 2)
    assert run["ack_p99_ms"] > 0 and run["fdatasync_p99_ms"] > 0


def test_txn_fanout_smoke(tmp_path):
    """bench/txn_fanout.py end to end against this broker (Java producers,
    a tiny window): every producer commits, the figures are its own."""
    out = tmp_path / "fanout.json"
    cmd = [sys.executable, str(REPO_ROOT / "bench" / "txn_fanout.py"),
           "--oncelog", f"this={oncelog_bin()}", "--producers", "2,4", "--seconds", "2",
           "--warmup", "1", "--runs", "1", "--java-heap", "256m", "--tmp", str(tmp_path),
           "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "| this | 4 |" in p.stdout, p.stdout[-3000:]
    d = json.loads(out.read_text())
    rows = sorted(d["results"], key=lambda r: r["producers"])
    assert [(r["target"], r["producers"]) for r in rows] == [("this", 2), ("this", 4)]
    for r in rows:
        assert r["commits"] > 0 and r["commits_per_s"] > 0, r
        assert 0 < r["commit_p50_ms"] <= r["commit_p99_ms"], r
        assert r["stopped_producers"] == 0 or r["error_kinds"], r


def test_console_bench_smoke(tmp_path):
    """bench/console_bench.py end to end at a tiny size: every view renders
    in headless Chromium and its figures are printed."""
    out = tmp_path / "console.json"
    cmd = [sys.executable, str(REPO_ROOT / "bench" / "console_bench.py"), "--oncelog", str(oncelog_bin()),
           "--partitions", "20", "--topics", "2", "--ids", "10", "--open", "2", "--runs", "1",
           "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    d = json.loads(out.read_text())
    for view in ("overview", "transactions", "stuck", "topic", "groups", "/health (plain text)"):
        assert d[view]["load_ms"] > 0 and d[view]["json_bytes"] > 0, (view, d[view])
    assert "console page load, 20 partitions" in p.stdout
