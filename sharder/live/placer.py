"""The reconcile loop's placement step: a delta in, the next assignment out.

The loop (``sharder.live.reconcile``) decides *when* to place and *what* changed (the merged
targets, grace periods, hysteresis counts); the :class:`Placer` decides *how*:

* labels only changed: the assignment stays, SD rebuilds the relabelled targets;
* shard counts and overrides unchanged: the ``IncrementalAssigner`` applies the change,
  at the cost of the change, with a result equal to a full sticky assignment;
* otherwise (counts or overrides changed, no engine base, a custom ``assign_fn``): a full
  sticky placement, which becomes the engine's new base.

The operator's overrides (pins, drains, weights, shard counts) are data held here, so an
unchanged override never forces a full placement. Not thread-safe on its own: the loop
calls it under its lock or from its one ticking thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from sharder.engine import overriding
from sharder.engine.assigning import assign
from sharder.engine.assignment import Assignment
from sharder.engine.incremental import IncrementalAssigner
from sharder.engine.step import Placement
from sharder.engine.targetsets import Delta
from sharder.kernel.errors import SharderError
from sharder.model.inventory import Target, sort_targets
from sharder.model.spec import FederationSpec

log = logging.getLogger(__name__)


class AssignFn(Protocol):
    """How the loop assigns; ``shard_counts`` carries the hysteresis decision per region."""

    def __call__(
        self,
        spec: FederationSpec,
        targets: Sequence[Target],
        *,
        previous: Assignment | None,
        shard_counts: Mapping[str, int],
    ) -> Assignment: ...


def sticky_assign(
    spec: FederationSpec,
    targets: Sequence[Target],
    *,
    previous: Assignment | None,
    shard_counts: Mapping[str, int],
) -> Assignment:
    """Default ``assign_fn``: sticky ``sharder.engine.assigning.assign`` with the hysteresis counts."""
    return assign(spec, targets, previous=previous, shard_counts=shard_counts)


class Placer:
    def __init__(self, spec: FederationSpec, *, assign_fn: AssignFn = sticky_assign) -> None:
        self.spec = spec
        self._assign_fn = assign_fn
        self.overrides = overriding.Overrides()
        self.engine: IncrementalAssigner | None = None
        self._full_due = False
        """The overrides changed since the last placement: the next one runs in full."""

    def set_overrides(self, checked: overriding.Overrides) -> None:
        """Unchanged overrides keep the engine; changed ones make the next placement full."""
        if checked != self.overrides:
            self.overrides = checked
            self.engine = None
            self._full_due = True

    def forget(self) -> None:
        """The base changed hands (an applied plan, a stored state): the engine is rebuilt
        from it at the next change, without placing again."""
        self.engine = None
        self._full_due = False

    def place(
        self,
        *,
        previous: Assignment | None,
        applied: Mapping[str, Target],
        targets: Mapping[str, Target],
        counts: dict[str, int],
        applied_counts: Mapping[str, int],
        delta: Delta,
    ) -> Placement:
        """The next assignment for ``targets`` and what may differ from ``previous``;
        ``applied`` and ``applied_counts``: what ``previous`` was made from."""
        if self._assign_fn is not sticky_assign:
            ordered = sort_targets(targets.values())
            return Placement(self._assign_fn(self.spec, ordered, previous=previous, shard_counts=counts),
                             touched=None, changed=None)  # fmt: skip
        if previous is not None and counts == applied_counts:
            added, removed, relabelled = delta
            if not added and not removed:  # labels only: placement cannot change
                return Placement(previous, touched=frozenset(), changed=frozenset(relabelled))
            if self.engine is None and not self._full_due:
                self.engine = self.engine_from(previous, applied, counts)
            if self.engine is not None and self.engine.assignment is previous:
                result = self.engine.apply(added=added, removed=removed)
                touched = self.engine.touched
                if touched is None:
                    return Placement(result, touched=None, changed=None)
                return Placement(result, touched=frozenset(touched), changed=frozenset(touched | relabelled))
        o = self.overrides
        self._full_due = False
        self.engine = IncrementalAssigner(
            self.spec,
            sort_targets(targets.values()),
            previous=previous,
            shard_counts={**counts, **o.shard_counts},
            pins=o.pins,
            drained=o.drained,
            weight_overrides=o.weights,
        )
        return Placement(self.engine.assignment, touched=None, changed=None)

    def prepare(self, previous: Assignment, applied: Mapping[str, Target], counts: Mapping[str, int]) -> None:
        """Index ``previous`` for the engine now (an idle loop after a restart)."""
        if self.engine is None and not self._full_due:
            self.engine = self.engine_from(previous, applied, counts)

    def engine_from(
        self, assignment: Assignment, targets: Mapping[str, Target], counts: Mapping[str, int]
    ) -> IncrementalAssigner | None:
        """The engine over ``assignment`` as it stands (no placement), or None when the
        assignment does not cover exactly ``targets`` (then the next change places in full)."""
        if assignment.targets.keys() != targets.keys():
            return None
        o = self.overrides
        try:
            return IncrementalAssigner.adopting(
                self.spec,
                list(targets.values()),
                assignment,
                shard_counts={**counts, **o.shard_counts},
                pins=o.pins,
                drained=o.drained,
                weight_overrides=o.weights,
            )
        except SharderError as exc:
            log.warning("the stored assignment cannot seed the engine, placing in full: %s", exc)
            return None
