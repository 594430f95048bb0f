"""Load-aware weights through the controller and its API, in-process (scripted load readings).

The reader is the one seam replaced: a scripted ``LoadReader`` says what the children
scraped. Everything else (plan, apply, shedding, the store, the routes) is the real
service, driven by hand (debounce 0, no threads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
import yaml
from typer.testing import CliRunner

from federation.commands import serve
from federation.controller.base.options import ControllerOptions
from federation.controller.http.service import ServeSettings, Service, build_service
from federation.controller.load.tracking import LoadOptions
from federation.controller.load.weighing import Observation, TargetKey, max_over_mean
from federation.spec import load_gpufed_spec
from sharder.model.inventory import Target

TOKEN = "k7q2w9x4m1v8z3c6b5n0p7r2"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PER_GPU, INTERVAL = 21.0, 15.0


class Api:
    """Sync calls into the ASGI app (one event loop per call; the routes are plain functions)."""

    def __init__(self, service: Service) -> None:
        self.app = service.app

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://ctl") as client:
                return await client.request(method, path, **kwargs)

        return asyncio.run(call())

    def get(self, path: str) -> httpx.Response:
        return self.request("GET", path)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)


class ScriptedReader:
    """Answers what ``observations`` holds; None (no answer) while it is None."""

    def __init__(self) -> None:
        self.observations: dict[TargetKey, Observation] | None = None
        self.urls: list[list[str]] = []

    def read(self, urls: Sequence[str]) -> dict[TargetKey, Observation] | None:
        self.urls.append(list(urls))
        return self.observations


def write_spec(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "cluster": "test",
                "regions": [{"name": "r1", "shards": 4}],
                "jobs": [{"name": "gpu", "scrape_interval": "15s"}],
                "children": {"target_discovery": "http_sd", "http_sd_url": "http://127.0.0.1:8080"},
            }
        )
    )
    return path


def fleet(count: int = 40) -> list[Target]:
    return [
        Target(
            address=f"10.0.0.{i + 1}", port=9400, job="gpu", node=f"n{i:02d}", region="r1", gpus=2, weight=2
        )
        for i in range(count)
    ]


def build(tmp_path: Path, *, load: LoadOptions | None, reader: ScriptedReader | None = None) -> Service:
    settings = ServeSettings(
        spec=load_gpufed_spec(write_spec(tmp_path / "spec.yaml")),
        data_dir=tmp_path / "data",
        check_configs=False,
        options=ControllerOptions(debounce_s=0.0, grace_s=0.0),
        env={"GPUFED_TOKEN": TOKEN},
        load=load,
    )
    service = build_service(settings, load_reader=reader)
    service.controller.restore()
    controller = service.controller
    controller.reconciler.on_change("file", fleet())
    with controller._lock:
        controller.tick(idle=False)
    assert controller.ready
    return service


def scrape_everything(reader: ScriptedReader, *, heavy: dict[str, float]) -> None:
    """Every target yields 21 samples per GPU (2 GPUs), except ``heavy`` node -> factor."""
    reader.observations = {
        ("gpu", t.instance, t.node): Observation(
            samples=2 * PER_GPU * heavy.get(t.node, 1.0), duration_s=0.01
        )
        for t in fleet()
    }


def samples_ratio(service: Service, reader: ScriptedReader) -> float:
    """Samples/s max/mean over the shards of the assignment in force, from the scripted truth."""
    assert reader.observations is not None
    assignment = service.controller.state.assignment
    assert assignment is not None
    totals = dict.fromkeys(assignment.shards, 0.0)
    for target in fleet():
        obs = reader.observations[("gpu", target.instance, target.node)]
        totals[assignment.targets[target.identity]] += obs.samples / INTERVAL
    return max_over_mean(totals.values())


@pytest.fixture
def loaded(tmp_path: Path) -> Iterator[tuple[Service, ScriptedReader]]:
    reader = ScriptedReader()
    service = build(tmp_path, load=LoadOptions(urls=("http://master:9090",)), reader=reader)
    yield service, reader
    service.stop()


def test_without_a_load_source_load_routes_say_how_to_get_one(tmp_path: Path) -> None:
    service = build(tmp_path, load=None)
    client = Api(service)
    answer = client.get("/v1/load")
    assert answer.status_code == 404 and "--load-url" in answer.json()["detail"]
    plan = client.post("/v1/plan", json={"use_observed_weights": True}, headers=AUTH)
    assert plan.status_code == 422 and plan.json()["field"] == "use_observed_weights"
    assert all("samples_per_s" not in row for row in client.get("/v1/shards").json()["shards"])
    service.stop()


def test_before_the_first_reading_a_load_aware_plan_is_refused(
    loaded: tuple[Service, ScriptedReader],
) -> None:
    service, reader = loaded
    assert service.controller.observe_load() is False  # the master did not answer
    plan = Api(service).post("/v1/plan", json={"use_observed_weights": True}, headers=AUTH)
    assert plan.status_code == 422
    assert "no load observed yet" in plan.json()["detail"]
    assert reader.urls == [["http://master:9090"]]


def test_load_shows_samples_per_shard_next_to_the_gpu_load(loaded: tuple[Service, ScriptedReader]) -> None:
    service, reader = loaded
    scrape_everything(reader, heavy={"n07": 10.0})
    assert service.controller.observe_load()
    client = Api(service)
    body = client.get("/v1/load").json()
    assert body["observed_targets"] == body["targets"] == 40
    assert body["unit_samples_per_s"] == pytest.approx(PER_GPU / INTERVAL)
    assert body["suggested_weights"] == {"10.0.0.8:9400": 20}
    shards = {row["shard"]: row for row in body["shards"]}
    assert sum(row["load"] for row in shards.values()) == 80
    assert sum(row["samples_per_s"] for row in shards.values()) == pytest.approx(
        (39 + 10) * 2 * PER_GPU / 15, 0.01
    )
    heavy_shard = service.controller.state.assignment.targets["10.0.0.8:9400"]  # type: ignore[union-attr]
    assert shards[heavy_shard]["suggested_load"] == shards[heavy_shard]["load"] + 18
    (region,) = body["regions"]
    assert region["samples_per_s_max_over_mean"] == pytest.approx(samples_ratio(service, reader), abs=0.001)
    assert region["samples_per_s_max_over_mean"] > region["load_max_over_mean"]
    rows = {row["shard"]: row for row in client.get("/v1/shards").json()["shards"]}
    assert {s: r["samples_per_s"] for s, r in rows.items()} == {
        s: r["samples_per_s"] for s, r in shards.items()
    }


def test_an_applied_load_aware_plan_lowers_samples_max_over_mean(
    loaded: tuple[Service, ScriptedReader],
) -> None:
    service, reader = loaded
    scrape_everything(reader, heavy={"n07": 10.0})
    service.controller.observe_load()
    before = samples_ratio(service, reader)
    client = Api(service)
    plan = client.post(
        "/v1/plan", json={"use_observed_weights": True, "reason": "PO#6051"}, headers=AUTH
    ).json()
    assert plan["change"]["weights"] == {"10.0.0.8:9400": 20}
    assert plan["counts"]["moved"] > 0
    applied = client.post("/v1/rebalance", json={"version": plan["version"]}, headers=AUTH).json()
    assert applied["applied"] and applied["counts"]["moved"] == plan["counts"]["moved"]
    assert service.controller.state.desired.weights == {"10.0.0.8:9400": 20}
    after = samples_ratio(service, reader)
    assert after < before
    again = client.post("/v1/plan", json={"use_observed_weights": True}, headers=AUTH).json()
    assert again["counts"]["moved"] == 0 and "weights" not in again["change"]


def test_explicit_weights_in_the_same_request_win(loaded: tuple[Service, ScriptedReader]) -> None:
    service, reader = loaded
    scrape_everything(reader, heavy={"n07": 10.0})
    service.controller.observe_load()
    body = {"use_observed_weights": True, "weights": {"10.0.0.8:9400": 6}}
    plan = Api(service).post("/v1/plan", json=body, headers=AUTH).json()
    assert plan["change"]["weights"] == {"10.0.0.8:9400": 6}


def test_auto_rebalance_applies_only_above_the_threshold_and_once_per_cooldown(tmp_path: Path) -> None:
    reader = ScriptedReader()
    options = LoadOptions(urls=("http://master:9090",), auto_rebalance_imbalance=1.3)
    service = build(tmp_path, load=options, reader=reader)
    controller = service.controller
    scrape_everything(reader, heavy={})
    controller.observe_load()
    assert controller.auto_rebalance() is None  # even: nothing to do
    scrape_everything(reader, heavy={"n07": 10.0})
    controller.load.smoother.retain(set())  # type: ignore[union-attr]  # forget the even reading
    controller.observe_load()
    before = samples_ratio(service, reader)
    assert before > 1.3
    result = controller.auto_rebalance()
    assert result is not None and result.applied
    assert samples_ratio(service, reader) < before
    (entry, *_) = controller.audit(limit=1, before_id=None)
    assert entry.actor == "auto-rebalance" and "above 1.3" in entry.detail["change"]["reason"]
    scrape_everything(reader, heavy={"n07": 10.0, "n08": 10.0, "n09": 10.0})
    controller.load.smoother.retain(set())  # type: ignore[union-attr]
    controller.observe_load()
    assert controller.auto_rebalance() is None  # cooldown
    service.stop()


def test_auto_rebalance_is_off_by_default(loaded: tuple[Service, ScriptedReader]) -> None:
    service, reader = loaded
    scrape_everything(reader, heavy={"n07": 10.0})
    service.controller.observe_load()
    assert service.controller.auto_rebalance() is None
    assert service.controller.state.desired.weights == {}


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--load-url", "master:9090"], "--load-url"),
        (["--auto-rebalance-imbalance", "0.9"], "--auto-rebalance-imbalance"),
        (["--load-interval", "0"], "--load-interval"),
    ],
)
def test_serve_refuses_bad_load_flags_naming_them(tmp_path: Path, flags: list[str], named: str) -> None:
    cli = typer.Typer()
    serve.register(cli)
    cli.command("noop", hidden=True)(lambda: None)
    spec = write_spec(tmp_path / "spec.yaml")
    result = CliRunner().invoke(
        cli, ["serve", "--spec", str(spec), "--data-dir", str(tmp_path / "d"), "--dev", *flags]
    )
    assert result.exit_code == 2, result.output
    assert named in result.output
