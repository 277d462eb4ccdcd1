"""The parts of bench/suite.py, by concern:

  procstat     /proc readings: a process's CPU, RSS, disk writes; the
               machine's busy time; other heavy processes; CPU affinity
  brokers      the brokers under test (oncelog, Apache Kafka, Tansu), their
               start/stop, logs, /metrics samples and deltas over a load
  load         load-generating producer/consumer processes and the
               closed-loop produce load every throughput section uses
  baselines    same-run baselines: loopback TCP, write+fdatasync, reading a
               data dir, page-cache and disk helpers
  report       medians, ranges, number formats and the text tables
  suite_base   what every section uses: data dirs, broker factory, clean-up
  sections_*   one class per section group (throughput: durable, interval;
               latency: ack, e2e; restart; resources)
  sections     the Suite composed of them, and the section order

The modules import the sibling scripts kafka_ref and produce_bench, so the
bench directory is put on sys.path here.
"""
import os
import sys

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

MB = 1e6
GB = 1e9
