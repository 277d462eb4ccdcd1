#!/usr/bin/env python3
"""Transaction overhead benchmark for oncelog.

One fresh broker per run. In each run, the same 1 KiB acks=all load from
confluent-kafka (librdkafka) is sent as: an idempotent producer without
transactions (the baseline), then a transactional producer committing every
10, 100 and 1000 ms. Reports msgs/s and the overhead against the baseline,
and the commit latency p50/p99. Medians over --runs runs. Bounded by
--messages and --seconds per load. Loopback only.

    .venv/bin/python bench/txn_bench.py --runs 3
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from produce_bench import ROOT, free_port, pct, wait_port  # noqa: E402


def run_load(bootstrap, topic, size, messages, seconds, txn_ms):
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 200_000,
        "queue.buffering.max.kbytes": 512 * 1024,
    }
    if txn_ms:
        conf["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    p = Producer(conf)
    if txn_ms:
        p.init_transactions(30)
    payload = os.urandom(size)
    errors = [0]
    commits = []

    def cb(err, _msg):
        if err is not None:
            errors[0] += 1

    start = time.perf_counter()
    sent = 0
    in_txn = False
    txn_started = 0.0
    while sent < messages and time.perf_counter() - start < seconds:
        if txn_ms and not in_txn:
            p.begin_transaction()
            in_txn = True
            txn_started = time.perf_counter()
        try:
            p.produce(topic, payload, on_delivery=cb)
            sent += 1
        except BufferError:
            p.poll(0.005)
        if sent % 1000 == 0:
            p.poll(0)
        if in_txn and (time.perf_counter() - txn_started) * 1000 >= txn_ms:
            t0 = time.perf_counter()
            p.commit_transaction(60)
            commits.append((time.perf_counter() - t0) * 1000)
            in_txn = False
    if in_txn:
        t0 = time.perf_counter()
        p.commit_transaction(60)
        commits.append((time.perf_counter() - t0) * 1000)
    left = p.flush(60)
    elapsed = time.perf_counter() - start
    return {
        "msgs_per_s": (sent - errors[0]) / elapsed,
        "errors": errors[0] + left,
        "commits": len(commits),
        "commit_p50_ms": pct(commits, 50) if commits else float("nan"),
        "commit_p99_ms": pct(commits, 99) if commits else float("nan"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.environ.get("ONCELOG_BIN", os.path.join(ROOT, "target/release/oncelog")))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=150_000)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--intervals", default="10,100,1000")
    args = ap.parse_args()
    intervals = [0] + [int(x) for x in args.intervals.split(",")]
    results = {k: [] for k in intervals}
    base = os.path.join(ROOT, "target")
    os.makedirs(base, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base, prefix="txnbench-") as tmp:
        for run in range(args.runs):
            port = free_port()
            log = open(os.path.join(tmp, f"broker-{run}.log"), "w")
            proc = subprocess.Popen([args.binary, "serve", "--data-dir", os.path.join(tmp, f"d{run}"),
                                     "--listen", f"127.0.0.1:{port}", "--metrics-listen", ""], stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_port(port)
                bootstrap = f"127.0.0.1:{port}"
                admin = AdminClient({"bootstrap.servers": bootstrap})
                for k in intervals:
                    topic = f"t{k}"
                    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
                    r = run_load(bootstrap, topic, args.size, args.messages, args.seconds, k)
                    results[k].append(r)
                    label = "idempotent, no txn" if k == 0 else f"txn every {k} ms"
                    print(f"run {run + 1} {label:>20}: {r['msgs_per_s']:9.0f} msgs/s, {r['commits']} commits, "
                          f"commit p50 {r['commit_p50_ms']:.2f} ms p99 {r['commit_p99_ms']:.2f} ms, errors {r['errors']}",
                          flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                log.close()
    base_rate = statistics.median(r["msgs_per_s"] for r in results[0])
    print(f"\nmedian of {args.runs} runs, {args.size}-byte messages:")
    print(f"  idempotent, no transactions: {base_rate:.0f} msgs/s")
    for k in intervals[1:]:
        rate = statistics.median(r["msgs_per_s"] for r in results[k])
        c50 = statistics.median(r["commit_p50_ms"] for r in results[k])
        c99 = statistics.median(r["commit_p99_ms"] for r in results[k])
        print(f"  commit every {k:>4} ms: {rate:.0f} msgs/s, overhead {100 * (1 - rate / base_rate):+.1f}%, "
              f"commit p50 {c50:.2f} ms p99 {c99:.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
