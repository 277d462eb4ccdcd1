"""`oncelog audit` against a cluster of `oncelog serve --cluster` brokers,
with the cluster's own faults injected on a schedule while the auditor's
workers run (and its client faults: worker kill -9 and zombies):

  broker-kill   kill -9 of a broker, restarted after a few seconds
  broker-pause  SIGSTOP of a broker for longer than its lease, then SIGCONT
  pg-restart    PostgreSQL restarted (pg_ctl restart -m fast)
  store-outage  the S3 server stopped (SIGSTOP) for a few seconds

  clock-jump    a broker's wall clock stepped forward or back by minutes
                (libfaketime; its monotonic clock goes on), then set right
  pg-failover   PostgreSQL's primary killed (immediate shutdown) and its
                synchronous standby promoted, then a new standby built from
                it where the old primary was (the run's own pair: the
                brokers follow a multi-host URL with
                target_session_attrs=read-write); pg-restart then restarts
                the pair's primary

and network partitions of one broker at a time:

  pg-partition         broker <-> PostgreSQL cut both ways for longer than
                       its lease (its groups move; it must stop answering
                       for them first), then healed
  pg-partition-oneway  the same, one direction only (requests or answers)
  store-partition      broker <-> S3 server cut for a few seconds (hung PUTs
                       and GETs of that broker only)
  client-partition     clients <-> broker cut for a few seconds (the broker
                       advertises its proxy's address, so every client
                       connection to it crosses the cut)

The partitions are made one of two ways:

  * by default, through a TCP proxy on each link of each broker
    (tests/faultproxy.py); no root needed;
  * with --netns, between hosts (tests/hosts.py): the whole run moves into a
    private network namespace of its own, where each broker, PostgreSQL, the
    S3 server and the clients are hosts with their own loopback address (and
    the brokers and clients their own uid), and a partition is an nftables
    rule on the broker's uid and the other host's address. A delay proxy on
    each service's address puts PostgreSQL --pg-delay-ms and the S3 server
    --s3-delay-ms away. Needs root.

Used by tests/test_cluster.py and tests/test_cluster_hosts.py at a small
size, and on its own for long runs:

  .venv/bin/python tests/cluster_audit.py --duration 150 --report report.json
  .venv/bin/python tests/cluster_audit.py --netns --pg-delay-ms 2 --s3-delay-ms 20 \
      --workload copier --duration 900 --report report.json

(it starts PostgreSQL and s3proxy itself unless ONCELOG_TEST_* say where they
are (always, with --netns), and a fresh database and three brokers;
everything it starts it stops).
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hosts  # noqa: E402
from cluster_env import Cluster, fresh_database, s3_store, services_env  # noqa: E402
from conftest import free_port, oncelog_bin  # noqa: E402
from faultproxy import FaultProxy, via  # noqa: E402

FAULTS = ("broker-kill", "broker-pause", "pg-restart", "store-outage")
PARTITIONS = ("pg-partition", "pg-partition-oneway", "store-partition", "client-partition")
CLOCK = ("clock-jump",)
FAILOVER = ("pg-failover",)


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

    def partition(self, b, link, up=True, down=True):
        proxy = self.by_broker[b][link]
        proxy.partition(up=up, down=down)
        return proxy

    def heal(self, proxy):
        proxy.heal()

    def close(self):
        for links in self.by_broker.values():
            for p in links.values():
                p.close()


class HostLinks:
    """The links between hosts inside the run's network namespace
    (tests/hosts.py): each broker on its own address and uid, a delay proxy
    on each service's address, partitions by nftables rules."""

    def __init__(self, cluster, env, pg_delay_ms=0, s3_delay_ms=0, pair=None):
        from urllib.parse import urlsplit
        self.cluster = cluster
        self.rules = hosts.Rules()
        s3 = urlsplit(env["ONCELOG_TEST_S3_ENDPOINT"])
        if pair is not None:
            nodes = [(n.host, n.port) for n in pair.nodes]
        else:
            pg = urlsplit(cluster.db)
            nodes = [(pg.hostname, pg.port)]
        # a delay proxy on each PostgreSQL node's address (both of a pair)
        pg_proxies = [FaultProxy(h, p, listen_host=h, delay_ms=pg_delay_ms) for h, p in nodes]
        self.proxies = [*pg_proxies,
                        FaultProxy(s3.hostname, s3.port, listen_host=s3.hostname,
                                   delay_ms=s3_delay_ms)]
        self.service = {"pg": [h for h, _ in nodes], "store": [s3.hostname]}
        if pair is not None:
            pg_url = pair.url_of([(x.host, x.port) for x in pg_proxies])
        else:
            pg_url = via(cluster.db, pg_proxies[0])
        self.uid = {}
        for i, b in enumerate(cluster.brokers, 1):
            b.host = hosts.broker_host(i)
            b.overrides["metrics.listen"] = f"{b.host}:{free_port()}"
            b.overrides["cluster.postgres"] = pg_url
            b.env["AWS_ENDPOINT"] = via(env["ONCELOG_TEST_S3_ENDPOINT"], self.proxies[-1])
            self.uid[b] = hosts.broker_uid(i)
            b.prefix = hosts.as_host(self.uid[b])
            for d in (b.data_dir.parent, b.data_dir):
                d.mkdir(parents=True, exist_ok=True)
                os.chown(d, self.uid[b], self.uid[b])

    def started(self):
        pass

    def bootstrap(self):
        return self.cluster.bootstrap

    def partition(self, b, link, up=True, down=True):
        if link == "client":
            return self.rules.cut(hosts.CLIENT_UID, b.host, up, down)
        return [self.rules.cut(self.uid[b], h, up, down) for h in self.service[link]]

    def heal(self, handles):
        if handles and isinstance(handles[0], list):
            for h in handles:
                self.rules.heal(h)
        else:
            self.rules.heal(handles)

    def close(self):
        for p in self.proxies:
            p.close()


def faketime_lib():
    """libfaketime's multithreaded library, if installed."""
    import glob
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        raise RuntimeError("clock-jump needs libfaketime (apt-get install faketime)")
    return found[0]


class Clocks:
    """Each broker's wall clock, offset through libfaketime's timestamp
    file (re-read every second); the monotonic clock is left alone, as an
    NTP step leaves it. The library is loaded after the switch to the
    broker's uid (`env` in its argv), so its shared memory is the broker's."""

    def __init__(self, cluster):
        lib = faketime_lib()
        self.files = {}
        for b in cluster.brokers:
            f = b.data_dir.parent / "faketime"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("+0\n")
            f.chmod(0o644)
            self.files[b] = f
            b.prefix = [*b.prefix, "env", f"LD_PRELOAD={lib}"]
            b.env.update({"FAKETIME_TIMESTAMP_FILE": str(f), "FAKETIME_CACHE_DURATION": "1",
                          "DONT_FAKE_MONOTONIC": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"})

    @staticmethod
    def clean():
        """The library's semaphores and shared memory of brokers killed
        with -9 (gone processes only)."""
        import glob
        for f in glob.glob("/dev/shm/sem.faketime_sem_*") + glob.glob("/dev/shm/faketime_shm_*"):
            pid = f.rsplit("_", 1)[1]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.unlink(f)
                except OSError:
                    pass

    def set(self, b, offset_s):
        tmp = self.files[b].with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}\n")
        tmp.chmod(0o644)
        os.replace(tmp, self.files[b])


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

    def __init__(self, cluster, env, faults, until, lease_s, seed, links=None, clocks=None,
                 pair=None):
        super().__init__(daemon=True)
        self.cluster, self.env, self.faults = cluster, env, list(faults)
        self.links, self.clocks, self.pair = links, clocks, pair
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
              if fault.startswith("broker") or fault in PARTITIONS + CLOCK else ""), flush=True)
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
            if self.pair is not None:
                self.pair.restart_primary()
            else:
                pg_restart(self.env)
        elif fault == "pg-failover":
            self.pair.fail_over()
            print(f"cluster-audit: PostgreSQL failed over to {self.pair.p.host}:{self.pair.p.port}",
                  flush=True)
            time.sleep(self.rng.uniform(1.0, 3.0))
            self.pair.build_standby()
        elif fault in PARTITIONS:
            link, hold = {"pg-partition": ("pg", self.lease_s + self.rng.uniform(0.5, 2.0)),
                          "pg-partition-oneway": ("pg", self.lease_s + self.rng.uniform(0.5, 2.0)),
                          "store-partition": ("store", self.rng.uniform(1.5, 3.0)),
                          "client-partition": ("client", self.rng.uniform(2.0, 5.0))}[fault]
            up = down = True
            if fault == "pg-partition-oneway":
                up = self.rng.random() < 0.5
                down = not up
            cut = self.links.partition(b, link, up=up, down=down)
            try:
                time.sleep(hold)
            finally:
                self.links.heal(cut)
        elif fault == "clock-jump":
            offset = self.rng.choice((-1, 1)) * self.rng.randint(60, 600)
            print(f"cluster-audit: broker {b.overrides['node.id']}'s clock {offset:+d} s",
                  flush=True)
            self.clocks.set(b, offset)
            try:
                time.sleep(self.rng.uniform(3.0, 6.0))
            finally:
                self.clocks.set(b, 0)
        elif fault == "store-outage":
            pid = int(self.env["ONCELOG_TEST_S3_PID"])
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(self.rng.uniform(1.5, 3.0))
            finally:
                os.kill(pid, signal.SIGCONT)


def client_side(base_dir):
    """Inside the namespace the clients are a host of their own: the
    binary where every uid can run it, the auditor's files theirs.
    Returns (binary, argv prefix, where the auditor writes its report)."""
    base = Path(base_dir)
    base.chmod(0o755)
    binary = base / "bin" / "oncelog"
    binary.parent.mkdir(exist_ok=True)
    shutil.copy2(oncelog_bin(), binary)
    binary.chmod(0o755)
    for d in (base / "audit", base / "client"):
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, hosts.CLIENT_UID, hosts.CLIENT_UID)
    return binary, hosts.as_host(hosts.CLIENT_UID), base / "client" / "report.json"


def run_audit(base_dir, env, duration, report, faults=FAULTS, workload="zombie",
              brokers=3, lease_ms=3000, seed=1, extra=(), delays=(0, 0)):
    """Runs the audit; returns (exit code, report dict, faults injected, cluster).
    Inside tests/hosts.py's namespace the brokers and clients are hosts and
    `delays` (ms to PostgreSQL, to the S3 server) apply."""
    pair = None
    if "pg-failover" in faults:
        if not hosts.inside() and any(f in PARTITIONS for f in faults):
            raise ValueError("pg-failover with partitions needs --netns")
        from pgpair import PgPair
        pair = PgPair(env, True, hosts=(hosts.PG_HOST, hosts.PG_STANDBY_HOST) if hosts.inside()
                      else ("127.0.0.1", "127.0.0.1")).start()
        db = pair.url
    else:
        db = fresh_database(env)
    store = s3_store(env)
    binary, prefix, written = (client_side(base_dir) if hosts.inside()
                               else (oncelog_bin(), [], report))
    cl = Cluster(base_dir, env, db, store, brokers,
                 {"cluster.lease.ms": lease_ms, "transaction.max.timeout.ms": 900000})
    for b in cl.brokers:
        b.binary = binary
    if hosts.inside():
        links = HostLinks(cl, env, *delays, pair=pair)
    elif any(f in PARTITIONS for f in faults):
        links = Links(cl, env)
    else:
        links = None
    clocks = Clocks(cl) if "clock-jump" in faults else None
    cl.start()
    if links is not None:
        links.started()
    try:
        until = time.monotonic() + duration
        loop = FaultLoop(cl, env, faults, until, lease_ms / 1000.0, seed, links, clocks, pair)
        bootstrap = links.bootstrap() if links is not None else cl.bootstrap
        cmd = [*prefix, str(binary), "audit", "--workload", workload, "--bootstrap", bootstrap,
               "--duration", str(duration), "--report", str(written), "--seed", str(seed),
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
        if Path(written) != Path(report) and Path(written).exists():
            shutil.copyfile(written, report)
        data = json.loads(Path(report).read_text()) if Path(report).exists() else {}
        data["_output"] = "".join(out)
        return rc, data, loop.done, cl
    finally:
        for b in cl.brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.kill9()
        if links is not None:
            links.close()
        if clocks is not None:
            clocks.clean()
        if pair is not None:
            pair.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=int, default=150)
    ap.add_argument("--report", default="cluster-audit-report.json")
    ap.add_argument("--workload", default="zombie")
    ap.add_argument("--faults", default=None,
                    help="comma-separated; by default every fault (pg-failover only with --netns)")
    ap.add_argument("--lease-ms", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--netns", action="store_true",
                    help="run between hosts in a network namespace of its own (root)")
    ap.add_argument("--pg-delay-ms", type=int, default=0, help="with --netns")
    ap.add_argument("--s3-delay-ms", type=int, default=0, help="with --netns")
    ap.add_argument("audit_args", nargs="*", help="more `oncelog audit` flags, after --")
    a = ap.parse_args()
    if a.faults is None:
        a.faults = ",".join(FAULTS + PARTITIONS + CLOCK + (FAILOVER if a.netns else ()))
    if a.netns and not hosts.inside():
        # the same command again, inside; the namespace goes with it
        os.environ["ONCELOG_BIN"] = str(oncelog_bin())
        sys.exit(hosts.run_inside([sys.executable, *sys.argv]))
    base = Path(tempfile.mkdtemp(prefix="oncelog-cluster-audit-"))
    if hosts.inside():
        os.environ.update({"ONCELOG_SERVICES_PG_HOST": hosts.PG_HOST,
                           "ONCELOG_SERVICES_S3_HOST": hosts.S3_HOST})
    env, stop = services_env(own=bool(hosts.inside()))
    try:
        rc, data, done, cl = run_audit(base, env, a.duration, Path(a.report).resolve(),
                                      a.faults.split(","), a.workload, lease_ms=a.lease_ms,
                                      seed=a.seed, extra=a.audit_args,
                                      delays=(a.pg_delay_ms, a.s3_delay_ms))
    finally:
        stop()
    errors = [line for line in cl.log_text().splitlines() if " ERROR " in line]
    print(f"cluster-audit: broker log errors: {len(errors)}")
    for line in errors[:20]:
        print(f"  {line}")
    print(f"cluster-audit: cluster faults injected: {len(done)} ({', '.join(done)})")
    print(f"cluster-audit: audit exit {rc}; report {a.report}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
