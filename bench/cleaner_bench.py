#!/usr/bin/env python3
"""Log cleaner throughput, oncelog against Apache Kafka 4.x, on the same data
in the same run; and produce throughput while a cleaner runs.

For each target and run: a fresh broker on a fresh data dir (cleaner backoff
100 ms on both), a compacted topic of one partition (segment.bytes 64 MiB,
min.cleanable.dirty.ratio 0.01, min.compaction.lag.ms one hour so nothing is
cleaned while it fills), filled with --mb MiB of 1 KiB records whose keys
are drawn uniformly from --mb * 1024 / 10 keys (10 % unique). Then
min.compaction.lag.ms is set to 0 and the clock runs until the broker's own
record of where cleaning stopped passes the dirty log (Kafka:
cleaner-offset-checkpoint in the log dir; oncelog: cleaner-offset in the
partition dir). Throughput = the dirty bytes (every non-active segment) over
that time, which includes the backoff and the config change reaching the
cleaner, the same for both.

--produce-seconds S also measures produce throughput (1 KiB records, acks=all,
another topic) for S seconds with no cleaning, then for S seconds starting
when cleaning is triggered on a log refilled to the same size, and prints
their ratio. The cleaning is usually shorter than S: the ratio then covers
the part of the window the cleaner was busy plus the rest.

    .venv/bin/python bench/cleaner_bench.py --oncelog target/release/oncelog \\
        --kafka --mb 1024 --runs 3 --produce-seconds 10

Bounded: every wait has a limit; brokers are stopped by PID in finally
blocks. Loopback only. Needs confluent-kafka (the test venv has it).
"""
import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Producer
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewTopic)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_ref  # noqa: E402
from kafka_ref import api_versions_ok, free_port  # noqa: E402

RECORD = 1024
SEGMENT = 64 << 20


class Oncelog:
    def __init__(self, binary, data_dir):
        self.binary, self.data_dir = binary, data_dir
        self.port, self.proc = free_port(), None

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        log = open(os.path.join(os.path.dirname(self.data_dir), "oncelog.log"), "w")
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--data-dir", self.data_dir, "--listen", self.bootstrap,
             "--metrics-listen", f"127.0.0.1:{free_port()}", "-o", "log.cleaner.backoff.ms=100"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=kafka_ref._pdeathsig)
        end = time.monotonic() + 60
        while not api_versions_ok(self.port, timeout=1.0):
            if time.monotonic() > end or self.proc.poll() is not None:
                raise RuntimeError("oncelog did not start")
            time.sleep(0.05)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def partition_dir(self, topic):
        return os.path.join(self.data_dir, f"{topic}-0")

    def pass_seconds(self, topic):
        """The broker's own time for its passes over `topic` (its log lines)."""
        import re
        text = open(os.path.join(os.path.dirname(self.data_dir), "oncelog.log"), errors="replace").read()
        ms = [int(m) for m in re.findall(rf"cleaned partition={re.escape(topic)}-0 .*? ms=(\d+)", text)]
        return sum(ms) / 1000 if ms else None

    def cleaned_to(self, topic):
        try:
            with open(os.path.join(self.data_dir, f"{topic}-0", "cleaner-offset")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return -1


class Kafka:
    def __init__(self, data_dir):
        self.kb = kafka_ref.KafkaBroker(data_dir, heap="1g", configs={
            "log.cleaner.backoff.ms": "100", "offsets.topic.num.partitions": "1"})

    @property
    def bootstrap(self):
        return self.kb.bootstrap

    def start(self):
        self.kb.start()

    def stop(self):
        self.kb.stop()

    def partition_dir(self, topic):
        return os.path.join(self.kb.data_dir, "logs", f"{topic}-0")

    def pass_seconds(self, topic):
        """The cleaner's own time for its passes over `topic` (LogCleaner's stats lines)."""
        import re
        text = open(self.kb.log_path, errors="replace").read()
        secs = [float(x.replace(",", "")) for x in re.findall(
            rf"cleaned log {re.escape(topic)}-0 .*?\n\s*[\d.,]+ MB of log processed in ([\d.,]+) seconds", text)]
        return sum(secs) if secs else None

    def cleaned_to(self, topic):
        path = os.path.join(self.kb.data_dir, "logs", "cleaner-offset-checkpoint")
        try:
            with open(path) as f:
                for line in f.read().splitlines()[2:]:
                    parts = line.split()
                    if len(parts) == 3 and parts[0] == topic and parts[1] == "0":
                        return int(parts[2])
        except OSError:
            pass
        return -1


def create_topic(bootstrap, topic, configs):
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(60)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        md = a.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and all(p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"topic {topic} not ready")


def set_config(bootstrap, topic, key, value):
    a = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    for f in a.incremental_alter_configs([res]).values():
        f.result(60)


def fill(bootstrap, topic, mb, seed):
    """--mb MiB of 1 KiB records, keys 10 % unique. Returns the records written."""
    n = mb * 1024 * 1024 // RECORD
    keys = max(1, n // 10)
    rng = random.Random(seed)
    value = bytes(rng.getrandbits(8) for _ in range(RECORD - 16))
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                  "acks": "all", "queue.buffering.max.kbytes": 512 * 1024, "compression.type": "none"})
    for i in range(n):
        key = b"key-%010d" % rng.randrange(keys)
        while True:
            try:
                p.produce(topic, key=key, value=value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    if p.flush(300) != 0:
        raise RuntimeError("fill did not finish")
    return n


def produce_across_cleaning(target, plain, topic2, goal2, before_s, after_s):
    """acks=all 1 KiB records to `plain` for `before_s` seconds, then while
    `topic2` is cleaned, then `after_s` more. Returns (MB/s before, MB/s
    while the cleaner ran) from the acknowledgement times."""
    import threading
    acks = []
    p = Producer({"bootstrap.servers": target.bootstrap, "linger.ms": 5, "batch.size": 1 << 20,
                  "acks": "all", "queue.buffering.max.kbytes": 64 * 1024})
    value = b"x" * RECORD
    window = {}

    def cleaner():
        window["start"] = time.monotonic()
        clean_once(target, topic2, goal2)
        window["end"] = time.monotonic()

    def cb(err, _msg):
        if err is None:
            acks.append(time.monotonic())
    t0 = time.monotonic()
    th = None
    while True:
        now = time.monotonic()
        if th is None and now - t0 >= before_s:
            th = threading.Thread(target=cleaner, daemon=True)
            th.start()
        if "end" in window and now - window["end"] >= after_s:
            break
        if now - t0 > before_s + 600:
            raise RuntimeError("cleaning during produce did not finish")
        try:
            p.produce(plain, value=value, on_delivery=cb)
        except BufferError:
            p.poll(0.01)
        p.poll(0)
    p.flush(60)
    th.join(10)

    def rate(a, b):
        return sum(1 for t in acks if a <= t < b) * RECORD / (1 << 20) / max(b - a, 1e-9)
    return rate(t0 + 1.0, window["start"]), rate(window["start"], window["end"])


def dirty_log(target, topic):
    """(bytes of every non-active segment, the active segment's base offset)."""
    d = target.partition_dir(topic)
    segs = sorted((int(f[:-4]), os.path.getsize(os.path.join(d, f)))
                  for f in os.listdir(d) if f.endswith(".log") and f[:-4].isdigit())
    return sum(size for _, size in segs[:-1]), segs[-1][0]


def clean_once(target, topic, goal, limit=600):
    """Triggers cleaning; seconds until the cleaned-to offset reaches `goal`
    (the active segment's base: everything before it is cleaned)."""
    t0 = time.monotonic()
    set_config(target.bootstrap, topic, "min.compaction.lag.ms", "0")
    while time.monotonic() - t0 < limit:
        if target.cleaned_to(topic) >= goal:
            return time.monotonic() - t0
        time.sleep(0.02)
    raise RuntimeError(f"cleaning of {topic} did not reach offset {goal} within {limit} s")


def one_run(label, make, args, run):
    root = tempfile.mkdtemp(prefix=f"cleaner-bench-{label}-")
    target = make(os.path.join(root, "data"))
    target.start()
    try:
        topic = f"compacted-{run}"
        create_topic(target.bootstrap, topic, {
            "cleanup.policy": "compact", "segment.bytes": str(SEGMENT),
            "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "3600000"})
        fill(target.bootstrap, topic, args.mb, seed=run)
        dirty_bytes, goal = dirty_log(target, topic)
        took = clean_once(target, topic, goal)
        out = {"mb_per_s": dirty_bytes / (1 << 20) / took, "seconds": took}
        out["own_seconds"] = target.pass_seconds(topic)
        if out["own_seconds"]:
            out["own_mb_per_s"] = dirty_bytes / (1 << 20) / out["own_seconds"]
        if args.produce_seconds:
            plain = f"plain-{run}"
            create_topic(target.bootstrap, plain, {})
            topic2 = f"compacted2-{run}"
            create_topic(target.bootstrap, topic2, {
                "cleanup.policy": "compact", "segment.bytes": str(SEGMENT),
                "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "3600000"})
            fill(target.bootstrap, topic2, args.mb, seed=run + 100)
            _, goal2 = dirty_log(target, topic2)
            alone, during = produce_across_cleaning(target, plain, topic2, goal2,
                                                    args.produce_seconds, 2.0)
            out["produce_alone"], out["produce_cleaning"] = alone, during
        return out
    finally:
        target.stop()
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--oncelog", action="append", default=[], metavar="[LABEL=]BIN")
    ap.add_argument("--kafka", action="store_true")
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--produce-seconds", type=float, default=0)
    args = ap.parse_args()
    targets = []
    for spec in args.oncelog:
        label, _, binary = spec.rpartition("=")
        binary = os.path.abspath(binary)
        targets.append((label or "oncelog", lambda d, b=binary: Oncelog(b, d)))
    if args.kafka:
        why = kafka_ref.unavailable()
        if why:
            sys.exit(f"Kafka unavailable: {why}")
        targets.append((f"Kafka {kafka_ref.kafka_version()}", Kafka))
    results = {label: [] for label, _ in targets}
    for run in range(args.runs):
        # Interleaved, so drift on a shared machine hits every target alike.
        for label, make in targets:
            r = one_run(label.replace(" ", "-"), make, args, run)
            results[label].append(r)
            print(f"run {run + 1} {label}: {r}", flush=True)
    print()
    print(f"cleaning {args.mb} MiB of 1 KiB records, 10 % unique keys; median of {args.runs} (range)")
    print("| target | cleaner MB/s, wall | by its own timing | seconds | produce MB/s before | while cleaning | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, rs in results.items():
        mbs = [r["mb_per_s"] for r in rs]
        own = [r["own_mb_per_s"] for r in rs if r.get("own_mb_per_s")]
        secs = [r["seconds"] for r in rs]
        own_txt = f"{statistics.median(own):.0f} ({min(own):.0f}–{max(own):.0f})" if own else "-"
        row = (f"| {label} | {statistics.median(mbs):.0f} ({min(mbs):.0f}–{max(mbs):.0f}) | {own_txt} "
               f"| {statistics.median(secs):.1f} |")
        if args.produce_seconds:
            alone = statistics.median(r["produce_alone"] for r in rs)
            busy = statistics.median(r["produce_cleaning"] for r in rs)
            row += f" {alone:.0f} | {busy:.0f} | {busy / alone:.2f} |"
        else:
            row += " - | - | - |"
        print(row)


if __name__ == "__main__":
    main()
