"""Issue 41 negative cases on a live edge: each refused, counted by reason, one log line, no traceback.

The exporter's own edge serves a web config with client certificates required and basic auth.
Real TLS clients (Python's ssl, with certificates made by ``tests.webconfig.pki``) come with a
certificate from another CA, an expired one, none, a CA that does not know the server's, or
plain HTTP; others bring a wrong password, an unknown user or no credentials. Each case reads
the whole tally (every other reason still zero) and the metric families the exporter serves.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import httpx
import pytest
from conftest import wait_for
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from exporter.app import http_server, web_config
from exporter.server import TEXT, HttpServer
from exporter.settings import ExporterSettings
from tests.webconfig.pki import Leaf, Pki
from webconfig.refusals import AUTH_REASONS, HANDSHAKE_REASONS
from webconfig.serving import Served

PASSWORD = "correct horse"


@dataclass
class Edge:
    server: HttpServer
    served: Served
    pki: Pki
    folder: Path

    @property
    def url(self) -> str:
        return f"https://localhost:{self.server.port}/metrics"

    def stranger(self) -> Pki:
        folder = self.folder / "stranger"
        folder.mkdir(exist_ok=True)
        return Pki(folder, name="stranger CA")


@pytest.fixture()
def edge(tmp_path: Path) -> Iterator[Edge]:
    pki = Pki(tmp_path)
    leaf = pki.server()
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text("\n".join([
        "tls_server_config:", f"  cert_file: {leaf.cert.name}", f"  key_file: {leaf.key.name}",
        "  client_auth_type: RequireAndVerifyClientCert", f"  client_ca_file: {pki.ca_file.name}",
        "basic_auth_users:", f"  prometheus: '{hashed}'", ""]))
    settings = ExporterSettings(listen="127.0.0.1:0", web_config_file=web)
    served = web_config(settings)
    server = http_server(settings, lambda path: (200, TEXT, b"ok\n"), served=served)
    server.start()
    try:
        yield Edge(server=server, served=served, pki=pki, folder=tmp_path)
    finally:
        server.stop()


def _client(*, trust: Path, cert: Leaf | None) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(trust))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return httpx.Client(verify=ctx, timeout=10)


def _counted(edge: Edge, reason: str, *, handshake: bool) -> None:
    """Exactly one refusal, for ``reason``; every other reason of both kinds still zero."""
    tally = edge.served.tls.handshake_failures if handshake and edge.served.tls else edge.served.guard.refused
    wait_for(lambda: tally[reason] == 1 or None, timeout=10, what=f"{reason} counted")
    tls = edge.served.tls.handshake_failures.snapshot() if edge.served.tls else {}
    auth = edge.served.guard.refused.snapshot()
    expected_tls = {r: int(handshake and r == reason) for r in HANDSHAKE_REASONS}
    expected_auth = {r: int(not handshake and r == reason) for r in (*AUTH_REASONS, "rate_limited")}
    assert (tls, auth) == (expected_tls, expected_auth)


def _one_clear_line(caplog: pytest.LogCaptureFixture, reason: str) -> str:
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert all(r.exc_info is None and r.stack_info is None for r in caplog.records)
    assert "Traceback" not in caplog.text
    message = lines[0].getMessage()
    assert f"reason={reason}" in message and "\n" not in message
    return message


def test_a_client_certificate_from_another_ca(edge: Edge, caplog: pytest.LogCaptureFixture) -> None:
    stranger = edge.stranger().client()
    with caplog.at_level(logging.INFO), _client(trust=edge.pki.ca_file, cert=stranger) as client, \
            pytest.raises(httpx.TransportError):
        client.get(edge.url, auth=("prometheus", PASSWORD))
    _counted(edge, "unknown_ca", handshake=True)
    assert "unable to get local issuer certificate" in _one_clear_line(caplog, "unknown_ca")


def test_an_expired_client_certificate(edge: Edge, caplog: pytest.LogCaptureFixture) -> None:
    expired = edge.pki.client("old", expired=True)
    with caplog.at_level(logging.INFO), _client(trust=edge.pki.ca_file, cert=expired) as client, \
            pytest.raises(httpx.TransportError):
        client.get(edge.url, auth=("prometheus", PASSWORD))
    _counted(edge, "expired", handshake=True)
    assert "certificate has expired" in _one_clear_line(caplog, "expired")


def test_no_client_certificate_where_one_is_required(edge: Edge, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), _client(trust=edge.pki.ca_file, cert=None) as client, \
            pytest.raises(httpx.TransportError):
        client.get(edge.url, auth=("prometheus", PASSWORD))
    _counted(edge, "no_client_cert", handshake=True)
    _one_clear_line(caplog, "no_client_cert")


def test_a_client_that_does_not_trust_the_server(edge: Edge, caplog: pytest.LogCaptureFixture) -> None:
    stranger = edge.stranger()
    with caplog.at_level(logging.INFO), _client(trust=stranger.ca_file, cert=edge.pki.client()) as client, \
            pytest.raises(httpx.TransportError):
        client.get(edge.url, auth=("prometheus", PASSWORD))
    _counted(edge, "server_cert_refused", handshake=True)
    _one_clear_line(caplog, "server_cert_refused")


def test_plain_http_to_the_tls_port(edge: Edge, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), httpx.Client(timeout=10) as plain, \
            pytest.raises(httpx.TransportError):
        plain.get(f"http://127.0.0.1:{edge.server.port}/metrics")
    _counted(edge, "plain_http", handshake=True)
    _one_clear_line(caplog, "plain_http")


@pytest.mark.parametrize(("auth", "reason"), [
    (("prometheus", "wrong"), "bad_password"),
    (("nobody", PASSWORD), "unknown_user"),
    (None, "missing"),
], ids=["wrong-password", "unknown-user", "no-credentials"])
def test_basic_auth_refusals(edge: Edge, caplog: pytest.LogCaptureFixture,
                             auth: tuple[str, str] | None, reason: str) -> None:
    with caplog.at_level(logging.INFO), _client(trust=edge.pki.ca_file, cert=edge.pki.client()) as client:
        answer = client.get(edge.url, auth=auth)
        ok = client.get(edge.url, auth=("prometheus", PASSWORD))
    assert (answer.status_code, ok.status_code) == (401, 200)
    _counted(edge, reason, handshake=False)
    message = _one_clear_line(caplog, reason)
    assert "peer=127.0.0.1:" in message and PASSWORD not in message


def test_the_refusals_are_exported_from_zero(edge: Edge) -> None:
    with _client(trust=edge.pki.ca_file, cert=None) as client, pytest.raises(httpx.TransportError):
        client.get(edge.url)
    tls = edge.served.tls
    assert tls is not None
    wait_for(lambda: tls.handshake_failures.total == 1 or None, timeout=10, what="the failure counted")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(edge.served.collector())
    lines = [line for line in generate_latest(registry).decode().splitlines() if not line.startswith("#")]
    assert lines == [
        *(f'gpufed_web_tls_handshake_failures_total{{reason="{r}"}} {1.0 if r == "no_client_cert" else 0.0}'
          for r in HANDSHAKE_REASONS),
        "gpufed_web_tls_certificate_reloads_total 0.0",
        *(f'gpufed_web_auth_failures_total{{reason="{r}"}} 0.0' for r in AUTH_REASONS),
    ]


def test_a_plain_server_exports_no_refusal_families() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(web_config(ExporterSettings(listen="127.0.0.1:0")).collector())
    assert generate_latest(registry) == b""


def test_the_exporter_shows_a_refusal_in_the_next_scrape_of_the_same_collection(tmp_path: Path) -> None:
    """The render cache is keyed on the collection and the refusal count: a refusal between
    two scrapes of one collection is in the second."""
    from exporter.app import ExporterApp

    pki = Pki(tmp_path)
    web = pki.web_config(tmp_path / "web.yml", server=pki.server())
    app = ExporterApp(ExporterSettings(backend="simulated", gpus=1, listen="127.0.0.1:0",
                                       collect_interval=3600, web_config_file=web))
    app.start()
    try:
        url = f"https://localhost:{app.http.port}/metrics"
        line = 'gpufed_web_tls_handshake_failures_total{reason="no_client_cert"}'
        with _client(trust=pki.ca_file, cert=pki.client()) as client:
            before = client.get(url).text
            stats = app.collection.stats
            with _client(trust=pki.ca_file, cert=None) as bare, pytest.raises(httpx.TransportError):
                bare.get(url)
            tls = app.served.tls
            assert tls is not None
            wait_for(lambda: tls.handshake_failures["no_client_cert"] == 1 or None, timeout=10,
                     what="the refusal counted")
            after = client.get(url).text
        assert app.collection.stats is stats  # no collection in between: the cache was keyed right
    finally:
        app.stop()
    assert f"{line} 0.0" in before and f"{line} 1.0" in after
