"""The web config on live servers: a real TLS client (httpx with the test CA) against the
exporter's own edge and against a uvicorn app behind the shared middleware (as ``gpufed
serve`` and ``gpufed-dingtalk`` run), client certificates required, basic auth, and a
certificate rotated under a running server.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest
from cryptography import x509

from exporter.app import http_server, web_config
from exporter.server import TEXT, HttpServer
from exporter.settings import ExporterSettings
from federation.testing.harnesses.app_server import AppServer
from tests.webconfig.pki import Leaf, Pki
from webconfig.serving import Served, for_uvicorn, load_web_config

PASSWORD = "correct horse"


@pytest.fixture()
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


def _web_config(tmp_path: Path, pki: Pki, server: Leaf, *, users: bool = False,
                client_auth: str = "RequireAndVerifyClientCert") -> Path:
    lines = ["tls_server_config:", f"  cert_file: {server.cert.name}", f"  key_file: {server.key.name}",
             f"  client_auth_type: {client_auth}", f"  client_ca_file: {pki.ca_file.name}",
             "http_server_config:", "  headers:", "    X-Content-Type-Options: nosniff"]
    if users:
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()  # cost 4: a fast test
        lines += ["basic_auth_users:", f"  prometheus: '{hashed}'"]
    path = tmp_path / "web.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _ok(path: str) -> tuple[int, str, bytes]:
    return 200, TEXT, b"ok\n"


@pytest.fixture()
def exporter_edge(tmp_path: Path, pki: Pki) -> Iterator[tuple[HttpServer, Leaf, Served]]:
    server_leaf = pki.server()
    settings = ExporterSettings(listen="127.0.0.1:0",
                                web_config_file=_web_config(tmp_path, pki, server_leaf, users=True))
    served = web_config(settings)
    server = http_server(settings, _ok, served=served)
    server.start()
    try:
        yield server, server_leaf, served
    finally:
        server.stop()


def _client(pki: Pki, client: Leaf | None) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    return httpx.Client(verify=ctx, timeout=10)


def _served_serial(port: int, pki: Pki, client: Leaf, *, host: str) -> int:
    """The serial of the certificate the server presents to a fresh connection."""
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    ctx.load_cert_chain(str(client.cert), str(client.key))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_exporter_serves_a_client_with_a_certificate_and_the_password(
        exporter_edge: tuple[HttpServer, Leaf, Served], pki: Pki) -> None:
    server, _, _ = exporter_edge
    with _client(pki, pki.client()) as client:
        ok = client.get(f"https://127.0.0.1:{server.port}/metrics", auth=("prometheus", PASSWORD))
        wrong = client.get(f"https://localhost:{server.port}/metrics", auth=("prometheus", "wrong"))
        unknown = client.get(f"https://localhost:{server.port}/metrics", auth=("nobody", PASSWORD))
        none = client.get(f"https://localhost:{server.port}/metrics")
    assert (ok.status_code, ok.text) == (200, "ok\n")
    assert ok.headers["X-Content-Type-Options"] == "nosniff"
    assert [r.status_code for r in (wrong, unknown, none)] == [401, 401, 401]
    assert wrong.headers["WWW-Authenticate"].startswith("Basic")
    assert server.guard is not None
    assert [server.guard.refused[r] for r in ("bad_password", "unknown_user", "missing")] == [1, 1, 1]


def test_exporter_refuses_a_client_without_a_certificate(
        exporter_edge: tuple[HttpServer, Leaf, Served], pki: Pki, tmp_path: Path) -> None:
    server, _, _ = exporter_edge
    with _client(pki, None) as client, pytest.raises(httpx.TransportError):
        client.get(f"https://localhost:{server.port}/metrics", auth=("prometheus", PASSWORD))
    stranger = Pki(tmp_path / "other" if (tmp_path / "other").mkdir() is None else tmp_path,
                   name="stranger CA")
    with _client(pki, stranger.client()) as client, pytest.raises(httpx.TransportError):
        client.get(f"https://localhost:{server.port}/metrics", auth=("prometheus", PASSWORD))
    with httpx.Client(timeout=10) as plain, pytest.raises(httpx.TransportError):  # HTTP to HTTPS
        plain.get(f"http://127.0.0.1:{server.port}/metrics")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"], ids=["sni", "no-sni"])
def test_a_rotated_certificate_is_served_without_a_restart(
        exporter_edge: tuple[HttpServer, Leaf, Served], pki: Pki, host: str) -> None:
    server, first, served = exporter_edge
    client_leaf = pki.client()
    assert _served_serial(server.port, pki, client_leaf, host=host) == first.serial
    second = pki.server()  # same paths, replaced by rename, as cert-manager or `mv` do
    assert second.cert == first.cert and second.serial != first.serial
    assert _served_serial(server.port, pki, client_leaf, host=host) == second.serial
    with _client(pki, client_leaf) as client:
        answer = client.get(f"https://{host}:{server.port}/metrics", auth=("prometheus", PASSWORD))
    assert answer.status_code == 200
    assert served.tls is not None and served.tls.reloads == 1  # gpufed_web_tls_certificate_reloads_total
    assert served.tls.handshake_failures.total == 0


def test_a_half_written_rotation_keeps_the_previous_certificate(
        exporter_edge: tuple[HttpServer, Leaf, Served], pki: Pki) -> None:
    server, first, served = exporter_edge
    client_leaf = pki.client()
    first.cert.write_text("-----BEGIN CERTIFICATE-----\ntruncated\n")
    assert _served_serial(server.port, pki, client_leaf, host="localhost") == first.serial
    assert served.tls is not None and served.tls.reloads == 0
    second = pki.server()
    assert _served_serial(server.port, pki, client_leaf, host="localhost") == second.serial
    assert served.tls.reloads == 1


def test_uvicorn_apps_take_the_same_file(tmp_path: Path, pki: Pki) -> None:
    """What ``gpufed serve`` and ``gpufed-dingtalk`` do: ``Served.wrap`` + ``for_uvicorn``."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    served = load_web_config(_web_config(tmp_path, pki, pki.server(), users=True))
    server = AppServer(served.wrap(app))
    for_uvicorn(server.server.config, served)
    server.start()
    try:
        url = f"https://localhost:{server.port}/healthz"
        with _client(pki, pki.client()) as client:
            ok = client.get(url, auth=("prometheus", PASSWORD))
            wrong = client.get(url, auth=("prometheus", "nope"))
        with _client(pki, None) as client, pytest.raises(httpx.TransportError):
            client.get(url, auth=("prometheus", PASSWORD))
    finally:
        server.stop()
    assert ok.status_code == 200 and ok.json() == {"status": "ok"}
    assert ok.headers["x-content-type-options"] == "nosniff"
    assert wrong.status_code == 401
