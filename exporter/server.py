"""The exporter's HTTP edge: an asyncio + h11 server on one thread, over plain routes.

Routing is a plain function `path -> Response`, so tests call it directly and the server
stays a thin edge. The design was chosen by measurement (`gpufed-exporter bench fleet`):
`ThreadingHTTPServer` with its backlog of 5 and a thread per connection had a p99 of
3-4 s for 64 scrapers of a 2,000-node fleet (SYN retransmits plus GIL hand-offs between
64 threads); one event loop with a deep backlog, a render cache per collection and a
cheaper text writer keeps the p99 in milliseconds.

What the edge guarantees, whatever the client does:

- GET and HEAD on every route; any other method gets 405 with `Allow`.
- A request body is read and dropped up to `max_body` bytes; a larger one gets 413 and
  the connection is closed. Malformed requests get 400 (431 for huge headers), no trace.
- A connection idle for `idle_timeout`, or slower than `request_timeout` to send one
  request, is closed. Pipelined requests wait while the client is not reading.
- A client that goes away mid-response costs one debug line through this module's logger.
- `Accept-Encoding: gzip` gets the gzip body (made once per rendered body, see `Body`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http import HTTPStatus

import h11
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from exporter import textformat
from exporter.errors import ConfigError
from webconfig.guard import Guard

log = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"
GZIP_MIN_BYTES = 1024
LINGER_S = 2.0
"""After a refusal, how long unread request bytes are drained before the socket closes: closing
with them unread makes the kernel send a reset that can overtake the refusal's answer."""


class Body:
    """Response bytes whose gzip form is made at most once, however many scrapes ask."""

    __slots__ = ("_gz", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._gz: bytes | None = None

    def gzipped(self) -> bytes:
        if self._gz is None:
            # Level 1: a tenth of level 6's CPU for ~10% more bytes; mtime=0 keeps it stable.
            self._gz = gzip.compress(self.raw, compresslevel=1, mtime=0)
        return self._gz


Response = tuple[int, str, bytes | Body]
Handler = Callable[[str], Response]
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
        cache: bool = True,
    ) -> None:
        self._registry = registry
        self._ready = ready
        self._version = version
        self.cache = cache and version is not None
        self._cached: tuple[object, Body] | None = None
        self._label_sets: textformat.LabelCache = {}

    def exposition(self) -> bytes:
        fast = textformat.render(self._registry.collect(), remembered=self._label_sets)
        return fast if fast is not None else textformat.fallback(self._registry)

    def body(self) -> Body:
        if not self.cache or self._version is None:
            return Body(self.exposition())
        key, cached = self._version(), self._cached
        if cached is not None and cached[0] is key:
            return cached[1]
        body = Body(self.exposition())
        self._cached = (key, body)
        return body

    def render(self) -> bytes:
        return self.body().raw

    def __call__(self, path: str) -> Response:
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, self.body()
        if path == "/healthz":
            return 200, TEXT, b"ok\n"
        if path == "/readyz":
            if self._ready():
                return 200, TEXT, b"ready\n"
            return 503, TEXT, b"no successful collection recently\n"
        return NOT_FOUND


def _wants_gzip(request: h11.Request) -> bool:
    for name, value in request.headers:
        if name == b"accept-encoding":
            for token in value.split(b","):
                coding, _, params = token.strip().partition(b";")
                if coding.strip().lower() in (b"gzip", b"x-gzip"):
                    q = params.strip().lower()
                    return not (q.startswith(b"q=") and q[2:].strip().rstrip(b"0.") == b"")
    return False


class _Connection(asyncio.Protocol):
    """One client connection: h11 parses, the route answers, timers bound its life."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._request: h11.Request | None = None
        self._body_bytes = 0
        self._in_request = False
        self._paused = False
        self._lingering = False
        self._peer = "?"

    # -- asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._server.connections.add(self)
        self._arm(self._server.idle_timeout, "idle")

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._cancel_timer()
        if exc is not None:
            log.debug("client went away peer=%s error=%s", self._peer, exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # a refused request's rest, drained so the answer arrives before any reset
        if not self._in_request:
            self._in_request = True
            self._arm(self._server.request_timeout, "request")
        self._h11.receive_data(data)
        self._process()

    def eof_received(self) -> bool | None:
        if self._lingering:
            return False  # the client read the refusal and closed: close now
        self._h11.receive_data(b"")
        self._process()
        return None

    def pause_writing(self) -> None:
        # The client stopped reading: stop reading its pipelined requests too.
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
            self._process()

    # -- request handling --------------------------------------------------------------
    def _process(self) -> None:
        transport = self._transport
        while (transport is not None and not transport.is_closing() and not self._paused
               and not self._lingering):
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._refuse(exc.error_status_hint, f"bad request: {exc}\n")
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self._request, self._body_bytes = event, 0
                length = _content_length(event)
                if length is not None and length > self._server.max_body:
                    self._refuse(413, f"request body over {self._server.max_body} bytes\n")
                    return
            elif isinstance(event, h11.Data):
                self._body_bytes += len(event.data)
                if self._body_bytes > self._server.max_body:
                    self._refuse(413, f"request body over {self._server.max_body} bytes\n")
                    return
            elif isinstance(event, h11.EndOfMessage):
                self._respond()
            elif isinstance(event, h11.ConnectionClosed):
                transport.close()
                return

    def _respond(self) -> None:
        request, transport = self._request, self._transport
        assert request is not None and transport is not None
        head_only = request.method == b"HEAD"
        extra: list[tuple[str, str]] = []
        body: bytes | Body
        guard = self._server.guard
        authorization = _header(request, b"authorization")
        refusal = guard.check(authorization, peer=self._peer) if guard is not None else None
        if guard is not None:
            extra.extend(guard.headers)
        if refusal is not None:
            status, refusal_headers, body = refusal
            content_type = dict(refusal_headers).get("Content-Type", TEXT)
            extra.extend(h for h in refusal_headers if h[0] != "Content-Type")
        elif request.method not in (b"GET", b"HEAD"):
            status, content_type, body = 405, TEXT, b"method not allowed; use GET or HEAD\n"
            extra.append(("Allow", "GET, HEAD"))
        else:
            path = request.target.split(b"?", 1)[0].decode("latin-1")
            try:
                status, content_type, body = self._server.handler(path)
            except Exception:
                log.exception("handler failed path=%s", path)
                status, content_type, body = 500, TEXT, b"internal error\n"
        payload: bytes
        if isinstance(body, Body):
            extra.append(("Vary", "Accept-Encoding"))
            if len(body.raw) >= GZIP_MIN_BYTES and _wants_gzip(request):
                payload = body.gzipped()
                extra.append(("Content-Encoding", "gzip"))
            else:
                payload = body.raw
        else:
            payload = body
        self._send(status, content_type, payload, extra, head_only=head_only)
        if self._h11.our_state is h11.MUST_CLOSE or transport.is_closing():
            transport.close()
            return
        self._h11.start_next_cycle()
        self._request, self._in_request = None, False
        self._arm(self._server.idle_timeout, "idle")

    def _send(self, status: int, content_type: str, payload: bytes, extra: list[tuple[str, str]], *,
              head_only: bool = False) -> None:
        assert self._transport is not None
        headers = [("Content-Type", content_type), ("Content-Length", str(len(payload))), *extra]
        reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        chunks = [self._h11.send(h11.Response(status_code=status, headers=headers, reason=reason)) or b""]
        if not head_only and payload:
            chunks += self._h11.send_with_data_passthrough(h11.Data(data=payload)) or []
        chunks.append(self._h11.send(h11.EndOfMessage()) or b"")
        self._transport.writelines([bytes(chunk) for chunk in chunks if chunk])

    def _refuse(self, status: int, message: str) -> None:
        """Answer an unusable request (if a response can still start) and close."""
        assert self._transport is not None
        log.debug("refused request peer=%s status=%d reason=%s", self._peer, status, message.strip())
        if self._h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            with contextlib.suppress(h11.LocalProtocolError):
                self._send(status, TEXT, message.encode(), [("Connection", "close")])
        if self._transport.can_write_eof() and not self._transport.is_closing():
            self._transport.write_eof()  # the answer, then FIN; keep reading until LINGER_S
            self._lingering = True
            self._arm(LINGER_S, "lingering")
            return
        self._transport.close()

    # -- timers ------------------------------------------------------------------------
    def _arm(self, seconds: float, what: str) -> None:
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire, what)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, what: str) -> None:
        log.debug("closing %s connection peer=%s", what, self._peer)
        if self._transport is not None:
            self._transport.close()


def _header(request: h11.Request, name: bytes) -> str | None:
    for key, value in request.headers:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)
    return None


def bind_socket(host: str, port: int, *, backlog: int) -> socket.socket:
    """A listening socket, or `ConfigError` saying in one line why there cannot be one."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ConfigError(f"cannot listen on {where}: host {host!r} does not resolve ({reason})") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        reason = {
            errno.EADDRINUSE: "address already in use (another process listens there)",
            errno.EADDRNOTAVAIL: "address not available on this machine",
            errno.EACCES: "permission denied (ports below 1024 need privileges)",
        }.get(exc.errno or 0, exc.strerror or str(exc))
        raise ConfigError(f"cannot listen on {where}: {reason}") from exc
    except OverflowError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {where}: port out of range 0-65535") from exc
    return sock


class HttpServer:
    """Serves a `Handler` from an event loop on its own thread.

    The socket is bound in the constructor, so a bad address fails before anything
    starts; `stop()` closes every connection, the listener and the loop (no warnings).
    """

    def __init__(self, handler: Handler, *, host: str = "127.0.0.1", port: int = 0, backlog: int = 4096,
                 idle_timeout: float = 120.0, request_timeout: float = 10.0, max_body: int = 65536,
                 ssl_context: ssl.SSLContext | None = None, guard: Guard | None = None) -> None:
        """`ssl_context` and `guard` come from `--web.config.file` (`webconfig.serving`)."""
        self.handler = handler
        self.ssl_context = ssl_context
        self.guard = guard
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.max_body = max_body
        self.backlog = backlog
        self.connections: set[_Connection] = set()
        self._sock = bind_socket(host, port, backlog=backlog)
        self._port = int(self._sock.getsockname()[1])
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._started = threading.Event()

    @property
    def port(self) -> int:
        return self._port

    def start(self) -> None:
        self._thread.start()
        self._started.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(self._loop.create_server(
            lambda: _Connection(self), sock=self._sock, backlog=self.backlog, ssl=self.ssl_context))
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            self._loop.run_until_complete(self._server.wait_closed())
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())

    async def _close_all(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            if connection._transport is not None:
                connection._transport.close()
        for _ in range(3):  # let connection_lost callbacks run before the loop stops
            await asyncio.sleep(0)
        self._loop.stop()

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close_all(), self._loop)
            self._thread.join(timeout=5)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()
        self._sock.close()
