#!/usr/bin/env python3
"""Several hosts on one machine: a private network namespace per run, each
host on its own loopback address and user id, and network partitions between
them by nftables rules. Needs root (CI has it); everything it makes, it
removes (a namespace takes its rules with it).

    with Namespace() as ns:           # `ip netns add oncelog-<pid>-<n>`, lo up
        ns.run([...])                 # a command inside it (as root)

Inside the namespace (a program run by `ns.run`, or re-run by
`run_inside`), the hosts are:

    broker i   127.0.0.(10+i), uid 2000+i
    PostgreSQL 127.0.0.20 (its primary; a standby 127.0.0.21)
    S3 server  127.0.0.30
    clients    uid 3000 (they only connect)

and `Rules` cuts and heals the links between them:

    rules = Rules()                       # the table, set up once
    cut = rules.cut(2001, "127.0.0.20")   # broker 1 <-> PostgreSQL, both ways
    rules.cut(2001, "127.0.0.20", up=False)   # answers only
    rules.heal(cut)

Every connection is marked with the uid of the process that opened it (a
rule installed before anything runs), so a cut also catches connections
that were open before it: requests are dropped by that mark and the
destination, answers by that mark and the reply direction. A dropped TCP
packet is retransmitted, so a heal lets what was held through, unless the
sender's own timeout ended the connection first. Latency is not a rule: a
TCP delay proxy (tests/faultproxy.py) listens on the server host's address.
"""

import itertools
import os
import shutil
import subprocess
import sys

NETNS_ENV = "ONCELOG_NETNS"
PG_HOST = "127.0.0.20"
PG_STANDBY_HOST = "127.0.0.21"
S3_HOST = "127.0.0.30"
CLIENT_UID = 3000
_TABLE = "oncelog"
_counter = itertools.count()


def broker_host(i):
    return f"127.0.0.{10 + i}"


def broker_uid(i):
    return 2000 + i


def missing():
    """Why this machine cannot run the hosts (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and nftables)"
    for tool in ("ip", "nft", "setpriv"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (apt-get install iproute2 nftables util-linux)"
    return None


def inside():
    """The namespace this process runs in, if one of ours."""
    return os.environ.get(NETNS_ENV)


def as_host(uid):
    """The argv prefix that runs a command as host `uid`: its own user
    and group ids, no supplementary groups, and killed with its parent."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--pdeathsig=KILL", "--"]


def _sh(*argv, check=True):
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, timeout=30)


def _remove_stale():
    """Namespaces of ours whose run died before removing them."""
    out = _sh("ip", "netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) == 3 and parts[0] == "oncelog" and parts[1].isdigit():
            if not os.path.exists(f"/proc/{parts[1]}"):
                _sh("ip", "netns", "del", name, check=False)


class Namespace:
    """A private network namespace with its loopback up and the uid marks
    of `Rules` in place; removed on exit."""

    def __init__(self):
        self.name = f"oncelog-{os.getpid()}-{next(_counter)}"

    def __enter__(self):
        reason = missing()
        if reason:
            raise RuntimeError(f"hosts: {reason}")
        _remove_stale()
        _sh("ip", "netns", "add", self.name)
        try:
            _sh("ip", "-n", self.name, "link", "set", "lo", "up")
            self.exec(["nft", "-f", "-"], input=Rules.RULESET)
        except BaseException:
            _sh("ip", "netns", "del", self.name, check=False)
            raise
        return self

    def exec(self, argv, **kw):
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], check=True,
                              capture_output=True, text=True, timeout=30, **kw)

    def run(self, argv, env=None, **kw):
        """`argv` inside the namespace, with NETNS_ENV set; its exit status."""
        env = dict(env if env is not None else os.environ)
        env[NETNS_ENV] = self.name
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], env=env, **kw).returncode

    def __exit__(self, *exc):
        _sh("ip", "netns", "del", self.name, check=False)


def run_inside(argv):
    """Runs `argv` in a namespace of its own; returns its exit status."""
    with Namespace() as ns:
        print(f"hosts: running in network namespace {ns.name}", flush=True)
        return ns.run(argv)


class Rules:
    """The namespace's nftables rules (run inside it)."""

    # Every new connection of a host carries its uid as its mark.
    UIDS = [broker_uid(i) for i in range(1, 10)] + [CLIENT_UID]
    MARKS = "\n".join(f"    meta skuid {u} ct state new ct mark set {u}" for u in UIDS)
    RULESET = f"""
table inet {_TABLE} {{
  chain out {{
    type filter hook output priority 0; policy accept;
{MARKS}
  }}
}}
"""

    def __init__(self):
        assert inside(), "Rules() runs inside the namespace"

    def _add(self, rule):
        out = _sh("nft", "--echo", "--handle", "add", "rule", "inet", _TABLE, "out", *rule.split())
        return int(out.stdout.rsplit("# handle", 1)[1].split()[0])

    def cut(self, uid, host, up=True, down=True):
        """Cuts the connections host `uid` opens to `host`: `up` its
        requests, `down` the answers. Returns what `heal` takes."""
        handles = []
        if up:
            handles.append(self._add(f"ct direction original ct mark {uid} ip daddr {host} drop"))
        if down:
            handles.append(self._add(f"ct direction reply ct mark {uid} ip saddr {host} drop"))
        return handles

    def heal(self, handles):
        for h in handles:
            _sh("nft", "delete", "rule", "inet", _TABLE, "out", "handle", str(h))

    def heal_all(self):
        _sh("nft", "delete", "table", "inet", _TABLE)
        subprocess.run(["nft", "-f", "-"], input=self.RULESET, check=True, capture_output=True,
                       text=True, timeout=30)


if __name__ == "__main__":
    # hosts.py -- CMD...: CMD inside a namespace of its own
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    sys.exit(run_inside(args))
