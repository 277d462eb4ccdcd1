#!/usr/bin/env python3
"""Regenerates the committed seed corpora under fuzz/seeds/ from real client
traffic.

It starts `oncelog serve` (target/release/oncelog or $ONCELOG_BIN) on a free
loopback port with a temporary data directory, puts a small TCP proxy in
front of it (the broker advertises the proxy, so every client connection goes
through it), and runs confluent-kafka and kafka-python clients against the
proxy: admin calls, idempotent producers with every codec, transactions
(committed, aborted, with consumer offsets), and a consumer group. Then:

* request_decode: one frame per (API key, version) seen, without its length
  prefix (the bytes `dispatch` gets);
* frame_split: the start of a few client streams, cut at frame boundaries,
  behind the target's chunking header;
* batch_header: record batches found in Produce requests (one per kind:
  codec, transactional or not), plus control batches (markers) from the logs;
* segment_recovery: a few small segment .log files, and one structured input
  (an older segment with its indexes plus the active segment);
* snapshot_load: producer-state snapshots from the data directory.

The broker is stopped (SIGTERM, then SIGKILL) by PID at the end, whatever
happens. Run with the repo's virtualenv:

    .venv/bin/python fuzz/make_seeds.py
"""

import base64
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import crc32c

FUZZ = Path(__file__).resolve().parent
REPO = FUZZ.parent
SEEDS = FUZZ / "seeds"
MAX_SEED = 100 * 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proxy:
    """Forwards loopback connections to the broker and records what each
    client sent."""

    def __init__(self, port, upstream):
        self.upstream = upstream
        self.streams = []
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                broker = socket.create_connection(self.upstream, timeout=10)
                broker.settimeout(None)
            except OSError:
                client.close()
                continue
            sent = bytearray()
            with self.lock:
                self.streams.append(sent)
            threading.Thread(target=self._pump, args=(client, broker, sent), daemon=True).start()
            threading.Thread(target=self._pump, args=(broker, client, None), daemon=True).start()

    @staticmethod
    def _pump(src, dst, record):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if record is not None:
                    record.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.sock.close()


def frames(stream):
    """(length-prefixed frame bytes) of a client stream, whole frames only."""
    pos = 0
    while pos + 4 <= len(stream):
        (n,) = struct.unpack_from(">i", stream, pos)
        if n < 0 or pos + 4 + n > len(stream):
            return
        yield bytes(stream[pos:pos + 4 + n])
        pos += 4 + n


def batches_in(buf):
    """Valid magic-2 record batches anywhere in `buf` (CRC-checked)."""
    out = []
    i = 0
    while i + 61 <= len(buf):
        (length,) = struct.unpack_from(">i", buf, i + 8)
        end = i + 12 + length
        if length >= 49 and end <= len(buf) and buf[i + 16] == 2:
            (crc,) = struct.unpack_from(">I", buf, i + 17)
            if crc32c.crc32c(bytes(buf[i + 21:end])) == crc:
                out.append(bytes(buf[i:end]))
                i = end
                continue
        i += 1
    return out


def clients(bootstrap):
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import (AdminClient, ConfigResource, NewPartitions,
                                       NewTopic)

    def attempt(what, f):
        try:
            return f()
        except (KafkaException, Exception) as e:  # noqa: BLE001 - seeds, not tests
            print(f"  ({what}: {e})", file=sys.stderr)
            return None

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([
        NewTopic("seed-plain", 2, 1),
        NewTopic("seed-txn", 1, 1, config={"segment.bytes": "1024"}),
        NewTopic("seed-comp", 1, 1, config={"segment.bytes": "4096"}),
        NewTopic("seed-scratch", 1, 1),
    ])
    for f in fs.values():
        attempt("create topic", lambda: f.result(10))
    attempt("describe configs", lambda: [f.result(10) for f in admin.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, "seed-plain")]).values()])
    attempt("create partitions", lambda: [f.result(10) for f in admin.create_partitions(
        [NewPartitions("seed-scratch", 2)]).values()])
    attempt("list topics", lambda: admin.list_topics(timeout=10))

    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                      "compression.type": codec, "linger.ms": 20})
        for i in range(40):
            p.produce("seed-comp" if codec != "none" else "seed-plain",
                      key=f"k{i % 5}".encode(), value=(f"{codec} value {i} " * 3).encode(),
                      headers=[("h", b"x")] if i % 7 == 0 else None, partition=0)
        attempt(f"flush {codec}", lambda: p.flush(15))

    tp = Producer({"bootstrap.servers": bootstrap, "transactional.id": "seed-tx",
                   "linger.ms": 5})
    attempt("init transactions", lambda: tp.init_transactions(15))
    for n in range(12):
        def txn(n=n):
            tp.begin_transaction()
            for i in range(8):
                tp.produce("seed-txn", key=b"t", value=f"txn {n} record {i} ".encode() * 4, partition=0)
                if i % 4 == 3:
                    tp.flush(10)  # several batches per transaction, so segments roll mid-way
            if n % 3 == 2:
                tp.abort_transaction(15)
            else:
                tp.commit_transaction(15)
        attempt(f"transaction {n}", txn)

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "seed-group",
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                  "enable.auto.commit": False})
    c.subscribe(["seed-plain", "seed-txn"])
    got, deadline = 0, time.monotonic() + 20
    while got < 60 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got += 1
    attempt("commit", lambda: c.commit(asynchronous=False))
    attempt("offsets for times", lambda: c.offsets_for_times(
        [TopicPartition("seed-plain", 0, int(time.time() * 1000) - 60000)], 10))

    def txn_offsets():
        tp.begin_transaction()
        tp.produce("seed-txn", value=b"with offsets", partition=0)
        tp.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 15)
        tp.commit_transaction(15)
    attempt("transaction with offsets", txn_offsets)
    c.close()
    attempt("list groups", lambda: admin.list_consumer_groups().result(10))
    attempt("describe groups", lambda: [f.result(10) for f in admin.describe_consumer_groups(
        ["seed-group"]).values()])
    attempt("delete topic", lambda: [f.result(10) for f in admin.delete_topics(
        ["seed-scratch"]).values()])

    try:
        import kafka  # kafka-python: other API versions, and its own encodings
    except ImportError:
        return
    def kp():
        p = kafka.KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip",
                                request_timeout_ms=10000)
        for i in range(10):
            p.send("seed-plain", key=b"kp", value=f"kafka-python {i}".encode(), partition=1)
        p.flush(15)
        p.close(5)
        kc = kafka.KafkaConsumer("seed-plain", bootstrap_servers=bootstrap, group_id="seed-kp",
                                 auto_offset_reset="earliest", consumer_timeout_ms=3000)
        for _ in kc:
            pass
        kc.commit()
        kc.close()
        ka = kafka.KafkaAdminClient(bootstrap_servers=bootstrap)
        for call in (ka.list_groups, lambda: ka.describe_groups(["seed-kp"]),
                     ka.list_transactions, lambda: ka.describe_transactions(["seed-tx"]),
                     lambda: ka.describe_producers([kafka.TopicPartition("seed-txn", 0)])):
            attempt("kafka-python admin", call)
        ka.close()
    attempt("kafka-python", kp)


def reset(target):
    d = SEEDS / target
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def save(d, name, data):
    if len(data) <= MAX_SEED:
        (d / name).write_bytes(data)


def write_seeds(streams, data_dir):
    all_frames = [f for s in streams for f in frames(s)]

    d = reset("request_decode")
    seen = {}
    for f in sorted(all_frames, key=len):
        key, ver = struct.unpack_from(">hh", f, 4)
        seen.setdefault((key, ver), f[4:])
    for (key, ver), body in sorted(seen.items()):
        save(d, f"k{key:02d}-v{ver:02d}.bin", body)
    # Found by request_decode without the allocation guard: DescribeProducers
    # v0 whose compact topics array declares ~2^32 entries, which kafka-protocol
    # pre-allocates (120 GiB). Kept so every run goes through the guard.
    save(d, "oom-k61-v00-huge-array.bin", base64.b64decode(
        "AD0AAAAAAAkAE2thZmthLXB5dGhvbi03LjAuMTIA/////2VkLXR4bgIAACkAAAA="))

    d = reset("frame_split")
    chunking = [(5, bytes([0x03, 0x81, 0x10])), (3, bytes([0x00])),
                (5, bytes([0xff])), (0x84, bytes([0x07, 0x02]))]
    longest = sorted(streams, key=len, reverse=True)[:len(chunking)]
    for i, (s, (sel, sizes)) in enumerate(zip(longest, chunking)):
        out = bytearray()
        for f in frames(s):
            if len(out) + len(f) > 8192:
                break
            out += f
        save(d, f"stream-{i}.bin", bytes([sel, len(sizes)]) + sizes + bytes(out))

    d = reset("batch_header")
    kinds = {}
    for f in all_frames:
        (key,) = struct.unpack_from(">h", f, 4)
        if key != 0:
            continue
        for b in batches_in(f):
            (attrs,) = struct.unpack_from(">h", b, 21)
            kinds.setdefault(attrs, b)
    logs = sorted(data_dir.glob("*/*.log"))
    for log in logs:
        for b in batches_in(log.read_bytes()):
            (attrs,) = struct.unpack_from(">h", b, 21)
            if attrs & 0x20:
                kinds.setdefault(attrs, b)
    for attrs, b in sorted(kinds.items()):
        save(d, f"attrs-{attrs:04x}.bin", b)

    d = reset("segment_recovery")
    picked = {}
    for log in logs:
        part = log.parent.name
        if part.startswith(("seed-txn", "seed-comp", "seed-plain")) and log.stat().st_size > 0:
            picked.setdefault(part, log)
    for part, log in sorted(picked.items()):
        save(d, f"{part}.log", log.read_bytes())
    for part_dir in sorted({log.parent for log in logs}):
        segs = sorted(part_dir.glob("*.log"))
        if len(segs) < 2:
            continue
        older, active = segs[0], segs[1]
        out = bytearray(b"OLFZ")
        out += struct.pack(">HHI", 4096, 0, int(active.stem))
        # 0x83: the active .log, with CRCs recomputed after mutations.
        for tag, path in ((0, older), (1, older.with_suffix(".index")),
                          (2, older.with_suffix(".timeindex")), (0x83, active)):
            data = path.read_bytes() if path.exists() else b""
            out += struct.pack(">BI", tag, len(data)) + data
        if int(older.stem) == 0:
            save(d, f"{part_dir.name}-two-segments.bin", bytes(out))
            break

    d = reset("snapshot_load")
    snaps = sorted(data_dir.glob("*/*.snapshot"), key=lambda p: -p.stat().st_size)
    contents = []
    for s in snaps:
        data = s.read_bytes()
        if data not in contents:
            contents.append(data)
    for i, data in enumerate(contents[:4]):
        save(d, f"snapshot-{i}.json", data)
    save(d, "empty-state.json", b'{"producers":{},"ongoing":{}}')
    # Hand-written: an open transaction and an aborted one (the captured
    # snapshots may have been taken between transactions).
    save(d, "open-txn-state.json", (
        b'{"producers":{"7":{"epoch":2,"coordinator_epoch":1,"last_timestamp":1700000000000,'
        b'"batches":[{"first_seq":0,"last_seq":3,"first_offset":2,"last_offset":5,'
        b'"timestamp":1700000000000}],"current_txn_first_offset":2}},"ongoing":{"2":7},'
        b'"aborted":[{"producer_id":7,"first_offset":0,"last_offset":1}]}'))


def main():
    binary = Path(os.environ.get("ONCELOG_BIN", REPO / "target" / "release" / "oncelog"))
    if not os.access(binary, os.X_OK):
        sys.exit(f"no broker binary at {binary}: build it or set ONCELOG_BIN")
    work = Path(tempfile.mkdtemp(prefix="oncelog-seeds-"))
    data_dir = work / "data"
    broker_port, proxy_port = free_port(), free_port()
    proxy = Proxy(proxy_port, ("127.0.0.1", broker_port))
    log = open(work / "broker.log", "wb")
    proc = subprocess.Popen(
        [str(binary), "serve", "--data-dir", str(data_dir),
         "--listen", f"127.0.0.1:{broker_port}", "--metrics-listen", "",
         "-o", f"advertised.listener=127.0.0.1:{proxy_port}",
         "-o", "log.segment.bytes=8192", "-o", "group.initial.rebalance.delay.ms=0"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                sys.exit(f"broker exited early, see {work / 'broker.log'}")
            try:
                socket.create_connection(("127.0.0.1", broker_port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("broker did not start listening")
                time.sleep(0.05)
        clients(f"127.0.0.1:{proxy_port}")
        time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        proxy.close()
        log.close()
    with proxy.lock:
        streams = [bytes(s) for s in proxy.streams if s]
    write_seeds(streams, data_dir)
    shutil.rmtree(work, ignore_errors=True)
    for t in sorted(SEEDS.iterdir()):
        files = list(t.iterdir())
        print(f"{t.name}: {len(files)} seeds, {sum(f.stat().st_size for f in files)} bytes")


if __name__ == "__main__":
    main()
