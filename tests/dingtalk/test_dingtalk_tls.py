"""``gpufed-dingtalk --web.config.file`` as a real process: TLS with client certificates and
basic auth (what Alertmanager's webhook_configs http_config sends); a wrong password, no
credentials and no client certificate refused, each counted on ``/metrics`` and said in one
log line, without a traceback."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import bcrypt
import httpx
import pytest
import yaml
from conftest import stop_process, wait_for
from prometheus_client.parser import text_string_to_metric_families

from federation.localrun.loopback import free_port
from tests.webconfig.pki import Pki


def _counters(exposition: str, family_name: str) -> dict[str, float]:
    return {sample.labels["reason"]: sample.value
            for family in text_string_to_metric_families(exposition) if family.name == family_name
            for sample in family.samples if sample.name.endswith("_total")}


def test_relay_over_mutual_tls_with_basic_auth(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    server = pki.server()
    client_leaf = pki.client()
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(server.cert), "key_file": str(server.key),
                              "client_auth_type": "RequireAndVerifyClientCert",
                              "client_ca_file": str(pki.ca_file)},
        "basic_auth_users": {"alertmanager": bcrypt.hashpw(b"am-pass", bcrypt.gensalt(4)).decode()}}))
    relay = tmp_path / "relay.yml"
    relay.write_text("robots:\n  cn-bj:\n    url: https://oapi.dingtalk.com/robot/send?access_token=t\n")
    port = free_port()
    log = tmp_path / "relay.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "alertmanager.dingtalk", "--config", str(relay),
                                 "--listen", f"127.0.0.1:{port}", "--web.config.file", str(web)],
                                stdout=out, stderr=subprocess.STDOUT)
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    ctx.load_cert_chain(str(client_leaf.cert), str(client_leaf.key))
    url = f"https://localhost:{port}/healthz"
    try:
        with httpx.Client(verify=ctx, timeout=10) as client:
            def up() -> httpx.Response:
                assert proc.poll() is None, log.read_text()
                return client.get(url, auth=("alertmanager", "am-pass"))

            assert wait_for(up, timeout=60, what="relay over TLS").status_code == 200
            assert client.get(url, auth=("alertmanager", "wrong")).status_code == 401
            assert client.get(url).status_code == 401
        bare = ssl.create_default_context(cafile=str(pki.ca_file))
        with httpx.Client(verify=bare, timeout=10) as client, pytest.raises(httpx.TransportError):
            client.get(url, auth=("alertmanager", "am-pass"))
        with httpx.Client(verify=ctx, timeout=10) as client:
            def counted() -> str | None:
                text = client.get(url.replace("/healthz", "/metrics"), auth=("alertmanager", "am-pass")).text
                done = _counters(text, "gpufed_web_tls_handshake_failures").get("no_client_cert") == 1
                return text if done else None

            exposition = wait_for(counted, timeout=10, what="refusals counted")
    finally:
        stop_process(proc)
    tls = _counters(exposition, "gpufed_web_tls_handshake_failures")
    auth = _counters(exposition, "gpufed_web_auth_failures")
    assert {reason: n for reason, n in tls.items() if n} == {"no_client_cert": 1}
    assert auth == {"missing": 1, "malformed": 0, "unknown_user": 0, "bad_password": 1}
    said = log.read_text()
    assert "Traceback" not in said
    assert said.count("TLS handshake refused reason=no_client_cert:") == 1, said
    assert said.count("basic auth refused") == 2 and said.count("reason=bad_password") == 1, said
