"""Output: medians and ranges over runs, number formats, text tables and the
warnings printed next to them."""
import statistics

from produce_bench import pct


def med(xs):
    xs = [x for x in xs if x is not None and x == x]
    return statistics.median(xs) if xs else None


def rng(xs):
    xs = [x for x in xs if x is not None and x == x]
    return (min(xs), max(xs)) if xs else (None, None)


def f0(v):
    return "-" if v is None else f"{v:,.0f}"


def f1(v):
    return "-" if v is None else f"{v:.1f}"


def f2(v):
    return "-" if v is None else f"{v:.2f}"


def f3(v):
    return "-" if v is None else f"{v:.3f}"


def table(headers, rows, notes=()):
    cols = [[str(h)] + [str(r[i]) for r in rows] for i, h in enumerate(headers)]
    w = [max(len(x) for x in c) for c in cols]
    line = lambda cells: "  ".join(str(c).rjust(w[i]) for i, c in enumerate(cells))  # noqa: E731
    print(line(headers))
    print("  ".join("-" * x for x in w))
    for r in rows:
        print(line(r))
    for n in notes:
        print(f"  {n}")
    print(flush=True)


def summarize(runs, keys):
    """Median and range of each key over runs."""
    s = {}
    for k in keys:
        vals = [r.get(k) for r in runs]
        s[k] = med(vals)
        lo, hi = rng(vals)
        s[k + "_min"], s[k + "_max"] = lo, hi
    return s


LOAD_KEYS = ["msgs_per_s", "mb_per_s", "ack_p50_ms", "ack_p99_ms", "ack_p999_ms", "ack_max_ms",
             "bytes_per_sync", "broker_cpu_s_per_gb", "broker_cpu_s_per_mmsg", "broker_rss_hwm_mb",
             "disk_write_amp", "broker_fsync_p50_le_ms", "broker_fsync_p99_le_ms",
             "broker_produce_p50_le_ms", "broker_produce_p99_le_ms", "other_cpu_cores", "steal_cores",
             "ratio", "baseline_mb_per_s", "client_cpu_s"]


def mark(s, args):
    """'!' when other processes used more than --noise-cpu cores in some run."""
    return "!" if (s.get("other_cpu_cores_max") or 0) > args.noise_cpu else ""


def warn_load(r, label):
    if r["errors"] or r["unflushed"] or r["acked"] != r["sent"]:
        print(f"  WARNING {label}: {r['errors']} delivery errors, {r['unflushed']} unflushed, "
              f"{r['sent'] - r['acked']} sent but not acknowledged (last error: {r['last_error']})", flush=True)


def lat_summary(vals, prefix):
    v = sorted(vals)
    return {f"{prefix}p50_ms": pct(v, 50), f"{prefix}p99_ms": pct(v, 99),
            f"{prefix}p999_ms": pct(v, 99.9), f"{prefix}max_ms": v[-1] if v else float("nan")}
