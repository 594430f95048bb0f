"""A loopback HTTP server that records Alertmanager webhook notifications, for e2e tests.

Alertmanager posts its webhook payload (``{"status", "groupLabels", "alerts", ...}``) as
JSON; every POST body is kept in arrival order. Runs in a daemon thread; use as a
context manager so the socket is always closed.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer


class WebhookCapture:
    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = LoopbackHTTPServer(self._handler(), name="webhook-capture")

    @property
    def url(self) -> str:
        return f"{self._server.url}/hook"

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.notifications)

    def _handler(self) -> type[LoopbackHandler]:
        capture = self

        class Handler(LoopbackHandler):
            def do_POST(self) -> None:
                body = self.body()
                with capture._lock:
                    capture.notifications.append(json.loads(body))
                self.reply(200)

        return Handler

    def __enter__(self) -> WebhookCapture:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
