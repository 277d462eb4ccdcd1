"""What every section uses: numbered data dirs under the suite's temp dir,
the oncelog broker factory, and stopping a broker with its log scanned and
its data deleted."""
import os

from .baselines import discard
from .brokers import Oncelog, scan_log


class SuiteBase:
    """State shared by the sections: args (the parsed command line), tmp
    (the temp dir), out (figures by section name, written to the JSON) and
    log_findings (ERROR/WARN lines by broker run). main() also sets kafka_ok,
    tansu_ok and peer_versions ({"kafka": version, "tansu": version})."""

    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp
        self.out = {}
        self.log_findings = {}
        self.n = 0

    def path(self, name):
        self.n += 1
        return os.path.join(self.tmp, f"{self.n:03d}-{name}")

    def oncelog(self, name, settings=(), data_dir=None):
        d = data_dir or self.path(name)
        return Oncelog(self.args.binary, d, d.rstrip("/") + ".log", settings, cpus=self.args.broker_cpus,
                       start_timeout=self.args.start_timeout)

    def finish(self, b, label):
        """Stops a broker, records what its log says and deletes its data:
        a few loads at disk speed write tens of GB, and a full disk would
        fail the next broker (as it did Kafka's, with a log dir failure)."""
        b.stop()
        n, msgs = scan_log(b.log_path)
        if n or b.findings:
            self.log_findings[label] = {"error_warn_lines": n, "first": msgs, "other": b.findings}
        discard(b.data_dir)

    def matrix(self):
        return [(s, p) for s in self.args.sizes for p in self.args.partitions]
