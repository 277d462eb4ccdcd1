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
import array
import atexit
import hashlib
import json
import multiprocessing as mp
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_ref  # noqa: E402
from produce_bench import KAFKA_VARIANTS, ROOT, free_port, pct, raw_fdatasync  # noqa: E402

SECTIONS = ["durable", "interval", "ack", "e2e", "restart", "resources"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
MB = 1e6
GB = 1e9

# --------------------------------------------------------------------------
# /proc helpers


def proc_cpu_s(pid):
    """utime+stime of a process (all its threads), seconds; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def proc_write_bytes(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def system_busy_s():
    """(busy, steal) CPU seconds of the whole machine since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    steal = v[7] if len(v) > 7 else 0
    return busy / CLK_TCK, steal / CLK_TCK


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


FOREIGN_NAMES = ("cargo", "rustc", "cc1", "cc1plus", "ld", "java", "oncelog", "fio", "stress",
                 "rdkafka_perform", "tansu")


def foreign_processes():
    """Heavy-looking processes (builds, brokers) that this suite did not start."""
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = int(d)
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if not comm.startswith(FOREIGN_NAMES):
            continue
        p, ours = pid, False
        for _ in range(64):
            if p in (0, 1):
                break
            if p == me:
                ours = True
                break
            p = _ppid(p)
        if not ours:
            out.append(f"{comm}({pid})")
    return out


def set_affinity_all_threads(pid, cpus):
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(t), cpus)
            except OSError:
                pass
    except OSError:
        pass


# --------------------------------------------------------------------------
# Brokers

LIVE = []  # brokers to stop if the suite exits early


def _cleanup():
    for b in list(LIVE):
        try:
            b.stop(timeout=10)
        except Exception:  # noqa: BLE001
            pass


atexit.register(_cleanup)


def _on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def wait_serving(port, proc, timeout):
    """Seconds until 127.0.0.1:port answers ApiVersions; raises if the process dies."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode} while starting")
        if kafka_ref.api_versions_ok(port, timeout=1.0):
            return time.monotonic() - t0
        time.sleep(0.005)
    raise RuntimeError(f"broker not serving on {port} after {timeout:.0f} s")


def scan_log(path, limit=8):
    """(count of ERROR/WARN lines, the first few distinct messages)."""
    n, seen = 0, []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if re.search(r"\b(ERROR|WARN)\b", line):
                    n += 1
                    # Strip the timestamp so equal messages collapse.
                    msg = re.sub(r"^\S*\d{4}-\d\d-\d\dT\S+\s*|^\[[^\]]*\]\s*", "", line.strip())
                    msg = msg[:300]
                    if msg not in seen and len(seen) < limit:
                        seen.append(msg)
    except OSError:
        pass
    return n, seen


class Oncelog:
    kind = "oncelog"

    def __init__(self, binary, data_dir, log_path, settings=(), cpus=None, start_timeout=300):
        self.binary, self.data_dir, self.log_path = binary, data_dir, log_path
        self.settings, self.cpus, self.start_timeout = list(settings), cpus, start_timeout
        self.proc = None
        self.findings = []

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self):
        return self.proc.pid

    def start(self):
        """Starts the broker; returns seconds until it answers ApiVersions."""
        self.port, self.mport = free_port(), free_port()
        cmd = [self.binary, "serve", "--data-dir", self.data_dir, "--listen", self.bootstrap,
               "--metrics-listen", f"127.0.0.1:{self.mport}"]
        for s in self.settings:
            cmd += ["-o", s]
        cpus = self.cpus

        def pre():
            kafka_ref._pdeathsig()
            if cpus:
                os.sched_setaffinity(0, cpus)

        log = open(self.log_path, "a")
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=pre)
        finally:
            log.close()
        LIVE.append(self)
        wait_serving(self.port, self.proc, self.start_timeout)
        return time.monotonic() - t0

    def metrics(self):
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.mport}/metrics", timeout=10).read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if not line or line[0] == "#":
                continue
            name, _, val = line.rpartition(" ")
            try:
                out[name] = float(val)
            except ValueError:
                pass
        return out

    def _forget(self):
        if self in LIVE:
            LIVE.remove(self)

    def stop(self, timeout=30):
        """SIGTERM, SIGKILL after `timeout`; by PID. Returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            self._forget()
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            self.findings.append(f"did not stop within {timeout} s of SIGTERM; killed")
        self._forget()
        rc = self.proc.returncode
        if rc != 0:
            self.findings.append(f"exit code {rc} after SIGTERM")
        return rc

    def kill9(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._forget()


class KafkaPeer:
    """Apache Kafka via kafka_ref, with the same interface the loads use."""
    kind = "kafka"

    def __init__(self, data_dir, variant, lib, cpus=None):
        self.kb = kafka_ref.KafkaBroker(data_dir, configs=KAFKA_VARIANTS[variant], lib=lib)
        self.data_dir = data_dir
        self.cpus = cpus
        self.log_path = self.kb.log_path
        self.findings = []

    bootstrap = property(lambda self: self.kb.bootstrap)
    pid = property(lambda self: self.kb.proc.pid)

    def start(self):
        t0 = time.monotonic()
        LIVE.append(self)
        self.kb.start()
        if self.cpus:
            set_affinity_all_threads(self.pid, self.cpus)
        return time.monotonic() - t0

    def metrics(self):
        return {}

    def stop(self, timeout=30):
        self.kb.stop_timeout = timeout
        rc = self.kb.stop()
        if self in LIVE:
            LIVE.remove(self)
        return rc


TANSU_ENV = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY",
             "OTEL_EXPORTER_OTLP_ENDPOINT")


class TansuPeer:
    """Tansu (`tansu broker`) on a free loopback port. `storage` is its
    --storage-engine URL; "{dir}" in it is replaced by this peer's data dir."""
    kind = "tansu"

    def __init__(self, binary, data_dir, storage, cpus=None, start_timeout=60):
        self.binary, self.data_dir, self.cpus = binary, data_dir, cpus
        self.storage = storage.replace("{dir}", data_dir)
        self.log_path = os.path.join(data_dir, "tansu.log")
        self.start_timeout = start_timeout
        self.proc = None
        self.findings = []

    bootstrap = property(lambda self: f"127.0.0.1:{self.port}")
    pid = property(lambda self: self.proc.pid)

    def start(self):
        os.makedirs(self.data_dir, exist_ok=True)
        self.port = free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in TANSU_ENV}
        cpus = self.cpus

        def pre():
            kafka_ref._pdeathsig()
            if cpus:
                os.sched_setaffinity(0, cpus)

        t0 = time.monotonic()
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen([self.binary, "broker", "--listener-url", url, "--advertised-listener-url",
                                          url, "--storage-engine", self.storage], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.data_dir,
                                         env=env, start_new_session=True, preexec_fn=pre)
        LIVE.append(self)
        wait_serving(self.port, self.proc, self.start_timeout)
        return time.monotonic() - t0

    def metrics(self):
        return {}

    def stop(self, timeout=30):
        return Oncelog.stop(self, timeout)

    def _forget(self):
        if self in LIVE:
            LIVE.remove(self)


def tansu_version(binary):
    try:
        return subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def broker_sample(b):
    return {"t": time.monotonic(), "cpu": proc_cpu_s(b.pid), "wbytes": proc_write_bytes(b.pid),
            "metrics": b.metrics(), "sys": system_busy_s(), "hwm_kb": proc_status_kb(b.pid, "VmHWM")}


def hist_quantile(m0, m1, name, labels, q):
    """Upper bound (seconds or bytes) of the bucket holding quantile q of the
    observations made between two /metrics scrapes; None if there were none."""
    sep = "," if labels else ""
    prefix = f"{name}_bucket{{{labels}{sep}le=\""
    rows = []
    for k, v in m1.items():
        if k.startswith(prefix):
            le = k[len(prefix):-2]
            rows.append((float("inf") if le == "+Inf" else float(le), v - m0.get(k, 0.0)))
    rows.sort()
    if not rows or rows[-1][1] <= 0:
        return None
    total = rows[-1][1]
    for le, cum in rows:
        if cum >= q * total:
            return le
    return rows[-1][0]


def broker_delta(s0, s1, payload_bytes, msgs):
    """Broker-side figures over a load: CPU, fsyncs, disk writes, histograms."""
    d = {}
    if s0["cpu"] is not None and s1["cpu"] is not None:
        d["broker_cpu_s"] = s1["cpu"] - s0["cpu"]
        d["broker_cpu_s_per_gb"] = d["broker_cpu_s"] / (payload_bytes / GB) if payload_bytes else None
        d["broker_cpu_s_per_mmsg"] = d["broker_cpu_s"] / (msgs / 1e6) if msgs else None
    if s0["wbytes"] is not None and s1["wbytes"] is not None and payload_bytes:
        d["disk_write_bytes"] = s1["wbytes"] - s0["wbytes"]
        d["disk_write_amp"] = d["disk_write_bytes"] / payload_bytes
    m0, m1 = s0["metrics"], s1["metrics"]
    if m1:
        syncs = m1.get("oncelog_fsync_total", 0) - m0.get("oncelog_fsync_total", 0)
        app = m1.get("oncelog_appended_bytes_total", 0) - m0.get("oncelog_appended_bytes_total", 0)
        d["fsyncs"] = syncs
        d["appended_bytes"] = app
        d["bytes_per_sync"] = app / syncs if syncs else None
        for q in (0.5, 0.99):
            v = hist_quantile(m0, m1, "oncelog_fsync_latency_seconds", "", q)
            d[f"broker_fsync_p{int(q * 100)}_le_ms"] = v * 1000 if v is not None else None
            v = hist_quantile(m0, m1, "oncelog_request_latency_seconds", 'api="Produce"', q)
            d[f"broker_produce_p{int(q * 100)}_le_ms"] = v * 1000 if v is not None else None
    d["broker_rss_hwm_mb"] = s1["hwm_kb"] / 1024 if s1["hwm_kb"] else None
    return d


# --------------------------------------------------------------------------
# Load generators (spawned processes; top level so they pickle)


def _self_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _producer_proc(cfg, ready_q, go, start_at, out_q):
    """Closed-loop producer: as fast as the client queue allows for warmup +
    seconds (or until max_bytes), then flush. Counts the acknowledged
    messages whose produce() call fell in the measured window."""
    try:
        if cfg.get("cpus"):
            os.sched_setaffinity(0, cfg["cpus"])
        from confluent_kafka import Producer
        st = {"n": 0, "n_all": 0, "err": 0, "last_err": None}
        lat = array.array("f")
        win = [float("inf"), float("inf")]

        def dr(err, msg):
            if err is not None:
                st["err"] += 1
                st["last_err"] = str(err)
                return
            st["n_all"] += 1
            lt = msg.latency() or 0.0
            if win[0] <= time.monotonic() - lt < win[1]:
                st["n"] += 1
                lat.append(lt * 1000.0)

        conf = dict(cfg["conf"])
        conf["on_delivery"] = dr
        p = Producer(conf)
        topic, parts, size = cfg["topic"], cfg["partitions"], cfg["size"]
        payload = os.urandom(size)
        for part in range(parts):  # metadata, connections, producer id
            p.produce(topic, payload, partition=part)
        if p.flush(60):
            raise RuntimeError("warm-up messages not acknowledged within 60 s")
        st.update(n=0, n_all=0)
        ready_q.put(("ready", os.getpid()))
        if not go.wait(120):
            raise RuntimeError("no start signal")
        t0 = start_at.value
        win[0] = t0 + cfg["warmup"]
        win[1] = win[0] + cfg["seconds"]
        end = win[1]
        max_msgs = cfg.get("max_bytes", 0) // size if cfg.get("max_bytes") else None
        chunk = cfg.get("chunk", 1)
        offset = cfg["index"] * chunk
        while time.monotonic() < t0:
            time.sleep(0.0005)
        cpu0 = _self_cpu()
        produce, poll = p.produce, p.poll
        k = 0
        while True:
            try:
                produce(topic, payload, partition=((k + offset) // chunk) % parts)
                k += 1
            except BufferError:
                poll(0.0005)
            if k & 127 == 0:
                poll(0)
                if time.monotonic() >= end or (max_msgs is not None and k >= max_msgs):
                    break
        t_stop = time.monotonic()
        left = p.flush(cfg["flush_timeout"])
        out_q.put({"ok": True, "sent": k, "acked_window": st["n"], "acked_all": st["n_all"],
                   "errors": st["err"], "last_error": st["last_err"], "unflushed": left,
                   "t_start": t0, "t_stop": t_stop, "t_end": time.monotonic(),
                   "cpu_s": _self_cpu() - cpu0, "lat": lat.tobytes()})
    except Exception as e:  # noqa: BLE001
        ready_q.put(("error", repr(e)))
        out_q.put({"ok": False, "error": repr(e)})


def _native_producer_proc(cfg, ready_q, go, start_at, out_q):
    """The same closed loop as _producer_proc, run by `oncelog bench-load`
    (librdkafka from Rust, no interpreter per message) or `oncelog bench-wire`
    (the Kafka wire protocol spoken directly, blocking I/O, pre-encoded
    records), so the load generator takes less of the machine's CPU from the
    broker under test."""
    proc = None
    try:
        lat_path = os.path.join(cfg["tmp"], f"lat-{os.getpid()}.f32")
        common = ["--topic", cfg["topic"], "--partitions", str(cfg["partitions"]), "--size", str(cfg["size"]),
                  "--index", str(cfg["index"]), "--flush-timeout", str(cfg["flush_timeout"]),
                  "--latency-file", lat_path]
        if cfg.get("max_bytes"):
            common += ["--max-msgs", str(max(1, cfg["max_bytes"] // cfg["size"]))]
        if cfg["client"] == "wire":
            # the same producer settings, spoken on the wire by the generator
            conf = cfg["conf"]
            if str(conf.get("acks")) not in ("all", "-1"):
                raise RuntimeError("the wire generator only does acks=all produce")
            cmd = [cfg["binary"], "bench-wire", "--bootstrap", conf["bootstrap.servers"],
                   "--request-bytes", str(conf.get("batch.size", 1_000_000)),
                   "--window", str(conf.get("max.in.flight.requests.per.connection", 5))] + common
            if not conf.get("enable.idempotence"):
                cmd.append("--no-idempotence")
            if cfg.get("rate"):
                cmd += ["--rate", str(cfg["rate"]), "--linger-ms", str(cfg.get("linger_ms") or 1)]
        else:
            cmd = [cfg["binary"], "bench-load", "--chunk", str(cfg.get("chunk", 1))] + common
            for k, v in cfg["conf"].items():
                cmd += ["--conf", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
        pre = (lambda: os.sched_setaffinity(0, cfg["cpus"])) if cfg.get("cpus") else None
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=pre)
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"{cmd[1]} did not start: {line or proc.wait(10)}")
        ready_q.put(("ready", proc.pid))
        if not go.wait(120):
            raise RuntimeError("no start signal")
        proc.stdin.write(f"go {start_at.value!r} {cfg['warmup']!r} {cfg['seconds']!r}\n")
        proc.stdin.flush()
        out = json.loads(proc.stdout.readline())
        proc.wait(30)
        if not out.get("ok"):
            raise RuntimeError(out.get("error"))
        with open(lat_path, "rb") as f:
            out["lat"] = f.read()
        os.unlink(lat_path)
        out_q.put(out)
    except Exception as e:  # noqa: BLE001
        if proc and proc.poll() is None:
            proc.kill()
        ready_q.put(("error", repr(e)))
        out_q.put({"ok": False, "error": repr(e)})


def _txn_producer_proc(cfg, ready_q, go, start_at, out_q):
    """Open-loop transactional producer: message k is due at t0 + k/rate and
    carries that time (CLOCK_MONOTONIC, little-endian double) in its first 8
    bytes; commits every commit_ms."""
    try:
        if cfg.get("cpus"):
            os.sched_setaffinity(0, cfg["cpus"])
        from confluent_kafka import Producer
        st = {"n": 0, "n_all": 0, "err": 0, "last_err": None}
        lat = array.array("f")
        win = [float("inf"), float("inf")]
        unpack = struct.Struct("<d").unpack_from

        def dr(err, msg):
            if err is not None:
                st["err"] += 1
                st["last_err"] = str(err)
                return
            st["n_all"] += 1
            if win[0] <= unpack(msg.value())[0] < win[1]:
                st["n"] += 1
                lat.append((msg.latency() or 0.0) * 1000.0)

        conf = dict(cfg["conf"])
        conf["on_delivery"] = dr
        conf["transactional.id"] = f"{cfg['txn_prefix']}-{cfg['index']}"
        p = Producer(conf)
        p.init_transactions(60)
        topic, parts, size = cfg["topic"], cfg["partitions"], cfg["size"]
        buf = bytearray(os.urandom(max(size, 8)))
        struct.pack_into("<d", buf, 0, 0.0)
        p.begin_transaction()
        for part in range(parts):
            p.produce(topic, bytes(buf), partition=part)
        p.commit_transaction(60)
        st.update(n=0, n_all=0)
        ready_q.put(("ready", os.getpid()))
        if not go.wait(120):
            raise RuntimeError("no start signal")
        t0 = start_at.value
        win[0] = t0 + cfg["warmup"]
        win[1] = win[0] + cfg["seconds"]
        end = win[1]
        gap = 1.0 / cfg["rate"]
        commit_s = cfg["commit_ms"] / 1000.0
        commits = []
        while time.monotonic() < t0:
            time.sleep(0.0005)
        cpu0 = _self_cpu()
        produce, poll, pack = p.produce, p.poll, struct.Struct("<d").pack_into
        k = 0
        due = t0
        p.begin_transaction()
        txn_t0 = time.monotonic()
        max_behind = 0.0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            max_behind = max(max_behind, now - due)
            while due <= now and due < end:
                pack(buf, 0, due)
                try:
                    produce(topic, bytes(buf), partition=k % parts)
                except BufferError:
                    poll(0.001)
                    break
                k += 1
                due = t0 + k * gap
            poll(0)
            now = time.monotonic()
            if now - txn_t0 >= commit_s:
                p.commit_transaction(60)
                t1 = time.monotonic()
                commits.append((t1 - now) * 1000.0)
                p.begin_transaction()
                txn_t0 = t1
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, 0.001))
        t_stop = time.monotonic()
        p.commit_transaction(60)
        left = p.flush(cfg["flush_timeout"])
        out_q.put({"ok": True, "sent": k, "acked_window": st["n"], "acked_all": st["n_all"],
                   "errors": st["err"], "last_error": st["last_err"], "unflushed": left,
                   "t_start": t0, "t_stop": t_stop, "t_end": time.monotonic(),
                   "cpu_s": _self_cpu() - cpu0, "lat": lat.tobytes(),
                   "commits": array.array("f", commits).tobytes(), "max_behind_s": max_behind})
    except Exception as e:  # noqa: BLE001
        ready_q.put(("error", repr(e)))
        out_q.put({"ok": False, "error": repr(e)})


def _consumer_proc(cfg, ready_q, go, start_at, out_q):
    """read_committed consumer on all partitions (assign, no group): latency =
    receive time - the scheduled send time carried in the payload."""
    try:
        if cfg.get("cpus"):
            os.sched_setaffinity(0, cfg["cpus"])
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
        c = Consumer({"bootstrap.servers": cfg["bootstrap"], "group.id": f"suite-{uuid.uuid4().hex[:8]}",
                      "isolation.level": "read_committed", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", **cfg.get("conf", {})})
        c.assign([TopicPartition(cfg["topic"], p, OFFSET_BEGINNING) for p in range(cfg["partitions"])])
        c.consume(1, 1.0)
        ready_q.put(("ready", os.getpid()))
        if not go.wait(120):
            raise RuntimeError("no start signal")
        t0 = start_at.value
        w0 = t0 + cfg["warmup"]
        w1 = w0 + cfg["seconds"]
        hard_end = w1 + cfg["drain_s"]
        idle_s = cfg["idle_s"]
        unpack = struct.Struct("<d").unpack_from
        lat = array.array("f")
        n_all = errors = 0
        last_err = None
        last_msg = time.monotonic()
        cpu0 = _self_cpu()
        while True:
            now = time.monotonic()
            if now >= hard_end or (now > w1 + idle_s and now - last_msg > idle_s):
                break
            # consume(n, timeout) waits for n messages or the timeout, which would
            # add up to the timeout to every latency: take what is there, else
            # block for the next single message.
            msgs = c.consume(1000, 0)
            if not msgs:
                m = c.poll(0.05)
                if m is None:
                    continue
                msgs = [m]
            now = time.monotonic()
            last_msg = now
            for m in msgs:
                if m.error():
                    errors += 1
                    last_err = str(m.error())
                    continue
                n_all += 1
                t = unpack(m.value())[0]
                if w0 <= t < w1:
                    lat.append((now - t) * 1000.0)
        c.close()
        out_q.put({"ok": True, "consumed_all": n_all, "consumed_window": len(lat), "errors": errors,
                   "last_error": last_err, "cpu_s": _self_cpu() - cpu0, "lat": lat.tobytes()})
    except Exception as e:  # noqa: BLE001
        ready_q.put(("error", repr(e)))
        out_q.put({"ok": False, "error": repr(e)})


def lat_summary(vals, prefix):
    v = sorted(vals)
    return {f"{prefix}p50_ms": pct(v, 50), f"{prefix}p99_ms": pct(v, 99),
            f"{prefix}p999_ms": pct(v, 99.9), f"{prefix}max_ms": v[-1] if v else float("nan")}


def run_procs(specs, warmup, seconds, timeout, on_start=None):
    """Starts (target, cfg) processes, waits until all are ready, calls
    on_start(), starts them together and returns their result dicts (and the
    start time)."""
    ctx = mp.get_context("spawn")
    ready_q, out_q = ctx.Queue(), ctx.Queue()
    go, start_at = ctx.Event(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=t, args=(c, ready_q, go, start_at, out_q), daemon=True) for t, c in specs]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in procs:
            kind, what = ready_q.get(timeout=120)
            if kind == "error":
                raise RuntimeError(f"load generator failed to start: {what}")
        if on_start:
            on_start()
        start_at.value = time.monotonic() + 0.05
        t0 = start_at.value
        go.set()
        for _ in procs:
            left = max(5.0, t0 + warmup + seconds + timeout - time.monotonic())
            results.append(out_q.get(timeout=left))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join(5)
    bad = [r["error"] for r in results if not r.get("ok")]
    if bad:
        raise RuntimeError(f"load generator failed: {bad[0]}")
    return results, t0


def producer_conf(bootstrap, args, **extra):
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": args.linger_ms,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": args.queue_msgs,
        "queue.buffering.max.kbytes": args.queue_kb,
        "message.timeout.ms": 60_000,
    }
    conf.update(extra)
    return conf


def create_topic(bootstrap, topic, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    fs = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for f in fs.values():
        f.result(timeout=60)


def closed_loop_load(broker, topic, size, partitions, args, seconds=None, warmup=None, conf=None,
                     max_bytes=0, chunk=1, client=None, rate=None, linger_ms=None):
    """The producer load every throughput section uses, with the broker-side
    deltas around it. Returns one flat dict of figures."""
    seconds = args.seconds if seconds is None else seconds
    warmup = args.warmup if warmup is None else warmup
    # Settle the disk first: files removed earlier (a baseline's, a previous
    # data dir) are discarded in the next journal commit on a filesystem
    # mounted with `discard`, which stalls an fdatasync for seconds.
    os.sync()
    create_topic(broker.bootstrap, topic, partitions)
    conf = conf or producer_conf(broker.bootstrap, args)
    n = args.producers
    client = client or args.client
    if rate and client != "wire":
        raise ValueError("a fixed rate needs the wire load generator")
    target = _producer_proc if client == "python" else _native_producer_proc
    specs = [(target, {"conf": conf, "topic": topic, "partitions": partitions, "size": size,
                       "binary": args.binary, "tmp": args.tmp, "client": client,
                       "rate": rate / n if rate else None, "linger_ms": linger_ms,
                               "warmup": warmup, "seconds": seconds, "index": i, "cpus": args.client_cpus,
                               "flush_timeout": args.flush_timeout, "chunk": chunk,
                               "max_bytes": max_bytes // n if max_bytes else 0})
             for i in range(n)]
    foreign = foreign_processes()
    s0 = {}
    rs, t0 = run_procs(specs, warmup, seconds, args.flush_timeout + 30,
                       on_start=lambda: s0.update(broker_sample(broker)))
    s1 = broker_sample(broker)
    lat = array.array("f")
    for r in rs:
        lat.frombytes(r["lat"])
    acked_window = sum(r["acked_window"] for r in rs)
    acked_all = sum(r["acked_all"] for r in rs)
    t_stop = max(r["t_stop"] for r in rs)
    out = {
        "size": size, "partitions": partitions, "producers": n,
        "sent": sum(r["sent"] for r in rs), "acked": acked_all,
        "errors": sum(r["errors"] for r in rs), "unflushed": sum(r["unflushed"] for r in rs),
        "last_error": next((r["last_error"] for r in rs if r["last_error"]), None),
        "msgs_per_s": acked_window / seconds, "mb_per_s": acked_window * size / seconds / MB,
        "load_seconds": t_stop - t0, "client_cpu_s": sum(r["cpu_s"] for r in rs),
        "loadavg": loadavg(), "foreign_processes": foreign,
    }
    if max_bytes:  # a fill: throughput over the whole run
        out["msgs_per_s"] = acked_all / max(t_stop - t0, 1e-9)
        out["mb_per_s"] = acked_all * size / max(t_stop - t0, 1e-9) / MB
    out.update(lat_summary(lat, "ack_"))
    out.update(broker_delta(s0, s1, acked_all * size, acked_all))
    out.update(noise(s0, s1, out.get("broker_cpu_s"), out["client_cpu_s"]))
    return out


def noise(s0, s1, broker_cpu, client_cpu):
    """CPU used by other processes during a load, in cores (busy - ours)."""
    el = s1["t"] - s0["t"]
    busy = s1["sys"][0] - s0["sys"][0]
    steal = s1["sys"][1] - s0["sys"][1]
    other = busy - (broker_cpu or 0) - (client_cpu or 0)
    return {"other_cpu_cores": max(other, 0.0) / el if el > 0 else None,
            "steal_cores": steal / el if el > 0 else None}


# --------------------------------------------------------------------------
# Baselines


def _loopback_receiver(conn):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    conn.send(srv.getsockname()[1])
    s, _ = srv.accept()
    buf = bytearray(1 << 20)
    n = 0
    cpu0 = _self_cpu()
    while True:
        k = s.recv_into(buf)
        if not k:
            break
        n += k
    cpu = _self_cpu() - cpu0
    s.sendall(struct.pack(">qd", n, cpu))
    s.close()
    srv.close()


def loopback_tcp(nbytes, chunk=1 << 20):
    """Moves nbytes over one loopback TCP connection between two processes:
    MB/s and the receiver's CPU seconds."""
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_loopback_receiver, args=(b,), daemon=True)
    p.start()
    try:
        if not a.poll(60):
            raise RuntimeError("loopback receiver did not start")
        port = a.recv()
        buf = memoryview(os.urandom(chunk))
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            t0 = time.perf_counter()
            cpu0 = _self_cpu()
            sent = 0
            while sent < nbytes:
                k = min(chunk, nbytes - sent)
                s.sendall(buf[:k])
                sent += k
            s.shutdown(socket.SHUT_WR)
            hdr = b""
            while len(hdr) < 16:
                more = s.recv(16 - len(hdr))
                if not more:
                    raise RuntimeError("loopback receiver closed early")
                hdr += more
            el = time.perf_counter() - t0
            send_cpu = _self_cpu() - cpu0
        got, recv_cpu = struct.unpack(">qd", hdr)
    finally:
        p.join(10)
        if p.is_alive():
            p.terminate()
    return {"bytes": got, "mb_per_s": got / el / MB, "recv_cpu_s": recv_cpu, "send_cpu_s": send_cpu}


def fdatasync_baseline(dirpath, sync_bytes, total_bytes, seconds):
    """produce_bench.raw_fdatasync plus the CPU it took (this process)."""
    t0, w0 = os.times(), time.monotonic()
    r = raw_fdatasync(dirpath, sync_bytes, total_bytes, seconds)
    t1, w1 = os.times(), time.monotonic()
    r["cpu_s"] = (t1.user - t0.user) + (t1.system - t0.system)
    r["sync_bytes"] = int(max(sync_bytes, 512))
    r["bytes_approx"] = r["mb_per_s"] * MB * (w1 - w0)  # raw_fdatasync does not return its byte count
    return r


def read_all_files(d, drop_caches=False):
    if drop_caches:
        drop_page_cache()
    t0 = time.monotonic()
    n = 0
    buf = bytearray(1 << 20)
    for root, _dirs, files in os.walk(d):
        for f in files:
            try:
                with open(os.path.join(root, f), "rb", buffering=0) as fh:
                    while True:
                        k = fh.readinto(buf)
                        if not k:
                            break
                        n += k
            except OSError:
                pass
    return {"bytes": n, "seconds": time.monotonic() - t0}


def discard(d):
    """Deletes a stopped broker's data and commits the deletion, so the
    freed blocks' discards do not stall the next measurement's fdatasync."""
    shutil.rmtree(d, ignore_errors=True)
    os.sync()


def dir_bytes(d):
    n = 0
    for root, _dirs, files in os.walk(d):
        for f in files:
            try:
                n += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return n


def drop_page_cache():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


# --------------------------------------------------------------------------
# Output


def med(xs):
    xs = [x for x in xs if x is not None and x == x]
    return statistics.median(xs) if xs else None


def rng(xs):
    xs = [x for x in xs if x is not None and x == x]
    return (min(xs), max(xs)) if xs else (None, None)


def f0(v):
    return "-" if v is None else f"{v:,.0f}"


def f1(v):
    return "-" if v is None else f"{v:.1f}"


def f2(v):
    return "-" if v is None else f"{v:.2f}"


def f3(v):
    return "-" if v is None else f"{v:.3f}"


def table(headers, rows, notes=()):
    cols = [[str(h)] + [str(r[i]) for r in rows] for i, h in enumerate(headers)]
    w = [max(len(x) for x in c) for c in cols]
    line = lambda cells: "  ".join(str(c).rjust(w[i]) for i, c in enumerate(cells))  # noqa: E731
    print(line(headers))
    print("  ".join("-" * x for x in w))
    for r in rows:
        print(line(r))
    for n in notes:
        print(f"  {n}")
    print(flush=True)


def summarize(runs, keys):
    """Median and range of each key over runs."""
    s = {}
    for k in keys:
        vals = [r.get(k) for r in runs]
        s[k] = med(vals)
        lo, hi = rng(vals)
        s[k + "_min"], s[k + "_max"] = lo, hi
    return s


LOAD_KEYS = ["msgs_per_s", "mb_per_s", "ack_p50_ms", "ack_p99_ms", "ack_p999_ms", "ack_max_ms",
             "bytes_per_sync", "broker_cpu_s_per_gb", "broker_cpu_s_per_mmsg", "broker_rss_hwm_mb",
             "disk_write_amp", "broker_fsync_p50_le_ms", "broker_fsync_p99_le_ms",
             "broker_produce_p50_le_ms", "broker_produce_p99_le_ms", "other_cpu_cores", "steal_cores",
             "ratio", "baseline_mb_per_s", "client_cpu_s"]


def mark(s, args):
    """'!' when other processes used more than --noise-cpu cores in some run."""
    return "!" if (s.get("other_cpu_cores_max") or 0) > args.noise_cpu else ""


def warn_load(r, label):
    if r["errors"] or r["unflushed"] or r["acked"] != r["sent"]:
        print(f"  WARNING {label}: {r['errors']} delivery errors, {r['unflushed']} unflushed, "
              f"{r['sent'] - r['acked']} sent but not acknowledged (last error: {r['last_error']})", flush=True)


# --------------------------------------------------------------------------
# Sections


class Suite:
    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp
        self.out = {}
        self.log_findings = {}
        self.n = 0

    def path(self, name):
        self.n += 1
        return os.path.join(self.tmp, f"{self.n:03d}-{name}")

    def oncelog(self, name, settings=(), data_dir=None):
        d = data_dir or self.path(name)
        return Oncelog(self.args.binary, d, d.rstrip("/") + ".log", settings, cpus=self.args.broker_cpus,
                       start_timeout=self.args.start_timeout)

    def finish(self, b, label):
        """Stops a broker, records what its log says and deletes its data:
        a few loads at disk speed write tens of GB, and a full disk would
        fail the next broker (as it did Kafka's, with a log dir failure)."""
        b.stop()
        n, msgs = scan_log(b.log_path)
        if n or b.findings:
            self.log_findings[label] = {"error_warn_lines": n, "first": msgs, "other": b.findings}
        discard(b.data_dir)

    def matrix(self):
        return [(s, p) for s in self.args.sizes for p in self.args.partitions]

    # -- 1 and 2 -----------------------------------------------------------

    def peers(self, section):
        """(key, label, factory(run) -> broker, extra warm-up s) of the peers for a section."""
        a = self.args
        out = []
        if self.kafka_ok:
            variant = "fsync" if section == "durable" else "default"
            label = "Apache Kafka " + ("flush.messages=1" if variant == "fsync" else "defaults (no fsync)")
            out.append((f"kafka_{variant}", label,
                        lambda run, v=variant: KafkaPeer(self.path(f"kafka-{v}-r{run}"), v, a.kafka_lib,
                                                         cpus=a.broker_cpus),
                        a.kafka_extra_warmup))
        if self.tansu_ok and (section == "interval" or not a.tansu_storage.startswith("memory:")):
            out.append(("tansu", f"Tansu {a.tansu_storage}",
                        lambda run: TansuPeer(a.tansu, self.path(f"tansu-{section}-r{run}"), a.tansu_storage,
                                              cpus=a.broker_cpus), 0.0))
        return out

    def throughput_section(self, name, settings, baseline):
        a = self.args
        peers = self.peers(name)
        rows = {m: [] for m in self.matrix()}
        peer_rows = {key: {m: [] for m in self.matrix()} for key, *_ in peers}
        for run in range(a.runs):
            b = self.oncelog(f"{name}-r{run}", settings)
            b.start()
            try:
                for size, parts in self.matrix():
                    r = closed_loop_load(b, f"{name}-{size}-{parts}", size, parts, a)
                    warn_load(r, f"{name} {size} B x{parts}")
                    r.update(baseline(r))
                    rows[(size, parts)].append(r)
                    print(f"  run {run + 1} {name} {size:>5} B x{parts:<3}: {r['msgs_per_s']:>9,.0f} msgs/s "
                          f"{r['mb_per_s']:7.1f} MB/s  ack p50 {r['ack_p50_ms']:.2f} p99 {r['ack_p99_ms']:.2f} "
                          f"p99.9 {r['ack_p999_ms']:.2f} ms | baseline {r['baseline_mb_per_s']:.1f} MB/s "
                          f"ratio {r['ratio']:.3f} | other CPU {r['other_cpu_cores']:.2f} cores", flush=True)
            finally:
                self.finish(b, f"{name} run {run + 1}")
            for key, label, factory, extra_warmup in peers:
                pb = factory(run)
                try:
                    pb.start()
                    for size, parts in self.matrix():
                        r = closed_loop_load(pb, f"{name}-{size}-{parts}", size, parts, a,
                                             warmup=a.warmup + extra_warmup)
                        warn_load(r, f"{label} {size} B x{parts}")
                        peer_rows[key][(size, parts)].append(r)
                        print(f"  run {run + 1} {label} {size:>5} B x{parts:<3}: "
                              f"{r['msgs_per_s']:>9,.0f} msgs/s {r['mb_per_s']:7.1f} MB/s  ack p50 "
                              f"{r['ack_p50_ms']:.2f} p99 {r['ack_p99_ms']:.2f} p99.9 {r['ack_p999_ms']:.2f} ms",
                              flush=True)
                except Exception as e:  # noqa: BLE001 - a peer failing must not lose oncelog's figures
                    print(f"  {label} failed: {e}", flush=True)
                finally:
                    pb.stop()
                    n, msgs = scan_log(pb.log_path)
                    if n:
                        self.log_findings[f"{label} ({name}) run {run + 1}"] = {"error_warn_lines": n,
                                                                               "first": msgs}
                    discard(pb.data_dir)
        result = []
        for (size, parts), runs in rows.items():
            s = summarize(runs, LOAD_KEYS)
            entry = {"size": size, "partitions": parts, "median": s, "runs": runs, "peers": {}}
            for key, label, _f, _w in peers:
                pr = peer_rows[key][(size, parts)]
                if not pr:
                    continue
                ps = summarize(pr, LOAD_KEYS)
                entry["peers"][key] = {
                    "label": label, "median": ps, "runs": pr,
                    "oncelog_over_peer_msgs_per_s": s["msgs_per_s"] / ps["msgs_per_s"] if ps["msgs_per_s"] else None,
                    "oncelog_over_peer_ack_p99": s["ack_p99_ms"] / ps["ack_p99_ms"] if ps["ack_p99_ms"] else None}
            result.append(entry)
        return result

    def durable(self):
        a = self.args
        print(f"== durable produce (fsync before ack), {a.producers} producer processes, idempotent, acks=all, "
              f"{a.warmup:g}+{a.seconds:g} s per load", flush=True)

        def baseline(r):
            bps = r.get("bytes_per_sync") or 65536
            # Best of two: the first measurement right after a load is often
            # slowed by the load's leftovers (journal, discards), and a
            # too-low baseline would flatter the ratio.
            tries = [fdatasync_baseline(self.tmp, bps, r["acked"] * r["size"], a.baseline_seconds)
                     for _ in range(2)]
            raw = max(tries, key=lambda x: x["mb_per_s"])
            raw["tries_mb_per_s"] = [x["mb_per_s"] for x in tries]
            return {"baseline": raw, "baseline_mb_per_s": raw["mb_per_s"],
                    "ratio": r["mb_per_s"] / raw["mb_per_s"] if raw["mb_per_s"] else None}

        res = self.throughput_section("durable", [], baseline)
        self.out["durable"] = res
        rows = []
        for e in res:
            s = e["median"]
            rows.append([e["size"], e["partitions"], f0(s["msgs_per_s"]),
                         f"{f1(s['mb_per_s'])} ({f1(s['mb_per_s_min'])}-{f1(s['mb_per_s_max'])})",
                         f2(s["ack_p50_ms"]), f2(s["ack_p99_ms"]), f2(s["ack_p999_ms"]),
                         f0((s["bytes_per_sync"] or 0) / 1024), f1(s["baseline_mb_per_s"]),
                         f2(s["ratio"]) + mark(s, a), f1(s["broker_cpu_s_per_gb"]),
                         f2(s["broker_fsync_p99_le_ms"]) if s["broker_fsync_p99_le_ms"] else "-",
                         f2(s["other_cpu_cores"])])
        print(f"\ndurable produce, median of {a.runs} runs")
        table(["bytes", "parts", "msgs/s", "MB/s (min-max)", "ack p50", "p99", "p99.9", "KiB/sync",
               "raw MB/s", "ratio", "CPU s/GB", "fsync p99<=", "others"], rows,
              ["MB/s = payload; ack latencies in ms, closed loop at saturation (include client queueing);",
               "raw MB/s = sequential write+fdatasync at the broker's KiB/sync, same filesystem, same run;",
               "ratio = median over runs of broker MB/s / raw MB/s; fsync p99<= = bucket bound of the broker's "
               "own fdatasync histogram (ms);",
               f"others = cores used by other processes during the load (median); ! = > {a.noise_cpu} in some run"])
        self.peer_table(res)
        return res

    def interval(self):
        a = self.args
        print(f"== interval-flush produce (log.flush.interval.ms={a.flush_interval_ms}), {a.producers} producer "
              f"processes, {a.warmup:g}+{a.seconds:g} s per load", flush=True)

        def baseline(r):
            nbytes = max(r["acked"] * r["size"], 64 << 20)
            lb = loopback_tcp(nbytes)
            return {"baseline": lb, "baseline_mb_per_s": lb["mb_per_s"],
                    "ratio": r["mb_per_s"] / lb["mb_per_s"] if lb["mb_per_s"] else None}

        res = self.throughput_section("interval", [f"log.flush.interval.ms={a.flush_interval_ms}"], baseline)
        self.out["interval"] = res
        rows = []
        for e in res:
            s = e["median"]
            rows.append([e["size"], e["partitions"], f0(s["msgs_per_s"]),
                         f"{f1(s['mb_per_s'])} ({f1(s['mb_per_s_min'])}-{f1(s['mb_per_s_max'])})",
                         f2(s["ack_p50_ms"]), f2(s["ack_p99_ms"]), f2(s["ack_p999_ms"]),
                         f0(s["baseline_mb_per_s"]), f3(s["ratio"]) + mark(s, a), f1(s["broker_cpu_s_per_gb"]),
                         f2(s["other_cpu_cores"])])
        print(f"\ninterval-flush produce, median of {a.runs} runs")
        table(["bytes", "parts", "msgs/s", "MB/s (min-max)", "ack p50", "p99", "p99.9", "loopback MB/s",
               "ratio", "CPU s/GB", "others"], rows,
              ["loopback MB/s = one Python process sending the same payload bytes to another over 127.0.0.1 "
               "(1 MiB sendall/recv_into), same run;",
               "ratio = median over runs of broker MB/s / loopback MB/s; others = cores used by other processes"])
        self.peer_table(res)
        return res

    def peer_table(self, res):
        keys = []
        for e in res:
            keys += [k for k in e["peers"] if k not in keys]
        for key in keys:
            rows, label = [], None
            for e in res:
                if key not in e["peers"]:
                    continue
                pe = e["peers"][key]
                label, k = pe["label"], pe["median"]
                rows.append([e["size"], e["partitions"], f0(k["msgs_per_s"]), f1(k["mb_per_s"]),
                             f2(k["ack_p50_ms"]), f2(k["ack_p99_ms"]), f2(k["ack_p999_ms"]),
                             f1(k["broker_cpu_s_per_gb"]), f2(pe["oncelog_over_peer_msgs_per_s"]),
                             f2(pe["oncelog_over_peer_ack_p99"]), f2(k["other_cpu_cores"])])
            version = self.peer_versions.get(key.split("_")[0], "")
            print(f"{label} ({version}), same load, median of {self.args.runs} runs")
            table(["bytes", "parts", "msgs/s", "MB/s", "ack p50", "p99", "p99.9", "CPU s/GB",
                   "oncelog/peer msgs/s", "oncelog/peer ack p99", "others"], rows)

    # -- 3 -------------------------------------------------------------------

    def ack(self):
        """Produce ack latency at a fraction of the durable peak, against the
        disk's own fdatasync latency at the broker's sync size, same run.
        Uses the wire generator for both the peak and the fixed-rate load:
        a fixed rate needs a generator that can keep it without queueing in
        the client."""
        a = self.args
        size, parts = a.ack_size, a.ack_partitions
        print(f"== produce ack latency at {a.e2e_fraction:.0%} of the durable peak: {size} B x{parts}, "
              f"{a.producers} wire producers, one request every {a.ack_linger_ms:g} ms each, "
              "latency from when each request was due", flush=True)
        runs = []
        for run in range(a.runs):
            b = self.oncelog(f"ack-r{run}")
            b.start()
            try:
                peak = closed_loop_load(b, "ack-peak", size, parts, a, client="wire")
                # One probe's peak swings with the disk (a burst absorbed by a
                # cache looks like a peak); with the durable section measured
                # by the same generator, its median is the steadier figure.
                ref = peak["msgs_per_s"]
                if a.client == "wire":
                    for e in self.out.get("durable", []):
                        if e["size"] == size and e["partitions"] == parts:
                            ref = min(ref, e["median"]["msgs_per_s"])
                target = ref * a.e2e_fraction
                r = closed_loop_load(b, "ack", size, parts, a, client="wire", rate=target,
                                     linger_ms=a.ack_linger_ms)
            finally:
                self.finish(b, f"ack run {run + 1}")
            bps = r.get("bytes_per_sync") or 4096
            fs = fdatasync_baseline(self.tmp, bps, 1 << 40, a.baseline_seconds)
            fs4 = fdatasync_baseline(self.tmp, 4096, 1 << 40, a.baseline_seconds)
            r.update({"peak_msgs_per_s": peak["msgs_per_s"], "target_msgs_per_s": target,
                      "fdatasync_p50_ms": fs["sync_p50_ms"], "fdatasync_p99_ms": fs["sync_p99_ms"],
                      "fdatasync_4k_p99_ms": fs4["sync_p99_ms"],
                      "ack_p99_over_fdatasync_p99": (r["ack_p99_ms"] / fs["sync_p99_ms"]
                                                     if fs["sync_p99_ms"] else None)})
            runs.append(r)
            print(f"  run {run + 1}: peak {peak['msgs_per_s']:,.0f} msgs/s, at {r['msgs_per_s']:,.0f} msgs/s ack "
                  f"p50 {r['ack_p50_ms']:.2f} p99 {r['ack_p99_ms']:.2f} p99.9 {r['ack_p999_ms']:.2f} ms; "
                  f"{(r.get('bytes_per_sync') or 0) / 1024:.0f} KiB/sync, fdatasync of that p99 "
                  f"{fs['sync_p99_ms']:.2f} ms (4 KiB: {fs4['sync_p99_ms']:.2f} ms)", flush=True)
            if r["msgs_per_s"] < 0.9 * target:
                print(f"  WARNING ack run {run + 1}: achieved only {r['msgs_per_s'] / target:.0%} of the target",
                      flush=True)
        keys = ["peak_msgs_per_s", "msgs_per_s", "ack_p50_ms", "ack_p99_ms", "ack_p999_ms", "bytes_per_sync",
                "fdatasync_p50_ms", "fdatasync_p99_ms", "fdatasync_4k_p99_ms", "ack_p99_over_fdatasync_p99",
                "broker_fsync_p99_le_ms", "other_cpu_cores", "client_cpu_s"]
        s = summarize(runs, keys)
        self.out["ack"] = {"size": size, "partitions": parts, "fraction": a.e2e_fraction,
                           "linger_ms": a.ack_linger_ms, "median": s, "runs": runs}
        print(f"\nproduce ack latency at {a.e2e_fraction:.0%} load, median of {a.runs} runs")
        table(["bytes", "parts", "peak msgs/s", "msgs/s", "ack p50", "p99", "p99.9", "KiB/sync",
               "fdatasync p50", "fdatasync p99", "ack p99/fdatasync p99", "4 KiB fdatasync p99"],
              [[size, parts, f0(s["peak_msgs_per_s"]), f0(s["msgs_per_s"]), f2(s["ack_p50_ms"]),
                f2(s["ack_p99_ms"]), f2(s["ack_p999_ms"]), f0((s["bytes_per_sync"] or 0) / 1024),
                f2(s["fdatasync_p50_ms"]), f2(s["fdatasync_p99_ms"]),
                f2(s["ack_p99_over_fdatasync_p99"]) + mark(s, a), f2(s["fdatasync_4k_p99_ms"])]],
              ["ms; ack = when the request was due -> its response (open loop; a client's linger comes on top);",
               "fdatasync = write+fdatasync loop at the broker's KiB/sync on the same filesystem, right after "
               "each run; issue target: ack p99 <= 2x fdatasync p99"])

    def e2e(self):
        a = self.args
        size, parts = a.e2e_size, a.e2e_partitions
        peak, peak_from = None, None
        if a.e2e_rate:
            target, peak_from = a.e2e_rate, "--e2e-rate"
        else:
            for e in self.out.get("durable", []) if a.client == "python" else []:
                if e["size"] == size and e["partitions"] == parts:
                    peak, peak_from = e["median"]["msgs_per_s"], "durable section (median)"
            if peak is None:
                b = self.oncelog("e2e-peak")
                b.start()
                try:
                    # the e2e producers are confluent-kafka in Python: half of
                    # what that client can push is what they can keep
                    r = closed_loop_load(b, "peak", size, parts, a, client="python")
                    peak, peak_from = r["msgs_per_s"], "a one-off durable peak probe (Python client)"
                finally:
                    self.finish(b, "e2e peak probe")
            target = peak * a.e2e_fraction
        print(f"== end-to-end read_committed latency: {size} B x{parts} partitions, target {target:,.0f} msgs/s "
              f"({a.e2e_fraction:.0%} of peak {f0(peak)} from {peak_from}), {a.producers} transactional "
              f"producers committing every {a.e2e_commit_ms:g} ms, linger.ms={a.e2e_linger_ms:g}", flush=True)
        runs = []
        for run in range(a.runs):
            fs = fdatasync_baseline(self.tmp, 4096, 1 << 40, a.baseline_seconds)
            b = self.oncelog(f"e2e-r{run}")
            b.start()
            try:
                topic = "e2e"
                create_topic(b.bootstrap, topic, parts)
                pconf = producer_conf(b.bootstrap, a, **{"transaction.timeout.ms": 60_000,
                                                         "linger.ms": a.e2e_linger_ms})
                common = {"topic": topic, "partitions": parts, "size": size, "warmup": a.warmup,
                          "seconds": a.seconds, "cpus": a.client_cpus, "txn_prefix": f"suite-{uuid.uuid4().hex[:8]}"}
                specs = [(_consumer_proc, dict(common, bootstrap=b.bootstrap, drain_s=a.flush_timeout,
                                               idle_s=2.0))]
                specs += [(_txn_producer_proc, dict(common, conf=pconf, rate=target / a.producers,
                                                    commit_ms=a.e2e_commit_ms, flush_timeout=a.flush_timeout,
                                                    index=i)) for i in range(a.producers)]
                foreign = foreign_processes()
                s0 = {}
                rs, _t0 = run_procs(specs, a.warmup, a.seconds, a.flush_timeout + 30,
                                    on_start=lambda: s0.update(broker_sample(b)))
                s1 = broker_sample(b)
            finally:
                self.finish(b, f"e2e run {run + 1}")
            # Results arrive in completion order.
            cons = next(x for x in rs if "consumed_all" in x)
            prods = [x for x in rs if "commits" in x]
            ack, e2e_l, commits = array.array("f"), array.array("f"), array.array("f")
            for p in prods:
                ack.frombytes(p["lat"])
                commits.frombytes(p["commits"])
            e2e_l.frombytes(cons["lat"])
            produced_w = sum(p["acked_window"] for p in prods)
            r = {"target_msgs_per_s": target, "achieved_msgs_per_s": produced_w / a.seconds,
                 "produced_window": produced_w, "consumed_window": cons["consumed_window"],
                 "errors": sum(p["errors"] for p in prods) + cons["errors"],
                 "unflushed": sum(p["unflushed"] for p in prods),
                 "last_error": next((p["last_error"] for p in prods if p["last_error"]), cons["last_error"]),
                 "max_behind_s": max(p["max_behind_s"] for p in prods),
                 "fdatasync_p50_ms": fs["sync_p50_ms"], "fdatasync_p99_ms": fs["sync_p99_ms"],
                 "client_cpu_s": sum(p["cpu_s"] for p in prods) + cons["cpu_s"],
                 "client_cpu_cores": (sum(p["cpu_s"] for p in prods) + cons["cpu_s"]) / (a.warmup + a.seconds),
                 "foreign_processes": foreign, "loadavg": loadavg()}
            r.update(lat_summary(ack, "ack_"))
            r.update(lat_summary(e2e_l, "e2e_"))
            r.update(lat_summary(commits, "commit_"))
            r["ack_p99_over_fdatasync_p99"] = (r["ack_p99_ms"] / r["fdatasync_p99_ms"]
                                               if r["fdatasync_p99_ms"] else None)
            total = sum(p["acked_all"] for p in prods)
            r.update(broker_delta(s0, s1, total * size, total))
            r.update(noise(s0, s1, r.get("broker_cpu_s"), r["client_cpu_s"]))
            r["broker_cpu_cores"] = r["broker_cpu_s"] / (s1["t"] - s0["t"]) if r.get("broker_cpu_s") else None
            runs.append(r)
            print(f"  run {run + 1}: {r['achieved_msgs_per_s']:,.0f} msgs/s, e2e p50 {r['e2e_p50_ms']:.1f} "
                  f"p99 {r['e2e_p99_ms']:.1f} p99.9 {r['e2e_p999_ms']:.1f} ms; ack p99 {r['ack_p99_ms']:.2f} ms vs "
                  f"fdatasync p99 {r['fdatasync_p99_ms']:.2f} ms; commit p99 {r['commit_p99_ms']:.1f} ms; "
                  f"consumed {r['consumed_window']}/{produced_w}", flush=True)
            if r["consumed_window"] != produced_w or r["errors"] or r["unflushed"]:
                print(f"  WARNING e2e run {run + 1}: consumed {r['consumed_window']} of {produced_w} "
                      f"acknowledged in-window messages, {r['errors']} errors, {r['unflushed']} unflushed "
                      f"(last error: {r['last_error']})", flush=True)
            if r["achieved_msgs_per_s"] < 0.9 * target:
                print(f"  WARNING e2e run {run + 1}: achieved only {r['achieved_msgs_per_s'] / target:.0%} of the "
                      f"target rate (producers up to {r['max_behind_s'] * 1000:.0f} ms behind schedule)", flush=True)
        keys = ["achieved_msgs_per_s", "ack_p50_ms", "ack_p99_ms", "ack_p999_ms", "e2e_p50_ms", "e2e_p99_ms",
                "e2e_p999_ms", "e2e_max_ms", "commit_p50_ms", "commit_p99_ms", "fdatasync_p50_ms",
                "fdatasync_p99_ms", "ack_p99_over_fdatasync_p99", "other_cpu_cores", "max_behind_s",
                "broker_fsync_p99_le_ms", "broker_cpu_s_per_gb", "client_cpu_cores", "broker_cpu_cores"]
        s = summarize(runs, keys)
        self.out["e2e"] = {"size": size, "partitions": parts, "commit_ms": a.e2e_commit_ms,
                           "peak_msgs_per_s": peak, "peak_from": peak_from, "target_msgs_per_s": target,
                           "median": s, "runs": runs}
        print(f"\nend-to-end read_committed latency at {target:,.0f} msgs/s target, median of {a.runs} runs")
        table(["bytes", "parts", "msgs/s", "e2e p50", "p99", "p99.9", "ack p50", "ack p99", "ack p99.9",
               "commit p99", "fdatasync p50", "fdatasync p99", "ack p99/fdatasync p99", "broker fsync p99<=",
               "CPU broker/clients/others"],
              [[size, parts, f0(s["achieved_msgs_per_s"]), f1(s["e2e_p50_ms"]), f1(s["e2e_p99_ms"]),
                f1(s["e2e_p999_ms"]), f2(s["ack_p50_ms"]), f2(s["ack_p99_ms"]), f2(s["ack_p999_ms"]),
                f1(s["commit_p99_ms"]), f2(s["fdatasync_p50_ms"]), f2(s["fdatasync_p99_ms"]),
                f2(s["ack_p99_over_fdatasync_p99"]) + mark(s, a), f1(s["broker_fsync_p99_le_ms"]),
                f"{f2(s['broker_cpu_cores'])}/{f2(s['client_cpu_cores'])}/{f2(s['other_cpu_cores'])}"]],
              ["ms; e2e = read_committed receive time - scheduled send time (open loop, includes waiting for "
               "the commit);",
               f"ack = produce() call -> delivery report (includes linger.ms={a.e2e_linger_ms:g}); fdatasync = 4 KiB write+fdatasync loop on the same "
               "filesystem just before each run;",
               "issue target: ack p99 <= 2x fdatasync p99; broker fsync p99<= = bucket bound of the broker's own "
               "fdatasync histogram (ms);",
               f"CPU in cores (of {os.cpu_count()}): when broker+clients+others approach that, latencies measure CPU "
               "queueing, not the broker alone"])

    # -- 4 -------------------------------------------------------------------

    def restart(self):
        a = self.args
        target = int(a.restart_gb * GB)
        parts = a.restart_partitions
        print(f"== restart after kill -9: {a.restart_gb:g} GB in {parts} partitions", flush=True)
        d = self.path("restart-data")
        fill_settings = [f"log.flush.interval.ms={a.flush_interval_ms}"]
        b = self.oncelog("restart-fill", fill_settings, data_dir=d)
        b.start()
        try:
            conf = producer_conf(b.bootstrap, a, **{"linger.ms": 20, "enable.idempotence": False,
                                                   "queue.buffering.max.kbytes": 256 * 1024})
            chunk = max(1, 1_000_000 // a.restart_msg_size)
            fill = closed_loop_load(b, "restart", a.restart_msg_size, parts, a, seconds=a.restart_fill_seconds,
                                    warmup=0, conf=conf, max_bytes=target, chunk=chunk)
            warn_load(fill, "restart fill")
        finally:
            b.kill9()
            n, msgs = scan_log(b.log_path)
            if n:
                self.log_findings["restart fill"] = {"error_warn_lines": n, "first": msgs}
        on_disk = dir_bytes(d)
        print(f"  filled {fill['acked'] * a.restart_msg_size / GB:.2f} GB payload ({on_disk / GB:.2f} GB on disk) "
              f"at {fill['mb_per_s']:.0f} MB/s, broker killed with SIGKILL", flush=True)
        runs = []
        for run in range(a.runs):
            if a.drop_caches:
                drop_page_cache()
            rb = self.oncelog(f"restart-r{run}", data_dir=d)
            rb.log_path = d.rstrip("/") + f"-restart-r{run}.log"
            try:
                serve_s = rb.start()
                t0 = time.monotonic()
                round_trip_s = produce_fetch_round_trip(rb.bootstrap, "restart", run % parts)
                first_rt = serve_s + (time.monotonic() - t0)
            finally:
                rb.kill9()
                n, msgs = scan_log(rb.log_path)
                if n:
                    self.log_findings[f"restart run {run + 1}"] = {"error_warn_lines": n, "first": msgs}
            ra = read_all_files(d, a.drop_caches)
            eb = self.oncelog(f"empty-r{run}")
            try:
                empty_s = eb.start()
            finally:
                self.finish(eb, f"empty start run {run + 1}")
            r = {"serve_s": serve_s, "first_round_trip_s": first_rt, "round_trip_only_s": round_trip_s,
                 "read_all_s": ra["seconds"], "read_all_bytes": ra["bytes"], "empty_start_s": empty_s,
                 "ratio_to_read_all": serve_s / ra["seconds"] if ra["seconds"] else None,
                 "loadavg": loadavg(), "foreign_processes": foreign_processes()}
            runs.append(r)
            print(f"  run {run + 1}: serving after {serve_s:.3f} s, first produce+fetch after {first_rt:.3f} s; "
                  f"reading all {ra['bytes'] / GB:.2f} GB takes {ra['seconds']:.3f} s; empty-dir start "
                  f"{empty_s:.3f} s", flush=True)
        # One clean restart for comparison.
        clean_s = None
        cb = self.oncelog("restart-clean", data_dir=d)
        cb.log_path = d.rstrip("/") + "-clean.log"
        try:
            cb.start()
            cb.stop(timeout=120)
            if a.drop_caches:
                drop_page_cache()
            clean_s = cb.start()
        finally:
            self.finish(cb, "restart clean")
        s = summarize(runs, ["serve_s", "first_round_trip_s", "read_all_s", "empty_start_s", "ratio_to_read_all"])
        self.out["restart"] = {"gb_target": a.restart_gb, "partitions": parts, "payload_bytes":
                               fill["acked"] * a.restart_msg_size, "disk_bytes": on_disk, "fill": fill,
                               "page_cache": "dropped" if a.drop_caches else "warm",
                               "clean_restart_s": clean_s, "median": s, "runs": runs}
        print(f"\nrestart after kill -9, median of {a.runs} runs ({'cold' if a.drop_caches else 'warm'} page cache)")
        table(["GB on disk", "parts", "fill MB/s", "serving s (min-max)", "produce+fetch s", "read-all s",
               "ratio", "empty start s", "clean restart s"],
              [[f2(on_disk / GB), parts, f0(fill["mb_per_s"]),
                f"{f3(s['serve_s'])} ({f3(s['serve_s_min'])}-{f3(s['serve_s_max'])})",
                f3(s["first_round_trip_s"]), f3(s["read_all_s"]), f2(s["ratio_to_read_all"]),
                f3(s["empty_start_s"]), f3(clean_s)]],
              ["serving = start of the process -> ApiVersions answered; produce+fetch = -> first acks=all "
               "produce and its fetch done;",
               "read-all = reading every file of the data dir once (same cache state); ratio = serving / read-all"])

    # -- 5 -------------------------------------------------------------------

    def resources(self):
        a = self.args
        print(f"== resources: durable load {a.res_size} B x{a.res_partitions} partitions", flush=True)
        runs = {p: [] for p in a.res_partitions}
        hwm = []
        for run in range(a.runs):
            b = self.oncelog(f"res-r{run}")
            b.start()
            try:
                for parts in a.res_partitions:
                    r = closed_loop_load(b, f"res-{parts}", a.res_size, parts, a)
                    warn_load(r, f"resources x{parts}")
                    nbytes = r["acked"] * a.res_size
                    lb = loopback_tcp(nbytes)
                    fs = fdatasync_baseline(self.tmp, r.get("bytes_per_sync") or 65536, nbytes, a.baseline_seconds)
                    # CPU per GB of each baseline part, over the bytes each actually moved.
                    lb_gb = lb["recv_cpu_s"] / (lb["bytes"] / GB)
                    fs_gb = fs["cpu_s"] / (max(fs["bytes_approx"], 1) / GB)
                    r["baseline_cpu_s_per_gb"] = lb_gb + fs_gb
                    r["baseline_parts"] = {"loopback_recv_cpu_s_per_gb": lb_gb, "write_fdatasync_cpu_s_per_gb": fs_gb}
                    r["ratio"] = (r["broker_cpu_s_per_gb"] / r["baseline_cpu_s_per_gb"]
                                  if r.get("broker_cpu_s_per_gb") and r["baseline_cpu_s_per_gb"] else None)
                    runs[parts].append(r)
                    print(f"  run {run + 1} x{parts}: {nbytes / GB:.2f} GB, broker {r['broker_cpu_s_per_gb']:.1f} CPU s/GB "
                          f"({r['broker_cpu_s_per_mmsg']:.2f} per M msgs), baseline {r['baseline_cpu_s_per_gb']:.1f}, "
                          f"VmHWM {r['broker_rss_hwm_mb']:.0f} MB", flush=True)
            finally:
                hwm.append((proc_status_kb(b.pid, "VmHWM") or 0) / 1024)
                self.finish(b, f"resources run {run + 1}")
        res = []
        keys = ["broker_cpu_s_per_gb", "broker_cpu_s_per_mmsg", "baseline_cpu_s_per_gb", "ratio", "disk_write_amp",
                "broker_rss_hwm_mb", "mb_per_s", "other_cpu_cores"]
        for parts, rr in runs.items():
            res.append({"size": a.res_size, "partitions": parts, "median": summarize(rr, keys), "runs": rr})
        self.out["resources"] = {"loads": res, "peak_rss_mb_per_run": hwm, "peak_rss_mb": med(hwm)}
        rows = []
        for e in res:
            s = e["median"]
            rows.append([e["size"], e["partitions"], f1(s["mb_per_s"]), f1(s["broker_cpu_s_per_gb"]),
                         f2(s["broker_cpu_s_per_mmsg"]), f1(s["baseline_cpu_s_per_gb"]), f2(s["ratio"]) + mark(s, a),
                         f2(s["disk_write_amp"]), f0(s["broker_rss_hwm_mb"])])
        print(f"\nresources (durable load), median of {a.runs} runs; peak RSS over the broker's life "
              f"{f0(med(hwm))} MB")
        table(["bytes", "parts", "MB/s", "CPU s/GB", "CPU s/M msgs", "baseline CPU s/GB", "ratio",
               "disk bytes/payload", "VmHWM MB"], rows,
              ["CPU = broker utime+stime over the load / payload GB acknowledged;",
               "baseline = CPU/GB of a loopback receiver + write+fdatasync at the broker's bytes per sync "
               "(what any broker must spend), same run",
               "disk bytes/payload = /proc/PID/io write_bytes / payload bytes; VmHWM = peak RSS so far"])


def produce_fetch_round_trip(bootstrap, topic, partition, timeout=60):
    """Seconds for one acks=all produce and a fetch of that record."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    t0 = time.monotonic()
    got = {}
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                  "message.timeout.ms": int(timeout * 1000)})
    p.produce(topic, b"restart-probe", partition=partition,
              on_delivery=lambda e, m: got.update(err=e, off=m.offset()))
    p.flush(timeout)
    if got.get("err") is not None or "off" not in got:
        raise RuntimeError(f"round-trip produce failed: {got.get('err')}")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"suite-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, partition, got["off"])])
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = c.poll(0.05)
            if m is not None and not m.error() and m.offset() == got["off"]:
                return time.monotonic() - t0
        raise RuntimeError("round-trip fetch timed out")
    finally:
        c.close()


# --------------------------------------------------------------------------


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
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)

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
        _cleanup()
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
