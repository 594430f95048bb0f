"""``gpufed certs``: a private CA and a server and a client certificate, read back with ``cryptography``.

The certificates must be what Go's and Python's TLS stacks accept: SANs for every host (and
localhost), the right extended key usage, an authority key identifier, keys readable by
their owner only. A second run keeps the CA, so leaves renew without redistributing it.
"""

from __future__ import annotations

import ipaddress
import ssl
import stat
from pathlib import Path

import typer
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from typer.testing import CliRunner, Result

from federation.commands import certs


def invoke(*args: str | Path) -> Result:
    app = typer.Typer(pretty_exceptions_enable=False)
    certs.register(app)
    app.command("noop", hidden=True)(lambda: None)  # two commands: typer keeps the subcommand name
    return CliRunner().invoke(app, [str(a) for a in args])


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_issues_a_ca_and_leaves_that_verify(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    result = invoke("certs", out, "--host", "master-prometheus", "--host", "10.0.0.7",
                    "--host", "*.gpu.internal")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "ca.crt", "ca.key", "client.crt", "client.key", "server.crt", "server.key"]
    for key in ("ca.key", "server.key", "client.key"):
        assert stat.S_IMODE((out / key).stat().st_mode) == 0o600, key
    ca, server, client = load(out / "ca.crt"), load(out / "server.crt"), load(out / "client.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["master-prometheus", "*.gpu.internal", "localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7"),
                                                        ipaddress.ip_address("127.0.0.1")]
    purposes = ((server, ExtendedKeyUsageOID.SERVER_AUTH), (client, ExtendedKeyUsageOID.CLIENT_AUTH))
    for leaf, purpose in purposes:
        assert list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [purpose]
    for leaf in (server, client):
        leaf.verify_directly_issued_by(ca)
        assert leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
    # Python's own verifier (strict X.509 flags as 3.13 sets them) takes the chain.
    context = ssl.create_default_context(cafile=str(out / "ca.crt"))
    context.load_cert_chain(str(out / "client.crt"), str(out / "client.key"))


def test_a_second_run_keeps_the_ca_and_renews_the_leaves(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    assert invoke("certs", out).exit_code == 0
    ca, server = (out / "ca.crt").read_bytes(), load(out / "server.crt")
    again = invoke("certs", out, "--host", "child-0")
    assert again.exit_code == 0, again.output
    assert (out / "ca.crt").read_bytes() == ca
    renewed = load(out / "server.crt")
    assert renewed.serial_number != server.serial_number
    renewed.verify_directly_issued_by(load(out / "ca.crt"))
    assert "ca.crt" not in again.output


def test_bad_input_is_an_error_naming_it(tmp_path: Path) -> None:
    bad = invoke("certs", tmp_path / "a", "--host", "two words")
    assert bad.exit_code == 2 and "--host 'two words' is not a host name or an IP address" in bad.output
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "ca.crt").write_text("x")
    half = invoke("certs", tmp_path / "b")
    assert half.exit_code == 2 and "has one of ca.crt and ca.key: both or neither" in half.output
    assert "Traceback" not in bad.output + half.output
