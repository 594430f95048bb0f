"""Shard counts for ``targets_per_shard`` sizing, with hysteresis for a live fleet.

Every shard added or removed moves targets (their children lose recent history), so a
fleet hovering at a boundary must not flip the count every few minutes. For a sized
region (no fixed ``shards`` in the spec) with ``n`` GPU nodes, ``t`` targets per shard
and ``c`` shards now:

* **grow** at once when ``n > c * t * (1 + grow_margin)``, to ``ceil(n / t)``;
* **shrink** only when ``n <= s * t * (1 - shrink_margin)`` for some ``s < c`` (even
  one shard fewer would stay well below the target) and that has held continuously for
  ``shrink_after_s``; then to the smallest such ``s``.

Right after growing to ``ceil(n / t)`` neither rule fires, so the count is stable
inside the band. Pure: the caller passes ``now``; used by ``sharder.live.reconcile``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from sharder.engine.assignment import Assignment
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec

MAX_SHARDS_BOUND = 100_000
"""The most ``--max-shards-per-region`` accepts. A guard against a typo, not a size: the
shipped spec (12 nodes a child) needs about 13,900 shards a sized region at a million
targets, and 1.25x room over that is 17,400, so the bound sits well above what a real
fleet asks for while still refusing an unbounded count (each shard is a child)."""


@dataclass(frozen=True)
class Hysteresis:
    grow_margin: float = 0.10
    """Grow once the nodes exceed the per-shard target by this fraction."""
    shrink_margin: float = 0.25
    """Shrink only when the smaller count would still be this fraction below the target."""
    shrink_after_s: float = 600.0
    """... continuously for this long."""
    max_shards: int = 2000
    """Shards a sized region grows to at most (``--max-shards-per-region``): past it the
    registry refuses new nodes (429) and other sources overfill the shards instead of
    growing the topology (each shard is a child to render, start and hand over to)."""

    def __post_init__(self) -> None:
        if (
            not all(math.isfinite(x) for x in (self.grow_margin, self.shrink_margin, self.shrink_after_s))
            or self.grow_margin < 0
            or not 0 <= self.shrink_margin < 1
            or self.shrink_after_s < 0
            or self.max_shards < 1
        ):
            raise ValueError(f"hysteresis out of range: {self}")


class ShardSizer:
    """Per-region shard counts for sized regions; remembers when shrinking became possible."""

    def __init__(
        self, spec: FederationSpec, rules: Hysteresis, *, previous: Assignment | None = None
    ) -> None:
        self.rules = rules
        self.per_shard = spec.sharding.targets_per_shard
        self.sized = [r.name for r in spec.regions if r.shards is None]
        self.applied: dict[str, int] = {}
        if previous is not None:
            for info in previous.shards.values():
                if info.region in self.sized:
                    self.applied[info.region] = max(self.applied.get(info.region, 0), info.index + 1)
        self._below_since: dict[str, float] = {}

    def counts(self, targets: Mapping[str, Target] | Iterable[Target], *, now: float) -> dict[str, int]:
        values = targets.values() if isinstance(targets, Mapping) else targets
        nodes: dict[str, set[str]] = {region: set() for region in self.sized}
        for target in values:
            bucket = nodes.get(target.region)
            if bucket is not None:
                bucket.add(target.node)
        return self.counts_of({region: len(members) for region, members in nodes.items()}, now=now)

    def counts_of(self, nodes: Mapping[str, int], *, now: float) -> dict[str, int]:
        """The same from distinct-node counts per region (a caller that keeps them up to date)."""
        return {region: self._count(region, nodes.get(region, 0), now=now) for region in self.sized}

    def _count(self, region: str, n: int, *, now: float) -> int:
        t = self.per_shard
        raw = min(self.rules.max_shards, max(1, math.ceil(n / t)))
        current = self.applied.get(region)
        if current is None:
            return raw
        if n > current * t * (1 + self.rules.grow_margin):
            self._below_since.pop(region, None)
            return raw
        smaller = min(self.rules.max_shards, max(1, math.ceil(n / (t * (1 - self.rules.shrink_margin)))))
        if smaller >= current:
            self._below_since.pop(region, None)
            return current
        since = self._below_since.setdefault(region, now)
        if now >= since + self.rules.shrink_after_s:
            del self._below_since[region]
            return smaller
        return current

    def next_shrink_at(self) -> float | None:
        """When a pending shrink falls due (clock of ``now``), None when none is pending."""
        if not self._below_since:
            return None
        return min(self._below_since.values()) + self.rules.shrink_after_s


def region_refusal(
    spec: FederationSpec, rules: Hysteresis, region: str, *, known: Collection[str], new: Iterable[str]
) -> str | None:
    """Why ``new`` nodes may not join a sized ``region`` that holds ``known`` nodes (it would
    need more than ``rules.max_shards`` shards), or None."""
    if not any(r.name == region and r.shards is None for r in spec.regions):
        return None
    most = rules.max_shards * spec.sharding.targets_per_shard
    fresh = {n for n in new if n not in known}
    if not fresh or len(known) + len(fresh) <= most:
        return None
    return (
        f"region {region!r} is at its cap of {rules.max_shards} shards of "
        f"{spec.sharding.targets_per_shard} nodes (--max-shards-per-region): {len(known)} nodes "
        f"placed, {len(fresh)} more refused; --max-shards-per-region="
        f"{math.ceil((len(known) + len(fresh)) / spec.sharding.targets_per_shard)} would fit them"
    )
