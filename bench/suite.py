#!/usr/bin/env python3
"""oncelog benchmark suite: one command, a table per section, medians of --runs
runs, and each figure next to a baseline measured in the same run.

Sections (pick with --only, comma-separated; default all):

  durable    Durable produce (the default fsync-before-ack mode): 1 KiB and
             100 B messages (--sizes), 1 and 12 partitions (--partitions),
             acks=all, idempotent, --producers producer *processes* (so the
             Python client is not the single bottleneck), messages sent
             round-robin over the partitions. msgs/s and MB/s over a measured
             window after --warmup seconds; ack latency p50/p99/p99.9 (librdkafka's
             produce()->delivery time; closed loop, so it includes client
             queueing at saturation -- see e2e for latency at a fixed load).
             Baseline: raw sequential write+fdatasync on the same filesystem at
             the broker's observed bytes per sync (oncelog_appended_bytes_total
             / oncelog_fsync_total from its /metrics, delta over the load) --
             produce_bench.raw_fdatasync.
  interval   The same load against a broker in interval-flush mode
             (-o log.flush.interval.ms=--flush-interval-ms). Baseline: loopback
             TCP throughput moving the same number of payload bytes, measured in
             the same run: one Python process sendall()s 1 MiB buffers over
             127.0.0.1 to another process that recv_into()s and discards them.
             It measures the kernel's single-stream loopback copy rate as seen
             by Python, i.e. what moving those bytes into a process costs with
             no protocol, no disk and no page-cache write.
  e2e        End-to-end read_committed latency at --e2e-fraction (0.5) of the
             peak msgs/s measured by `durable` for --e2e-size/--e2e-partitions
             (or --e2e-rate; or a short peak probe when `durable` is not run).
             Open loop: --producers transactional producers, each committing
             every --e2e-commit-ms, send at a fixed schedule and put the
             scheduled send time (CLOCK_MONOTONIC) in the first 8 payload
             bytes; a read_committed consumer (assign(), no group) reports
             receive time - scheduled time, so producer stalls (blocking
             commits) count. Also the produce ack p99 at that load against the
             disk's fdatasync p99 from a loop of 4 KiB write+fdatasync on the
             same filesystem, measured just before the load.
  restart    Restart time after kill -9: a data dir is filled with --restart-gb
             GB in --restart-partitions partitions (interval-flush mode,
             --restart-msg-size messages in ~1 MB batches), the broker is
             killed with SIGKILL, then restarted on the same dir (default mode)
             and timed until it answers ApiVersions, and until a first
             produce(acks=all)+fetch round trip; per run the broker is killed
             again. Baselines: reading every file of the data dir once (the
             cost of a full recovery scan at this cache state) and start-up on
             an empty dir; a clean (SIGTERM) restart is timed once for
             comparison. The page cache is warm unless --drop-caches (root;
             it drops the caches of the whole machine).
  resources  Broker CPU seconds per GB written and per million messages
             (utime+stime from /proc/PID/stat around a durable load of
             --res-size bytes on --res-partitions), disk bytes written per
             payload byte (/proc/PID/io), peak RSS (VmHWM). Baseline: the CPU
             a minimal "broker" needs for the same bytes -- a loopback receiver
             (recv into a buffer) plus write+fdatasync at the broker's bytes
             per sync, both measured in this run.

Peers: --kafka runs the durable (flush.messages=1) and interval (Kafka
defaults, page cache) loads against Apache Kafka too, via bench/kafka_ref.py
(with --kafka-extra-warmup more discarded warm-up for the JIT), and prints
oncelog/peer ratios. --tansu PATH does the same with `tansu broker
--storage-engine --tansu-storage` (default memory://tansu/, which is not
durable, so Tansu then runs in the interval section only; a durable engine URL,
e.g. a postgres:// one you provide, puts it in the durable section too). The
suite needs no peer.

Ratios are medians of the per-run ratios (each run's broker figure over the
baseline measured next to it). Every load is bounded by --warmup + --seconds
plus a flush timeout; brokers are started on 127.0.0.1 only, on temporary
data dirs under --dir (removed at the end), and stopped by PID. The broker
under test is a private copy of --binary (its sha256 is in the JSON), so a
rebuild of target/release during the suite does not change it. During each
load the CPU used by other processes on the machine is measured
(/proc/stat busy time minus the broker's and the load generators' CPU) and
flagged with '!' when above --noise-cpu of one core; foreign builds
(cargo/rustc) and brokers are listed.

    .venv/bin/python bench/suite.py --runs 3 --json /tmp/suite.json
    .venv/bin/python bench/suite.py --only durable,interval --kafka
    .venv/bin/python bench/suite.py --only e2e --e2e-rate 20000 --seconds 5
"""
import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_ref  # noqa: E402
from benchlib.brokers import exit_on_signal, stop_live_brokers, tansu_version  # noqa: E402
from benchlib.procstat import foreign_processes, loadavg  # noqa: E402
from benchlib.sections import SECTIONS, Suite  # noqa: E402
from produce_bench import ROOT  # noqa: E402


def parse_cpus(s):
    return {int(x) for x in s.split(",") if x != ""} if s else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.environ.get("ONCELOG_BIN", os.path.join(ROOT, "target/release/oncelog")))
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"sections, comma-separated: {','.join(SECTIONS)}")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10, help="measured window per load (s)")
    ap.add_argument("--warmup", type=float, default=2, help="discarded start of every load (s)")
    ap.add_argument("--producers", type=int, default=2, help="producer processes per load")
    ap.add_argument("--client", choices=("python", "native", "wire"), default="python",
                    help="closed-loop load generator for durable/interval/restart/resources: python = "
                         "confluent-kafka in Python (default), native = `oncelog bench-load` (librdkafka "
                         "2.12.1 from Rust; less client CPU, but on 2 vCPUs its runs stalled for 20-60 s "
                         "together with 'workqueue lockup' reports in the kernel log, so it is opt-in), "
                         "wire = `oncelog bench-wire` (idempotent Produce requests of batch.size bytes, "
                         "5 in flight per connection, records encoded once: about 5-8 %% of a core per "
                         "100 MB/s, so the broker, not the client, sets the rate)")
    ap.add_argument("--sizes", default="1024,100", help="message sizes for durable/interval")
    ap.add_argument("--partitions", default="1,12", help="partition counts for durable/interval")
    ap.add_argument("--linger-ms", type=float, default=5)
    ap.add_argument("--queue-msgs", type=int, default=200_000, help="queue.buffering.max.messages per producer")
    ap.add_argument("--queue-kb", type=int, default=16_384,
                    help="queue.buffering.max.kbytes per producer: keep it above max.in.flight (5) x batch.size "
                         "(1 MB) or the pipeline starves; bigger only adds queueing latency")
    ap.add_argument("--flush-timeout", type=float, default=60, help="cap on each producer's final flush (s)")
    ap.add_argument("--baseline-seconds", type=float, default=4, help="cap on each fdatasync baseline (s)")
    ap.add_argument("--flush-interval-ms", type=int, default=1000, help="log.flush.interval.ms for interval mode")
    ap.add_argument("--e2e-fraction", type=float, default=0.5, help="load of the ack and e2e sections, of peak")
    ap.add_argument("--ack-size", type=int, default=1024, help="message size of the ack section")
    ap.add_argument("--ack-partitions", type=int, default=1, help="partitions of the ack section")
    ap.add_argument("--ack-linger-ms", type=float, default=1.0,
                    help="ack section: each wire producer sends one request per this interval")
    ap.add_argument("--e2e-rate", type=float, default=0, help="fixed e2e target msgs/s (overrides the fraction)")
    ap.add_argument("--e2e-size", type=int, default=1024)
    ap.add_argument("--e2e-partitions", type=int, default=1)
    ap.add_argument("--e2e-commit-ms", type=float, default=10)
    ap.add_argument("--e2e-linger-ms", type=float, default=5,
                    help="producer linger.ms in the e2e section (lower means more requests: on 2 vCPUs the "
                         "Python clients then saturate the CPU)")
    ap.add_argument("--restart-gb", type=float, default=1.0, help="payload GB written before the kill (issue: 5)")
    ap.add_argument("--restart-partitions", type=int, default=100)
    ap.add_argument("--restart-msg-size", type=int, default=16_384)
    ap.add_argument("--restart-fill-seconds", type=float, default=600, help="cap on filling the restart data dir")
    ap.add_argument("--drop-caches", action="store_true",
                    help="restart: drop the page cache before each restart (root; affects the whole machine)")
    ap.add_argument("--res-size", type=int, default=1024)
    ap.add_argument("--res-partitions", default="1,12")
    ap.add_argument("--start-timeout", type=float, default=300, help="cap on a broker start (s)")
    ap.add_argument("--pin", default="", metavar="BROKER_CPUS:CLIENT_CPUS",
                    help="pin brokers and load generators, e.g. 1:0 (default: no pinning)")
    ap.add_argument("--noise-cpu", type=float, default=0.2,
                    help="flag runs where other processes used more than this many cores")
    ap.add_argument("--dir", default=None, help="where temporary data dirs go (default: under ./target)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write every figure to FILE")
    ap.add_argument("--kafka", action="store_true", help="also run durable/interval against Apache Kafka")
    ap.add_argument("--kafka-lib", default=None, help="Kafka broker jars (default $KAFKA_LIB or .tools/kafka-lib)")
    ap.add_argument("--kafka-extra-warmup", type=float, default=3,
                    help="extra discarded warm-up for Kafka loads (JIT), s")
    ap.add_argument("--tansu", default=None, metavar="PATH", help="also run against this tansu binary")
    ap.add_argument("--tansu-storage", default="memory://tansu/",
                    help="Tansu --storage-engine URL ({dir} = a fresh temp dir); memory:// runs only in interval")
    a = ap.parse_args()

    only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; choose from {SECTIONS}")
    a.sizes = [int(x) for x in a.sizes.split(",")]
    a.partitions = [int(x) for x in a.partitions.split(",")]
    a.res_partitions = [int(x) for x in a.res_partitions.split(",")]
    a.broker_cpus = a.client_cpus = None
    if a.pin:
        bc, _, cc = a.pin.partition(":")
        a.broker_cpus, a.client_cpus = parse_cpus(bc), parse_cpus(cc)
    if a.e2e_size < 8:
        ap.error("--e2e-size must be at least 8 (the payload carries the send time)")
    if not os.access(a.binary, os.X_OK):
        ap.error(f"no broker binary at {a.binary}")
    signal.signal(signal.SIGTERM, exit_on_signal)
    signal.signal(signal.SIGHUP, exit_on_signal)

    kafka_ok = False
    if a.kafka:
        why = kafka_ref.unavailable(a.kafka_lib)
        if why:
            print(f"Apache Kafka: not available ({why}); skipped", flush=True)
        else:
            kafka_ok = True
            print(f"Apache Kafka {kafka_ref.kafka_version(a.kafka_lib)} as peer for durable (flush.messages=1) "
                  f"and interval (defaults), single node KRaft", flush=True)
    tansu_ok = False
    if a.tansu:
        if not os.access(a.tansu, os.X_OK):
            print(f"Tansu: no executable at {a.tansu}; skipped", flush=True)
        else:
            tansu_ok = True
            print(f"{tansu_version(a.tansu)} as peer with --storage-engine {a.tansu_storage}: interval section"
                  + ("" if a.tansu_storage.startswith("memory:") else " and durable section")
                  + (" (memory storage is not durable, so not in the durable section)"
                     if a.tansu_storage.startswith("memory:") else ""), flush=True)

    started = time.time()
    version = subprocess.run([a.binary, "--version"], capture_output=True, text=True).stdout.strip()
    try:
        rev = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        rev = None
    import confluent_kafka
    meta = {"command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "oncelog": version, "git": rev, "librdkafka": confluent_kafka.libversion()[0],
            "confluent_kafka": confluent_kafka.version()[0], "cpus": os.cpu_count(),
            "kafka": kafka_ref.kafka_version(a.kafka_lib) if kafka_ok else None,
            "tansu": tansu_version(a.tansu) if tansu_ok else None,
            "loadavg_start": loadavg(), "foreign_processes_start": foreign_processes(),
            "settings": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(a).items()}}
    print(f"{version} ({rev}), librdkafka {meta['librdkafka']}, {meta['cpus']} CPUs, load {meta['loadavg_start']}",
          flush=True)
    if meta["foreign_processes_start"]:
        print(f"NOTE: other heavy processes on this machine: {', '.join(meta['foreign_processes_start'])}", flush=True)

    base = a.dir or os.path.join(ROOT, "target")
    os.makedirs(base, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=base, prefix="suite-")
    # Run a private copy, so a rebuild of target/release during the suite
    # does not change the broker under test.
    private = os.path.join(tmp, "oncelog-under-test")
    shutil.copy2(a.binary, private)
    with open(private, "rb") as f:
        meta["binary_sha256"] = hashlib.sha256(f.read()).hexdigest()
    meta["binary"] = a.binary
    meta["binary_mtime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(a.binary)))
    a.binary = private
    a.tmp = tmp
    print(f"broker under test: copy of {meta['binary']} (built {meta['binary_mtime']}, "
          f"sha256 {meta['binary_sha256'][:12]})", flush=True)
    suite = Suite(a, tmp)
    suite.kafka_ok, suite.tansu_ok = kafka_ok, tansu_ok
    suite.peer_versions = {"kafka": meta["kafka"], "tansu": meta["tansu"]}
    failed = []
    try:
        for name in SECTIONS:
            if name not in only:
                continue
            t0 = time.monotonic()
            try:
                getattr(suite, name)()
            except Exception as e:  # noqa: BLE001 - one section failing must not lose the others
                failed.append(name)
                print(f"SECTION {name} FAILED: {e!r}", flush=True)
                suite.out[name] = {"error": repr(e)}
            print(f"   ({name}: {time.monotonic() - t0:.0f} s)\n", flush=True)
    finally:
        stop_live_brokers()
        shutil.rmtree(tmp, ignore_errors=True)
    meta["seconds"] = time.time() - started
    meta["loadavg_end"] = loadavg()
    meta["foreign_processes_end"] = foreign_processes()
    if suite.log_findings:
        print("broker logs: ERROR/WARN lines")
        for label, f in suite.log_findings.items():
            other = ("; " + "; ".join(f["other"])) if f.get("other") else ""
            print(f"  {label}: {f['error_warn_lines']} lines{other}")
            if not label.startswith(("Apache Kafka", "Tansu")):  # peers' lines are in the JSON
                for m in f["first"]:
                    print(f"    {m}")
    else:
        print("broker logs: no ERROR/WARN lines")
    print(f"total {meta['seconds']:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "log_findings": suite.log_findings, **suite.out}, f, indent=1, default=str)
        print(f"figures written to {a.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
