"""What changes between two assignments: the plan that ``gpufed plan`` and REST print.

Pipeline: ``sharder.engine.assigning`` -> :func:`diff` (here, pure) -> CLI/REST show the plan, the
controller applies it. A plan is plain data: every list is sorted and every dict keyed in
shard order, so ``to_json_dict()`` is the same for the same two assignments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from sharder.engine.assignment import Assignment, ShardInfo


class PlanModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Move(PlanModel):
    identity: str
    from_shard: str
    to_shard: str


class Placement(PlanModel):
    identity: str
    shard: str


class PlanCounts(PlanModel):
    targets_before: int
    targets_after: int
    moved: int
    added: int
    removed: int
    unchanged: int
    shards_added: int
    shards_removed: int
    moved_fraction: float
    """moved / targets present both before and after; 0 when there are none."""


class Plan(PlanModel):
    algorithm: str
    algorithm_version: int
    algorithm_changed: bool
    moves: list[Move]
    added_targets: list[Placement]
    removed_targets: list[Placement]
    added_shards: list[str]
    removed_shards: list[str]
    load_before: dict[str, int]
    """shard id -> total weight (GPUs) before; shards that did not exist are absent."""
    load_after: dict[str, int]
    counts: PlanCounts

    @property
    def changed(self) -> bool:
        """Whether applying the plan would change any child's targets or the shard set."""
        c = self.counts
        return bool(c.moved or c.added or c.removed or c.shards_added or c.shards_removed)

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (for ``gpufed plan --json`` and the REST API)."""
        return self.model_dump(mode="json")


def _shard_order(infos: Mapping[str, ShardInfo]) -> list[str]:
    """Shard ids by region then numeric index (``a-2`` before ``a-10``)."""
    return sorted(infos, key=lambda name: (infos[name].region, infos[name].index, name))


Changed = list[tuple[str, str]]
"""(identity, shard) pairs, sorted by identity."""


def _changes(
    old: Assignment | None, new: Assignment, only: set[str] | None
) -> tuple[Changed, Changed, Changed]:
    """(moved, added, removed), each (identity, shard in ``new`` or, when removed, ``old``)."""
    before = old.targets if old is not None else {}
    after = new.targets
    if only is not None and old is not None:
        new.derive_totals(old, only)
        looked = sorted(only)
        moved = [(i, after[i]) for i in looked if i in after and i in before and before[i] != after[i]]
        fresh = [(i, after[i]) for i in looked if i in after and i not in before]
        gone = [(i, before[i]) for i in looked if i in before and i not in after]
    elif old is None:
        moved, fresh, gone = [], sorted(after.items()), []
    else:
        # Filter, then sort only what changed: a re-plan of 800k unchanged targets sorts nothing.
        moved = sorted((i, s) for i, s in after.items() if i in before and before[i] != s)
        fresh = sorted((i, s) for i, s in after.items() if i not in before)
        gone = sorted((i, s) for i, s in before.items() if i not in after)
    return moved, fresh, gone


@dataclass(frozen=True)
class PlanSummary:
    """What the live loop keeps of a plan: its counts and the shard set's change. A first
    placement of a million targets spent seconds building a million ``Placement`` models
    that nothing read."""

    counts: PlanCounts
    added_shards: list[str]
    removed_shards: list[str]


def summarize(old: Assignment | None, new: Assignment, *, only: set[str] | None = None) -> PlanSummary:
    """:func:`diff`'s counts and shard lists, without the per-target lists."""
    moved, fresh, gone = _changes(old, new, only)
    if old is not None and old.shards is new.shards:  # the shard set kept (an incremental step)
        return PlanSummary(counts=_counts(old, new, moved=len(moved), added=len(fresh), removed=len(gone)),
                           added_shards=[], removed_shards=[])  # fmt: skip
    ordered = _ordered(old, new)
    return PlanSummary(
        counts=_counts(old, new, moved=len(moved), added=len(fresh), removed=len(gone)),
        added_shards=[s for s in ordered if old is None or s not in old.shards],
        removed_shards=[s for s in ordered if s not in new.shards],
    )


def _ordered(old: Assignment | None, new: Assignment) -> list[str]:
    return _shard_order({**(old.shards if old is not None else {}), **new.shards})


def _counts(old: Assignment | None, new: Assignment, *, moved: int, added: int, removed: int) -> PlanCounts:
    kept = len(new.targets) - added
    if old is not None and old.shards is new.shards:  # no pass over the shards of a kept set
        shards_added = shards_removed = 0
    else:
        old_shards = set(old.shards) if old is not None else set()
        shards_added = len(new.shards.keys() - old_shards)
        shards_removed = len(old_shards - new.shards.keys())
    return PlanCounts(
        targets_before=len(old.targets) if old is not None else 0,
        targets_after=len(new.targets),
        moved=moved,
        added=added,
        removed=removed,
        unchanged=kept - moved,
        shards_added=shards_added,
        shards_removed=shards_removed,
        moved_fraction=moved / kept if kept else 0.0,
    )


def diff(old: Assignment | None, new: Assignment, *, only: set[str] | None = None) -> Plan:
    """Moves, additions, removals and per-shard load from ``old`` (None: nothing yet) to ``new``.

    ``only``: the identities that may differ (the incremental engine knows them); the plan
    is the same, found in the time of the change instead of a pass over the fleet."""
    before = old.targets if old is not None else {}
    moved, fresh, gone = _changes(old, new, only)
    moves = [Move(identity=i, from_shard=before[i], to_shard=shard) for i, shard in moved]
    added = [Placement(identity=i, shard=s) for i, s in fresh]
    removed = [Placement(identity=i, shard=s) for i, s in gone]
    old_shards = set(old.shards) if old is not None else set()
    ordered = _ordered(old, new)
    old_load = old.load() if old is not None else {}
    changed = old is not None and (old.algorithm, old.algorithm_version) != (
        new.algorithm,
        new.algorithm_version,
    )
    new_load = new.load()
    return Plan(
        algorithm=new.algorithm,
        algorithm_version=new.algorithm_version,
        algorithm_changed=changed,
        moves=moves,
        added_targets=added,
        removed_targets=removed,
        added_shards=[s for s in ordered if s not in old_shards],
        removed_shards=[s for s in ordered if s not in new.shards],
        load_before={s: old_load[s] for s in ordered if s in old_load},
        load_after={s: new_load[s] for s in ordered if s in new_load},
        counts=_counts(old, new, moved=len(moves), added=len(added), removed=len(removed)),
    )
