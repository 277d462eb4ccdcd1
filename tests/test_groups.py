"""Consumer groups (classic protocol) and transactional offset commits against
a real `oncelog serve`: rebalancing with eager and cooperative assignors,
session timeouts, static membership, committed offsets across restarts,
librdkafka / kafka-python / Java members in one group, the admin API, the
S7 consume-transform-produce copier, and require_stable offset fetches while
a transaction's offsets are pending.

Assignment is client-side: the broker only has to carry the members'
protocols and metadata faithfully, time members out, and keep the
generations straight. Every wait has a deadline; everything is on loopback.
"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import (Consumer, ConsumerGroupState, ConsumerGroupTopicPartitions,
                             KafkaError, KafkaException, Producer, TopicPartition)

import kafka_wire as kw
from clients import (HEARTBEAT_MS, SESSION_TIMEOUT_MS, admin, admin_committed, committed_offsets,
                     consumer_config, create_topic, flush_all, group_conf, lso, producer_config,
                     read_partition, txn_producer, unique_topic)
from conftest import both_modes, wait_until, _die_with_parent
from test_java import java_classpath  # noqa: F401  (fixture)

TESTS_DIR = Path(__file__).resolve().parent
GROUP_MEMBER = TESTS_DIR / "group_member.py"
COPIER = TESTS_DIR / "copier.py"

# Rebalance as soon as a member joins (the broker default is 3000 like Kafka).
GROUP_OVERRIDES = {"group.initial.rebalance.delay.ms": 0}

API_OFFSET_FETCH = 9
UNSTABLE_OFFSET_COMMIT = 88


# ------------------------------------------------------------------ helpers

def seed(bootstrap, topic, partitions, per_partition, fmt="v{p}-{i}"):
    p = Producer(producer_config(bootstrap))
    for i in range(per_partition):
        for part in range(partitions):
            p.produce(topic, value=fmt.format(p=part, i=i).encode(), partition=part)
    flush_all(p)


def tp_map(tps):
    return {tp.partition: tp.offset for tp in tps}


class OwnerBook:
    """Who owns which partition, according to the rebalance callbacks of the
    in-process members. A member's revoke callback runs before it rejoins,
    and a partition is handed to another member only in a later
    generation, so a partition must never be taken while another member
    still holds it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.owner = {}
        self.violations = []

    def take(self, member, parts):
        with self.lock:
            for p in parts:
                cur = self.owner.get(p)
                if cur is not None and cur != member:
                    self.violations.append(
                        f"t={time.monotonic():.3f}: {member} was assigned partition {p} "
                        f"while {cur} still owned it")
                self.owner[p] = member

    def release(self, member, parts):
        with self.lock:
            for p in parts:
                if self.owner.get(p) == member:
                    del self.owner[p]


class Member:
    """A confluent-kafka consumer subscribed to one topic, polled by its own
    thread (heartbeats run in librdkafka's background thread; rebalance
    callbacks run in the polling thread). Tracks ownership through the
    callbacks and through assignment()."""

    def __init__(self, name, bootstrap, group, topic, strategy="range", book=None, **extra):
        self.name = name
        self.incremental = strategy == "cooperative-sticky"
        self.book = book
        self.lock = threading.Lock()
        self.owned = set()        # from the rebalance callbacks
        self.assigned = set()     # from assignment() after every poll
        self.last_change = time.monotonic()
        self.events = []          # (t, kind, frozenset(partitions))
        self.records = []         # (partition, offset, value)
        self.errors = []
        self.member_id = None
        self.closed = False
        self._stop = threading.Event()
        conf = group_conf(bootstrap, group, **{"client.id": name,
                                               "partition.assignment.strategy": strategy})
        conf.update(extra)
        self.consumer = Consumer(conf)
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        self.thread = threading.Thread(target=self._run, name=f"member-{name}", daemon=True)
        self.thread.start()

    def _event(self, kind, parts):
        ps = frozenset(tp.partition for tp in parts)
        with self.lock:
            self.events.append((time.monotonic(), kind, ps))
            self.last_change = time.monotonic()
        return ps

    def _on_assign(self, _c, parts):
        ps = self._event("assign", parts)
        old = frozenset()
        with self.lock:
            if self.incremental:
                self.owned |= ps
            else:
                old = self.owned - ps
                self.owned = set(ps)
        if self.book:
            if old:
                self.book.release(self.name, old)
            self.book.take(self.name, ps)

    def _on_revoke(self, _c, parts):
        ps = self._event("revoke", parts)
        with self.lock:
            if self.incremental:
                self.owned -= ps
            else:
                ps = frozenset(self.owned | ps)
                self.owned = set()
        if self.book:
            self.book.release(self.name, ps)

    def _on_lost(self, _c, parts):
        ps = self._event("lost", parts)
        with self.lock:
            self.owned -= ps
            if not self.incremental:
                self.owned = set()
        if self.book:
            self.book.release(self.name, ps)

    def _run(self):
        c = self.consumer
        try:
            while not self._stop.is_set():
                m = c.poll(0.1)
                if m is not None:
                    if m.error():
                        self.errors.append(f"{self.name}: {m.error()}")
                    else:
                        with self.lock:
                            self.records.append((m.partition(), m.offset(), m.value()))
                a = {tp.partition for tp in c.assignment()}
                with self.lock:
                    if a != self.assigned:
                        self.assigned = a
                        self.last_change = time.monotonic()
                self.member_id = c.memberid()
        except Exception as e:  # noqa: BLE001 - surfaced by wait_balanced
            self.errors.append(f"{self.name}: {type(e).__name__}: {e}")
        finally:
            try:
                c.close()
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"{self.name}: close: {e}")
            self.closed = True

    def view(self):
        with self.lock:
            return frozenset(self.owned), self.owned == self.assigned, self.last_change

    def revoked_since(self, t):
        with self.lock:
            return set().union(*[ps for (et, kind, ps) in self.events
                                 if et >= t and kind in ("revoke", "lost")])

    def events_since(self, t):
        with self.lock:
            return [(round(et - t, 3), kind, sorted(ps)) for (et, kind, ps) in self.events if et >= t]

    def record_offsets(self, partition):
        with self.lock:
            return [o for (p, o, _) in self.records if p == partition]

    def close(self, timeout=20):
        self._stop.set()
        self.thread.join(timeout)
        assert self.closed, f"{self.name}: consumer close did not finish in {timeout}s"

    def __repr__(self):
        owned, consistent, t = self.view()
        return (f"<{self.name} owned={sorted(owned)} assignment()={sorted(self.assigned)} "
                f"member_id={self.member_id} errors={self.errors[-3:]}>")


class ProcMember:
    """A group member in its own process (tests/group_member.py or the Java
    JavaGroupMember) that reports its assignment as JSON lines."""

    def __init__(self, name, argv, log_dir):
        self.name = name
        self.argv = argv
        self.stderr_path = Path(log_dir) / f"member-{name}-{time.monotonic_ns()}.stderr"
        self.lock = threading.Lock()
        self.owned = set()
        self.reported = False
        self.last_change = time.monotonic()
        self.events = []   # parsed JSON objects
        self.errors = []
        self.noise = []
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, cwd=str(TESTS_DIR),
                                         preexec_fn=_die_with_parent)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    @classmethod
    def python(cls, client, name, bootstrap, group, topic, log_dir, strategy="range", **opts):
        argv = [sys.executable, str(GROUP_MEMBER), "--client", client, "--bootstrap", bootstrap,
                "--group", group, "--topic", topic, "--name", name, "--strategy", strategy]
        for k, v in opts.items():
            flag = "--" + k.replace("_", "-")
            argv += [flag] if v is True else [flag, str(v)]
        return cls(name, argv, log_dir)

    @classmethod
    def java(cls, classpath, name, bootstrap, group, topic, log_dir, strategy="range"):
        argv = ["java", "-Xmx256m", "-cp", classpath, "JavaGroupMember",
                bootstrap, group, topic, strategy, name]
        return cls(name, argv, log_dir)

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            try:
                ev = json.loads(line)
            except ValueError:
                self.noise.append(line)
                continue
            with self.lock:
                self.events.append(ev)
                kind = ev.get("event")
                if kind == "owned":
                    self.owned = set(ev["partitions"])
                    self.reported = True
                    self.last_change = ev["t"]
                elif kind in ("assigned", "revoked", "lost"):
                    self.last_change = ev["t"]
                elif kind == "error":
                    self.errors.append(f"{self.name}: {ev.get('error')}")

    @property
    def alive(self):
        return self.proc.poll() is None

    def view(self):
        with self.lock:
            return frozenset(self.owned), self.reported and self.alive, self.last_change

    def events_since(self, t, kinds=("assigned", "revoked", "lost", "owned")):
        with self.lock:
            return [(round(e["t"] - t, 3), e["event"], e.get("partitions"))
                    for e in self.events if e["t"] >= t and e["event"] in kinds]

    def stderr_tail(self, n=30):
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    def close(self, timeout=30):
        """Close stdin: the member closes its consumer (LeaveGroup) and exits."""
        if self.alive:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
                raise AssertionError(f"{self.name} did not exit {timeout}s after stdin EOF:\n"
                                     f"{self.stderr_tail()}")
        self.reader.join(5)

    def kill9(self):
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def sigstop(self):
        self.proc.send_signal(signal.SIGSTOP)

    def sigcont(self):
        self.proc.send_signal(signal.SIGCONT)

    def __repr__(self):
        owned, ok, _ = self.view()
        tail = self.events[-6:]
        return (f"<{self.name} alive={self.alive} owned={sorted(owned)} errors={self.errors[-3:]} "
                f"last events={tail} noise={self.noise[-3:]}\n stderr: {self.stderr_tail(8)}>")


@pytest.fixture
def registry():
    """Everything a test starts that must not outlive it."""
    things = []
    yield things
    for t in reversed(things):
        try:
            if isinstance(t, ProcMember):
                if t.alive:
                    t.sigcont()
                t.kill9()
            elif isinstance(t, Member):
                t._stop.set()
                t.thread.join(15)
            elif isinstance(t, threading.Thread):
                t.stop.set()
                t.join(15)
            elif isinstance(t, subprocess.Popen):
                if t.poll() is None:
                    t.kill()
                t.wait(10)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass


def wait_balanced(members, partitions, sizes=None, timeout=60, stable_for=2.0, book=None):
    """Wait until the members' assignments cover partitions 0..partitions-1
    exactly once (with the given sizes, in any order) and nothing changed
    for stable_for seconds. Returns {name: frozenset}. Fails at once on a
    member error or an ownership overlap."""
    deadline = time.monotonic() + timeout
    while True:
        for m in members:
            if m.errors:
                pytest.fail(f"member {m.name} reported errors: {m.errors}")
            if isinstance(m, ProcMember) and not m.alive:
                pytest.fail(f"member {m.name} exited with {m.proc.returncode}: {m!r}")
        if book and book.violations:
            pytest.fail("partition owned by two members at once: " + "; ".join(book.violations))
        views = {m.name: m.view() for m in members}
        owned = [v[0] for v in views.values()]
        flat = sorted(p for s in owned for p in s)
        now = time.monotonic()
        if (all(v[1] for v in views.values())
                and flat == list(range(partitions))
                and (sizes is None or sorted(len(s) for s in owned) == sorted(sizes))
                and now - max(v[2] for v in views.values()) >= stable_for):
            return {name: v[0] for name, v in views.items()}
        if now > deadline:
            pytest.fail(f"group not balanced over {partitions} partitions (sizes {sizes}) after "
                        f"{timeout}s: {members!r}")
        time.sleep(0.1)


# ---------------------------------------------------------- raw OffsetFetch

def api_versions(broker):
    with kw.Conn(broker.host, broker.port) as c:
        c.send(kw.api_versions_request(0, 1))
        err, apis = kw.parse_api_versions_v0_response(c.recv_response(1))
    assert err == kw.NONE
    return apis


def offset_fetch(broker, group, topic, partitions, require_stable):
    """OffsetFetch v7 (the first version with require_stable) on a raw
    connection. Returns {partition: (committed_offset, error_code)}."""
    lo, hi = api_versions(broker)[API_OFFSET_FETCH]
    assert lo <= 7 <= hi, f"OffsetFetch versions {lo}..{hi} do not include v7 (require_stable)"
    body = (kw.compact_string(group)
            + kw.uvarint(1 + 1)
            + kw.compact_string(topic)
            + kw.uvarint(len(partitions) + 1) + b"".join(kw.i32(p) for p in partitions)
            + kw.uvarint(0)                      # topic tagged fields
            + kw.i8(1 if require_stable else 0)
            + kw.uvarint(0))                     # request tagged fields
    cid = 4242
    with kw.Conn(*kw.find_coordinator(broker.host, broker.port, group)) as c:
        c.send(kw.frame(kw.request_header_v2(API_OFFSET_FETCH, 7, cid) + body))
        r = kw.Reader(c.recv_response(cid))
    r.tagged()                                   # response header v1
    r.i32()                                      # throttle_time_ms
    out = {}
    for _ in range(r.uvarint() - 1):
        name = r.compact_string()
        assert name == topic, name
        for _ in range(r.uvarint() - 1):
            p = r.i32()
            offset = r.i64()
            r.i32()                              # committed_leader_epoch
            r.compact_string()          # metadata
            err = r.i16()
            r.tagged()
            out[p] = (offset, err)
        r.tagged()
    top_err = r.i16()
    r.tagged()
    assert top_err == kw.NONE, f"OffsetFetch error {top_err}"
    assert r.remaining() == 0, f"{r.remaining()} trailing bytes in OffsetFetch v7 response"
    return out


# ======================================================= 1. rebalancing

@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_two_then_three_members_own_every_partition_once(broker_factory, registry, strategy):
    broker = broker_factory(GROUP_OVERRIDES)
    topic = unique_topic("grp")
    create_topic(broker.bootstrap, topic, partitions=6)
    group = "g-" + topic
    book = OwnerBook()

    def member(name):
        m = Member(name, broker.bootstrap, group, topic, strategy=strategy, book=book)
        registry.append(m)
        return m

    a = member("a")
    assert wait_balanced([a], 6, [6], book=book) == {"a": frozenset(range(6))}

    b = member("b")
    two = wait_balanced([a, b], 6, [3, 3], book=book)

    t_c = time.monotonic()
    c = member("c")
    three = wait_balanced([a, b, c], 6, [2, 2, 2], book=book)

    if strategy == "cooperative-sticky":
        # Incremental: a and b each keep two of their three partitions and
        # revoke only the one that moves to c (the broker carried their
        # owned partitions in the subscription metadata).
        for m in (a, b):
            assert three[m.name] < two[m.name], (m.name, two, three)
            assert m.revoked_since(t_c) == set(two[m.name] - three[m.name]), \
                (m.name, m.events_since(t_c))
    else:
        # Eager: every member gave up everything before the new assignment.
        for m in (a, b):
            assert m.revoked_since(t_c) >= set(two[m.name]), (m.name, m.events_since(t_c))

    # c leaves with a LeaveGroup: its partitions move on at once, without
    # waiting for a session timeout.
    t_leave = time.monotonic()
    c.close()
    back = wait_balanced([a, b], 6, [3, 3], book=book, stable_for=1.5)
    settled = max(a.view()[2], b.view()[2])
    assert settled - t_leave < SESSION_TIMEOUT_MS / 1000 - 1, \
        f"rebalance after LeaveGroup took {settled - t_leave:.1f}s"
    if strategy == "cooperative-sticky":
        for m in (a, b):
            assert back[m.name] > three[m.name], (m.name, three, back)
            assert m.revoked_since(t_leave) == set(), (m.name, m.events_since(t_leave))
    assert not book.violations, book.violations


@pytest.mark.timeout(120)
def test_initial_rebalance_delay_gathers_members(broker_factory, registry):
    """With the default group.initial.rebalance.delay.ms (3000), the first
    rebalance of an empty group waits for more members: two consumers that
    subscribe together get their first assignment in one generation."""
    broker = broker_factory()
    topic = unique_topic("delay")
    create_topic(broker.bootstrap, topic, partitions=6)
    group = "g-" + topic
    t0 = time.monotonic()
    a = Member("a", broker.bootstrap, group, topic)
    registry.append(a)
    time.sleep(0.5)
    b = Member("b", broker.bootstrap, group, topic)
    registry.append(b)
    wait_balanced([a, b], 6, [3, 3], timeout=30)
    first_assign = min(t for m in (a, b) for (t, kind, _) in m.events if kind == "assign")
    assert first_assign - t0 >= 2.5, \
        f"first assignment after {first_assign - t0:.2f}s: the initial delay was not applied"
    for m in (a, b):
        assigns = [ps for (_, kind, ps) in m.events if kind == "assign"]
        assert len(assigns[0]) == 3, f"{m.name}'s first assignment was {sorted(assigns[0])}"


# ===================================================== 2. committed offsets

def consume_to_end(c, topic, ends, timeout=30):
    """Poll c until every partition in ends has been read up to its end.
    Returns {partition: [offsets]}."""
    got = {p: [] for p in ends}
    deadline = time.monotonic() + timeout
    while any((not got[p] or got[p][-1] < ends[p] - 1) for p in ends):
        if time.monotonic() > deadline:
            pytest.fail(f"consumer stuck: got {{p: (first, last, n)}} = "
                        f"{ {p: (v[:1], v[-1:], len(v)) for p, v in got.items()} }, ends {ends}")
        m = c.poll(0.2)
        if m is None:
            continue
        if m.error():
            pytest.fail(f"consumer error: {m.error()}")
        assert m.topic() == topic
        got[m.partition()].append(m.offset())
    return got


@pytest.mark.timeout(180)
def test_committed_offsets_survive_sigterm_and_kill9(broker_factory):
    broker = broker_factory(GROUP_OVERRIDES)
    topic = unique_topic("commit")
    create_topic(broker.bootstrap, topic, partitions=3)
    seed(broker.bootstrap, topic, 3, 50)
    ends = {0: 50, 1: 50, 2: 50}
    group = "g-" + topic
    bs = broker.bootstrap

    # A member reads everything and commits explicit offsets with metadata.
    c1 = Consumer(group_conf(bs, group))
    c1.subscribe([topic])
    got = consume_to_end(c1, topic, ends)
    assert {p: v[0] for p, v in got.items()} == {0: 0, 1: 0, 2: 0}
    first = {0: 10, 1: 17, 2: 23}
    c1.commit(offsets=[TopicPartition(topic, p, o, metadata=f"meta-{p}") for p, o in first.items()],
              asynchronous=False)
    own = c1.committed([TopicPartition(topic, p) for p in ends], timeout=30)
    assert {tp.partition: (tp.offset, tp.metadata) for tp in own} == \
        {p: (o, f"meta-{p}") for p, o in first.items()}
    c1.close()

    broker.restart()  # SIGTERM
    assert committed_offsets(bs, group, topic, ends, metadata=True) == \
        {p: (o, f"meta-{p}") for p, o in first.items()}

    # A new member resumes from them (auto.offset.reset=error: no fallback).
    c2 = Consumer(group_conf(bs, group, **{"auto.offset.reset": "error"}))
    c2.subscribe([topic])
    got = consume_to_end(c2, topic, ends)
    assert {p: v[0] for p, v in got.items()} == first
    assert all(v == list(range(first[p], 50)) for p, v in got.items())
    c2.commit(asynchronous=False)  # the consumed positions
    assert committed_offsets(bs, group, topic, ends) == ends
    second = {0: 30, 1: 35, 2: 40}
    c2.commit(offsets=[TopicPartition(topic, p, o) for p, o in second.items()], asynchronous=False)
    c2.close()

    broker.kill9()
    broker.start()
    assert committed_offsets(bs, group, topic, ends) == second

    # Auto-commit: the final commit on close is durable too.
    c3 = Consumer(group_conf(bs, group, **{"auto.offset.reset": "error", "enable.auto.commit": True,
                                           "auto.commit.interval.ms": 200}))
    c3.subscribe([topic])
    got = consume_to_end(c3, topic, ends)
    assert {p: v[0] for p, v in got.items()} == second
    c3.close()

    broker.kill9()
    broker.start()
    assert committed_offsets(bs, group, topic, ends) == ends


# ================================================ 3. session timeout, static

@pytest.mark.timeout(150)
@pytest.mark.parametrize("client,how", [("confluent", "sigkill"), ("confluent", "sigstop"),
                                        ("kafka-python", "sigkill")])
def test_silent_member_is_removed_after_session_timeout(broker_factory, registry, tmp_path, client, how):
    broker = broker_factory(GROUP_OVERRIDES)
    topic = unique_topic("session")
    create_topic(broker.bootstrap, topic, partitions=6)
    group = "g-" + topic
    a = Member("a", broker.bootstrap, group, topic)
    registry.append(a)
    wait_balanced([a], 6, [6])
    b = ProcMember.python(client, "b", broker.bootstrap, group, topic, tmp_path,
                          session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_ms=HEARTBEAT_MS)
    registry.append(b)
    wait_balanced([a, b], 6, [3, 3])

    t0 = time.monotonic()
    if how == "sigkill":
        b.kill9()      # connections close, no LeaveGroup
    else:
        b.sigstop()    # connections stay open, heartbeats stop
    wait_until(lambda: a.view()[0] == frozenset(range(6)) and a.view()[1], 30, interval=0.1,
               what="a to take over all partitions", on_timeout=lambda: f"{a!r}")
    took = a.view()[2] - t0
    # The member is dropped when its session expires, not before (a closed
    # connection is not a LeaveGroup), and not much after.
    assert took >= SESSION_TIMEOUT_MS / 1000 - 1.5, f"b removed {took:.2f}s after it went silent"
    assert took <= SESSION_TIMEOUT_MS / 1000 + 10, f"b removed only {took:.2f}s after it went silent"
    wait_balanced([a], 6, [6], stable_for=1.0)

    if how == "sigstop":
        # Woken up, b finds it was removed, rejoins, and the group rebalances.
        b.sigcont()
        wait_balanced([a, b], 6, [3, 3], timeout=45)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("leader", ["dynamic", "static"])
def test_static_member_restart_keeps_its_partitions_without_rebalance(broker_factory, registry, tmp_path,
                                                                      leader):
    """A static member killed and started again with its group.instance.id
    takes its place back: same partitions, no rebalance for the other member,
    whether the static member is a follower or the group's leader (KIP-345;
    the leader is answered with its old leader id, so it does not assign)."""
    broker = broker_factory(GROUP_OVERRIDES)
    topic = unique_topic("static")
    create_topic(broker.bootstrap, topic, partitions=6)
    group = "g-" + topic
    session_ms = 10000

    def static_b(name):
        m = ProcMember.python("confluent", name, broker.bootstrap, group, topic, tmp_path,
                              session_timeout_ms=session_ms, heartbeat_ms=HEARTBEAT_MS,
                              instance_id="b-static")
        registry.append(m)
        return m

    if leader == "dynamic":
        a = Member("a", broker.bootstrap, group, topic)  # first: the leader
        registry.append(a)
        wait_balanced([a], 6, [6])
        b1 = static_b("b1")
    else:
        b1 = static_b("b1")  # first: the leader
        wait_balanced([b1], 6, [6])
        a = Member("a", broker.bootstrap, group, topic)
        registry.append(a)
    before = wait_balanced([a, b1], 6, [3, 3])
    b1_member_id = [e for e in b1.events if e["event"] == "owned"][-1]["member_id"]

    t0 = time.monotonic()
    b1.kill9()
    b2 = static_b("b2")
    after = wait_balanced([a, b2], 6, [3, 3], timeout=session_ms / 1000 - 2, stable_for=0.5)
    took = time.monotonic() - t0
    assert took < session_ms / 1000 - 2, f"static member took {took:.1f}s to come back"
    assert after["b2"] == before["b1"] and after["a"] == before["a"], (before, after)
    b2_member_id = [e for e in b2.events if e["event"] == "owned"][-1]["member_id"]
    assert b2_member_id and b2_member_id != b1_member_id

    # No rebalance: a saw no callback, neither now nor when b1's session
    # would have expired.
    time.sleep(max(0.0, session_ms / 1000 + 2 - (time.monotonic() - t0)))
    assert a.events_since(t0) == [], a.events_since(t0)
    assert wait_balanced([a, b2], 6, [3, 3], stable_for=0.5) == after


@pytest.mark.timeout(120)
def test_second_instance_of_a_static_member_fences_the_first(broker_factory, registry, tmp_path):
    """Two consumers started with one group.instance.id: the newer takes the
    place, the older is told FENCED_INSTANCE_ID (librdkafka makes that a fatal
    error and stops) instead of the two taking turns."""
    broker = broker_factory(GROUP_OVERRIDES)
    topic = unique_topic("fence-static")
    create_topic(broker.bootstrap, topic, partitions=4)
    group = "g-" + topic

    def static(name):
        m = ProcMember.python("confluent", name, broker.bootstrap, group, topic, tmp_path,
                              session_timeout_ms=10000, heartbeat_ms=HEARTBEAT_MS,
                              instance_id="only-one")
        registry.append(m)
        return m

    s1 = static("s1")
    wait_balanced([s1], 4, [4])
    s2 = static("s2")

    def s1_fenced():
        with s1.lock:
            return [e for e in s1.events if e["event"] == "error"
                    and "fenced" in e.get("error", "").lower()]
    wait_until(s1_fenced, 30, interval=0.1, what="s1 fenced",
               on_timeout=lambda: f"events: {s1.events[-5:]}")
    assert "FENCED_INSTANCE_ID" in broker.log_text() or s1_fenced(), broker.log_tail()
    s1.errors.clear()  # expected: that is the point
    s1.kill9()
    assert wait_balanced([s2], 4, [4], stable_for=1.0) == {"s2": frozenset(range(4))}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_members_keep_their_generation_across_a_broker_restart(broker_factory, registry, how):
    """Membership is kept in the offsets log: after a restart (clean or
    kill -9) the members' heartbeats and commits are answered for their
    generation, so nobody rebalances, and a transactional copier's next
    TxnOffsetCommit is accepted (no UNKNOWN_MEMBER_ID, no aborted batch)."""
    broker = broker_factory(GROUP_OVERRIDES)
    topic = unique_topic("keep-gen")
    out = topic + "-out"
    create_topic(broker.bootstrap, topic, partitions=4)
    create_topic(broker.bootstrap, out, partitions=1)
    seed(broker.bootstrap, topic, 4, 20)
    group = "g-" + topic
    bs = broker.bootstrap
    a = Member("a", bs, group, topic)
    registry.append(a)
    b = Member("b", bs, group, topic)
    registry.append(b)
    wait_balanced([a, b], 4, [2, 2])

    # A transactional copier in a group of its own, driven from this thread.
    c = Consumer(group_conf(bs, group + "-copier", **{"isolation.level": "read_committed"}))
    c.subscribe([topic])
    txn_id = "copier-" + topic

    def copy_some(p, n, timeout=30):
        copied = 0
        deadline = time.monotonic() + timeout
        while copied < n and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            p.begin_transaction()
            p.produce(out, value=m.value())
            positions = [tp for tp in c.position(c.assignment()) if tp.offset >= 0]
            p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 30)
            p.commit_transaction(30)
            copied += 1
        return copied

    try:
        p = txn_producer(bs, txn_id)
        p.init_transactions(30)
        assert copy_some(p, 10) == 10
        # The producer goes before the broker does: a librdkafka transactional
        # producer whose broker restarts between AddOffsetsToTxn and
        # TxnOffsetCommit can wait forever (seen with every oncelog version).
        del p
        t0 = time.monotonic()
        if how == "kill9":
            broker.kill9()
            broker.start()
        else:
            broker.restart()
        # Straight after the restart, the consumer's group metadata (member
        # id, generation) from before it.
        p = txn_producer(bs, txn_id)
        p.init_transactions(30)
        assert copy_some(p, 10) == 10
        assert "TxnOffsetCommit refused" not in broker.log_text(since_last_start=True), \
            broker.log_tail()
        # Past a session timeout and more: still nobody rebalanced.
        time.sleep(SESSION_TIMEOUT_MS / 1000 + 3)
        assert a.events_since(t0) == [] and b.events_since(t0) == [], \
            (a.events_since(t0), b.events_since(t0))
        assert copy_some(p, 10) == 10
        del p
        assert a.errors == [] and b.errors == []
        # The copier's committed offsets cover the 30 records it copied.
        got = committed_offsets(bs, group + "-copier", topic, range(4))
        assert sum(o for o in got.values() if o > 0) == 30, got
    finally:
        c.close()


# ===================================================== 4. client interop

@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_librdkafka_kafka_python_and_java_members_share_a_group(
        broker_factory, registry, tmp_path, java_classpath, strategy):  # noqa: F811
    broker = broker_factory(GROUP_OVERRIDES)
    topic = unique_topic("interop")
    create_topic(broker.bootstrap, topic, partitions=6)
    group = "g-" + topic
    bs = broker.bootstrap

    rd = ProcMember.python("confluent", "librdkafka", bs, group, topic, tmp_path, strategy=strategy)
    registry.append(rd)
    wait_balanced([rd], 6, [6])
    kp = ProcMember.python("kafka-python", "kafka-python", bs, group, topic, tmp_path, strategy=strategy)
    registry.append(kp)
    wait_balanced([rd, kp], 6, [3, 3])
    jv = ProcMember.java(java_classpath, "java", bs, group, topic, tmp_path, strategy=strategy)
    registry.append(jv)
    wait_balanced([rd, kp, jv], 6, [2, 2, 2], timeout=90)

    # The first member (the leader so far) leaves; one of the others leads now.
    rd.close()
    assert rd.proc.returncode == 0, rd
    wait_balanced([kp, jv], 6, [3, 3])
    jv.close()
    assert jv.proc.returncode == 0, jv
    wait_balanced([kp], 6, [6])


# =========================================================== 5. admin API

@pytest.mark.timeout(150)
@both_modes("broker_factory")
def test_admin_list_describe_alter_delete_groups(broker_factory, registry):
    broker = broker_factory(GROUP_OVERRIDES)
    bs = broker.bootstrap
    topic = unique_topic("admin")
    create_topic(bs, topic, partitions=4)
    seed(bs, topic, 4, 10)
    live = "live-" + topic
    simple = "simple-" + topic

    a = Member("admin-a", bs, live, topic)
    b = Member("admin-b", bs, live, topic)
    registry += [a, b]
    shares = wait_balanced([a, b], 4, [2, 2])

    # A "simple" group: offsets committed by a consumer that never joins.
    s = Consumer(group_conf(bs, simple))
    s.commit(offsets=[TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 6)], asynchronous=False)
    s.close()

    ad = admin(bs)
    listing = ad.list_consumer_groups(request_timeout=15).result(30)
    assert not listing.errors, listing.errors
    by_id = {g.group_id: g for g in listing.valid}
    assert by_id[live].state == ConsumerGroupState.STABLE
    assert not by_id[live].is_simple_consumer_group
    assert by_id[simple].state == ConsumerGroupState.EMPTY
    assert by_id[simple].is_simple_consumer_group

    stable = ad.list_consumer_groups(request_timeout=15, states={ConsumerGroupState.STABLE}).result(30)
    assert live in {g.group_id for g in stable.valid}
    assert simple not in {g.group_id for g in stable.valid}

    desc = ad.describe_consumer_groups([live, simple], request_timeout=15)
    d = desc[live].result(30)
    assert d.group_id == live
    assert d.state == ConsumerGroupState.STABLE
    assert not d.is_simple_consumer_group
    assert d.partition_assignor == "range"
    assert d.coordinator.id in ({0} if broker.mode == "local" else {1, 2, 3}), d.coordinator
    assert sorted(m.client_id for m in d.members) == ["admin-a", "admin-b"]
    for m in d.members:
        mine = a if m.client_id == "admin-a" else b
        assert m.member_id == mine.member_id
        assert "127.0.0.1" in m.host, m.host
        assert {tp.partition for tp in m.assignment.topic_partitions} == shares[m.client_id]
        assert all(tp.topic == topic for tp in m.assignment.topic_partitions)
    ds = desc[simple].result(30)
    assert ds.state == ConsumerGroupState.EMPTY and ds.members == []

    res = ad.list_consumer_group_offsets([ConsumerGroupTopicPartitions(simple)])[simple].result(30)
    assert {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions} == \
        {(topic, 0): 4, (topic, 1): 6}
    res = ad.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(simple, [TopicPartition(topic, 0), TopicPartition(topic, 2)])]
    )[simple].result(30)
    assert tp_map(res.topic_partitions) == {0: 4, 2: -1001}

    # A group with members cannot be deleted.
    with pytest.raises(KafkaException) as e:
        ad.delete_consumer_groups([live], request_timeout=15)[live].result(30)
    assert e.value.args[0].code() == KafkaError.NON_EMPTY_GROUP, e.value

    a.close()
    b.close()
    wait_until(lambda: ad.describe_consumer_groups([live])[live].result(30).state == ConsumerGroupState.EMPTY,
               20, interval=0.1, what="the group to become empty after both members left")

    # Offsets of an empty group can be set from outside; a new member resumes there.
    altered = ad.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(live, [TopicPartition(topic, p, p + 1) for p in range(4)])]
    )[live].result(30)
    assert all(tp.error is None for tp in altered.topic_partitions), altered.topic_partitions
    res = ad.list_consumer_group_offsets([ConsumerGroupTopicPartitions(live)])[live].result(30)
    assert tp_map(res.topic_partitions) == {p: p + 1 for p in range(4)}
    c = Consumer(group_conf(bs, live, **{"auto.offset.reset": "error"}))
    c.subscribe([topic])
    got = consume_to_end(c, topic, {p: 10 for p in range(4)})
    c.close()
    assert {p: v[0] for p, v in got.items()} == {p: p + 1 for p in range(4)}

    for g, f in ad.delete_consumer_groups([live, simple], request_timeout=15).items():
        assert f.result(30) is None, g
    listing = ad.list_consumer_groups(request_timeout=15).result(30)
    assert not {live, simple} & {g.group_id for g in listing.valid}
    res = ad.list_consumer_group_offsets([ConsumerGroupTopicPartitions(simple)])[simple].result(30)
    assert [tp for tp in res.topic_partitions if tp.offset >= 0] == []
    with pytest.raises(KafkaException) as e:
        ad.delete_consumer_groups([live], request_timeout=15)[live].result(30)
    assert e.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND, e.value


@both_modes("broker_factory")
def test_offset_delete_follows_kafkas_rule_and_survives_kill9(broker_factory, registry):
    """OffsetDelete (kafka-python's delete_group_offsets, what
    `kafka-consumer-groups --delete-offsets` sends): with a live member
    subscribed to topic A, A's offsets stay (GROUP_SUBSCRIBED_TO_TOPIC) and
    B's go; an unknown topic is UNKNOWN_TOPIC_OR_PARTITION; once the member
    left, A's go; a group left with no offsets is gone (GROUP_ID_NOT_FOUND
    after). Run twice, nothing else moves; after kill -9 the deletes hold."""
    from kafka import TopicPartition as KTP
    from kafka import errors as kerr
    from kafka.admin import KafkaAdminClient
    broker = broker_factory(GROUP_OVERRIDES)
    bs = broker.bootstrap
    a_topic, b_topic = unique_topic("odel-a"), unique_topic("odel-b")
    create_topic(bs, a_topic, partitions=2)
    create_topic(bs, b_topic, partitions=1)
    seed(bs, a_topic, 2, 10)
    seed(bs, b_topic, 1, 10)
    group = "odel-" + a_topic
    other = "odel-other-" + a_topic
    s = Consumer(group_conf(bs, group))
    s.commit(offsets=[TopicPartition(a_topic, 0, 3), TopicPartition(a_topic, 1, 4),
                      TopicPartition(b_topic, 0, 5)], asynchronous=False)
    s.close()
    s = Consumer(group_conf(bs, other))
    s.commit(offsets=[TopicPartition(b_topic, 0, 9)], asynchronous=False)
    s.close()

    m = Member("odel-m", bs, group, a_topic)
    registry.append(m)
    wait_balanced([m], 2, [2])
    ka = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=30000)
    try:
        res = ka.delete_group_offsets(group, [KTP(a_topic, 0), KTP(b_topic, 0), KTP("no-such-topic", 0),
                                              KTP(b_topic, 7)])
        assert res[KTP(a_topic, 0)] is kerr.GroupSubscribedToTopicError, res
        assert res[KTP(b_topic, 0)] is kerr.NoError, res
        assert res[KTP("no-such-topic", 0)] is kerr.UnknownTopicOrPartitionError, res
        assert res[KTP(b_topic, 7)] is kerr.UnknownTopicOrPartitionError, res
        assert admin_committed(bs, group, a_topic, [0, 1]) == {0: 3, 1: 4}
        assert admin_committed(bs, group, b_topic, [0]) == {}
        assert admin_committed(bs, other, b_topic, [0]) == {0: 9}, "another group's offset moved"
        # twice: the same answer, nothing else moves
        assert ka.delete_group_offsets(group, [KTP(b_topic, 0)])[KTP(b_topic, 0)] is kerr.NoError
        assert admin_committed(bs, group, a_topic, [0, 1]) == {0: 3, 1: 4}

        m.close()
        ad = admin(bs)
        wait_until(lambda: ad.describe_consumer_groups([group])[group].result(30).state
                   == ConsumerGroupState.EMPTY, 20, interval=0.1,
                   what="the group to become empty after its member left")
        assert ka.delete_group_offsets(group, [KTP(a_topic, 0)])[KTP(a_topic, 0)] is kerr.NoError
        assert admin_committed(bs, group, a_topic, [0, 1]) == {1: 4}

        broker.kill9()
        broker.start()
        assert admin_committed(bs, group, a_topic, [0, 1]) == {1: 4}, "a deleted offset came back"
        assert admin_committed(bs, other, b_topic, [0]) == {0: 9}

        # kafka-python's old connection to the killed broker sits in its
        # reconnect backoff (NodeNotReadyError); a new client is what an
        # operator's next command would be.
        ka.close()
        ka = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=30000)
        assert ka.delete_group_offsets(group, [KTP(a_topic, 1)])[KTP(a_topic, 1)] is kerr.NoError
        listing = ad.list_consumer_groups(request_timeout=15).result(30)
        assert group not in {g.group_id for g in listing.valid}, "a group without offsets or members stayed"
        assert other in {g.group_id for g in listing.valid}
        with pytest.raises(kerr.GroupIdNotFoundError):
            ka.delete_group_offsets(group, [KTP(a_topic, 1)])
        with pytest.raises(kerr.GroupIdNotFoundError):
            ka.delete_group_offsets("never-" + group, [KTP(a_topic, 0)])
    finally:
        ka.close()


@both_modes("broker_factory")
def test_offset_delete_drops_pending_transactional_offsets(broker_factory):
    """A transaction's offsets for a partition are pending until its commit;
    OffsetDelete of that partition drops them too (as Kafka), so the commit
    that follows does not bring the offset back. The transaction's records
    are unaffected."""
    from kafka import TopicPartition as KTP
    from kafka import errors as kerr
    from kafka.admin import KafkaAdminClient
    broker = broker_factory(GROUP_OVERRIDES)
    bs = broker.bootstrap
    topic = unique_topic("odel-txn")
    create_topic(bs, topic, partitions=2)
    group = "odel-txn-" + topic
    p = txn_producer(bs, "odel-" + topic)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"in-txn", partition=0)
    c = Consumer(group_conf(bs, group))
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 11), TopicPartition(topic, 1, 12)],
                                  c.consumer_group_metadata(), 30)
    ka = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=30000)
    try:
        res = ka.delete_group_offsets(group, [KTP(topic, 0)])
        assert res[KTP(topic, 0)] is kerr.NoError, res
        p.commit_transaction(30)
    finally:
        ka.close()
        c.close()
    assert admin_committed(bs, group, topic, [0, 1]) == {1: 12}
    assert [v for _, v in read_partition(bs, topic, 0, 0, "read_committed", 2)] == [b"in-txn"]


@both_modes("broker_factory")
def test_a_deleted_topics_offsets_go_and_its_successor_starts_afresh(broker_factory):
    """DeleteTopics removes the groups' committed offsets of the topic (as
    Kafka's coordinator does): a topic created again under the name is read
    from auto.offset.reset, not from the old topic's offsets (which would
    skip its first records). Other topics' offsets stay; a group left with
    none is gone; kill -9 and restart change nothing."""
    broker = broker_factory(GROUP_OVERRIDES)
    bs = broker.bootstrap
    topic, keep = unique_topic("gone"), unique_topic("kept")
    create_topic(bs, topic, partitions=2)
    create_topic(bs, keep, partitions=1)
    only, both = "only-" + topic, "both-" + topic
    for g, offsets in ((only, [TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 6)]),
                       (both, [TopicPartition(topic, 0, 7), TopicPartition(keep, 0, 2)])):
        c = Consumer(group_conf(bs, g))
        c.commit(offsets=offsets, asynchronous=False)
        c.close()
    ad = admin(bs)
    ad.delete_topics([topic], operation_timeout=30)[topic].result(30)
    wait_until(lambda: topic not in ad.list_topics(timeout=10).topics, 20, interval=0.1,
               what="the topic to be gone")

    listing = {g.group_id for g in ad.list_consumer_groups(request_timeout=15).result(30).valid}
    assert only not in listing, "a group whose only offsets were the deleted topic's stayed"
    assert both in listing
    assert admin_committed(bs, both, keep, [0]) == {0: 2}

    create_topic(bs, topic, partitions=2)
    seed(bs, topic, 2, 10)
    broker.kill9()
    broker.start()
    assert admin_committed(bs, both, topic, [0, 1]) == {}
    assert admin_committed(bs, both, keep, [0]) == {0: 2}
    c = Consumer(group_conf(bs, only))
    c.subscribe([topic])
    got = consume_to_end(c, topic, {0: 10, 1: 10})
    c.close()
    assert {p: v[0] for p, v in got.items()} == {0: 0, 1: 0}, "the new topic was not read from its start"


@pytest.mark.timeout(240)
@both_modes("broker_factory")
def test_offsets_of_groups_without_members_expire(broker_factory, registry):
    """offsets.retention.minutes: a group without members loses its
    committed offsets once they are older than that; a group with a live
    member keeps them however old. In cluster mode also a group whose
    coordinator was killed (nobody coordinates it: the leased job's case).
    It takes a minute and a little more: offsets.retention.minutes counts
    whole minutes, as Kafka's does, and 1 is its least."""
    broker = broker_factory(dict(GROUP_OVERRIDES, **{"offsets.retention.minutes": 1,
                                                     "offsets.retention.check.interval.ms": 1000}))
    bs = broker.bootstrap
    topic = unique_topic("expire")
    create_topic(bs, topic, partitions=3)
    seed(bs, topic, 3, 5)
    idle, live, orphan = ("idle-" + topic, "live-" + topic, "orphan-" + topic)
    for g, p in ((idle, 0), (live, 1), (orphan, 2)):
        c = Consumer(group_conf(bs, g))
        c.commit(offsets=[TopicPartition(topic, p, p + 1)], asynchronous=False)
        c.close()
    t0 = time.monotonic()
    # the live group's offset is as old as the others; its member stays
    m = Member("expire-m", bs, live, topic)
    registry.append(m)
    wait_balanced([m], 3, [3])
    if broker.mode == "cluster":
        host, port = kw.find_coordinator(broker.host, broker.port, orphan)
        victim = next(b for b in broker.brokers if b.port == port)
        victim.kill9()

    wait_until(lambda: admin_committed(bs, idle, topic, [0]) == {}, 150, interval=2,
               what="the idle group's offset to expire")
    assert time.monotonic() - t0 >= 50, "an offset expired before offsets.retention.minutes"
    if broker.mode == "cluster":
        wait_until(lambda: admin_committed(bs, orphan, topic, [2]) == {}, 90, interval=2,
                   what="the offset of a group nobody coordinates to expire")
    assert admin_committed(bs, live, topic, [1]) == {1: 2}, "a live member's group lost its offset"
    ad = admin(bs)
    listing = {g.group_id for g in ad.list_consumer_groups(request_timeout=15).result(30).valid}
    assert idle not in listing and live in listing, listing


# =================================================== 6. S7 copier loop

class OutputReader(threading.Thread):
    """A read_committed reader of every partition of a topic from offset 0,
    running for the whole scenario: it must never see a record twice, nor
    one from an aborted transaction."""

    def __init__(self, bootstrap, topic, partitions):
        super().__init__(daemon=True)
        self.c = Consumer(consumer_config(bootstrap, **{"isolation.level": "read_committed"}))
        self.c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.values = {p: [] for p in range(partitions)}
        self.errors = []
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self):
        try:
            while not self.stop.is_set():
                for m in self.c.consume(1000, timeout=0.2):
                    if m.error():
                        self.errors.append(str(m.error()))
                        continue
                    with self.lock:
                        self.values[m.partition()].append(m.value())
        finally:
            self.c.close()

    def count(self):
        with self.lock:
            return sum(len(v) for v in self.values.values())


@pytest.mark.timeout(480)
@both_modes("broker_factory")
def test_s7_copier_killed_and_fenced_copies_exactly_once(broker_factory, registry, tmp_path):
    """S7: a consume-transform-produce copier killed and fenced while it
    copies; the output is the input exactly once. About a minute (longer
    than 60 s) because the copy must outlast every kill and the fence: with
    fewer records they would land after the copy ends and prove nothing."""
    broker = broker_factory(GROUP_OVERRIDES)
    bs = broker.bootstrap
    # Enough records that every kill and the fence land mid-copy (the
    # aborted-records check below says so); a cluster commits each
    # transaction in PostgreSQL (its flush interval and a round trip), so
    # it copies fewer. ONCELOG_S7_RECORDS=200000 for a longer run.
    default_n = "25000" if broker.mode == "local" else "15000"
    n = int(os.environ.get("ONCELOG_S7_RECORDS", default_n))
    parts = 3
    inp = unique_topic("s7-in")
    out = unique_topic("s7-out")
    create_topic(bs, inp, partitions=parts)
    create_topic(bs, out, partitions=parts)
    group = "s7-copier-" + inp
    txn_id = "s7-copier-" + inp

    # Small batches, so the copier's fetches interleave the partitions.
    p = Producer(producer_config(bs, **{"batch.num.messages": 200}))
    expected = {q: [] for q in range(parts)}
    for i in range(n):
        q = i % parts
        v = f"rec-{q}-{i:06d}".encode()
        p.produce(inp, key=b"k%d" % i, value=v, partition=q)
        expected[q].append(b"out:" + v)
        if i % 1000 == 0:
            p.poll(0)
    flush_all(p)
    ends = {q: len(expected[q]) for q in range(parts)}

    reader = OutputReader(bs, out, parts)
    reader.start()
    registry.append(reader)

    logs = []

    def start_copier():
        log = tmp_path / f"copier-{len(logs)}.log"
        logs.append(log)
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                [sys.executable, str(COPIER), "--bootstrap", bs, "--group", group,
                 "--txn-id", txn_id, "--input", inp, "--output", out,
                 "--session-timeout-ms", str(SESSION_TIMEOUT_MS), "--txn-sleep-ms", "25"],
                stdin=subprocess.DEVNULL, stdout=f, stderr=f, cwd=str(TESTS_DIR),
                preexec_fn=_die_with_parent)
        registry.append(proc)
        proc.log = log
        return proc

    def tail(proc, lines=25):
        return "\n".join(proc.log.read_text(errors="replace").splitlines()[-lines:])

    def committed_now():
        return {q: o for q, (o, err) in offset_fetch(broker, group, inp, list(range(parts)), False).items()}

    seed_ = int(os.environ.get("ONCELOG_S7_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed_)
    print(f"S7: {n} records, random seed {seed_}")

    primary = start_copier()
    kills = 0
    fenced = 0
    plan = [("kill", 0.08), ("kill", 0.20), ("fence", 0.35), ("kill", 0.50), ("kill", 0.65), ("kill", 0.85)]
    for action, frac in plan:
        target = int(frac * n)

        def progressed():
            if primary.poll() is not None:
                pytest.fail(f"copier exited with {primary.returncode} on its own:\n{tail(primary)}")
            if reader.errors:
                pytest.fail(f"output reader errors: {reader.errors}")
            return reader.count() >= target
        wait_until(progressed, 90, interval=0.02, what=f"copier progress {target}/{n}",
                   on_timeout=lambda: f"at {reader.count()}, log:\n{tail(primary)}")
        time.sleep(rng.uniform(0.0, 0.3))
        if action == "kill":
            primary.send_signal(signal.SIGKILL)
            assert primary.wait(10) == -signal.SIGKILL
            kills += 1
            print(f"S7: kill #{kills} at {reader.count()} copied")
            primary = start_copier()
        else:
            zombie = primary
            primary = start_copier()
            try:
                rc = zombie.wait(60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the first copier was not fenced within 60s:\n{tail(zombie)}\n"
                            f"--- new copier:\n{tail(primary)}")
            assert rc == 3, f"fenced copier exited {rc}, expected 3 (fenced):\n{tail(zombie)}"
            assert "FENCED" in zombie.log.read_text(), tail(zombie)
            fenced += 1
            print(f"S7: fenced the running copier at {reader.count()} copied")

    def done():
        if primary.poll() is not None:
            pytest.fail(f"copier exited with {primary.returncode} on its own:\n{tail(primary)}")
        return reader.count() >= n and committed_now() == ends
    wait_until(done, 120, interval=0.2, what="the copier to finish",
               on_timeout=lambda: f"{reader.count()}/{n} copied, committed {committed_now()} of "
                                  f"{ends}; log:\n{tail(primary)}")
    primary.send_signal(signal.SIGTERM)
    assert primary.wait(30) == 0, tail(primary)
    time.sleep(1.0)  # let the reader drain anything (that must not be there)
    reader.stop.set()
    reader.join(15)

    assert kills >= 5 and fenced == 1
    assert not reader.errors, reader.errors
    for q in range(parts):
        got = reader.values[q]
        assert len(got) == len(set(got)), f"partition {q}: the concurrent reader saw duplicates"
        assert got == expected[q], \
            f"partition {q}: {len(got)} records seen, {len(expected[q])} expected; first difference at " \
            f"{next((i for i, (x, y) in enumerate(zip(got, expected[q])) if x != y), min(len(got), len(expected[q])))}"
    # A fresh read_committed pass agrees, and the group's lag is zero.
    aborted = 0
    for q in range(parts):
        end = lso(bs, out, q)
        fresh = [v for _, v in read_partition(bs, out, q, 0, "read_committed", end, timeout=60)]
        assert fresh == expected[q], f"partition {q}: fresh read_committed pass differs"
        everything = [v for _, v in read_partition(bs, out, q, 0, "read_uncommitted", end, timeout=60)]
        extra = len(everything) - len(fresh)
        assert extra >= 0 and set(everything) == set(expected[q]), f"partition {q}: stray records"
        aborted += extra
    # The kills and the fencing cut transactions short after their records
    # were written: those records exist, read_committed never showed them.
    print(f"S7: {aborted} records of aborted transactions in the output")
    assert aborted > 0, "no kill landed inside a transaction"
    assert committed_offsets(bs, group, inp, range(parts)) == ends
    assert offset_fetch(broker, group, inp, list(range(parts)), True) == {q: (ends[q], 0) for q in range(parts)}
    assert "fenced" in broker.log_text().lower()


# ====================================== 7. pending transactional offsets

@pytest.mark.timeout(120)
@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_new_member_waits_for_pending_transactional_offsets(broker_factory, registry, outcome):
    broker = broker_factory(GROUP_OVERRIDES)
    bs = broker.bootstrap
    topic = unique_topic("unstable")
    out = unique_topic("unstable-out")
    create_topic(bs, topic)
    create_topic(bs, out)
    seed(bs, topic, 1, 10)
    group = "g-" + topic

    # The owner: a member of the group that has read offsets 0..6 and
    # committed 3 the ordinary way.
    owner = Consumer(group_conf(bs, group, **{"isolation.level": "read_committed"}))
    owner.subscribe([topic])
    seen = []
    deadline = time.monotonic() + 30
    while not seen or seen[-1] < 6:
        assert time.monotonic() < deadline, f"owner read only {seen}"
        m = owner.poll(0.2)
        if m is not None:
            assert m.error() is None, m.error()
            seen.append(m.offset())
    assert seen[:7] == list(range(7))
    owner.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    assert offset_fetch(broker, group, topic, [0], True) == {0: (3, 0)}

    # Its transactional producer adds offset 7 to a transaction, which stays open.
    p = txn_producer(bs, "unstable-" + topic)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(out, value=b"derived-from-3..6", partition=0)
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], owner.consumer_group_metadata(), 30)
    p.flush(30)
    assert offset_fetch(broker, group, topic, [0], False) == {0: (3, 0)}, \
        "pending transactional offsets must not be visible"
    assert offset_fetch(broker, group, topic, [0], True) == {0: (-1, UNSTABLE_OFFSET_COMMIT)}
    owner.close()  # the owner leaves the group; its transaction is still open

    # A new member gets the partition, but must not start while the offsets are unstable.
    n = Member("new", bs, group, topic, **{"isolation.level": "read_committed",
                                            "auto.offset.reset": "error"})
    registry.append(n)
    wait_balanced([n], 1, [1], timeout=30, stable_for=0.5)
    time.sleep(3.0)
    assert n.records == [], f"the new member started before the transaction ended: {n.records[:3]}"
    assert not n.errors, n.errors
    assert offset_fetch(broker, group, topic, [0], True) == {0: (-1, UNSTABLE_OFFSET_COMMIT)}

    if outcome == "commit":
        p.commit_transaction(30)
        start = 7
    else:
        p.abort_transaction(30)
        start = 3
    wait_until(lambda: n.record_offsets(0)[-1:] == [9], 30, interval=0.1,
               what="the new member to read up to offset 9",
               on_timeout=lambda: f"{n!r} {n.record_offsets(0)}")
    assert n.record_offsets(0) == list(range(start, 10))
    assert not n.errors, n.errors
    assert offset_fetch(broker, group, topic, [0], True) == {0: (start, 0)}
    assert offset_fetch(broker, group, topic, [0], False) == {0: (start, 0)}
    derived = read_partition(bs, out, 0, 0, "read_committed", lso(bs, out, 0))
    assert [v for _, v in derived] == ([b"derived-from-3..6"] if outcome == "commit" else [])
