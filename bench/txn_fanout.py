#!/usr/bin/env python3
"""Transactions per second with many concurrent transactional producers.

What a Flink / Kafka Streams job with high parallelism does at each
checkpoint: N transactional producers (Java kafka-clients, one transactional.id
each) loop begin -> one record to each of 2 partitions -> commit. The load is
bench/java/TxnFanout.java; it reports commits/s, commitTransaction() latency
p50/p99 and whole-transaction (begin -> commit returned) latency p50/p99 over
the measured window, after a warm-up and after all producers have run
initTransactions() (the producers start the window together).

For each target, in each run: a fresh broker on a fresh temp data dir, then
one TxnFanout per producer count (its own topic, --partitions partitions,
replication 1), then the broker is stopped. Targets:

    --oncelog LABEL=BIN   an oncelog binary (repeatable), started as
                          `BIN serve --data-dir D --listen 127.0.0.1:P
                          --metrics-listen 127.0.0.1:P2`
    --kafka               Apache Kafka 4.x (bench/kafka_ref.py, jars from
                          .tools/kafka-lib; `bash bench/kafka/fetch.sh`) with
                          its defaults: acknowledged from the page cache
    --kafka-fsync         the same, durable: log.flush.interval.messages=1

With --runs R each (target, producers) is measured R times and the table shows
the median and the range of commits/s and the medians of the latencies.

    # an oncelog from an earlier commit, to compare against
    git worktree add /tmp/oncelog-old <commit> && \\
        (cd /tmp/oncelog-old && cargo build --release) && \\
        cp /tmp/oncelog-old/target/release/oncelog /tmp/oncelog-before

    # compile the load (the driver does this itself when the .class is
    # missing or older than the source)
    javac -cp '.tools/java-lib/*' -d .tools/bench-java bench/java/TxnFanout.java

    python3 bench/txn_fanout.py \\
        --oncelog before=/tmp/oncelog-before \\
        --oncelog after=target/release/oncelog \\
        --kafka --kafka-fsync --producers 8,64,256 --seconds 20 --warmup 5 \\
        --runs 3 --json /tmp/txn_fanout.json

    # a quick check
    python3 bench/txn_fanout.py --oncelog before=/tmp/oncelog-before \\
        --kafka --producers 8,64 --seconds 10 --warmup 3

Bounded: TxnFanout exits by itself after S + W + 120 s and is killed at
S + W + 180 s; brokers are stopped (SIGTERM, SIGKILL after 30 s, by PID) in
finally blocks, on SIGTERM/SIGHUP/SIGINT, and get SIGTERM if this process dies
(PR_SET_PDEATHSIG). Loopback only. Stdlib only (Python 3.11).
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_ref  # noqa: E402
from kafka_ref import api_versions_ok, free_port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAVA_SRC = os.path.join(ROOT, "bench", "java", "TxnFanout.java")
JAVA_OUT = os.path.join(ROOT, ".tools", "bench-java")
JAVA_LIB = os.path.join(ROOT, ".tools", "java-lib")

KAFKA_VARIANTS = {
    "kafka": [],
    "kafka-fsync": ["log.flush.interval.messages=1"],
}

LIVE = []  # brokers to stop on a signal


class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted(f"signal {signum}")


def _tail(path, n=20):
    return kafka_ref._tail(path, n)


def compile_java(java_home_bin=None):
    """Compile TxnFanout into .tools/bench-java if missing or older than the source."""
    cls = os.path.join(JAVA_OUT, "TxnFanout.class")
    if os.path.exists(cls) and os.path.getmtime(cls) >= os.path.getmtime(JAVA_SRC):
        return
    javac = shutil.which("javac")
    if not javac:
        raise RuntimeError("no javac on PATH (a JDK 17+ is needed)")
    if not os.path.isdir(JAVA_LIB):
        raise RuntimeError(f"no {JAVA_LIB} (kafka-clients jars)")
    os.makedirs(JAVA_OUT, exist_ok=True)
    print(f"compiling {os.path.relpath(JAVA_SRC, ROOT)} into {os.path.relpath(JAVA_OUT, ROOT)}", flush=True)
    p = subprocess.run([javac, "-cp", os.path.join(JAVA_LIB, "*"), "-d", JAVA_OUT, JAVA_SRC],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"javac failed:\n{p.stdout}{p.stderr}")


class Oncelog:
    def __init__(self, binary, data_dir, log_path, start_timeout=60.0, settings=()):
        self.binary = binary
        self.settings = list(settings)  # extra `-o key=value` arguments
        self.data_dir = data_dir
        self.log_path = log_path
        self.start_timeout = start_timeout
        self.proc = None
        self.port = self.mport = None

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        self.port = free_port()
        self.mport = free_port()
        while self.mport == self.port:
            self.mport = free_port()
        cmd = [self.binary, "serve", "--data-dir", self.data_dir, "--listen", self.bootstrap,
               "--metrics-listen", f"127.0.0.1:{self.mport}"] + self.settings
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=kafka_ref._pdeathsig)
        LIVE.append(self)
        end = time.monotonic() + self.start_timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"oncelog exited with {self.proc.returncode} while starting:\n"
                                   + _tail(self.log_path))
            if api_versions_ok(self.port, timeout=1.0):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"oncelog not serving on {self.bootstrap} after {self.start_timeout:.0f} s:\n"
                           + _tail(self.log_path))

    def stop(self, timeout=30):
        """SIGTERM, SIGKILL after `timeout`; by PID. Returns the exit code."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"  oncelog pid {self.proc.pid} did not stop within {timeout} s of SIGTERM; killed", flush=True)
                self.proc.kill()
                self.proc.wait(10)
        if self in LIVE:
            LIVE.remove(self)
        return None if self.proc is None else self.proc.returncode


class Kafka:
    def __init__(self, data_dir, configs, lib):
        self.kb = kafka_ref.KafkaBroker(data_dir, configs=configs, lib=lib)
        self.log_path = self.kb.log_path

    @property
    def bootstrap(self):
        return self.kb.bootstrap

    def start(self):
        LIVE.append(self)
        self.kb.start()
        return self

    def stop(self):
        rc = self.kb.stop()
        if self in LIVE:
            LIVE.remove(self)
        return rc


def run_fanout(bootstrap, topic, n, args, log_path):
    """One TxnFanout run; returns its JSON (plus rc), or a dict with 'failure'."""
    cmd = ["java", f"-Xmx{args.java_heap}", "-XX:+UseParallelGC",
           "-cp", f"{JAVA_OUT}:{os.path.join(JAVA_LIB, '*')}", "TxnFanout",
           "--bootstrap", bootstrap, "--topic", topic, "--partitions", str(partitions_for(args, n)),
           "--producers", str(n), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
           "--size", str(args.size), "--id-prefix", f"{topic}-p"]
    if getattr(args, "offsets_group", None):
        cmd += ["--offsets-group", args.offsets_group]
    timeout = args.seconds + args.warmup + 180
    with open(log_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True, preexec_fn=kafka_ref._pdeathsig)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate(10)
            return {"producers": n, "failure": f"TxnFanout killed after {timeout:.0f} s", "errors": None}
        except BaseException:
            proc.kill()
            proc.wait(10)
            raise
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        return {"producers": n, "errors": None,
                "failure": f"TxnFanout exit {proc.returncode}, no result:\n{_tail(log_path)}"}
    r = json.loads(lines[-1])
    r["rc"] = proc.returncode
    return r


def partitions_for(args, n):
    return 2 * n if args.partitions == "2n" else int(args.partitions)


def fmt_ms(v):
    return "-" if v is None else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def median(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--oncelog", action="append", default=[], metavar="LABEL=BIN",
                    help="an oncelog binary to measure, with a label (repeatable)")
    ap.add_argument("--kafka", action="store_true", help="also Apache Kafka with its defaults (label kafka)")
    ap.add_argument("--kafka-fsync", action="store_true",
                    help="also Apache Kafka with log.flush.interval.messages=1 (label kafka-fsync)")
    ap.add_argument("--kafka-lib", default=None, help="Kafka jar dir (default .tools/kafka-lib)")
    ap.add_argument("--producers", default="8,64,256", help="producer counts, comma-separated")
    ap.add_argument("--partitions", default="64",
                    help="topic partitions (default 64); '2n' = 2 x producers, so no two producers share one")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per load")
    ap.add_argument("--warmup", type=float, default=5.0, help="warm-up before the window, not counted")
    ap.add_argument("--size", type=int, default=100, help="record value bytes")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--java-heap", default="1g", help="TxnFanout -Xmx")
    ap.add_argument("--tmp", default=None, help="parent dir of the temp data dirs (default: system temp)")
    ap.add_argument("--keep", action="store_true", help="keep data dirs and logs")
    ap.add_argument("--json", default=None, metavar="OUT", help="write the raw results here")
    a = ap.parse_args()

    try:
        counts = [int(x) for x in a.producers.split(",") if x.strip()]
    except ValueError:
        ap.error("--producers takes comma-separated integers")
    if not counts or min(counts) < 1:
        ap.error("--producers needs positive counts")
    if a.partitions != "2n" and (not a.partitions.isdigit() or int(a.partitions) < 1):
        ap.error("--partitions takes a positive integer or 2n")
    targets = []  # (label, kind, spec)
    for spec in a.oncelog:
        label, sep, binary = spec.partition("=")
        if not sep:
            binary, label = spec, os.path.basename(spec)
        if not os.access(binary, os.X_OK):
            ap.error(f"--oncelog {spec}: no executable at {binary}")
        targets.append((label, "oncelog", os.path.abspath(binary)))
    for label, flag in (("kafka", a.kafka), ("kafka-fsync", a.kafka_fsync)):
        if flag:
            why = kafka_ref.unavailable(a.kafka_lib)
            if why:
                print(f"Apache Kafka: not available ({why}); {label} skipped", flush=True)
            else:
                targets.append((label, "kafka", KAFKA_VARIANTS[label]))
    if not targets:
        ap.error("nothing to measure: give --oncelog LABEL=BIN and/or --kafka")
    labels = [t[0] for t in targets]
    if len(set(labels)) != len(labels):
        ap.error(f"duplicate labels {labels}")

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _on_signal)

    compile_java()
    tmp = tempfile.mkdtemp(prefix="txn-fanout-", dir=a.tmp)
    if any(k == "kafka" for _, k, _ in targets):
        print(f"Apache Kafka {kafka_ref.kafka_version(a.kafka_lib)} single node KRaft", flush=True)
    print(f"producers {counts}, partitions {a.partitions}, {a.size} B records, 2 partitions per transaction, "
          f"{a.warmup:g} s warm-up + {a.seconds:g} s measured, {a.runs} run(s); data in {tmp}", flush=True)

    results = []  # one dict per (run, target, producers)
    notes = []
    try:
        for run in range(a.runs):
            for label, kind, spec in targets:
                d = os.path.join(tmp, f"{label}-r{run}")
                if kind == "oncelog":
                    os.makedirs(d, exist_ok=True)
                    broker = Oncelog(spec, os.path.join(d, "data"), os.path.join(d, "oncelog.log"))
                else:
                    broker = Kafka(d, spec, a.kafka_lib)
                try:
                    t0 = time.monotonic()
                    broker.start()
                    print(f"run {run + 1} {label}: serving on {broker.bootstrap} after "
                          f"{time.monotonic() - t0:.1f} s", flush=True)
                    for n in counts:
                        topic = f"fanout-{n}"
                        r = run_fanout(broker.bootstrap, topic, n, a, os.path.join(d, f"fanout-{n}.stderr"))
                        r.update(target=label, run=run)
                        results.append(r)
                        if r.get("failure") and r.get("commits") is None:
                            print(f"  {label} {n:>4} producers: FAILED {r['failure']}", flush=True)
                            notes.append(f"{label} run {run + 1} {n} producers: {r['failure'].splitlines()[0]}")
                            continue
                        print(f"  {label} {n:>4} producers: {r['commits_per_s']:.0f} commits/s, commit p50 "
                              f"{fmt_ms(r['commit_p50_ms'])} p99 {fmt_ms(r['commit_p99_ms'])} ms, txn p99 "
                              f"{fmt_ms(r['txn_p99_ms'])} ms, errors {r['errors']}, init {r['init_s']:.1f} s",
                              flush=True)
                        if r.get("errors") or r.get("failure") or r.get("timed_out"):
                            msg = (f"{label} run {run + 1} {n} producers: errors {r.get('errors')} "
                                   f"{r.get('error_kinds')}, stopped producers {r.get('stopped_producers')}"
                                   + (f", {r['failure']}" if r.get("failure") else ""))
                            notes.append(msg)
                            for s in (r.get("error_samples") or [])[:3]:
                                print(f"    {s[:300]}", flush=True)
                except Interrupted:
                    raise
                except Exception as e:  # noqa: BLE001 - one target failing must not lose the others
                    print(f"  {label}: failed: {e}", flush=True)
                    notes.append(f"{label} run {run + 1}: {str(e).splitlines()[0] if str(e) else e!r}")
                finally:
                    rc = broker.stop()
                    if rc not in (0, None, -signal.SIGTERM, 128 + signal.SIGTERM, 143):
                        notes.append(f"{label} run {run + 1}: broker exit code {rc} after SIGTERM")
                    if not a.keep and kind == "oncelog":
                        shutil.rmtree(os.path.join(d, "data"), ignore_errors=True)
                    if not a.keep and kind == "kafka":
                        shutil.rmtree(os.path.join(d, "logs"), ignore_errors=True)
    except Interrupted as e:
        print(f"interrupted ({e}); stopping brokers", flush=True)
        notes.append(f"interrupted ({e})")
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # let the clean-up finish
        for b in list(LIVE):
            try:
                b.stop()
            except Exception as e:  # noqa: BLE001
                print(f"stopping a broker failed: {e}", flush=True)

    # Summary: median per (target, producers)
    rows = {}
    for r in results:
        if r.get("commits") is None:
            continue
        rows.setdefault((r["target"], r["producers"]), []).append(r)
    summary = {}
    print()
    print("| target | producers | commits/s (median, range) | commit p50 ms | commit p99 ms | txn p99 ms | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label in labels:
        for n in counts:
            rs = rows.get((label, n))
            if not rs:
                tried = any(r["target"] == label and r["producers"] == n for r in results)
                print(f"| {label} | {n} | {'failed' if tried else 'not run'} | - | - | - | - |")
                continue
            cps = [x["commits_per_s"] for x in rs]
            s = {
                "commits_per_s": median(cps), "min": min(cps), "max": max(cps),
                "commit_p50_ms": median([x["commit_p50_ms"] for x in rs]),
                "commit_p99_ms": median([x["commit_p99_ms"] for x in rs]),
                "txn_p99_ms": median([x["txn_p99_ms"] for x in rs]),
                "errors": sum(x["errors"] or 0 for x in rs), "runs": len(rs),
            }
            summary[f"{label}/{n}"] = s
            rng = f" ({s['min']:.0f}-{s['max']:.0f})" if len(rs) > 1 else ""
            print(f"| {label} | {n} | {s['commits_per_s']:.0f}{rng} | {fmt_ms(s['commit_p50_ms'])} | "
                  f"{fmt_ms(s['commit_p99_ms'])} | {fmt_ms(s['txn_p99_ms'])} | {s['errors']} |")
    print()
    kafkas = [lb for lb, k, _ in targets if k == "kafka"]
    for ol in [lb for lb, k, _ in targets if k == "oncelog"]:
        for kl in kafkas:
            parts = []
            for n in counts:
                o, k = summary.get(f"{ol}/{n}"), summary.get(f"{kl}/{n}")
                if o and k and k["commits_per_s"]:
                    parts.append(f"{n}: {o['commits_per_s'] / k['commits_per_s']:.2f}x")
                else:
                    parts.append(f"{n}: -")
            print(f"commits/s {ol} / {kl}: " + ", ".join(parts))
    if notes:
        print("\nnotes:")
        for n in notes:
            print(f"  - {n}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "kafka_version": kafka_ref.kafka_version(a.kafka_lib),
                       "results": results, "summary": summary, "notes": notes}, f, indent=1)
        print(f"raw results in {a.json}")
    if a.keep:
        print(f"data and logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if any(n.startswith("interrupted") for n in notes) else 0


if __name__ == "__main__":
    sys.exit(main())
