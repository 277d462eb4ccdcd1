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
import socket
import ssl
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)

from clients import create_topic, unique_topic
from conftest import free_port, oncelog_bin, wait_until
from kafka_wire import Conn, api_versions_request

pytestmark = pytest.mark.timeout(240)


def openssl(*args, cwd):
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"openssl {args}: {p.stderr}"


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "3", "-subj", f"/CN={name}",
            cwd=d)


def make_cert(d, name, ca, subject, san=None):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "3", "-extfile", str(ext), cwd=d)
    (d / f"{name}-bundle.pem").write_text((d / f"{name}.pem").read_text() + (d / f"{name}.key").read_text())


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
