"""The built-in registry: exporters register with the controller itself (no Consul, no Kubernetes).

``PUT /v1/registry/targets/{identity}`` lands in :meth:`BuiltinRegistry.put` with the
same validation as an inventory file entry (``sharder.loading.parse_target``); an entry
lives ``ttl_s`` after its last PUT, so an exporter that dies without deregistering goes
the way a failing Consul check would (then the reconcile loop's grace period applies).
The registry is one discovery source named ``registry``: every change pushes its whole
set into the sink, like the Consul and Kubernetes sources do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sharder.errors import InventoryError
from sharder.inventory import Target
from sharder.loading import parse_target
from sharder.sources.base import DiscoverySink
from sharder.spec import JobSpec

SOURCE = "registry"


class IdentityMismatch(InventoryError):
    pass


@dataclass(frozen=True)
class Entry:
    target: Target
    expires_at: float


class BuiltinRegistry:
    name = SOURCE

    def __init__(
        self,
        *,
        sink: DiscoverySink,
        jobs: Mapping[str, JobSpec],
        ttl_s: float = 90.0,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 200_000,
    ) -> None:
        self._sink = sink
        self._jobs = jobs
        self.ttl_s = ttl_s
        self._clock = clock
        self.max_entries = max_entries
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()
        self._push_lock = threading.Lock()  # keeps pushes in the order of their snapshots
        self._dirty = threading.Event()
        self._running = False

    def seed(self, targets: Iterable[Target]) -> None:
        """Entries persisted before a restart, each with a fresh TTL (their exporters re-PUT)."""
        expires = self._clock() + self.ttl_s
        with self._lock:
            for target in targets:
                self._entries.setdefault(target.identity, Entry(target, expires))

    def put(self, identity: str, body: Any) -> tuple[Target, bool]:
        """Validate and (re)register; (target, created). Raises ``InventoryError`` naming the field."""
        target = parse_target(body, source="registry", jobs=self._jobs)
        if target.identity != identity:
            raise IdentityMismatch(
                f"the path names identity {identity!r} but the body's target is {target.identity!r} "
                "(set 'identity' in the body, or use host:port in the path)",
                field="identity",
                value=identity,
                source="registry",
            )
        with self._lock:
            old = self._entries.get(identity)
            if old is None and len(self._entries) >= self.max_entries:
                raise InventoryError(
                    f"the built-in registry holds its maximum of {self.max_entries} targets",
                    source="registry",
                )
            self._entries[identity] = Entry(target, self._clock() + self.ttl_s)
            changed = old is None or old.target != target
        if changed:
            self._push()
        return target, old is None

    def delete(self, identity: str) -> bool:
        with self._lock:
            found = self._entries.pop(identity, None) is not None
        if found:
            self._push()
        return found

    def entries(self) -> list[tuple[Target, float]]:
        """(target, seconds until it expires), by identity."""
        now = self._clock()
        with self._lock:
            return [(e.target, max(0.0, e.expires_at - now)) for _, e in sorted(self._entries.items())]

    def expire(self) -> int:
        """Drop entries past their TTL; how many went."""
        now = self._clock()
        with self._lock:
            gone = [i for i, e in self._entries.items() if e.expires_at <= now]
            for identity in gone:
                del self._entries[identity]
        if gone:
            self._push()
        return len(gone)

    def poll_once(self) -> int:
        return self.expire()

    def run(self, stop: threading.Event) -> None:
        """Push changes as they come, coalesced, and expire entries every second.

        A push hands the sink the whole set (as every source does), so a fleet of N nodes
        registering at once would cost N pushes of up to N targets if each PUT pushed; here
        the PUTs that arrive during one push ride on the next."""
        self._running = True
        next_expiry = self._clock() + 1.0
        try:
            while not stop.is_set():
                if self._dirty.wait(timeout=max(0.0, min(1.0, next_expiry - self._clock()))):
                    self._dirty.clear()
                    self._send()
                if self._clock() >= next_expiry:
                    next_expiry = self._clock() + 1.0
                    self.expire()
        finally:
            self._running = False
            if self._dirty.is_set():
                self._send()

    def _push(self) -> None:
        """The set changed: push now, or let the running loop push it (coalescing a burst)."""
        if self._running:
            self._dirty.set()
        else:
            self._send()

    def _send(self) -> None:
        with self._push_lock:
            with self._lock:
                targets = [e.target for e in self._entries.values()]
            self._sink.on_change(SOURCE, targets)
