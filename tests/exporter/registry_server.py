"""gpufed's own registry for the exporter's tests: the controller that ``gpufed serve`` runs,
built by ``build_service`` and served by uvicorn on a loopback socket in a thread.

Nothing of the registry is re-implemented here, so the exporter is tested against the
routes of ``federation/controller/http/routes_registry.py`` themselves. Three switches
reach the real controller through its seams, not a copy of it:

- ``follower = True``: the controller's ``Replication`` says it may not write, as a
  follower's does; writes answer 503 naming the leader (``LEADER``);
- ``batch = False``: ``POST /v1/registry/batch`` answers 404, as a controller from before
  the batch route did (an ASGI wrapper in front of the app);
- ``requests`` records (method, raw path) of every call, in that wrapper.

``port=N`` listens on a port chosen beforehand (a controller that comes up late);
``web_config=PATH`` serves it as ``gpufed serve --web.config.file`` does (``url`` says https).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import yaml

from federation.controller.base.options import ControllerOptions
from federation.controller.ha.leader import AlwaysLeader
from federation.controller.http.service import ServeSettings, Service, build_service
from federation.localrun.waiting import wait_until
from federation.spec import load_gpufed_spec
from federation.testing.harnesses.app_server import AppServer
from sharder.sources.lastknown import target_document
from webconfig.serving import for_uvicorn, load_web_config

TOKEN = "exporter-write-token-0123456789abcdef"
READ_TOKEN = "exporter-read-token-0123456789abcdef"
LEADER = "http://gpufed-0.gpufed:8080"
REGIONS = ("eu-1", "region-0", "region-1", "region-2")
JOBS = ("gpu", "node", "dcgm")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _spec(path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "cluster": "test",
        "regions": [{"name": name, "shards": 2} for name in REGIONS],
        "jobs": [{"name": job, "scrape_interval": "15s"} for job in JOBS],
        "children": {"target_discovery": "http_sd", "http_sd_url": "http://127.0.0.1:8080"},
    }))
    return path


class _Elector(AlwaysLeader):
    """The leader until the test makes this replica a follower of ``LEADER``."""

    def __init__(self, server: RegistryServer) -> None:
        super().__init__(address=LEADER)
        self.server = server

    def is_leader(self) -> bool:
        return not self.server.follower


class RegistryServer:
    def __init__(self, tmp_path: Path, *, ttl_s: float = 90.0, port: int | None = None,
                 web_config: Path | None = None) -> None:
        tokens = tmp_path / "tokens.yaml"
        tokens.write_text(yaml.safe_dump({"tokens": [{"name": "reader", "token": READ_TOKEN}]}))
        settings = ServeSettings(
            spec=load_gpufed_spec(_spec(tmp_path / "spec.yaml")),
            data_dir=tmp_path / "data",
            tokens_file=tokens,
            check_configs=False,
            options=ControllerOptions(debounce_s=0.0, grace_s=0.0, registry_ttl_s=ttl_s),
            env={"GPUFED_TOKEN": TOKEN},
        )
        self.follower = False
        self.service: Service = build_service(settings, elector=_Elector(self))
        self.batch = True
        self.requests: list[tuple[str, str]] = []
        sock = socket.create_server(("127.0.0.1", port)) if port is not None else None
        self._server = AppServer(self._recorded, sock=sock, name="registry-server", interface="asgi3",
                                 access_log=False, lifespan="off")
        self.port, self.url = self._server.port, self._server.url
        if web_config is not None:
            for_uvicorn(self._server.server.config, load_web_config(web_config))
            self.url = self.url.replace("http://", "https://", 1)

    async def _recorded(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("raw_path", scope["path"].encode()).decode()
            self.requests.append((scope["method"], path))
            if not self.batch and scope["path"] == "/v1/registry/batch":
                await send({"type": "http.response.start", "status": 404,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": b'{"detail":"Not Found"}'})
                return
        await self.service.app(scope, receive, send)

    def __enter__(self) -> RegistryServer:
        self.service.start()
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
        self.service.stop()

    @property
    def targets(self) -> dict[str, dict[str, Any]]:
        """What the registry holds now, by identity, each as its inventory entry (what
        ``GET /v1/registry/targets`` lists; read here so that ``requests`` stays the exporter's)."""
        _, page = self.service.controller.registry.page(offset=0, limit=10**6)
        return {target.identity: target_document(target) for target, _ in page}

    def wait_expired(self, identity: str, *, timeout: float) -> float:
        """Seconds until ``identity`` leaves the registry (its lease ran out)."""
        started = time.monotonic()
        wait_until(lambda: identity not in self.targets, timeout=timeout, what=f"{identity} to expire")
        return time.monotonic() - started
