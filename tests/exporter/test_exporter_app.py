"""Serving, readiness, collection timeouts, fleet mode, settings and the CLI."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from exporter import logs
from exporter.app import ExporterApp
from exporter.catalogue import select_families
from exporter.collection import Collection
from exporter.commands.cli import build_settings, cli
from exporter.fleet import FleetApp, fleet_nodes
from exporter.models import Reading
from exporter.settings import ExporterSettings
from exporter.simulated import SimulatedBackend
from federation.testing.standins.consul.agent import FakeConsulAgent


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_serve_metrics_health_ready() -> None:
    app = ExporterApp(ExporterSettings(backend="simulated", gpus=8, listen="127.0.0.1:0", node_name="n1",
                                       collect_interval=0.05))
    app.start()
    try:
        base = f"http://127.0.0.1:{app.http.port}"
        status, body = get(f"{base}/metrics")
        assert status == 200
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        assert len(fams["DCGM_FI_DEV_GPU_UTIL"].samples) == 8
        assert get(f"{base}/healthz")[0] == 200
        assert get(f"{base}/readyz")[0] == 200
        assert get(f"{base}/nope")[0] == 404
    finally:
        app.stop()


class BlockingBackend(SimulatedBackend):
    """Reads hang until released: a wedged driver."""

    def __init__(self) -> None:
        super().__init__(1, clock=lambda: 1000.0)
        self.release = threading.Event()
        self.block = False

    def read(self, families):
        if self.block:
            self.release.wait(5)
        return super().read(families)


def test_collection_timeout_keeps_last_snapshot() -> None:
    backend = BlockingBackend()
    collection = Collection(backend, select_families(), timeout=0.05, clock=lambda: 1000.0)
    assert collection.collect_once()
    first = collection.snapshot
    backend.block = True
    assert not collection.collect_once()  # abandoned at the timeout
    assert not collection.collect_once()  # previous read still hung: not restarted
    assert collection.snapshot is first
    assert collection.stats.timeouts == 2
    backend.block = False
    backend.release.set()
    collection._hung.join(1)  # type: ignore[union-attr]
    assert collection.collect_once()


def test_readyz_fails_without_recent_collection() -> None:
    class Failing(SimulatedBackend):
        def read(self, families) -> dict[int, Reading]:
            raise RuntimeError("driver gone")

    app = ExporterApp(ExporterSettings(backend="simulated", listen="127.0.0.1:0", node_name="n"),
                      backend=Failing(1))
    app.start()
    try:
        base = f"http://127.0.0.1:{app.http.port}"
        assert get(f"{base}/readyz")[0] == 503
        assert get(f"{base}/healthz")[0] == 200
        body = get(f"{base}/metrics")[1].decode()
        fams = {f.name: f for f in text_string_to_metric_families(body)}
        errors = fams["gpufed_exporter_collection_errors"]
        assert errors.samples[0].value >= 1
        assert "DCGM_FI_DEV_GPU_UTIL" not in body  # no snapshot yet: no stale or invented values
    finally:
        app.stop()


def test_fleet_serves_per_node_paths_and_registers_each() -> None:
    nodes = fleet_nodes(6, regions=3)
    assert [n.region for n in nodes[:3]] == ["region-0", "region-1", "region-2"]
    with FakeConsulAgent() as agent:
        from exporter.consul_registry import ConsulAgentRegistry

        settings = ExporterSettings(backend="simulated", gpus=2, listen="127.0.0.1:0", register_interval=0.05)
        app = FleetApp(settings, nodes, registry=ConsulAgentRegistry(agent.address))
        app.start()
        try:
            base = f"http://127.0.0.1:{app.http.port}"
            status, body = get(f"{base}/nodes/{nodes[4].name}/metrics")
            assert status == 200
            fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
            util = fams["DCGM_FI_DEV_GPU_UTIL"]
            assert {s.labels["Hostname"] for s in util.samples} == {nodes[4].name}
            assert {s.labels["region"] for s in util.samples} == {nodes[4].region}
            assert get(f"{base}/nodes/nope/metrics")[0] == 404
            assert get(f"{base}/nodes")[1].decode().split() == [n.name for n in nodes]
            assert get(f"{base}/readyz")[0] == 200
            wait = threading.Event()
            for _ in range(200):
                if len(agent.services) == 6:
                    break
                wait.wait(0.02)
            metas = {s.meta["node"]: s.meta for s in agent.services.values()}
            assert metas[nodes[4].name]["metrics_path"] == f"/nodes/{nodes[4].name}/metrics"
            agent.run_checks()
            assert all(c.status == "passing" for s in agent.services.values() for c in s.checks.values())
        finally:
            app.stop()
        assert agent.services == {}


def test_settings_env_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFED_EXPORTER_GPUS", "4")
    monkeypatch.setenv("GPUFED_EXPORTER_FAMILIES_INCLUDE", "gpm,pcie")
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    settings = build_settings(gpus=2, region="eu-1", backend=None)
    assert settings.gpus == 2
    assert settings.families_include == ["gpm", "pcie"]
    assert settings.node_name == "from-downward-api"
    assert settings.region == "eu-1"
    assert settings.backend == "nvml"
    with pytest.raises(ValueError, match="at least 1m"):
        ExporterSettings(deregister_critical_after="30s")
    with pytest.raises(ValueError, match="unknown families"):
        ExporterSettings(families_include=["bogus"])


def test_cli_bench_json_and_help() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["bench", "--gpus", "2", "--scrapes", "30", "--fleet-nodes", "3", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["serve"]["scrapes"] == 30
    assert data["fleet"]["capacity_nodes"] > 0
    assert runner.invoke(cli, ["serve", "--help"]).exit_code == 0
    bad = runner.invoke(cli, ["serve", "--backend", "simulated", "--families", "bogus"])
    assert bad.exit_code == 2


def test_logfmt_and_json_lines() -> None:
    import logging

    record = logging.LogRecord("exporter.x", logging.INFO, __file__, 1, "registered count=%d", (3,), None)
    line = logs.StructuredFormatter("logfmt").format(record)
    assert line.endswith('level=info logger=exporter.x msg="registered count=3"')
    assert json.loads(logs.StructuredFormatter("json").format(record))["msg"] == "registered count=3"
