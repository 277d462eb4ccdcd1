"""Malformed and hostile input on raw sockets. Each case must get the answer
Kafka gives (an error code, or a closed connection), and afterwards the same
broker process must still serve a fresh librdkafka client without having
grown its memory."""

import random
import socket
import struct

import pytest

from clients import (DeliveryTracker, Producer, consume_confluent, create_topic,
                     flush_all, producer_config, watermarks)
import kafka_wire as w

TOPIC = "bad-input"
RSS_GROWTH_LIMIT_KIB = 200 * 1024


class State:
    broker = None
    baseline_rss_kib = None
    correlation = 100


@pytest.fixture(scope="module")
def target(module_broker_factory):
    b = module_broker_factory({"auto.create.topics.enable": "false"})
    create_topic(b.bootstrap, TOPIC, partitions=1)
    State.broker = b
    check_fresh_client_works(b)      # warm up before taking the baseline
    State.baseline_rss_kib = b.rss_kib()
    return b


@pytest.fixture
def broker_ok(target):
    """Yields the shared broker; afterwards checks it survived the test."""
    yield target
    assert target.alive, f"broker died; log tail:\n{target.log_tail(80)}"
    check_fresh_client_works(target)
    growth = target.rss_kib() - State.baseline_rss_kib
    assert growth <= RSS_GROWTH_LIMIT_KIB, \
        f"broker RSS grew by {growth} KiB (baseline {State.baseline_rss_kib} KiB)"


def check_fresh_client_works(b):
    tracker = DeliveryTracker()
    p = Producer(producer_config(b.bootstrap, message_timeout_ms=20000))
    p.produce(TOPIC, key=b"health", value=b"still-serving", partition=0, on_delivery=tracker)
    flush_all(p)
    assert not tracker.failed and len(tracker.acked) == 1, (tracker.failed, tracker.acked)
    _, off, _, _ = tracker.acked[0]
    got = consume_confluent(b.bootstrap, TOPIC, [0], start=off, end=off + 1)[0]
    assert [(r.offset, r.key, r.value) for r in got] == [(off, b"health", b"still-serving")]


def next_cid():
    State.correlation += 1
    return State.correlation


def connect(b, timeout=10.0):
    return w.Conn(b.host, b.port, timeout)


def send_expect_close(conn, data, timeout=10.0, what="request"):
    try:
        conn.send(data)
    except (BrokenPipeError, ConnectionResetError):
        return
    assert conn.wait_closed(timeout), f"broker kept the connection open {timeout}s after {what}"


def produce_v3(b, batch, partition=0):
    cid = next_cid()
    with connect(b) as c:
        c.send(w.produce_request(3, cid, TOPIC, partition, batch))
        body = c.recv_response(cid)
    results, _ = w.parse_produce_v3_response(body)
    assert list(results) == [(TOPIC, partition)], results
    return results[(TOPIC, partition)]


def sample_batch(n=3, tag=b"raw"):
    return w.encode_batch([(b"%s-k%d" % (tag, i), b"%s-v%d" % (tag, i) * 5,
                            [("h", b"%d" % i)]) for i in range(n)])


# ------------------------------------------------------------------ sanity

def test_hand_built_batch_is_accepted(broker_ok):
    """The encoder used by the negative cases produces batches the broker and
    librdkafka accept, so their rejections below are for the intended reason."""
    b = broker_ok
    _, hi = watermarks(b.bootstrap, TOPIC, 0)
    err, base, _ = produce_v3(b, sample_batch(3, b"good"))
    assert (err, base) == (w.NONE, hi)
    got = consume_confluent(b.bootstrap, TOPIC, [0], start=hi, end=hi + 3)[0]
    assert [(r.offset, r.key, r.value, r.headers) for r in got] == [
        (hi + i, b"good-k%d" % i, b"good-v%d" % i * 5, [("h", b"%d" % i)]) for i in range(3)]


# ----------------------------------------------------------------- framing

@pytest.mark.parametrize("prefix", [0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 30])
def test_huge_or_negative_length_prefix_closes_connection(broker_ok, prefix):
    with connect(broker_ok) as c:
        send_expect_close(c, struct.pack(">I", prefix) + b"\x00" * 64,
                          what=f"length prefix {prefix:#x}")


@pytest.mark.parametrize("header", [
    b"\x00\x12",                          # api key only
    b"\x00\x12\x00\x00\x00",              # key, version, 1 byte of correlation id
    b"\x00\x00\x00\x03\x00\x00\x00\x07\x00\x20ab",  # client id length 32, 2 bytes
])
def test_truncated_header_closes_connection(broker_ok, header):
    with connect(broker_ok) as c:
        send_expect_close(c, w.frame(header), what=f"truncated header {header!r}")


def test_eof_in_the_middle_of_a_frame_closes_connection(broker_ok):
    with connect(broker_ok) as c:
        c.send(struct.pack(">i", 100) + b"\x00\x12\x00\x00")
        c.sock.shutdown(socket.SHUT_WR)
        assert c.wait_closed(10), "broker kept a half-closed connection with a partial frame open"


@pytest.mark.parametrize("api_key", [1000, 32767, -1])
def test_unknown_api_key_closes_or_errors(broker_ok, api_key):
    cid = next_cid()
    with connect(broker_ok) as c:
        c.send(w.frame(w.request_header_v1(api_key, 0, cid)))
        try:
            data = c.sock.recv(4)
        except ConnectionResetError:
            return
        if not data:
            return
        # An answer instead of a close must be a well-formed error response.
        c.sock.settimeout(10)
        rest = data + c.recv_exact(4 - len(data)) if len(data) < 4 else data
        size = struct.unpack(">i", rest[:4])[0]
        payload = c.recv_exact(size)
        (got_cid, err) = struct.unpack(">ih", payload[:6])
        assert got_cid == cid and err != 0, f"api key {api_key}: answered {payload[:32]!r}"


# ------------------------------------------------------------- ApiVersions

@pytest.mark.parametrize("version", [5, 127])
def test_unsupported_api_versions_version_gets_v0_fallback(broker_ok, version):
    cid = next_cid()
    with connect(broker_ok) as c:
        c.send(w.api_versions_request(version, cid))
        body = c.recv_response(cid)
        err, apis = w.parse_api_versions_v0_response(body)
        assert err == w.UNSUPPORTED_VERSION, f"error code {err}"
        assert apis.get(w.API_API_VERSIONS, (None, None))[0] == 0 and apis[w.API_API_VERSIONS][1] >= 3, apis
        assert apis[w.API_PRODUCE][0] <= 3 and apis[w.API_PRODUCE][1] >= 10, apis
        assert apis[w.API_FETCH][0] <= 4 and apis[w.API_FETCH][1] >= 12, apis
        assert w.API_METADATA in apis and w.API_LIST_OFFSETS in apis, apis

        # Clients retry on the same connection with a version from the list.
        cid2 = next_cid()
        c.send(w.api_versions_request(0, cid2))
        err, apis0 = w.parse_api_versions_v0_response(c.recv_response(cid2))
        assert err == w.NONE and apis0 == apis


# ----------------------------------------------------------------- Produce

@pytest.mark.parametrize("version", [0, 2, 11, 99])
def test_unsupported_produce_version_closes_connection(broker_ok, version):
    cid = next_cid()
    header = (w.request_header_v2 if version >= 9 else w.request_header_v1)(w.API_PRODUCE, version, cid)
    with connect(broker_ok) as c:
        send_expect_close(c, w.frame(header + w.produce_v3_body(TOPIC, 0, sample_batch())),
                          what=f"Produce v{version}")


def assert_rejected_without_append(b, batch, allowed):
    before = watermarks(b.bootstrap, TOPIC, 0)
    err, base, _ = produce_v3(b, batch)
    assert err in allowed, f"partition error {err}, expected one of {allowed} (base offset {base})"
    assert watermarks(b.bootstrap, TOPIC, 0) == before, "a rejected batch changed the log"


def test_produce_with_bad_crc_is_corrupt_message(broker_ok):
    assert_rejected_without_append(broker_ok, w.with_bad_crc(sample_batch()), {w.CORRUPT_MESSAGE})


def test_produce_with_payload_flipped_under_crc_is_corrupt_message(broker_ok):
    batch = bytearray(sample_batch())
    batch[-5] ^= 0x01
    assert_rejected_without_append(broker_ok, bytes(batch), {w.CORRUPT_MESSAGE})


@pytest.mark.parametrize("delta", [100, 1 << 20, -5, "tiny"])
def test_produce_with_wrong_batch_length_is_rejected(broker_ok, delta):
    batch = sample_batch()
    declared = len(batch) - 12
    new_len = 10 if delta == "tiny" else declared + delta
    assert_rejected_without_append(broker_ok, w.with_length(batch, new_len),
                                   {w.CORRUPT_MESSAGE, w.INVALID_RECORD})


def test_produce_with_trailing_garbage_after_batch_is_rejected(broker_ok):
    assert_rejected_without_append(broker_ok, sample_batch() + b"\x00\x01\x02",
                                   {w.CORRUPT_MESSAGE, w.INVALID_RECORD})


def test_client_written_control_batch_is_invalid_record(broker_ok):
    batch = w.encode_batch([w.control_commit_record()], attributes=w.ATTR_CONTROL)
    assert_rejected_without_append(broker_ok, batch, {w.INVALID_RECORD})


def test_mutated_produce_requests_never_wedge_the_broker(broker_ok):
    """Seeded byte mutations of a valid Produce v3 request. After each one the
    client half-closes; the broker may answer, but must then close."""
    b = broker_ok
    rng = random.Random(1234)
    base = w.produce_request(3, 4242, TOPIC, 0, sample_batch(2, b"fuzz"))
    for i in range(200):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(4, len(data))] = rng.randrange(256)
        with connect(b, timeout=10) as c:
            try:
                c.send(bytes(data))
                c.sock.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                continue
            c.sock.settimeout(10)
            received = 0
            while True:
                try:
                    chunk = c.sock.recv(65536)
                except ConnectionResetError:
                    break
                except socket.timeout:
                    pytest.fail(f"mutation {i}: connection still open 10 s after EOF "
                                f"({received} bytes received); request {bytes(data)!r}")
                if not chunk:
                    break
                received += len(chunk)
        assert b.alive, f"broker died on mutation {i}: {bytes(data)!r}\n{b.log_tail(60)}"


def http_exchange(b, raw, timeout=10):
    """Sends `raw` to the broker's HTTP listener; returns all it answers
    until it closes the connection or goes quiet."""
    host, port = b.overrides["metrics.listen"].rsplit(":", 1)
    out = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(raw)
        try:
            while chunk := s.recv(65536):
                out += chunk
        except socket.timeout:
            pass
    return out


def test_http_listener_keeps_a_connection_and_answers_bad_requests(broker_ok):
    """The HTTP listener (metrics, admin endpoints, console) serves pipelined
    requests on one connection, in order, each naming its cluster; a head
    too large and a bad query are refused with their status; a malformed
    request line gets 400. The broker serves Kafka clients afterwards
    (`broker_ok`)."""
    two = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
           b"GET /v1/transactions/%zz/history HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = http_exchange(broker_ok, two)
    answers = got.split(b"HTTP/1.1 ")[1:]
    assert len(answers) == 2, got
    assert answers[0].startswith(b"200 ") and answers[0].endswith(b"\r\n\r\nok\n"), got
    assert answers[1].startswith(b"400 ") and b"percent-encoding" in answers[1], got
    assert got.lower().count(b"x-oncelog-cluster-id: ") == 2, got
    big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20000 + b"\r\n\r\n"
    got = http_exchange(broker_ok, big)
    assert got.startswith(b"HTTP/1.1 431 "), got[:200]
    got = http_exchange(broker_ok, b"NOT A REQUEST\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 400 "), got[:200]


def test_http_listener_drops_a_head_that_never_ends(broker_ok):
    """A request head still unfinished after 5 s (slowloris) loses its
    connection; the listener keeps serving others."""
    import time
    t0 = time.monotonic()
    got = http_exchange(broker_ok, b"GET /health HTTP/1.1\r\nHost: x\r\n", timeout=20)
    waited = time.monotonic() - t0
    assert b"200 " not in got and 4 <= waited < 15, (got, waited)
    assert http_exchange(broker_ok, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n").endswith(b"ok\n")
