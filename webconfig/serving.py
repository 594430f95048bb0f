"""One server's view of ``--web.config.file``: the TLS context (or none) and the guard.

``load_web_config(path)`` reads, validates and builds everything at startup, so a bad file
stops the server with the field named before it listens. ``for_uvicorn`` applies it to a
``uvicorn.Config`` (the controller and the relay); the exporter's own edge takes
``Served.ssl_context`` and ``Served.guard`` directly. Each server registers
``Served.collector()`` in its metrics registry (``webconfig.metrics``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from webconfig.guard import ASGIApp, Guard, GuardMiddleware
from webconfig.metrics import WebCollector
from webconfig.model import WebConfig, load
from webconfig.tls import ReloadingContext

if TYPE_CHECKING:
    import uvicorn


@dataclass(frozen=True)
class Served:
    config: WebConfig
    tls: ReloadingContext | None
    guard: Guard

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        return self.tls.context if self.tls is not None else None

    @property
    def generation(self) -> int:
        """Grows with every refusal counted and every reload: what the collector would show changed."""
        tls = (self.tls.handshake_failures.total + self.tls.reloads) if self.tls is not None else 0
        return tls + self.guard.refused.total

    def collector(self) -> WebCollector:
        """The refusal metrics, for the server's own registry."""
        return WebCollector(self)

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """The ASGI app behind the guard, or itself when the file asks for no request checks."""
        return GuardMiddleware(app, guard=self.guard) if self.guard.active else app


def build(config: WebConfig, *, base: Path) -> Served:
    tls = ReloadingContext(config.tls_server_config, base=base) if config.tls_server_config else None
    return Served(config=config, tls=tls, guard=Guard(config))


def load_web_config(path: Path | None) -> Served:
    """``None`` (no flag): plain HTTP, no checks, as before the flag existed."""
    if path is None:
        return build(WebConfig(), base=Path.cwd())
    return build(load(path), base=path.resolve().parent)


def for_uvicorn(config: uvicorn.Config, served: Served) -> None:
    """Serve TLS from ``served``'s reloading context; call before ``Server.run``/``serve``."""
    if served.ssl_context is None:
        return
    if not config.loaded:
        config.load()
    config.ssl = served.ssl_context
