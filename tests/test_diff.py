"""`oncelog diff A B` against a live broker: the check of a blue/green
hand-over (S10), where a shadow topic is compared with the live one before
consumers switch. Equal content in other partitions, other orders and
through transactions (aborted ones ignored) is equal; a changed amount, a
missing key, a duplicate and an extra key are each reported, with the sums;
windows by time and by offset; bad input is a clear error (exit 2)."""

import json
import time
from decimal import Decimal

from confluent_kafka import Producer

from clients import cli, create_topic, flush_all, produce, producer_config, txn_producer, unique_topic

DIFF_TIMEOUT_S = 60


def diff(broker, a, b, *args, json_out=True):
    """Runs `oncelog diff`; returns (exit code, the JSON document or the
    text on stdout, stderr)."""
    # exit 1 (differences) still prints the document: parsed here, not by cli()
    out, p = cli(broker, "diff", a, b, *args, *(["--json"] if json_out else []), json_out=False,
                 check=False, timeout=DIFF_TIMEOUT_S)
    if json_out and p.returncode in (0, 1):
        out = json.loads(out)
    return p.returncode, out, p.stderr


def order(i, amount=None):
    """Order i as (key, JSON value bytes); amounts have cents."""
    amount = round(i * 1.25 + 0.01, 2) if amount is None else amount
    return f"order-{i}".encode(), json.dumps({"id": f"order-{i}", "amount": amount}).encode()


def amount_of(value):
    """The amount of a JSON value as the exact decimal written."""
    return Decimal(repr(json.loads(value)["amount"]))


def plain(d):
    """A Decimal as oncelog prints it: no exponent, no trailing zeros."""
    return format(d.normalize(), "f")


def produce_txn(bootstrap, topic, txn_id, records, partitions, abort_first=()):
    """Writes `records` in one committed transaction, spread round-robin over
    `partitions`, after an aborted transaction of `abort_first`."""
    p = txn_producer(bootstrap, txn_id)
    p.init_transactions(30)
    if abort_first:
        p.begin_transaction()
        for i, (key, value) in enumerate(abort_first):
            p.produce(topic, key=key, value=value, partition=i % partitions)
        p.flush(30)
        p.abort_transaction(30)
    p.begin_transaction()
    for i, (key, value) in enumerate(records):
        p.produce(topic, key=key, value=value, partition=i % partitions)
    p.commit_transaction(30)
    return p


def test_equal_topics_in_other_partitions_and_orders(broker):
    """A plain topic of 3 partitions and a transactional one of 2, written in
    reverse order, with an aborted transaction and an open one that must not
    count: equal, exit 0."""
    a, b = unique_topic("live"), unique_topic("shadow")
    create_topic(broker.bootstrap, a, partitions=3)
    create_topic(broker.bootstrap, b, partitions=2)
    orders = [order(i) for i in range(40)]
    produce(broker.bootstrap, a, orders)
    junk = [order(3, amount=999.99), order(1000)]
    p = produce_txn(broker.bootstrap, b, "diff-eq-" + b, list(reversed(orders)), 2,
                    abort_first=junk)
    # An open transaction holds B's last stable offset: the diff stops there.
    p.begin_transaction()
    p.produce(b, key=b"order-2000", value=order(2000)[1], partition=0)
    p.flush(30)
    try:
        total = sum(amount_of(v) for _, v in orders)
        for keying in (["--key-from-record-key"], ["--key", "id"]):
            started = time.monotonic()
            rc, out, err = diff(broker, a, b, *keying, "--sum", "amount")
            assert rc == 0, (out, err)
            assert time.monotonic() - started < 30
            assert out["equal"] is True
            assert (out["a"]["topic"], out["a"]["partitions"]) == (a, 3)
            assert (out["b"]["topic"], out["b"]["partitions"]) == (b, 2)
            for side in ("a", "b"):
                assert out[side]["records"] == 40 and out[side]["keys"] == 40
                assert out[side]["unkeyed"] == 0
                s = out["sums"]["amount"][side]
                assert Decimal(s["sum"]) == total and s["exact"] is True
                assert (s["numbers"], s["non_numeric"], s["absent"]) == (40, 0, 0)
            assert out["keys"] == 40
            assert out["sums"]["amount"]["equal"] is True
            assert Decimal(out["sums"]["amount"]["difference"]) == 0
            for kind in ("missing", "extra", "mismatch"):
                assert out[kind] == {"count": 0, "examples": []}
        rc, text, err = diff(broker, a, b, "--key", "id", "--sum", "amount", json_out=False)
        assert rc == 0, err
        assert "equal: 40 keys" in text and f"sum amount: A {plain(total)}, B {plain(total)} (equal)" in text
    finally:
        p.abort_transaction(30)


def test_planted_differences_are_each_reported(broker):
    """B has one changed amount, misses one key, holds one record twice and
    one key A lacks: exit 1, each in its category, and the sums differ by
    exactly what was planted."""
    a, b = unique_topic("live"), unique_topic("shadow")
    create_topic(broker.bootstrap, a, partitions=2)
    create_topic(broker.bootstrap, b, partitions=3)
    orders = [order(i) for i in range(30)]
    produce(broker.bootstrap, a, orders)
    shadow = [o for i, o in enumerate(orders) if i != 7]          # order-7 missing
    shadow[3] = order(3, amount=round(json.loads(orders[3][1])["amount"] + 5, 2))  # changed
    shadow.append(orders[11])                                      # order-11 twice
    shadow.append(order(500, amount=0.07))                         # an extra key
    produce_txn(broker.bootstrap, b, "diff-planted-" + b, list(reversed(shadow)), 3)
    planted = (amount_of(shadow[3][1]) - amount_of(orders[3][1]) - amount_of(orders[7][1])
               + amount_of(orders[11][1]) + Decimal("0.07"))

    for keying in (["--key", "id"], ["--key-from-record-key"]):
        rc, out, err = diff(broker, a, b, *keying, "--sum", "amount")
        assert rc == 1, (out, err)
        assert out["equal"] is False
        assert (out["a"]["records"], out["b"]["records"]) == (30, 31)
        assert (out["a"]["keys"], out["b"]["keys"]) == (30, 30)
        assert out["missing"] == {"count": 1, "examples": [{"key": "order-7", "a": 1, "b": 0}]}
        assert out["extra"] == {"count": 1, "examples": [{"key": "order-500", "a": 0, "b": 1}]}
        assert out["mismatch"] == {"count": 2, "examples": [
            {"key": "order-11", "a": 1, "b": 2},
            {"key": "order-3", "a": 1, "b": 1},
        ]}
        s = out["sums"]["amount"]
        assert s["equal"] is False
        assert Decimal(s["difference"]) == planted
        assert Decimal(s["b"]["sum"]) - Decimal(s["a"]["sum"]) == planted

    rc, out, _ = diff(broker, a, b, "--key", "id", "--max-report", "1")
    assert rc == 1
    assert out["mismatch"]["count"] == 2 and len(out["mismatch"]["examples"]) == 1
    rc, text, _ = diff(broker, a, b, "--key", "id", "--sum", "amount", json_out=False)
    assert rc == 1
    assert "DIFFERENT: 1 key missing from B, 1 key extra in B, 2 keys with different values" in text
    assert 'missing from B: "order-7" (1 in A, 0 in B)' in text
    assert 'extra in B: "order-500" (0 in A, 1 in B)' in text
    assert '"order-11" (1 in A, 2 in B), "order-3" (1 in A, 1 in B)' in text
    assert f"difference B - A = {plain(planted)}" in text


def test_unkeyed_records_and_non_numeric_amounts(broker):
    """With --key FIELD, values that are not JSON objects with the field are
    unkeyed, compared as a multiset of their own; amounts that are not
    numbers are counted, numeric strings are summed exactly."""
    a, b = unique_topic("live"), unique_topic("shadow")
    create_topic(broker.bootstrap, a, partitions=1)
    create_topic(broker.bootstrap, b, partitions=1)
    common = [
        (None, b'{"id": "x1", "amount": "10.10"}'),
        (None, b'{"id": "x2", "amount": 0.2}'),
        (None, b'{"id": "x3", "amount": "n/a"}'),
        (None, b'{"id": "x4"}'),
        (None, b"not json at all"),
        (None, b'{"no_id": 1, "amount": 5}'),
    ]
    produce(broker.bootstrap, a, common, partition=0)
    produce(broker.bootstrap, b, list(reversed(common)), partition=0)
    rc, out, err = diff(broker, a, b, "--key", "id", "--sum", "amount")
    assert rc == 0, (out, err)
    for side in ("a", "b"):
        assert out[side]["unkeyed"] == 2 and out[side]["keys"] == 4
        s = out["sums"]["amount"][side]
        assert (s["sum"], s["numbers"], s["non_numeric"], s["absent"]) == ("15.3", 3, 1, 2)
    assert out["a"]["unkeyed_examples"] == ["0@4", "0@5"]
    assert out["sums"]["amount"]["a"]["non_numeric_examples"] == ["0@2"]
    rc, text, _ = diff(broker, a, b, "--key", "id", "--sum", "amount", json_out=False)
    assert rc == 0
    assert "6 records, 4 keys, 2 unkeyed (at 0@4, 0@5) (1 partition)" in text.splitlines()[0]
    assert "  A: 1 value of amount not a number (at 0@2)" in text
    # One more unkeyed record in B: a difference, though every key matches.
    produce(broker.bootstrap, b, [(None, b"not json at all")], partition=0)
    rc, out, _ = diff(broker, a, b, "--key", "id")
    assert rc == 1 and out["unkeyed_equal"] is False
    assert out["missing"]["count"] == out["extra"]["count"] == out["mismatch"]["count"] == 0
    # By record key, all of them are unkeyed (no keys were written).
    rc, out, _ = diff(broker, a, b, "--key-from-record-key")
    assert rc == 1 and (out["a"]["unkeyed"], out["b"]["unkeyed"]) == (6, 7)


def test_windows_by_time_and_by_offset(broker):
    a, b = unique_topic("live"), unique_topic("shadow")
    create_topic(broker.bootstrap, a, partitions=1)
    create_topic(broker.bootstrap, b, partitions=1)
    base = int(time.time() * 1000) - 100_000
    orders = [order(i) for i in range(10)]
    p = Producer(producer_config(broker.bootstrap))
    for i, (k, v) in enumerate(orders):
        p.produce(a, key=k, value=v, partition=0, timestamp=base + i * 1000)
    # B: the same orders at the same offsets, but 0, 1 and 5..9 changed.
    for i, (k, v) in enumerate(orders):
        if not 2 <= i < 5:
            k, v = order(i, amount=-1)
        p.produce(b, key=k, value=v, partition=0, timestamp=base + i * 1000)
    flush_all(p)
    assert diff(broker, a, b, "--key-from-record-key")[0] == 1
    rc, out, err = diff(broker, a, b, "--key-from-record-key",
                        "--from", f"@{base + 2000}", "--to", f"@{base + 5000}")
    assert rc == 0, (out, err)
    assert out["a"]["records"] == out["b"]["records"] == 3
    assert out["window"] == {"from": {"timestamp_ms": base + 2000}, "to": {"timestamp_ms": base + 5000}}
    rc, out, _ = diff(broker, a, b, "--key-from-record-key", "--from", "2", "--to", "5")
    assert rc == 0 and out["a"]["records"] == out["b"]["records"] == 3
    rc, out, _ = diff(broker, a, b, "--key-from-record-key", "--from", "2", "--to", "6")
    assert rc == 1 and out["mismatch"]["examples"] == [{"key": "order-5", "a": 1, "b": 1}]
    # Windows past the end are empty, and empty topics are equal.
    rc, out, _ = diff(broker, a, b, "--key-from-record-key", "--from", "100")
    assert rc == 0 and out["a"]["records"] == 0


def test_bad_input_is_a_clear_error(broker):
    a = unique_topic("live")
    create_topic(broker.bootstrap, a, partitions=1)
    missing = unique_topic("nope")
    for pair in ((a, missing), (missing, a)):
        rc, out, err = diff(broker, *pair, "--key-from-record-key")
        assert rc == 2, (out, err)
        assert f"topic {missing} does not exist" in err and out == ""
    # A missing topic is not created by looking at it.
    rc, _, err = diff(broker, a, missing, "--key-from-record-key")
    assert rc == 2 and "does not exist" in err
    # Exactly one way to key records.
    for args in ([], ["--key", "id", "--key-from-record-key"]):
        rc, _, err = diff(broker, a, a, *args)
        assert rc == 2 and "--key" in err
    rc, _, err = diff(broker, a, a, "--key", "id", "--from", "yesterday")
    assert rc == 2 and "--from must be @TIMESTAMP_MS or an offset" in err
