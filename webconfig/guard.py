"""The request side of the web config: basic auth (bcrypt), the rate limit, response headers.

``Guard.check(authorization)`` is the one decision, made per request by every server:
``None`` lets the request through, else ``(status, headers, body)`` is the refusal (401 with
``WWW-Authenticate``, or 429). ``Guard.headers`` go on every response. The exporter's h11
edge calls it directly; the uvicorn apps (``gpufed serve``, ``gpufed-dingtalk``) get it as
``GuardMiddleware``. Refusals are counted in ``Guard.refused`` by reason
(``webconfig.refusals``) and said in one log line each, with the client's address.

bcrypt is slow on purpose (cost 10 is ~70 ms), so a verdict is cached per (user, password,
hash) digest, as exporter-toolkit does; an unknown user is checked against a fixed hash so
that answers do not reveal which users exist by their time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import bcrypt

from webconfig.model import WebConfig
from webconfig.refusals import AUTH_REASONS, RATE_LIMITED, Tally

log = logging.getLogger(__name__)

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
        self.refused = Tally((*AUTH_REASONS, RATE_LIMITED))

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

    def _refusal(self, authorization: str | None) -> tuple[str, str] | None:
        """``None``: a known user with the right password; else (reason, what to log)."""
        if not authorization:
            return "missing", "no Authorization header"
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "basic":
            return "missing", f"Authorization scheme {scheme[:20]!r}, not Basic"
        try:
            user, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return "malformed", "Basic credentials that are not base64 of user:password"
        if not sep:
            return "malformed", "Basic credentials without a ':' between user and password"
        if self._password_ok(user, password):
            return None
        if user not in self._users:  # its name is not logged: it may be a password typed there
            return "unknown_user", "a user not in basic_auth_users"
        return "bad_password", f"wrong password for user {user!r}"

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

    def check(self, authorization: str | None, *, peer: str = "?") -> Refusal | None:
        """``None``: serve the request; else the refusal to send instead."""
        if not self._take_token():
            self.refused.add(RATE_LIMITED)
            # DEBUG, not WARNING: the limit is there for floods, and a line per refused request
            # would turn one into a flood of log lines (the counter says how many).
            log.debug("request refused peer=%s reason=%s: over rate_limit", peer, RATE_LIMITED)
            return 429, [("Content-Type", "text/plain; charset=utf-8")], b"too many requests\n"
        refusal = self._refusal(authorization) if self._users else None
        if refusal is not None:
            reason, detail = refusal
            self.refused.add(reason)
            log.warning("basic auth refused peer=%s reason=%s: %s", peer, reason, detail)
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
        client = scope.get("client")
        peer = f"{client[0]}:{client[1]}" if client else "?"
        refusal = self.guard.check(authorization, peer=peer)
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
