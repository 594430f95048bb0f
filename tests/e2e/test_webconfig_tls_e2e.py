"""Real Prometheus (2.x and 3.x, Go's TLS client) scrapes the exporter served with
``--web.config.file``: client certificate required, basic auth, certificate rotated mid-run.

Five jobs scrape one exporter: ``gpu`` with the client certificate and the password (up),
``nocert`` without a certificate, ``wrongpw`` with a wrong password, ``wrongca`` trusting
another CA than the one that signed the exporter's certificate and ``strangercert`` with a
client certificate from another CA (all four down, each with its own error). The exporter
counts each refusal by reason, and ``gpu`` scrapes those counters into Prometheus; the
exporter logs no traceback. After the server certificate is replaced, ``gpu`` keeps being
scraped, a new connection is served the new certificate, and the reload is counted.
"""

from __future__ import annotations

import datetime
import logging
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
import yaml
from conftest import stack_tool, wait_for
from cryptography import x509

from exporter.app import ExporterApp
from exporter.settings import ExporterSettings
from tests.e2e.prom_process import PrometheusProcess
from tests.webconfig.pki import Leaf, Pki

pytestmark = pytest.mark.e2e
PASSWORD = "scrape-password-1"


def _scrape_job(name: str, port: int, pki: Pki, *, client: Leaf | None,
                password_file: Path) -> dict[str, Any]:
    tls: dict[str, Any] = {"ca_file": str(pki.ca_file), "server_name": "localhost"}
    if client is not None:
        tls |= {"cert_file": str(client.cert), "key_file": str(client.key)}
    return {"job_name": name, "scheme": "https", "scrape_interval": "1s", "scrape_timeout": "1s",
            "tls_config": tls, "basic_auth": {"username": "prometheus", "password_file": str(password_file)},
            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}


@pytest.fixture()
def exporter(tmp_path: Path) -> Iterator[tuple[ExporterApp, Pki, Leaf]]:
    pki = Pki(tmp_path)
    server = pki.server()
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": server.cert.name, "key_file": server.key.name,
                              "client_auth_type": "RequireAndVerifyClientCert",
                              "client_ca_file": pki.ca_file.name},
        "basic_auth_users": {"prometheus": hashed}}))
    app = ExporterApp(ExporterSettings(backend="simulated", gpus=2, listen="127.0.0.1:0",
                                       collect_interval=0.5, web_config_file=web))
    app.start()
    try:
        yield app, pki, server
    finally:
        app.stop()


def _targets(prom: PrometheusProcess) -> dict[str, dict[str, Any]]:
    return {t["labels"]["job"]: t for t in prom.active_targets()}


def _served_serial(port: int, pki: Pki, client: Leaf) -> int:
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    ctx.load_cert_chain(str(client.cert), str(client.key))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


@pytest.mark.parametrize("line", [2, 3])
def test_prometheus_scrapes_the_exporter_over_mutual_tls(
        line: int, exporter: tuple[ExporterApp, Pki, Leaf], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    app, pki, first = exporter
    port = app.http.port
    client = pki.client()
    (tmp_path / "stranger").mkdir()
    stranger = Pki(tmp_path / "stranger", name="stranger CA")
    good, bad = tmp_path / "password", tmp_path / "wrong-password"
    good.write_text(PASSWORD)
    bad.write_text("not-the-password")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [
        _scrape_job("gpu", port, pki, client=client, password_file=good),
        _scrape_job("nocert", port, pki, client=None, password_file=good),
        _scrape_job("wrongpw", port, pki, client=client, password_file=bad),
        _scrape_job("wrongca", port, stranger, client=client, password_file=good),
        _scrape_job("strangercert", port, pki, client=stranger.client(), password_file=good),
    ]}))
    with httpx.Client(timeout=10) as http, PrometheusProcess(
            stack_tool(line, "prometheus"), config=config, data=tmp_path / "data", log=tmp_path / "prom.log",
            client=http) as prom:
        prom.wait_ready()

        def all_scraped() -> dict[str, dict[str, Any]] | None:
            targets = _targets(prom)
            done = len(targets) == 5 and all(t["health"] != "unknown" for t in targets.values())
            return targets if done else None

        targets = wait_for(all_scraped, timeout=30, interval=0.2, what="five targets scraped")
        assert targets["gpu"]["health"] == "up", targets["gpu"]["lastError"]
        assert targets["nocert"]["health"] == "down"
        assert targets["wrongpw"]["health"] == "down" and "401" in targets["wrongpw"]["lastError"]
        assert targets["wrongca"]["health"] == "down"
        assert "x509: certificate signed by unknown authority" in targets["wrongca"]["lastError"]
        assert targets["strangercert"]["health"] == "down"
        assert prom.query('DCGM_FI_DEV_GPU_TEMP{job="gpu"}'), "no GPU series scraped over TLS"
        for metric, reason in (("tls_handshake_failures", "no_client_cert"),
                               ("tls_handshake_failures", "server_cert_refused"),
                               ("tls_handshake_failures", "unknown_ca"),
                               ("auth_failures", "bad_password")):
            promql = f'gpufed_web_{metric}_total{{job="gpu",reason="{reason}"}} > 0'
            wait_for(lambda q=promql: prom.query(q) or None, timeout=30, interval=0.2, what=promql)
        zero = 'gpufed_web_tls_handshake_failures_total{job="gpu",reason=~"expired|plain_http|protocol"} > 0'
        assert prom.query(zero) == [], "a refusal counted under a reason no job gave"

        rotated_at = datetime.datetime.now(datetime.UTC)
        second = pki.server()
        assert _served_serial(port, pki, client) == second.serial != first.serial

        def scraped_after_rotation() -> bool:
            target = _targets(prom)["gpu"]
            last = datetime.datetime.fromisoformat(target["lastScrape"].replace("Z", "+00:00"))
            return last > rotated_at and target["health"] == "up"

        wait_for(scraped_after_rotation, timeout=30, interval=0.2, what="a scrape after the rotation")
        reloads = 'gpufed_web_tls_certificate_reloads_total{job="gpu"} == 1'
        wait_for(lambda: prom.query(reloads) or None, timeout=30, interval=0.2, what=reloads)
    assert all(record.exc_info is None for record in caplog.records)
    assert "Traceback" not in caplog.text
