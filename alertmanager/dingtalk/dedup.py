"""Relay-side dedup of one notification sent by several Alertmanager replicas.

Alertmanager HA gossips its notification log, but a replica that has not heard from its
peer within ``peer_timeout`` sends anyway. The relay keeps, per dedup key, whether the
notification is in flight or done, and which message parts already reached DingTalk, so
a retry after a partial failure re-sends only the missing parts.

The key (``payload.dedup_key``) names each alert's episode, so the next episode of the same
alerts is never a duplicate; the window only has to outlast the replicas' copies. Replica
``n`` of an HA set sends a notification ``n * peer_timeout`` (15 s by default) after the
first replica unless the gossiped notification log says it was sent: a copy comes at most
``(replicas - 1) * peer_timeout`` after the original, plus its send time. The default
window, 60 s (``config.DEFAULT_DEDUP_WINDOW``), covers three replicas with 30 s to spare,
and is shorter than any ``repeat_interval`` a route may have (it cannot be under the
``group_interval``, 1 minute for critical alerts), so a reminder of an unchanged group is
never taken for a copy. Completed keys are kept in ``snapshot`` rows so that a restarted
relay (``memory``) still knows the copies it already answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

Clock = Callable[[], float]


@dataclass
class _Entry:
    at: float
    done: bool = False
    parts: set[str] = field(default_factory=set)


class Deduplicator:
    """Keys seen within ``window`` seconds of ``clock``."""

    def __init__(self, window: float, *, clock: Clock = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._in_flight: set[str] = set()

    def _expire(self, now: float) -> None:
        stale = [key for key, entry in self._entries.items()
                 if entry.at <= now - self.window and key not in self._in_flight]
        for key in stale:
            del self._entries[key]

    def reserve(self, key: str) -> bool:
        """True when the caller should deliver; False for a duplicate (done or in flight)."""
        now = self._clock()
        self._expire(now)
        entry = self._entries.get(key)
        if key in self._in_flight or (entry is not None and entry.done):
            return False
        if entry is None:
            self._entries[key] = _Entry(at=now)
        self._in_flight.add(key)
        return True

    def delivered_parts(self, key: str) -> set[str]:
        entry = self._entries.get(key)
        return set(entry.parts) if entry else set()

    def part_delivered(self, key: str, part: str) -> None:
        entry = self._entries.setdefault(key, _Entry(at=self._clock()))
        entry.parts.add(part)

    def complete(self, key: str) -> None:
        """Delivered (or permanently refused): later copies within the window are dropped."""
        self._in_flight.discard(key)
        self._entries[key] = _Entry(at=self._clock(), done=True)

    def snapshot(self) -> list[tuple[str, float]]:
        """(key, completed at) of every completed key still inside the window."""
        self._expire(self._clock())
        return sorted((key, entry.at) for key, entry in self._entries.items() if entry.done)

    def restore(self, rows: Iterable[tuple[str, float]]) -> None:
        """Remember completed keys from ``snapshot`` rows (before any request is served)."""
        for key, at in rows:
            self._entries[str(key)] = _Entry(at=float(at), done=True)

    def release(self, key: str) -> None:
        """Transient failure: let the retry through, remembering parts already delivered."""
        self._in_flight.discard(key)
        entry = self._entries.get(key)
        if entry is not None:
            entry.at = self._clock()
