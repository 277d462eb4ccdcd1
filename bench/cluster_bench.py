#!/usr/bin/env python3
"""Cluster mode against local mode (and Tansu on the same PostgreSQL), in one
run: durable produce throughput and ack latency (acks=all, idempotent,
closed loop, benchlib's load) for

  local      `oncelog serve` on a local data dir (fsync before ack);
  cluster-1  one `oncelog serve --cluster` broker over PostgreSQL and S3;
  cluster-3  three of them (bootstrap list of all three);
  cluster-N-file  the same over a shared directory (file://) instead of S3;
  tansu      `tansu broker --storage-engine postgres://…` (with --tansu PATH),
             on the same PostgreSQL server, its own database.

Per load, from PostgreSQL's own counters (pg_stat_database.xact_commit of the
load's database, deltas around the load) and the brokers' /metrics
(oncelog_cluster_object_puts_total): PostgreSQL transactions and object PUTs
per GB written — the cost drivers on a cloud bill — and the brokers' produce
commit p99 (oncelog_cluster_commit_seconds, bucket bound) beside the ack p99
to check the goal ack p99 <= cluster.flush.ms + 2 x commit p99.

The closed loop measures the peak; its ack latency includes queueing in the
client at saturation. So each run also starts every configuration afresh for
two open-loop loads below the peaks: produce ack latency at --ack-rate (the
wire generator, latency from when each request was due — the goal is checked
on this one) and read_committed end-to-end latency at --e2e-rate
(transactional producers committing every --e2e-commit-ms, one
read_committed consumer, latency from the scheduled send to the read).

PostgreSQL and the S3 server (s3proxy) come from the ONCELOG_TEST_* environment
of `scripts/services.sh start DIR`, or are started here and stopped at the end.
Everything listens on 127.0.0.1; every broker is stopped by PID; each load is
bounded by --warmup + --seconds plus a flush timeout. Medians of --runs runs.

    .venv/bin/python bench/cluster_bench.py --runs 3 --seconds 8 --json /tmp/cluster-bench.json
    .venv/bin/python bench/cluster_bench.py --tansu ~/.cargo/bin/tansu --tansu-schema 010-schema.sql

Hosts apart: --pg-delay-ms D and --s3-delay-ms D put a TCP delay proxy
(tests/faultproxy.py, D ms each way) between the brokers and PostgreSQL or
the S3 server, as hosts of one cloud region are apart (2 ms and 20 ms, say).
With --pg-delay-ms (0 included) the run also counts the brokers' PostgreSQL
round trips (request/response turn-arounds through the proxy) per flush.

    .venv/bin/python bench/cluster_bench.py --configs cluster-1,cluster-3 --pg-delay-ms 2 --s3-delay-ms 20

--idle-seconds S measures, before each cluster load, what the idle brokers
ask of PostgreSQL per broker per second (transactions; round trips too with
--pg-delay-ms). --tailing-consumers N then measures, for as long, what N
caught-up read_committed consumers add to that, per consumer per second.

Tansu: `cargo install tansu --locked --features postgres` (0.6.0 measured);
its schema is etc/initdb.d/010-schema.sql of Tansu's repository at the same
tag (`git show v0.6.0:etc/initdb.d/010-schema.sql`).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import GB  # noqa: E402
from benchlib.brokers import Oncelog, TansuPeer, exit_on_signal, stop_live_brokers  # noqa: E402
from benchlib.load import closed_loop_load, create_topic, e2e_load  # noqa: E402
from benchlib.brokers import hist_quantile  # noqa: E402
from produce_bench import ROOT  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests"))
from faultproxy import FaultProxy  # noqa: E402

SERVICES = os.path.join(ROOT, "scripts", "services.sh")


def services(base):
    """ONCELOG_TEST_* settings, and a callback that stops what was started."""
    if os.environ.get("ONCELOG_TEST_PG") and os.environ.get("ONCELOG_TEST_S3_ENDPOINT"):
        return dict(os.environ), lambda: None
    out = subprocess.run(["bash", SERVICES, "start", base], check=True, capture_output=True, text=True,
                         timeout=180).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        for part in line.removeprefix("export ").split():
            k, _, v = part.partition("=")
            env[k] = v
    return env, lambda: subprocess.run(["bash", SERVICES, "stop", base], check=False, timeout=120)


def psql(url, query, *args):
    import psycopg
    with psycopg.connect(url, autocommit=True) as c:
        cur = c.execute(query, args)
        return cur.fetchall() if cur.description else []


def fresh_db(env):
    name = f"bench_{uuid.uuid4().hex[:12]}"
    psql(env["ONCELOG_TEST_PG"], f"CREATE DATABASE {name}")
    return name, env["ONCELOG_TEST_PG"].rsplit("/", 1)[0] + "/" + name


def xact_commits(env, db):
    return psql(env["ONCELOG_TEST_PG"], "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", db)[0][0]


def pg_work(env, db):
    """(rows written: inserted + updated + deleted in the load's database,
    WAL bytes of the whole instance), PostgreSQL's own counters."""
    rows = psql(env["ONCELOG_TEST_PG"], "SELECT tup_inserted + tup_updated + tup_deleted "
                "FROM pg_stat_database WHERE datname = %s", db)[0][0]
    wal = psql(env["ONCELOG_TEST_PG"], "SELECT wal_bytes FROM pg_stat_wal")[0][0]
    return int(rows), int(wal)


class Brokers:
    """Several oncelog brokers seen as one by benchlib's load: the bootstrap
    list of all, /metrics summed, CPU and RSS of the first."""

    def __init__(self, members, proxies=()):
        self.members = members
        self.bootstrap = ",".join(m.bootstrap for m in members)
        # (name, FaultProxy) between the brokers and PostgreSQL or S3
        self.proxies = dict(proxies)

    def pg_round_trips(self):
        p = self.proxies.get("pg")
        return p.turns if p is not None else None

    pid = property(lambda self: self.members[0].pid)

    def metrics(self):
        total = {}
        for m in self.members:
            for k, v in m.metrics().items():
                total[k] = total.get(k, 0.0) + v
        return total

    def stop(self):
        for m in self.members:
            m.stop()
        for p in self.proxies.values():
            p.close()


def apart(url_host, url_port, delay_ms):
    """A FaultProxy to host:port `delay_ms` away, each way."""
    return FaultProxy(url_host, url_port, delay_ms=delay_ms)


def start_config(kind, a, env, tmp, run):
    """Starts one configuration; returns (target, database name or None)."""
    d = os.path.join(tmp, f"{kind}-r{run}")
    os.makedirs(d, exist_ok=True)
    if kind == "local":
        b = Oncelog(a.binary, os.path.join(d, "data"), os.path.join(d, "broker.log"))
        b.start()
        return Brokers([b]), None
    if kind == "tansu":
        db, url = fresh_db(env)
        # Tansu's PostgreSQL engine expects its schema in place (its
        # release ships it as an initdb script, not as a migration)
        import psycopg
        with open(a.tansu_schema) as f, psycopg.connect(url, autocommit=True) as c:
            c.execute(f.read())
        proxy = None
        if a.pg_delay_ms is not None:  # the same distance as the brokers'
            from urllib.parse import urlsplit
            u = urlsplit(url)
            proxy = apart(u.hostname, u.port or 5432, a.pg_delay_ms)
            auth = u.netloc.rsplit("@", 1)[0] + "@" if "@" in u.netloc else ""
            url = f"{u.scheme}://{auth}127.0.0.1:{proxy.port}{u.path}"
        t = TansuPeer(a.tansu, d, url)
        t.start()
        if proxy is not None:
            stop = t.stop

            def stop_both():
                stop()
                proxy.close()
            t.stop = stop_both
        return t, db
    n = int(kind.split("-")[1])
    db, url = fresh_db(env)
    store = f"s3://{env['ONCELOG_TEST_S3_BUCKET']}/bench-{uuid.uuid4().hex[:12]}"
    if kind.endswith("-file"):  # a shared directory instead of S3
        store = f"file://{d}/objects"
        os.makedirs(f"{d}/objects", exist_ok=True)
    from urllib.parse import urlsplit
    proxies = []
    if a.pg_delay_ms is not None:
        u = urlsplit(url)
        pg = apart(u.hostname, u.port or 5432, a.pg_delay_ms)
        proxies.append(("pg", pg))
        auth = u.netloc.rsplit("@", 1)[0] + "@" if "@" in u.netloc else ""
        url = f"{u.scheme}://{auth}127.0.0.1:{pg.port}{u.path}"
    endpoint = env["ONCELOG_TEST_S3_ENDPOINT"]
    if a.s3_delay_ms is not None and not kind.endswith("-file"):
        u = urlsplit(endpoint)
        s3 = apart(u.hostname, u.port, a.s3_delay_ms)
        proxies.append(("s3", s3))
        endpoint = f"http://127.0.0.1:{s3.port}"
    os.environ.update({"AWS_ENDPOINT": endpoint,
                       "AWS_ACCESS_KEY_ID": env["ONCELOG_TEST_S3_KEY"],
                       "AWS_SECRET_ACCESS_KEY": env["ONCELOG_TEST_S3_SECRET"],
                       "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"})
    members = []
    for i in range(1, n + 1):
        b = Oncelog(a.binary, os.path.join(d, f"data{i}"), os.path.join(d, f"broker{i}.log"),
                    settings=[f"node.id={i}", f"cluster.postgres={url}", f"cluster.object.store={store}",
                              f"cluster.flush.ms={a.flush_ms}"])
        b.start()
        members.append(b)
    return Brokers(members, proxies), db


def one_run(kind, a, env, tmp, run):
    target, db = start_config(kind, a, env, tmp, run)
    idle = {}
    try:
        if a.idle_seconds and isinstance(target, Brokers):
            idle = idle_floor(target, env, db, a.idle_seconds)
            if a.tailing_consumers:
                tail = tailing_consumers(target, env, db, a.idle_seconds, a.tailing_consumers, a.partitions)
                # above the floor: what the consumers themselves cost
                for k, base in (("tail_pg_xacts_per_consumer_s", "idle_pg_xacts_per_broker_s"),
                                ("tail_pg_round_trips_per_consumer_s", "idle_pg_round_trips_per_broker_s")):
                    if k in tail:
                        tail[k] -= idle[base] * len(target.members) / a.tailing_consumers
                idle.update(tail)
        x0 = xact_commits(env, db) if db else None
        w0 = pg_work(env, db) if db else None
        m0 = target.metrics()
        t0 = target.pg_round_trips() if isinstance(target, Brokers) else None
        r = closed_loop_load(target, f"bench-{kind}-{run}", a.size, a.partitions, a)
        t1 = target.pg_round_trips() if isinstance(target, Brokers) else None
        m1 = target.metrics()
        x1 = xact_commits(env, db) if db else None
        w1 = pg_work(env, db) if db else None
    finally:
        target.stop()
    gb = r["acked"] * a.size / GB
    row = {"kind": kind, "run": run, "msgs_per_s": r["msgs_per_s"], "mb_per_s": r["mb_per_s"],
           "ack_p50_ms": r["ack_p50_ms"], "ack_p99_ms": r["ack_p99_ms"], "acked": r["acked"],
           "errors": r["errors"], "last_error": r["last_error"], "gb": gb}
    row.update(idle)
    if x0 is not None:
        row["pg_xacts"] = x1 - x0
        row["pg_xacts_per_gb"] = (x1 - x0) / gb if gb else None
        row["pg_rows_per_gb"] = (w1[0] - w0[0]) / gb if gb else None
        row["pg_wal_bytes_per_gb"] = (w1[1] - w0[1]) / gb if gb else None
    gets = m1.get("oncelog_cluster_object_gets_total", 0) - m0.get("oncelog_cluster_object_gets_total", 0)
    puts = m1.get("oncelog_cluster_object_puts_total", 0) - m0.get("oncelog_cluster_object_puts_total", 0)
    if kind.startswith("cluster"):
        row["object_puts"] = puts
        row["object_puts_per_gb"] = puts / gb if gb else None
        row["object_gets_per_gb"] = gets / gb if gb else None
        row.update(cluster_histograms(m0, m1))
        if t0 is not None:
            row["pg_round_trips"] = t1 - t0
            row["pg_round_trips_per_flush"] = (t1 - t0) / row["flushes"] if row["flushes"] else None
            row["pg_round_trips_per_gb"] = (t1 - t0) / gb if gb else None
    return row


def idle_floor(target, env, db, seconds):
    """What idle brokers ask of PostgreSQL: transactions (and round trips,
    through the delay proxy) per broker per second over `seconds` with no
    client, after a few seconds to settle."""
    time.sleep(3)
    x0, t0 = xact_commits(env, db), target.pg_round_trips()
    time.sleep(seconds)
    x1, t1 = xact_commits(env, db), target.pg_round_trips()
    n = len(target.members) * seconds
    row = {"idle_pg_xacts_per_broker_s": (x1 - x0) / n}
    if t0 is not None:
        row["idle_pg_round_trips_per_broker_s"] = (t1 - t0) / n
    return row


def tailing_consumers(target, env, db, seconds, consumers, partitions):
    """What caught-up consumers ask of PostgreSQL: `consumers`
    read_committed consumers, each in its own group, tail one topic of
    `partitions` partitions with nothing new for `seconds` (librdkafka's
    long polls, fetch.wait.max.ms 500); PostgreSQL transactions and round
    trips per consumer per second above the idle floor measured just
    before."""
    import threading
    from confluent_kafka import Consumer
    topic = f"tail-{uuid.uuid4().hex[:8]}"
    create_topic(target.bootstrap, topic, partitions)
    time.sleep(2)
    stop = threading.Event()

    def tail(k):
        c = Consumer({"bootstrap.servers": target.bootstrap, "group.id": f"tail-{k}-{topic}",
                      "isolation.level": "read_committed", "auto.offset.reset": "latest",
                      "enable.auto.commit": False})
        c.subscribe([topic])
        while not stop.is_set():
            c.poll(0.2)
        c.close()
    threads = [threading.Thread(target=tail, args=(k,), daemon=True) for k in range(consumers)]
    for t in threads:
        t.start()
    time.sleep(8)  # joined and caught up
    floor = idle_floor(target, env, db, seconds)  # settles 3 s, then measures
    stop.set()
    for t in threads:
        t.join(10)
    row = {"tail_pg_xacts_per_consumer_s": floor["idle_pg_xacts_per_broker_s"] * len(target.members) / consumers}
    if "idle_pg_round_trips_per_broker_s" in floor:
        row["tail_pg_round_trips_per_consumer_s"] = (
            floor["idle_pg_round_trips_per_broker_s"] * len(target.members) / consumers)
    return row


def cluster_histograms(m0, m1):
    """The brokers' PUT, produce-commit and ack latency over a load (bucket
    upper bounds, ms) and their flush count."""
    row = {}
    for name, key in (("oncelog_cluster_commit_seconds", "pg_commit"),
                      ("oncelog_cluster_object_put_seconds", "put"),
                      ("oncelog_cluster_ack_seconds", "broker_ack")):
        for qq in (0.5, 0.99):
            q = hist_quantile(m0, m1, name, "", qq)
            row[f"{key}_p{int(qq * 100)}_le_ms"] = q * 1000 if q is not None else None
    row["flushes"] = (m1.get("oncelog_cluster_flushes_total", 0)
                      - m0.get("oncelog_cluster_flushes_total", 0))
    return row


def latency_run(kind, a, env, tmp, run):
    """Open loop, below every configuration's peak: produce ack latency at
    --ack-rate (the wire generator, a request every --ack-linger-ms per
    producer, latency from when each request was due), then read_committed
    end-to-end latency at --e2e-rate (transactional producers committing
    every --e2e-commit-ms and a read_committed consumer), on a fresh start of
    the configuration."""
    target, _db = start_config(kind, a, env, tmp, f"{run}-lat")
    row = {"kind": kind, "run": run}
    try:
        if a.ack_rate:
            m0 = target.metrics()
            r = closed_loop_load(target, f"ack-{kind}-{run}", a.size, a.partitions, a, client="wire",
                                 rate=a.ack_rate, linger_ms=a.ack_linger_ms)
            m1 = target.metrics()
            row.update({"ack_rate_msgs_per_s": r["msgs_per_s"], "ack_errors": r["errors"],
                        "ack_last_error": r["last_error"]})
            row.update({f"open_{k}": r[k] for k in ("ack_p50_ms", "ack_p99_ms", "ack_p999_ms")})
            if kind.startswith("cluster"):
                h = cluster_histograms(m0, m1)
                row.update({f"open_{k}": v for k, v in h.items()})
                c99 = h["pg_commit_p99_le_ms"]
                row["goal_ms"] = a.flush_ms + 2 * c99 if c99 is not None else None
        r = None
        if a.e2e_rate:
            try:
                r = e2e_load(target, f"e2e-{kind}-{run}", a.size, a.partitions, a, a.e2e_rate, a.e2e_commit_ms,
                             a.e2e_linger_ms, f"bench-{uuid.uuid4().hex[:8]}")
            except RuntimeError as e:  # a peer without transactions
                row["e2e_failed"] = str(e)
        if r is not None:
            row.update({"e2e_rate_msgs_per_s": r["achieved_msgs_per_s"], "e2e_errors": r["errors"],
                        "e2e_consumed": r["consumed_window"], "e2e_produced": r["produced_window"],
                        "e2e_last_error": r["last_error"]})
            row.update({k: r[k] for k in ("e2e_p50_ms", "e2e_p99_ms", "e2e_p999_ms", "commit_p50_ms",
                                          "commit_p99_ms")})
    finally:
        target.stop()
    return row


def med(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, spec):
    """`v` in `spec`; a missing figure is a dash of the same width."""
    if v is None:
        width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
        return "-".rjust(int(width)) if width else "-"
    return format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.environ.get("ONCELOG_BIN", os.path.join(ROOT, "target/release/oncelog")))
    ap.add_argument("--tansu", default=None, metavar="PATH", help="also run Tansu on the same PostgreSQL")
    ap.add_argument("--tansu-schema", default=None, metavar="SQL",
                    help="Tansu's PostgreSQL schema: etc/initdb.d/010-schema.sql of its repository at the tag of "
                         "the installed version, applied to Tansu's fresh database")
    ap.add_argument("--configs", default="local,cluster-1,cluster-3")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--client", choices=("python", "native"), default="python")
    ap.add_argument("--linger-ms", type=float, default=5)
    ap.add_argument("--flush-ms", type=int, default=5, help="cluster.flush.ms of the cluster brokers")
    ap.add_argument("--queue-msgs", type=int, default=200_000)
    ap.add_argument("--queue-kb", type=int, default=16_384)
    ap.add_argument("--flush-timeout", type=float, default=60)
    ap.add_argument("--ack-rate", type=float, default=2000,
                    help="msgs/s of the open-loop ack latency run (0: none)")
    ap.add_argument("--ack-linger-ms", type=float, default=10.0,
                    help="the wire generator's request interval per producer in the ack run: an idempotent "
                         "producer keeps at most 5 requests in flight, so 5 intervals must exceed the ack latency "
                         "or requests wait in the client")
    ap.add_argument("--e2e-rate", type=float, default=1000,
                    help="msgs/s of the read_committed end-to-end run (0: none)")
    ap.add_argument("--e2e-commit-ms", type=float, default=100)
    ap.add_argument("--e2e-linger-ms", type=float, default=5)
    ap.add_argument("--pg-delay-ms", type=float, default=None,
                    help="PostgreSQL this many ms away each way (a delay proxy); also counts round trips")
    ap.add_argument("--s3-delay-ms", type=float, default=None,
                    help="the S3 server this many ms away each way (a delay proxy)")
    ap.add_argument("--idle-seconds", type=float, default=0,
                    help="before each cluster load, measure the idle brokers' PostgreSQL transactions "
                         "(and round trips, with --pg-delay-ms) per broker per second over this long")
    ap.add_argument("--tailing-consumers", type=int, default=0,
                    help="with --idle-seconds: then this many caught-up read_committed consumers (each its "
                         "own group, one topic of --partitions partitions) for as long; their PostgreSQL "
                         "transactions and round trips per consumer per second above the idle floor")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    a.client_cpus = None
    configs = [c for c in a.configs.split(",") if c]
    if a.tansu:
        if not a.tansu_schema or not os.path.isfile(a.tansu_schema):
            ap.error("--tansu needs --tansu-schema (Tansu's etc/initdb.d/010-schema.sql)")
        if os.access(a.tansu, os.X_OK):
            configs.append("tansu")
        else:
            print(f"Tansu: no executable at {a.tansu}; skipped", flush=True)
    import signal
    signal.signal(signal.SIGTERM, exit_on_signal)
    tmp = tempfile.mkdtemp(dir=os.path.join(ROOT, "target"), prefix="cluster-bench-")
    # PostgreSQL runs as its own user, who must pass through to services/
    # (mkdtemp makes the directory 0700)
    os.chmod(tmp, 0o711)
    a.tmp = tmp
    private = os.path.join(tmp, "oncelog-under-test")
    shutil.copy2(a.binary, private)
    a.binary = private
    env, stop_services = services(os.path.join(tmp, "services"))
    rows, lat_rows = [], []
    try:
        for run in range(a.runs):
            for kind in configs:  # interleaved, so drift on the machine hits every config
                row = one_run(kind, a, env, tmp, run)
                rows.append(row)
                print(f"  run {run} {kind:14} {row['msgs_per_s']:9.0f} msgs/s  ack p99 {row['ack_p99_ms']:7.1f} ms"
                      + (f"  pg xacts/GB {row['pg_xacts_per_gb']:.0f}" if row.get("pg_xacts_per_gb") else "")
                      + (f"  PUTs/GB {row['object_puts_per_gb']:.0f}" if row.get("object_puts_per_gb") else "")
                      + (f"  PUT p50/p99 <= {row['put_p50_le_ms']}/{row['put_p99_le_ms']} ms, commit p50/p99 <= "
                         f"{row['pg_commit_p50_le_ms']}/{row['pg_commit_p99_le_ms']} ms, {row['flushes']:.0f} flushes"
                         if "flushes" in row else "")
                      + (f"  PG round trips/flush {row['pg_round_trips_per_flush']:.2f}"
                         if row.get("pg_round_trips_per_flush") is not None else "")
                      + (f"  errors {row['errors']}" if row["errors"] else ""), flush=True)
                if "idle_pg_xacts_per_broker_s" in row:
                    print(f"  run {run} {kind:14} idle, per broker per second: "
                          f"{row['idle_pg_xacts_per_broker_s']:.1f} PG xacts"
                          + (f", {row['idle_pg_round_trips_per_broker_s']:.1f} round trips"
                             if "idle_pg_round_trips_per_broker_s" in row else ""), flush=True)
                if "tail_pg_xacts_per_consumer_s" in row:
                    print(f"  run {run} {kind:14} caught-up consumers, per consumer per second: "
                          f"{row['tail_pg_xacts_per_consumer_s']:.1f} PG xacts"
                          + (f", {row['tail_pg_round_trips_per_consumer_s']:.1f} round trips"
                             if "tail_pg_round_trips_per_consumer_s" in row else ""), flush=True)
                if a.ack_rate or a.e2e_rate:
                    lat = latency_run(kind, a, env, tmp, run)
                    lat_rows.append(lat)
                    print(f"  run {run} {kind:14} open loop:"
                          + (f" ack at {lat['ack_rate_msgs_per_s']:.0f} msgs/s p50/p99/p99.9 "
                             f"{lat['open_ack_p50_ms']:.1f}/{lat['open_ack_p99_ms']:.1f}/"
                             f"{lat['open_ack_p999_ms']:.1f} ms" if a.ack_rate else "")
                      + (f" (broker commit p99 <= {fmt(lat.get('open_pg_commit_p99_le_ms'), 'g')} ms, PUT p99 <= "
                         f"{fmt(lat.get('open_put_p99_le_ms'), 'g')} ms, goal {fmt(lat.get('goal_ms'), '.1f')} ms)"
                         if lat.get("open_flushes") is not None else "")
                      + (f"; read_committed e2e at {lat['e2e_rate_msgs_per_s']:.0f} msgs/s p50/p99 "
                         f"{lat['e2e_p50_ms']:.1f}/{lat['e2e_p99_ms']:.1f} ms, consumed "
                         f"{lat['e2e_consumed']}/{lat['e2e_produced']}" if "e2e_p50_ms" in lat else "")
                      + (f"; read_committed e2e failed: {lat['e2e_failed']}" if "e2e_failed" in lat else "")
                      + (f"  errors {lat.get('ack_errors', 0)}/{lat.get('e2e_errors', 0)}"
                         if lat.get("ack_errors") or lat.get("e2e_errors") else ""), flush=True)
    finally:
        stop_live_brokers()
        stop_services()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\ndurable produce, {a.size} B messages, {a.partitions} partitions, {a.producers} producers, "
          f"median of {a.runs} runs")
    print(f"{'config':14} {'msgs/s':>9} {'MB/s':>7} {'ack p50':>8} {'ack p99':>8} {'PG commit p99<=':>16} "
          f"{'PG xacts/GB':>12} {'PUTs/GB':>8} {'PG RTs/flush':>13} {'PG RTs/GB':>10}")
    summary = {}
    for kind in configs:
        rs = [r for r in rows if r["kind"] == kind]
        s = {k: med(rs, k) for k in ("msgs_per_s", "mb_per_s", "ack_p50_ms", "ack_p99_ms", "pg_commit_p99_le_ms",
                                       "pg_xacts_per_gb", "object_puts_per_gb", "pg_round_trips_per_flush",
                                       "pg_round_trips_per_gb")}
        summary[kind] = s
        print(f"{kind:14} {fmt(s['msgs_per_s'], '9.0f')} {fmt(s['mb_per_s'], '7.1f')} {fmt(s['ack_p50_ms'], '8.1f')} "
              f"{fmt(s['ack_p99_ms'], '8.1f')} {fmt(s['pg_commit_p99_le_ms'], '>16.1f')} "
              f"{fmt(s['pg_xacts_per_gb'], '>12.0f')} {fmt(s['object_puts_per_gb'], '>8.0f')} "
              f"{fmt(s['pg_round_trips_per_flush'], '>13.2f')} {fmt(s['pg_round_trips_per_gb'], '>10.0f')}")
    print(f"\nPostgreSQL and object-store work per GB produced (the capacity model's inputs, "
          f"docs/cluster.md), median of {a.runs} runs")
    print(f"{'config':14} {'flushes/GB':>11} {'xacts/GB':>9} {'RTs/GB':>8} {'rows/GB':>9} {'WAL MB/GB':>10} "
          f"{'PUTs/GB':>8} {'GETs/GB':>8}")
    for kind in configs:
        rs = [r for r in rows if r["kind"] == kind and kind.startswith("cluster")]
        if not rs:
            continue
        c = {k: med(rs, k) for k in ("pg_xacts_per_gb", "pg_round_trips_per_gb", "pg_rows_per_gb",
                                       "pg_wal_bytes_per_gb", "object_puts_per_gb", "object_gets_per_gb")}
        fl = med([dict(r, fpg=r["flushes"] / r["gb"]) for r in rs if r.get("flushes") and r["gb"]], "fpg")
        summary[kind].update(c, flushes_per_gb=fl)
        wal_mb = c["pg_wal_bytes_per_gb"] / 1e6 if c["pg_wal_bytes_per_gb"] is not None else None
        print(f"{kind:14} {fmt(fl, '>11.0f')} {fmt(c['pg_xacts_per_gb'], '>9.0f')} "
              f"{fmt(c['pg_round_trips_per_gb'], '>8.0f')} {fmt(c['pg_rows_per_gb'], '>9.0f')} "
              f"{fmt(wal_mb, '>10.1f')} {fmt(c['object_puts_per_gb'], '>8.0f')} "
              f"{fmt(c['object_gets_per_gb'], '>8.0f')}")
    if "tansu" in summary and summary["tansu"]["msgs_per_s"]:
        for kind in configs:
            if kind.startswith("cluster") and summary[kind]["msgs_per_s"]:
                print(f"{kind} / tansu throughput: {summary[kind]['msgs_per_s'] / summary['tansu']['msgs_per_s']:.2f}x")
    lat_summary = {}
    if lat_rows:
        print(f"\nopen loop, median of {a.runs} runs: ack at {a.ack_rate:g} msgs/s (wire generator, latency from "
              f"when a request was due); read_committed end to end at {a.e2e_rate:g} msgs/s (commit every "
              f"{a.e2e_commit_ms:g} ms)")
        print(f"{'config':14} {'ack p50':>8} {'ack p99':>8} {'p99.9':>8} {'commit p99<=':>13} {'PUT p99<=':>10} "
              f"{'goal':>7} {'e2e p50':>8} {'e2e p99':>8} {'txn commit p99':>15}")
        for kind in configs:
            rs = [r for r in lat_rows if r["kind"] == kind]
            s = {k: med(rs, k) for k in ("open_ack_p50_ms", "open_ack_p99_ms", "open_ack_p999_ms",
                                           "open_pg_commit_p99_le_ms", "open_put_p99_le_ms", "goal_ms",
                                           "e2e_p50_ms", "e2e_p99_ms", "commit_p99_ms")}
            lat_summary[kind] = s
            met = ""
            if s["goal_ms"] is not None and s["open_ack_p99_ms"] is not None:
                met = " met" if s["open_ack_p99_ms"] <= s["goal_ms"] else " MISSED"
            print(f"{kind:14} {fmt(s['open_ack_p50_ms'], '8.1f')} {fmt(s['open_ack_p99_ms'], '8.1f')} "
                  f"{fmt(s['open_ack_p999_ms'], '8.1f')} {fmt(s['open_pg_commit_p99_le_ms'], '13g')} "
                  f"{fmt(s['open_put_p99_le_ms'], '10g')} {fmt(s['goal_ms'], '7.1f')}{met:7} "
                  f"{fmt(s['e2e_p50_ms'], '8.1f')} {fmt(s['e2e_p99_ms'], '8.1f')} {fmt(s['commit_p99_ms'], '15.1f')}")
        print("ms; goal = cluster.flush.ms + 2 x the brokers' produce-commit p99 (its histogram's bucket bound); "
              "PUT is not in the goal's budget")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"settings": {k: v for k, v in vars(a).items()}, "runs": rows, "summary": summary,
                       "latency_runs": lat_rows, "latency_summary": lat_summary}, f, indent=1)


if __name__ == "__main__":
    main()
