"""Consul registration through real py-consul against the in-process fake agent."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path

import pytest
from conftest import wait_for as shared_wait_for

from exporter.app import ExporterApp
from exporter.consul_registry import ConsulAgentRegistry, split_address
from exporter.errors import RegistryError
from exporter.registration import Registrar, clean_meta, service_definition, service_id
from exporter.settings import ExporterSettings
from federation.localrun.loopback import free_port
from federation.testing.standins.consul.agent import FakeConsulAgent
from tests.webconfig.pki import Pki

wait_for = partial(shared_wait_for, timeout=5.0, interval=0.01)


@pytest.fixture
def agent():
    with FakeConsulAgent() as fake:
        yield fake


def _definition(port: int = 9400, host: str = "node-a"):
    return service_definition("gpufed-exporter", host, address="127.0.0.1", port=port,
                              meta={"region": "eu-1", "gpu_count": 8, "metrics_path": "/metrics"})


def test_meta_limits_enforced() -> None:
    meta = {f"k{i:03d}": "v" for i in range(70)} | {"bad key!": "x", "consul-x": "y", "long": "z" * 600}
    cleaned = clean_meta(meta)
    assert len(cleaned) == 64
    assert "consul-x" not in cleaned
    assert all(len(v) <= 512 for v in cleaned.values())
    assert clean_meta({"bad key!": 1, "k" * 200: 2}) == {"bad_key_": "1", "k" * 128: "2"}
    assert service_id("gpufed-exporter", "node a.example", 9400) == "gpufed-exporter-node-a.example-9400"


def test_split_address() -> None:
    assert split_address("consul.local:8501") == ("consul.local", 8501)
    assert split_address("http://10.0.0.1:8500/") == ("10.0.0.1", 8500)
    assert split_address("consul") == ("consul", 8500)


def test_register_payload_as_consul_documents(agent: FakeConsulAgent) -> None:
    registry = ConsulAgentRegistry(agent.address)
    registry.register(_definition())
    (service,) = agent.services.values()
    assert service.service_id == "gpufed-exporter-node-a-9400"
    assert (service.name, service.address, service.port) == ("gpufed-exporter", "127.0.0.1", 9400)
    assert service.tags == ["gpu", "prometheus"]
    assert service.meta == {"gpu_count": "8", "metrics_path": "/metrics", "region": "eu-1"}
    (check,) = service.checks.values()
    assert check.http == "http://127.0.0.1:9400/healthz"
    assert (check.interval, check.timeout, check.deregister_after) == ("10s", "2s", "5m")
    assert ("PUT", "/v1/agent/service/register?replace-existing-checks=true") in agent.requests
    assert registry.service_ids() == {"gpufed-exporter-node-a-9400"}
    registry.deregister("gpufed-exporter-node-a-9400")
    assert agent.services == {}
    registry.deregister("gpufed-exporter-node-a-9400")  # 404 from Consul: already gone, not an error


def test_unreachable_agent_is_registry_error() -> None:
    with pytest.raises(RegistryError):
        ConsulAgentRegistry(f"127.0.0.1:{free_port()}", timeout=1).service_ids()


def test_reregisters_after_agent_restart_and_deregisters_on_stop(agent: FakeConsulAgent) -> None:
    registrar = Registrar(ConsulAgentRegistry(agent.address), [_definition()], interval=0.05)
    registrar.start()
    try:
        wait_for(lambda: "gpufed-exporter-node-a-9400" in agent.services)
        agent.restart()  # the agent forgot us
        assert agent.services == {}
        wait_for(lambda: "gpufed-exporter-node-a-9400" in agent.services)
    finally:
        registrar.stop(deregister=True)
    assert agent.services == {}


def test_agent_down_at_start_then_up() -> None:
    port = free_port()
    registrar = Registrar(ConsulAgentRegistry(f"127.0.0.1:{port}", timeout=1), [_definition()],
                          interval=0.05, backoff_initial=0.02, backoff_max=0.1)
    registrar.start()
    try:
        wait_for(lambda: registrar.failures >= 2)
        with FakeConsulAgent(port=port) as fake:
            wait_for(lambda: "gpufed-exporter-node-a-9400" in fake.services)
            registrar.stop(deregister=True)
            assert fake.services == {}
    finally:
        registrar.stop(deregister=False)


def test_fake_agent_rejects_what_consul_rejects(agent: FakeConsulAgent) -> None:
    def put(body: dict) -> int:
        req = urllib.request.Request(f"http://{agent.address}/v1/agent/service/register",
                                     data=json.dumps(body).encode(), method="PUT")
        try:
            with urllib.request.urlopen(req, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code

    assert put({"Name": "x", "Meta": {"bad key": "v"}}) == 400
    assert put({"Name": "x", "Meta": {"k": "v" * 513}}) == 400
    assert put({"Meta": {}}) == 400
    assert put({"Name": "x", "Check": {"HTTP": "http://h/", "Interval": "ten"}}) == 400
    assert put({"Name": "x", "Port": 1}) == 200


def _get(url: str) -> tuple[int, dict, object]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, dict(response.headers), json.loads(response.read() or b"null")


def test_blocking_catalog_and_health_queries(agent: FakeConsulAgent) -> None:
    _, headers, body = _get(f"http://{agent.address}/v1/catalog/service/gpufed-exporter")
    index = int(headers["X-Consul-Index"])
    assert body == []
    started = time.monotonic()
    _, headers, _ = _get(f"http://{agent.address}/v1/catalog/service/gpufed-exporter?index={index}&wait=200ms")
    assert time.monotonic() - started >= 0.15  # nothing changed: waited out
    assert int(headers["X-Consul-Index"]) == index
    timer = threading.Timer(0.1, lambda: ConsulAgentRegistry(agent.address).register(_definition()))
    timer.start()
    try:
        _, headers, body = _get(f"http://{agent.address}/v1/catalog/service/gpufed-exporter?index={index}&wait=5s")
    finally:
        timer.join()
    assert int(headers["X-Consul-Index"]) > index
    (entry,) = body  # type: ignore[misc]
    assert entry["ServiceMeta"]["metrics_path"] == "/metrics"
    assert entry["ServicePort"] == 9400
    _, _, passing = _get(f"http://{agent.address}/v1/health/service/gpufed-exporter?passing=1")
    assert passing == []  # a new HTTP check starts critical
    agent.set_status("gpufed-exporter-node-a-9400", "passing")
    _, _, passing = _get(f"http://{agent.address}/v1/health/service/gpufed-exporter?passing=1")
    assert [e["Service"]["ID"] for e in passing] == ["gpufed-exporter-node-a-9400"]  # type: ignore[union-attr]


def test_app_registers_passes_check_and_deregisters(agent: FakeConsulAgent) -> None:
    settings = ExporterSettings(backend="simulated", gpus=2, listen="127.0.0.1:0", node_name="node-b",
                                consul=agent.address, region="eu-1", rack="r1", team="ml", cluster="c1",
                                register_interval=0.05, collect_interval=0.05)
    app = ExporterApp(settings)
    app.start()
    try:
        sid = f"gpufed-exporter-node-b-{app.http.port}"
        wait_for(lambda: sid in agent.services)
        meta = agent.services[sid].meta
        assert meta == {"cluster": "c1", "driver": "550.54.15", "gpu_count": "2",
                        "gpu_model": "NVIDIA H100 80GB HBM3", "metrics_path": "/metrics", "node": "node-b",
                        "rack": "r1", "region": "eu-1", "team": "ml"}
        agent.run_checks()
        assert [c.status for c in agent.services[sid].checks.values()] == ["passing"]
    finally:
        app.stop()
    assert agent.services == {}


def test_an_exporter_serving_tls_gets_a_tcp_check(agent: FakeConsulAgent, tmp_path: Path) -> None:
    """Consul's agent presents no client certificate: its check of a TLS exporter only connects."""
    pki = Pki(tmp_path)
    settings = ExporterSettings(backend="simulated", gpus=1, listen="127.0.0.1:0", node_name="node-t",
                                consul=agent.address, region="eu-1", register_interval=0.05,
                                collect_interval=0.05,
                                web_config_file=pki.web_config(tmp_path / "web.yml", server=pki.server()))
    app = ExporterApp(settings)
    app.start()
    try:
        sid = f"gpufed-exporter-node-t-{app.http.port}"
        wait_for(lambda: sid in agent.services)
        (check,) = agent.services[sid].checks.values()
        assert (check.http, check.tcp) == ("", f"127.0.0.1:{app.http.port}")
    finally:
        app.stop()


def test_kubernetes_mode_never_registers(agent: FakeConsulAgent) -> None:
    settings = ExporterSettings(backend="simulated", gpus=1, listen="127.0.0.1:0", node_name="k",
                                consul=agent.address, kubernetes=True)
    app = ExporterApp(settings)
    try:
        assert app.registrar is None
    finally:
        app.http.stop()
        app.backend.close()
