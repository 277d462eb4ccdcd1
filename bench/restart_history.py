#!/usr/bin/env python3
"""Restart time with a long coordinator history, next to an empty one.

An exactly-once job's history is its transactions and the offsets it
commits with them. This fills a fresh broker with that history: N
transactional producers (bench/java/TxnFanout.java with --offsets-group)
loop begin -> 2 records -> sendOffsetsToTransaction -> commit for S
seconds, so every transaction writes the transaction log (its state
changes) and the offsets log (its offset commit and its end). Then the
data topic is deleted (so what is measured is the coordinators' history,
not the records: add --keep-data to keep them), the broker is killed with
SIGKILL and started again R times on that data dir, and R times on an empty
one; start-up time is from process start until the
Kafka listener answers ApiVersions (the coordinators have loaded by then).
The internal logs compact themselves (coordinator.log.compact.records), so
start-up reads the live state, not the history; `--no-compact` sets that
setting past any history, for the figure without compaction.

    python3 bench/restart_history.py --oncelog target/release/oncelog \\
        --producers 64 --seconds 400 --runs 5
    # about 1,000,000 transactions and as many offset commits at ~2,500/s

Bounded: the load runs S seconds (killed at S + 240 s), every broker is
stopped by PID in finally blocks. Loopback only. Stdlib only (Python 3.11).
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txn_fanout  # noqa: E402
from txn_fanout import Oncelog, compile_java, run_fanout  # noqa: E402



def dir_bytes(path):
    """Bytes of the files under `path`."""
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file()) + \
        sum(dir_bytes(e.path) for e in os.scandir(path) if e.is_dir())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--oncelog", required=True, help="the oncelog binary")
    ap.add_argument("--producers", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=400)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-compact", action="store_true", help="no internal log compaction")
    ap.add_argument("--java-heap", default="1g")
    ap.add_argument("--keep", action="store_true", help="keep the data dirs")
    ap.add_argument("--keep-data", action="store_true",
                    help="keep the transactions' records (by default their topic is deleted after the fill)")
    args = ap.parse_args()
    args.warmup = 0
    args.size = 100
    args.partitions = "2n"
    args.offsets_group = "history"
    signal.signal(signal.SIGTERM, txn_fanout._on_signal)
    compile_java()
    root = tempfile.mkdtemp(prefix="restart-history-")
    binary = os.path.abspath(args.oncelog)
    full, empty = os.path.join(root, "full"), os.path.join(root, "empty")
    settings = []
    if args.no_compact:
        settings = ["-o", "coordinator.log.compact.records=9000000000"]
    try:
        print(f"filling: {args.producers} transactional producers for {args.seconds:.0f} s, "
              "each transaction with an offset commit", flush=True)
        fill = fill_history(binary, full, root, args, settings)
        commits = fill.get("commits") or fill.get("transactions") or fill.get("count")
        print(f"  fill result: {fill}", flush=True)
        internal = dir_bytes(os.path.join(full, "internal"))
        print(f"  internal logs on disk after the fill: {internal / 1e6:.1f} MB", flush=True)
        with_history, without = [], []
        for i in range(args.runs):
            t, loaded = timed_start_args(binary, full, os.path.join(root, f"full-{i}.log"), settings)
            with_history.append(t)
            e, _ = timed_start_args(binary, empty, os.path.join(root, f"empty-{i}.log"), settings)
            without.append(e)
            print(f"  run {i + 1}: with history {t * 1000:.0f} ms, empty {e * 1000:.0f} ms; {loaded}", flush=True)
        m_full, m_empty = statistics.median(with_history), statistics.median(without)
        print()
        print(f"transactions in history: {commits}")
        print(f"internal logs on disk: {dir_bytes(os.path.join(full, 'internal')) / 1e6:.1f} MB")
        print(f"restart, median of {args.runs}: with history {m_full * 1000:.0f} ms "
              f"(range {min(with_history) * 1000:.0f}-{max(with_history) * 1000:.0f}), "
              f"empty {m_empty * 1000:.0f} ms (range {min(without) * 1000:.0f}-{max(without) * 1000:.0f}), "
              f"ratio {m_full / m_empty:.2f}")
    finally:
        for b in list(txn_fanout.LIVE):
            b.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def timed_start_args(binary, data_dir, log_path, settings):
    b = Oncelog(binary, data_dir, log_path, start_timeout=600, settings=settings)
    t0 = time.monotonic()
    b.start()
    took = time.monotonic() - t0
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(30)
    txn_fanout.LIVE.remove(b)
    text = open(log_path, errors="replace").read()
    loaded = re.findall(r"(?:transaction|group) coordinator loaded[^\n]*", text)
    return took, [re.sub(r"^.*?(?=(transaction|group))", "", x) for x in loaded]


def fill_history(binary, data_dir, root, args, settings):
    b = Oncelog(binary, data_dir, os.path.join(root, "fill.log"), start_timeout=600, settings=settings)
    b.start()
    try:
        r = run_fanout(b.bootstrap, "history", args.producers, args, os.path.join(root, "fanout.log"))
        if not args.keep_data:
            import subprocess
            subprocess.run([binary, "topic", "delete", "history", "--bootstrap", b.bootstrap],
                           check=True, capture_output=True, timeout=120)
    finally:
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(30)
        txn_fanout.LIVE.remove(b)
    return r


if __name__ == "__main__":
    main()
