"""Section restart: start-up time after kill -9 on a filled data dir, next to
reading that dir once and starting on an empty one."""
import time
import uuid

from . import GB
from .baselines import dir_bytes, drop_page_cache, read_all_files
from .brokers import scan_log
from .load import closed_loop_load, producer_conf
from .procstat import foreign_processes, loadavg
from .report import f0, f2, f3, summarize, table, warn_load
from .suite_base import SuiteBase


class RestartSection(SuiteBase):
    def restart(self):
        a = self.args
        target = int(a.restart_gb * GB)
        parts = a.restart_partitions
        print(f"== restart after kill -9: {a.restart_gb:g} GB in {parts} partitions", flush=True)
        d = self.path("restart-data")
        fill_settings = [f"log.flush.interval.ms={a.flush_interval_ms}"]
        b = self.oncelog("restart-fill", fill_settings, data_dir=d)
        b.start()
        try:
            conf = producer_conf(b.bootstrap, a, **{"linger.ms": 20, "enable.idempotence": False,
                                                   "queue.buffering.max.kbytes": 256 * 1024})
            chunk = max(1, 1_000_000 // a.restart_msg_size)
            fill = closed_loop_load(b, "restart", a.restart_msg_size, parts, a, seconds=a.restart_fill_seconds,
                                    warmup=0, conf=conf, max_bytes=target, chunk=chunk)
            warn_load(fill, "restart fill")
        finally:
            b.kill9()
            n, msgs = scan_log(b.log_path)
            if n:
                self.log_findings["restart fill"] = {"error_warn_lines": n, "first": msgs}
        on_disk = dir_bytes(d)
        print(f"  filled {fill['acked'] * a.restart_msg_size / GB:.2f} GB payload ({on_disk / GB:.2f} GB on disk) "
              f"at {fill['mb_per_s']:.0f} MB/s, broker killed with SIGKILL", flush=True)
        runs = []
        for run in range(a.runs):
            if a.drop_caches:
                drop_page_cache()
            rb = self.oncelog(f"restart-r{run}", data_dir=d)
            rb.log_path = d.rstrip("/") + f"-restart-r{run}.log"
            try:
                serve_s = rb.start()
                t0 = time.monotonic()
                round_trip_s = produce_fetch_round_trip(rb.bootstrap, "restart", run % parts)
                first_rt = serve_s + (time.monotonic() - t0)
            finally:
                rb.kill9()
                n, msgs = scan_log(rb.log_path)
                if n:
                    self.log_findings[f"restart run {run + 1}"] = {"error_warn_lines": n, "first": msgs}
            ra = read_all_files(d, a.drop_caches)
            eb = self.oncelog(f"empty-r{run}")
            try:
                empty_s = eb.start()
            finally:
                self.finish(eb, f"empty start run {run + 1}")
            r = {"serve_s": serve_s, "first_round_trip_s": first_rt, "round_trip_only_s": round_trip_s,
                 "read_all_s": ra["seconds"], "read_all_bytes": ra["bytes"], "empty_start_s": empty_s,
                 "ratio_to_read_all": serve_s / ra["seconds"] if ra["seconds"] else None,
                 "loadavg": loadavg(), "foreign_processes": foreign_processes()}
            runs.append(r)
            print(f"  run {run + 1}: serving after {serve_s:.3f} s, first produce+fetch after {first_rt:.3f} s; "
                  f"reading all {ra['bytes'] / GB:.2f} GB takes {ra['seconds']:.3f} s; empty-dir start "
                  f"{empty_s:.3f} s", flush=True)
        # One clean restart for comparison.
        clean_s = None
        cb = self.oncelog("restart-clean", data_dir=d)
        cb.log_path = d.rstrip("/") + "-clean.log"
        try:
            cb.start()
            cb.stop(timeout=120)
            if a.drop_caches:
                drop_page_cache()
            clean_s = cb.start()
        finally:
            self.finish(cb, "restart clean")
        s = summarize(runs, ["serve_s", "first_round_trip_s", "read_all_s", "empty_start_s", "ratio_to_read_all"])
        self.out["restart"] = {"gb_target": a.restart_gb, "partitions": parts, "payload_bytes":
                               fill["acked"] * a.restart_msg_size, "disk_bytes": on_disk, "fill": fill,
                               "page_cache": "dropped" if a.drop_caches else "warm",
                               "clean_restart_s": clean_s, "median": s, "runs": runs}
        print(f"\nrestart after kill -9, median of {a.runs} runs ({'cold' if a.drop_caches else 'warm'} page cache)")
        table(["GB on disk", "parts", "fill MB/s", "serving s (min-max)", "produce+fetch s", "read-all s",
               "ratio", "empty start s", "clean restart s"],
              [[f2(on_disk / GB), parts, f0(fill["mb_per_s"]),
                f"{f3(s['serve_s'])} ({f3(s['serve_s_min'])}-{f3(s['serve_s_max'])})",
                f3(s["first_round_trip_s"]), f3(s["read_all_s"]), f2(s["ratio_to_read_all"]),
                f3(s["empty_start_s"]), f3(clean_s)]],
              ["serving = start of the process -> ApiVersions answered; produce+fetch = -> first acks=all "
               "produce and its fetch done;",
               "read-all = reading every file of the data dir once (same cache state); ratio = serving / read-all"])


def produce_fetch_round_trip(bootstrap, topic, partition, timeout=60):
    """Seconds for one acks=all produce and a fetch of that record."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    t0 = time.monotonic()
    got = {}
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                  "message.timeout.ms": int(timeout * 1000)})
    p.produce(topic, b"restart-probe", partition=partition,
              on_delivery=lambda e, m: got.update(err=e, off=m.offset()))
    p.flush(timeout)
    if got.get("err") is not None or "off" not in got:
        raise RuntimeError(f"round-trip produce failed: {got.get('err')}")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"suite-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, partition, got["off"])])
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = c.poll(0.05)
            if m is not None and not m.error() and m.offset() == got["off"]:
                return time.monotonic() - t0
        raise RuntimeError("round-trip fetch timed out")
    finally:
        c.close()
