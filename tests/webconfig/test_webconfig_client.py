"""``webconfig.client``: Prometheus' ``http_config`` file for gpufed's own calls over TLS.

Parsed strictly (unknown and unsupported keys refused with the field named), then used by a
real httpx client against a uvicorn server that requires client certificates: the client
certificate is presented, ``server_name`` is checked, and a renewed client certificate is
presented on the next connection without building a new client.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from federation.testing.harnesses.app_server import AppServer
from tests.webconfig.pki import Pki
from webconfig.client import client_context, parse
from webconfig.model import WebConfigError
from webconfig.serving import for_uvicorn, load_web_config


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture()
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture()
def server(tmp_path: Path, pki: Pki) -> Iterator[AppServer]:
    """A uvicorn app requiring a client certificate from ``pki``'s CA."""
    served = load_web_config(pki.web_config(tmp_path / "web.yml", server=pki.server()))
    app = AppServer(_ok, name="tls-client-test", interface="asgi3", lifespan="off", access_log=False)
    for_uvicorn(app.server.config, served)
    with app:
        yield app


def _file(tmp_path: Path, document: dict[str, Any], name: str = "http.yml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    return path


def _get(path: Path, url: str) -> httpx.Response:
    """One request on a fresh connection, with the context ``path`` builds."""
    context = client_context(path)
    assert context is not None
    with httpx.Client(verify=context, timeout=10) as client:
        return client.get(url)


@pytest.mark.parametrize(("document", "field"), [
    ({"tls_config": {"ca_file": "ca.crt", "cafile": "x"}}, "tls_config.cafile: unknown field"),
    ({"basic_auth": {"username": "a", "password": "b"}}, "basic_auth: not supported"),
    ({"proxy_url": "http://proxy:3128"}, "proxy_url: not supported"),
    ({"tls_config": {"cert": "PEM", "key": "PEM"}}, "inline cert and key are not supported"),
    ({"tls_config": {"cert_file": "client.crt"}}, "cert_file and key_file go together"),
    ({"tls_config": {"ca": "PEM", "ca_file": "ca.crt"}}, "ca and ca_file are exclusive"),
    ({"tls_config": {"min_version": "TLS14"}}, "tls_config.min_version"),
    (["tls_config"], "expected a mapping"),
])
def test_a_malformed_file_is_refused_naming_the_field(document: Any, field: str) -> None:
    with pytest.raises(WebConfigError) as caught:
        parse(yaml.safe_dump(document), source="http.yml")
    assert caught.value.detail.startswith("http.yml: ") and field in caught.value.detail


def test_what_gpufed_render_writes_parses(tmp_path: Path) -> None:
    from sharder.kernel.tls import TlsSpec

    spec = TlsSpec(ca_file="/etc/gpufed/tls/ca.crt", cert_file="/etc/gpufed/tls/client.crt",
                   key_file="/etc/gpufed/tls/client.key", server_name="gpufed-controller")
    config = parse(yaml.safe_dump(spec.http_client_config()))
    assert config.tls_config is not None and config.tls_config.server_name == "gpufed-controller"
    assert client_context(None) is None
    assert client_context(_file(tmp_path, {"follow_redirects": True})) is None  # no tls_config: defaults


def test_the_client_certificate_is_presented_and_required(
        tmp_path: Path, pki: Pki, server: AppServer) -> None:
    leaf = pki.client()
    # Relative names are the file's folder's, as Prometheus resolves them.
    good = _file(tmp_path, {"tls_config": {"ca_file": pki.ca_file.name, "cert_file": leaf.cert.name,
                                           "key_file": leaf.key.name}})
    url = f"https://127.0.0.1:{server.port}/"
    assert _get(good, url).text == "ok"
    anonymous = _file(tmp_path, {"tls_config": {"ca_file": str(pki.ca_file)}}, "anonymous.yml")
    with pytest.raises(httpx.TransportError):
        _get(anonymous, url)


def test_server_name_is_the_name_checked(tmp_path: Path, pki: Pki, server: AppServer) -> None:
    leaf = pki.client()
    base = {"ca_file": str(pki.ca_file), "cert_file": str(leaf.cert), "key_file": str(leaf.key)}
    url = f"https://127.0.0.1:{server.port}/"
    assert _get(_file(tmp_path, {"tls_config": {**base, "server_name": "localhost"}}), url).text == "ok"
    with pytest.raises(httpx.TransportError, match=r"(?i)hostname|certificate"):
        _get(_file(tmp_path, {"tls_config": {**base, "server_name": "gpufed.example"}}, "wrong.yml"), url)


def test_a_renewed_client_certificate_is_presented_without_a_new_client(
        tmp_path: Path, pki: Pki, server: AppServer) -> None:
    leaf = pki.client()
    path = _file(tmp_path, {"tls_config": {"ca_file": str(pki.ca_file), "cert_file": str(leaf.cert),
                                           "key_file": str(leaf.key)}})
    context = client_context(path)
    assert context is not None
    url = f"https://127.0.0.1:{server.port}/"

    def fresh_get() -> httpx.Response:
        with httpx.Client(verify=context, timeout=10) as client:  # the same context, a new connection
            return client.get(url)

    assert fresh_get().status_code == 200
    # Replaced in place by a certificate of another CA: the server refuses the next connection...
    stranger_dir = tmp_path / "stranger"
    stranger_dir.mkdir()
    stranger = Pki(stranger_dir, name="stranger CA").client()
    leaf.key.write_bytes(stranger.key.read_bytes())
    leaf.cert.write_bytes(stranger.cert.read_bytes())
    with pytest.raises(httpx.TransportError):
        fresh_get()
    assert context.reloads == 1
    # ...and a renewal from the right CA is presented again, with the same client.
    pki.client()
    assert fresh_get().status_code == 200
    assert context.reloads == 2


def test_a_renewal_that_does_not_load_keeps_the_previous_certificate(
        tmp_path: Path, pki: Pki, server: AppServer) -> None:
    leaf = pki.client()
    path = _file(tmp_path, {"tls_config": {"ca_file": str(pki.ca_file), "cert_file": str(leaf.cert),
                                           "key_file": str(leaf.key)}})
    context = client_context(path)
    assert context is not None
    leaf.cert.write_text("not a certificate\n")
    with httpx.Client(verify=context, timeout=10) as client:
        assert client.get(f"https://127.0.0.1:{server.port}/").status_code == 200
    assert context.reloads == 0


def test_a_missing_file_named_at_startup(tmp_path: Path, pki: Pki) -> None:
    path = _file(tmp_path, {"tls_config": {"ca_file": str(pki.ca_file), "cert_file": "nope.crt",
                                           "key_file": "nope.key"}})
    with pytest.raises(WebConfigError, match=r"tls_config.cert_file/key_file: cannot load .*nope.crt"):
        client_context(path)
