"""A controller built in-process with a hand-driven loop (no threads, no sleeps).

``ControllerHarness.feed`` pushes a source's full set and ticks the reconcile loop at
once (debounce 0), so a test sees the new assignment right after the call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from federation.controller.base.options import ControllerOptions
from federation.controller.controller import Controller
from federation.controller.http.service import ServeSettings, Service, build_service
from federation.master import pipeline
from federation.spec import GpufedSpec, load_gpufed_spec
from sharder.model.inventory import Target

TOKEN = "t0k3n-for-tests-0123456789abcdef"
READ_TOKEN = "read-only-token-0123456789abcdef"


def spec_document(
    *,
    regions: dict[str, int] | None = None,
    replication_factor: int = 1,
    url: str = "http://127.0.0.1:8080",
    interval: str = "15s",
    refresh: str = "5s",
) -> dict[str, Any]:
    return {
        "cluster": "test",
        "regions": [
            {"name": name, "shards": count} for name, count in (regions or {"r1": 2, "r2": 1}).items()
        ],
        "sharding": {"replication_factor": replication_factor},
        "jobs": [{"name": "gpu", "scrape_interval": interval}, {"name": "node", "scrape_interval": interval}],
        "children": {"target_discovery": "http_sd", "http_sd_url": url, "http_sd_refresh_interval": refresh},
    }


def write_spec(path: Path, **kwargs: Any) -> GpufedSpec:
    path.write_text(yaml.safe_dump(spec_document(**kwargs)))
    return load_gpufed_spec(path)


def fleet(count: int, *, region: str = "r1", start: int = 1, gpus: int = 8, job: str = "gpu") -> list[Target]:
    port = 9400 if job == "gpu" else 9100
    return [
        Target(
            address=f"10.{(start + i) // 62500}.{(start + i) // 250 % 250}.{(start + i) % 250 + 1}",
            port=port,
            job=job,
            node=f"{region}-n{start + i:04d}",
            region=region,
            gpus=gpus,
            weight=gpus if job == "gpu" else 1,
        )
        for i in range(count)
    ]


@dataclass
class ControllerHarness:
    service: Service
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def controller(self) -> Controller:
        return self.service.controller

    def feed(self, targets: list[Target], *, source: str = "file") -> None:
        self.controller.reconciler.on_change(source, targets)
        self.tick()

    def tick(self) -> None:
        with self.controller._lock:
            self.controller.tick(idle=False)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.service.app), base_url="http://ctl")

    def auth(self, token: str = TOKEN) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


def build(
    tmp_path: Path,
    *,
    spec: GpufedSpec | None = None,
    options: ControllerOptions | None = None,
    tokens_file: Path | None = None,
    env: dict[str, str] | None = None,
    dev: bool = False,
) -> ControllerHarness:
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = spec or write_spec(tmp_path / "spec.yaml")
    settings = ServeSettings(
        spec=spec,
        data_dir=tmp_path / "data",
        tokens_file=tokens_file,
        dev=dev,
        check_configs=False,
        options=options or ControllerOptions(debounce_s=0.0, grace_s=0.0),
        env={"GPUFED_TOKEN": TOKEN} if env is None else env,
    )
    service = build_service(settings)
    service.controller.restore()
    return ControllerHarness(service=service)


def on_disk(root: Path) -> dict[str, bytes]:
    """Every file under ``root``: relative path -> bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def full_render(harness: ControllerHarness) -> dict[str, bytes]:
    """The bundle ``gpufed render`` writes for the controller's assignment, whole."""
    controller = harness.controller
    assert controller.state.assignment is not None
    targets = list(controller.reconciler.target_map.values())
    return pipeline.build_bundle(controller.spec, targets, controller.state.assignment)
