#!/usr/bin/env python3
"""Live verification's cost and reach, measured in one run against itself.

Each run starts two fresh `oncelog serve` brokers one after the other, the
first with `verify.enable=false`, the second with it on (scrubber at its
default rate, `verify.unique.key=record-key` on the topic), and loads each
the same way: --messages records with distinct keys (so --messages keys
are held), at acks=all from librdkafka. It reports, per broker, durable
produce msgs/s, MB/s and ack p50/p99 (the goal: on >= 0.9x off); with
verification on, the bytes the scrubber verified per second, the broker's
extra memory per million keys held (RSS on minus RSS off after the same
load, once every key is indexed), and the time from a planted fault (a
committed batch changed at rest with its CRC fixed up) to its report.
Figures are medians over --runs runs. Loopback only, bounded in time.

    python3 bench/verify_bench.py --runs 3 --messages 1000000 --size 200
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from produce_bench import free_port, pct, wait_port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import kafka_wire as kw  # noqa: E402


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def verify_status(metrics):
    with urllib.request.urlopen(f"http://{metrics}/v1/verify", timeout=10) as r:
        return json.load(r)


def load(bootstrap, topic, size, messages, seconds, unique):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"verify.unique.key": "record-key"} if unique else {}
    for f in admin.create_topics([NewTopic(topic, 1, 1, config=config)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "batch.size": 1_000_000, "queue.buffering.max.messages": 200_000,
                  "queue.buffering.max.kbytes": 512 * 1024})
    payload = os.urandom(size)
    lat = []

    def cb(err, _msg, t0):
        if err is None:
            lat.append((time.perf_counter() - t0) * 1000.0)
    start = time.perf_counter()
    sent = 0
    while sent < messages and time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        try:
            p.produce(topic, payload, key=b"k%09d" % sent, on_delivery=lambda e, m, t0=t0: cb(e, m, t0))
            sent += 1
        except BufferError:
            p.poll(0.01)
            continue
        if sent % 1000 == 0:
            p.poll(0)
    p.flush(120)
    elapsed = time.perf_counter() - start
    return {"acked": len(lat), "msgs_per_s": len(lat) / elapsed,
            "mb_per_s": len(lat) * size / elapsed / 1e6,
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}


def plant(data_dir, topic):
    """Changes the fourth batch of the topic's first segment at rest (a
    value byte, CRC fixed up); returns its base offset."""
    seg = os.path.join(data_dir, f"{topic}-0", "00000000000000000000.log")
    data = bytearray(open(seg, "rb").read())
    b = list(kw.walk_batches(bytes(data)))[3]
    data[b.pos + b.size - 2] ^= 0x01
    struct.pack_into(">I", data, b.pos + 17, kw.crc32c(bytes(data[b.pos + 21:b.pos + b.size])))
    with open(seg, "r+b") as f:
        f.seek(b.pos)
        f.write(data[b.pos:b.pos + b.size])
    return b.base_offset


def one(binary, tmp, i, verify, args):
    port, mport = free_port(), free_port()
    data = os.path.join(tmp, f"{'on' if verify else 'off'}-{i}")
    opts = ["-o", f"verify.enable={'true' if verify else 'false'}",
            "-o", f"verify.scrub.interval.ms={args.pass_interval_ms}"]
    log = open(os.path.join(tmp, f"{'on' if verify else 'off'}-{i}.log"), "w")
    proc = subprocess.Popen([binary, "serve", "--data-dir", data, "--listen", f"127.0.0.1:{port}",
                             "--metrics-listen", f"127.0.0.1:{mport}", *opts],
                            stdout=log, stderr=subprocess.STDOUT)
    metrics = f"127.0.0.1:{mport}"
    try:
        wait_port(port)
        t0 = time.time()
        r = load(f"127.0.0.1:{port}", "bench", args.size, args.messages, args.seconds, verify)
        if verify:
            # every key indexed, then memory; the scrubber's rate over the run
            deadline = time.time() + 120
            while time.time() < deadline:
                s = verify_status(metrics)
                keys = sum(u["keys"] for u in s["unique"])
                verified = min((p["verified_through"] for p in s["partitions"]), default=0)
                if keys >= r["acked"] and verified >= r["acked"]:
                    break
                time.sleep(0.5)
            r["keys"] = keys
            r["verified_in_s"] = time.time() - t0
            r["scrubbed_mb_per_s"] = s["scrubbed_bytes"] / (time.time() - t0) / 1e6
            r["dups"] = s["anomalies_total"].get("duplicate_key", 0)
        time.sleep(1)
        r["rss_kib"] = rss_kib(proc.pid)
        if verify:
            at = plant(data, "bench")
            t_plant = time.time()
            deadline = t_plant + args.pass_interval_ms / 1000 + 120
            r["fault_report_s"] = None
            while time.time() < deadline:
                found = [a for a in verify_status(metrics)["anomalies"]
                         if a["kind"] == "digest_changed" and a["first_offset"] == at]
                if found:
                    r["fault_report_s"] = time.time() - t_plant
                    break
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.environ.get("ONCELOG_BIN", os.path.join(ROOT, "target/release/oncelog")))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--pass-interval-ms", type=int, default=2000,
                    help="verify.scrub.interval.ms of both brokers (passes compare content; 5 min by default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.makedirs(os.path.join(ROOT, "target"), exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "target"), prefix="verify-bench-") as tmp:
        for i in range(args.runs):
            # which side goes first alternates, so neither gains from the
            # other's warmed caches or a quieter moment every time
            if i % 2 == 0:
                off = one(args.binary, tmp, i, False, args)
                on = one(args.binary, tmp, i, True, args)
            else:
                on = one(args.binary, tmp, i, True, args)
                off = one(args.binary, tmp, i, False, args)
            extra_kib = on["rss_kib"] - off["rss_kib"]
            on["mib_per_million_keys"] = extra_kib / 1024 / max(on["keys"], 1) * 1e6
            runs.append({"off": off, "on": on})
            print(f"run {i + 1}: off {off['msgs_per_s']:.0f} msgs/s {off['mb_per_s']:.1f} MB/s "
                  f"p99 {off['p99_ms']:.1f} ms | on {on['msgs_per_s']:.0f} msgs/s {on['mb_per_s']:.1f} MB/s "
                  f"p99 {on['p99_ms']:.1f} ms | {on['keys']} keys, {on['mib_per_million_keys']:.0f} MiB "
                  f"per million | scrubbed {on['scrubbed_mb_per_s']:.1f} MB/s, all verified in "
                  f"{on['verified_in_s']:.1f} s | fault reported in "
                  f"{'never' if on['fault_report_s'] is None else format(on['fault_report_s'], '.1f')} s", flush=True)
    med = lambda side, k: statistics.median(r[side][k] for r in runs if r[side].get(k) is not None)  # noqa: E731
    summary = {
        "off_mb_per_s": med("off", "mb_per_s"), "on_mb_per_s": med("on", "mb_per_s"),
        "off_p99_ms": med("off", "p99_ms"), "on_p99_ms": med("on", "p99_ms"),
        "throughput_on_over_off": med("on", "mb_per_s") / med("off", "mb_per_s"),
        "mib_per_million_keys": med("on", "mib_per_million_keys"),
        "scrubbed_mb_per_s": med("on", "scrubbed_mb_per_s"),
        "fault_report_s": med("on", "fault_report_s"),
    }
    print("medians: " + ", ".join(f"{k} {v:.2f}" for k, v in summary.items()))
    if args.json:
        print(json.dumps({"runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
