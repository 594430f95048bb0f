"""A real Prometheus 2.42 scrapes the simulated exporter; DCGM queries return 8 series."""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import require_tool, stop_process, wait_for

from exporter.app import ExporterApp
from exporter.settings import ExporterSettings
from federation.localrun.loopback import free_port


def _api(port: int, path: str, **params: str) -> dict:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}{query}", timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.e2e
def test_prometheus_scrapes_simulated_exporter(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    settings = ExporterSettings(backend="simulated", gpus=8, listen="127.0.0.1:0", node_name="e2e-node",
                                collect_interval=0.5)
    app = ExporterApp(settings)
    app.start()
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpu\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{app.http.port}']}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        seen: dict[str, Any] = {"up": False, "series": []}

        def scraped() -> bool:
            try:
                targets = _api(prom_port, "/api/v1/targets")["data"]["activeTargets"]
                seen["up"] = any(t["health"] == "up" for t in targets)
                query = 'DCGM_FI_DEV_GPU_TEMP{Hostname="e2e-node"}'
                seen["series"] = _api(prom_port, "/api/v1/query", query=query)["data"]["result"]
            except OSError:
                return False
            return bool(seen["up"] and len(seen["series"]) == 8)

        with contextlib.suppress(AssertionError):  # the asserts below say what is missing
            wait_for(scraped, timeout=30, interval=0.3, what="8 GPU series")
        up, series = seen["up"], seen["series"]
        assert up, "target never came up"
        assert sorted(s["metric"]["gpu"] for s in series) == [str(i) for i in range(8)]
        fb = _api(prom_port, "/api/v1/query", query="sum by (Hostname) (DCGM_FI_DEV_FB_FREE)")
        fb = fb["data"]["result"]
        assert fb and fb[0]["metric"]["Hostname"] == "e2e-node"
    finally:
        stop_process(proc)
        log.close()
        app.stop()
