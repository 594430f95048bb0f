"""Loopback helpers, the one place gpufed keeps them: ports and small HTTP servers.

``free_port`` is for processes that take a port number on their command line (Prometheus,
Alertmanager, a child of the demo): the OS picks a free port, the socket closes and the
process binds the number soon after (a race the OS rarely loses on loopback). A server we
start in this process takes a listening socket from ``listening_socket`` instead (uvicorn's
``Server.run(sockets=[...])``), so nothing can take its port in between.

``LoopbackHTTPServer`` runs a ``LoopbackHandler`` subclass (``http.server``, one thread per
request) on 127.0.0.1 in a daemon thread: the demo's DingTalk sink and child router, and
the stand-ins and small servers of the tests and benches.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOOPBACK = "127.0.0.1"


def listening_socket(host: str = LOOPBACK) -> socket.socket:
    """A TCP socket bound to ``host`` on a port the OS picks, listening; the caller owns it."""
    return socket.create_server((host, 0))


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on now, for a process that binds it by number."""
    with socket.create_server((host, 0)) as sock:
        return int(sock.getsockname()[1])


class LoopbackHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and answers in one call (``reply``)."""

    def reply(self, status: int, body: bytes | str | Any = b"", *, content_type: str | None = None,
              headers: dict[str, str] | None = None) -> None:
        """Answer ``status`` with ``body``: bytes as given, str as text, anything else as JSON."""
        if isinstance(body, bytes):
            raw, kind = body, "application/octet-stream"
        elif isinstance(body, str):
            raw, kind = body.encode(), "text/plain; charset=utf-8"
        else:
            raw, kind = json.dumps(body, ensure_ascii=False).encode(), "application/json; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", content_type or kind)
        self.send_header("Content-Length", str(len(raw)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(raw)

    def body(self) -> bytes:
        """The request body (``Content-Length`` bytes; none without it)."""
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _TLSHTTPServer(ThreadingHTTPServer):
    """A refused handshake (no client certificate, plain HTTP) is the client's problem: no traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ssl.SSLError | ConnectionError):
            return
        super().handle_error(request, client_address)


class LoopbackHTTPServer:
    """``with LoopbackHTTPServer(Handler) as server: ... server.url``: serves until the block ends."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, port: int = 0, host: str = LOOPBACK,
                 name: str = "loopback-http", ssl_context: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.httpd = (ThreadingHTTPServer if ssl_context is None else _TLSHTTPServer)((host, port), handler)
        self.httpd.daemon_threads = True
        self.scheme = "http" if ssl_context is None else "https"
        if ssl_context is not None:  # the handshake in the request's thread, not in accept()
            self.httpd.socket = ssl_context.wrap_socket(self.httpd.socket, server_side=True,
                                                        do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True, name=name)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def start(self) -> LoopbackHTTPServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.httpd.shutdown()
            self._thread.join(timeout=5)
        self.httpd.server_close()

    def __enter__(self) -> LoopbackHTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
