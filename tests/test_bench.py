"""The benchmark suite runs end to end (a tiny load, one run) with both load
generators, and its figures are the broker's: every message sent is
acknowledged, the broker's own counters saw the bytes, and the same-run
baseline was measured. Rates are not asserted (speed is for the bench)."""

import json
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, oncelog_bin


@pytest.mark.parametrize("client", ["python", "native"])
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
