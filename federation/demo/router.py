"""Reach a child Prometheus by name: ``http://127.0.0.1:<router>/<child>/...`` -> its port.

In production the controller finds children by name (``--child-url-template
http://{child}:9090``). On one machine every child has its own free port, and a child
for a shard added while the demo runs gets one only then, after ``gpufed serve`` has
started; the children known at start get their ``--child-url`` directly, the later ones
are reached through this router (``--child-url-template http://127.0.0.1:<router>/{child}``),
which stands in for the DNS name. Unknown or stopped children answer 502, which the
controller treats as "cannot tell" (a hand-over then ends by its window).

With ``gpufed demo --tls`` the router serves https with the children's web config (client
certificates required) and calls each child with the demo's client certificate.
"""

from __future__ import annotations

import contextlib
import http.client
import ssl
import threading

from federation.localrun.loopback import LoopbackHandler, LoopbackHTTPServer


class ChildRouter:
    def __init__(self, *, port: int = 0, timeout: float = 5.0, server_tls: ssl.SSLContext | None = None,
                 client_tls: ssl.SSLContext | None = None) -> None:
        self.timeout = timeout
        """Seconds a child may take to answer before the router says 502."""
        self.client_tls = client_tls
        """How the router calls the children (None: plain HTTP)."""
        self._ports: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server = LoopbackHTTPServer(_handler(self), port=port, name="router", ssl_context=server_tls)

    @property
    def port(self) -> int:
        return self._server.port

    def template(self) -> str:
        return f"{self._server.scheme}://127.0.0.1:{self.port}/{{child}}"

    def connect(self, port: int) -> http.client.HTTPConnection:
        if self.client_tls is not None:
            return http.client.HTTPSConnection("127.0.0.1", port, timeout=self.timeout,
                                               context=self.client_tls)
        return http.client.HTTPConnection("127.0.0.1", port, timeout=self.timeout)

    def set(self, child: str, port: int) -> None:
        with self._lock:
            self._ports[child] = port

    def remove(self, child: str) -> None:
        with self._lock:
            self._ports.pop(child, None)

    def lookup(self, child: str) -> int | None:
        with self._lock:
            return self._ports.get(child)

    def __enter__(self) -> ChildRouter:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


def _handler(router: ChildRouter) -> type[LoopbackHandler]:
    class Handler(LoopbackHandler):
        def do_GET(self) -> None:
            self._forward("GET")

        def do_POST(self) -> None:
            self._forward("POST")

        def _forward(self, method: str) -> None:
            child, _, rest = self.path.lstrip("/").partition("/")
            port = router.lookup(child)
            if port is None:
                self._fail(f"no child {child!r} runs here")
                return
            body = self.body()
            conn = router.connect(port)
            try:
                conn.request(method, "/" + rest, body=body or None)
                answer = conn.getresponse()
                payload = answer.read()
            except OSError as exc:
                self._fail(f"child {child!r} on port {port}: {exc}")
                return
            finally:
                conn.close()
            self._answer(answer.status, payload, answer.getheader("Content-Type"))

        def _fail(self, why: str) -> None:
            self._answer(502, why, "text/plain")

        def _answer(self, status: int, body: bytes | str, content_type: str | None) -> None:
            # A hung child outlasts the scraper's timeout: the scraper has hung up by the time
            # the answer (often the 502) is ready, and nobody is left to read it.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.reply(status, body, content_type=content_type)

    return Handler
