"""The result of assigning targets to shards: plain data, saved as ``assignment.json``.

Produced by ``sharder.engine.assigning``, compared by ``sharder.engine.planning.diff``, read by the renderers
and persisted by the CLI/controller so the next run is sticky and its algorithm pinned.

A *shard* is a logical slice of one region's targets. With replication factor r each
shard runs as r identical *children* (an HA pair for r=2) that differ only in their
``replica`` external label, which is what Prometheus/Thanos deduplication expects.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_serializer,
    model_serializer,
)


class ShardInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str
    index: int = Field(ge=0)


class Assignment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: str
    algorithm_version: int
    replication_factor: int = 1
    shards: dict[str, ShardInfo]
    """shard id -> where it lives; every shard, empty ones included."""
    targets: Mapping[str, str]
    """target identity -> shard id (a dict, or a :class:`~sharder.engine.cowmap.CowMap` from
    the incremental engine: read it as a mapping)."""
    weights: Mapping[str, int] = Field(default_factory=dict)
    """target identity -> weight (GPU count, at least 1), so plans can report load."""
    drained: list[str] = Field(default_factory=list)
    """shard ids that exist but were given no targets (sorted); undraining one makes it new."""

    @field_serializer("targets", "weights", mode="wrap")
    def _plain(self, value: Mapping[str, Any], handler: SerializerFunctionWrapHandler) -> Any:
        # a CowMap is written as the dict it stands for
        return handler(value if type(value) is dict else dict(value.items()))

    @model_serializer(mode="wrap")
    def _omit_no_drains(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Files from before drains existed stay byte-identical when nothing is drained.
        data = handler(self)
        if isinstance(data, dict) and not data.get("drained"):
            data.pop("drained", None)
        return data

    def members(self, shard: str) -> list[str]:
        return sorted(identity for identity, owner in self.targets.items() if owner == shard)

    def load(self) -> dict[str, int]:
        """shard -> summed weight of its targets (a copy of a per-instance cache)."""
        return dict(self._tally()[0])

    def sizes(self) -> dict[str, int]:
        """shard -> how many targets it has."""
        return dict(self._tally()[1])

    def totals(self) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """(load, size) per shard without a copy: the cached dicts, read-only by contract."""
        load, size = self._tally()
        return load, size

    def _tally(self) -> Totals:
        totals = _cached(self)
        if totals is None:
            load = dict.fromkeys(self.shards, 0)
            size = dict.fromkeys(self.shards, 0)
            weights = self.weights
            for identity, shard in self.targets.items():
                load[shard] += weights.get(identity, 1)
                size[shard] += 1
            totals = _remember(self, (load, size))
        return totals

    def derive_totals(self, previous: Assignment, touched: set[str]) -> None:
        """Fill the cache from ``previous``'s when only ``touched`` identities may differ
        (the incremental engine says which): the cost of the change, not of the fleet."""
        before = _cached(previous)
        if before is None or _cached(self) is not None:
            return
        if self.shards is previous.shards:  # the same shard set: a copy at C speed, no pass
            load, size = dict(before[0]), dict(before[1])
        else:
            load = {s: before[0].get(s, 0) for s in self.shards}
            size = {s: before[1].get(s, 0) for s in self.shards}
        for identity in touched:
            was = previous.targets.get(identity)
            if was is not None and was in load:
                load[was] -= previous.weights.get(identity, 1)
                size[was] -= 1
            now = self.targets.get(identity)
            if now is not None:
                load[now] += self.weights.get(identity, 1)
                size[now] += 1
        _remember(self, (load, size))

    def children(self, shard: str) -> list[tuple[str, int]]:
        """(child id, replica index) for a shard: ``<shard>`` alone, or ``<shard>-r<k>``."""
        if self.replication_factor == 1:
            return [(shard, 0)]
        return [(f"{shard}-r{k}", k) for k in range(self.replication_factor)]

    def ordinal(self, shard: str, replica: int) -> int:
        """A child's place in its region: shard index x replication factor + replica (the
        StatefulSet pod ordinal the Helm chart gives it)."""
        return self.shards[shard].index * self.replication_factor + replica


Totals = tuple[dict[str, int], dict[str, int]]
_TALLIES: OrderedDict[int, tuple[Assignment, Totals]] = OrderedDict()
"""(load, size) per shard of the few newest assignments, by object: a frozen assignment's
totals cannot go stale, and the live path asks for them several times per change.
Outside the model so that equality and serialisation stay the fields'."""
_KEEP = 2
_GUARD = threading.Lock()


def _cached(assignment: Assignment) -> Totals | None:
    with _GUARD:
        entry = _TALLIES.get(id(assignment))
    return entry[1] if entry is not None and entry[0] is assignment else None


def _remember(assignment: Assignment, totals: Totals) -> Totals:
    with _GUARD:
        _TALLIES[id(assignment)] = (assignment, totals)
        while len(_TALLIES) > _KEEP:
            _TALLIES.popitem(last=False)
    return totals
