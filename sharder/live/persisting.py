"""Saving the reconcile loop's per-source sets: only what changed, at most every interval.

The loop (``sharder.live.reconcile``) notes which identities of which source changed; the
:class:`SetPersister` writes them to a delta store (``LastKnownChanges``, e.g. the
controller's SQLite rows) or, for a store that takes only whole sets, the whole sets.
Not thread-safe on its own: ``note``/``take`` run under the loop's lock, ``write`` outside
it (a slow store must not block sources).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from sharder.model.inventory import Target

Changes = dict[str, dict[str, Target | None]]
"""source -> identity -> target (None: gone from the source)."""


class LastKnownStore(Protocol):
    """Where the merged per-source sets survive a restart (``sharder.sources.lastknown``)."""

    def save(self, sets: Mapping[str, Sequence[Target]]) -> None: ...


@runtime_checkable
class LastKnownChanges(Protocol):
    """A store that can take only what changed: source -> identity -> target (None: gone).
    ``save_changes`` returns False when it cannot, and the loop saves the whole sets."""

    def save_changes(self, changes: Mapping[str, Mapping[str, Target | None]]) -> bool: ...


class SetPersister:
    """When to write and what: a delta store gets at most ``chunk`` rows per write, the rest
    a moment later, so a first save of a million rows never holds the loop for seconds
    (changes arriving meanwhile are placed between two chunks)."""

    def __init__(
        self, store: LastKnownStore | None, *, interval_s: float, chunk: int = 20_000, gap_s: float = 0.2
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.chunk = chunk
        self.gap_s = gap_s
        self._unsaved: dict[str, set[str]] = {}
        """source -> identities changed since the last write (what a delta store writes)."""
        self._saved_at = float("-inf")
        self._chunked = isinstance(store, LastKnownChanges)
        """Rows in chunks; off once the store says it takes only whole sets."""
        self._backlog = False
        """The last write was a chunk and more rows wait: the next one comes after ``gap_s``."""
        self.due = False
        """An assignment was applied since the last write."""

    def note(self, source: str) -> set[str]:
        """The set to add ``source``'s changed identities to."""
        return self._unsaved.setdefault(source, set())

    def wants(self, now: float) -> bool:
        return self.due and now >= self._next()

    def next_at(self) -> float | None:
        """When the next write is due (loop clock), None when none is."""
        return self._next() if self.due and self.store is not None else None

    def _next(self) -> float:
        return self._saved_at + (self.gap_s if self._backlog else self.interval_s)

    def take(self, now: float, sets: Mapping[str, Mapping[str, Target]], *, every: bool = False) -> Changes:
        """What changed since the last write, as of ``sets`` now (at most ``chunk`` rows for
        a delta store, unless ``every``); marks it written."""
        self._saved_at = now
        if self._chunked and not every:
            unsaved = self._take_chunk()
        else:
            unsaved, self._unsaved = self._unsaved, {}
        self._backlog = any(self._unsaved.values())
        self.due = self._backlog
        return {
            name: {i: sets.get(name, {}).get(i) for i in identities}
            for name, identities in unsaved.items()
            if identities
        }

    def _take_chunk(self) -> dict[str, set[str]]:
        taken: dict[str, set[str]] = {}
        room = self.chunk
        for name in list(self._unsaved):
            pending = self._unsaved[name]
            if len(pending) <= room:
                taken[name] = self._unsaved.pop(name)
                room -= len(pending)
            else:
                taken[name] = {pending.pop() for _ in range(room)}
                room = 0
            if room == 0:
                break
        return taken

    def requeue(self, changes: Mapping[str, Mapping[str, Target | None]]) -> None:
        """Changes taken but not written (the store refused): written with the next ones."""
        for source, found in changes.items():
            self.note(source).update(found)
        self.due = True

    def write(self, changes: Changes, whole: Callable[[], dict[str, list[Target]]]) -> None:
        """Save ``changes`` (a delta store) or ``whole()`` sets; nothing when none changed."""
        if self.store is None or not changes:
            return  # the store holds these sets already
        if isinstance(self.store, LastKnownChanges) and self.store.save_changes(changes):
            return
        self._chunked = False  # whole sets from now on: one write holds every change
        self.store.save(whole())
