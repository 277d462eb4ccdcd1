#!/usr/bin/env python3
"""Run Apache Kafka (single node, KRaft, no ZooKeeper) as a reference peer.

The broker is assembled from the jars that `bash bench/kafka/fetch.sh` copies
into .tools/kafka-lib (see bench/kafka/pom.xml); a JDK 17+ `java` must be on
PATH (or given with --java / $JAVA).

For a data dir D it writes D/server.properties and D/log4j2.properties, keeps
the partitions in D/logs (log.dirs), formats that storage with a random cluster
id, starts `java -cp 'LIB/*' kafka.Kafka D/server.properties` with its output
in D/broker.log and its PID in D/kafka.pid, and waits until the listener on
127.0.0.1:PORT answers a Kafka ApiVersions request (in KRaft mode the broker
only serves requests once it is unfenced). The controller listens on another
free loopback port. Everything is bound to 127.0.0.1.

Library use (what bench/produce_bench.py does):

    from kafka_ref import KafkaBroker
    with KafkaBroker(data_dir, port, ["log.flush.interval.messages=1"]) as kb:
        ... kb.bootstrap ...          # "127.0.0.1:PORT"

CLI:

    kafka_ref.py run --data-dir D [--port P] [--config k=v ...] [--max-seconds S]
        start, print the bootstrap address, serve until SIGINT/SIGTERM or for at
        most S seconds (default 3600), then stop the broker;
    kafka_ref.py stop --data-dir D
        stop a broker started with that data dir (by the PID in D/kafka.pid);
    kafka_ref.py info
        print the Kafka version found in the lib dir, or why it is unavailable.

Stopping sends SIGTERM to the broker's PID and SIGKILL after a timeout. The JVM
also gets SIGTERM if the Python process that started it dies (PR_SET_PDEATHSIG),
so no broker outlives its runner. Stdlib only.
"""
import argparse
import base64
import ctypes
import glob
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LIB = os.path.join(ROOT, ".tools", "kafka-lib")

# Topic-level names accepted as broker configs: the broker default for every
# topic that does not override it is the log.* name.
TOPIC_TO_BROKER = {
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "segment.bytes": "log.segment.bytes",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
}

JVM_OPTS = [
    "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
]

LOG4J2 = """\
status = warn
name = kafka-reference
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
"""


def lib_dir(lib=None):
    return lib or os.environ.get("KAFKA_LIB") or DEFAULT_LIB


def java_bin(java=None):
    return java or os.environ.get("JAVA") or shutil.which("java")


def kafka_version(lib=None):
    """Version of the kafka_2.13 jar in the lib dir, or None."""
    jars = glob.glob(os.path.join(lib_dir(lib), "kafka_2.13-*.jar"))
    for j in sorted(jars):
        m = re.match(r"kafka_2\.13-(\d[^-]*)\.jar$", os.path.basename(j))
        if m:
            return m.group(1)
    return None


def unavailable(lib=None, java=None):
    """Why the reference broker cannot run here, or None when it can."""
    lib = lib_dir(lib)
    if not os.path.isdir(lib):
        shown = os.path.relpath(lib, ROOT) if os.path.abspath(lib).startswith(ROOT + os.sep) else lib
        return f"no {shown}; fetch it with: bash bench/kafka/fetch.sh"
    if kafka_version(lib) is None:
        return f"no kafka_2.13 jar in {lib}; fetch it with: bash bench/kafka/fetch.sh"
    if not java_bin(java):
        return "no java on PATH (a JDK 17+ is needed)"
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_cluster_id():
    """A Kafka Uuid in its base64url form, as `kafka-storage random-uuid` prints."""
    while True:
        s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not s.startswith("-"):  # keeps it from looking like an option
            return s


def parse_configs(items):
    """["k=v", ...] -> {broker key: value}, topic-level names mapped to log.*."""
    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        k = k.strip()
        if not sep or not k:
            raise ValueError(f"config {it!r} is not key=value")
        out[TOPIC_TO_BROKER.get(k, k)] = v.strip()
    return out


def server_properties(data_dir, port, controller_port, extra=None):
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": os.path.join(os.path.abspath(data_dir), "logs"),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
    }
    props.update(extra or {})
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _pdeathsig():
    """In the child before exec: get SIGTERM when the parent dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def api_versions_ok(port, timeout=2.0):
    """True when 127.0.0.1:port answers an ApiVersions v0 request without error."""
    client = b"kafka-ref"
    body = struct.pack(">hhih", 18, 0, 7, len(client)) + client
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">i", len(body)) + body)
            hdr = _recv(s, 4)
            (n,) = struct.unpack(">i", hdr)
            resp = _recv(s, n)
    except (OSError, ConnectionError):
        return False
    if len(resp) < 6:
        return False
    corr, err = struct.unpack(">ih", resp[:6])
    return corr == 7 and err == 0


def _recv(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class KafkaBroker:
    """One single-node KRaft broker+controller on 127.0.0.1:port."""

    def __init__(self, data_dir, port=None, configs=None, lib=None, java=None,
                 heap="1g", start_timeout=120.0, stop_timeout=30.0):
        self.data_dir = os.path.abspath(data_dir)
        self.port = port or free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.extra = parse_configs(configs) if isinstance(configs, (list, tuple)) else dict(configs or {})
        self.lib = lib_dir(lib)
        self.java = java_bin(java)
        self.heap = heap
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.proc = None
        self.version = kafka_version(self.lib)
        self.props_path = os.path.join(self.data_dir, "server.properties")
        self.log4j_path = os.path.join(self.data_dir, "log4j2.properties")
        self.log_path = os.path.join(self.data_dir, "broker.log")
        self.pid_path = os.path.join(self.data_dir, "kafka.pid")

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    def _java_cmd(self, main, args, heap):
        return [self.java, f"-Xms{heap}", f"-Xmx{heap}", *JVM_OPTS,
                f"-Dlog4j2.configurationFile={self.log4j_path}",
                "-cp", os.path.join(self.lib, "*"), main, *args]

    def write_config(self):
        os.makedirs(self.data_dir, exist_ok=True)
        with open(self.props_path, "w") as f:
            f.write(server_properties(self.data_dir, self.port, self.controller_port, self.extra))
        with open(self.log4j_path, "w") as f:
            f.write(LOG4J2)

    def format(self):
        """kafka-storage format with a random cluster id (static voter set, so
        no --standalone is needed)."""
        self.cluster_id = random_cluster_id()
        cmd = self._java_cmd("kafka.tools.StorageTool",
                             ["format", "-t", self.cluster_id, "-c", self.props_path], "256m")
        with open(os.path.join(self.data_dir, "format.log"), "w") as log:
            p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=120,
                               preexec_fn=_pdeathsig)
        if p.returncode != 0:
            raise RuntimeError(f"kafka storage format failed ({p.returncode}):\n"
                               + _tail(os.path.join(self.data_dir, "format.log")))

    def start(self):
        why = unavailable(self.lib, self.java)
        if why:
            raise RuntimeError(f"Apache Kafka not available: {why}")
        self.write_config()
        self.format()
        log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(
                self._java_cmd("kafka.Kafka", [self.props_path], self.heap),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_pdeathsig)
        finally:
            log.close()
        with open(self.pid_path, "w") as f:
            f.write(f"{self.proc.pid}\n")
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self):
        end = time.monotonic() + self.start_timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Kafka exited with {self.proc.returncode} while starting:\n"
                                   + _tail(self.log_path))
            if api_versions_ok(self.port, timeout=1.0):
                return
            time.sleep(0.2)
        raise RuntimeError(f"Kafka not serving on {self.bootstrap} after {self.start_timeout:.0f} s:\n"
                           + _tail(self.log_path))

    def stop(self):
        """SIGTERM, then SIGKILL after stop_timeout; by PID only. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        _unlink(self.pid_path)
        return self.proc.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def stop_pid_file(data_dir, timeout=30.0):
    """Stop the broker whose PID is in DATA_DIR/kafka.pid (SIGTERM, then SIGKILL)."""
    pid_path = os.path.join(os.path.abspath(data_dir), "kafka.pid")
    try:
        pid = int(open(pid_path).read().strip())
    except (OSError, ValueError):
        print(f"no PID in {pid_path}")
        return 1
    try:
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        cmdline = b""
    if b"kafka.Kafka" not in cmdline:
        print(f"PID {pid} is not a Kafka broker (any more); removing {pid_path}")
        _unlink(pid_path)
        return 0
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + timeout
    while time.monotonic() < end and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.2)
    if os.path.exists(f"/proc/{pid}"):
        os.kill(pid, signal.SIGKILL)
        print(f"killed {pid} after {timeout:.0f} s")
    else:
        print(f"stopped {pid}")
    _unlink(pid_path)  # the runner may have removed it already
    return 0


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=None, help=f"jar dir (default $KAFKA_LIB or {DEFAULT_LIB})")
    ap.add_argument("--java", default=None, help="java binary (default $JAVA or java on PATH)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="start, serve until a signal or --max-seconds, stop")
    r.add_argument("--data-dir", required=True)
    r.add_argument("--port", type=int, default=None, help="PLAINTEXT port (default: a free one)")
    r.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="extra broker config, repeatable (flush.messages=1 means log.flush.interval.messages=1)")
    r.add_argument("--heap", default="1g")
    r.add_argument("--max-seconds", type=float, default=3600.0)
    r.add_argument("--start-timeout", type=float, default=120.0)
    s = sub.add_parser("stop", help="stop the broker started with this data dir")
    s.add_argument("--data-dir", required=True)
    s.add_argument("--timeout", type=float, default=30.0)
    sub.add_parser("info", help="print the Kafka version found, or why it is unavailable")
    args = ap.parse_args()

    if args.cmd == "info":
        why = unavailable(args.lib, args.java)
        if why:
            print(f"Apache Kafka: not available ({why})")
            return 1
        print(f"Apache Kafka {kafka_version(args.lib)} in {lib_dir(args.lib)}")
        return 0
    if args.cmd == "stop":
        return stop_pid_file(args.data_dir, args.timeout)

    stop_now = []
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop_now.append(1))
    kb = KafkaBroker(args.data_dir, args.port, args.config, lib=args.lib, java=args.java,
                     heap=args.heap, start_timeout=args.start_timeout)
    t0 = time.monotonic()
    try:
        kb.start()
        print(f"Apache Kafka {kb.version} serving on {kb.bootstrap} (pid {kb.proc.pid}, "
              f"controller 127.0.0.1:{kb.controller_port}, log {kb.log_path})", flush=True)
        end = t0 + args.max_seconds
        while not stop_now and time.monotonic() < end and kb.proc.poll() is None:
            time.sleep(0.2)
        if kb.proc.poll() is not None:
            rc = kb.proc.returncode
            if rc == 128 + signal.SIGTERM:  # stopped from outside, e.g. `kafka_ref.py stop`
                return 0
            print(f"Kafka exited with {rc}:\n{_tail(kb.log_path)}", flush=True)
            return 1
    finally:
        rc = kb.stop()
        print(f"Kafka stopped (exit {rc})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
