"""The request side of the web config: basic auth (bcrypt), the rate limit, response headers.

``Guard.check(authorization)`` is the one decision, made per request by every server:
``None`` lets the request through, else ``(status, headers, body)`` is the refusal (401 with
``WWW-Authenticate``, or 429). ``Guard.headers`` go on every response. The exporter's h11
edge calls it directly; the uvicorn apps (``gpufed serve``, ``gpufed-dingtalk``) get it as
``GuardMiddleware``. Refusals are counted in ``Guard.refused`` by reason.

bcrypt is slow on purpose (cost 10 is ~70 ms), so a verdict is cached per (user, password,
hash) digest, as exporter-toolkit does; an unknown user is checked against a fixed hash so
that answers do not reveal which users exist by their time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import bcrypt

from webconfig.model import WebConfig

Refusal = tuple[int, list[tuple[str, str]], bytes]
_CACHE_MAX = 1024
# bcrypt of a fixed string, cost 10: what an unknown user's password is checked against.
_DUMMY = b"$2b$10$4So9szdy6W8N2Limq0FPDOq1ojtTpyI59LJ0hAmI.z4qv.GsLV/n2"


class Guard:
    def __init__(self, config: WebConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._users = {user: hashed.encode() for user, hashed in (config.basic_auth_users or {}).items()}
        http = config.http_server_config
        self.headers: list[tuple[str, str]] = http.headers.items() if http and http.headers else []
        rate = config.rate_limit
        self._interval = rate.seconds() if rate else 0.0
        self._burst = float(max(rate.burst, 1)) if rate else 1.0
        self._tokens = self._burst
        self._clock = clock
        self._last = clock()
        self._lock = threading.Lock()
        self._verdicts: dict[bytes, bool] = {}
        self.refused: Counter[str] = Counter()

    @property
    def active(self) -> bool:
        return bool(self._users or self.headers or self._interval > 0)

    def _password_ok(self, user: str, password: str) -> bool:
        hashed = self._users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed or b""))).digest()
        with self._lock:
            known = self._verdicts.get(key)
        if known is not None:
            return known
        try:
            ok = bcrypt.checkpw(password.encode(), hashed or _DUMMY) and hashed is not None
        except ValueError:  # a hash bcrypt cannot read (the model admits $2x$, bcrypt may not)
            ok = False
        with self._lock:
            if len(self._verdicts) >= _CACHE_MAX:
                self._verdicts.clear()
            self._verdicts[key] = ok
        return ok

    def _authorized(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return bool(sep) and self._password_ok(user, password)

    def _take_token(self) -> bool:
        if self._interval <= 0:
            return True
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
            self._last = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            return False

    def check(self, authorization: str | None) -> Refusal | None:
        """``None``: serve the request; else the refusal to send instead."""
        if not self._take_token():
            self.refused["rate_limit"] += 1
            return 429, [("Content-Type", "text/plain; charset=utf-8")], b"too many requests\n"
        if self._users and not self._authorized(authorization):
            self.refused["basic_auth"] += 1
            return 401, [("Content-Type", "text/plain; charset=utf-8"),
                         ("WWW-Authenticate", 'Basic realm="gpufed"')], b"unauthorized\n"
        return None


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class GuardMiddleware:
    """ASGI: ``Guard.check`` before the app, ``Guard.headers`` on every HTTP response."""

    def __init__(self, app: ASGIApp, *, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        authorization = next((value.decode("latin-1") for name, value in scope.get("headers", [])
                              if name == b"authorization"), None)
        extra = [(name.encode(), value.encode()) for name, value in self.guard.headers]
        refusal = self.guard.check(authorization)
        if refusal is not None:
            status, headers, body = refusal
            await send({"type": "http.response.start", "status": status,
                        "headers": [(n.encode(), v.encode()) for n, v in headers] + extra})
            await send({"type": "http.response.body", "body": body})
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
