"""Operator changes: a request body -> the new desired state. Pure.

Every change is a plan first (``POST /v1/plan``); drains and pins through their own
routes build the same :class:`ChangeRequest`. Validation here names the field and the
value; what needs the targets (pins of unknown targets) is checked by the controller.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from federation.controller.base.state import Desired
from sharder.engine.assignment import Assignment
from sharder.model.spec import FederationSpec

MAX_SHARDS_PER_REGION = 10_000
MAX_ENTRIES = 10_000
"""Entries one change may list per field (pins, drains, weights...): a plan holds the lock."""
MAX_STEPS = 1_000
"""add_shard/remove_shard entries: one per shard added, so a region grows by at most this much."""
MAX_ID = 1000
"""Characters of one target identity or shard id a change may name."""
MAX_NAME = 200
"""Characters of one region name."""
Identity = Annotated[str, Field(max_length=MAX_ID)]
Name = Annotated[str, Field(max_length=MAX_NAME)]
Items = Annotated[list[Identity], Field(max_length=MAX_ENTRIES)]


class ChangeError(ValueError):
    def __init__(self, message: str, *, field: str) -> None:
        self.field = field
        super().__init__(message)


class ChangeRequest(BaseModel):
    """What an operator wants changed; everything left out stays as it is."""

    model_config = ConfigDict(extra="forbid")

    # StrictInt: JSON ``true`` is not a count (pydantic's lax mode would read it as 1).
    shard_counts: dict[Name, StrictInt] = Field(
        default_factory=dict, max_length=MAX_ENTRIES, description="region -> shards"
    )
    add_shard: list[Name] = Field(
        default_factory=list, max_length=MAX_STEPS, description="regions that get one more shard"
    )
    remove_shard: list[Name] = Field(
        default_factory=list, max_length=MAX_STEPS, description="regions that lose their last shard"
    )
    drain: Items = Field(default_factory=list, description="shard ids to empty (the child keeps running)")
    undrain: Items = Field(default_factory=list)
    pin: dict[Identity, Identity] = Field(
        default_factory=dict, max_length=MAX_ENTRIES, description="target identity -> shard id"
    )
    unpin: Items = Field(default_factory=list)
    weights: dict[Identity, StrictInt | None] = Field(
        default_factory=dict,
        max_length=MAX_ENTRIES,
        description="target identity -> weight (null: back to the GPU count)",
    )
    use_observed_weights: bool = Field(
        default=False,
        description="set weights from the samples/s the children report (see GET /v1/load); "
        "explicit weights win, and overloaded shards shed their excess",
    )
    reason: str = Field(default="", max_length=500, description="free text kept in the audit log")

    def is_empty(self) -> bool:
        return not (
            self.shard_counts
            or self.add_shard
            or self.remove_shard
            or self.drain
            or self.undrain
            or self.pin
            or self.unpin
            or self.weights
            or self.use_observed_weights
        )


def region_counts(assignment: Assignment | None) -> dict[str, int]:
    counts: dict[str, int] = {}
    if assignment is not None:
        for info in assignment.shards.values():
            counts[info.region] = counts.get(info.region, 0) + 1
    return counts


def apply_request(
    desired: Desired, change: ChangeRequest, *, spec: FederationSpec, assignment: Assignment | None
) -> Desired:
    regions = set(spec.region_names())
    shards = set(assignment.shards) if assignment is not None else set()
    counts = dict(desired.shard_counts)
    current = {**region_counts(assignment), **counts}

    def known_region(region: str, field: str) -> str:
        if region not in regions:
            raise ChangeError(
                f"unknown region {region!r} (regions: {', '.join(sorted(regions))})", field=field
            )
        return region

    for region, count in change.shard_counts.items():
        known_region(region, f"shard_counts.{region}")
        if count < 1 or count > MAX_SHARDS_PER_REGION:
            raise ChangeError(
                f"a region needs 1 to {MAX_SHARDS_PER_REGION} shards (value {count})",
                field=f"shard_counts.{region}",
            )
        counts[region] = count
    for i, region in enumerate(change.add_shard):
        known_region(region, f"add_shard[{i}]")
        counts[region] = counts.get(region, current.get(region, 0)) + 1
        if counts[region] > MAX_SHARDS_PER_REGION:
            raise ChangeError(
                f"region {region!r} would have {counts[region]} shards; the most is {MAX_SHARDS_PER_REGION}",
                field=f"add_shard[{i}]",
            )
    for i, region in enumerate(change.remove_shard):
        known_region(region, f"remove_shard[{i}]")
        now = counts.get(region, current.get(region, 0))
        if now <= 1:
            raise ChangeError(f"region {region!r} keeps at least one shard", field=f"remove_shard[{i}]")
        counts[region] = now - 1
    drained = set(desired.drained)
    for i, shard in enumerate(change.drain):
        if shard not in shards:
            raise ChangeError(f"unknown shard {shard!r}", field=f"drain[{i}]")
        drained.add(shard)
    for i, shard in enumerate(change.undrain):
        if shard not in drained:
            raise ChangeError(f"shard {shard!r} is not drained", field=f"undrain[{i}]")
        drained.discard(shard)
    pins = dict(desired.pins)
    for identity in change.unpin:
        pins.pop(identity, None)
    for identity, shard in change.pin.items():
        if shard not in shards:
            raise ChangeError(f"unknown shard {shard!r}", field=f"pin.{identity}")
        pins[identity] = shard
    weights = dict(desired.weights)
    for identity, weight in change.weights.items():
        if weight is None:
            weights.pop(identity, None)
        elif not 1 <= weight <= 10_000:
            raise ChangeError(f"a weight is 1 to 10000 (value {weight})", field=f"weights.{identity}")
        else:
            weights[identity] = weight
    return Desired(
        shard_counts=dict(sorted(counts.items())),
        pins=dict(sorted(pins.items())),
        drained=sorted(drained),
        weights=dict(sorted(weights.items())),
    )
