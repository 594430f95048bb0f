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
inside the band. Pure: the caller passes ``now``; used by ``sharder.reconcile``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sharder.assignment import Assignment
from sharder.inventory import Target
from sharder.spec import FederationSpec


@dataclass(frozen=True)
class Hysteresis:
    grow_margin: float = 0.10
    """Grow once the nodes exceed the per-shard target by this fraction."""
    shrink_margin: float = 0.25
    """Shrink only when the smaller count would still be this fraction below the target."""
    shrink_after_s: float = 600.0
    """... continuously for this long."""

    def __post_init__(self) -> None:
        if self.grow_margin < 0 or not 0 <= self.shrink_margin < 1 or self.shrink_after_s < 0:
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
        raw = max(1, math.ceil(n / t))
        current = self.applied.get(region)
        if current is None:
            return raw
        if n > current * t * (1 + self.rules.grow_margin):
            self._below_since.pop(region, None)
            return raw
        smaller = max(1, math.ceil(n / (t * (1 - self.rules.shrink_margin))))
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
