"""A private CA and its certificates for the web-config tests and the TLS benches.

A test aid (``cryptography`` is a test dependency; service code never imports this module:
the ``testing-is-edge-only`` contract). ``Pki(folder)`` makes a CA; ``server(...)`` and
``client(...)`` issue leaf certificates for localhost / 127.0.0.1 into PEM files, written by
rename as rotations are in production; ``client(expired=True)`` issues one whose validity
ended yesterday; ``web_config(...)`` writes a ``--web.config.file`` that serves a leaf.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write(path: Path, data: bytes) -> None:
    staged = path.with_name(path.name + ".new")
    staged.write_bytes(data)
    os.replace(staged, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass
class Leaf:
    cert: Path
    key: Path
    serial: int


class Pki:
    def __init__(self, folder: Path, *, name: str = "gpufed test CA") -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca_file = folder / f"{name.replace(' ', '-')}.crt"
        _write(self.ca_file, self.cert.public_bytes(serialization.Encoding.PEM))

    def _issue(self, stem: str, *, usage: x509.ObjectIdentifier, common_name: str,
               expired: bool = False) -> Leaf:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2 if expired else 0)
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.name).public_key(key.public_key()).serial_number(serial)
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            ]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                           critical=False)
            .sign(self.key, hashes.SHA256())
        )
        leaf = Leaf(cert=self.folder / f"{stem}.crt", key=self.folder / f"{stem}.key", serial=serial)
        _write(leaf.key, _key_pem(key))  # key first: a handshake in between keeps the old pair
        _write(leaf.cert, cert.public_bytes(serialization.Encoding.PEM))
        return leaf

    def server(self, stem: str = "server") -> Leaf:
        return self._issue(stem, usage=ExtendedKeyUsageOID.SERVER_AUTH, common_name="localhost")

    def client(self, stem: str = "client", *, expired: bool = False) -> Leaf:
        return self._issue(stem, usage=ExtendedKeyUsageOID.CLIENT_AUTH, common_name="prometheus",
                           expired=expired)

    def web_config(self, path: Path, *, server: Leaf,
                   client_auth: str = "RequireAndVerifyClientCert") -> Path:
        """A ``--web.config.file`` serving ``server`` and verifying clients against this CA."""
        path.write_text("\n".join([
            "tls_server_config:", f"  cert_file: {server.cert}", f"  key_file: {server.key}",
            f"  client_auth_type: {client_auth}", f"  client_ca_file: {self.ca_file}", ""]))
        return path
