"""Operator and control-plane overrides of an assignment, checked before any placement.

``sharder.engine.assigning.assign`` takes four keyword-only overrides; the reconcile loop and the
controller feed them from hysteresis and operator actions:

* ``shard_counts``: region -> shard count, replacing the spec's sizing (fixed count or
  ``targets_per_shard``) for that region.
* ``pins``: target identity -> shard id. A pinned target is placed on its shard before
  anything else and its weight counts against that shard's capacity, even when the pins
  alone exceed it. Pins of identities that are not among the targets are ignored (a
  target may be away for a grace period), but their shard must still exist.
* ``drained``: shard ids that keep existing (their child keeps running, so its history
  stays queryable) but receive no targets; their targets move to the other shards.
* ``weight_overrides``: identity -> weight (positive int), replacing the GPU count.

Everything is checked here, against the spec and the shard ids the counts produce, so a
bad value is refused with an :class:`AssignmentError` naming it before any work is done.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from sharder.kernel.errors import AssignmentError
from sharder.model.spec import FederationSpec


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class Overrides:
    """The checked overrides of one assignment run; empty ones change nothing."""

    shard_counts: Mapping[str, int] = field(default_factory=dict)
    pins: Mapping[str, str] = field(default_factory=dict)
    drained: frozenset[str] = frozenset()
    weights: Mapping[str, int] = field(default_factory=dict)

    def shard_count(self, spec: FederationSpec, region: str, *, nodes: int) -> int:
        count = self.shard_counts.get(region)
        return count if count is not None else spec.shard_count(region, nodes=nodes)

    def needs_nodes(self, spec: FederationSpec, region: str) -> bool:
        """Whether sizing this region counts its nodes (only ``targets_per_shard`` does)."""
        fixed = next(r.shards for r in spec.regions if r.name == region)
        return region not in self.shard_counts and fixed is None

    def check_shards(self, shards: Mapping[str, str]) -> None:
        """Refuse drains and pins that name no shard (``shards``: shard id -> region)."""
        for name in sorted(self.drained):
            if name not in shards:
                raise AssignmentError(f"drained shard {name!r} does not exist (shards: {_listing(shards)})")
        for identity, name in sorted(self.pins.items()):
            if name not in shards:
                raise AssignmentError(
                    f"target {identity!r} is pinned to shard {name!r}, which does not exist "
                    f"(shards: {_listing(shards)})"
                )
            if name in self.drained:
                raise AssignmentError(
                    f"target {identity!r} is pinned to shard {name!r}, which is drained; "
                    "unpin it or undrain the shard"
                )


def _listing(shards: Collection[str]) -> str:
    names = sorted(shards)
    shown = ", ".join(names[:8])
    return f"{shown}, ... ({len(names)} in all)" if len(names) > 8 else shown or "none"


def build(
    spec: FederationSpec,
    *,
    shard_counts: Mapping[str, int] | None,
    pins: Mapping[str, str] | None,
    drained: Collection[str] | None,
    weight_overrides: Mapping[str, int] | None,
) -> Overrides:
    """Check the overrides that need only the spec; shard names are checked per run."""
    regions = set(spec.region_names())
    counts = dict(shard_counts or {})
    for region, count in sorted(counts.items(), key=lambda kv: str(kv[0])):
        if region not in regions:
            raise AssignmentError(
                f"shard_counts names region {region!r}, which the spec does not define "
                f"(known regions: {', '.join(sorted(regions))})"
            )
        if not _positive_int(count):
            raise AssignmentError(
                f"shard_counts[{region!r}] must be a whole number of shards, at least 1 (value {count!r})"
            )
    weights = dict(weight_overrides or {})
    for identity, weight in weights.items():
        if not _positive_int(weight):
            raise AssignmentError(
                f"weight_overrides[{identity!r}] must be a whole number, at least 1 (value {weight!r})"
            )
    pinned = dict(pins or {})
    for identity, shard in pinned.items():
        if not isinstance(shard, str):
            raise AssignmentError(f"pins[{identity!r}] must be a shard id (value {shard!r})")
    if isinstance(drained, str):
        raise AssignmentError(
            f"drained must be a collection of shard ids, not one string (value {drained!r})"
        )
    names = frozenset(drained or ())
    for name in names:
        if not isinstance(name, str):
            raise AssignmentError(f"drained must hold shard ids (value {name!r})")
    return Overrides(shard_counts=counts, pins=pinned, drained=names, weights=weights)
