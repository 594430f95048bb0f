"""The result of assigning targets to shards: plain data, saved as ``assignment.json``.

Produced by ``sharder.assign``, compared by ``sharder.plan.diff``, read by the renderers
and persisted by the CLI/controller so the next run is sticky and its algorithm pinned.

A *shard* is a logical slice of one region's targets. With replication factor r each
shard runs as r identical *children* (an HA pair for r=2) that differ only in their
``replica`` external label, which is what Prometheus/Thanos deduplication expects.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer


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
    targets: dict[str, str]
    """target identity -> shard id."""
    weights: dict[str, int] = Field(default_factory=dict)
    """target identity -> weight (GPU count, at least 1), so plans can report load."""
    drained: list[str] = Field(default_factory=list)
    """shard ids that exist but were given no targets (sorted); undraining one makes it new."""

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
        totals = dict.fromkeys(self.shards, 0)
        for identity, shard in self.targets.items():
            totals[shard] += self.weights.get(identity, 1)
        return totals

    def children(self, shard: str) -> list[tuple[str, int]]:
        """(child id, replica index) for a shard: ``<shard>`` alone, or ``<shard>-r<k>``."""
        if self.replication_factor == 1:
            return [(shard, 0)]
        return [(f"{shard}-r{k}", k) for k in range(self.replication_factor)]
