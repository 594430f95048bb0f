"""``gpufed serve`` for real: child Prometheus servers follow its HTTP SD; hand-overs overlap;
a restart (also after ``kill -9`` mid-rebalance) keeps the assignment.

The fleet is the simulated exporter in fleet mode (one port, a path per node); its nodes
register through the controller's built-in registry (PUT /v1/registry/targets/...), and
the children run the ``prometheus.yml`` the controller publishes (GET /v1/configs/...).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import require_tool, wait_for

from exporter.fleet import FleetApp, fleet_nodes
from exporter.settings import ExporterSettings
from federation.localrun.loopback import free_port
from tests.controller.harness import TOKEN
from tests.controller.serve_process import ServeProcess
from tests.e2e.prom_process import PrometheusProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def spec(path: Path, *, port: int, shards: int = 1) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "cluster": "e2e",
                "regions": [{"name": "region-0", "shards": shards}],
                "jobs": [{"name": "gpu", "scrape_interval": "1s", "scrape_timeout": "1s"}],
                "children": {
                    "target_discovery": "http_sd",
                    "http_sd_url": f"http://127.0.0.1:{port}",
                    "http_sd_refresh_interval": "1s",
                    "scrape_interval": "1s",
                },
            }
        )
    )
    return path


def entry(fleet: FleetApp, name: str) -> dict[str, Any]:
    node = fleet.nodes[name]
    return {
        "address": "127.0.0.1",
        "port": fleet.http.port,
        "job": "gpu",
        "node": name,
        "region": node.region,
        "gpus": 2,
        "metrics_path": f"/nodes/{name}/metrics",
        "identity": f"{name}:gpu",
    }


@pytest.fixture
def fleet() -> Iterator[FleetApp]:
    settings = ExporterSettings(backend="simulated", gpus=2, listen="127.0.0.1:0", collect_interval=0.5)
    app = FleetApp(settings, fleet_nodes(8, regions=1))
    app.start()
    yield app
    app.stop()


def register(serve: ServeProcess, fleet: FleetApp, names: list[str]) -> None:
    for name in names:
        response = serve.client.put(
            f"/v1/registry/targets/{name}:gpu", json=entry(fleet, name), headers=serve.auth()
        )
        assert response.status_code in (200, 201), response.text


def start_child(serve: ServeProcess, child: str, root: Path, client: httpx.Client) -> PrometheusProcess:
    config = root / f"{child}.yml"
    published = wait_for(lambda: _config(serve, child), timeout=30, what=f"{child}'s published config")
    config.write_bytes(published)
    return PrometheusProcess(
        require_tool("prometheus"),
        config=config,
        data=root / f"data-{child}",
        log=root / f"{child}.log",
        client=client,
    ).start()


def _config(serve: ServeProcess, child: str) -> bytes | None:
    response = serve.client.get(f"/v1/configs/children/{child}/prometheus.yml")
    return response.content if response.status_code == 200 else None


def up_nodes(child: PrometheusProcess) -> dict[str, float]:
    """node -> last scrape (unix) of the child's healthy targets."""
    from federation.controller.live.probe import parse_time

    body = child.client.get(f"{child.url}/api/v1/targets", params={"state": "active"}).json()
    return {
        t["labels"]["node"]: parse_time(t["lastScrape"])
        for t in body["data"]["activeTargets"]
        if t["health"] == "up"
    }


def test_children_follow_http_sd_and_handovers_overlap(tmp_path: Path, fleet: FleetApp) -> None:
    names = sorted(fleet.nodes)
    port = free_port()
    child_urls: list[str] = []
    children: dict[str, PrometheusProcess] = {}
    with httpx.Client(timeout=5) as client:
        for child in ("region-0-0", "region-0-1"):
            children[child] = PrometheusProcess(
                require_tool("prometheus"),
                config=tmp_path / f"{child}.yml",
                data=tmp_path / f"data-{child}",
                log=tmp_path / f"{child}.log",
                client=client,
            )
            child_urls += ["--child-url", f"{child}={children[child].url}"]
        serve = ServeProcess(
            spec=spec(tmp_path / "spec.yaml", port=port),
            data_dir=tmp_path / "data",
            log=tmp_path / "serve.log",
            port=port,
            extra=tuple(child_urls),
        )
        with serve:
            register(serve, fleet, names[:6])
            wait_for(lambda: serve.client.get("/readyz").status_code == 200 or None, timeout=30, what="ready")
            first = children["region-0-0"]
            first.config.write_bytes(
                wait_for(lambda: _config(serve, "region-0-0"), timeout=30, what="config")
            )
            first.start().wait_ready()
            try:
                wait_for(lambda: set(up_nodes(first)) == set(names[:6]) or None, timeout=60, what="6 up")
                register(serve, fleet, names[6:7])  # an added target reaches the child by itself
                wait_for(lambda: set(up_nodes(first)) == set(names[:7]) or None, timeout=60, what="7 up")

                result = serve.rebalance({"add_shard": ["region-0"]})
                moved = {m["identity"].removesuffix(":gpu") for m in result["moves"]}
                assert moved and all(m["to_shard"] == "region-0-1" for m in result["moves"])
                second = children["region-0-1"]
                second.config.write_bytes(
                    wait_for(lambda: _config(serve, "region-0-1"), timeout=30, what="new child's config")
                )
                new_up: dict[str, float] = {}
                old_gone: dict[str, float] = {}
                second.start().wait_ready()
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline and len(old_gone) < len(moved):
                    now = time.time()
                    for node in moved & set(up_nodes(second)):
                        new_up.setdefault(node, now)
                    still = set(up_nodes(first))
                    for node in moved - still:
                        old_gone.setdefault(node, now)
                    time.sleep(0.1)
                assert set(old_gone) == moved, "the old child never let go"
                for node in moved:  # make-before-break: the new child had it before the old one let go
                    assert node in new_up and new_up[node] <= old_gone[node], (
                        node,
                        new_up,
                        old_gone,
                        serve.client.get("/metrics").text.split("handovers_total")[1:],
                    )
                assert set(up_nodes(second)) == moved
                assert set(up_nodes(first)) == set(names[:7]) - moved
                metrics = serve.client.get("/metrics").text
                assert TOKEN not in serve.log_path.read_text()  # debug logs included
                lines = [line for line in metrics.splitlines() if "handovers_total{" in line]
                assert any('result="scraped"' in line for line in lines), lines
            finally:
                for child in children.values():
                    if child.proc is not None:
                        child.stop()


def test_restart_keeps_the_assignment_even_after_kill_9_mid_rebalance(
    tmp_path: Path, fleet: FleetApp
) -> None:
    names = sorted(fleet.nodes)
    port = free_port()
    spec_path = spec(tmp_path / "spec.yaml", port=port, shards=2)
    serve = ServeProcess(spec=spec_path, data_dir=tmp_path / "data", log=tmp_path / "serve.log", port=port)
    with serve:
        register(serve, fleet, names)
        wait_for(lambda: len(serve.placement()) == len(names) or None, timeout=30, what="all placed")
        before = serve.placement()
        serve.kill9()
    with serve:  # a restart moves nothing
        register(serve, fleet, names)
        time.sleep(2.0)  # let a debounced re-assignment (if any) happen
        assert serve.placement() == before
        stop = threading.Event()
        errors: list[str] = []

        def churn() -> None:
            rng = random.Random(1)
            while not stop.is_set():
                try:
                    serve.rebalance({"shard_counts": {"region-0": rng.choice((1, 2, 3, 4))}})
                except (httpx.HTTPError, AssertionError) as exc:
                    errors.append(str(exc))
                    return

        worker = threading.Thread(target=churn)
        worker.start()
        time.sleep(1.5)
        serve.kill9()  # somewhere inside a rebalance
        stop.set()
        worker.join(timeout=10)
    from federation.controller.stores.sqlite_store import SqliteStore

    store = SqliteStore(tmp_path / "data" / "state.db")
    state = store.load()
    assert state is not None and state.assignment is not None
    shards = [s for s, i in state.assignment.shards.items() if i.region == "region-0"]
    assert len(shards) == state.desired.shard_counts["region-0"]  # desired and applied agree: no mix
    audit = store.audit_log(limit=1000)
    assert sum(1 for e in audit if e.action == "rebalance") == state.desired_revision
    store.close()
    with serve:
        register(serve, fleet, names)
        time.sleep(2.0)
        after = serve.placement()
        assert set(after) == {f"{n}:gpu" for n in names}
        assert {after[i] for i in after} <= set(shards)
