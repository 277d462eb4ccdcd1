#!/usr/bin/env python3
"""One consumer-group member in its own process, for tests/test_groups.py.

Runs a librdkafka (confluent-kafka) or kafka-python consumer subscribed to one
topic and reports, as JSON lines on stdout, every rebalance callback and every
change of its assignment:

    {"t": <time.monotonic()>, "name": ..., "event": "owned", "partitions": [0, 3]}

"t" is CLOCK_MONOTONIC, so the test process can order events of several
members. Events: ready, assigned, revoked, lost, owned, record (with
--report-records), error, closed.

The member leaves the group cleanly (consumer close) when its stdin reaches
EOF or on SIGTERM. The tests also SIGKILL it (the member vanishes without a
LeaveGroup) or SIGSTOP it (it stops heartbeating but keeps its connections).
"""

import argparse
import json
import signal
import sys
import threading
import time

_out_lock = threading.Lock()


def make_emit(name):
    def emit(event, **fields):
        line = json.dumps({"t": time.monotonic(), "name": name, "event": event, **fields})
        with _out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    return emit


def parts(tps):
    return sorted(tp.partition for tp in tps)


def run_confluent(args, emit, stop):
    from confluent_kafka import Consumer

    conf = {
        "bootstrap.servers": args.bootstrap,
        "broker.address.family": "v4",
        "group.id": args.group,
        "client.id": args.client_id or args.name,
        "partition.assignment.strategy": args.strategy,
        "session.timeout.ms": args.session_timeout_ms,
        "heartbeat.interval.ms": args.heartbeat_ms,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": args.isolation_level,
        "fetch.wait.max.ms": 100,
    }
    if args.instance_id:
        conf["group.instance.id"] = args.instance_id
    c = Consumer(conf)
    c.subscribe([args.topic],
                on_assign=lambda _c, p: emit("assigned", partitions=parts(p)),
                on_revoke=lambda _c, p: emit("revoked", partitions=parts(p)),
                on_lost=lambda _c, p: emit("lost", partitions=parts(p)))
    emit("ready")
    last = None
    while not stop.is_set():
        m = c.poll(0.1)
        if m is not None:
            if m.error():
                emit("error", error=str(m.error()))
            elif args.report_records:
                emit("record", partition=m.partition(), offset=m.offset())
        now = parts(c.assignment())
        if now != last:
            emit("owned", partitions=now, member_id=c.memberid())
            last = now
    c.close()


def run_kafka_python(args, emit, stop):
    from kafka import KafkaConsumer
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    assignor = {
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
        "cooperative-sticky": CooperativeStickyAssignor,
    }[args.strategy]

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            emit("revoked", partitions=parts(revoked))

        def on_partitions_assigned(self, assigned):
            emit("assigned", partitions=parts(assigned))

        def on_partitions_lost(self, lost):
            emit("lost", partitions=parts(lost))

    c = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        group_instance_id=args.instance_id or None,
        client_id=args.client_id or args.name,
        partition_assignment_strategy=[assignor],
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_ms,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=args.isolation_level,
        fetch_max_wait_ms=100,
    )
    c.subscribe([args.topic], listener=Listener())
    emit("ready")
    last = None
    while not stop.is_set():
        batches = c.poll(timeout_ms=100)
        if args.report_records:
            for tp, recs in batches.items():
                for r in recs:
                    emit("record", partition=tp.partition, offset=r.offset)
        now = parts(c.assignment())
        if now != last:
            emit("owned", partitions=now)
            last = now
    c.close(autocommit=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", choices=["confluent", "kafka-python"], required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--client-id", default="")
    ap.add_argument("--strategy", default="range")
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--heartbeat-ms", type=int, default=500)
    ap.add_argument("--isolation-level", default="read_uncommitted")
    ap.add_argument("--instance-id", default="")
    ap.add_argument("--report-records", action="store_true")
    args = ap.parse_args()

    emit = make_emit(args.name)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def watch_stdin():
        try:
            while sys.stdin.buffer.read(4096):
                pass
        finally:
            stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        if args.client == "confluent":
            run_confluent(args, emit, stop)
        else:
            run_kafka_python(args, emit, stop)
    except Exception as e:  # reported to the test, which fails on it
        emit("error", error=f"{type(e).__name__}: {e}")
        sys.exit(1)
    emit("closed")


if __name__ == "__main__":
    main()
