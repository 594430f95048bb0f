"""A small threaded HTTP server and the routes of one exporter (or one fleet of them).

Routing is a plain function `path -> Response`, so tests call it directly and the
server stays a thin edge. HTTP/1.1 keep-alive matters: Prometheus reuses connections,
and a scrape from the snapshot is well under a millisecond of work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Response = tuple[int, str, bytes]
Handler = Callable[[str], Response]
TEXT = "text/plain; charset=utf-8"
NOT_FOUND: Response = (404, TEXT, b"not found\n")


class NodeRoutes:
    """`/metrics`, `/healthz` (the process is up), `/readyz` (a recent collection worked).

    With `version` given, the exposition is rendered once per version (the collection's
    stats object, replaced on every collection) and reused, so HA Prometheus pairs and
    retries cost one render per collection; `cache = False` renders every scrape.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        ready: Callable[[], bool],
        version: Callable[[], object] | None = None,
    ) -> None:
        self._registry = registry
        self._ready = ready
        self._version = version
        self.cache = version is not None
        self._cached: tuple[object, bytes] | None = None

    def render(self) -> bytes:
        if not self.cache or self._version is None:
            return generate_latest(self._registry)
        key, cached = self._version(), self._cached
        if cached is not None and cached[0] is key:
            return cached[1]
        body = generate_latest(self._registry)
        self._cached = (key, body)
        return body

    def __call__(self, path: str) -> Response:
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self.render()
        if path == "/healthz":
            return 200, TEXT, b"ok\n"
        if path == "/readyz":
            if self._ready():
                return 200, TEXT, b"ready\n"
            return 503, TEXT, b"no successful collection recently\n"
        return NOT_FOUND


class HttpServer:
    """Serves a `Handler` on a thread; `stop()` closes the socket (no ResourceWarning)."""

    def __init__(self, handler: Handler, *, host: str = "127.0.0.1", port: int = 0) -> None:
        route = handler

        class _RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body are separate writes; with Nagle on, the client's delayed
            # ACK adds ~40 ms to every keep-alive scrape.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                try:
                    status, content_type, body = route(self.path.split("?", 1)[0])
                except Exception:
                    log.exception("handler failed path=%s", self.path)
                    status, content_type, body = 500, TEXT, b"internal error\n"
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http " + format, *args)

        class _Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = _Server((host, port), _RequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
