"""Section resources: broker CPU per GB and per million messages, disk bytes
per payload byte and peak RSS, next to the CPU of a minimal receiver plus
write+fdatasync for the same bytes."""
from . import GB
from .baselines import fdatasync_baseline, loopback_tcp
from .load import closed_loop_load
from .procstat import proc_status_kb
from .report import f0, f1, f2, mark, med, summarize, table, warn_load
from .suite_base import SuiteBase


class ResourcesSection(SuiteBase):
    def resources(self):
        a = self.args
        print(f"== resources: durable load {a.res_size} B x{a.res_partitions} partitions", flush=True)
        runs = {p: [] for p in a.res_partitions}
        hwm = []
        for run in range(a.runs):
            b = self.oncelog(f"res-r{run}")
            b.start()
            try:
                for parts in a.res_partitions:
                    r = closed_loop_load(b, f"res-{parts}", a.res_size, parts, a)
                    warn_load(r, f"resources x{parts}")
                    nbytes = r["acked"] * a.res_size
                    lb = loopback_tcp(nbytes)
                    fs = fdatasync_baseline(self.tmp, r.get("bytes_per_sync") or 65536, nbytes, a.baseline_seconds)
                    # CPU per GB of each baseline part, over the bytes each actually moved.
                    lb_gb = lb["recv_cpu_s"] / (lb["bytes"] / GB)
                    fs_gb = fs["cpu_s"] / (max(fs["bytes_approx"], 1) / GB)
                    r["baseline_cpu_s_per_gb"] = lb_gb + fs_gb
                    r["baseline_parts"] = {"loopback_recv_cpu_s_per_gb": lb_gb, "write_fdatasync_cpu_s_per_gb": fs_gb}
                    r["ratio"] = (r["broker_cpu_s_per_gb"] / r["baseline_cpu_s_per_gb"]
                                  if r.get("broker_cpu_s_per_gb") and r["baseline_cpu_s_per_gb"] else None)
                    runs[parts].append(r)
                    print(f"  run {run + 1} x{parts}: {nbytes / GB:.2f} GB, broker {r['broker_cpu_s_per_gb']:.1f} CPU s/GB "
                          f"({r['broker_cpu_s_per_mmsg']:.2f} per M msgs), baseline {r['baseline_cpu_s_per_gb']:.1f}, "
                          f"VmHWM {r['broker_rss_hwm_mb']:.0f} MB", flush=True)
            finally:
                hwm.append((proc_status_kb(b.pid, "VmHWM") or 0) / 1024)
                self.finish(b, f"resources run {run + 1}")
        res = []
        keys = ["broker_cpu_s_per_gb", "broker_cpu_s_per_mmsg", "baseline_cpu_s_per_gb", "ratio", "disk_write_amp",
                "broker_rss_hwm_mb", "mb_per_s", "other_cpu_cores"]
        for parts, rr in runs.items():
            res.append({"size": a.res_size, "partitions": parts, "median": summarize(rr, keys), "runs": rr})
        self.out["resources"] = {"loads": res, "peak_rss_mb_per_run": hwm, "peak_rss_mb": med(hwm)}
        rows = []
        for e in res:
            s = e["median"]
            rows.append([e["size"], e["partitions"], f1(s["mb_per_s"]), f1(s["broker_cpu_s_per_gb"]),
                         f2(s["broker_cpu_s_per_mmsg"]), f1(s["baseline_cpu_s_per_gb"]), f2(s["ratio"]) + mark(s, a),
                         f2(s["disk_write_amp"]), f0(s["broker_rss_hwm_mb"])])
        print(f"\nresources (durable load), median of {a.runs} runs; peak RSS over the broker's life "
              f"{f0(med(hwm))} MB")
        table(["bytes", "parts", "MB/s", "CPU s/GB", "CPU s/M msgs", "baseline CPU s/GB", "ratio",
               "disk bytes/payload", "VmHWM MB"], rows,
              ["CPU = broker utime+stime over the load / payload GB acknowledged;",
               "baseline = CPU/GB of a loopback receiver + write+fdatasync at the broker's bytes per sync "
               "(what any broker must spend), same run",
               "disk bytes/payload = /proc/PID/io write_bytes / payload bytes; VmHWM = peak RSS so far"])
