"""`oncelog audit` against a cluster of `oncelog serve --cluster` brokers,
with the cluster's own faults injected on a schedule while the auditor's
workers run (and its client faults: worker kill -9 and zombies):

  broker-kill   kill -9 of a broker, restarted after a few seconds
  broker-pause  SIGSTOP of a broker for longer than its lease, then SIGCONT
  pg-restart    PostgreSQL restarted (pg_ctl restart -m fast)
  store-outage  the S3 server stopped (SIGSTOP) for a few seconds

and, through a TCP proxy on each link of each broker (tests/faultproxy.py),
network partitions of one broker at a time:

  pg-partition         broker <-> PostgreSQL cut both ways for longer than
                       its lease (its groups move; it must stop answering
                       for them first), then healed
  pg-partition-oneway  the same, one direction only (requests or answers)
  store-partition      broker <-> S3 server cut for a few seconds (hung PUTs
                       and GETs of that broker only)
  client-partition     clients <-> broker cut for a few seconds (the broker
                       advertises its proxy's address, so every client
                       connection to it crosses the cut)

Used by tests/test_cluster.py at a small size, and on its own for long runs:

  .venv/bin/python tests/cluster_audit.py --duration 150 --report report.json

(it starts PostgreSQL and s3proxy itself unless ONCELOG_TEST_* say where they
are, and a fresh database and three brokers; everything it starts it stops).
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_env import Cluster, fresh_database, s3_store, services_env  # noqa: E402
from conftest import oncelog_bin  # noqa: E402
from faultproxy import FaultProxy, via  # noqa: E402

FAULTS = ("broker-kill", "broker-pause", "pg-restart", "store-outage")
PARTITIONS = ("pg-partition", "pg-partition-oneway", "store-partition", "client-partition")


class Links:
    """Each broker's three links as proxies: to PostgreSQL, to the S3
    server, and from its clients (the broker advertises the last)."""

    def __init__(self, cluster, env):
        from urllib.parse import urlsplit
        self.by_broker = {}
        pg = urlsplit(cluster.db)
        s3 = urlsplit(env["ONCELOG_TEST_S3_ENDPOINT"])
        for b in cluster.brokers:
            links = {"pg": FaultProxy(pg.hostname, pg.port or 5432),
                     "store": FaultProxy(s3.hostname, s3.port),
                     "client": FaultProxy(b.host, b.port)}
            b.overrides["cluster.postgres"] = via(cluster.db, links["pg"])
            b.env["AWS_ENDPOINT"] = via(env["ONCELOG_TEST_S3_ENDPOINT"], links["store"])
            b.overrides["advertised.listener"] = f"127.0.0.1:{links['client'].port}"
            self.by_broker[b] = links

    def started(self):
        """After the brokers started: a port redrawn at start is followed."""
        for b, links in self.by_broker.items():
            links["client"].target = (b.host, b.port)

    def bootstrap(self):
        return ",".join(f"127.0.0.1:{links['client'].port}" for links in self.by_broker.values())

    def close(self):
        for links in self.by_broker.values():
            for p in links.values():
                p.close()


def pg_restart(env):
    data = env["ONCELOG_TEST_PG_DIR"]
    # -l: the restarted server logs to the file services.sh gave it, not to
    # this process's pipes (which it would hold open)
    cmd = [f"{env['ONCELOG_TEST_PG_BIN']}/pg_ctl", "-D", data, "-l",
           str(Path(data).parent / "pg.log"), "-m", "fast", "-w", "-t", "60", "restart"]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=90)


class FaultLoop(threading.Thread):
    """Injects one fault, waits a quiet period, the next; stops by itself at
    `until` (monotonic) with everything healed."""

    def __init__(self, cluster, env, faults, until, lease_s, seed, links=None):
        super().__init__(daemon=True)
        self.cluster, self.env, self.faults = cluster, env, list(faults)
        self.links = links
        self.until, self.lease_s = until, lease_s
        self.rng = random.Random(seed)
        self.done = []
        self.error = None
        # Brokers restarted here die with this thread (conftest's
        # PR_SET_PDEATHSIG is per thread): it lives until the audit ends.
        self.finished = threading.Event()

    def sleep(self, s):
        time.sleep(max(0.0, min(s, self.until - time.monotonic())))

    def run(self):
        try:
            i = 0
            self.sleep(3.0)
            while time.monotonic() + 8 < self.until:
                fault = self.faults[i % len(self.faults)]
                i += 1
                self.inject(fault)
                self.done.append(fault)
                self.sleep(self.rng.uniform(2.0, 4.0))
        except Exception as e:  # reported by the caller
            self.error = e
        self.finished.wait()

    def inject(self, fault):
        b = self.rng.choice(self.cluster.brokers)
        print(f"cluster-audit: {fault}" + (f" broker {b.overrides['node.id']}"
              if fault.startswith("broker") or fault in PARTITIONS else ""), flush=True)
        if fault == "broker-kill":
            b.kill9()
            time.sleep(self.rng.uniform(1.0, 3.0))
            b.start()
        elif fault == "broker-pause":
            os.kill(b.pid, signal.SIGSTOP)
            try:
                time.sleep(self.lease_s + self.rng.uniform(0.5, 2.0))
            finally:
                os.kill(b.pid, signal.SIGCONT)
        elif fault == "pg-restart":
            pg_restart(self.env)
        elif fault in PARTITIONS:
            link, hold = {"pg-partition": ("pg", self.lease_s + self.rng.uniform(0.5, 2.0)),
                          "pg-partition-oneway": ("pg", self.lease_s + self.rng.uniform(0.5, 2.0)),
                          "store-partition": ("store", self.rng.uniform(1.5, 3.0)),
                          "client-partition": ("client", self.rng.uniform(2.0, 5.0))}[fault]
            proxy = self.links.by_broker[b][link]
            if fault == "pg-partition-oneway":
                up = self.rng.random() < 0.5
                proxy.partition(up=up, down=not up)
            else:
                proxy.partition()
            try:
                time.sleep(hold)
            finally:
                proxy.heal()
        elif fault == "store-outage":
            pid = int(self.env["ONCELOG_TEST_S3_PID"])
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(self.rng.uniform(1.5, 3.0))
            finally:
                os.kill(pid, signal.SIGCONT)


def run_audit(base_dir, env, duration, report, faults=FAULTS, workload="zombie",
              brokers=3, lease_ms=3000, seed=1, extra=()):
    """Runs the audit; returns (exit code, report dict, faults injected, cluster)."""
    db = fresh_database(env)
    store = s3_store(env)
    cl = Cluster(base_dir, env, db, store, brokers,
                 {"cluster.lease.ms": lease_ms, "transaction.max.timeout.ms": 900000})
    links = Links(cl, env) if any(f in PARTITIONS for f in faults) else None
    cl.start()
    if links is not None:
        links.started()
    try:
        until = time.monotonic() + duration
        loop = FaultLoop(cl, env, faults, until, lease_ms / 1000.0, seed, links)
        bootstrap = links.bootstrap() if links is not None else cl.bootstrap
        cmd = [str(oncelog_bin()), "audit", "--workload", workload, "--bootstrap", bootstrap,
               "--duration", str(duration), "--report", str(report), "--seed", str(seed),
               "--workdir", str(Path(base_dir) / "audit"), *extra]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        loop.start()
        out = []
        for line in proc.stdout:
            out.append(line)
            print(line, end="", flush=True)
        rc = proc.wait()
        loop.finished.set()
        loop.join(60)
        if loop.error:
            raise loop.error
        data = json.loads(Path(report).read_text()) if Path(report).exists() else {}
        data["_output"] = "".join(out)
        return rc, data, loop.done, cl
    finally:
        for b in cl.brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.kill9()
        if links is not None:
            links.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=int, default=150)
    ap.add_argument("--report", default="cluster-audit-report.json")
    ap.add_argument("--workload", default="zombie")
    ap.add_argument("--faults", default=",".join(FAULTS + PARTITIONS))
    ap.add_argument("--lease-ms", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("audit_args", nargs="*", help="more `oncelog audit` flags, after --")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="oncelog-cluster-audit-"))
    env, stop = services_env()
    try:
        rc, data, done, _ = run_audit(base, env, a.duration, Path(a.report).resolve(),
                                      a.faults.split(","), a.workload, lease_ms=a.lease_ms,
                                      seed=a.seed, extra=a.audit_args)
    finally:
        stop()
    print(f"cluster-audit: cluster faults injected: {len(done)} ({', '.join(done)})")
    print(f"cluster-audit: audit exit {rc}; report {a.report}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
