"""SASL on a real `oncelog serve` with real clients (issue #16, first part:
listeners, SASL_PLAINTEXT, PLAIN and SCRAM-SHA-256/512, SCRAM users).

Each test's broker has two listeners: PLAINTEXT on the harness's port (the
operator's loopback door, where users are created) and SASL_PLAINTEXT on a
second port. What is proven:

* librdkafka (confluent-kafka) with SCRAM-SHA-512 produces transactionally,
  consumes read_committed in a group and commits offsets; with a wrong
  password, an unknown user or a mechanism the user has no credential for
  it fails with an authentication error and nothing reaches the log.
* kafka-python with PLAIN (checked against the user's SCRAM credential)
  produces and consumes; a wrong password fails.
* Kafka's own `kafka-configs` tool (Java client) adds, describes and deletes
  a SCRAM user against oncelog, and itself authenticates over
  SASL_PLAINTEXT with SCRAM-SHA-256 through a client properties file.
* Before authenticating, a connection may send only ApiVersions and the SASL
  requests: Metadata closes it, as does an oversized frame; a failed
  authentication is answered only after the configured delay.
* Credentials are durable (kill -9), AlterUserScramCredentials refuses bad
  iterations, unknown mechanisms, deleting what is not there and the same
  user twice in one request, and concurrent changes all land.
* KIP-368: with `connections.max.reauth.ms` librdkafka re-authenticates on
  its own connection, and a connection that does not is closed at its next
  request after the session lifetime.
* Metadata advertises the listener the client came in on.
"""

import concurrent.futures
import json
import re
import shutil
import struct
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                   UserScramCredentialDeletion, UserScramCredentialUpsertion)

from clients import create_topic, end_offset, scrape, unique_topic, value
from conftest import REPO_ROOT, both_modes, free_port, oncelog_bin, wait_until
from kafka_wire import Conn, api_versions_request, frame, i16, nullable_string, request_header_v1

KAFKA_LIB = REPO_ROOT / ".tools" / "kafka-lib"
CONFIG_TOOL = "org.apache.kafka.tools.ConfigCommand"

pytestmark = pytest.mark.timeout(240)


class SaslBroker:
    """A broker with PLAINTEXT on `plain` and SASL_PLAINTEXT on `sasl`."""

    def __init__(self, broker_factory, **overrides):
        self.b = broker_factory(start=False)
        # one broker, or each of a cluster's (whose credentials are the
        # cluster's rows)
        self.nodes = getattr(self.b, "brokers", [self.b])
        ports = []
        for n in self.nodes:
            ports.append(free_port())
            n.overrides["listeners"] = (f"PLAINTEXT://127.0.0.1:{n.port},"
                                        f"SASL_PLAINTEXT://127.0.0.1:{ports[-1]}")
            n.overrides.update(overrides)
        self.b.start()
        self.sasl_port = ports[0]
        self.plain = self.b.bootstrap
        self.sasl = ",".join(f"127.0.0.1:{p}" for p in ports)

    def cli(self, *args, sasl=None, check=True):
        argv = [str(oncelog_bin()), *args]
        if sasl:
            mech, user, pw = sasl
            argv += ["--bootstrap", self.sasl, "--security-protocol", "SASL_PLAINTEXT",
                     "--sasl-mechanism", mech, "--sasl-username", user, "--sasl-password", pw]
        else:
            argv += ["--bootstrap", self.plain]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if check:
            assert p.returncode == 0, f"{args}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
        return p

    def add_user(self, name, password, mechanism=None):
        args = ["user", "create", name, "--password", password]
        if mechanism:
            args += ["--mechanism", mechanism]
        self.cli(*args)
        self.settle()

    def settle(self):
        """A cluster's brokers take a change of the credentials at their
        next read of the cluster's rows (announced; at the latest every
        500 ms): wait that long, so the next client may reach any."""
        if len(self.nodes) > 1:
            time.sleep(0.6)

    def metrics(self, node=0):
        return scrape(int(self.nodes[node].overrides["metrics.listen"].rsplit(":", 1)[1]))

    def total(self, name, **labels):
        """A counter summed over every broker."""
        return sum(value(self.metrics(i), name, **labels) or 0 for i in range(len(self.nodes)))


@pytest.fixture
def sb(broker_factory):
    return SaslBroker(broker_factory)


def sasl_conf(bootstrap, mechanism, user, password, **extra):
    return {"bootstrap.servers": bootstrap, "broker.address.family": "v4",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password, **extra}


def auth_error(conf, topic):
    """Produces one record with `conf`; returns the errors librdkafka
    reported (the record must not be delivered)."""
    errors = []
    p = Producer({**conf, "message.timeout.ms": 4000, "error_cb": errors.append})
    delivered = []
    p.produce(topic, b"must-not-arrive", on_delivery=lambda e, m: delivered.append(e))
    p.flush(8)
    assert delivered and delivered[0] is not None, "a record was delivered without authentication"
    return errors


# ------------------------------------------------------------ librdkafka

@both_modes("broker_factory")
def test_scram_sha512_transactions_read_committed_and_offsets(sb):
    sb.add_user("alice", "alice-secret")
    topic = unique_topic("sasl-txn")
    create_topic(sb.plain, topic)
    conf = sasl_conf(sb.sasl, "SCRAM-SHA-512", "alice", "alice-secret")

    p = Producer({**conf, "transactional.id": "sasl-writer-1"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, key=b"k", value=f"committed-{i}".encode(), partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic, value=b"aborted", partition=0)
    p.flush(10)
    p.abort_transaction(30)

    c = Consumer({**conf, "group.id": "sasl-readers", "isolation.level": "read_committed",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF and got:
                break
            continue
        got.append(m.value().decode())
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition(topic, 0)], timeout=15)[0].offset
    c.close()
    assert got == [f"committed-{i}" for i in range(5)]
    assert committed == end_offset(sb.plain, topic)

    assert sb.total("oncelog_authentications_total", listener="SASL_PLAINTEXT",
                    mechanism="SCRAM-SHA-512", result="success") >= 2


@both_modes("broker_factory")
def test_wrong_credentials_fail_and_write_nothing(sb):
    sb.add_user("alice", "alice-secret")
    sb.add_user("bob", "bob-secret", mechanism="SCRAM-SHA-256")
    topic = unique_topic("sasl-deny")
    create_topic(sb.plain, topic)
    for mech, user, pw in [("SCRAM-SHA-512", "alice", "Wr0ng-pass-9x"),
                           ("SCRAM-SHA-512", "nobody", "alice-secret"),
                           ("SCRAM-SHA-512", "bob", "bob-secret"),   # no SHA-512 credential
                           ("PLAIN", "alice", "Wr0ng-pass-9x")]:
        errors = auth_error(sasl_conf(sb.sasl, mech, user, pw), topic)
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), (mech, user, errors)
        if user == "alice" and mech == "SCRAM-SHA-512":
            assert any("invalid credentials" in e.str() for e in errors), errors
    assert end_offset(sb.plain, topic) == 0
    log = sb.b.log_text()
    assert "authentication failed" in log and "Wr0ng-pass-9x" not in log and "alice-secret" not in log
    failures = sb.total("oncelog_authentications_total", listener="SASL_PLAINTEXT",
                        mechanism="SCRAM-SHA-512", result="failure")
    assert failures >= 3


# ------------------------------------------------------------ kafka-python

@both_modes("broker_factory")
def test_plain_with_kafka_python(sb):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaError as KPError
    sb.add_user("carol", "carol-secret", mechanism="SCRAM-SHA-256")
    topic = unique_topic("sasl-plain")
    create_topic(sb.plain, topic)
    common = dict(bootstrap_servers=sb.sasl, security_protocol="SASL_PLAINTEXT",
                  sasl_mechanism="PLAIN", sasl_plain_username="carol")
    p = KafkaProducer(sasl_plain_password="carol-secret", acks="all", **common)
    for i in range(3):
        p.send(topic, value=f"plain-{i}".encode(), partition=0).get(timeout=30)
    p.close()
    c = KafkaConsumer(topic, sasl_plain_password="carol-secret", group_id="kp-plain",
                      auto_offset_reset="earliest", consumer_timeout_ms=5000, **common)
    got = [m.value.decode() for m in c]
    c.commit()
    c.close()
    assert got == ["plain-0", "plain-1", "plain-2"]
    with pytest.raises(KPError):
        bad = KafkaProducer(sasl_plain_password="nope", max_block_ms=5000, **common)
        bad.send(topic, b"x").get(timeout=10)
    assert end_offset(sb.plain, topic) == 3


# ------------------------------------------------------------ Kafka's tool

@both_modes("broker_factory")
@pytest.mark.skipif(not sorted(KAFKA_LIB.glob("kafka-tools-[0-9]*.jar")),
                    reason="no kafka-tools jar (test.sh fetches it)")
def test_kafka_configs_manages_scram_users(sb, tmp_path):
    if shutil.which("java") is None:
        pytest.fail("java not found on PATH", pytrace=False)
    sb.add_user("admin", "admin-secret", mechanism="SCRAM-SHA-256")
    sasl_props = tmp_path / "sasl.properties"
    sasl_props.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required '
        'username="admin" password="admin-secret";\n'
        "default.api.timeout.ms=30000\nrequest.timeout.ms=10000\n")

    def tool(*args, over_sasl=False):
        server = sb.sasl if over_sasl else sb.plain
        argv = ["java", "-Xmx256m", "-cp", f"{KAFKA_LIB}/*", CONFIG_TOOL,
                "--bootstrap-server", server, *args]
        if over_sasl:
            argv += ["--command-config", str(sasl_props)]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, f"kafka-configs {args}: {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
        return p.stdout

    tool("--alter", "--entity-type", "users", "--entity-name", "dave",
         "--add-config", "SCRAM-SHA-256=[iterations=8192,password=dave-secret],"
                         "SCRAM-SHA-512=[password=dave-secret]", over_sasl=True)
    out = tool("--describe", "--entity-type", "users", "--entity-name", "dave", over_sasl=True)
    assert "SCRAM-SHA-256=iterations=8192" in out and "SCRAM-SHA-512=iterations=4096" in out, out
    listed = json.loads(sb.cli("user", "list", "--json").stdout)
    assert {u["user"] for u in listed} == {"admin", "dave"}

    # dave authenticates with what the tool set.
    sb.cli("topic", "list", sasl=("SCRAM-SHA-512", "dave", "dave-secret"))
    tool("--alter", "--entity-type", "users", "--entity-name", "dave",
         "--delete-config", "SCRAM-SHA-512")
    p = sb.cli("topic", "list", sasl=("SCRAM-SHA-512", "dave", "dave-secret"), check=False)
    assert p.returncode != 0 and "authentication failed" in p.stderr, p.stderr
    sb.cli("topic", "list", sasl=("SCRAM-SHA-256", "dave", "dave-secret"))


# ------------------------------------------------------------ the wire

def sasl_handshake(version, cid, mechanism):
    return frame(request_header_v1(17, version, cid) + i16(len(mechanism)) + mechanism.encode())


def sasl_authenticate_v1(cid, token):
    return frame(request_header_v1(36, 1, cid) + struct.pack(">i", len(token)) + token)


def metadata_v1(cid):
    return frame(request_header_v1(3, 1, cid) + struct.pack(">i", -1))


def read_authenticate_v1(conn, cid):
    body = conn.recv_response(cid)
    code = struct.unpack(">h", body[:2])[0]
    n = struct.unpack(">h", body[2:4])[0]
    pos = 4 + max(n, 0)
    (tlen,) = struct.unpack(">i", body[pos:pos + 4])
    lifetime = struct.unpack(">q", body[pos + 4 + tlen:pos + 12 + tlen])[0]
    return code, lifetime


def plain_login(conn, user, password, cid=1):
    conn.send(sasl_handshake(1, cid, "PLAIN"))
    body = conn.recv_response(cid)
    assert struct.unpack(">h", body[:2])[0] == 0, body
    conn.send(sasl_authenticate_v1(cid + 1, b"\0" + user.encode() + b"\0" + password.encode()))
    return read_authenticate_v1(conn, cid + 1)


def test_only_sasl_before_authentication(sb):
    sb.add_user("erin", "erin-secret")
    port = sb.sasl_port
    # ApiVersions is served, Metadata closes the connection.
    c = Conn("127.0.0.1", port)
    c.send(api_versions_request(0, 7))
    assert struct.unpack(">h", c.recv_response(7)[:2])[0] == 0
    c.send(metadata_v1(8))
    assert c.wait_closed(), "Metadata before authentication was served"
    # An oversized frame before authentication closes it too.
    c = Conn("127.0.0.1", port)
    c.send(struct.pack(">i", 10 * 1024 * 1024) + b"\0" * 1024)
    assert c.wait_closed()
    # An unknown mechanism: UNSUPPORTED_SASL_MECHANISM and the offered list.
    c = Conn("127.0.0.1", port)
    c.send(sasl_handshake(1, 3, "GSSAPI"))
    body = c.recv_response(3)
    assert struct.unpack(">h", body[:2])[0] == 33, body
    assert b"SCRAM-SHA-512" in body and b"PLAIN" in body
    # A wrong password is answered SASL_AUTHENTICATION_FAILED, after the delay.
    c = Conn("127.0.0.1", port)
    t0 = time.monotonic()
    code, _ = plain_login(c, "erin", "wrong")
    assert code == 58 and time.monotonic() - t0 >= 0.09
    assert c.wait_closed()
    # The right one, then requests are served.
    c = Conn("127.0.0.1", port)
    assert plain_login(c, "erin", "erin-secret") == (0, 0)
    c.send(metadata_v1(9))
    assert c.recv_response(9)
    # The PLAINTEXT listener refuses a SASL handshake (ILLEGAL_SASL_STATE).
    c = Conn("127.0.0.1", sb.b.port)
    c.send(sasl_handshake(1, 4, "PLAIN"))
    assert struct.unpack(">h", c.recv_response(4)[:2])[0] == 34


def test_session_lifetime_and_reauthentication(broker_factory):
    sb = SaslBroker(broker_factory, **{"connections.max.reauth.ms": 1500})
    sb.add_user("frank", "frank-secret")
    topic = unique_topic("sasl-reauth")
    create_topic(sb.plain, topic)
    # A raw connection that does not re-authenticate is closed at its next
    # request after the session lifetime, which the answer announced.
    c = Conn("127.0.0.1", sb.sasl_port)
    assert plain_login(c, "frank", "frank-secret") == (0, 1500)
    c.send(metadata_v1(5))
    assert c.recv_response(5)
    time.sleep(1.8)
    c.send(metadata_v1(6))
    assert c.wait_closed(), "an expired session was still served"
    # librdkafka re-authenticates on its own and keeps producing.
    p = Producer(sasl_conf(sb.sasl, "SCRAM-SHA-256", "frank", "frank-secret", acks="all"))
    for i in range(8):
        p.produce(topic, f"r-{i}".encode(), partition=0)
        assert p.flush(10) == 0
        time.sleep(0.5)
    assert end_offset(sb.plain, topic) == 8
    wait_until(lambda: "reauthentication=true" in sb.b.log_text(), 10,
               what="a re-authentication in the broker log")


# ------------------------------------------------------------ credentials

@both_modes("broker_factory")
def test_credentials_are_durable_and_alter_is_validated(sb):
    a = AdminClient({"bootstrap.servers": sb.plain, "broker.address.family": "v4"})

    def err(changes):
        out = {}
        for u, f in a.alter_user_scram_credentials(changes).items():
            try:
                f.result(30)
                out[u] = None
            except KafkaException as e:
                out[u] = e.args[0].code()
        return out

    up = lambda user, it=8192, mech=ScramMechanism.SCRAM_SHA_256: UserScramCredentialUpsertion(
        user, ScramCredentialInfo(mech, it), f"{user}-pw".encode())
    assert err([up("too-few", it=1024)]) == {"too-few": KafkaError.UNACCEPTABLE_CREDENTIAL}
    assert err([up("too-many", it=20000)]) == {"too-many": KafkaError.UNACCEPTABLE_CREDENTIAL}
    assert err([UserScramCredentialDeletion("ghost", ScramMechanism.SCRAM_SHA_256)]) == \
        {"ghost": KafkaError.RESOURCE_NOT_FOUND}
    assert err([up("twice"), up("twice")]) == {"twice": KafkaError.DUPLICATE_RESOURCE}
    assert json.loads(sb.cli("user", "list", "--json").stdout) == [], "a refused change left state"

    # Twenty users created at once, from separate connections.
    names = [f"u{i}" for i in range(20)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: sb.add_user(n, f"{n}-pw", mechanism="SCRAM-SHA-256"), names))
    assert err([up("u0", mech=ScramMechanism.SCRAM_SHA_512)]) == {"u0": None}

    sb.b.kill9()
    sb.b.start()
    listed = {u["user"]: u["credentials"] for u in json.loads(sb.cli("user", "list", "--json").stdout)}
    assert set(listed) == set(names)
    assert sorted(c["mechanism"] for c in listed["u0"]) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    sb.cli("topic", "list", sasl=("SCRAM-SHA-256", "u7", "u7-pw"))
    sb.cli("topic", "list", sasl=("SCRAM-SHA-512", "u0", "u0-pw"))
    assert value(sb.metrics(), "oncelog_scram_users") == 20


def test_metadata_advertises_the_listener_of_the_connection(broker_factory):
    sasl_port = free_port()
    sb = SaslBroker(broker_factory, **{
        "advertised.listeners": f"SASL_PLAINTEXT://localhost:{sasl_port}"})
    sb.add_user("gina", "gina-secret")
    plain = json.loads(sb.cli("cluster", "info", "--json").stdout)
    assert [(b["host"], b["port"]) for b in plain["brokers"]] == [("127.0.0.1", sb.b.port)]
    p = subprocess.run([str(oncelog_bin()), "cluster", "info", "--json", "--bootstrap", sb.sasl,
                        "--security-protocol", "SASL_PLAINTEXT", "--sasl-username", "gina",
                        "--sasl-password", "gina-secret"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    brokers = json.loads(p.stdout)["brokers"]
    assert [(b["host"], b["port"]) for b in brokers] == [("localhost", sasl_port)]
    apis = {a["api"] for a in json.loads(p.stdout)["apis"]}
    assert {"SaslHandshake", "SaslAuthenticate", "DescribeUserScramCredentials",
            "AlterUserScramCredentials"} <= apis


def test_a_client_without_sasl_is_told_what_the_listener_expects(sb):
    """The CLI without SASL settings on a SASL listener: the broker answers
    ApiVersions and closes the connection at Metadata (as Kafka does); the
    CLI says what that most likely means, the broker's log names the
    listener and what the client sent before authenticating."""
    p = subprocess.run([str(oncelog_bin()), "topic", "list", "--bootstrap", sb.sasl],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr.startswith(
        f"error: {sb.sasl}: the broker closed the connection during the first request (Metadata): "
        "does this listener expect SASL?"), p.stderr
    assert "--security-protocol SASL_PLAINTEXT" in p.stderr and "--sasl-username" in p.stderr
    wait_until(lambda: "the client sent Metadata before authenticating" in sb.b.log_text(), 10,
               what="the broker's log line")
    line = next(x for x in sb.b.log_text().splitlines()
                if "the client sent Metadata before authenticating" in x)
    assert "listener=SASL_PLAINTEXT" in line, line


def kcat_librdkafka_version():
    kcat = shutil.which("kcat")
    if kcat is None:
        return None
    out = subprocess.run([kcat, "-V"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else None


def test_the_librdkafka_scram_nonce_bug_is_named(sb):
    """librdkafka before 2.6.1 (Debian's kcat) repeats its own nonce in the
    SCRAM client-final message: refused (the check stands), and the broker's
    log names the client bug and the fixed version."""
    version = kcat_librdkafka_version()
    if version is None:
        pytest.skip("kcat (with its librdkafka version) not found")
    sb.add_user("nora", "nora-secret")
    p = subprocess.run(["kcat", "-b", sb.sasl, "-L", "-m", "5",
                        "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=SCRAM-SHA-512",
                        "-X", "sasl.username=nora", "-X", "sasl.password=nora-secret",
                        "-X", "broker.address.family=v4"],
                       capture_output=True, text=True, timeout=60)
    if version >= (2, 6, 1):
        assert p.returncode == 0, p.stderr
        return
    assert p.returncode != 0
    wait_until(lambda: "librdkafka before 2.6.1" in sb.b.log_text(), 10, what="the broker's log line")
    line = next(x for x in sb.b.log_text().splitlines() if "librdkafka before 2.6.1" in x)
    assert "nonce does not match" in line and 'user="nora"' in line, line
    # the client is told too (librdkafka shows the broker's reason)
    assert "librdkafka before 2.6.1" in p.stderr, p.stderr


def test_a_tls_listener_needs_a_keystore(tmp_path):
    p = subprocess.run([str(oncelog_bin()), "serve", "--data-dir", str(tmp_path / "d"),
                        "-o", f"listeners=SSL://127.0.0.1:{free_port()}"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "ssl.keystore.location" in p.stderr, p.stderr
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    p = subprocess.run([str(oncelog_bin()), "serve", "--data-dir", str(tmp_path / "d"),
                        "-o", f"listeners=SSL://127.0.0.1:{free_port()}",
                        "-o", f"ssl.keystore.location={tmp_path / 'bad.pem'}"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "TLS" in p.stderr and "bad.pem" in p.stderr, p.stderr


# ------------------------------------------------------------ limits

def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(300)
def test_ten_thousand_unauthenticated_connections(broker_factory):
    """10,000 connections that never authenticate (each sends ApiVersions,
    the one request allowed before SASL) hold bounded memory, and an
    authenticated client is still served meanwhile."""
    import resource
    import socket
    n = 10_000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 1000:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 2000), hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= n + 1000, "cannot open enough files"
    sb = SaslBroker(broker_factory, **{"connections.max.unauthenticated.ms": 120000})
    sb.add_user("hana", "hana-secret")
    time.sleep(0.5)
    before = rss_kb(sb.b.pid)
    socks = []
    try:
        req = api_versions_request(0, 1)
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", sb.sasl_port), timeout=10)
            s.sendall(req)
            socks.append(s)
        wait_until(lambda: value(sb.metrics(), "oncelog_connections") >= n, 60, interval=0.5,
                   what=f"{n} open connections")
        t0 = time.monotonic()
        sb.cli("topic", "list", sasl=("SCRAM-SHA-512", "hana", "hana-secret"))
        served_s = time.monotonic() - t0
        grown_mb = (rss_kb(sb.b.pid) - before) / 1024
        print(f"{n} unauthenticated connections: broker RSS +{grown_mb:.0f} MB "
              f"({grown_mb * 1024 / n:.1f} KB each); an authenticated client served in {served_s:.2f} s")
        assert grown_mb < 400, f"{grown_mb:.0f} MB for {n} idle connections"
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: value(sb.metrics(), "oncelog_connections") <= 5, 60, interval=0.5,
               what="the connections to close")


def test_connection_limits_and_the_authentication_deadline(broker_factory):
    import socket
    sb = SaslBroker(broker_factory, **{"max.connections.per.ip": 20,
                                       "connections.max.unauthenticated.ms": 1000})
    # From a loopback address of their own, so that no other local client
    # (the harness's readiness probe, a client another test left behind)
    # shares their per-IP count.
    socks = [socket.create_connection(("127.0.0.1", sb.sasl_port), timeout=5,
                                      source_address=("127.0.0.2", 0)) for _ in range(25)]
    try:
        # The ones over the limit are closed at once; the first 20 stay
        # until the authentication deadline closes them too.
        import select
        time.sleep(0.2)
        readable, _, _ = select.select(socks, [], [], 0.3)
        closed = [socks.index(s) for s in readable if s.recv(1) == b""]
        assert sorted(closed) == list(range(20, 25)), closed
        m = sb.metrics()
        assert value(m, "oncelog_connections_refused_total", reason="max_connections_per_ip") == 5
        time.sleep(1.5)
        for s in socks[:20]:
            s.settimeout(3)
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
        wait_until(lambda: value(sb.metrics(), "oncelog_connections_refused_total",
                                 reason="authentication_timeout") == 20, 10, interval=0.2,
                   what="20 authentication timeouts")
    finally:
        for s in socks:
            s.close()
    # Authenticated clients are not held to the deadline.
    sb.add_user("ivy", "ivy-secret")
    c = Conn("127.0.0.1", sb.sasl_port)
    assert plain_login(c, "ivy", "ivy-secret") == (0, 0)
    time.sleep(1.5)
    c.send(metadata_v1(9))
    assert c.recv_response(9)
