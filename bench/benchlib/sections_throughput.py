"""Sections durable and interval: the closed-loop produce load over the
--sizes x --partitions matrix against oncelog (and any peers), next to a
baseline measured in the same run (write+fdatasync for durable, loopback TCP
for interval)."""
from .baselines import discard, fdatasync_baseline, loopback_tcp
from .brokers import KafkaPeer, TansuPeer, scan_log
from .load import closed_loop_load
from .report import LOAD_KEYS, f0, f1, f2, f3, mark, summarize, table, warn_load
from .suite_base import SuiteBase


class ThroughputSections(SuiteBase):
    def peers(self, section):
        """(key, label, factory(run) -> broker, extra warm-up s) of the peers for a section."""
        a = self.args
        out = []
        if self.kafka_ok:
            variant = "fsync" if section == "durable" else "default"
            label = "Apache Kafka " + ("flush.messages=1" if variant == "fsync" else "defaults (no fsync)")
            out.append((f"kafka_{variant}", label,
                        lambda run, v=variant: KafkaPeer(self.path(f"kafka-{v}-r{run}"), v, a.kafka_lib,
                                                         cpus=a.broker_cpus),
                        a.kafka_extra_warmup))
        if self.tansu_ok and (section == "interval" or not a.tansu_storage.startswith("memory:")):
            out.append(("tansu", f"Tansu {a.tansu_storage}",
                        lambda run: TansuPeer(a.tansu, self.path(f"tansu-{section}-r{run}"), a.tansu_storage,
                                              cpus=a.broker_cpus), 0.0))
        return out

    def throughput_section(self, name, settings, baseline):
        a = self.args
        peers = self.peers(name)
        rows = {m: [] for m in self.matrix()}
        peer_rows = {key: {m: [] for m in self.matrix()} for key, *_ in peers}
        for run in range(a.runs):
            b = self.oncelog(f"{name}-r{run}", settings)
            b.start()
            try:
                for size, parts in self.matrix():
                    r = closed_loop_load(b, f"{name}-{size}-{parts}", size, parts, a)
                    warn_load(r, f"{name} {size} B x{parts}")
                    r.update(baseline(r))
                    rows[(size, parts)].append(r)
                    print(f"  run {run + 1} {name} {size:>5} B x{parts:<3}: {r['msgs_per_s']:>9,.0f} msgs/s "
                          f"{r['mb_per_s']:7.1f} MB/s  ack p50 {r['ack_p50_ms']:.2f} p99 {r['ack_p99_ms']:.2f} "
                          f"p99.9 {r['ack_p999_ms']:.2f} ms | baseline {r['baseline_mb_per_s']:.1f} MB/s "
                          f"ratio {r['ratio']:.3f} | other CPU {r['other_cpu_cores']:.2f} cores", flush=True)
            finally:
                self.finish(b, f"{name} run {run + 1}")
            for key, label, factory, extra_warmup in peers:
                pb = factory(run)
                try:
                    pb.start()
                    for size, parts in self.matrix():
                        r = closed_loop_load(pb, f"{name}-{size}-{parts}", size, parts, a,
                                             warmup=a.warmup + extra_warmup)
                        warn_load(r, f"{label} {size} B x{parts}")
                        peer_rows[key][(size, parts)].append(r)
                        print(f"  run {run + 1} {label} {size:>5} B x{parts:<3}: "
                              f"{r['msgs_per_s']:>9,.0f} msgs/s {r['mb_per_s']:7.1f} MB/s  ack p50 "
                              f"{r['ack_p50_ms']:.2f} p99 {r['ack_p99_ms']:.2f} p99.9 {r['ack_p999_ms']:.2f} ms",
                              flush=True)
                except Exception as e:  # noqa: BLE001 - a peer failing must not lose oncelog's figures
                    print(f"  {label} failed: {e}", flush=True)
                finally:
                    pb.stop()
                    n, msgs = scan_log(pb.log_path)
                    if n:
                        self.log_findings[f"{label} ({name}) run {run + 1}"] = {"error_warn_lines": n,
                                                                               "first": msgs}
                    discard(pb.data_dir)
        result = []
        for (size, parts), runs in rows.items():
            s = summarize(runs, LOAD_KEYS)
            entry = {"size": size, "partitions": parts, "median": s, "runs": runs, "peers": {}}
            for key, label, _f, _w in peers:
                pr = peer_rows[key][(size, parts)]
                if not pr:
                    continue
                ps = summarize(pr, LOAD_KEYS)
                entry["peers"][key] = {
                    "label": label, "median": ps, "runs": pr,
                    "oncelog_over_peer_msgs_per_s": s["msgs_per_s"] / ps["msgs_per_s"] if ps["msgs_per_s"] else None,
                    "oncelog_over_peer_ack_p99": s["ack_p99_ms"] / ps["ack_p99_ms"] if ps["ack_p99_ms"] else None}
            result.append(entry)
        return result

    def durable(self):
        a = self.args
        print(f"== durable produce (fsync before ack), {a.producers} producer processes, idempotent, acks=all, "
              f"{a.warmup:g}+{a.seconds:g} s per load", flush=True)

        def baseline(r):
            bps = r.get("bytes_per_sync") or 65536
            # Best of two: the first measurement right after a load is often
            # slowed by the load's leftovers (journal, discards), and a
            # too-low baseline would flatter the ratio.
            tries = [fdatasync_baseline(self.tmp, bps, r["acked"] * r["size"], a.baseline_seconds)
                     for _ in range(2)]
            raw = max(tries, key=lambda x: x["mb_per_s"])
            raw["tries_mb_per_s"] = [x["mb_per_s"] for x in tries]
            return {"baseline": raw, "baseline_mb_per_s": raw["mb_per_s"],
                    "ratio": r["mb_per_s"] / raw["mb_per_s"] if raw["mb_per_s"] else None}

        res = self.throughput_section("durable", [], baseline)
        self.out["durable"] = res
        rows = []
        for e in res:
            s = e["median"]
            rows.append([e["size"], e["partitions"], f0(s["msgs_per_s"]),
                         f"{f1(s['mb_per_s'])} ({f1(s['mb_per_s_min'])}-{f1(s['mb_per_s_max'])})",
                         f2(s["ack_p50_ms"]), f2(s["ack_p99_ms"]), f2(s["ack_p999_ms"]),
                         f0((s["bytes_per_sync"] or 0) / 1024), f1(s["baseline_mb_per_s"]),
                         f2(s["ratio"]) + mark(s, a), f1(s["broker_cpu_s_per_gb"]),
                         f2(s["broker_fsync_p99_le_ms"]) if s["broker_fsync_p99_le_ms"] else "-",
                         f2(s["other_cpu_cores"])])
        print(f"\ndurable produce, median of {a.runs} runs")
        table(["bytes", "parts", "msgs/s", "MB/s (min-max)", "ack p50", "p99", "p99.9", "KiB/sync",
               "raw MB/s", "ratio", "CPU s/GB", "fsync p99<=", "others"], rows,
              ["MB/s = payload; ack latencies in ms, closed loop at saturation (include client queueing);",
               "raw MB/s = sequential write+fdatasync at the broker's KiB/sync, same filesystem, same run;",
               "ratio = median over runs of broker MB/s / raw MB/s; fsync p99<= = bucket bound of the broker's "
               "own fdatasync histogram (ms);",
               f"others = cores used by other processes during the load (median); ! = > {a.noise_cpu} in some run"])
        self.peer_table(res)
        return res

    def interval(self):
        a = self.args
        print(f"== interval-flush produce (log.flush.interval.ms={a.flush_interval_ms}), {a.producers} producer "
              f"processes, {a.warmup:g}+{a.seconds:g} s per load", flush=True)

        def baseline(r):
            nbytes = max(r["acked"] * r["size"], 64 << 20)
            lb = loopback_tcp(nbytes)
            return {"baseline": lb, "baseline_mb_per_s": lb["mb_per_s"],
                    "ratio": r["mb_per_s"] / lb["mb_per_s"] if lb["mb_per_s"] else None}

        res = self.throughput_section("interval", [f"log.flush.interval.ms={a.flush_interval_ms}"], baseline)
        self.out["interval"] = res
        rows = []
        for e in res:
            s = e["median"]
            rows.append([e["size"], e["partitions"], f0(s["msgs_per_s"]),
                         f"{f1(s['mb_per_s'])} ({f1(s['mb_per_s_min'])}-{f1(s['mb_per_s_max'])})",
                         f2(s["ack_p50_ms"]), f2(s["ack_p99_ms"]), f2(s["ack_p999_ms"]),
                         f0(s["baseline_mb_per_s"]), f3(s["ratio"]) + mark(s, a), f1(s["broker_cpu_s_per_gb"]),
                         f2(s["other_cpu_cores"])])
        print(f"\ninterval-flush produce, median of {a.runs} runs")
        table(["bytes", "parts", "msgs/s", "MB/s (min-max)", "ack p50", "p99", "p99.9", "loopback MB/s",
               "ratio", "CPU s/GB", "others"], rows,
              ["loopback MB/s = one Python process sending the same payload bytes to another over 127.0.0.1 "
               "(1 MiB sendall/recv_into), same run;",
               "ratio = median over runs of broker MB/s / loopback MB/s; others = cores used by other processes"])
        self.peer_table(res)
        return res

    def peer_table(self, res):
        keys = []
        for e in res:
            keys += [k for k in e["peers"] if k not in keys]
        for key in keys:
            rows, label = [], None
            for e in res:
                if key not in e["peers"]:
                    continue
                pe = e["peers"][key]
                label, k = pe["label"], pe["median"]
                rows.append([e["size"], e["partitions"], f0(k["msgs_per_s"]), f1(k["mb_per_s"]),
                             f2(k["ack_p50_ms"]), f2(k["ack_p99_ms"]), f2(k["ack_p999_ms"]),
                             f1(k["broker_cpu_s_per_gb"]), f2(pe["oncelog_over_peer_msgs_per_s"]),
                             f2(pe["oncelog_over_peer_ack_p99"]), f2(k["other_cpu_cores"])])
            version = self.peer_versions.get(key.split("_")[0], "")
            print(f"{label} ({version}), same load, median of {self.args.runs} runs")
            table(["bytes", "parts", "msgs/s", "MB/s", "ack p50", "p99", "p99.9", "CPU s/GB",
                   "oncelog/peer msgs/s", "oncelog/peer ack p99", "others"], rows)
