"""Wiring for ``gpufed serve``: settings in, a running controller and its ASGI app out.

Kept apart from the CLI so tests (and ``gpufed demo``) build the same service in-process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from alertmanager.amtool import Amtool
from federation.controller import api
from federation.controller.auth import Authenticator, load_tokens
from federation.controller.core import Controller, ControllerOptions
from federation.controller.load import LoadOptions, LoadTracker
from federation.controller.load_reader import PrometheusLoadReader
from federation.controller.load_weights import LoadReader
from federation.controller.metrics import ControllerMetrics
from federation.controller.probe import ChildProbe
from federation.controller.publisher import Publisher
from federation.controller.sqlite_store import SqliteStore
from federation.controller.store import StateStore
from federation.spec import GpufedSpec
from federation.watching import WatchOptions, build_sources
from sharder.promtool import Promtool
from sharder.sources.consul import ConsulConfig
from sharder.sources.kubernetes import KubernetesConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeSettings:
    spec: GpufedSpec
    data_dir: Path
    inventory: Path | None = None
    consul: ConsulConfig | None = None
    kubernetes: KubernetesConfig | None = None
    tokens_file: Path | None = None
    dev: bool = False
    check_configs: bool = True
    options: ControllerOptions = field(default_factory=ControllerOptions)
    load: LoadOptions | None = None
    """Measured load (``--load-url``); None: read it only from full-Prometheus children, if any are known."""
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass
class Service:
    controller: Controller
    app: FastAPI
    auth: Authenticator
    store: StateStore
    http: httpx.Client
    sources: list[Any]

    def start(self) -> None:
        self.controller.restore()
        self.controller.start(self.sources)

    def stop(self) -> None:
        self.controller.stop()
        self.http.close()
        self.store.close()


def build_service(
    settings: ServeSettings, *, store: StateStore | None = None, load_reader: LoadReader | None = None
) -> Service:
    """Raises ``TokenError`` for missing/placeholder tokens (unless ``dev``) and store errors."""
    tokens = load_tokens(settings.tokens_file, env=settings.env)
    if not tokens and not settings.dev:
        from federation.controller.auth import TokenError

        raise TokenError(
            "no write token: set GPUFED_TOKEN or pass --tokens FILE (or --dev for a local trial)"
        )
    auth = Authenticator(tokens, dev=settings.dev)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.data_dir, 0o700)
    store = store or SqliteStore(settings.data_dir / "state.db")
    metrics = ControllerMetrics(registry=CollectorRegistry())
    http = httpx.Client(timeout=httpx.Timeout(2.0))
    publisher = Publisher(
        out=settings.data_dir / "rendered",
        checker=Promtool() if settings.check_configs else None,
        alert_checker=Amtool() if settings.check_configs else None,
        agent=settings.spec.children.agent_mode,
        on_result=lambda result: metrics.config_checks.labels(result=result).inc(),
    )
    controller = Controller(
        spec=settings.spec,
        store=store,
        metrics=metrics,
        options=settings.options,
        probe=ChildProbe(http),
        publisher=publisher,
        load=_load_tracker(
            settings, load_reader or PrometheusLoadReader(http, jobs=[job.name for job in settings.spec.jobs])
        ),
    )
    watch = WatchOptions(consul=settings.consul, kubernetes=settings.kubernetes, file=settings.inventory)
    sources = build_sources(watch, sink=controller.reconciler, spec=settings.spec)
    app = api.create_app(controller, auth=auth)
    return Service(controller=controller, app=app, auth=auth, store=store, http=http, sources=sources)


def _load_tracker(settings: ServeSettings, reader: LoadReader) -> LoadTracker | None:
    """Read load from ``--load-url``; else from the children, when they are full Prometheus servers
    the controller can reach (agents have no query API)."""
    options = settings.load or LoadOptions()
    children_readable = not settings.spec.children.agent_mode and bool(
        settings.options.child_urls or settings.options.child_url_template
    )
    if not options.urls and not children_readable:
        if options.auto_rebalance_imbalance is not None:
            log.warning("auto rebalancing is off: no --load-url and no full-Prometheus children to read")
        return None
    return LoadTracker(reader=reader, options=options)
