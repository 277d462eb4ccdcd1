"""/proc readings: per-process CPU, memory and disk writes, the machine's busy
time, and the heavy processes on it that the suite did not start."""
import os
import resource

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid):
    """utime+stime of a process (all its threads), seconds; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def proc_status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def proc_write_bytes(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def system_busy_s():
    """(busy, steal) CPU seconds of the whole machine since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    steal = v[7] if len(v) > 7 else 0
    return busy / CLK_TCK, steal / CLK_TCK


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


FOREIGN_NAMES = ("cargo", "rustc", "cc1", "cc1plus", "ld", "java", "oncelog", "fio", "stress",
                 "rdkafka_perform", "tansu")


def foreign_processes():
    """Heavy-looking processes (builds, brokers) that this suite did not start."""
    me = os.getpid()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = int(d)
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if not comm.startswith(FOREIGN_NAMES):
            continue
        p, ours = pid, False
        for _ in range(64):
            if p in (0, 1):
                break
            if p == me:
                ours = True
                break
            p = _ppid(p)
        if not ours:
            out.append(f"{comm}({pid})")
    return out


def set_affinity_all_threads(pid, cpus):
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(t), cpus)
            except OSError:
                pass
    except OSError:
        pass


def self_cpu_s():
    """utime+stime of this process (all its threads), seconds."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
