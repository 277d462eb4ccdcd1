"""The brokers under test, with one interface for the loads: oncelog (a
private copy of the binary), Apache Kafka via kafka_ref and Tansu. Every
started broker is in LIVE until stopped, and is stopped at exit. Also the
broker-side figures of a load: /proc and /metrics samples and their delta."""
import atexit
import os
import re
import signal
import subprocess
import time
import urllib.request

import kafka_ref
from produce_bench import KAFKA_VARIANTS, free_port

from . import GB
from .procstat import proc_cpu_s, proc_status_kb, proc_write_bytes, set_affinity_all_threads, system_busy_s

LIVE = []  # brokers to stop if the suite exits early


def stop_live_brokers():
    for b in list(LIVE):
        try:
            b.stop(timeout=10)
        except Exception:  # noqa: BLE001
            pass


atexit.register(stop_live_brokers)


def exit_on_signal(signum, _frame):
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
