"""Hand-encoded Kafka wire frames and record batches, for tests that must send
bytes no well-behaved client would send, and for reading segment files.

Only what the tests need is here: request framing, a v2 record batch encoder,
the Produce v3 request/response, the ApiVersions v0 response, and a walker over
the record batches of a segment file.
"""

import socket
import struct
import time

import crc32c as _crc32c

# Error codes (Kafka wire numbers).
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNSUPPORTED_VERSION = 35
INVALID_RECORD = 87

API_PRODUCE = 0
API_FETCH = 1
API_LIST_OFFSETS = 2
API_METADATA = 3
API_FIND_COORDINATOR = 10
API_CREATE_TOPICS = 19
API_API_VERSIONS = 18

BATCH_HEADER_LEN = 61
# Offsets of fields inside a record batch (from the start of the batch).
OFF_LENGTH = 8
OFF_MAGIC = 16
OFF_CRC = 17
OFF_ATTRIBUTES = 21
OFF_LAST_OFFSET_DELTA = 23
OFF_BASE_TIMESTAMP = 27
OFF_MAX_TIMESTAMP = 35
OFF_RECORD_COUNT = 57

ATTR_COMPRESSION_MASK = 0x07
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20


def crc32c(data):
    return _crc32c.crc32c(data)


# ---------------------------------------------------------------- primitives

def i8(v):
    return struct.pack(">b", v)


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def u32(v):
    return struct.pack(">I", v)


def i64(v):
    return struct.pack(">q", v)


def string(s):
    """Non-nullable string (int16 length)."""
    b = s.encode() if isinstance(s, str) else s
    return i16(len(b)) + b


def nullable_string(s):
    if s is None:
        return i16(-1)
    return string(s)


def nbytes(b):
    """Nullable bytes (int32 length)."""
    if b is None:
        return i32(-1)
    return i32(len(b)) + b


def uvarint(v):
    out = bytearray()
    while True:
        byte = v & 0x7F
        v >>= 7
        if v:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def varint(v):
    """Zigzag-encoded signed varint/varlong."""
    return uvarint((v << 1) ^ (v >> 63))


def compact_string(s):
    b = s.encode()
    return uvarint(len(b) + 1) + b


# ------------------------------------------------------------- record batch

def encode_record(offset_delta, timestamp_delta, key, value, headers=()):
    body = bytearray()
    body += i8(0)  # record attributes (unused)
    body += varint(timestamp_delta)
    body += varint(offset_delta)
    if key is None:
        body += varint(-1)
    else:
        body += varint(len(key)) + key
    if value is None:
        body += varint(-1)
    else:
        body += varint(len(value)) + value
    body += varint(len(headers))
    for hk, hv in headers:
        hkb = hk.encode()
        body += varint(len(hkb)) + hkb
        if hv is None:
            body += varint(-1)
        else:
            body += varint(len(hv)) + hv
    return varint(len(body)) + bytes(body)


def encode_batch(records, base_offset=0, base_timestamp=None, attributes=0,
                 producer_id=-1, producer_epoch=-1, base_sequence=-1,
                 partition_leader_epoch=-1):
    """Build an uncompressed v2 record batch.

    records: list of (key, value, headers) tuples, or pre-encoded record bytes
    (then the caller is responsible for the offset deltas).
    """
    if base_timestamp is None:
        base_timestamp = int(time.time() * 1000)
    encoded = []
    for i, r in enumerate(records):
        if isinstance(r, (bytes, bytearray)):
            encoded.append(bytes(r))
        else:
            key, value, headers = r
            encoded.append(encode_record(i, 0, key, value, headers))
    tail = (
        i16(attributes)
        + i32(len(records) - 1)          # lastOffsetDelta
        + i64(base_timestamp)            # baseTimestamp
        + i64(base_timestamp)            # maxTimestamp
        + i64(producer_id)
        + i16(producer_epoch)
        + i32(base_sequence)
        + i32(len(records))
        + b"".join(encoded)
    )
    crc = crc32c(tail)
    after_length = i32(partition_leader_epoch) + i8(2) + u32(crc) + tail
    return i64(base_offset) + i32(len(after_length)) + after_length


def control_commit_record():
    """The single record of a COMMIT control batch (key: version 0, type 1;
    value: version 0, coordinator epoch 0)."""
    return encode_record(0, 0, i16(0) + i16(1), i16(0) + i32(0), ())


def with_bad_crc(batch):
    b = bytearray(batch)
    b[OFF_CRC] ^= 0xFF
    return bytes(b)


def with_length(batch, new_length):
    b = bytearray(batch)
    b[OFF_LENGTH:OFF_LENGTH + 4] = i32(new_length)
    return bytes(b)


# --------------------------------------------------------------- requests

def request_header_v1(api_key, api_version, correlation_id, client_id="oncelog-tests"):
    return i16(api_key) + i16(api_version) + i32(correlation_id) + nullable_string(client_id)


def request_header_v2(api_key, api_version, correlation_id, client_id="oncelog-tests"):
    return request_header_v1(api_key, api_version, correlation_id, client_id) + uvarint(0)


def frame(payload):
    return i32(len(payload)) + payload


def produce_v3_body(topic, partition, records, acks=-1, timeout_ms=10000):
    return (
        nullable_string(None)          # transactional_id
        + i16(acks)
        + i32(timeout_ms)
        + i32(1) + string(topic)       # topics[1]
        + i32(1) + i32(partition)      # partitions[1]
        + nbytes(records)
    )


def produce_request(version, correlation_id, topic, partition, records, acks=-1):
    """Produce request with request header v1 and the v3 body layout. Right
    for v3..v8 (non-flexible); other versions are sent only to be refused."""
    return frame(request_header_v1(API_PRODUCE, version, correlation_id)
                 + produce_v3_body(topic, partition, records, acks))


def api_versions_request(version, correlation_id):
    if version >= 3:
        body = compact_string("oncelog-tests") + compact_string("0.0.0") + uvarint(0)
        return frame(request_header_v2(API_API_VERSIONS, version, correlation_id) + body)
    return frame(request_header_v1(API_API_VERSIONS, version, correlation_id))


def fetch_v4_request(correlation_id, topic, partition, offset, max_bytes=1 << 20,
                     isolation=0, max_wait_ms=100):
    """Fetch v4 (non-flexible) of one partition from `offset`."""
    body = (i32(-1) + i32(max_wait_ms) + i32(0) + i32(max_bytes) + i8(isolation)
            + i32(1) + string(topic)
            + i32(1) + i32(partition) + i64(offset) + i32(max_bytes))
    return frame(request_header_v1(API_FETCH, 4, correlation_id) + body)


# -------------------------------------------------------------- responses

class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError(f"short response: need {n} bytes at {self.pos}, have {len(self.data)}")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def i16(self):
        return struct.unpack(">h", self.take(2))[0]

    def i32(self):
        return struct.unpack(">i", self.take(4))[0]

    def i64(self):
        return struct.unpack(">q", self.take(8))[0]

    def string(self):
        n = self.i16()
        if n < 0:
            return None
        return self.take(n).decode()

    def remaining(self):
        return len(self.data) - self.pos

    # the flexible versions' compact fields

    def uvarint(self):
        shift = out = 0
        while True:
            b = self.take(1)[0]
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7

    def compact_string(self):
        """A compact (nullable) string: None for null."""
        n = self.uvarint()
        return None if n == 0 else self.take(n - 1).decode()

    def tagged(self):
        """Skips a tagged-fields section."""
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())

    def array(self, item):
        """A compact (nullable) array of item() each: None for null."""
        n = self.uvarint()
        return None if n == 0 else [item() for _ in range(n - 1)]


def parse_produce_v3_response(body):
    """Body after the v0 response header. Returns ({(topic, partition): (error,
    base_offset, log_append_time)}, throttle_ms); rejects trailing bytes."""
    r = Reader(body)
    out = {}
    for _ in range(r.i32()):
        name = r.string()
        for _ in range(r.i32()):
            idx = r.i32()
            err = r.i16()
            base = r.i64()
            append_time = r.i64()
            out[(name, idx)] = (err, base, append_time)
    throttle = r.i32()
    if r.remaining():
        raise ValueError(f"{r.remaining()} trailing bytes in Produce v3 response")
    return out, throttle


def parse_api_versions_v0_response(body):
    r = Reader(body)
    err = r.i16()
    apis = {}
    for _ in range(r.i32()):
        key = r.i16()
        apis[key] = (r.i16(), r.i16())
    if r.remaining():
        raise ValueError(f"{r.remaining()} trailing bytes in ApiVersions v0 response")
    return err, apis


def parse_fetch_v4_response(body):
    """(error_code, high_watermark, last_stable_offset, records bytes) of the
    one partition a fetch_v4_request asked for."""
    r = Reader(body)
    r.i32()                              # throttle_time_ms
    assert r.i32() == 1
    r.string()
    assert r.i32() == 1
    r.i32()                              # partition
    code, hw, lso = r.i16(), r.i64(), r.i64()
    n = r.i32()
    for _ in range(max(n, 0)):           # aborted transactions
        r.i64(), r.i64()
    size = r.i32()
    return code, hw, lso, (r.take(size) if size > 0 else b"")


def fetch_raw(host, port, topic, partition, start=0, end=None):
    """Every batch of a partition as the broker serves it (read_uncommitted,
    markers included), from `start` up to the high watermark (or `end`)."""
    out = bytearray()
    offset, cid = start, 1
    with Conn(host, port) as c:
        while True:
            c.send(fetch_v4_request(cid, topic, partition, offset))
            code, hw, _, data = parse_fetch_v4_response(c.recv_response(cid))
            cid += 1
            if code != 0:
                raise AssertionError(f"fetch {topic}-{partition}@{offset}: error {code}")
            stop = hw if end is None else min(end, hw)
            batches = list(walk_batches(data))
            for b in batches:
                if b.last_offset >= offset:
                    out += data[b.pos:b.pos + b.size]
            if batches:
                offset = max(offset, batches[-1].last_offset + 1)
            if offset >= stop or not batches:
                return bytes(out)


def find_coordinator(host, port, key, key_type=0):
    """(host, port) of the coordinator of a group (key_type 0) or a
    transactional id (1), by FindCoordinator v1 to host:port."""
    cid = 77
    with Conn(host, port) as c:
        c.send(frame(request_header_v1(API_FIND_COORDINATOR, 1, cid) + string(key) + i8(key_type)))
        r = Reader(c.recv_response(cid))
    r.i32()                                  # throttle_time_ms
    code = r.i16()
    message = r.string()
    r.i32()                                  # node id
    chost, cport = r.string(), r.i32()
    if code != 0:
        raise AssertionError(f"FindCoordinator {key!r}: error {code} {message}")
    return chost, cport


def _compact_nullable_string(v):
    return uvarint(0) if v is None else compact_string(v)


def compact_array(items):
    return uvarint(len(items) + 1) + b"".join(items)


def create_topics_v7(host, port, topics, validate_only=False, timeout_ms=30000):
    """CreateTopics v7 (the flexible version with topic ids and configs in
    the answer) to host:port. `topics`: dicts with name, and optionally
    partitions (-1), replication_factor (-1), assignments ({partition:
    [broker ids]}), configs ({name: value}). Returns one dict per topic:
    name, error_code, error_message, num_partitions, replication_factor,
    topic_id (hex), configs ({name: (value, source)}) or None."""
    cid = 91
    body = bytearray()
    entries = []
    for t in topics:
        assignments = [i32(p) + compact_array([i32(b) for b in ids]) + uvarint(0)
                       for p, ids in (t.get("assignments") or {}).items()]
        configs = [compact_string(k) + _compact_nullable_string(v) + uvarint(0)
                   for k, v in (t.get("configs") or {}).items()]
        entries.append(compact_string(t["name"]) + i32(t.get("partitions", -1))
                       + i16(t.get("replication_factor", -1)) + compact_array(assignments)
                       + compact_array(configs) + uvarint(0))
    body += compact_array(entries) + i32(timeout_ms) + i8(1 if validate_only else 0) + uvarint(0)
    with Conn(host, port, timeout=timeout_ms / 1000 + 10) as c:
        c.send(frame(request_header_v2(API_CREATE_TOPICS, 7, cid) + bytes(body)))
        r = Reader(c.recv_response(cid))
    r.tagged()                                # response header v1
    r.i32()                                   # throttle_time_ms

    def topic():
        out = {"name": r.compact_string(), "topic_id": r.take(16).hex(), "error_code": r.i16(),
               "error_message": r.compact_string(), "num_partitions": r.i32(),
               "replication_factor": r.i16()}

        def config():
            name, value = r.compact_string(), r.compact_string()
            r.take(1)                         # read_only
            source = r.take(1)[0]
            r.take(1)                         # is_sensitive
            r.tagged()
            return name, (value, source)
        cs = r.array(config)
        out["configs"] = None if cs is None else dict(cs)
        r.tagged()
        return out
    got = r.array(topic)
    r.tagged()
    return got


# ------------------------------------------------------------------ socket

class Conn:
    """A blocking TCP connection with a deadline on every read."""

    def __init__(self, host, port, timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)

    def send(self, data):
        self.sock.sendall(data)

    def recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"EOF after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def recv_frame(self):
        size = struct.unpack(">i", self.recv_exact(4))[0]
        if size < 4 or size > 64 * 1024 * 1024:
            raise ValueError(f"implausible response size {size}")
        return self.recv_exact(size)

    def recv_response(self, correlation_id):
        """Read one frame; check and strip the v0 response header."""
        data = self.recv_frame()
        (cid,) = struct.unpack(">i", data[:4])
        if cid != correlation_id:
            raise ValueError(f"correlation id {cid}, expected {correlation_id}")
        return data[4:]

    def wait_closed(self, timeout=10.0):
        """True if the peer closes the connection (EOF or reset) within
        timeout without sending anything; raises if data arrives instead."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False
        if data:
            raise AssertionError(f"expected the connection to close, got {len(data)} bytes: {data[:64]!r}")
        return True

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------ group member

API_JOIN_GROUP, API_HEARTBEAT, API_SYNC_GROUP = 11, 12, 14


class WireMember:
    """One consumer-group member speaking JoinGroup, SyncGroup and Heartbeat
    v0 to one broker over its own connection, so a test sees exactly which
    broker answered what, and when. Each call returns the error code."""

    def __init__(self, host, port, group, session_timeout_ms=10000, timeout=10.0):
        self.addr = (host, port)
        self.group = group
        self.session_timeout_ms = session_timeout_ms
        self.timeout = timeout
        self.member_id = ""
        self.generation = -1
        self.conn = None
        self.cid = 0

    def _call(self, api, body):
        if self.conn is None:
            self.conn = Conn(*self.addr, timeout=self.timeout)
        self.cid += 1
        try:
            self.conn.send(frame(request_header_v1(api, 0, self.cid) + body))
            return Reader(self.conn.recv_response(self.cid))
        except (OSError, ValueError, ConnectionError):
            self.close()
            raise

    def join(self):
        """JoinGroup (a one-member "consumer" group with one protocol)."""
        r = self._call(API_JOIN_GROUP, string(self.group) + i32(self.session_timeout_ms)
                       + string(self.member_id) + string("consumer")
                       + i32(1) + string("range") + nbytes(b""))
        code = r.i16()
        generation = r.i32()
        r.string()                        # protocol
        r.string()                        # leader
        member_id = r.string()
        if code == 0:
            self.generation, self.member_id = generation, member_id
        return code

    def sync(self):
        """SyncGroup as the leader, assigning nothing to itself."""
        r = self._call(API_SYNC_GROUP, string(self.group) + i32(self.generation)
                       + string(self.member_id)
                       + i32(1) + string(self.member_id) + nbytes(b""))
        return r.i16()

    def heartbeat(self):
        r = self._call(API_HEARTBEAT, string(self.group) + i32(self.generation)
                       + string(self.member_id))
        return r.i16()

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


# ------------------------------------------------------------ segment files

class BatchInfo:
    __slots__ = ("pos", "size", "base_offset", "last_offset", "attributes",
                 "record_count", "max_timestamp", "crc", "crc_ok")

    def __repr__(self):
        return (f"BatchInfo(pos={self.pos}, size={self.size}, base={self.base_offset}, "
                f"last={self.last_offset}, attrs={self.attributes:#x}, crc_ok={self.crc_ok})")


def walk_batches(data):
    """Yield BatchInfo for every complete batch in a segment's bytes, stopping
    at the first incomplete one. Returns nothing about the torn tail: compare
    the end of the last batch with len(data)."""
    pos = 0
    while pos + 12 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        size = 12 + length
        if length < BATCH_HEADER_LEN - 12 or pos + size > len(data):
            return
        b = BatchInfo()
        b.pos = pos
        b.size = size
        b.base_offset = base
        (b.crc,) = struct.unpack_from(">I", data, pos + OFF_CRC)
        (b.attributes,) = struct.unpack_from(">h", data, pos + OFF_ATTRIBUTES)
        (delta,) = struct.unpack_from(">i", data, pos + OFF_LAST_OFFSET_DELTA)
        (b.record_count,) = struct.unpack_from(">i", data, pos + OFF_RECORD_COUNT)
        (b.max_timestamp,) = struct.unpack_from(">q", data, pos + OFF_MAX_TIMESTAMP)
        b.last_offset = base + delta
        b.crc_ok = crc32c(bytes(data[pos + OFF_ATTRIBUTES:pos + size])) == b.crc
        yield b
        pos += size
