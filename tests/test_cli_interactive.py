"""`oncelog produce` and `oncelog consume` as a person uses them: typed into a
terminal (a pseudo-terminal here, Ctrl-C as the ^C character), piped, or
interrupted; plus the connection settings and messages a first-day user
meets (--bootstrap without a port, ONCELOG_BOOTSTRAP, an HTTP server by
mistake, shell completions) and the read_committed message that names the
open transaction holding a partition back."""

import base64
import fcntl
import http.server
import json
import os
import re
import select
import signal
import socket
import subprocess
import termios
import threading
import time

import pytest
from confluent_kafka import KafkaError

from clients import (assigned_consumer, committed_offsets, produce, read_all, txn_producer,
                     unique_topic)
from conftest import free_port, oncelog_bin, wait_until

pytestmark = pytest.mark.timeout(120)


def run(*args, env=None, stdin=None, timeout=60):
    """Runs the CLI to completion (no pty); returns the finished process."""
    full_env = dict(os.environ)
    full_env.pop("ONCELOG_BOOTSTRAP", None)
    full_env.update(env or {})
    return subprocess.run([str(oncelog_bin()), *args], input=stdin, capture_output=True,
                          timeout=timeout, env=full_env)


class PtyProc:
    """The CLI with stdin and stdout on a pseudo-terminal it has as its
    controlling terminal (so ^C typed there is SIGINT), stderr to a file.
    A thread drains the terminal so the program never blocks writing."""

    def __init__(self, argv, stderr_path):
        self.master, slave = os.openpty()
        attrs = termios.tcgetattr(slave)
        attrs[3] &= ~termios.ECHO  # what is read back is the program's output only
        # ^C still signals, but the terminal keeps the output queued before it
        # (by default it discards it, and then the acknowledgements printed
        # just before a ^C would be lost to the test, not to the program)
        attrs[3] |= termios.NOFLSH
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        self.stderr_path = stderr_path
        self._err = open(stderr_path, "wb")
        env = dict(os.environ)
        env.pop("ONCELOG_BOOTSTRAP", None)
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=self._err, env=env,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(slave)
        self._out = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        while True:
            try:
                r, _, _ = select.select([self.master], [], [], 0.1)
                if r:
                    data = os.read(self.master, 65536)
                    if not data:
                        return
                    with self._lock:
                        self._out += data
                elif self.proc.poll() is not None:
                    return
            except OSError:  # EIO once the child side is closed
                return

    def type(self, text):
        os.write(self.master, text.encode() if isinstance(text, str) else text)

    def ctrl_c(self):
        self.type(b"\x03")

    @property
    def output(self):
        with self._lock:
            return self._out.decode("utf-8", "replace").replace("\r\n", "\n")

    def wait_output(self, predicate, timeout, what):
        return wait_until(lambda: predicate(self.output), timeout, what=what)

    def wait(self, timeout=15):
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"CLI did not exit within {timeout}s; stderr: {self.stderr}")
        self._reader.join(5)
        return rc

    @property
    def stderr(self):
        self._err.flush()
        with open(self.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self._err.close()
        try:
            os.close(self.master)
        except OSError:
            pass


@pytest.fixture
def ptys(tmp_path):
    started = []

    def start(*args):
        p = PtyProc([str(oncelog_bin()), *args], tmp_path / f"stderr-{len(started)}.txt")
        started.append(p)
        return p
    yield start
    for p in started:
        p.close()


def poll_values(consumer, want, timeout):
    """Polls until `want` values arrived (or the timeout); returns them."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        m = consumer.poll(0.05)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(m.error())
        got.append(m.value())
    return got


def create(broker, topic, partitions=1):
    p = run("topic", "create", topic, "--partitions", str(partitions), "--bootstrap", broker.bootstrap)
    assert p.returncode == 0, p.stderr


# ------------------------------------------------------------------ produce

def test_typed_lines_reach_a_consumer_within_a_second(broker, ptys):
    topic = unique_topic("tty-p")
    create(broker, topic)
    consumer = assigned_consumer(broker.bootstrap, topic)
    try:
        prod = ptys("produce", topic, "--verbose", "--bootstrap", broker.bootstrap)
        # the consumer is fetching (at the empty end) before anything is typed
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert consumer.poll(0.1) is None
        for i, word in enumerate(["one", "two", "three"]):
            typed = time.monotonic()
            prod.type(f"{word}\n")
            got = poll_values(consumer, 1, 5.0)
            elapsed = time.monotonic() - typed
            assert got == [word.encode()], f"line {i}: {got}"
            assert elapsed < 1.0, f"line {word!r} took {elapsed:.2f}s to reach a consumer"
            prod.wait_output(lambda out: f"Produced to partition 0 at offset {i} with timestamp" in out,
                             5, f"the acknowledgement of offset {i}")
        prod.ctrl_c()
        assert prod.wait() == 0, prod.stderr
        assert prod.stderr.strip().splitlines()[-1] == \
            "interrupted (SIGINT): 3 records acknowledged, nothing left pending"
        acks = re.findall(r"^Produced to partition 0 at offset (\d+) with timestamp \d+\.$",
                          prod.output, re.M)
        assert acks == ["0", "1", "2"]
    finally:
        consumer.close()
    assert read_all(broker.bootstrap, topic, until="quiet") == [b"one", b"two", b"three"]


def test_ctrl_c_loses_nothing_acknowledged(broker, ptys):
    """A burst of typed lines and Ctrl-C right after the first
    acknowledgements: the count printed is what a consumer reads, and every
    acknowledged record was reported with its offset."""
    topic = unique_topic("tty-burst")
    create(broker, topic)
    prod = ptys("produce", topic, "--verbose", "--batch-records", "7", "--bootstrap", broker.bootstrap)
    prod.type("".join(f"line-{i}\n" for i in range(300)))
    prod.wait_output(lambda out: "Produced to partition 0 at offset" in out, 10, "a first acknowledgement")
    prod.ctrl_c()
    assert prod.wait() == 0, prod.stderr
    m = re.fullmatch(r"interrupted \(SIGINT\): (\d+) records acknowledged, nothing left pending",
                     prod.stderr.strip().splitlines()[-1])
    assert m, prod.stderr
    acked = int(m.group(1))
    assert acked >= 1
    reported = re.findall(r"^Produced to partition 0 at offset (\d+) ", prod.output, re.M)
    assert reported == [str(i) for i in range(acked)], (acked, prod.output[-500:])
    assert read_all(broker.bootstrap, topic, until="quiet") == [b"line-%d" % i for i in range(acked)]


def test_ctrl_c_aborts_the_open_transaction(broker, ptys):
    topic = unique_topic("tty-txn")
    create(broker, topic)
    txn_id = unique_topic("tty-txn-id")
    prod = ptys("produce", topic, "--transactional-id", txn_id, "--transaction-records", "2",
                "--verbose", "--bootstrap", broker.bootstrap)
    prod.type("c1\nc2\n")
    # c1, c2 at offsets 0 and 1, the commit marker at 2, then the open transaction
    prod.wait_output(lambda out: "at offset 1 " in out, 10, "the first transaction's records")
    prod.type("open1\n")
    prod.wait_output(lambda out: "at offset 3 " in out, 10, "the open transaction's record")
    prod.ctrl_c()
    assert prod.wait() == 0, prod.stderr
    assert prod.stderr.strip().splitlines()[-1] == (
        "interrupted (SIGINT): 2 records acknowledged in 1 committed transactions; "
        "aborted the open transaction (1 records)")
    desc = run("txn", "describe", txn_id, "--json", "--bootstrap", broker.bootstrap)
    assert json.loads(desc.stdout)["state"] == "CompleteAbort"
    topic_desc = json.loads(run("topic", "describe", topic, "--json", "--bootstrap", broker.bootstrap).stdout)
    part = topic_desc["partitions"][0]
    assert part["last_stable_offset"] == part["high_watermark"] == 5
    assert read_all(broker.bootstrap, topic, until="quiet") == [b"c1", b"c2"]
    assert read_all(broker.bootstrap, topic, isolation="read_uncommitted", until="quiet") == \
        [b"c1", b"c2", b"open1"]


def test_a_lost_connection_says_what_was_acknowledged(broker, ptys):
    topic = unique_topic("tty-lost")
    create(broker, topic)
    prod = ptys("produce", topic, "--verbose", "--bootstrap", broker.bootstrap)
    prod.type("kept-1\nkept-2\n")
    prod.wait_output(lambda out: "at offset 1 " in out, 10, "two acknowledgements")
    broker.kill9()
    prod.type("after-kill\n")
    rc = prod.wait(30)
    assert rc != 0
    last = prod.stderr.strip().splitlines()[-1]
    assert last.startswith("error: produce stopped after 2 records were acknowledged (1 more were sent "
                           "without an answer: they may or may not have been written): "), last
    assert f"{broker.bootstrap}" in last
    broker.start()
    assert read_all(broker.bootstrap, topic, until="quiet")[:2] == [b"kept-1", b"kept-2"]


def test_sigterm_sends_what_is_pending(broker):
    """With a long --linger-ms the lines wait in the producer; SIGTERM sends
    them before it exits, and says how many were acknowledged."""
    topic = unique_topic("pipe-term-p")
    create(broker, topic)
    env = dict(os.environ)
    env.pop("ONCELOG_BOOTSTRAP", None)
    proc = subprocess.Popen([str(oncelog_bin()), "produce", topic, "--linger-ms", "60000",
                             "--bootstrap", broker.bootstrap],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    consumer = assigned_consumer(broker.bootstrap, topic)
    try:
        proc.stdin.write(b"p1\np2\n")
        proc.stdin.flush()
        assert poll_values(consumer, 1, 1.5) == []  # lingering, not sent yet
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)  # stdin stays open: the signal, not an EOF, ends the run
        err = proc.stderr.read()
        assert poll_values(consumer, 2, 5.0) == [b"p1", b"p2"]
    finally:
        consumer.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0, err
    assert err.decode().strip().splitlines()[-1] == \
        "interrupted (SIGTERM): 2 records acknowledged, nothing left pending"


def test_piped_produce_and_eof_still_batch(broker):
    """Piped input (no terminal) goes out in requests of --batch-records and
    ends with the usual summary at EOF."""
    topic = unique_topic("pipe-p")
    create(broker, topic)
    p = run("produce", topic, "--batch-records", "100", "--json", "--bootstrap", broker.bootstrap,
            stdin=b"".join(b"%d\n" % i for i in range(1000)))
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["records"] == 1000 and summary["acknowledged"] == 1000
    assert summary["interrupted"] is None and summary["outcome"] == "acknowledged"
    assert read_all(broker.bootstrap, topic, until="quiet") == [b"%d" % i for i in range(1000)]


def test_verbose_json_acknowledgements(broker):
    topic = unique_topic("pipe-pj")
    create(broker, topic)
    p = run("produce", topic, "--verbose", "--json", "--bootstrap", broker.bootstrap, stdin=b"a\nb\n")
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.decode().splitlines()]
    assert [(x["topic"], x["partition"], x["offset"]) for x in lines[:2]] == [(topic, 0, 0), (topic, 0, 1)]
    assert all(isinstance(x["timestamp"], int) and x["timestamp"] > 0 for x in lines[:2])
    assert lines[2]["records"] == 2 and len(lines) == 3


# ------------------------------------------------------------------ consume

def test_follow_on_a_terminal_shows_records_at_once_and_commits_on_ctrl_c(broker, ptys):
    topic = unique_topic("tty-c")
    create(broker, topic)
    group = unique_topic("tty-group")
    produce(broker.bootstrap, topic, [b"r0", b"r1", b"r2"], partition=0)
    cons = ptys("consume", topic, "--group", group, "--follow", "--bootstrap", broker.bootstrap)
    cons.wait_output(lambda out: out == "r0\nr1\nr2\n", 10, "the first three records")
    produce(broker.bootstrap, topic, [b"r3", b"r4"], partition=0)
    shown = time.monotonic()
    cons.wait_output(lambda out: out == "r0\nr1\nr2\nr3\nr4\n", 5, "the live records")
    assert time.monotonic() - shown < 1.5
    cons.ctrl_c()
    assert cons.wait() == 0, cons.stderr
    err = cons.stderr.strip().splitlines()
    assert err[-3:] == ["interrupted (SIGINT)", f"consumed 5 records from {topic}",
                        f"committed group {group}: {topic}-0 at 5"]
    assert committed_offsets(broker.bootstrap, group, topic, [0])[0] == 5
    desc = json.loads(run("group", "describe", group, "--json", "--bootstrap", broker.bootstrap).stdout)
    assert [(o["partition"], o["committed"]) for o in desc["offsets"]] == [(0, 5)]
    # and a later run resumes there
    produce(broker.bootstrap, topic, [b"r5"], partition=0)
    again = run("consume", topic, "--group", group, "--bootstrap", broker.bootstrap)
    assert again.returncode == 0 and again.stdout == b"r5\n", again.stderr


def test_sigterm_stops_follow_and_commits(broker):
    topic = unique_topic("pipe-term")
    create(broker, topic)
    group = unique_topic("term-group")
    produce(broker.bootstrap, topic, [b"x", b"y"], partition=0)
    env = dict(os.environ)
    env.pop("ONCELOG_BOOTSTRAP", None)
    proc = subprocess.Popen([str(oncelog_bin()), "consume", topic, "--group", group, "--follow",
                             "--bootstrap", broker.bootstrap],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline() == b"x\n"
        assert proc.stdout.readline() == b"y\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0, err
    assert b"interrupted (SIGTERM)\n" in err
    assert committed_offsets(broker.bootstrap, group, topic, [0])[0] == 2


def test_from_past_the_end_waits_at_the_end(broker):
    topic = unique_topic("past-end")
    create(broker, topic)
    produce(broker.bootstrap, topic, [b"old-0", b"old-1"], partition=0)
    # without --follow: nothing to read, and it says why
    p = run("consume", topic, "--from", "10", "--bootstrap", broker.bootstrap, timeout=20)
    assert p.returncode == 0 and p.stdout == b""
    assert (f"{topic}-0: offset 10 is past the end of the log (2); nothing to read "
            "(--follow waits there)").encode() in p.stderr
    env = dict(os.environ)
    env.pop("ONCELOG_BOOTSTRAP", None)
    proc = subprocess.Popen([str(oncelog_bin()), "consume", topic, "--from", "10", "--follow",
                             "--bootstrap", broker.bootstrap],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        lines = []
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        time.sleep(1.5)
        assert lines == [] and proc.poll() is None  # waiting, not rewound to 0
        produce(broker.bootstrap, topic, [b"new-2"], partition=0)
        reader.join(10)
        assert lines == [b"new-2\n"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0 and out == b""
    assert (f"{topic}-0: offset 10 is past the end of the log (2); waiting there for new "
            "records").encode() in err
    assert b"consumed 1 records" in err


def test_from_minus_n_reads_the_last_n(broker):
    topic = unique_topic("minus-n")
    create(broker, topic)
    produce(broker.bootstrap, topic, [b"%d" % i for i in range(10)], partition=0)
    p = run("consume", topic, "--from", "-3", "--bootstrap", broker.bootstrap)
    assert p.returncode == 0 and p.stdout == b"7\n8\n9\n", p.stderr


def test_hex_and_base64_formats(broker):
    topic = unique_topic("fmt")
    create(broker, topic)
    values = [b"\x00\xff\x10binary\n", b"", b"ab", b"abc", b"abcd"]
    produce(broker.bootstrap, topic, values, partition=0)
    h = run("consume", topic, "--format", "hex", "--bootstrap", broker.bootstrap)
    assert h.returncode == 0, h.stderr
    assert h.stdout.decode().splitlines() == ["00ff1062696e6172790a", "", "6162", "616263", "61626364"]
    b = run("consume", topic, "--format", "base64", "--bootstrap", broker.bootstrap)
    assert b.returncode == 0, b.stderr
    assert b.stdout.decode().splitlines() == [base64.b64encode(v).decode() for v in values]
    bad = run("consume", topic, "--format", "yaml", "--bootstrap", broker.bootstrap)
    assert bad.returncode != 0
    assert b"--format must be one of value, kv, json, hex, base64" in bad.stderr


def test_read_committed_names_the_open_transaction(broker):
    topic = unique_topic("lso")
    create(broker, topic)
    produce(broker.bootstrap, topic, [b"before"], partition=0)
    txn_id = unique_topic("lso-holder")
    tp = txn_producer(broker.bootstrap, txn_id)
    tp.init_transactions(30)
    tp.begin_transaction()
    tp.produce(topic, value=b"pending-1", partition=0)
    tp.produce(topic, value=b"pending-2", partition=0)
    tp.flush(30)
    producers = json.loads(run("txn", "producers", topic, "0", "--json", "--bootstrap", broker.bootstrap).stdout)
    holder = [x for x in producers if x["current_txn_start_offset"] >= 0]
    assert len(holder) == 1 and holder[0]["current_txn_start_offset"] == 1
    pid, epoch = holder[0]["producer_id"], holder[0]["epoch"]
    p = run("consume", topic, "--bootstrap", broker.bootstrap)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"before\n"
    expected = (rf'^{re.escape(topic)}-0: stopped at the last stable offset 1 \(read_committed\); '
                rf'the high watermark is 3: 2 offsets are held back by the open transaction of '
                rf'transactional id "{re.escape(txn_id)}" \(producer id {pid}, epoch {epoch}, first offset 1, '
                rf'open for \d+\.\d s\)$')
    assert re.search(expected, p.stderr.decode(), re.M), p.stderr
    # --follow says the same while it waits there
    f = run("consume", topic, "--follow", "--timeout-ms", "3500", "--bootstrap", broker.bootstrap)
    assert f.returncode == 0 and f.stdout == b"before\n"
    assert re.search(expected.replace("stopped at", "waiting at"), f.stderr.decode(), re.M), f.stderr
    # read_uncommitted has nothing held back
    u = run("consume", topic, "--isolation", "read_uncommitted", "--bootstrap", broker.bootstrap)
    assert u.stdout == b"before\npending-1\npending-2\n" and b"last stable offset" not in u.stderr
    tp.commit_transaction(30)
    done = run("consume", topic, "--bootstrap", broker.bootstrap)
    assert done.stdout == b"before\npending-1\npending-2\n"
    assert b"last stable offset" not in done.stderr


# ------------------------------------------------------------- connecting

def test_bootstrap_from_the_environment_and_the_flag_wins(broker):
    ok = run("topic", "list", "--json", env={"ONCELOG_BOOTSTRAP": broker.bootstrap})
    assert ok.returncode == 0, ok.stderr
    assert isinstance(json.loads(ok.stdout), list)
    dead = "127.0.0.2:1"
    bad = run("topic", "list", "--json", env={"ONCELOG_BOOTSTRAP": dead})
    assert bad.returncode == 1
    assert bad.stderr.decode().startswith(f"error: cannot connect to {dead}: ")
    wins = run("topic", "list", "--json", "--bootstrap", broker.bootstrap, env={"ONCELOG_BOOTSTRAP": dead})
    assert wins.returncode == 0, wins.stderr


def test_bootstrap_host_alone_means_port_9092():
    for args, env in [(["--bootstrap", "127.0.0.2"], {}), ([], {"ONCELOG_BOOTSTRAP": "127.0.0.2"})]:
        p = run("topic", "list", *args, env=env, timeout=30)
        err = p.stderr.decode()
        assert p.returncode == 1, err
        assert err.startswith("error: cannot connect to 127.0.0.2:9092: "), err
        # each cause once: no "refused: ... refused" chains
        assert err.count("refused") <= 1 and err.count("127.0.0.2") == 1, err
    bad = run("topic", "list", "--bootstrap", "host:notaport")
    assert bad.returncode == 2 and b"port \"notaport\" is not a number" in bad.stderr


def test_an_http_server_is_recognised(tmp_path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Quiet)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        p = run("topic", "list", "--bootstrap", f"127.0.0.1:{port}", timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert p.returncode == 1
    assert p.stderr.decode() == \
        f"error: 127.0.0.1:{port}: this looks like an HTTP server, not a Kafka broker\n"


def test_a_peer_that_closes_at_once_is_named():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        conn.recv(100)
        conn.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        p = run("topic", "list", "--bootstrap", f"127.0.0.1:{port}", timeout=30)
    finally:
        listener.close()
    assert p.returncode == 1
    assert p.stderr.decode().startswith(
        f"error: 127.0.0.1:{port} did not answer as a Kafka broker: it closed the connection")


def test_completions():
    for shell, marker in [("bash", "_oncelog()"), ("zsh", "#compdef oncelog"), ("fish", "complete -c oncelog")]:
        p = run("completions", shell)
        assert p.returncode == 0, p.stderr
        out = p.stdout.decode()
        assert marker in out, shell
        assert "produce" in out and "consume" in out and "bootstrap" in out and "linger-ms" in out
    bad = run("completions", "tcsh")
    assert bad.returncode == 2 and b"invalid value 'tcsh'" in bad.stderr
