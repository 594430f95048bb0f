"""A real controller on loopback for browser tests, with fake children it can probe.

``build_service`` wires the controller as ``gpufed serve`` does; uvicorn serves its app
from a thread on a socket bound before the thread starts (no port race). The children
are one small HTTP server answering Prometheus' ``/api/v1/targets`` for every child from
the controller's own HTTP SD, so shard health, target health and hand-over proof run
through the real probe code. A child named in ``starting`` answers 503 (a child still
coming up), which keeps hand-overs towards it in flight until the test lets it start.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from conftest import wait_for

from federation.controller.base.options import ControllerOptions
from federation.controller.http.service import ServeSettings, Service, build_service
from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer, listening_socket
from federation.spec import GpufedSpec
from federation.testing.harnesses.app_server import AppServer


@dataclass
class FakeChildren:
    """Every child's ``/child/<name>/api/v1/targets``, built from the controller's HTTP SD."""

    controller_url: str = ""
    jobs: tuple[str, ...] = ()
    down: set[str] = field(default_factory=set)
    """Instances every child reports as ``down``."""
    starting: set[str] = field(default_factory=set)
    """Children that answer 503, as one whose Prometheus is not up yet."""

    def answer(self, child: str) -> tuple[int, dict[str, Any]]:
        if child in self.starting:
            return 503, {"status": "error", "error": "starting"}
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        active = []
        with httpx.Client(base_url=self.controller_url, timeout=5) as http:
            for job in self.jobs:
                response = http.get(f"/v1/sd/{child}/{job}")
                if response.status_code != 200:
                    continue
                for group in response.json():
                    for instance in group["targets"]:
                        labels = {**group["labels"], "job": job, "instance": instance}
                        health = "down" if instance in self.down else "up"
                        active.append({"labels": labels, "health": health, "lastScrape": now})
        return 200, {"status": "success", "data": {"activeTargets": active}}


@contextmanager
def fake_children(children: FakeChildren) -> Iterator[str]:
    """Serve ``children`` on loopback; yields the ``--child-url-template`` to use."""

    class Handler(LoopbackHandler):
        def do_GET(self) -> None:
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            if len(parts) == 5 and parts[0] == "child" and parts[2:] == ["api", "v1", "targets"]:
                status, body = children.answer(parts[1])
            else:
                status, body = 404, {"status": "error", "error": "not found"}
            self.reply(status, body, content_type="application/json")

    with LoopbackHTTPServer(Handler, name="fake-children") as server:
        yield f"{server.url}/child/{{child}}"


@dataclass
class LiveController:
    url: str
    service: Service
    children: FakeChildren
    token: str

    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(f"{self.url}{path}", params=params, timeout=10)
        response.raise_for_status()
        return response.json()


@contextmanager
def live_controller(
    *, spec: GpufedSpec, inventory: Path, data_dir: Path, token: str, down: set[str] | None = None
) -> Iterator[LiveController]:
    """A started controller behind uvicorn on a free loopback port, ready (``/readyz`` 200)."""
    sock = listening_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    children = FakeChildren(controller_url=url, jobs=tuple(j.name for j in spec.jobs), down=set(down or ()))
    with fake_children(children) as template:
        options = ControllerOptions(
            debounce_s=0.2,
            health_interval_s=1.0,
            settle_interval_s=0.5,
            child_url_template=template,
        )
        service = build_service(
            ServeSettings(
                spec=spec,
                data_dir=data_dir,
                inventory=inventory,
                check_configs=False,
                options=options,
                env={"GPUFED_TOKEN": token},
            )
        )
        service.start()
        server = AppServer(service.app, sock=sock, name="uvicorn", lifespan="off", ws="none",
                           access_log=False)
        server.start()
        try:
            wait_for(
                lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 200,
                timeout=60,
                what="the controller's /readyz",
            )
            yield LiveController(url=url, service=service, children=children, token=token)
        finally:
            server.stop()
            service.stop()
