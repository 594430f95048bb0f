"""Reads never wait on a sick state store: its health, a bounded audit reader, a write gate.

Sits between the API and whichever :class:`~federation.controller.stores.store.StateStore`
``service.build_service`` built (SQLite, Consul, Kubernetes):

* :class:`WatchedStore` delegates every call and records it in :class:`StoreHealth`: when the
  oldest call in flight is older than ``stall_s``, or calls have failed for that long, the
  store "has not answered", ``/readyz`` turns 503 and says so (the orchestrator can act).
* :class:`AuditPages` answers ``/v1/audit``: a page changes only on a commit, so pages are
  kept per state revision and a repeat read touches neither the store nor its lock; a miss
  is read on one thread of its own and waited for at most ``wait_s`` (a frozen store makes
  the read fail fast with :class:`StoreSlow`, not hold an API worker).
* :class:`WriteGate` (ASGI) bounds the requests that may write, so writes waiting on a
  frozen store hold at most ``limit`` of the API's worker threads and reads keep the rest;
  past the limit, or while the store has not answered, a write is refused at once (503).

Time is injected (``clock``) so tests need no sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from federation.controller.base.state import AuditEntry
from federation.controller.stores.store import StoreError

STALL_S = 10.0
"""A store call in flight this long (or failing this long) means the store is not answering."""
AUDIT_WAIT_S = 1.5
"""An audit read waits this long for the store, then answers 503 (well below client timeouts)."""
WRITE_SLOTS = 8
"""Requests that may write at once (the API's thread pool holds 40)."""
WRITE_QUEUE_S = 1.0


class StoreSlow(StoreError):
    """The state store did not answer in time; nothing waited longer than the bound."""


class StoreHealth:
    def __init__(self, *, stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s, self._clock = stall_s, clock
        self._ids = itertools.count()
        self._inflight: dict[int, float] = {}
        self._lock = threading.Lock()
        self.last_ok: float | None = None
        self.failing_since: float | None = None
        self.last_error: str | None = None

    def begin(self) -> int:
        with self._lock:
            call = next(self._ids)
            self._inflight[call] = self._clock()
            return call

    def end(self, call: int, *, error: BaseException | None) -> None:
        now = self._clock()
        with self._lock:
            self._inflight.pop(call, None)
            if error is None:
                self.last_ok, self.failing_since = now, None
            else:
                self.last_error = str(error)[:300]
                self.failing_since = self.failing_since or now

    def unanswered_s(self) -> float:
        """How long the store has not answered (0 while it does)."""
        now = self._clock()
        with self._lock:
            oldest = min(self._inflight.values(), default=now)
            failing = self.failing_since if self.failing_since is not None else now
        return max(now - oldest, now - failing)

    def answering(self) -> bool:
        return self.unanswered_s() < self.stall_s

    def report(self) -> dict[str, Any]:
        waited = self.unanswered_s()
        with self._lock:
            inflight = len(self._inflight)
        out: dict[str, Any] = {
            "answering": waited < self.stall_s,
            "unanswered_s": round(waited, 1),
            "calls_in_flight": inflight,
        }
        if waited >= self.stall_s and self.last_error is not None:
            out["last_error"] = self.last_error
        return out


class WatchedStore:
    """A state store whose every call is recorded in ``health``; otherwise the store itself."""

    def __init__(self, inner: Any, health: StoreHealth) -> None:
        self._inner, self._health = inner, health

    @property
    def inner(self) -> Any:
        return self._inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name.startswith("_") or name == "close":
            return attr
        health = self._health

        def watched(*args: Any, **kwargs: Any) -> Any:
            call = health.begin()
            try:
                result = attr(*args, **kwargs)
            except StoreError as exc:
                health.end(call, error=exc)
                raise
            except BaseException:
                health.end(call, error=None)  # the store answered; the caller's error is its own
                raise
            health.end(call, error=None)
            return result

        return watched


class AuditPages:
    """``/v1/audit`` pages kept per state revision; misses read on a thread of their own."""

    def __init__(
        self,
        read: Callable[[int, int | None], list[AuditEntry]],
        *,
        wait_s: float = AUDIT_WAIT_S,
        keep: int = 64,
    ) -> None:
        self._read, self.wait_s, self._keep = read, wait_s, keep
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-read")
        self._lock = threading.Lock()
        self._revision: int | None = None
        self._pages: dict[tuple[int, int | None], list[AuditEntry]] = {}
        self._pending: dict[tuple[int, int | None], Future[list[AuditEntry]]] = {}

    def page(self, *, revision: int, limit: int, before_id: int | None) -> list[AuditEntry]:
        key = (limit, before_id)
        with self._lock:
            if revision != self._revision:
                self._revision, self._pages = revision, {}
            hit = self._pages.get(key)
            if hit is not None:
                return hit
            pending = self._pending.get(key)
            if pending is None:
                if any(not f.done() for f in self._pending.values()):  # the store is busy with one
                    raise StoreSlow("state store: an audit read is still waiting for the store; retry")
                pending = self._pool.submit(self._read, limit, before_id)
                self._pending = {k: f for k, f in self._pending.items() if not f.done()}
                self._pending[key] = pending
        try:
            entries = pending.result(timeout=self.wait_s)
        except FutureTimeout:
            raise StoreSlow(f"state store: no answer within {self.wait_s:g} s; retry") from None
        with self._lock:
            self._pending.pop(key, None)
            if revision == self._revision and len(self._pages) < self._keep:
                self._pages[key] = entries
        return entries

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class WriteGate:
    """ASGI: at most ``limit`` requests that may write (not GET/HEAD/OPTIONS) at once."""

    def __init__(
        self,
        app: Any,
        *,
        health: StoreHealth,
        refuse: Callable[[str], Any],
        limit: int = WRITE_SLOTS,
        queue_s: float = WRITE_QUEUE_S,
    ) -> None:
        self.app, self.health, self.refuse = app, health, refuse
        self.limit, self.queue_s = limit, queue_s
        self._slots: asyncio.Semaphore | None = None

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        if not self.health.answering():
            waited = self.health.unanswered_s()
            await self.refuse(f"the state store has not answered for {waited:.0f} s; retry")(
                scope, receive, send
            )
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout=self.queue_s)
        except TimeoutError:
            await self.refuse(f"{self.limit} writes are waiting for the state store; retry")(
                scope, receive, send
            )
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._slots.release()
