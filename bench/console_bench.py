#!/usr/bin/env python3
"""How fast the web console loads on a big broker, measured in headless
Chromium: a broker with --partitions partitions (in --topics topics) and
--ids transactional ids (each with committed and aborted transactions, a
few left open so the stuck view has rows), then each console view is
loaded --runs times in a fresh navigation and timed from navigation start
to the first render of its data (the page's `console-ready` mark).

Printed beside it, measured in the same run: the server's time for the
view's JSON alone (urllib, median of the same number of requests) and for
/metrics (what a Prometheus scrape of the same broker costs).

    .venv/bin/python bench/console_bench.py --partitions 10000 --ids 1000 --runs 5

Needs chromium and chromium-driver (test.sh installs them) and, for 10,000
partitions, an open-files limit of 3 per partition (raised for the broker
when this runs as root)."""

import argparse
import concurrent.futures
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from browser import start_chromium  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_nofile():
    want = 65536
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
    except (ValueError, OSError):
        pass


def wait_port(port, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"broker did not listen on {port}")


def get(url):
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    return (time.perf_counter() - t) * 1000, len(body)


def make_ids(bootstrap, topics, per_topic, ids, open_left):
    from confluent_kafka import Producer

    def one(i):
        p = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                      "transactional.id": f"job-{i % 40}-{i // 40}-0", "linger.ms": 0,
                      "client.id": f"bench-writer-{i}"})
        p.init_transactions(60)
        for k in range(2):
            p.begin_transaction()
            p.produce(topics[(i + k) % len(topics)], value=b"x" * 100, partition=(i * 7 + k) % per_topic)
            if (i + k) % 5 == 0:
                p.abort_transaction(60)
            else:
                p.commit_transaction(60)
        if i < open_left:
            p.begin_transaction()
            p.produce(topics[i % len(topics)], value=b"open", partition=i % per_topic)
            p.flush(60)
            return p  # kept open: it pins its partition's LSO
        p.flush(60)
        return None

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        return [p for p in ex.map(one, range(ids)) if p is not None]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--oncelog", default=str(REPO / "target" / "release" / "oncelog"))
    ap.add_argument("--partitions", type=int, default=10000)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--ids", type=int, default=1000)
    ap.add_argument("--open", type=int, default=20, help="transactions left open")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    if not shutil.which("chromium") and not shutil.which("chromium-browser"):
        raise SystemExit("needs chromium and chromium-driver (apt-get install chromium chromium-driver)")

    from confluent_kafka.admin import AdminClient, NewTopic

    tmp = Path(tempfile.mkdtemp(prefix="console-bench-"))
    port, http_port = free_port(), free_port()
    log = open(tmp / "broker.log", "w")
    broker = subprocess.Popen([a.oncelog, "serve", "--data-dir", str(tmp / "data"), "--listen", f"127.0.0.1:{port}",
                               "-o", f"metrics.listen=127.0.0.1:{http_port}", "-o", "transaction.max.timeout.ms=900000"],
                              stdout=log, stderr=log, preexec_fn=raise_nofile)
    producers = []
    driver = None
    try:
        wait_port(port)
        wait_port(http_port)
        bootstrap = f"127.0.0.1:{port}"
        base = f"http://127.0.0.1:{http_port}"
        per_topic = a.partitions // a.topics
        topics = [f"bench-{i:03d}" for i in range(a.topics)]
        t0 = time.monotonic()
        admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
        for i in range(0, len(topics), 10):
            fs = admin.create_topics([NewTopic(t, per_topic, 1) for t in topics[i:i + 10]], request_timeout=120)
            for f in fs.values():
                f.result(180)
        print(f"created {a.topics} topics x {per_topic} partitions in {time.monotonic() - t0:.1f} s", flush=True)
        t0 = time.monotonic()
        producers = make_ids(bootstrap, topics, per_topic, a.ids, a.open)
        print(f"{a.ids} transactional ids ({a.open} left open) in {time.monotonic() - t0:.1f} s", flush=True)
        overview = json.loads(urllib.request.urlopen(f"{base}/v1/console/overview", timeout=60).read())
        print(f"broker: {overview['totals']['partitions']} partitions, "
              f"{overview['totals']['pinned_partitions']} with an LSO gap", flush=True)

        driver = start_chromium()
        views = [("overview", "/overview", "/v1/console/overview"),
                 ("transactions", "/transactions", "/v1/console/transactions?per_page=25"),
                 ("stuck", "/stuck", "/v1/console/stuck"),
                 ("topic", f"/topic/{topics[0]}", f"/v1/console/topic?topic={topics[0]}"),
                 ("groups", "/groups", "/v1/console/groups")]
        results = {}
        for name, hash_, api in views:
            loads = []
            for _ in range(a.runs + 1):
                driver.get("about:blank")
                driver.get(f"{base}/#{hash_}")
                deadline = time.monotonic() + 60
                ready = None
                while ready is None and time.monotonic() < deadline:
                    ready = driver.execute_script(
                        "const m = performance.getEntriesByName('console-ready'); return m.length ? m[0].startTime : null;")
                    if ready is None:
                        time.sleep(0.02)
                if ready is None:
                    raise SystemExit(f"{name}: the view never rendered")
                loads.append(ready)
            loads = loads[1:]  # the first navigation warms the browser
            server = [get(base + api) for _ in range(a.runs)]
            results[name] = {"load_ms": statistics.median(loads), "load_ms_range": [min(loads), max(loads)],
                             "json_ms": statistics.median(s[0] for s in server), "json_bytes": server[0][1]}
        # the browser's own cost: a plain-text page from the same listener
        plain = []
        for _ in range(a.runs + 1):
            driver.get("about:blank")
            driver.get(f"{base}/health")
            plain.append(driver.execute_script("return performance.getEntriesByType('navigation')[0].loadEventEnd;"))
        plain = plain[1:]
        results["/health (plain text)"] = {"load_ms": statistics.median(plain), "load_ms_range": [min(plain), max(plain)],
                                           "json_ms": statistics.median(get(base + "/health")[0] for _ in range(a.runs)), "json_bytes": 3}
        metrics = [get(base + "/metrics") for _ in range(a.runs)]
        results["/metrics"] = {"json_ms": statistics.median(m[0] for m in metrics), "json_bytes": metrics[0][1]}

        print(f"\nconsole page load, {a.partitions} partitions, {a.ids} transactional ids "
              f"(median of {a.runs}, navigation start to data rendered)")
        print(f"{'view':<22}{'load ms':>9}{'range':>16}{'its JSON ms':>13}{'JSON bytes':>12}")
        for name, r in results.items():
            if "load_ms" in r:
                lo, hi = r["load_ms_range"]
                print(f"{name:<22}{r['load_ms']:>9.0f}{f'{lo:.0f}-{hi:.0f}':>16}{r['json_ms']:>13.1f}{r['json_bytes']:>12}")
            else:
                print(f"{name:<22}{'':>9}{'':>16}{r['json_ms']:>13.1f}{r['json_bytes']:>12}")
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=2))
    finally:
        if driver:
            driver.quit()
        for p in producers:
            try:
                p.abort_transaction(5)
            except Exception:
                pass
        broker.terminate()
        try:
            broker.wait(30)
        except subprocess.TimeoutExpired:
            broker.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
