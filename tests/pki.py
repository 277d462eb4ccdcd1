"""Throwaway certificates for tests, made with the `openssl` command: EC
(P-256) CAs and certificates signed by them, valid for three days."""

import subprocess


def openssl(*args, cwd):
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"openssl {args}: {p.stderr}"


def make_ca(d, name):
    """`d/name.pem` and `d/name.key`: a self-signed CA."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "3", "-subj", f"/CN={name}",
            cwd=d)


def make_cert(d, name, ca, subject, san=None):
    """`d/name.pem`, `d/name.key` and `d/name-bundle.pem` (both): a
    certificate for `subject` (and `san`, e.g. "IP:127.0.0.1,DNS:localhost")
    signed by the CA `ca` made by make_ca in `d`."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "3", "-extfile", str(ext), cwd=d)
    (d / f"{name}-bundle.pem").write_text((d / f"{name}.pem").read_text() + (d / f"{name}.key").read_text())
