"""Loopback helpers, the one place gpufed keeps them: ports and small HTTP servers.

``free_port`` is for processes that take a port number on their command line (Prometheus,
Alertmanager, a child of the demo): the number is free now and the process binds it soon
after. Two things could take it in between, and ``free_port`` keeps both away: it picks
below the kernel's ephemeral range (``ip_local_port_range``), where outgoing connections
never take a local port, and it holds a lock file for the number for a minute, so another
gpufed process (a parallel test worker, a second demo) does not hand out the same one.
A server we start in this process takes a listening socket from ``listening_socket``
instead (uvicorn's ``Server.run(sockets=[...])``), so nothing can take its port in between.

``LoopbackHTTPServer`` runs a ``LoopbackHandler`` subclass (``http.server``, one thread per
request) on 127.0.0.1 in a daemon thread: the demo's DingTalk sink and child router, and
the stand-ins and small servers of the tests and benches.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"


def listening_socket(host: str = LOOPBACK) -> socket.socket:
    """A TCP socket bound to ``host`` on a port the OS picks, listening; the caller owns it."""
    return socket.create_server((host, 0))


RESERVATION_S = 60.0
"""How long ``free_port`` keeps a number from other gpufed processes: the process it was
picked for binds it within this time (a child or Alertmanager starts in seconds)."""

_LOWEST_PICKED = 20000
_reservations: deque[tuple[float, int]] = deque()  # (monotonic time, lock fd), oldest first
_reservations_lock = threading.Lock()


def _ephemeral_floor() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _reserve(port: int) -> bool:
    """Take the machine-wide lock file for ``port``; False when another process holds it."""
    folder = Path(tempfile.gettempdir()) / f"gpufed-ports-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(folder / str(port), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    now = time.monotonic()
    with _reservations_lock:
        while _reservations and now - _reservations[0][0] > RESERVATION_S:
            os.close(_reservations.popleft()[1])
        _reservations.append((now, fd))
    return True


def _bindable(host: str, port: int) -> bool:
    try:
        with socket.create_server((host, port)):
            return True
    except OSError:
        return False


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on now and no other gpufed process was just given, for a
    process that binds it by number."""
    floor = _ephemeral_floor()
    if floor - _LOWEST_PICKED >= 1000:
        for _ in range(200):
            port = random.randrange(_LOWEST_PICKED, floor)
            if _reserve(port) and _bindable(host, port):  # bound-free checked once we hold it
                return port
    with socket.create_server((host, 0)) as sock:  # a narrow or odd range: the kernel's pick
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
