"""Saving the reconcile loop's per-source sets: only what changed, at most every interval.

The loop (``sharder.reconcile``) notes which identities of which source changed; the
:class:`SetPersister` writes them to a delta store (``LastKnownChanges``, e.g. the
controller's SQLite rows) or, for a store that takes only whole sets, the whole sets.
Not thread-safe on its own: ``note``/``take`` run under the loop's lock, ``write`` outside
it (a slow store must not block sources).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from sharder.inventory import Target

Changes = dict[str, dict[str, Target | None]]
"""source -> identity -> target (None: gone from the source)."""


class LastKnownStore(Protocol):
    """Where the merged per-source sets survive a restart (``sharder.lastknown``)."""

    def save(self, sets: Mapping[str, Sequence[Target]]) -> None: ...


@runtime_checkable
class LastKnownChanges(Protocol):
    """A store that can take only what changed: source -> identity -> target (None: gone).
    ``save_changes`` returns False when it cannot, and the loop saves the whole sets."""

    def save_changes(self, changes: Mapping[str, Mapping[str, Target | None]]) -> bool: ...


class SetPersister:
    def __init__(self, store: LastKnownStore | None, *, interval_s: float) -> None:
        self.store = store
        self.interval_s = interval_s
        self._unsaved: dict[str, set[str]] = {}
        """source -> identities changed since the last write (what a delta store writes)."""
        self._saved_at = float("-inf")
        self.due = False
        """An assignment was applied since the last write."""

    def note(self, source: str) -> set[str]:
        """The set to add ``source``'s changed identities to."""
        return self._unsaved.setdefault(source, set())

    def wants(self, now: float) -> bool:
        return self.due and now >= self._saved_at + self.interval_s

    def next_at(self) -> float | None:
        """When the next write is due (loop clock), None when none is."""
        return self._saved_at + self.interval_s if self.due and self.store is not None else None

    def take(self, now: float, sets: Mapping[str, Mapping[str, Target]]) -> Changes:
        """What changed since the last write, as of ``sets`` now; marks it written."""
        unsaved, self._unsaved = self._unsaved, {}
        self._saved_at, self.due = now, False
        return {
            name: {i: sets.get(name, {}).get(i) for i in identities}
            for name, identities in unsaved.items()
            if identities
        }

    def write(self, changes: Changes, whole: Callable[[], dict[str, list[Target]]]) -> None:
        """Save ``changes`` (a delta store) or ``whole()`` sets; nothing when none changed."""
        if self.store is None or not changes:
            return  # the store holds these sets already
        if isinstance(self.store, LastKnownChanges) and self.store.save_changes(changes):
            return
        self.store.save(whole())
