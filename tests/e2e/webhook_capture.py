"""A loopback HTTP server that records Alertmanager webhook notifications, for e2e tests.

Alertmanager posts its webhook payload (``{"status", "groupLabels", "alerts", ...}``) as
JSON; every POST body is kept in arrival order. Runs in a daemon thread; use as a
context manager so the socket is always closed.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookCapture:
    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.notifications)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with capture._lock:
                    capture.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                del format, args  # keep test output quiet

        return Handler

    def __enter__(self) -> WebhookCapture:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
