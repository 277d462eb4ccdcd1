#!/usr/bin/env python3
"""Durable-produce benchmark for oncelog, with a same-run disk baseline.

For each run it starts a fresh `oncelog serve` on a temporary data dir,
loads it with 1 KiB messages at acks=all from confluent-kafka (librdkafka),
and reports msgs/s, MB/s and produce->ack latency p50/p99. At shutdown the
broker reports how many fdatasync calls its group commit made, which gives
the average bytes per sync. The raw baseline is then measured on the same
filesystem in the same run: sequential write + fdatasync at exactly that
sync size. Figures are medians over --runs runs.

Optionally (--kafka, with the broker jars that `bash bench/kafka/fetch.sh`
puts in .tools/kafka-lib) each run also loads Apache Kafka 4.x (single node,
KRaft, see bench/kafka_ref.py) the same way twice: with flush.messages=1
(an fsync after every append, the durable comparison) and with its defaults
(acknowledged from the page cache), and the ratios oncelog/Kafka are printed.

Bounded: every run stops after --messages messages or --seconds seconds.
Loopback only.
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The two Apache Kafka variants loaded by --kafka: name -> broker configs.
KAFKA_VARIANTS = {
    "fsync": ["flush.messages=1"],  # log.flush.interval.messages=1
    "default": [],
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, deadline_s=30):
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def pct(vals, p):
    v = sorted(vals)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def load(bootstrap, topic, partitions, size, messages, seconds, extra=None):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for f in fs.values():
        f.result(timeout=30)
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": False,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 200_000,
        "queue.buffering.max.kbytes": 512 * 1024,
    }
    conf.update(extra or {})
    p = Producer(conf)
    payload = os.urandom(size)
    lat = []
    errors = [0]

    def cb(err, msg, t0):
        if err is not None:
            errors[0] += 1
        else:
            lat.append((time.perf_counter() - t0) * 1000.0)

    # Warm up the connection and metadata.
    p.produce(topic, payload)
    p.flush(30)
    lat.clear()
    start = time.perf_counter()
    sent = 0
    while sent < messages and time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        try:
            p.produce(topic, payload, on_delivery=lambda e, m, t0=t0: cb(e, m, t0))
            sent += 1
        except BufferError:
            p.poll(0.01)
            continue
        if sent % 1000 == 0:
            p.poll(0)
    left = p.flush(120)
    elapsed = time.perf_counter() - start
    acked = len(lat)
    return {
        "sent": sent,
        "acked": acked,
        "errors": errors[0],
        "unflushed": left,
        "seconds": elapsed,
        "msgs_per_s": acked / elapsed,
        "mb_per_s": acked * size / elapsed / 1e6,
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
    }


def run_oncelog(binary, args, tmp, i):
    port = free_port()
    data = os.path.join(tmp, f"oncelog-{i}")
    log_path = os.path.join(tmp, f"oncelog-{i}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [binary, "serve", "--data-dir", data, "--listen", f"127.0.0.1:{port}", "--metrics-listen", ""],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port)
        r = load(f"127.0.0.1:{port}", "bench", args.partitions, args.size, args.messages, args.seconds)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = open(log_path).read()
    m = re.search(r"syncs=(\d+) appended_bytes=(\d+)", text)
    if m:
        syncs, appended = int(m.group(1)), int(m.group(2))
        r["syncs"] = syncs
        r["bytes_per_sync"] = appended / max(syncs, 1)
    r["data_dir"] = data
    return r


def run_kafka(args, tmp, i, variant):
    """The same load against a fresh Apache Kafka; None (and a note) if it fails."""
    kb = kafka_ref.KafkaBroker(os.path.join(tmp, f"kafka-{variant}-{i}"),
                               configs=KAFKA_VARIANTS[variant], lib=args.kafka_lib)
    try:
        kb.start()
        return load(kb.bootstrap, "bench", args.partitions, args.size, args.messages, args.seconds)
    except Exception as e:  # noqa: BLE001 - a reference peer failing must not lose oncelog's figures
        print(f"  Apache Kafka ({variant}) failed: {e}", flush=True)
        return None
    finally:
        kb.stop()


def fmt_load(r):
    return (f"{r['msgs_per_s']:.0f} msgs/s {r['mb_per_s']:.1f} MB/s "
            f"ack p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms")


def raw_fdatasync(dirpath, sync_bytes, total_bytes, seconds):
    """Sequential write + fdatasync of `sync_bytes` chunks: MB/s and sync p50/p99."""
    path = os.path.join(dirpath, "raw-baseline.bin")
    buf = os.urandom(max(int(sync_bytes), 512))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    lat = []
    start = time.perf_counter()
    try:
        while written < total_bytes and time.perf_counter() - start < seconds:
            os.write(fd, buf)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t0) * 1000)
            written += len(buf)
    finally:
        os.close(fd)
        os.unlink(path)
        # commit the removal now: on a filesystem mounted with `discard` the
        # freed blocks are discarded in the next journal commit, which would
        # otherwise stall the next measurement's first fdatasync for seconds
        os.sync()
    el = time.perf_counter() - start
    return {"mb_per_s": written / el / 1e6, "sync_p50_ms": pct(lat, 50), "sync_p99_ms": pct(lat, 99)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.environ.get("ONCELOG_BIN", os.path.join(ROOT, "target/release/oncelog")))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--dir", default=None, help="where data dirs go (default: a temp dir under ./target)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--kafka", action="store_true",
                    help="also load Apache Kafka (flush.messages=1 and defaults) each run")
    ap.add_argument("--kafka-lib", default=None,
                    help="Kafka broker jars (default $KAFKA_LIB or .tools/kafka-lib)")
    args = ap.parse_args()

    kafka_variants = []
    if args.kafka:
        why = kafka_ref.unavailable(args.kafka_lib)
        if why:
            print(f"Apache Kafka: not available ({why}); skipped", flush=True)
        else:
            kafka_variants = list(KAFKA_VARIANTS)
            print(f"Apache Kafka {kafka_ref.kafka_version(args.kafka_lib)} as reference "
                  f"(single node, KRaft; fsync = flush.messages=1, default = no fsync)", flush=True)

    base = args.dir or os.path.join(ROOT, "target")
    os.makedirs(base, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-") as tmp:
        for i in range(args.runs):
            r = run_oncelog(args.binary, args, tmp, i)
            raw = raw_fdatasync(tmp, r.get("bytes_per_sync", 65536), r["acked"] * args.size, args.seconds)
            r["raw"] = raw
            results.append(r)
            print(f"run {i + 1}: {r['msgs_per_s']:.0f} msgs/s {r['mb_per_s']:.1f} MB/s "
                  f"ack p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms, "
                  f"{r.get('bytes_per_sync', 0) / 1024:.0f} KiB/sync | raw write+fdatasync at that size "
                  f"{raw['mb_per_s']:.1f} MB/s (sync p50 {raw['sync_p50_ms']:.2f} p99 {raw['sync_p99_ms']:.2f} ms)",
                  flush=True)
            if r["errors"] or r["acked"] != r["sent"]:
                print(f"  WARNING: {r['errors']} delivery errors, {r['sent'] - r['acked']} unacknowledged", flush=True)
            r["kafka"] = {}
            for v in kafka_variants:
                k = run_kafka(args, tmp, i, v)
                r["kafka"][v] = k
                if k is None:
                    continue
                print(f"  Apache Kafka {v:<7}: {fmt_load(k)}", flush=True)
                if k["errors"] or k["acked"] != k["sent"]:
                    print(f"  WARNING: Kafka {v}: {k['errors']} delivery errors, "
                          f"{k['sent'] - k['acked']} unacknowledged", flush=True)
    med = lambda k: statistics.median(x[k] for x in results)
    medraw = lambda k: statistics.median(x["raw"][k] for x in results)
    summary = {
        "runs": args.runs,
        "message_bytes": args.size,
        "oncelog_msgs_per_s": med("msgs_per_s"),
        "oncelog_mb_per_s": med("mb_per_s"),
        "oncelog_ack_p50_ms": med("p50_ms"),
        "oncelog_ack_p99_ms": med("p99_ms"),
        "bytes_per_sync": statistics.median(x.get("bytes_per_sync", 0) for x in results),
        "raw_mb_per_s": medraw("mb_per_s"),
        "raw_sync_p99_ms": medraw("sync_p99_ms"),
    }
    summary["ratio_to_raw"] = summary["oncelog_mb_per_s"] / summary["raw_mb_per_s"] if summary["raw_mb_per_s"] else None
    print(f"\nmedian of {args.runs}: oncelog {summary['oncelog_msgs_per_s']:.0f} msgs/s, "
          f"{summary['oncelog_mb_per_s']:.1f} MB/s, ack p50 {summary['oncelog_ack_p50_ms']:.2f} ms, "
          f"p99 {summary['oncelog_ack_p99_ms']:.2f} ms; raw write+fdatasync at "
          f"{summary['bytes_per_sync'] / 1024:.0f} KiB/sync {summary['raw_mb_per_s']:.1f} MB/s; "
          f"ratio {summary['ratio_to_raw']:.2f}")
    for v in kafka_variants:
        ks = [x["kafka"][v] for x in results if x["kafka"].get(v)]
        if not ks:
            print(f"Apache Kafka {v}: no successful run")
            continue
        kmed = lambda k: statistics.median(x[k] for x in ks)
        for key in ("msgs_per_s", "mb_per_s", "p50_ms", "p99_ms"):
            name = key.replace("p50", "ack_p50").replace("p99", "ack_p99")
            summary[f"kafka_{v}_{name}"] = kmed(key)
        summary[f"kafka_{v}_runs"] = len(ks)
        tput = summary["oncelog_msgs_per_s"] / summary[f"kafka_{v}_msgs_per_s"]
        p99 = summary["oncelog_ack_p99_ms"] / summary[f"kafka_{v}_ack_p99_ms"]
        summary[f"oncelog_over_kafka_{v}_msgs_per_s"] = tput
        summary[f"oncelog_over_kafka_{v}_ack_p99"] = p99
        print(f"Apache Kafka {kafka_ref.kafka_version(args.kafka_lib)} {v:<7} (median of {len(ks)}): "
              f"{summary[f'kafka_{v}_msgs_per_s']:.0f} msgs/s, {summary[f'kafka_{v}_mb_per_s']:.1f} MB/s, "
              f"ack p50 {summary[f'kafka_{v}_ack_p50_ms']:.2f} ms, p99 {summary[f'kafka_{v}_ack_p99_ms']:.2f} ms; "
              f"oncelog/Kafka: throughput x{tput:.2f}, ack p99 x{p99:.2f}")
    if kafka_variants:
        summary["kafka_version"] = kafka_ref.kafka_version(args.kafka_lib)
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
