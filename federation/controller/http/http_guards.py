"""HTTP hygiene in front of the API: body size and read deadlines, relative redirects.

Sits between uvicorn and the FastAPI app (``api.create_app`` adds the ASGI parts;
``serve`` passes :class:`DeadlineH11Protocol` to uvicorn). Why here and not in routes:

- A body over the limit is answered 413 before the app sees it. The app's own body
  reader turns any exception into a 400, so an over-long *chunked* body must be caught
  while it is read, not while the route parses it.
- The whole body must arrive within ``body_timeout_s``; a client that trickles a byte
  every few seconds is answered 408 instead of holding a worker for minutes.
- Request headers must arrive within ``header_timeout_s`` of the connection opening (or
  of the previous answer): uvicorn has no such deadline of its own, so a slowloris
  client that never finishes its headers is cut here, at the protocol level.
- Starlette's trailing-slash redirect builds an absolute URL from the ``Host`` header;
  the ``Location`` is made relative, so nothing a client sends is echoed back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import h11
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from federation.controller.http import redact

PROBLEM = "application/problem+json"
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def problem(status: int, title: str, detail: str, **extra: Any) -> JSONResponse:
    """Every error body: credentials in ``detail`` masked, ``errors[].value`` as shapes only."""
    if isinstance(extra.get("errors"), list):
        extra["errors"] = redact.shapes_only(extra["errors"])
    detail = redact.redact_text(detail)  # the one masking every surface uses
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(_utf8(body), status_code=status, media_type=PROBLEM)


def _utf8(value: Any) -> Any:
    """A refusal may quote the input, and the input may hold a lone surrogate (JSON ``"\\udfff"``)
    that UTF-8 cannot carry: such characters are written as ``\\udfff`` instead of failing."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_utf8(v) for v in value]
    return value


class BodyGuard:
    """Read the request body first, within ``limit`` bytes and ``timeout_s``; then run the app.

    413 for a body over the limit (declared in ``Content-Length`` or streamed chunked),
    408 for one that does not arrive in time. The app gets the body replayed in one message.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        larger: Mapping[str, int] | None = None,
        timeout_s: float = BODY_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app, self.default, self.larger = app, limit, dict(larger or {})
        self.timeout_s, self._clock = timeout_s, clock

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and _framed_twice(scope):
            # RFC 9112 §6.1: a request with both may be refused, and the connection MUST be
            # closed after it (what follows on it may be a smuggled request).
            refused = problem(
                400, "Bad request", "a request must not carry both Content-Length and Transfer-Encoding"
            )
            refused.headers["Connection"] = "close"
            await refused(scope, receive, send)
            return
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        limit = self.larger.get(scope.get("path", ""), self.default)
        too_large = problem(413, "Body too large", f"request bodies are limited to {limit} bytes")
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await too_large(scope, receive, send)
                return
        chunks: list[bytes] = []
        seen = 0
        deadline = self._clock() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - self._clock()))
            except TimeoutError:
                late = problem(408, "Request timeout", f"the body must arrive within {self.timeout_s:g} s")
                await late(scope, receive, send)
                return
            if message["type"] != "http.request":  # the client went away
                return
            body = message.get("body", b"")
            seen += len(body)
            if seen > limit:
                await too_large(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: waits for the disconnect, as uvicorn does

        await self.app(scope, replay, send)


def _framed_twice(scope: MutableMapping[str, Any]) -> bool:
    names = {name.lower() for name, _ in scope.get("headers", [])}
    return b"content-length" in names and b"transfer-encoding" in names


class RelativeRedirects:
    """Strip scheme and host from a redirect's ``Location``: the ``Host`` header is never echoed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def relative(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and 300 <= message["status"] < 400:
                message["headers"] = [
                    (name, relative_location(value) if name.lower() == b"location" else value)
                    for name, value in message.get("headers", [])
                ]
            await send(message)

        await self.app(scope, receive, relative)


def relative_location(value: bytes) -> bytes:
    """``http://evil.example/v1/x?a=1`` -> ``/v1/x?a=1``; a path stays as it is."""
    parts = urlsplit(value.decode("latin-1"))
    path = "/" + parts.path.lstrip("/")  # '//evil' would be scheme-relative: one slash only
    return (path + (f"?{parts.query}" if parts.query else "")).encode("latin-1")


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for request headers (slowloris).

    Armed when the connection opens and again after each answer; disarmed once h11 has
    the whole request head. On expiry the connection is closed: there is no request yet
    to answer.
    """

    header_timeout_s = HEADER_TIMEOUT_S
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.transport.close()
