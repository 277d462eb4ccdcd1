"""TLS listeners on a real `oncelog serve` (issue #16, TLS part) with
librdkafka: SASL_SSL with SCRAM-SHA-512, and SSL with client certificates
whose subject is the principal the ACLs name. Certificates are made for
each test with the `openssl` command (an EC CA, a server certificate for
127.0.0.1, client certificates from that CA and from a stranger's).

* SASL_SSL: a transactional producer commits, a read_committed consumer in a
  group reads and commits offsets; a wrong password fails.
* SSL with `ssl.client.auth=required`: a client with a certificate from the
  trusted CA is `User:CN=alice,O=oncelog-test` and writes where its ACL
  lets it; no certificate, a stranger's certificate, or no TLS at all on the
  TLS port: the connection fails and nothing reaches the log.
* The certificate files are read again when they change: a new server
  certificate is served to new connections without a restart.
"""

import json
import os
import socket
import ssl
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)

from clients import create_topic, end_offset, unique_topic
from conftest import free_port, oncelog_bin, wait_until
from kafka_wire import Conn, api_versions_request
from pki import make_ca, make_cert, openssl
from test_java import java_classpath  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def pki(tmp_path):
    d = tmp_path / "pki"
    d.mkdir()
    make_ca(d, "ca")
    make_ca(d, "stranger-ca")
    make_cert(d, "server", "ca", "/CN=localhost", san="IP:127.0.0.1,DNS:localhost")
    make_cert(d, "alice", "ca", "/O=oncelog-test/CN=alice")
    make_cert(d, "mallory", "stranger-ca", "/O=oncelog-test/CN=mallory")
    return d


class TlsBroker:
    def __init__(self, broker_factory, pki, protocol, **overrides):
        self.port = free_port()
        self.b = broker_factory(start=False)
        self.b.overrides.update({
            "listeners": f"PLAINTEXT://127.0.0.1:{self.b.port},{protocol}://127.0.0.1:{self.port}",
            "ssl.keystore.location": str(pki / "server-bundle.pem"),
            **overrides,
        })
        self.b.start()
        self.plain = self.b.bootstrap
        self.tls = f"127.0.0.1:{self.port}"


def test_sasl_ssl_scram_transactions(broker_factory, pki):
    tb = TlsBroker(broker_factory, pki, "SASL_SSL")
    p = subprocess.run([str(oncelog_bin()), "user", "create", "alice", "--password", "alice-pw",
                        "--bootstrap", tb.plain], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    topic = unique_topic("tls-txn")
    create_topic(tb.plain, topic)
    conf = {"bootstrap.servers": tb.tls, "broker.address.family": "v4",
            "security.protocol": "SASL_SSL", "ssl.ca.location": str(pki / "ca.pem"),
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": "alice-pw"}
    prod = Producer({**conf, "transactional.id": "tls-writer"})
    prod.init_transactions(30)
    prod.begin_transaction()
    for i in range(5):
        prod.produce(topic, f"v{i}".encode(), partition=0)
    prod.commit_transaction(30)
    c = Consumer({**conf, "group.id": "tls-readers", "isolation.level": "read_committed",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    c.commit(asynchronous=False)
    assert c.committed([TopicPartition(topic, 0)], timeout=15)[0].offset == 5
    c.close()
    assert got == [f"v{i}" for i in range(5)]
    errors = []
    bad = Producer({**conf, "sasl.password": "nope", "message.timeout.ms": 4000, "error_cb": errors.append})
    bad.produce(topic, b"x", partition=0)
    bad.flush(6)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert "TLS handshake failed" not in tb.b.log_text()


def test_ssl_client_certificates_are_principals(broker_factory, pki):
    tb = TlsBroker(broker_factory, pki, "SSL", **{
        "ssl.truststore.location": str(pki / "ca.pem"), "ssl.client.auth": "required",
        "authorizer.class.name": "x", "super.users": "User:ANONYMOUS"})
    topic = unique_topic("tls-acl")
    create_topic(tb.plain, topic)
    a = AdminClient({"bootstrap.servers": tb.plain, "broker.address.family": "v4"})
    alice = "User:CN=alice,O=oncelog-test"
    for f in a.create_acls([AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, alice, "*",
                                       AclOperation.WRITE, AclPermissionType.ALLOW)]).values():
        f.result(30)
    base = {"bootstrap.servers": tb.tls, "broker.address.family": "v4", "security.protocol": "SSL",
            "ssl.ca.location": str(pki / "ca.pem"), "message.timeout.ms": 5000}

    def produce(conf):
        errors, reports = [], []
        p = Producer({**conf, "error_cb": errors.append})
        p.produce(topic, b"hello", partition=0, on_delivery=lambda e, m: reports.append(e))
        p.flush(8)
        return reports[0] if reports else None, errors

    ok, _ = produce({**base, "ssl.certificate.location": str(pki / "alice.pem"),
                     "ssl.key.location": str(pki / "alice.key")})
    assert ok is None, ok
    for conf in [base,
                 {**base, "ssl.certificate.location": str(pki / "mallory.pem"),
                  "ssl.key.location": str(pki / "mallory.key")}]:
        report, errors = produce(conf)
        assert report is not None, "delivered without a trusted client certificate"
        assert any(e.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
                   for e in errors), errors
    # No TLS at all on the TLS port: ApiVersions in the clear gets a TLS
    # alert (record type 21), never a Kafka answer, and the connection ends.
    c = Conn("127.0.0.1", tb.port)
    c.send(api_versions_request(0, 1))
    c.sock.settimeout(15)
    data = b""
    try:
        while chunk := c.sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    assert data == b"" or data[0] == 0x15, data[:16]
    cons = Consumer({"bootstrap.servers": tb.plain, "group.id": "x", "broker.address.family": "v4"})
    assert cons.get_watermark_offsets(TopicPartition(topic, 0), timeout=15, cached=False)[1] == 1
    cons.close()
    assert tb.b.log_text().count("TLS handshake failed") >= 2


def served_subject(port, ca):
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        with ctx.wrap_socket(s, server_hostname="localhost") as t:
            return dict(x[0] for x in t.getpeercert()["subject"])["commonName"]


def test_certificates_reload_without_a_restart(broker_factory, pki):
    tb = TlsBroker(broker_factory, pki, "SSL")
    assert served_subject(tb.port, pki / "ca.pem") == "localhost"
    make_cert(pki, "server2", "ca", "/CN=renewed.localhost", san="IP:127.0.0.1,DNS:localhost")
    (pki / "server-bundle.pem").write_text((pki / "server2-bundle.pem").read_text())
    wait_until(lambda: served_subject(tb.port, pki / "ca.pem") == "renewed.localhost", 20,
               interval=0.5, what="the renewed certificate to be served")
    assert "TLS certificates reloaded" in tb.b.log_text()
    # A broken file keeps the working certificate.
    (pki / "server-bundle.pem").write_text("not a certificate\n")
    wait_until(lambda: "do not load" in tb.b.log_text(), 20, interval=0.5, what="the reload error")
    assert served_subject(tb.port, pki / "ca.pem") == "renewed.localhost"


def make_expired_cert(d, name, ca, subject, san=None):
    """A certificate from `ca` that was valid for one day in 2020 (`openssl
    ca`, which, unlike `openssl x509` of OpenSSL 3.0, takes dates)."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    (d / "ca.cnf").write_text(
        "[ca]\ndefault_ca=d\n[d]\ndatabase=index.txt\nnew_certs_dir=.\nserial=serial\n"
        "default_md=sha256\npolicy=p\ncopy_extensions=copy\n"
        "[p]\ncommonName=supplied\norganizationName=optional\n")
    (d / "index.txt").write_text("")
    (d / "serial").write_text("1000\n")
    ext = d / f"{name}.ext"
    ext.write_text(f"[e]\nsubjectAltName={san}\n" if san else "[e]\nbasicConstraints=CA:FALSE\n")
    openssl("ca", "-batch", "-config", "ca.cnf", "-cert", f"{ca}.pem", "-keyfile", f"{ca}.key",
            "-in", f"{name}.csr", "-out", f"{name}.pem", "-startdate", "20200101000000Z",
            "-enddate", "20200102000000Z", "-notext", "-preserveDN",
            "-extfile", str(ext), "-extensions", "e", cwd=d)
    (d / f"{name}-bundle.pem").write_text((d / f"{name}.pem").read_text() + (d / f"{name}.key").read_text())


def produce_one(conf, topic):
    """One record through librdkafka: (delivery error or None, client errors)."""
    errors, reports = [], []
    p = Producer({**conf, "message.timeout.ms": 5000, "error_cb": errors.append})
    p.produce(topic, b"hello", partition=0, on_delivery=lambda e, m: reports.append(e))
    p.flush(8)
    return (reports[0] if reports else "no report"), errors


def test_expired_certificates_are_refused(broker_factory, pki):
    """An expired client certificate from the trusted CA is refused by the
    broker; a broker serving an expired certificate is refused by the client;
    nothing reaches the log either way."""
    make_expired_cert(pki, "old-alice", "ca", "/O=oncelog-test/CN=alice")
    tb = TlsBroker(broker_factory, pki, "SSL", **{
        "ssl.truststore.location": str(pki / "ca.pem"), "ssl.client.auth": "required"})
    topic = unique_topic("tls-expired")
    create_topic(tb.plain, topic)
    base = {"bootstrap.servers": tb.tls, "broker.address.family": "v4", "security.protocol": "SSL",
            "ssl.ca.location": str(pki / "ca.pem")}
    report, errors = produce_one({**base, "ssl.certificate.location": str(pki / "old-alice.pem"),
                                  "ssl.key.location": str(pki / "old-alice.key")}, topic)
    assert report is not None, "delivered with an expired client certificate"
    assert any(e.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
               for e in errors), errors
    log = tb.b.log_text()
    assert "TLS handshake failed" in log and "xpired" in log, log[-3000:]
    ok, _ = produce_one({**base, "ssl.certificate.location": str(pki / "alice.pem"),
                         "ssl.key.location": str(pki / "alice.key")}, topic)
    assert ok is None, ok
    assert end_offset(tb.plain, topic) == 1

    # The broker's own certificate expired: the client refuses the broker.
    make_expired_cert(pki, "old-server", "ca", "/CN=localhost", san="IP:127.0.0.1,DNS:localhost")
    tb2 = TlsBroker(broker_factory, pki, "SSL",
                    **{"ssl.keystore.location": str(pki / "old-server-bundle.pem")})
    topic2 = unique_topic("tls-expired-server")
    create_topic(tb2.plain, topic2)
    report, errors = produce_one({**base, "bootstrap.servers": tb2.tls}, topic2)
    assert report is not None, "delivered to a broker with an expired certificate"
    assert any(e.code() == KafkaError._SSL and "certificate verify failed" in e.str()
               for e in errors), errors
    # The client's alert names the reason; the broker logs it.
    assert "received fatal alert: CertificateExpired" in tb2.b.log_text()
    assert end_offset(tb2.plain, topic2) == 0


def test_principal_mapping_rules(broker_factory, pki):
    """`ssl.principal.mapping.rules` turns the subject CN=alice,O=oncelog-test
    into User:alice, whom the ACL names; a subject no rule matches is refused
    at the door, logged, and counted."""
    make_cert(pki, "bob", "ca", "/O=elsewhere/CN=bob")
    tb = TlsBroker(broker_factory, pki, "SSL", **{
        "ssl.truststore.location": str(pki / "ca.pem"), "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]*),O=oncelog-test$/$1/L",
        "authorizer.class.name": "x", "super.users": "User:ANONYMOUS"})
    topic = unique_topic("tls-map")
    create_topic(tb.plain, topic)
    a = AdminClient({"bootstrap.servers": tb.plain, "broker.address.family": "v4"})
    for f in a.create_acls([AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                                       "User:alice", "*", AclOperation.WRITE,
                                       AclPermissionType.ALLOW)]).values():
        f.result(30)
    base = {"bootstrap.servers": tb.tls, "broker.address.family": "v4", "security.protocol": "SSL",
            "ssl.ca.location": str(pki / "ca.pem")}
    ok, _ = produce_one({**base, "ssl.certificate.location": str(pki / "alice.pem"),
                         "ssl.key.location": str(pki / "alice.key")}, topic)
    assert ok is None, ok
    report, _ = produce_one({**base, "ssl.certificate.location": str(pki / "bob.pem"),
                             "ssl.key.location": str(pki / "bob.key")}, topic)
    assert report is not None, "delivered by a subject no rule maps"
    assert end_offset(tb.plain, topic) == 1
    log = tb.b.log_text()
    assert "no ssl.principal.mapping.rules rule applies" in log and "CN=bob,O=elsewhere" in log
    # A rule that does not parse stops the broker at start, naming the setting.
    bad = broker_factory(start=False)
    bad.overrides["ssl.principal.mapping.rules"] = "RULE:^CN=(.*$/x/"
    with pytest.raises(AssertionError, match="ssl.principal.mapping.rules"):
        bad.start()


def test_cli_over_ssl_and_sasl_ssl(broker_factory, pki, tmp_path):
    """The `oncelog` CLI over SSL with a client certificate (flags), over
    SASL_SSL from a Kafka client properties file (PEM truststore and
    keystore, sasl.jaas.config), and its errors for a CA that did not sign
    the broker's certificate and for plaintext on a TLS port."""
    ssl_port, sasl_ssl_port = free_port(), free_port()
    b = broker_factory(start=False)
    b.overrides.update({
        "listeners": f"PLAINTEXT://127.0.0.1:{b.port},SSL://127.0.0.1:{ssl_port},"
                     f"SASL_SSL://127.0.0.1:{sasl_ssl_port}",
        "ssl.keystore.location": str(pki / "server-bundle.pem"),
        "ssl.truststore.location": str(pki / "ca.pem"), "ssl.client.auth": "requested",
        "authorizer.class.name": "x", "super.users": "User:CN=alice,O=oncelog-test;User:carol"})
    b.start()

    def cli(*args, stdin=None):
        return subprocess.run([str(oncelog_bin()), *args], input=stdin, capture_output=True,
                              text=True, timeout=60)

    topic = unique_topic("tls-cli")
    ssl_flags = ["--bootstrap", f"127.0.0.1:{ssl_port}", "--security-protocol", "SSL",
                 "--ca-cert", str(pki / "ca.pem"), "--cert", str(pki / "alice.pem"),
                 "--cert-key", str(pki / "alice.key")]
    p = cli("user", "create", "carol", "--password", "carol-pw", *ssl_flags)
    assert p.returncode == 0, p.stderr
    p = cli("topic", "create", topic, *ssl_flags)
    assert p.returncode == 0, p.stderr
    p = cli("produce", topic, *ssl_flags, stdin="one\ntwo\nthree\n")
    assert p.returncode == 0, p.stderr
    props = tmp_path / "client.properties"
    props.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
        'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required '
        'username="carol" password="carol-pw";\n'
        f"ssl.truststore.type=PEM\nssl.truststore.location={pki / 'ca.pem'}\n")
    p = cli("consume", topic, "--bootstrap", f"127.0.0.1:{sasl_ssl_port}",
            "--command-config", str(props))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["one", "two", "three"]
    # Without the client certificate the SSL listener's principal is
    # ANONYMOUS, which no ACL names.
    p = cli("produce", topic, *ssl_flags[:6], stdin="four\n")
    assert p.returncode != 0 and "AUTHORIZATION" in p.stderr.upper(), p.stderr
    # The stranger's CA did not sign the broker's certificate.
    p = cli("topic", "list", "--bootstrap", f"127.0.0.1:{ssl_port}", "--security-protocol", "SSL",
            "--ca-cert", str(pki / "stranger-ca.pem"))
    assert p.returncode != 0 and "TLS handshake failed" in p.stderr, p.stderr
    # Plaintext Kafka on the TLS port.
    p = cli("topic", "list", "--bootstrap", f"127.0.0.1:{ssl_port}")
    assert p.returncode != 0 and "--security-protocol SSL" in p.stderr, p.stderr
    # TLS flags on a plaintext protocol are a mistake, said so.
    p = cli("topic", "list", "--bootstrap", b.bootstrap, "--ca-cert", str(pki / "ca.pem"))
    assert p.returncode != 0 and "SSL or SASL_SSL" in p.stderr, p.stderr
    p = cli("consume", topic, *ssl_flags)
    assert p.returncode == 0 and p.stdout.split() == ["one", "two", "three"], p


def run_java(classpath, *args):
    proc = subprocess.run(["java", "-Xmx256m", "-cp", classpath, "JavaTlsCheck", *args],
                          capture_output=True, timeout=180)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    result = [line for line in out.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and result, \
        f"java exited {proc.returncode}\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
    return result[-1]


def test_java_client_over_ssl_with_client_certificates(broker_factory, pki, tmp_path, java_classpath):
    """The Java client 4.x over SSL with a client certificate (PKCS12
    keystore, PEM truststore) produces transactionally, consumes
    read_committed in a group and commits offsets, as the principal its
    certificate names; an untrusted certificate, an expired one and
    plaintext on the TLS port fail, and nothing reaches the log."""
    make_expired_cert(pki, "old-alice", "ca", "/O=oncelog-test/CN=alice")
    for name in ["alice", "mallory", "old-alice"]:
        openssl("pkcs12", "-export", "-in", f"{name}.pem", "-inkey", f"{name}.key",
                "-out", f"{name}.p12", "-passout", "pass:changeit", "-name", name, cwd=pki)
    tb = TlsBroker(broker_factory, pki, "SSL", **{
        "ssl.truststore.location": str(pki / "ca.pem"), "ssl.client.auth": "required",
        "authorizer.class.name": "x", "super.users": "User:ANONYMOUS"})
    alice = "User:CN=alice,O=oncelog-test"
    topic = unique_topic("java-tls")
    create_topic(tb.plain, topic)
    txn_id = "java-tls-writer"
    a = AdminClient({"bootstrap.servers": tb.plain, "broker.address.family": "v4"})
    acls = [AclBinding(rt, name, ResourcePatternType.LITERAL, alice, "*", op, AclPermissionType.ALLOW)
            for rt, name, op in [(ResourceType.TOPIC, topic, AclOperation.ALL),
                                 (ResourceType.TRANSACTIONAL_ID, txn_id, AclOperation.ALL),
                                 (ResourceType.GROUP, f"java-tls-{topic}", AclOperation.ALL)]]
    for f in a.create_acls(acls).values():
        f.result(30)

    def props(name, protocol="SSL"):
        p = tmp_path / f"{name}-{protocol}.properties"
        p.write_text(f"security.protocol={protocol}\n"
                     f"ssl.truststore.type=PEM\nssl.truststore.location={pki / 'ca.pem'}\n"
                     f"ssl.keystore.type=PKCS12\nssl.keystore.location={pki / (name + '.p12')}\n"
                     "ssl.keystore.password=changeit\nssl.key.password=changeit\n")
        return str(p)

    for name, protocol, expect in [("mallory", "SSL", "SslAuthenticationException"),
                                   ("old-alice", "SSL", "SslAuthenticationException"),
                                   ("alice", "PLAINTEXT", "TimeoutException")]:
        r = run_java(java_classpath, tb.tls, topic, props(name, protocol), txn_id, "expect-failure")
        assert r.startswith("RESULT failed") and expect in r, (name, protocol, r)
    assert end_offset(tb.plain, topic) == 0
    log = tb.b.log_text()
    # Java offers only a certificate from a CA the broker names in its
    # request, so the stranger's is never sent.
    assert "peer sent no certificates" in log, log[-2000:]
    assert "certificate expired" in log

    r = run_java(java_classpath, tb.tls, topic, props("alice"), txn_id)
    ok, produced, consumed, committed = r.split()[1:]
    assert (ok, produced, consumed) == ("ok", "produced=10", "consumed=10"), r
    # The group's position is past the committed records: at least past
    # their commit marker, at most the end of the partition (17: ten
    # records, a marker, five aborted records, a marker).
    assert 11 <= int(committed.removeprefix("committed=")) <= 17, r
    assert end_offset(tb.plain, topic) == 17


def test_large_fetches_to_a_slow_reader_complete(broker_factory, pki):
    """A response's last bytes must leave the broker even when the socket
    was full as it was written: TLS buffers what the socket refuses until a
    flush, and without one the tail of a fetch waited there for the next
    response (a read_committed consumer with one fetch in flight stalled
    until its request timed out). A consumer with a small receive buffer
    and large fetches reads 24 MiB over SSL; no request may time out."""
    tb = TlsBroker(broker_factory, pki, "SSL")
    topic = unique_topic("tls-slow")
    create_topic(tb.plain, topic)
    p = Producer({"bootstrap.servers": tb.plain, "broker.address.family": "v4",
                  "linger.ms": 5, "batch.size": 1 << 20})
    value = b"x" * 4096
    n = 6 * 1024
    for i in range(n):
        p.produce(topic, value, partition=0)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    logs = []
    import logging
    logger = logging.getLogger("tls-slow")
    logger.addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: logs.append(r.getMessage())})())
    c = Consumer({"bootstrap.servers": tb.tls, "broker.address.family": "v4", "security.protocol": "SSL",
                  "ssl.ca.location": str(pki / "ca.pem"), "group.id": "slow",
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                  "socket.receive.buffer.bytes": 4096, "fetch.max.bytes": 8 << 20,
                  "max.partition.fetch.bytes": 8 << 20, "socket.timeout.ms": 8000,
                  "fetch.wait.max.ms": 100}, logger=logger)
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    deadline = time.monotonic() + 120
    while got < n and time.monotonic() < deadline:
        for m in c.consume(1000, 0.5):
            if not m.error():
                got += 1
    c.close()
    assert got == n, f"read {got} of {n}"
    timeouts = [line for line in logs if "Timed out" in line]
    assert not timeouts, timeouts[:3]


def test_the_http_listener_over_tls(broker_factory, pki, tmp_path):
    """`metrics.tls`: /health, /metrics, the console and the CLI's endpoints
    over TLS with the Kafka listeners' keystore. Plain HTTP and a client
    that trusts another CA are refused; the CLI reaches it as https://,
    checking the certificate against the system's bundle (SSL_CERT_FILE)."""
    b = broker_factory(start=False)
    b.overrides.update({"metrics.tls": "true",
                        "ssl.keystore.location": str(pki / "server-bundle.pem")})
    b.start()
    addr = b.overrides["metrics.listen"]
    url = f"https://{addr}"

    def curl(*args):
        return subprocess.run(["curl", "-sS", "--max-time", "10", *args],
                              capture_output=True, text=True, timeout=30)

    p = curl("--cacert", str(pki / "ca.pem"), f"{url}/health")
    assert p.returncode == 0 and p.stdout.strip(), p
    p = curl("--cacert", str(pki / "ca.pem"), f"{url}/metrics")
    assert p.returncode == 0 and "oncelog_" in p.stdout, p.stderr
    # keep-alive over TLS: two requests on one connection
    p = curl("--cacert", str(pki / "ca.pem"), "-o", "/dev/null", "-o", "/dev/null",
             "-w", "%{num_connects}\n", f"{url}/health", f"{url}/health")
    assert p.returncode == 0 and p.stdout.split() == ["1", "0"], p
    # the console's page, with its https address in the broker's log
    p = curl("--cacert", str(pki / "ca.pem"), f"{url}/")
    assert p.returncode == 0 and "<html" in p.stdout.lower(), p.stderr
    assert f"console: https://{addr}/" in b.log_text(), b.log_tail()
    # plain HTTP to a TLS listener, and a CA that did not sign its certificate
    p = curl(f"http://{addr}/health")
    assert p.returncode != 0, p
    p = curl("--cacert", str(pki / "stranger-ca.pem"), f"{url}/health")
    assert p.returncode != 0, p
    # the CLI
    env = {**os.environ, "SSL_CERT_FILE": str(pki / "ca.pem")}

    def cli(*args, env=env):
        return subprocess.run([str(oncelog_bin()), *args, "--bootstrap", b.bootstrap],
                              capture_output=True, text=True, timeout=60, env=env)

    p = cli("cutover", "status", "--admin", url)
    assert p.returncode == 0, p.stderr
    p = cli("cutover", "status", "--admin", url,
            env={**os.environ, "SSL_CERT_FILE": str(pki / "stranger-ca.pem")})
    assert p.returncode != 0 and "TLS handshake failed" in p.stderr, p.stderr
    p = cli("cutover", "status", "--admin", f"http://{addr}")
    assert p.returncode != 0, p.stderr
    assert b.alive
