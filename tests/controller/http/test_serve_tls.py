"""``gpufed serve --web.config.file`` as a real process: TLS with client certificates
required, the bearer token still carried in Authorization for changes; a client without a
certificate and a plain-HTTP client refused, each counted on ``/metrics`` and said in one
log line, without a traceback."""

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
from prometheus_client.parser import text_string_to_metric_families

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


def handshake_failures(exposition: str) -> dict[str, float]:
    """``gpufed_web_tls_handshake_failures_total`` by reason, from a ``/metrics`` answer."""
    return {sample.labels["reason"]: sample.value
            for family in text_string_to_metric_families(exposition)
            if family.name == "gpufed_web_tls_handshake_failures"
            for sample in family.samples if sample.name.endswith("_total")}


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
        with _client(pki, with_cert=True) as client:
            counted = wait_for(lambda: (lambda c: c if c.get("plain_http") == 1 else None)(
                handshake_failures(client.get(f"{url}/metrics").text)), timeout=10, what="refusals counted")
    finally:
        stop_process(proc)
    assert {reason: n for reason, n in counted.items() if n} == {"no_client_cert": 1, "plain_http": 1}
    said = log.read_text()
    assert "Traceback" not in said
    for reason in ("no_client_cert", "plain_http"):
        assert said.count(f"TLS handshake refused reason={reason}:") == 1, said
