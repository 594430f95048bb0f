"""Issue #11's acceptance test for load-aware weights, against a real Prometheus 2.42.

A simulated fleet of 16 two-GPU nodes (one ``gpufed-exporter fleet`` app, every node
behind ``/nodes/<node>/metrics``) and one more node that says it has two GPUs but
serves 22 (about 10x the series its GPU count suggests: a node with MIG slices, or with
extra exporter families). A real Prometheus scrapes all 17 with the labels children put
on them (``job``, ``instance``, ``node``), and plays the part of the master the children
remote-write to: the controller's reader queries its API, as ``--load-url`` does.

The controller starts with GPU-count weights on 4 shards. After the load-aware plan is
applied, the heavy node's shard holds fewer other targets and the samples/s max/mean
across shards (measured by Prometheus, not assumed) is below the GPU-weighted one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml
from conftest import require_tool, wait_for
from e2e.prom_process import PrometheusProcess

from exporter.app import ExporterApp
from exporter.fleet import FleetApp, fleet_nodes
from exporter.settings import ExporterSettings
from federation.controller.base.options import ControllerOptions
from federation.controller.controller import Controller
from federation.controller.http.service import ServeSettings, Service, build_service
from federation.controller.load.tracking import LoadOptions
from federation.controller.load.weighing import max_over_mean
from federation.spec import load_gpufed_spec
from sharder.model.inventory import Target

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODES, GPUS, HEAVY_GPUS, SHARDS = 16, 2, 22, 4
HEAVY = "heavy-node"
TOKEN = "p4t8r2m6q1w9z3x7v5c0b8n2"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Stack:
    service: Service
    prometheus: PrometheusProcess
    targets: list[Target]

    @property
    def controller(self) -> Controller:
        return self.service.controller

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.service.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://ctl") as client:
                return await client.request(method, path, **kwargs)

        response = asyncio.run(go())
        assert response.status_code == 200, response.text
        return response.json()

    def samples_by_shard(self) -> dict[str, float]:
        assignment = self.controller.state.assignment
        assert assignment is not None
        rates = self.controller.load.rates()  # type: ignore[union-attr]
        totals = dict.fromkeys(assignment.shards, 0.0)
        for identity, shard in assignment.targets.items():
            totals[shard] += rates[identity]
        return totals

    def neighbours_of_heavy(self) -> int:
        assignment = self.controller.state.assignment
        assert assignment is not None
        home = assignment.targets[HEAVY]
        return sum(1 for identity, shard in assignment.targets.items() if shard == home) - 1


def prometheus_config(fleet: FleetApp, heavy: ExporterApp) -> str:
    static = [
        {
            "targets": [f"127.0.0.1:{fleet.http.port}"],
            "labels": {"node": name, "__metrics_path__": f"/nodes/{name}/metrics"},
        }
        for name in fleet.nodes
    ]
    static.append({"targets": [f"127.0.0.1:{heavy.http.port}"], "labels": {"node": HEAVY}})
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": "2s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "gpu", "static_configs": static}],
        }
    )


def inventory(fleet: FleetApp, heavy: ExporterApp) -> list[Target]:
    targets = [
        Target(
            address="127.0.0.1",
            port=fleet.http.port,
            job="gpu",
            node=name,
            region="r1",
            gpus=GPUS,
            weight=GPUS,
            metrics_path=f"/nodes/{name}/metrics",
            identity=name,
        )
        for name in fleet.nodes
    ]
    # It says two GPUs; it serves 22.
    targets.append(
        Target(
            address="127.0.0.1",
            port=heavy.http.port,
            job="gpu",
            node=HEAVY,
            region="r1",
            gpus=GPUS,
            weight=GPUS,
            identity=HEAVY,
        )
    )
    return targets


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = require_tool("prometheus")
    root = tmp_path_factory.mktemp("load")
    fleet = FleetApp(
        ExporterSettings(backend="simulated", gpus=GPUS, listen="127.0.0.1:0"), fleet_nodes(NODES, regions=1)
    )
    heavy = ExporterApp(
        ExporterSettings(backend="simulated", gpus=HEAVY_GPUS, listen="127.0.0.1:0", node_name=HEAVY)
    )
    fleet.start()
    heavy.start()
    spec_path = root / "federation.yaml"
    spec_path.write_text(
        yaml.safe_dump(
            {
                "cluster": "e2e",
                "regions": [{"name": "r1", "shards": SHARDS}],
                "jobs": [{"name": "gpu", "scrape_interval": "2s", "scrape_timeout": "1s"}],
                "children": {"target_discovery": "http_sd", "http_sd_url": "http://127.0.0.1:8080"},
            }
        )
    )
    (root / "prometheus.yml").write_text(prometheus_config(fleet, heavy))
    try:
        with (
            httpx.Client(timeout=5.0) as client,
            PrometheusProcess(
                binary,
                config=root / "prometheus.yml",
                data=root / "data",
                log=root / "prometheus.log",
                client=client,
            ) as prometheus,
        ):
            prometheus.wait_ready(timeout=60)
            settings = ServeSettings(
                spec=load_gpufed_spec(spec_path),
                data_dir=root / "controller",
                check_configs=False,
                options=ControllerOptions(debounce_s=0.0, grace_s=0.0),
                env={"GPUFED_TOKEN": TOKEN},
                load=LoadOptions(urls=(prometheus.url,)),
            )
            service = build_service(settings)
            service.controller.restore()
            targets = inventory(fleet, heavy)
            service.controller.reconciler.on_change("file", targets)
            with service.controller._lock:
                service.controller.tick(idle=False)
            try:
                yield Stack(service=service, prometheus=prometheus, targets=targets)
            finally:
                service.stop()
    finally:
        heavy.stop()
        fleet.stop()


def observe_everyone(stack: Stack) -> None:
    """Read until Prometheus has samples of all 17 targets (scrapes start over a few seconds)."""
    tracker = stack.controller.load
    assert tracker is not None

    def everyone() -> bool:
        stack.controller.observe_load()
        return len(tracker.rates()) == NODES + 1

    wait_for(everyone, timeout=90, interval=1.0, what="samples of all 17 targets in Prometheus")


def test_the_reader_gets_what_prometheus_ingested_per_target(stack: Stack) -> None:
    observe_everyone(stack)
    ingested = {
        r["metric"]["node"]: float(r["value"][1])
        for r in stack.prometheus.query("scrape_samples_post_metric_relabeling")
    }
    rates = stack.controller.load.rates()  # type: ignore[union-attr]
    for target in stack.targets:
        assert rates[target.identity] == pytest.approx(ingested[target.node] / 2.0, rel=0.1)
    normal = sorted(rates[t.identity] for t in stack.targets if t.node != HEAVY)
    assert 8 < rates[HEAVY] / normal[len(normal) // 2] < 12  # "10x what its GPU count suggests"


def test_an_applied_load_aware_plan_leaves_the_heavy_node_alone_enough(stack: Stack) -> None:
    observe_everyone(stack)
    gpu_weighted = max_over_mean(stack.samples_by_shard().values())
    neighbours = stack.neighbours_of_heavy()
    report = stack.call("GET", "/v1/load")
    assert report["regions"][0]["samples_per_s_max_over_mean"] == pytest.approx(gpu_weighted, abs=0.01)
    assert report["regions"][0]["load_max_over_mean"] < gpu_weighted
    weight = report["suggested_weights"][HEAVY]
    assert 15 <= weight <= 25

    plan = stack.call("POST", "/v1/plan", json={"use_observed_weights": True}, headers=AUTH)
    assert plan["change"]["weights"][HEAVY] == weight
    applied = stack.call("POST", "/v1/rebalance", json={"version": plan["version"]}, headers=AUTH)
    assert applied["applied"]

    load_aware = max_over_mean(stack.samples_by_shard().values())
    assert load_aware < gpu_weighted
    assert stack.neighbours_of_heavy() < neighbours
    rows = stack.call("GET", "/v1/shards")["shards"]
    assert all(row["samples_per_s"] > 0 for row in rows)
    after = stack.call("GET", "/v1/load")["regions"][0]["samples_per_s_max_over_mean"]
    assert after == pytest.approx(load_aware, abs=0.01)
