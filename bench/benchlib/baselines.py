"""Baselines measured in the same run as the broker figures: loopback TCP
between two processes, sequential write+fdatasync, reading a whole data dir;
and the disk and page-cache helpers around them."""
import multiprocessing as mp
import os
import shutil
import socket
import struct
import time

from produce_bench import raw_fdatasync

from . import MB
from .procstat import self_cpu_s


def _loopback_receiver(conn):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    conn.send(srv.getsockname()[1])
    s, _ = srv.accept()
    buf = bytearray(1 << 20)
    n = 0
    cpu0 = self_cpu_s()
    while True:
        k = s.recv_into(buf)
        if not k:
            break
        n += k
    cpu = self_cpu_s() - cpu0
    s.sendall(struct.pack(">qd", n, cpu))
    s.close()
    srv.close()


def loopback_tcp(nbytes, chunk=1 << 20):
    """Moves nbytes over one loopback TCP connection between two processes:
    MB/s and the receiver's CPU seconds."""
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_loopback_receiver, args=(b,), daemon=True)
    p.start()
    try:
        if not a.poll(60):
            raise RuntimeError("loopback receiver did not start")
        port = a.recv()
        buf = memoryview(os.urandom(chunk))
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            t0 = time.perf_counter()
            cpu0 = self_cpu_s()
            sent = 0
            while sent < nbytes:
                k = min(chunk, nbytes - sent)
                s.sendall(buf[:k])
                sent += k
            s.shutdown(socket.SHUT_WR)
            hdr = b""
            while len(hdr) < 16:
                more = s.recv(16 - len(hdr))
                if not more:
                    raise RuntimeError("loopback receiver closed early")
                hdr += more
            el = time.perf_counter() - t0
            send_cpu = self_cpu_s() - cpu0
        got, recv_cpu = struct.unpack(">qd", hdr)
    finally:
        p.join(10)
        if p.is_alive():
            p.terminate()
    return {"bytes": got, "mb_per_s": got / el / MB, "recv_cpu_s": recv_cpu, "send_cpu_s": send_cpu}


def fdatasync_baseline(dirpath, sync_bytes, total_bytes, seconds):
    """produce_bench.raw_fdatasync plus the CPU it took (this process)."""
    t0, w0 = os.times(), time.monotonic()
    r = raw_fdatasync(dirpath, sync_bytes, total_bytes, seconds)
    t1, w1 = os.times(), time.monotonic()
    r["cpu_s"] = (t1.user - t0.user) + (t1.system - t0.system)
    r["sync_bytes"] = int(max(sync_bytes, 512))
    r["bytes_approx"] = r["mb_per_s"] * MB * (w1 - w0)  # raw_fdatasync does not return its byte count
    return r


def read_all_files(d, drop_caches=False):
    if drop_caches:
        drop_page_cache()
    t0 = time.monotonic()
    n = 0
    buf = bytearray(1 << 20)
    for root, _dirs, files in os.walk(d):
        for f in files:
            try:
                with open(os.path.join(root, f), "rb", buffering=0) as fh:
                    while True:
                        k = fh.readinto(buf)
                        if not k:
                            break
                        n += k
            except OSError:
                pass
    return {"bytes": n, "seconds": time.monotonic() - t0}


def discard(d):
    """Deletes a stopped broker's data and commits the deletion, so the
    freed blocks' discards do not stall the next measurement's fdatasync."""
    shutil.rmtree(d, ignore_errors=True)
    os.sync()


def dir_bytes(d):
    n = 0
    for root, _dirs, files in os.walk(d):
        for f in files:
            try:
                n += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return n


def drop_page_cache():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")
