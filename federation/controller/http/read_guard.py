"""Reads of lists: a budget per client without a token, and cheap ETags.

HTTP SD must stay open (children fetch it without a token), and so do the list reads the
web page makes. A list read costs work in proportion to what it returns, so a client that
loops on them could take the CPU HTTP SD needs. The choice (see the README, "Reads"):

* a request with a valid bearer token (any scope: ``read``, or an exporter's ``register``
  token listing the registry) is not limited;
* any other list read is charged to its client address: one unit per request, plus one
  per :data:`ROWS_PER_UNIT` rows it returned, from a token bucket (``--read-rate`` units
  per second, ``--read-burst`` at once); an empty bucket answers 429 with ``Retry-After``
  before any work is done;
* every list read carries a weak ``ETag`` made from the versions it was built from; a
  matching ``If-None-Match`` gets 304 without building a row.

HTTP SD, ``/healthz``, ``/readyz`` and ``/metrics`` are never charged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.responses import Response

from federation.controller.http.auth import Authenticator
from federation.controller.http.ratelimit import RateLimiter

ROWS_PER_UNIT = 100
READ_RATE = 20.0
"""Units per second per client address (``--read-rate``): about two 1,000-row pages a second."""
READ_BURST = 100
"""Units a client may spend at once (``--read-burst``)."""


def read_limiter(*, rate: float, burst: int) -> RateLimiter:
    return RateLimiter(
        rate=rate,
        burst=burst,
        what=lambda client: (
            f"client {client} reads lists faster than {rate:g} units/s without a token "
            f"(--read-rate; a unit is a request or {ROWS_PER_UNIT} rows)"
        ),
    )


@dataclass(frozen=True)
class ReadBudget:
    """Who pays for a list read: ``client`` is None for a valid token (nothing charged)."""

    limiter: RateLimiter
    client: str | None

    def charge(self, rows: int) -> None:
        if self.client is not None:
            self.limiter.spend(self.client, rows // ROWS_PER_UNIT)


async def read_budget(request: Request, authorization: Annotated[str | None, Header()] = None) -> ReadBudget:
    """Admit a list read (runs on the event loop, so a refusal never waits for a worker thread)."""
    limiter: RateLimiter = request.app.state.read_limiter
    auth: Authenticator = request.app.state.auth
    if authorization is not None and auth.caller(authorization) is not None:
        return ReadBudget(limiter=limiter, client=None)
    client = request.client.host if request.client is not None else "unknown"
    limiter.take(client)
    return ReadBudget(limiter=limiter, client=client)


Reader = Annotated[ReadBudget, Depends(read_budget)]


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
