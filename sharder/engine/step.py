"""A change as one value: what the reconcile loop hands to whoever commits and publishes it.

:class:`Placement` is what :meth:`sharder.live.placer.Placer.place` returns; :class:`Step` is
what :meth:`sharder.live.reconcile.Reconciler.step` returns: the assignment, the one it was
placed from, what may differ between them, the targets it places and the per-source set
changes not stored yet. Frozen, read forward: nothing is read back from the placer or the
loop after the call (no side outputs, no callbacks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from sharder.engine.assignment import Assignment
from sharder.engine.planning import PlanSummary
from sharder.model.inventory import Target

SetChanges = Mapping[str, Mapping[str, Target | None]]
"""source -> identity -> target (None: gone from the source)."""
NO_SETS: SetChanges = MappingProxyType({})


@dataclass(frozen=True)
class Placement:
    assignment: Assignment
    touched: frozenset[str] | None
    """Identities whose shard may differ from the previous assignment (None: unknown, a
    full placement)."""
    changed: frozenset[str] | None
    """``touched`` plus the targets whose fields changed (labels): what SD must rebuild."""


@dataclass(frozen=True)
class Step:
    base: Assignment | None
    """The assignment this one was placed from (``touched``/``changed`` are relative to it)."""
    assignment: Assignment
    summary: PlanSummary
    touched: frozenset[str] | None
    changed: frozenset[str] | None
    targets: Mapping[str, Target]
    """identity -> target of ``assignment``, read-only."""
    sets: SetChanges = field(default_factory=lambda: NO_SETS)
    """Per-source set changes the committer stores with this step (empty when the loop was
    given a store of its own)."""

    def delta_of(self, base: Assignment | None) -> tuple[Assignment, frozenset[str]] | None:
        """(base, touched) when ``base`` is the one this step was placed from, else None."""
        if base is None or base is not self.base or self.touched is None:
            return None
        return base, self.touched

    def sd_delta_of(self, base: Assignment | None) -> tuple[Assignment, frozenset[str]] | None:
        """(base, changed) for the SD rebuild, when ``base`` is this step's base."""
        if base is None or base is not self.base or self.changed is None:
            return None
        return base, self.changed
