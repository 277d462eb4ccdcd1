"""Load generators and the loads built from them. The *_proc functions run in
processes started with the "spawn" method (run_procs), so they are top-level
functions of this module: a child imports it to find its target. Each takes
(cfg, ready_q, go, start_at, out_q): it reports ("ready", pid) or ("error",
...) on ready_q, waits for `go`, starts at start_at and puts one result dict
on out_q."""
import array
import json
import multiprocessing as mp
import os
import struct
import subprocess
import time
import uuid

from . import MB
from .brokers import broker_delta, broker_sample
from .procstat import foreign_processes, loadavg, self_cpu_s
from .report import lat_summary


def producer_proc(cfg, ready_q, go, start_at, out_q):
    """Closed-loop producer: as fast as the client queue allows for warmup +
    seconds (or until max_bytes), then flush. Counts the acknowledged
    messages whose produce() call fell in the measured window."""
    try:
        if cfg.get("cpus"):
            os.sched_setaffinity(0, cfg["cpus"])
        from confluent_kafka import Producer
        st = {"n": 0, "n_all": 0, "err": 0, "last_err": None}
        lat = array.array("f")
        win = [float("inf"), float("inf")]

        def dr(err, msg):
            if err is not None:
                st["err"] += 1
                st["last_err"] = str(err)
                return
            st["n_all"] += 1
            lt = msg.latency() or 0.0
            if win[0] <= time.monotonic() - lt < win[1]:
                st["n"] += 1
                lat.append(lt * 1000.0)

        conf = dict(cfg["conf"])
        conf["on_delivery"] = dr
        p = Producer(conf)
        topic, parts, size = cfg["topic"], cfg["partitions"], cfg["size"]
        payload = os.urandom(size)
        for part in range(parts):  # metadata, connections, producer id
            p.produce(topic, payload, partition=part)
        if p.flush(60):
            raise RuntimeError("warm-up messages not acknowledged within 60 s")
        st.update(n=0, n_all=0)
        ready_q.put(("ready", os.getpid()))
        if not go.wait(120):
            raise RuntimeError("no start signal")
        t0 = start_at.value
        win[0] = t0 + cfg["warmup"]
        win[1] = win[0] + cfg["seconds"]
        end = win[1]
        max_msgs = cfg.get("max_bytes", 0) // size if cfg.get("max_bytes") else None
        chunk = cfg.get("chunk", 1)
        offset = cfg["index"] * chunk
        while time.monotonic() < t0:
            time.sleep(0.0005)
        cpu0 = self_cpu_s()
        produce, poll = p.produce, p.poll
        k = 0
        while True:
            try:
                produce(topic, payload, partition=((k + offset) // chunk) % parts)
                k += 1
            except BufferError:
                poll(0.0005)
            if k & 127 == 0:
                poll(0)
                if time.monotonic() >= end or (max_msgs is not None and k >= max_msgs):
                    break
        t_stop = time.monotonic()
        left = p.flush(cfg["flush_timeout"])
        out_q.put({"ok": True, "sent": k, "acked_window": st["n"], "acked_all": st["n_all"],
                   "errors": st["err"], "last_error": st["last_err"], "unflushed": left,
                   "t_start": t0, "t_stop": t_stop, "t_end": time.monotonic(),
                   "cpu_s": self_cpu_s() - cpu0, "lat": lat.tobytes()})
    except Exception as e:  # noqa: BLE001
        ready_q.put(("error", repr(e)))
        out_q.put({"ok": False, "error": repr(e)})


def native_producer_proc(cfg, ready_q, go, start_at, out_q):
    """The same closed loop as producer_proc, run by `oncelog bench-load`
    (librdkafka from Rust, no interpreter per message) or `oncelog bench-wire`
    (the Kafka wire protocol spoken directly, blocking I/O, pre-encoded
    records), so the load generator takes less of the machine's CPU from the
    broker under test."""
    proc = None
    try:
        lat_path = os.path.join(cfg["tmp"], f"lat-{os.getpid()}.f32")
        common = ["--topic", cfg["topic"], "--partitions", str(cfg["partitions"]), "--size", str(cfg["size"]),
                  "--index", str(cfg["index"]), "--flush-timeout", str(cfg["flush_timeout"]),
                  "--latency-file", lat_path]
        if cfg.get("max_bytes"):
            common += ["--max-msgs", str(max(1, cfg["max_bytes"] // cfg["size"]))]
        if cfg["client"] == "wire":
            # the same producer settings, spoken on the wire by the generator
            conf = cfg["conf"]
            if str(conf.get("acks")) not in ("all", "-1"):
                raise RuntimeError("the wire generator only does acks=all produce")
            # it speaks to one broker: with several (a cluster), producer i
            # writes through the i-th of the bootstrap list
            servers = conf["bootstrap.servers"].split(",")
            cmd = [cfg["binary"], "bench-wire", "--bootstrap", servers[cfg["index"] % len(servers)],
                   "--request-bytes", str(conf.get("batch.size", 1_000_000)),
                   "--window", str(conf.get("max.in.flight.requests.per.connection", 5))] + common
            if not conf.get("enable.idempotence"):
                cmd.append("--no-idempotence")
            if cfg.get("rate"):
                cmd += ["--rate", str(cfg["rate"]), "--linger-ms", str(cfg.get("linger_ms") or 1)]
        else:
            cmd = [cfg["binary"], "bench-load", "--chunk", str(cfg.get("chunk", 1))] + common
            for k, v in cfg["conf"].items():
                cmd += ["--conf", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
        pre = (lambda: os.sched_setaffinity(0, cfg["cpus"])) if cfg.get("cpus") else None
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=pre)
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"{cmd[1]} did not start: {line or proc.wait(10)}")
        ready_q.put(("ready", proc.pid))
        if not go.wait(120):
            raise RuntimeError("no start signal")
        proc.stdin.write(f"go {start_at.value!r} {cfg['warmup']!r} {cfg['seconds']!r}\n")
        proc.stdin.flush()
        out = json.loads(proc.stdout.readline())
        proc.wait(30)
        if not out.get("ok"):
            raise RuntimeError(out.get("error"))
        with open(lat_path, "rb") as f:
            out["lat"] = f.read()
        os.unlink(lat_path)
        out_q.put(out)
    except Exception as e:  # noqa: BLE001
        if proc and proc.poll() is None:
            proc.kill()
        ready_q.put(("error", repr(e)))
        out_q.put({"ok": False, "error": repr(e)})


def txn_producer_proc(cfg, ready_q, go, start_at, out_q):
    """Open-loop transactional producer: message k is due at t0 + k/rate and
    carries that time (CLOCK_MONOTONIC, little-endian double) in its first 8
    bytes; commits every commit_ms."""
    try:
        if cfg.get("cpus"):
            os.sched_setaffinity(0, cfg["cpus"])
        from confluent_kafka import Producer
        st = {"n": 0, "n_all": 0, "err": 0, "last_err": None}
        lat = array.array("f")
        win = [float("inf"), float("inf")]
        unpack = struct.Struct("<d").unpack_from

        def dr(err, msg):
            if err is not None:
                st["err"] += 1
                st["last_err"] = str(err)
                return
            st["n_all"] += 1
            if win[0] <= unpack(msg.value())[0] < win[1]:
                st["n"] += 1
                lat.append((msg.latency() or 0.0) * 1000.0)

        conf = dict(cfg["conf"])
        conf["on_delivery"] = dr
        conf["transactional.id"] = f"{cfg['txn_prefix']}-{cfg['index']}"
        p = Producer(conf)
        p.init_transactions(60)
        topic, parts, size = cfg["topic"], cfg["partitions"], cfg["size"]
        buf = bytearray(os.urandom(max(size, 8)))
        struct.pack_into("<d", buf, 0, 0.0)
        p.begin_transaction()
        for part in range(parts):
            p.produce(topic, bytes(buf), partition=part)
        p.commit_transaction(60)
        st.update(n=0, n_all=0)
        ready_q.put(("ready", os.getpid()))
        if not go.wait(120):
            raise RuntimeError("no start signal")
        t0 = start_at.value
        win[0] = t0 + cfg["warmup"]
        win[1] = win[0] + cfg["seconds"]
        end = win[1]
        gap = 1.0 / cfg["rate"]
        commit_s = cfg["commit_ms"] / 1000.0
        commits = []
        while time.monotonic() < t0:
            time.sleep(0.0005)
        cpu0 = self_cpu_s()
        produce, poll, pack = p.produce, p.poll, struct.Struct("<d").pack_into
        k = 0
        due = t0
        p.begin_transaction()
        txn_t0 = time.monotonic()
        max_behind = 0.0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            max_behind = max(max_behind, now - due)
            while due <= now and due < end:
                pack(buf, 0, due)
                try:
                    produce(topic, bytes(buf), partition=k % parts)
                except BufferError:
                    poll(0.001)
                    break
                k += 1
                due = t0 + k * gap
            poll(0)
            now = time.monotonic()
            if now - txn_t0 >= commit_s:
                p.commit_transaction(60)
                t1 = time.monotonic()
                commits.append((t1 - now) * 1000.0)
                p.begin_transaction()
                txn_t0 = t1
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, 0.001))
        t_stop = time.monotonic()
        p.commit_transaction(60)
        left = p.flush(cfg["flush_timeout"])
        out_q.put({"ok": True, "sent": k, "acked_window": st["n"], "acked_all": st["n_all"],
                   "errors": st["err"], "last_error": st["last_err"], "unflushed": left,
                   "t_start": t0, "t_stop": t_stop, "t_end": time.monotonic(),
                   "cpu_s": self_cpu_s() - cpu0, "lat": lat.tobytes(),
                   "commits": array.array("f", commits).tobytes(), "max_behind_s": max_behind})
    except Exception as e:  # noqa: BLE001
        ready_q.put(("error", repr(e)))
        out_q.put({"ok": False, "error": repr(e)})


def consumer_proc(cfg, ready_q, go, start_at, out_q):
    """read_committed consumer on all partitions (assign, no group): latency =
    receive time - the scheduled send time carried in the payload."""
    try:
        if cfg.get("cpus"):
            os.sched_setaffinity(0, cfg["cpus"])
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
        c = Consumer({"bootstrap.servers": cfg["bootstrap"], "group.id": f"suite-{uuid.uuid4().hex[:8]}",
                      "isolation.level": "read_committed", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", **cfg.get("conf", {})})
        c.assign([TopicPartition(cfg["topic"], p, OFFSET_BEGINNING) for p in range(cfg["partitions"])])
        c.consume(1, 1.0)
        ready_q.put(("ready", os.getpid()))
        if not go.wait(120):
            raise RuntimeError("no start signal")
        t0 = start_at.value
        w0 = t0 + cfg["warmup"]
        w1 = w0 + cfg["seconds"]
        hard_end = w1 + cfg["drain_s"]
        idle_s = cfg["idle_s"]
        unpack = struct.Struct("<d").unpack_from
        lat = array.array("f")
        n_all = errors = 0
        last_err = None
        last_msg = time.monotonic()
        cpu0 = self_cpu_s()
        while True:
            now = time.monotonic()
            if now >= hard_end or (now > w1 + idle_s and now - last_msg > idle_s):
                break
            # consume(n, timeout) waits for n messages or the timeout, which would
            # add up to the timeout to every latency: take what is there, else
            # block for the next single message.
            msgs = c.consume(1000, 0)
            if not msgs:
                m = c.poll(0.05)
                if m is None:
                    continue
                msgs = [m]
            now = time.monotonic()
            last_msg = now
            for m in msgs:
                if m.error():
                    errors += 1
                    last_err = str(m.error())
                    continue
                n_all += 1
                t = unpack(m.value())[0]
                if w0 <= t < w1:
                    lat.append((now - t) * 1000.0)
        c.close()
        out_q.put({"ok": True, "consumed_all": n_all, "consumed_window": len(lat), "errors": errors,
                   "last_error": last_err, "cpu_s": self_cpu_s() - cpu0, "lat": lat.tobytes()})
    except Exception as e:  # noqa: BLE001
        ready_q.put(("error", repr(e)))
        out_q.put({"ok": False, "error": repr(e)})



def run_procs(specs, warmup, seconds, timeout, on_start=None):
    """Starts (target, cfg) processes, waits until all are ready, calls
    on_start(), starts them together and returns their result dicts (and the
    start time)."""
    ctx = mp.get_context("spawn")
    ready_q, out_q = ctx.Queue(), ctx.Queue()
    go, start_at = ctx.Event(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=t, args=(c, ready_q, go, start_at, out_q), daemon=True) for t, c in specs]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in procs:
            kind, what = ready_q.get(timeout=120)
            if kind == "error":
                raise RuntimeError(f"load generator failed to start: {what}")
        if on_start:
            on_start()
        start_at.value = time.monotonic() + 0.05
        t0 = start_at.value
        go.set()
        for _ in procs:
            left = max(5.0, t0 + warmup + seconds + timeout - time.monotonic())
            results.append(out_q.get(timeout=left))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join(5)
    bad = [r["error"] for r in results if not r.get("ok")]
    if bad:
        raise RuntimeError(f"load generator failed: {bad[0]}")
    return results, t0


def producer_conf(bootstrap, args, **extra):
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": args.linger_ms,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": args.queue_msgs,
        "queue.buffering.max.kbytes": args.queue_kb,
        "message.timeout.ms": 60_000,
    }
    conf.update(extra)
    return conf


def create_topic(bootstrap, topic, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    fs = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for f in fs.values():
        f.result(timeout=60)


def closed_loop_load(broker, topic, size, partitions, args, seconds=None, warmup=None, conf=None,
                     max_bytes=0, chunk=1, client=None, rate=None, linger_ms=None):
    """The producer load every throughput section uses, with the broker-side
    deltas around it. Returns one flat dict of figures."""
    seconds = args.seconds if seconds is None else seconds
    warmup = args.warmup if warmup is None else warmup
    # Settle the disk first: files removed earlier (a baseline's, a previous
    # data dir) are discarded in the next journal commit on a filesystem
    # mounted with `discard`, which stalls an fdatasync for seconds.
    os.sync()
    create_topic(broker.bootstrap, topic, partitions)
    conf = conf or producer_conf(broker.bootstrap, args)
    n = args.producers
    client = client or args.client
    if rate and client != "wire":
        raise ValueError("a fixed rate needs the wire load generator")
    target = producer_proc if client == "python" else native_producer_proc
    specs = [(target, {"conf": conf, "topic": topic, "partitions": partitions, "size": size,
                       "binary": args.binary, "tmp": args.tmp, "client": client,
                       "rate": rate / n if rate else None, "linger_ms": linger_ms,
                               "warmup": warmup, "seconds": seconds, "index": i, "cpus": args.client_cpus,
                               "flush_timeout": args.flush_timeout, "chunk": chunk,
                               "max_bytes": max_bytes // n if max_bytes else 0})
             for i in range(n)]
    foreign = foreign_processes()
    s0 = {}
    rs, t0 = run_procs(specs, warmup, seconds, args.flush_timeout + 30,
                       on_start=lambda: s0.update(broker_sample(broker)))
    s1 = broker_sample(broker)
    lat = array.array("f")
    for r in rs:
        lat.frombytes(r["lat"])
    acked_window = sum(r["acked_window"] for r in rs)
    acked_all = sum(r["acked_all"] for r in rs)
    t_stop = max(r["t_stop"] for r in rs)
    out = {
        "size": size, "partitions": partitions, "producers": n,
        "sent": sum(r["sent"] for r in rs), "acked": acked_all,
        "errors": sum(r["errors"] for r in rs), "unflushed": sum(r["unflushed"] for r in rs),
        "last_error": next((r["last_error"] for r in rs if r["last_error"]), None),
        "msgs_per_s": acked_window / seconds, "mb_per_s": acked_window * size / seconds / MB,
        "load_seconds": t_stop - t0, "client_cpu_s": sum(r["cpu_s"] for r in rs),
        "loadavg": loadavg(), "foreign_processes": foreign,
    }
    if max_bytes:  # a fill: throughput over the whole run
        out["msgs_per_s"] = acked_all / max(t_stop - t0, 1e-9)
        out["mb_per_s"] = acked_all * size / max(t_stop - t0, 1e-9) / MB
    out.update(lat_summary(lat, "ack_"))
    out.update(broker_delta(s0, s1, acked_all * size, acked_all))
    out.update(noise(s0, s1, out.get("broker_cpu_s"), out["client_cpu_s"]))
    return out


def noise(s0, s1, broker_cpu, client_cpu):
    """CPU used by other processes during a load, in cores (busy - ours)."""
    el = s1["t"] - s0["t"]
    busy = s1["sys"][0] - s0["sys"][0]
    steal = s1["sys"][1] - s0["sys"][1]
    other = busy - (broker_cpu or 0) - (client_cpu or 0)
    return {"other_cpu_cores": max(other, 0.0) / el if el > 0 else None,
            "steal_cores": steal / el if el > 0 else None}


def e2e_load(broker, topic, size, partitions, args, rate, commit_ms, linger_ms, txn_prefix):
    """read_committed end to end at a fixed rate: args.producers open-loop
    transactional producers (txn_producer_proc, committing every commit_ms)
    and one read_committed consumer (consumer_proc) on `topic`, with the
    broker-side deltas around the load. Returns one flat dict of figures:
    ack_* (produce() -> delivery report), e2e_* (scheduled send -> read
    committed), commit_* (commit_transaction calls)."""
    create_topic(broker.bootstrap, topic, partitions)
    pconf = producer_conf(broker.bootstrap, args, **{"transaction.timeout.ms": 60_000, "linger.ms": linger_ms})
    common = {"topic": topic, "partitions": partitions, "size": size, "warmup": args.warmup,
              "seconds": args.seconds, "cpus": args.client_cpus, "txn_prefix": txn_prefix}
    specs = [(consumer_proc, dict(common, bootstrap=broker.bootstrap, drain_s=args.flush_timeout, idle_s=2.0))]
    specs += [(txn_producer_proc, dict(common, conf=pconf, rate=rate / args.producers, commit_ms=commit_ms,
                                       flush_timeout=args.flush_timeout, index=i)) for i in range(args.producers)]
    foreign = foreign_processes()
    s0 = {}
    rs, _t0 = run_procs(specs, args.warmup, args.seconds, args.flush_timeout + 30,
                        on_start=lambda: s0.update(broker_sample(broker)))
    s1 = broker_sample(broker)
    # Results arrive in completion order.
    cons = next(x for x in rs if "consumed_all" in x)
    prods = [x for x in rs if "commits" in x]
    ack, e2e_l, commits = array.array("f"), array.array("f"), array.array("f")
    for p in prods:
        ack.frombytes(p["lat"])
        commits.frombytes(p["commits"])
    e2e_l.frombytes(cons["lat"])
    produced_w = sum(p["acked_window"] for p in prods)
    client_cpu = sum(p["cpu_s"] for p in prods) + cons["cpu_s"]
    r = {"target_msgs_per_s": rate, "achieved_msgs_per_s": produced_w / args.seconds,
         "produced_window": produced_w, "consumed_window": cons["consumed_window"],
         "errors": sum(p["errors"] for p in prods) + cons["errors"],
         "unflushed": sum(p["unflushed"] for p in prods),
         "last_error": next((p["last_error"] for p in prods if p["last_error"]), cons["last_error"]),
         "max_behind_s": max(p["max_behind_s"] for p in prods),
         "client_cpu_s": client_cpu, "client_cpu_cores": client_cpu / (args.warmup + args.seconds),
         "foreign_processes": foreign, "loadavg": loadavg()}
    r.update(lat_summary(ack, "ack_"))
    r.update(lat_summary(e2e_l, "e2e_"))
    r.update(lat_summary(commits, "commit_"))
    total = sum(p["acked_all"] for p in prods)
    r.update(broker_delta(s0, s1, total * size, total))
    r.update(noise(s0, s1, r.get("broker_cpu_s"), r["client_cpu_s"]))
    r["broker_cpu_cores"] = r["broker_cpu_s"] / (s1["t"] - s0["t"]) if r.get("broker_cpu_s") else None
    return r
