"""Reads without a token pay for what they cost; cheap ETags.

HTTP SD must stay open (children fetch it without a token), and so do the reads the web
page makes. Every other route costs work a client could loop on to take the CPU HTTP SD
needs. The choice (see the README, "Reads"):

* a request with a valid bearer token (any scope: ``read``, or an exporter's ``register``
  token) is not limited;
* HTTP SD (``/v1/sd/...``, the master's children list), ``/healthz``, ``/readyz`` and
  ``/metrics`` are never charged;
* any other request is admitted by :class:`ReadAdmission` against its client's bucket
  (``--read-rate`` units per second, ``--read-burst`` at once; the client is the TCP peer,
  ``client_address``): one unit up front, so an empty bucket answers 429 with
  ``Retry-After`` before any work is done. After the answer the client is charged what
  the request turned out to cost: the bytes it sent and received (:data:`BYTES_PER_UNIT`),
  plus the larger of the rows it walked (:data:`ROWS_PER_UNIT`) and the CPU time its route
  took on its worker thread (:data:`CPU_S_PER_UNIT`, measured per request with the
  thread's own clock, so waiting for the GIL or a neighbour is not billed);
* every list read carries a weak ``ETag`` made from the versions it was built from; a
  matching ``If-None-Match`` gets 304 without building a row.

A unit is about what the cheapest answer costs (a ``/readyz``-sized request is roughly a
millisecond of the server's CPU on the bench host); the rates are checked end to end by
``gpufed bench sd --abuse 8 --abuse-route status|target-list|xff``, which keeps SD p99
under eight tokenless loops within 2x of the same loops on ``/readyz`` (README, Benchmarks).
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response

from federation.controller.http.auth import Authenticator
from federation.controller.http.client_address import ClientAddress
from federation.controller.http.http_guards import ASGIApp, problem
from federation.controller.http.ratelimit import RateLimited, RateLimiter

ROWS_PER_UNIT = 100
BYTES_PER_UNIT = 64 * 1024
CPU_S_PER_UNIT = 0.001
READ_RATE = 20.0
"""Units per second per client address (``--read-rate``)."""
READ_BURST = 100
"""Units a client may spend at once (``--read-burst``)."""
CLIENT_KEY = "gpufed_read_client"
"""Where :class:`ReadAdmission` leaves the charged client in ``scope["state"]`` (None: a token)."""


def read_limiter(*, rate: float, burst: int) -> RateLimiter:
    return RateLimiter(
        rate=rate,
        burst=burst,
        what=lambda client: (
            f"client {client} reads faster than {rate:g} units/s without a token "
            f"(--read-rate; a unit is a request, {ROWS_PER_UNIT} rows, {BYTES_PER_UNIT // 1024} KiB "
            f"or {CPU_S_PER_UNIT * 1000:g} ms of work)"
        ),
    )


def limited_response(exc: RateLimited) -> JSONResponse:
    response = problem(429, "Too many requests", str(exc), retry_after_s=exc.retry_after_s)
    response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


class ReadAdmission:
    """ASGI: admit a request without a token against its client's bucket, then charge its bytes.

    ``free(path)`` names the routes never charged. Runs on the event loop, so a refusal
    never waits for a worker thread.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limiter: Callable[[], RateLimiter],
        auth: Authenticator,
        clients: ClientAddress,
        free: Callable[[str], bool],
    ) -> None:
        self.app, self.limiter, self.auth, self.clients, self.free = app, limiter, auth, clients, free

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.free(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if self._token(scope):
            state[CLIENT_KEY] = None
            await self.app(scope, receive, send)
            return
        limiter, client = self.limiter(), self.clients.of(scope)
        try:
            limiter.take(client)
        except RateLimited as exc:
            await limited_response(exc)(scope, receive, send)
            return
        state[CLIENT_KEY] = client
        moved = 0

        async def counted_receive() -> Any:
            nonlocal moved
            message = await receive()
            moved += len(message.get("body", b""))
            return message

        async def counted_send(message: MutableMapping[str, Any]) -> None:
            nonlocal moved
            if message["type"] == "http.response.body":
                moved += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counted_receive, counted_send)
        finally:
            limiter.spend(client, moved / BYTES_PER_UNIT - 1)  # the unit taken up front covers 64 KiB

    def _token(self, scope: MutableMapping[str, Any]) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                return self.auth.caller(value.decode("latin-1")) is not None
        return False


@dataclass
class ReadBudget:
    """Who pays for a read: ``client`` is None for a valid token (nothing charged)."""

    limiter: RateLimiter
    client: str | None
    cpu_clock: Callable[[], float] = time.thread_time
    rows: int = field(default=0)

    def charge(self, rows: int) -> None:
        """Rows the read walked; settled with the measured CPU time by :func:`metered`."""
        self.rows += rows

    def settle(self, cpu_s: float) -> None:
        if self.client is not None:
            self.limiter.spend(self.client, max(self.rows / ROWS_PER_UNIT, cpu_s / CPU_S_PER_UNIT) - 1)


def read_budget(request: Request) -> ReadBudget:
    limiter: RateLimiter = request.app.state.read_limiter
    client = request.scope.get("state", {}).get(CLIENT_KEY)
    clock: Callable[[], float] = getattr(request.app.state, "cpu_clock", time.thread_time)
    return ReadBudget(limiter=limiter, client=client, cpu_clock=clock)


Reader = Annotated[ReadBudget, Depends(read_budget)]
Route = TypeVar("Route", bound=Callable[..., Any])


def metered(route: Route) -> Route:
    """A sync route (it runs on a worker thread) charged by its rows and measured CPU time.

    The route takes ``budget: Reader``; its answer is rendered here, inside the measurement,
    so the JSON encoding is billed too.
    """

    @functools.wraps(route)
    def run(*args: Any, **kwargs: Any) -> Any:
        budget: ReadBudget = kwargs["budget"]
        started = budget.cpu_clock()
        try:
            answer = route(*args, **kwargs)
            return answer if isinstance(answer, Response) else JSONResponse(answer)
        finally:
            budget.settle(budget.cpu_clock() - started)

    return run  # type: ignore[return-value]


def etag(*parts: object) -> str:
    """A weak validator: the versions a list was built from and the query that shaped it."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=12).hexdigest()
    return f'W/"{digest}"'


def not_modified(request: Request, tag: str) -> Response | None:
    """304 when ``If-None-Match`` names ``tag`` (weak comparison, RFC 9110 §13.1.2), else None."""
    given = request.headers.get("if-none-match")
    if given is None:
        return None
    names = {t.strip().removeprefix("W/") for t in given.split(",")}
    if "*" in names or tag.removeprefix("W/") in names:
        return Response(status_code=304, headers={"ETag": tag})
    return None
