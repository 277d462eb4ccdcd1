#!/usr/bin/env python3
"""Consume-transform-produce copier for scenario S7 (tests/test_groups.py).

A read_committed consumer in group GROUP subscribed to INPUT and a
transactional producer with a fixed transactional.id. For every batch:
begin a transaction, produce each record transformed to OUTPUT (same
partition, same key, value prefixed with b"out:"), add the consumer's
positions to the transaction with send_offsets_to_transaction (with the
consumer's group metadata, so the coordinator can fence by generation), and
commit.

Exit status: 0 after SIGTERM (finishes the current transaction, closes the
consumer); 3 when the producer is fenced by a newer instance with the same
transactional.id; 2 on any other error (the open transaction is aborted
first when that is still possible). The test kills it with SIGKILL at random
moments and restarts it; every restart resumes from the committed offsets.
"""

import argparse
import os
import random
import signal
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

EXIT_OK = 0
EXIT_ERROR = 2
EXIT_FENCED = 3

FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


def log(*a):
    print(f"[copier {time.monotonic():.3f}]", *a, file=sys.stderr, flush=True)


def is_fenced(exc):
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if err is not None and err.code() in FENCED_CODES:
        return True
    return "fenced" in str(exc).lower()


def close_quietly(consumer, timeout=10):
    t = threading.Thread(target=consumer.close, daemon=True)
    t.start()
    t.join(timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--txn-id", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--max-batch", type=int, default=100)
    ap.add_argument("--tag", default="out", help="output value prefix (TAG:value), to tell jobs apart")
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--txn-sleep-ms", type=int, default=0,
                    help="sleep up to this long after producing and again after adding the "
                         "offsets, so that a kill often lands inside a transaction")
    args = ap.parse_args()
    rng = random.Random()

    def txn_sleep():
        if args.txn_sleep_ms:
            time.sleep(rng.uniform(args.txn_sleep_ms / 5, args.txn_sleep_ms) / 1000)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    fatal = []

    def on_error(err):
        if err.fatal():
            fatal.append(err)
        log("error callback:", err)

    producer = Producer({
        "bootstrap.servers": args.bootstrap,
        "broker.address.family": "v4",
        "transactional.id": args.txn_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 1,
        "transaction.timeout.ms": 60000,
        "error_cb": on_error,
    })
    try:
        # Fences any older instance and aborts its open transaction before
        # this one reads the committed offsets.
        producer.init_transactions(60)
    except KafkaException as e:
        log("init_transactions failed:", e)
        sys.exit(EXIT_FENCED if is_fenced(e) else EXIT_ERROR)
    log("transactions initialised for", args.txn_id)

    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "broker.address.family": "v4",
        "group.id": args.group,
        "client.id": "copier",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": args.session_timeout_ms,
        "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "range",
        "fetch.wait.max.ms": 100,
        # Small fetches and a small prefetch queue, so that the partitions
        # are copied interleaved rather than one after the other.
        "max.partition.fetch.bytes": 8192,
        "queued.min.messages": 500,
        "fetch.queue.backoff.ms": 10,
        "error_cb": on_error,
    })

    batch = []

    def on_assign(_c, parts):
        log("assigned", sorted(tp.partition for tp in parts))

    def on_revoke(_c, parts):
        # Eager protocol: everything is revoked, and a new assignment starts
        # again from the committed offsets. Records polled but not yet
        # copied will be fetched again; drop them.
        log("revoked", sorted(tp.partition for tp in parts), "dropping", len(batch), "uncopied")
        batch.clear()

    def on_lost(_c, parts):
        log("lost", sorted(tp.partition for tp in parts), "dropping", len(batch), "uncopied")
        batch.clear()

    consumer.subscribe([args.input], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)

    copied = 0
    txns = 0
    in_txn = False
    try:
        while not stop.is_set():
            if fatal:
                raise KafkaException(fatal[0])
            deadline = time.monotonic() + 0.2
            while len(batch) < args.max_batch and time.monotonic() < deadline:
                m = consumer.poll(0.05)
                if m is None:
                    continue
                if m.error():
                    raise KafkaException(m.error())
                batch.append(m)
            if not batch:
                continue
            producer.begin_transaction()
            in_txn = True
            for m in batch:
                while True:
                    try:
                        producer.produce(args.output, key=m.key(), value=args.tag.encode() + b":" + m.value(),
                                         partition=m.partition())
                        break
                    except BufferError:
                        producer.poll(0.05)
            txn_sleep()
            positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
            txn_sleep()
            producer.commit_transaction(30)
            in_txn = False
            copied += len(batch)
            txns += 1
            batch.clear()
            if txns % 20 == 0:
                log(f"committed {txns} transactions, {copied} records; positions",
                    {tp.partition: tp.offset for tp in positions})
    except KafkaException as e:
        fenced = is_fenced(e) or any(is_fenced(KafkaException(f)) for f in fatal)
        log("FENCED:" if fenced else "ERROR:", e)
        if in_txn and not fenced:
            try:
                producer.abort_transaction(10)
                log("aborted the open transaction")
            except KafkaException as e2:
                log("abort failed:", e2)
                # a produce() can fail with librdkafka's bare _FATAL before
                # the fatal error's cause reaches us; the abort names it
                fenced = is_fenced(e2)
        close_quietly(consumer)
        sys.stderr.flush()
        # Out at once, past the producer's destructor: librdkafka tearing down
        # a producer with batches in flight after a fatal fence has been seen
        # to abort the process ("double free or corruption"), which would
        # read as a crash rather than the fence it is. A fenced producer has
        # nothing left to deliver.
        os._exit(EXIT_FENCED if fenced else EXIT_ERROR)
    log(f"stopping after {txns} transactions, {copied} records")
    close_quietly(consumer)
    sys.exit(EXIT_OK)


if __name__ == "__main__":
    main()
