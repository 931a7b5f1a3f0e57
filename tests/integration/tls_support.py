"""A throwaway certificate authority for TLS tests: a CA, a server and a client certificate.

:func:`make_foreign_client_cert` makes a client certificate of another CA, one that a
server trusting only the first refuses.

Everything is made fresh in a test's directory with the ``cryptography`` package; the
keys are EC P-256, the certificates valid for a day, the server's for ``127.0.0.1``
and ``localhost``.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from toolexec.redis_server import TlsFiles

__all__ = ["make_ca", "make_foreign_client_cert", "make_tls_files"]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=1)
    )


_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def make_ca(
    directory: Path, name: str = "toolexec test CA"
) -> tuple[Path, ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA: (its certificate file, its key, its certificate)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_USAGE, critical=True)
    )
    cert = _validity(builder).sign(key, hashes.SHA256())
    slug = name.replace(" ", "-")
    return _write_cert(cert, directory / f"{slug}.pem"), key, cert


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    usage: x509.ObjectIdentifier,
    *,
    server: bool,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return key, _validity(builder).sign(ca_key, hashes.SHA256())


def make_tls_files(directory: Path, *, require_client_certs: bool = False) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    ca_file, ca_key, ca_cert = make_ca(directory)
    server_key, server_cert = _issue(
        ca_key, ca_cert, "127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH, server=True
    )
    client_key, client_cert = _issue(
        ca_key, ca_cert, "toolexec-client", ExtendedKeyUsageOID.CLIENT_AUTH, server=False
    )
    return TlsFiles(
        ca_file=ca_file,
        cert_file=_write_cert(server_cert, directory / "server.pem"),
        key_file=_write_key(server_key, directory / "server.key"),
        client_cert_file=_write_cert(client_cert, directory / "client.pem"),
        client_key_file=_write_key(client_key, directory / "client.key"),
        require_client_certs=require_client_certs,
    )


def make_foreign_client_cert(directory: Path) -> tuple[Path, Path]:
    """A client certificate and its key, signed by a CA of their own (no server trusts it)."""
    _, ca_key, ca_cert = make_ca(directory, "foreign CA")
    key, cert = _issue(ca_key, ca_cert, "intruder", ExtendedKeyUsageOID.CLIENT_AUTH, server=False)
    return _write_cert(cert, directory / "foreign-client.pem"), _write_key(
        key, directory / "foreign-client.key"
    )
