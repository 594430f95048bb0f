"""``gpufed serve --http.config.file``: the controller's own calls over mutual TLS.

A real Prometheus serves ``--web.config.file`` with client certificates required, as the
children and the master do with the spec's ``tls.serve``. The controller built from
``ServeSettings(client_tls=...)`` reads its targets (hand-over checks), reloads it (a
published config) and queries it (``--load-url``); built without, every call is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import require_tool, stop_process, wait_for

from federation.controller.http.service import ServeSettings, Service, build_service
from federation.controller.live.probe import ChildProbe
from federation.controller.load.reader import PrometheusLoadReader
from federation.localrun.loopback import free_port
from federation.spec import load_gpufed_spec
from tests.webconfig.pki import Pki
from webconfig.client import client_context

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def http_config(tmp_path: Path, pki: Pki) -> Path:
    leaf = pki.client()
    path = tmp_path / "http-client.yml"
    path.write_text(yaml.safe_dump({"tls_config": {"ca_file": str(pki.ca_file), "cert_file": str(leaf.cert),
                                                   "key_file": str(leaf.key)}}))
    return path


@pytest.fixture
def child(tmp_path: Path, pki: Pki, http_config: Path) -> Iterator[str]:
    """A Prometheus requiring client certificates, with reloads allowed (as the children run)."""
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s}\nscrape_configs: []\n")
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [require_tool("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
             "--web.enable-lifecycle",
             f"--web.config.file={pki.web_config(tmp_path / 'web.yml', server=pki.server())}"],
            stdout=out, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    context = client_context(http_config)
    try:
        with httpx.Client(verify=context or True, timeout=5) as client:
            def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(log.read_text(errors="replace")[-2000:])
                try:
                    return client.get(url + "/-/ready").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(ready, timeout=30, interval=0.1, what="Prometheus over mutual TLS")
        yield url
    finally:
        stop_process(proc)


def _service(tmp_path: Path, name: str, http_config: Path | None) -> Service:
    return build_service(ServeSettings(
        spec=load_gpufed_spec(ROOT / "examples" / "federation.yaml"), data_dir=tmp_path / name, dev=True,
        check_configs=False, client_tls=client_context(http_config), env={}))


def test_the_controllers_calls_present_its_client_certificate(
        tmp_path: Path, child: str, http_config: Path) -> None:
    service = _service(tmp_path, "with-tls", http_config)
    try:
        probe = ChildProbe(service.http)
        assert probe.active_targets(child) == {}  # hand-over checks read the child's targets
        assert probe.reload(child) is True  # a published config is applied
        assert PrometheusLoadReader(service.http).query(child, "vector(1)") is not None  # --load-url
    finally:
        service.stop()
    bare = _service(tmp_path, "without", None)
    try:
        probe = ChildProbe(bare.http)
        assert probe.active_targets(child) is None and probe.reload(child) is False
        assert PrometheusLoadReader(bare.http).query(child, "vector(1)") is None
    finally:
        bare.stop()


def test_a_bad_http_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "http.yml"
    bad.write_text("tls_config:\n  ca_file: ca.crt\nbasic_auth: {username: a, password: b}\n")
    done = subprocess.run(
        [sys.executable, "-m", "federation.commands.cli", "serve",
         "--spec", str(ROOT / "examples" / "federation.yaml"), "--data-dir", str(tmp_path / "data"),
         "--listen", "127.0.0.1:0", "--dev", "--no-check",
         "--http.config.file", str(bad)],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ, "GPUFED_TOKEN": ""})
    assert done.returncode == 2, done.stderr
    assert f"error: --http.config.file: {bad}: basic_auth: not supported" in done.stderr
    assert "Traceback" not in done.stderr
