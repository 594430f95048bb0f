"""Registration with the gpufed controller's built-in registry (`--register-url`), against
the controller itself: its app served on loopback (`tests/exporter/registry_server.py`)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
from conftest import stop_process
from conftest import wait_for as shared_wait_for

from exporter import logs
from exporter.app import ExporterApp
from exporter.commands.cli import main
from exporter.controller_registry import ControllerRegistry, controller_client, target_path
from exporter.errors import RegistryError, RegistryRefused
from exporter.fleet import FleetApp, fleet_nodes
from exporter.registration import Registrar
from exporter.settings import ExporterSettings
from exporter.target_entry import target_entry
from federation.localrun.loopback import free_port
from tests.exporter.registry_server import READ_TOKEN, TOKEN, RegistryServer

wait_for = partial(shared_wait_for, timeout=5.0, interval=0.01)


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[RegistryServer]:
    with RegistryServer(tmp_path) as server:
        yield server


@pytest.fixture
def client(controller: RegistryServer) -> Iterator[httpx.Client]:
    with controller_client(controller.url, timeout=2) as http:
        yield http


def _settings(url: str, **overrides: object) -> ExporterSettings:
    values: dict[str, object] = dict(
        backend="simulated", gpus=2, listen="127.0.0.1:0", node_name="node-a", register_url=url,
        register_token=TOKEN, region="eu-1", rack="r07", team="ml", register_interval=0.02,
        collect_interval=0.05,
    )
    return ExporterSettings(**(values | overrides))  # type: ignore[arg-type]


def _entry(port: int = 9400, address: str = "10.0.0.7", **fields: object):
    return target_entry(address=address, port=port, job="gpu", node="node-a", region="eu-1",
                        **fields)  # type: ignore[arg-type]


# -- the pure entry and the adapter ------------------------------------------------------

def test_entry_identity_body_and_path() -> None:
    v6 = _entry(address="[FD00:0:0:0::1]", rack="r1", gpus=8)
    assert v6.identity == "[fd00::1]:9400"
    assert target_path(v6.identity) == "/v1/registry/targets/%5Bfd00%3A%3A1%5D%3A9400"
    assert v6.body() == {"address": "fd00::1", "gpus": 8, "job": "gpu", "node": "node-a", "port": 9400,
                         "rack": "r1", "region": "eu-1"}
    named = _entry(address="GPU-Node.Example.", metrics_path="/nodes/n/metrics", identity="n:gpu",
                   labels={"pool": "a"})
    assert named.identity == "n:gpu"
    assert named.body() == {"address": "gpu-node.example", "gpus": 0, "identity": "n:gpu", "job": "gpu",
                            "labels": {"pool": "a"}, "metrics_path": "/nodes/n/metrics", "node": "node-a",
                            "port": 9400, "region": "eu-1"}


def test_adapter_put_list_delete(controller: RegistryServer, client: httpx.Client) -> None:
    registry = ControllerRegistry(client, token=TOKEN)
    v6 = _entry(address="fd00::1")
    registry.register(v6)
    registry.register(v6)  # a refresh: 200 instead of 201, same entry
    registry.register(_entry(identity="node-a:gpu", metrics_path="/nodes/node-a/metrics"))
    assert registry.service_ids() == {"[fd00::1]:9400", "node-a:gpu"}
    # as the registry keeps it: defaults (gpus 0) left out, the weight it derives added
    assert controller.targets["[fd00::1]:9400"] == {"address": "fd00::1", "port": 9400, "job": "gpu",
                                                    "node": "node-a", "region": "eu-1", "weight": 1}
    registry.deregister("[fd00::1]:9400")
    registry.deregister("[fd00::1]:9400")  # 404: already gone, not an error
    assert set(controller.targets) == {"node-a:gpu"}
    assert [m for m, _ in controller.requests].count("PUT") == 3


def test_adapter_maps_refusals_and_outages(controller: RegistryServer, client: httpx.Client) -> None:
    with pytest.raises(RegistryRefused, match=r"answered 401 \(the token was refused; set --register-token"):
        ControllerRegistry(client, token="wrong").register(_entry())
    with pytest.raises(RegistryRefused, match=r"answered 401 \(no token was sent"):
        ControllerRegistry(client).register(_entry())
    with pytest.raises(RegistryRefused, match="answered 403"):
        ControllerRegistry(client, token=READ_TOKEN).register(_entry())
    assert ControllerRegistry(client, token=READ_TOKEN).service_ids() == set()
    with pytest.raises(RegistryRefused, match=r"answered 422 \(entry refused\).*metrics_path"):
        ControllerRegistry(client, token=TOKEN).register(_entry(metrics_path="metrics"))
    controller.follower = True
    with pytest.raises(RegistryError, match=r"answered 503 \(a follower; leader http://gpufed-0") as info:
        ControllerRegistry(client, token=TOKEN).register(_entry())
    assert not isinstance(info.value, RegistryRefused)
    hangs_up = httpx.Client(base_url=controller.url, transport=httpx.MockTransport(_hang_up))
    with hangs_up, pytest.raises(RegistryError, match="RemoteProtocolError") as info:
        ControllerRegistry(hangs_up, token=TOKEN).register(_entry())  # the connection closes unanswered
    assert not isinstance(info.value, RegistryRefused)
    with controller_client(f"http://127.0.0.1:{free_port()}", timeout=1) as dead, \
            pytest.raises(RegistryError, match="ConnectError"):
        ControllerRegistry(dead, token=TOKEN).register(_entry())


def _hang_up(request: httpx.Request) -> httpx.Response:
    raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)


def test_short_lease_is_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with RegistryServer(tmp_path, ttl_s=20) as fake, \
            controller_client(fake.url) as http:
        registry = ControllerRegistry(http, token=TOKEN, refresh_interval=30)
        with caplog.at_level(logging.WARNING, logger="exporter.controller_registry"):
            registry.register(_entry())
            registry.register(_entry())
    (record,) = caplog.records
    assert "expires_in_s=20 register_interval=30" in record.getMessage()


class Flaky:
    """A leasing registry in memory that fails from the `fail_at`-th call on."""

    expires_entries = True

    def __init__(self, fail_at: int) -> None:
        self.calls, self.fail_at = 0, fail_at
        self.lock = threading.Lock()

    def _call(self) -> None:
        with self.lock:
            self.calls += 1
            if self.calls >= self.fail_at:
                raise RegistryError("controller went away")

    def register(self, service: object) -> None:
        self._call()

    def deregister(self, service_id: str) -> None:
        self._call()

    def service_ids(self) -> set[str]:
        raise AssertionError("a leasing registry is refreshed, never listed")


@pytest.mark.parametrize("workers", [1, 8])
def test_a_pass_stops_at_the_first_failure(workers: int, caplog: pytest.LogCaptureFixture) -> None:
    entries = [_entry(port=1000 + i) for i in range(500)]
    flaky = Flaky(fail_at=10**6)
    registrar = Registrar(flaky, entries, workers=workers)
    assert registrar.sync_once() and registrar.sync_once()  # every pass re-registers everything
    assert flaky.calls == 1000
    flaky.calls, flaky.fail_at = 0, 3
    assert not registrar.sync_once()
    assert flaky.calls < 3 + workers  # the workers already under way finish; no one starts anew
    flaky.calls = 0
    with caplog.at_level(logging.WARNING, logger="exporter.registration"):
        registrar.stop(deregister=True)
    assert flaky.calls < 3 + workers
    (line,) = [r.getMessage() for r in caplog.records if "deregistration failed" in r.getMessage()]
    assert "left=" in line


# -- one node: serve ---------------------------------------------------------------------

def test_serve_registers_gpu_and_node_exporter_targets(controller: RegistryServer) -> None:
    app = ExporterApp(_settings(controller.url, node_exporter_port=9100))
    app.start()
    try:
        gpu_id = f"127.0.0.1:{app.http.port}"
        targets = wait_for(lambda: controller.targets if len(controller.targets) == 2 else None)
        assert targets == {
            gpu_id: {"address": "127.0.0.1", "port": app.http.port, "job": "gpu", "node": "node-a",
                     "region": "eu-1", "rack": "r07", "team": "ml", "gpus": 2, "weight": 2,
                     "identity": gpu_id},
            "127.0.0.1:9100": {"address": "127.0.0.1", "port": 9100, "job": "node", "node": "node-a",
                               "region": "eu-1", "rack": "r07", "team": "ml", "gpus": 2, "weight": 1,
                               "identity": "127.0.0.1:9100"},
        }
    finally:
        app.stop()
    assert controller.targets == {}
    # one process, two exporters: both go in one batch request each time, never one PUT each
    assert {method for method, _ in controller.requests} == {"POST"}
    assert controller.requests[-1] == ("POST", "/v1/registry/batch")  # the deregistration


def test_serve_on_an_older_controller_puts_and_deletes_each(controller: RegistryServer) -> None:
    controller.batch = False
    app = ExporterApp(_settings(controller.url, node_exporter_port=9100))
    app.start()
    try:
        wait_for(lambda: len(controller.targets) == 2)
    finally:
        app.stop()
    assert controller.targets == {}
    assert ("DELETE", f"/v1/registry/targets/127.0.0.1%3A{app.http.port}") in controller.requests
    assert [method for method, _ in controller.requests].count("POST") == 1  # asked once, then PUTs


def test_refresh_keeps_the_entry_past_its_ttl(tmp_path: Path) -> None:
    ttl = 1.0
    with RegistryServer(tmp_path, ttl_s=ttl) as controller:
        app = ExporterApp(_settings(controller.url, register_job="dcgm"))
        app.start()
        try:
            (identity,) = wait_for(lambda: controller.targets or None)
            deadline = time.monotonic() + 2.5 * ttl  # refreshes keep it for more than two leases
            while time.monotonic() < deadline:
                calls = len(controller.requests)
                wait_for(lambda c=calls: len(controller.requests) > c + 1)  # a whole refresh
                assert controller.targets[identity]["job"] == "dcgm"
            assert app.registrar is not None
            app.registrar.stop(deregister=False)  # refreshes stop: the lease runs out
            assert identity in controller.targets
            gone_after = controller.wait_expired(identity, timeout=ttl + 3)
            assert gone_after > ttl / 2  # its lease ran out, the exporter did not delete it
            assert [m for m, _ in controller.requests].count("DELETE") == 0
        finally:
            app.stop()


def test_sigterm_deregisters(controller: RegistryServer) -> None:
    port = free_port()
    # The token comes from GPUFED_TOKEN, the variable the gpufed CLI shares.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFED_")} | {"GPUFED_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--backend", "simulated", "--gpus", "1", "--listen",
         f"127.0.0.1:{port}", "--node-name", "sig", "--region", "eu-1", "--register-url", controller.url],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: f"127.0.0.1:{port}" in controller.targets, timeout=30)
    finally:
        stop_process(proc)
        output = proc.stdout.read().decode() if proc.stdout else ""
        if proc.stdout:
            proc.stdout.close()
    assert proc.returncode == 0, output
    assert controller.targets == {}
    assert ("DELETE", f"/v1/registry/targets/127.0.0.1%3A{port}") in controller.requests


def test_controller_down_at_start_then_up(tmp_path: Path) -> None:
    port = free_port()
    with controller_client(f"http://127.0.0.1:{port}", timeout=1) as http:
        registrar = Registrar(ControllerRegistry(http, token=TOKEN), [_entry()], interval=0.05,
                              backoff_initial=0.02, backoff_max=0.1)
        registrar.start()
        try:
            wait_for(lambda: registrar.failures >= 2)
            fake = RegistryServer(tmp_path, port=port)
            fake.follower = True  # up, but not the leader yet: 503, keep backing off
            with fake:
                failures = registrar.failures
                wait_for(lambda: registrar.failures > failures and fake.requests)
                fake.follower = False
                wait_for(lambda: "10.0.0.7:9400" in fake.targets)
                registrar.stop(deregister=True)
                assert fake.targets == {}
        finally:
            registrar.stop(deregister=False)


def test_bad_token_is_a_clear_error_line_and_serving_goes_on(
    controller: RegistryServer, caplog: pytest.LogCaptureFixture
) -> None:
    app = ExporterApp(_settings(controller.url, register_token="stale"))
    with caplog.at_level(logging.WARNING, logger="exporter.registration"):
        app.start()
        try:
            assert app.registrar is not None
            wait_for(lambda: app.registrar.failures >= 1)  # type: ignore[union-attr]
            with urllib.request.urlopen(f"http://127.0.0.1:{app.http.port}/metrics", timeout=5) as response:
                assert response.status == 200
        finally:
            app.stop()
    refused = [r for r in caplog.records if r.getMessage().startswith("registration refused")]
    assert refused and refused[0].levelno == logging.ERROR
    message = refused[0].getMessage()
    assert "answered 401" in message and "GPUFED_EXPORTER_REGISTER_TOKEN" in message
    assert "stale" not in message  # the token itself is never logged
    assert controller.targets == {}


# -- fleet -------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [True, False], ids=["batch-route", "older-controller"])
def test_fleet_registers_every_node(
    controller: RegistryServer, batch: bool, caplog: pytest.LogCaptureFixture
) -> None:
    controller.batch = batch
    settings = ExporterSettings(backend="simulated", gpus=4, listen="127.0.0.1:0",
                                register_url=controller.url, register_token=TOKEN, register_interval=0.05,
                                collect_interval=1)
    nodes = fleet_nodes(30, regions=3)
    app = FleetApp(settings, nodes)
    app.start()
    try:
        targets = wait_for(lambda: controller.targets if len(controller.targets) == 30 else None)
        assert sorted(targets) == sorted(f"{n.name}:gpu" for n in nodes)
        for node in nodes:
            entry = targets[f"{node.name}:gpu"]
            assert entry == {"address": "127.0.0.1", "port": app.http.port, "job": "gpu", "node": node.name,
                             "region": node.region, "rack": node.rack, "team": node.team, "gpus": 4,
                             "metrics_path": f"/nodes/{node.name}/metrics", "identity": f"{node.name}:gpu",
                             "weight": 4}
        path = targets[f"{nodes[7].name}:gpu"]["metrics_path"]
        with urllib.request.urlopen(f"http://127.0.0.1:{app.http.port}{path}", timeout=5) as response:
            assert nodes[7].name in response.read().decode()
    finally:
        app.stop()
    assert controller.targets == {}
    methods = [method for method, _ in controller.requests]
    if batch:  # one POST per pass (30 < BATCH_CHUNK) and one for the deregistration; never a PUT
        assert "PUT" not in methods and "DELETE" not in methods and methods.count("POST") >= 2
        assert not [r for r in caplog.records if "no batch registry route" in r.getMessage()]
    else:  # asked once, then one PUT (and one DELETE) per target, said once in the log
        assert methods.count("POST") == 1 and methods.count("PUT") >= 30 and methods.count("DELETE") == 30
        assert len([r for r in caplog.records if "no batch registry route" in r.getMessage()]) == 1


def test_batch_refusal_names_the_entry(controller: RegistryServer, client: httpx.Client) -> None:
    registry = ControllerRegistry(client, token=TOKEN)
    good, bad = _entry(port=9400), _entry(port=9401, labels={"__bad": "x"})
    with pytest.raises(RegistryRefused, match="answered 422") as refused:
        registry.register_many([good, bad])
    assert "\"index\":1" in str(refused.value).replace(" ", "") and "labels" in str(refused.value)
    assert controller.targets == {}  # nothing of a refused batch is applied
    assert registry.register_many([good, _entry(port=9402)]) and len(controller.targets) == 2
    assert registry.deregister_many([good.identity, "10.9.9.9:1"]) and len(controller.targets) == 1


# -- flags -------------------------------------------------------------------------------

def _exit_2(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(logs, "configure", lambda **_: None)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


SIM = ["--backend", "simulated", "--gpus", "1", "--listen", "127.0.0.1:0", "--region", "eu-1"]


@pytest.mark.parametrize(("argv", "expect"), [
    (["--consul", "127.0.0.1:8500", "--register-url", "http://gpufed:8080", *SIM],
     "--consul and --register-url are mutually exclusive"),
    (["fleet", "--nodes", "2", "--consul", "127.0.0.1:8500", "--register-url", "http://gpufed:8080"],
     "--consul and --register-url are mutually exclusive"),
    (["--register-url", "gpufed:8080", *SIM], "--register-url: expected the controller's base URL"),
    (["--register-url", "http://gpufed:8080", "--backend", "simulated", "--listen", "127.0.0.1:0"],
     "--register-url needs --region"),
    (["--register-url", "http://gpufed:8080", "--node-exporter-port", "0", *SIM], "--node-exporter-port"),
    (["--register-url", "http://gpufed:8080", "--register-job", "", *SIM], "--register-job"),
])
def test_bad_register_flags_exit_2(argv, expect, capsys, monkeypatch) -> None:
    assert expect in _exit_2(argv, capsys, monkeypatch)


def test_consul_from_the_environment_conflicts_too(capsys, monkeypatch) -> None:
    monkeypatch.setenv("GPUFED_EXPORTER_CONSUL", "127.0.0.1:8500")
    monkeypatch.setenv("GPUFED_TOKEN", "do-not-print")
    line = _exit_2(["--register-url", "http://gpufed:8080", *SIM], capsys, monkeypatch)
    assert "mutually exclusive" in line and "do-not-print" not in line


def test_token_sources(monkeypatch) -> None:
    monkeypatch.setenv("GPUFED_TOKEN", "shared")
    assert ExporterSettings().register_token.get_secret_value() == "shared"  # type: ignore[union-attr]
    monkeypatch.setenv("GPUFED_EXPORTER_REGISTER_TOKEN", "exporter")
    assert ExporterSettings().register_token.get_secret_value() == "exporter"  # type: ignore[union-attr]
    flag = ExporterSettings(register_token="flag").register_token
    assert flag is not None and flag.get_secret_value() == "flag" and "flag" not in repr(flag)


@pytest.mark.parametrize(("env", "expect"), [
    ({"GPUFED_EXPORTER_CONSUL": "", "GPUFED_EXPORTER_REGISTER_URL": "http://gpufed:8080"},
     (None, "http://gpufed:8080")),
    ({"GPUFED_EXPORTER_CONSUL": "127.0.0.1:8500", "GPUFED_EXPORTER_REGISTER_URL": ""},
     ("127.0.0.1:8500", None)),
    ({"GPUFED_EXPORTER_CONSUL": "", "GPUFED_EXPORTER_REGISTER_URL": ""}, (None, None)),
])
def test_empty_registry_variables_count_as_unset(env, expect, monkeypatch) -> None:
    # compose/node.yml passes both through from the env file; the one left empty is unused.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = ExporterSettings()
    assert (settings.consul, settings.register_url) == expect


def test_both_registries_given_still_conflict(monkeypatch) -> None:
    monkeypatch.setenv("GPUFED_EXPORTER_CONSUL", "127.0.0.1:8500")
    monkeypatch.setenv("GPUFED_EXPORTER_REGISTER_URL", "http://gpufed:8080")
    with pytest.raises(ValueError, match="mutually exclusive"):
        ExporterSettings()
