"""``gpufed serve --web.config.file`` as a real process: TLS with client certificates
required, the bearer token still carried in Authorization for changes."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import stop_process, wait_for

from federation.testing.harnesses.polling import serve_port
from tests.controller.harness import TOKEN
from tests.webconfig.pki import Pki

ROOT = Path(__file__).resolve().parents[3]


def _client(pki: Pki, *, with_cert: bool) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    if with_cert:
        leaf = pki.client()
        ctx.load_cert_chain(str(leaf.cert), str(leaf.key))
    return httpx.Client(verify=ctx, timeout=10)


def test_gpufed_serve_over_mutual_tls(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    server = pki.server()
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {
        "cert_file": str(server.cert), "key_file": str(server.key),
        "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca_file)}}))
    log = tmp_path / "serve.log"
    args = [sys.executable, "-m", "federation.commands.cli", "serve", "--spec",
            str(ROOT / "examples" / "federation.yaml"), "--data-dir", str(tmp_path / "data"),
            "--listen", "127.0.0.1:0", "--no-check", "--web.config.file", str(web)]
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "GPUFED_TOKEN": TOKEN})
    try:
        port = serve_port(log, proc)
        url = f"https://localhost:{port}"
        with _client(pki, with_cert=True) as client:
            health = wait_for(lambda: client.get(f"{url}/healthz"), timeout=60, what="serve over TLS")
            assert health.status_code == 200, health.text
            unauthorised = client.post(f"{url}/v1/plan", json={})
            assert unauthorised.status_code == 401  # the token check still runs behind TLS
        with _client(pki, with_cert=False) as client, pytest.raises(httpx.TransportError):
            client.get(f"{url}/healthz")
        with httpx.Client(timeout=10) as plain, pytest.raises(httpx.TransportError):
            plain.get(f"http://127.0.0.1:{port}/healthz")
    finally:
        stop_process(proc)
