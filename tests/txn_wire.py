"""A transactional producer spoken by hand on the Kafka wire, for the tests
that need what no client library exposes: a transaction's producer id and
epoch kept across a "restart" and used again to commit, the way Flink's
KafkaSink resumes a checkpointed transaction (FLINK-BRIEF.md), and EndTxn in
a chosen protocol version (v1: classic; v5: KIP-890 transaction version 2,
which bumps the epoch).

Each call opens a fresh connection, so a test can kill and restart the broker
between any two calls. Errors come back as Kafka error codes, not exceptions.
"""

import kafka_wire as w

API_PRODUCE = 0
API_INIT_PRODUCER_ID = 22
API_ADD_PARTITIONS_TO_TXN = 24
API_END_TXN = 26

ATTR_TRANSACTIONAL = 0x10

NONE = 0
COORDINATOR_LOAD_IN_PROGRESS = 14
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
CONCURRENT_TRANSACTIONS = 51
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
OPERATION_NOT_ATTEMPTED = 55
PRODUCER_FENCED = 90


def _first(bootstrap):
    """(host, port) of a bootstrap's first address: these requests go to one
    broker (in a cluster, any broker serves any of them)."""
    return bootstrap.split(",")[0].rsplit(":", 1)


def _call(bootstrap, request, correlation_id, flexible_response=False):
    host, port = _first(bootstrap)
    with w.Conn(host, int(port)) as c:
        c.send(request)
        body = c.recv_response(correlation_id)
    r = w.Reader(body)
    if flexible_response:
        r.take(1)  # empty tagged fields of response header v1
    return r


def init_producer_id(bootstrap, txn_id, timeout_ms):
    """InitProducerId v1 -> (error, producer_id, epoch)."""
    body = w.nullable_string(txn_id) + w.i32(timeout_ms)
    req = w.frame(w.request_header_v1(API_INIT_PRODUCER_ID, 1, 1) + body)
    r = _call(bootstrap, req, 1)
    r.i32()  # throttle
    err = r.i16()
    pid = r.i64()
    epoch = r.i16()
    return err, pid, epoch


def init_producer_id_v6(bootstrap, txn_id, timeout_ms, enable_2pc, keep_prepared,
                        producer_id=-1, epoch=-1):
    """InitProducerId v6 (KIP-939) -> (error, producer_id, epoch,
    ongoing_producer_id, ongoing_epoch)."""
    body = (w.uvarint(len(txn_id.encode()) + 1) + txn_id.encode() + w.i32(timeout_ms)
            + w.i64(producer_id) + w.i16(epoch)
            + w.i8(1 if enable_2pc else 0) + w.i8(1 if keep_prepared else 0) + w.uvarint(0))
    req = w.frame(w.request_header_v2(API_INIT_PRODUCER_ID, 6, 5) + body)
    r = _call(bootstrap, req, 5, flexible_response=True)
    r.i32()
    return r.i16(), r.i64(), r.i16(), r.i64(), r.i16()


def max_version(bootstrap, api_key):
    """The highest version of `api_key` the broker advertises (ApiVersions v0)."""
    host, port = _first(bootstrap)
    with w.Conn(host, int(port)) as c:
        c.send(w.api_versions_request(0, 6))
        body = c.recv_response(6)
    _, versions = w.parse_api_versions_v0_response(body)
    return versions[api_key][1]


def add_partition(bootstrap, txn_id, pid, epoch, topic, partition):
    """AddPartitionsToTxn v1 for one partition -> its error code."""
    body = (w.string(txn_id) + w.i64(pid) + w.i16(epoch)
            + w.i32(1) + w.string(topic) + w.i32(1) + w.i32(partition))
    req = w.frame(w.request_header_v1(API_ADD_PARTITIONS_TO_TXN, 1, 2) + body)
    r = _call(bootstrap, req, 2)
    r.i32()
    n_topics = r.i32()
    codes = []
    for _ in range(n_topics):
        r.string()
        for _ in range(r.i32()):
            r.i32()
            codes.append(r.i16())
    assert len(codes) == 1, codes
    return codes[0]


def add_partitions_v4(bootstrap, transactions):
    """AddPartitionsToTxn v4 (KIP-890 part 1, broker to broker in Kafka):
    a batch of transactions, each (txn_id, pid, epoch, verify_only,
    {topic: [partitions]}). Returns (top-level error, [(txn_id, {(topic,
    partition): error})] in request order)."""
    def compact_array(items):
        return w.uvarint(len(items) + 1) + b"".join(items)
    entries = []
    for txn_id, pid, epoch, verify_only, topics in transactions:
        ts = [w.compact_string(t) + compact_array([w.i32(p) for p in ps]) + w.uvarint(0)
              for t, ps in topics.items()]
        entries.append(w.compact_string(txn_id) + w.i64(pid) + w.i16(epoch)
                       + w.i8(1 if verify_only else 0) + compact_array(ts) + w.uvarint(0))
    req = w.frame(w.request_header_v2(API_ADD_PARTITIONS_TO_TXN, 4, 7)
                  + compact_array(entries) + w.uvarint(0))
    r = _call(bootstrap, req, 7, flexible_response=True)
    r.i32()  # throttle
    top = r.i16()
    out = []

    def result():
        txn_id = r.compact_string()
        codes = {}

        def topic():
            name = r.compact_string()

            def partition():
                p, code = r.i32(), r.i16()
                r.tagged()
                codes[(name, p)] = code
            r.array(partition)
            r.tagged()
        r.array(topic)
        r.tagged()
        out.append((txn_id, codes))
    r.array(result)
    r.tagged()
    return top, out


def produce(bootstrap, txn_id, pid, epoch, topic, partition, values, base_sequence):
    """A transactional batch (Produce v3) -> (error, base_offset)."""
    batch = w.encode_batch([(None, v, ()) for v in values], attributes=ATTR_TRANSACTIONAL,
                           producer_id=pid, producer_epoch=epoch, base_sequence=base_sequence)
    body = (w.nullable_string(txn_id) + w.i16(-1) + w.i32(10000)
            + w.i32(1) + w.string(topic) + w.i32(1) + w.i32(partition) + w.nbytes(batch))
    req = w.frame(w.request_header_v1(API_PRODUCE, 3, 3) + body)
    r = _call(bootstrap, req, 3)
    r.i32()  # topics
    r.string()
    r.i32()  # partitions
    r.i32()  # index
    err = r.i16()
    base = r.i64()
    return err, base


def produce_v12(bootstrap, txn_id, pid, epoch, topic, partition, values, base_sequence):
    """A transactional batch in Produce v12 (KIP-890 part 2: the partition
    leader adds the partition to the transaction, no AddPartitionsToTxn
    first) -> (error, base_offset)."""
    batch = w.encode_batch([(None, v, ()) for v in values], attributes=ATTR_TRANSACTIONAL,
                           producer_id=pid, producer_epoch=epoch, base_sequence=base_sequence)
    partition_data = w.i32(partition) + w.uvarint(len(batch) + 1) + batch + w.uvarint(0)
    topic_data = w.compact_string(topic) + w.uvarint(2) + partition_data + w.uvarint(0)
    body = (w.compact_string(txn_id) + w.i16(-1) + w.i32(10000)
            + w.uvarint(2) + topic_data + w.uvarint(0))
    req = w.frame(w.request_header_v2(API_PRODUCE, 12, 8) + body)
    r = _call(bootstrap, req, 8, flexible_response=True)
    answers = []

    def partition_response():
        r.i32()  # index
        err, base = r.i16(), r.i64()
        r.i64()  # log append time
        r.i64()  # log start offset
        r.array(lambda: (r.i32(), r.compact_string(), r.tagged()))  # record errors
        r.compact_string()  # error message
        r.tagged()
        answers.append((err, base))

    def topic_response():
        r.compact_string()
        r.array(partition_response)
        r.tagged()
    r.array(topic_response)
    assert len(answers) == 1, answers
    return answers[0]


def end_txn(bootstrap, txn_id, pid, epoch, commit, version=1):
    """EndTxn v1 (classic) or v5 (transaction version 2).

    Returns (error, next_producer_id, next_epoch); the last two are None
    for v1, which does not carry them."""
    if version >= 3:
        body = (w.compact_string(txn_id) + w.i64(pid) + w.i16(epoch)
                + w.i8(1 if commit else 0) + w.uvarint(0))
        req = w.frame(w.request_header_v2(API_END_TXN, version, 4) + body)
        r = _call(bootstrap, req, 4, flexible_response=True)
        r.i32()
        err = r.i16()
        if version >= 5:
            return err, r.i64(), r.i16()
        return err, None, None
    body = w.string(txn_id) + w.i64(pid) + w.i16(epoch) + w.i8(1 if commit else 0)
    req = w.frame(w.request_header_v1(API_END_TXN, version, 4) + body)
    r = _call(bootstrap, req, 4)
    r.i32()
    return r.i16(), None, None


def prepared_transaction(bootstrap, txn_id, timeout_ms, topic, values, partition=0):
    """A transaction as a Flink checkpoint leaves it: open, records written
    and acknowledged, not committed. Returns (producer_id, epoch)."""
    err, pid, epoch = init_producer_id(bootstrap, txn_id, timeout_ms)
    assert err == NONE, f"InitProducerId: error {err}"
    err = add_partition(bootstrap, txn_id, pid, epoch, topic, partition)
    assert err == NONE, f"AddPartitionsToTxn: error {err}"
    err, _ = produce(bootstrap, txn_id, pid, epoch, topic, partition, values, 0)
    assert err == NONE, f"Produce: error {err}"
    return pid, epoch

