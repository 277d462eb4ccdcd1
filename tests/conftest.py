"""Fixtures that run a real `oncelog serve` process for the integration tests.

The binary is target/release/oncelog, or $ONCELOG_BIN. Every broker a test
starts gets its own data directory and loopback port, its stderr goes to a log
file next to the data directory, and whatever is still running at teardown is
killed by PID.
"""

import ctypes
import gc
import os
import re
import resource
import signal
import socket
import subprocess
import time
import types
import weakref
from pathlib import Path

import confluent_kafka
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BIN = REPO_ROOT / "target" / "release" / "oncelog"
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """Runs in the child before exec: SIGKILL the broker if pytest dies, so a
    killed test run leaves no broker behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def oncelog_bin():
    path = Path(os.environ.get("ONCELOG_BIN", DEFAULT_BIN))
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"broker binary {path} not found: run `cargo build --release` "
            "(or set ONCELOG_BIN)", pytrace=False)
    return path


# Ports for the brokers a test starts come from below the kernel's ephemeral
# range (32768-60999 by default), so no client connection, no port-0 bind
# and no other service ever takes one between the draw and the broker's
# bind. Each pytest-xdist worker draws from its own slice, in turn, and
# skips a port something still holds: two workers never hand out one port.
_PORT_BASE = 20000
_PORT_SLICE = 1400
_PORT_SLICES = 8           # gw0..gw7 use slices 1..8; a run without xdist slice 0
_port_next = [None]


def _port_slice():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    i = 0
    if worker.startswith("gw") and worker[2:].isdigit():
        i = 1 + int(worker[2:]) % _PORT_SLICES
    return _PORT_BASE + i * _PORT_SLICE, _PORT_SLICE


def port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port():
    """A loopback port nothing listens on, distinct from every port this
    worker handed out recently and from every other worker's."""
    lo, n = _port_slice()
    if _port_next[0] is None:
        # a random start: a re-run soon after does not meet its own TIME_WAITs
        _port_next[0] = int.from_bytes(os.urandom(2), "big") % n
    for _ in range(n):
        port = lo + _port_next[0]
        _port_next[0] = (_port_next[0] + 1) % n
        if port_is_free(port):
            return port
    raise AssertionError(f"no free port in 127.0.0.1:{lo}-{lo + n - 1}")


def wait_until(predicate, timeout, interval=0.05, what="condition", on_timeout=None):
    """Poll predicate() until it returns a truthy value; return that value.
    Fails the test when the deadline passes (with on_timeout()'s text, if given)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{on_timeout()}" if on_timeout else ""
            pytest.fail(f"timed out after {timeout:.1f}s waiting for {what}{detail}", pytrace=False)
        time.sleep(interval)


class Broker:
    """One `oncelog serve` process; restartable on the same data dir and port."""

    mode = "local"

    def __init__(self, binary, data_dir, port, log_path, overrides=None):
        self.binary = Path(binary)
        self.data_dir = Path(data_dir)
        self.port = port
        self.host = "127.0.0.1"
        self.log_path = Path(log_path)
        self.overrides = dict(overrides or {})
        # Every broker gets its own metrics port (a port in use stops a broker).
        self._drew_metrics_port = "metrics.listen" not in self.overrides
        self.overrides.setdefault("metrics.listen", f"127.0.0.1:{free_port()}")
        # Extra environment for the broker process (e.g. ONCELOG_FAILPOINTS),
        # and an optional RLIMIT_NOFILE (soft = hard) to start it under.
        self.env = {}
        self.nofile = None
        # What runs the broker (e.g. tests/hosts.py's as_host: another uid).
        self.prefix = []
        self.proc = None
        self.starts = 0
        self._log_start_offset = 0

    # -- addresses
    @property
    def bootstrap(self):
        return f"{self.host}:{self.port}"

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def argv(self):
        argv = [str(self.binary), "serve", "--data-dir", str(self.data_dir),
                "--listen", self.bootstrap]
        for key, value in self.overrides.items():
            argv += ["-o", f"{key}={value}"]
        return argv

    # -- lifecycle
    def start(self, timeout=READY_TIMEOUT_S):
        """Start the broker and wait until it accepts connections. On its
        first start a port something else took after the draw (the broker
        says so and exits) is drawn again, twice at most."""
        for attempt in range(3):
            self._spawn()
            try:
                self.wait_ready(timeout)
                return self
            except AssertionError:
                if attempt == 2 or self.alive or not self._redraw_taken_port():
                    raise

    def _redraw_taken_port(self):
        if self.starts != 1:
            return False   # a restart keeps its addresses: clients know them
        m = re.search(r"address (\S+) is already in use", self.log_text(since_last_start=True))
        if not m:
            return False
        if m.group(1) == self.bootstrap:
            self.port = free_port()
        elif m.group(1) == self.overrides.get("metrics.listen") and self._drew_metrics_port:
            self.overrides["metrics.listen"] = f"127.0.0.1:{free_port()}"
        else:
            return False
        self.starts = 0
        return True

    def _spawn(self):
        assert not self.alive, "broker already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"==== test harness: start #{self.starts + 1}: {' '.join(self.argv())}\n".encode())
            log.flush()
            self._log_start_offset = log.tell()
            env = dict(os.environ)
            env["NO_COLOR"] = "1"
            env.setdefault("RUST_BACKTRACE", "1")
            env.update(self.env)
            nofile = self.nofile

            def preexec():
                _die_with_parent()
                if nofile is not None:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

            self.proc = subprocess.Popen(
                self.prefix + self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=env, cwd=str(self.data_dir.parent), preexec_fn=preexec)
        self.starts += 1

    def wait_ready(self, timeout=READY_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"broker exited with status {self.proc.returncode} before accepting "
                    f"connections; log tail:\n{self.log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"broker not accepting connections on {self.bootstrap} after "
                    f"{timeout}s; log tail:\n{self.log_tail()}")
            time.sleep(0.05)

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=STOP_TIMEOUT_S):
        """Clean shutdown with SIGTERM. Fails if the broker does not exit in
        time (it is then killed) or exits with a non-zero status."""
        assert self.alive, "broker is not running"
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise AssertionError(
                f"broker did not exit within {timeout}s of SIGTERM; log tail:\n{self.log_tail()}")
        if rc != 0:
            raise AssertionError(
                f"broker exited with status {rc} after SIGTERM; log tail:\n{self.log_tail()}")
        return rc

    def kill9(self):
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def restart(self, timeout=READY_TIMEOUT_S):
        """SIGTERM (if running), then start again on the same dir and port."""
        if self.alive:
            self.stop()
        return self.start(timeout)

    # -- observation
    def log_text(self, since_last_start=False):
        """The broker's stderr (ANSI colours stripped); optionally only what
        the current (or last) process wrote."""
        try:
            with open(self.log_path, "rb") as f:
                if since_last_start:
                    f.seek(self._log_start_offset)
                data = f.read()
        except FileNotFoundError:
            return ""
        return _ANSI.sub("", data.decode("utf-8", "replace"))

    def log_tail(self, lines=60):
        return "\n".join(self.log_text().splitlines()[-lines:])

    def rss_kib(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS line")

    def partition_dir(self, topic, partition):
        return self.data_dir / f"{topic}-{partition}"

    @property
    def metrics_url(self):
        addr = self.overrides.get("metrics.listen")
        return f"http://{addr}" if addr else None

    def segment_files(self, topic, partition):
        """Segment .log files of a partition, ordered by base offset."""
        d = self.partition_dir(topic, partition)
        files = [p for p in d.iterdir() if re.fullmatch(r"\d{20}\.log", p.name)]
        return sorted(files, key=lambda p: int(p.stem))

    def stored_logs(self, topic, partition):
        """The partition's batches as stored: one bytes chunk per segment file."""
        return [seg.read_bytes() for seg in self.segment_files(topic, partition)]

    def __repr__(self):
        return f"Broker({self.bootstrap}, pid={self.pid}, dir={self.data_dir})"


class BrokerFactory:
    def __init__(self, base_dir):
        self.base_dir = Path(base_dir)
        self.brokers = []

    def __call__(self, overrides=None, start=True, **kw):
        """Make (and by default start) a broker. Overrides are Kafka config
        names: pass a dict ({"log.segment.bytes": 65536}) and/or keywords whose
        underscores stand for dots (log_segment_bytes=65536)."""
        opts = dict(overrides or {})
        for key, value in kw.items():
            opts[key.replace("_", ".")] = value
        n = len(self.brokers)
        root = self.base_dir / f"broker{n}"
        b = Broker(oncelog_bin(), root / "data", free_port(), root / "broker.log", opts)
        self.brokers.append(b)
        if start:
            b.start()
        return b

    def cleanup(self):
        for b in self.brokers:
            if b.alive:
                b.kill9()
        for b in self.brokers:
            if b.starts:
                print(f"---- {b} log tail ----\n{b.log_tail(40)}")


def both_modes(fixture="broker"):
    """Runs a test against local mode and against a cluster of three
    `oncelog serve --cluster` brokers (over PostgreSQL and S3): the
    `broker` (or `broker_factory`) fixture is then one or the other."""
    return pytest.mark.parametrize(fixture, ["local", "cluster"], indirect=True)


def _cluster_factory(request):
    def make(overrides=None, start=True, **kw):
        opts = dict(overrides or {})
        for key, value in kw.items():
            opts[key.replace("_", ".")] = value
        return request.getfixturevalue("cluster_factory")(overrides=opts, start=start)
    return make


@pytest.fixture
def broker_factory(request, tmp_path):
    if getattr(request, "param", "local") == "cluster":
        yield _cluster_factory(request)
        return
    factory = BrokerFactory(tmp_path)
    yield factory
    factory.cleanup()


@pytest.fixture
def broker(request, tmp_path):
    if getattr(request, "param", "local") == "cluster":
        return _cluster_factory(request)()
    return request.getfixturevalue("broker_factory")()


@pytest.fixture(scope="module")
def module_broker_factory(tmp_path_factory):
    factory = BrokerFactory(tmp_path_factory.mktemp("brokers"))
    yield factory
    factory.cleanup()


# Cluster mode's fixtures (PostgreSQL, S3, N brokers), for `both_modes`.
pytest_plugins = ["cluster_env"]


# --- librdkafka producers a test leaves behind ---------------------------------
# A producer whose queue still holds a message (a zombie's refused write, a
# write to a broker the test killed) keeps that message's delivery callback
# alive inside librdkafka, where Python's cycle collector cannot see it; a
# callback that reaches the producer back (through a closure, or an exception
# and its traceback) keeps the producer, its threads and its reconnect loop
# running for the rest of the run. At each test's end the producers it made
# have their queues purged and their delivery reports served, which drops
# those references, and the cycle collector frees them; one a finished
# test's frame still holds goes with that frame's locals.
# ONCELOG_DEBUG_PRODUCERS=1 (with pytest -s) prints any still alive after
# that, with where it was made. (This module is
# imported before any test module, so `from confluent_kafka import Producer`
# there finds the tracked class.)

_made_producers = weakref.WeakSet()
_producer_generation = [0]


class _TrackedProducer(confluent_kafka.Producer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._oncelog_generation = _producer_generation[0]
        if os.environ.get("ONCELOG_DEBUG_PRODUCERS"):
            import traceback
            self._made_at = "".join(traceback.format_stack(limit=4)[:-1])
        _made_producers.add(self)


confluent_kafka.Producer = _TrackedProducer


def _producers_of(generation):
    return [p for p in list(_made_producers)
            if getattr(p, "_oncelog_generation", None) == generation]


def _purge(generation):
    for p in _producers_of(generation):
        try:
            p.purge()
            # the purged messages' reports come through the queue: serve them
            p.flush(2)
        except Exception:  # a producer in a fatal state may refuse; nothing to keep
            pass


def _clear_frames_holding(generation):
    # A producer still alive is held by its test's frame, which a traceback
    # kept (librdkafka's fatal errors, raised out of a poll, leave a
    # reference the cycle collector cannot account for). The test has
    # ended: its frame's locals go.
    for p in _producers_of(generation):
        for r in gc.get_referrers(p):
            if isinstance(r, types.FrameType):
                try:
                    r.clear()
                except RuntimeError:  # still running: not a finished test's frame
                    pass


@pytest.fixture(autouse=True)
def _release_the_tests_producers():
    _producer_generation[0] += 1
    generation = _producer_generation[0]
    yield
    _purge(generation)
    gc.collect()
    _clear_frames_holding(generation)
    gc.collect()
    if os.environ.get("ONCELOG_DEBUG_PRODUCERS"):
        for p in _producers_of(generation):
            print(f"\nstill alive after its test: {p!r}: referrers "
                  f"{[type(r).__name__ for r in gc.get_referrers(p)]}\n{p._made_at}")


# --- parallel runs (pytest-xdist, `--dist loadgroup`) ----------------------------
# A heavy test (a JVM framework, the Apache Kafka reference broker, a C build,
# Chromium, `oncelog audit` under faults, a benchmark) takes a core or more
# for a long while: they share one xdist group, so at most one runs at a time
# beside the light ones, and they go first, so the longest chain starts at
# once instead of last.
HEAVY_MODULES = {
    "test_flink", "test_streams", "test_streams_writers",      # Flink, Kafka Streams
    "test_conformance", "test_acl_differential",                # Apache Kafka broker
    "test_audit", "test_bench",                                 # audit under faults, benchmarks
    "test_console",                                             # Chromium
    "test_librdkafka_suite",                                    # builds librdkafka's tests
}
HEAVY_TESTS = {
    "test_cluster.py::test_audit_under_cluster_faults",
    "test_cluster.py::test_exactly_once_copier_audit_under_cluster_faults",
}


# `bash test.sh --quick` (pytest -m quick): a subset that touches every layer
# (wire decoding, produce/fetch, idempotence, transactions and fencing, groups,
# the CLI, cluster mode once) in a few minutes. Not what CI runs.
QUICK_MODULES = {
    "test_readme", "test_docs", "test_clients", "test_idempotence", "test_transactions",
    "test_bad_input", "test_cli", "test_txn_scenarios", "test_metrics",
}


def _is_heavy(item):
    module = item.module.__name__ if item.module else ""
    test = item.nodeid.split("@")[0].split("[")[0].split("/")[-1]
    return module in HEAVY_MODULES or test in HEAVY_TESTS


def pytest_itemcollected(item):
    # Marks made here are on the item before any collection_modifyitems hook
    # (xdist's, which reads the groups, among them) runs.
    if _is_heavy(item):
        item.add_marker(pytest.mark.xdist_group("heavy"))
    if item.module and item.module.__name__ in QUICK_MODULES:
        item.add_marker(pytest.mark.quick)


def pytest_collection_modifyitems(config, items):
    items[:] = [i for i in items if _is_heavy(i)] + [i for i in items if not _is_heavy(i)]


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    # With --dist loadgroup a worker's heavy tests must carry the group in
    # their node ids (xdist's way of grouping): if they do not, the groups
    # did not take and heavy tests would run side by side.
    if getattr(session.config.option, "loadgroup", False):
        ungrouped = [i.nodeid for i in session.items if _is_heavy(i) and not i.nodeid.endswith("@heavy")]
        if ungrouped:
            raise pytest.UsageError(
                f"xdist groups did not take (pytest {pytest.__version__} with this pytest-xdist?): "
                f"{ungrouped[:3]}")
