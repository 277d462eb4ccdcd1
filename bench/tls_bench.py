#!/usr/bin/env python3
"""What TLS costs: durable produce and read_committed consume over PLAINTEXT
and over TLS on oncelog, and over TLS on Apache Kafka 4.x, in the same run,
with the broker's CPU seconds per GB produced.

For each run and target: a fresh broker and data dir, one topic of
--partitions partitions, then --mb MiB of --size byte records produced with
one librdkafka producer (acks=all, idempotent, linger 5 ms, 1 MiB batches)
as fast as it goes, then read back with a read_committed consumer. Figures
are MB/s of record payload; medians of --runs. Certificates (EC P-256) are
made with `openssl` for the run. Kafka's TLS listener uses a PEM keystore.

    .venv/bin/python bench/tls_bench.py --oncelog target/release/oncelog --kafka --runs 3

Bounded: every wait has a limit; brokers are stopped by PID in finally
blocks; loopback only. Needs confluent-kafka (the test venv has it).
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kafka_ref  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_pki(d):
    def run(*a):
        subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True, timeout=60)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bench-ca")
    run("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    with open(os.path.join(d, "bundle.pem"), "w") as f:
        f.write(open(os.path.join(d, "server.key")).read() + open(os.path.join(d, "server.pem")).read())
    return os.path.join(d, "bundle.pem"), os.path.join(d, "ca.pem")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port, timeout=60):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def measure(plain, conf, pid, args):
    topic = "tls-bench"
    a = AdminClient({"bootstrap.servers": plain})
    a.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(60)
    time.sleep(1)
    n = args.mb * 1024 * 1024 // args.size
    payload = os.urandom(args.size)
    p = Producer({**conf, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                  "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000,
                  "queue.buffering.max.kbytes": 1 << 20})
    cpu0, t0 = cpu_s(pid), time.monotonic()
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload, partition=i % args.partitions)
                break
            except BufferError:
                p.poll(0.01)
    left = p.flush(300)
    t1, cpu1 = time.monotonic(), cpu_s(pid)
    if left:
        raise RuntimeError(f"{left} records unacknowledged")
    mb = n * args.size / 1e6
    produce_mbs = mb / (t1 - t0)
    cpu_per_gb = (cpu1 - cpu0) / (mb / 1000)
    c = Consumer({**conf, "group.id": "tls-bench", "isolation.level": "read_committed",
                  "enable.auto.commit": False, "fetch.max.bytes": 50 << 20,
                  "max.partition.fetch.bytes": 10 << 20})
    c.assign([TopicPartition(topic, i, 0) for i in range(args.partitions)])
    got, t0 = 0, time.monotonic()
    deadline = t0 + 300
    while got < n and time.monotonic() < deadline:
        for m in c.consume(10000, timeout=1.0):
            if not m.error():
                got += 1
    t1 = time.monotonic()
    c.close()
    if got < n:
        raise RuntimeError(f"read {got} of {n}")
    return produce_mbs, mb / (t1 - t0), cpu_per_gb


def run_oncelog(binary, tls, args, keystore, ca):
    d = tempfile.mkdtemp(prefix="tls-bench-")
    port, tls_port = free_port(), free_port()
    cmd = [binary, "serve", "--data-dir", os.path.join(d, "data"), "--metrics-listen", "",
           "-o", f"listeners=PLAINTEXT://127.0.0.1:{port},SSL://127.0.0.1:{tls_port}",
           "-o", f"ssl.keystore.location={keystore}"]
    log = open(os.path.join(d, "broker.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        wait_port(port)
        conf = {"bootstrap.servers": f"127.0.0.1:{tls_port if tls else port}"}
        if tls:
            conf.update({"security.protocol": "SSL", "ssl.ca.location": ca})
        return measure(f"127.0.0.1:{port}", conf, proc.pid, args)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        subprocess.run(["rm", "-rf", d])


def run_kafka(args, keystore, ca):
    d = tempfile.mkdtemp(prefix="tls-bench-kafka-")
    port, tls_port = free_port(), free_port()
    k = kafka_ref.KafkaBroker(d, port=port, heap="1g", configs={
        "listeners": f"PLAINTEXT://127.0.0.1:{port},SSL://127.0.0.1:{tls_port},CONTROLLER://127.0.0.1:CTRL",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},SSL://127.0.0.1:{tls_port}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": keystore,
        # as durable as oncelog: fsync before the acknowledgement
        "log.flush.interval.messages": "1",
    })
    k.extra["listeners"] = k.extra["listeners"].replace("CTRL", str(k.controller_port))
    k.start()
    try:
        conf = {"bootstrap.servers": f"127.0.0.1:{tls_port}", "security.protocol": "SSL",
                "ssl.ca.location": ca}
        return measure(k.bootstrap, conf, k.proc.pid, args)
    finally:
        k.stop()
        subprocess.run(["rm", "-rf", d])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--oncelog", default="target/release/oncelog")
    ap.add_argument("--kafka", action="store_true", help="also Apache Kafka over TLS (.tools/kafka-lib)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    pki = tempfile.mkdtemp(prefix="tls-bench-pki-")
    keystore, ca = make_pki(pki)
    results = {"oncelog PLAINTEXT": [], "oncelog TLS": []}
    if args.kafka:
        results["Kafka TLS"] = []
    for r in range(args.runs):
        for name in results:
            if name == "Kafka TLS":
                fig = run_kafka(args, keystore, ca)
            else:
                fig = run_oncelog(args.oncelog, name.endswith("TLS"), args, keystore, ca)
            results[name].append(fig)
            print(f"run {r + 1} {name:18} produce {fig[0]:7.1f} MB/s  consume {fig[1]:7.1f} MB/s  "
                  f"broker CPU {fig[2]:5.1f} s/GB", flush=True)
    print(f"\nmedians of {args.runs} runs, {args.mb} MiB of {args.size} B records, {args.partitions} partitions:")
    print(f"{'target':18} {'produce MB/s':>14} {'consume MB/s':>14} {'CPU s/GB':>10}")
    med = {}
    for name, figs in results.items():
        med[name] = [statistics.median(f[i] for f in figs) for i in range(3)]
        lo = [min(f[i] for f in figs) for i in range(2)]
        hi = [max(f[i] for f in figs) for i in range(2)]
        print(f"{name:18} {med[name][0]:7.1f} ({lo[0]:.0f}-{hi[0]:.0f}) {med[name][1]:7.1f} ({lo[1]:.0f}-{hi[1]:.0f}) "
              f"{med[name][2]:8.1f}")
    p, t = med["oncelog PLAINTEXT"], med["oncelog TLS"]
    print(f"TLS on oncelog: produce {t[0] / p[0]:.2f}x, consume {t[1] / p[1]:.2f}x of PLAINTEXT")
    if "Kafka TLS" in med:
        k = med["Kafka TLS"]
        print(f"oncelog TLS vs Kafka TLS: produce {t[0] / k[0]:.2f}x, consume {t[1] / k[1]:.2f}x")
    subprocess.run(["rm", "-rf", pki])


if __name__ == "__main__":
    main()
