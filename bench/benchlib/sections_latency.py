"""Sections ack and e2e: latency at a fixed fraction of the durable peak.
ack: produce ack latency (wire generator, open loop) against the disk's
fdatasync latency; e2e: read_committed end-to-end latency with transactional
producers and a consumer."""
import os
import uuid

from .baselines import fdatasync_baseline
from .load import closed_loop_load, e2e_load
from .report import f0, f1, f2, mark, summarize, table
from .suite_base import SuiteBase


class LatencySections(SuiteBase):
    def ack(self):
        """Produce ack latency at a fraction of the durable peak, against the
        disk's own fdatasync latency at the broker's sync size, same run.
        Uses the wire generator for both the peak and the fixed-rate load:
        a fixed rate needs a generator that can keep it without queueing in
        the client."""
        a = self.args
        size, parts = a.ack_size, a.ack_partitions
        print(f"== produce ack latency at {a.e2e_fraction:.0%} of the durable peak: {size} B x{parts}, "
              f"{a.producers} wire producers, one request every {a.ack_linger_ms:g} ms each, "
              "latency from when each request was due", flush=True)
        runs = []
        for run in range(a.runs):
            b = self.oncelog(f"ack-r{run}")
            b.start()
            try:
                peak = closed_loop_load(b, "ack-peak", size, parts, a, client="wire")
                # One probe's peak swings with the disk (a burst absorbed by a
                # cache looks like a peak); with the durable section measured
                # by the same generator, its median is the steadier figure.
                ref = peak["msgs_per_s"]
                if a.client == "wire":
                    for e in self.out.get("durable", []):
                        if e["size"] == size and e["partitions"] == parts:
                            ref = min(ref, e["median"]["msgs_per_s"])
                target = ref * a.e2e_fraction
                r = closed_loop_load(b, "ack", size, parts, a, client="wire", rate=target,
                                     linger_ms=a.ack_linger_ms)
            finally:
                self.finish(b, f"ack run {run + 1}")
            bps = r.get("bytes_per_sync") or 4096
            fs = fdatasync_baseline(self.tmp, bps, 1 << 40, a.baseline_seconds)
            fs4 = fdatasync_baseline(self.tmp, 4096, 1 << 40, a.baseline_seconds)
            r.update({"peak_msgs_per_s": peak["msgs_per_s"], "target_msgs_per_s": target,
                      "fdatasync_p50_ms": fs["sync_p50_ms"], "fdatasync_p99_ms": fs["sync_p99_ms"],
                      "fdatasync_4k_p99_ms": fs4["sync_p99_ms"],
                      "ack_p99_over_fdatasync_p99": (r["ack_p99_ms"] / fs["sync_p99_ms"]
                                                     if fs["sync_p99_ms"] else None)})
            runs.append(r)
            print(f"  run {run + 1}: peak {peak['msgs_per_s']:,.0f} msgs/s, at {r['msgs_per_s']:,.0f} msgs/s ack "
                  f"p50 {r['ack_p50_ms']:.2f} p99 {r['ack_p99_ms']:.2f} p99.9 {r['ack_p999_ms']:.2f} ms; "
                  f"{(r.get('bytes_per_sync') or 0) / 1024:.0f} KiB/sync, fdatasync of that p99 "
                  f"{fs['sync_p99_ms']:.2f} ms (4 KiB: {fs4['sync_p99_ms']:.2f} ms)", flush=True)
            if r["msgs_per_s"] < 0.9 * target:
                print(f"  WARNING ack run {run + 1}: achieved only {r['msgs_per_s'] / target:.0%} of the target",
                      flush=True)
        keys = ["peak_msgs_per_s", "msgs_per_s", "ack_p50_ms", "ack_p99_ms", "ack_p999_ms", "bytes_per_sync",
                "fdatasync_p50_ms", "fdatasync_p99_ms", "fdatasync_4k_p99_ms", "ack_p99_over_fdatasync_p99",
                "broker_fsync_p99_le_ms", "other_cpu_cores", "client_cpu_s"]
        s = summarize(runs, keys)
        self.out["ack"] = {"size": size, "partitions": parts, "fraction": a.e2e_fraction,
                           "linger_ms": a.ack_linger_ms, "median": s, "runs": runs}
        print(f"\nproduce ack latency at {a.e2e_fraction:.0%} load, median of {a.runs} runs")
        table(["bytes", "parts", "peak msgs/s", "msgs/s", "ack p50", "p99", "p99.9", "KiB/sync",
               "fdatasync p50", "fdatasync p99", "ack p99/fdatasync p99", "4 KiB fdatasync p99"],
              [[size, parts, f0(s["peak_msgs_per_s"]), f0(s["msgs_per_s"]), f2(s["ack_p50_ms"]),
                f2(s["ack_p99_ms"]), f2(s["ack_p999_ms"]), f0((s["bytes_per_sync"] or 0) / 1024),
                f2(s["fdatasync_p50_ms"]), f2(s["fdatasync_p99_ms"]),
                f2(s["ack_p99_over_fdatasync_p99"]) + mark(s, a), f2(s["fdatasync_4k_p99_ms"])]],
              ["ms; ack = when the request was due -> its response (open loop; a client's linger comes on top);",
               "fdatasync = write+fdatasync loop at the broker's KiB/sync on the same filesystem, right after "
               "each run; issue target: ack p99 <= 2x fdatasync p99"])

    def e2e(self):
        a = self.args
        size, parts = a.e2e_size, a.e2e_partitions
        peak, peak_from = None, None
        if a.e2e_rate:
            target, peak_from = a.e2e_rate, "--e2e-rate"
        else:
            for e in self.out.get("durable", []) if a.client == "python" else []:
                if e["size"] == size and e["partitions"] == parts:
                    peak, peak_from = e["median"]["msgs_per_s"], "durable section (median)"
            if peak is None:
                b = self.oncelog("e2e-peak")
                b.start()
                try:
                    # the e2e producers are confluent-kafka in Python: half of
                    # what that client can push is what they can keep
                    r = closed_loop_load(b, "peak", size, parts, a, client="python")
                    peak, peak_from = r["msgs_per_s"], "a one-off durable peak probe (Python client)"
                finally:
                    self.finish(b, "e2e peak probe")
            target = peak * a.e2e_fraction
        print(f"== end-to-end read_committed latency: {size} B x{parts} partitions, target {target:,.0f} msgs/s "
              f"({a.e2e_fraction:.0%} of peak {f0(peak)} from {peak_from}), {a.producers} transactional "
              f"producers committing every {a.e2e_commit_ms:g} ms, linger.ms={a.e2e_linger_ms:g}", flush=True)
        runs = []
        for run in range(a.runs):
            fs = fdatasync_baseline(self.tmp, 4096, 1 << 40, a.baseline_seconds)
            b = self.oncelog(f"e2e-r{run}")
            b.start()
            try:
                r = e2e_load(b, "e2e", size, parts, a, target, a.e2e_commit_ms, a.e2e_linger_ms,
                             f"suite-{uuid.uuid4().hex[:8]}")
            finally:
                self.finish(b, f"e2e run {run + 1}")
            produced_w = r["produced_window"]
            r.update({"fdatasync_p50_ms": fs["sync_p50_ms"], "fdatasync_p99_ms": fs["sync_p99_ms"]})
            r["ack_p99_over_fdatasync_p99"] = (r["ack_p99_ms"] / r["fdatasync_p99_ms"]
                                               if r["fdatasync_p99_ms"] else None)
            runs.append(r)
            print(f"  run {run + 1}: {r['achieved_msgs_per_s']:,.0f} msgs/s, e2e p50 {r['e2e_p50_ms']:.1f} "
                  f"p99 {r['e2e_p99_ms']:.1f} p99.9 {r['e2e_p999_ms']:.1f} ms; ack p99 {r['ack_p99_ms']:.2f} ms vs "
                  f"fdatasync p99 {r['fdatasync_p99_ms']:.2f} ms; commit p99 {r['commit_p99_ms']:.1f} ms; "
                  f"consumed {r['consumed_window']}/{produced_w}", flush=True)
            if r["consumed_window"] != produced_w or r["errors"] or r["unflushed"]:
                print(f"  WARNING e2e run {run + 1}: consumed {r['consumed_window']} of {produced_w} "
                      f"acknowledged in-window messages, {r['errors']} errors, {r['unflushed']} unflushed "
                      f"(last error: {r['last_error']})", flush=True)
            if r["achieved_msgs_per_s"] < 0.9 * target:
                print(f"  WARNING e2e run {run + 1}: achieved only {r['achieved_msgs_per_s'] / target:.0%} of the "
                      f"target rate (producers up to {r['max_behind_s'] * 1000:.0f} ms behind schedule)", flush=True)
        keys = ["achieved_msgs_per_s", "ack_p50_ms", "ack_p99_ms", "ack_p999_ms", "e2e_p50_ms", "e2e_p99_ms",
                "e2e_p999_ms", "e2e_max_ms", "commit_p50_ms", "commit_p99_ms", "fdatasync_p50_ms",
                "fdatasync_p99_ms", "ack_p99_over_fdatasync_p99", "other_cpu_cores", "max_behind_s",
                "broker_fsync_p99_le_ms", "broker_cpu_s_per_gb", "client_cpu_cores", "broker_cpu_cores"]
        s = summarize(runs, keys)
        self.out["e2e"] = {"size": size, "partitions": parts, "commit_ms": a.e2e_commit_ms,
                           "peak_msgs_per_s": peak, "peak_from": peak_from, "target_msgs_per_s": target,
                           "median": s, "runs": runs}
        print(f"\nend-to-end read_committed latency at {target:,.0f} msgs/s target, median of {a.runs} runs")
        table(["bytes", "parts", "msgs/s", "e2e p50", "p99", "p99.9", "ack p50", "ack p99", "ack p99.9",
               "commit p99", "fdatasync p50", "fdatasync p99", "ack p99/fdatasync p99", "broker fsync p99<=",
               "CPU broker/clients/others"],
              [[size, parts, f0(s["achieved_msgs_per_s"]), f1(s["e2e_p50_ms"]), f1(s["e2e_p99_ms"]),
                f1(s["e2e_p999_ms"]), f2(s["ack_p50_ms"]), f2(s["ack_p99_ms"]), f2(s["ack_p999_ms"]),
                f1(s["commit_p99_ms"]), f2(s["fdatasync_p50_ms"]), f2(s["fdatasync_p99_ms"]),
                f2(s["ack_p99_over_fdatasync_p99"]) + mark(s, a), f1(s["broker_fsync_p99_le_ms"]),
                f"{f2(s['broker_cpu_cores'])}/{f2(s['client_cpu_cores'])}/{f2(s['other_cpu_cores'])}"]],
              ["ms; e2e = read_committed receive time - scheduled send time (open loop, includes waiting for "
               "the commit);",
               f"ack = produce() call -> delivery report (includes linger.ms={a.e2e_linger_ms:g}); fdatasync = 4 KiB write+fdatasync loop on the same "
               "filesystem just before each run;",
               "issue target: ack p99 <= 2x fdatasync p99; broker fsync p99<= = bucket bound of the broker's own "
               "fdatasync histogram (ms);",
               f"CPU in cores (of {os.cpu_count()}): when broker+clients+others approach that, latencies measure CPU "
               "queueing, not the broker alone"])
