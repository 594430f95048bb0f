"""What a load-aware plan takes off overloaded shards before the sticky assignment runs. Pure.

The assignment engine keeps every target on its shard while the shard stays under the
keep limit, ``max(c x mean, ceil(mean) + heaviest - 1)`` (``sharder.fill.keep_limit``):
generous on purpose, so that a rerun moves nothing. With load-aware weights that bound
is the problem: one target that really weighs 10 units lifts the limit by 9, and the
shard it sits on keeps its full share of other targets besides. New weights alone would
then move nothing at all (``gpufed bench balance`` reports this as
``load_aware_sticky_max_over_mean``).

So a load-aware plan first *sheds*: per shard, it keeps targets heaviest first while the
shard stays within ``c x`` its region's mean, always keeping its heaviest target that
is not pinned (a target cannot be split, and moving the heaviest costs the most
history), and pinned targets whatever their weight. The targets shed are left without
a previous shard, and the engine places them as it places new targets: ring owner
under the fill capacity, else the clockwise walk. Everything else stays, so only the
overload moves; the result is stable under later reruns because every shard ends
within the keep limit.
"""

from __future__ import annotations

from collections.abc import Collection

from sharder.assignment import Assignment
from sharder.hashing import key_hash


def shed(assignment: Assignment, *, load_factor: float, pinned: Collection[str] = ()) -> Assignment:
    """``assignment`` without the targets each shard holds above ``load_factor`` x its region's mean.

    Weights are ``assignment.weights`` (run the engine with the new weights first, so that
    they are the ones in force). Drained shards keep nothing. Returns a copy; the input
    is not changed.
    """
    members: dict[str, list[str]] = {shard: [] for shard in assignment.shards}
    for identity, shard in assignment.targets.items():
        members[shard].append(identity)
    weight = assignment.weights
    totals: dict[str, int] = {}
    active: dict[str, int] = {}
    for shard, info in assignment.shards.items():
        if shard in assignment.drained:
            continue
        active[info.region] = active.get(info.region, 0) + 1
        totals[info.region] = totals.get(info.region, 0) + sum(weight.get(i, 1) for i in members[shard])
    kept: dict[str, str] = {}
    for shard, identities in members.items():
        region = assignment.shards[shard].region
        if shard in assignment.drained or not active.get(region):
            continue
        limit = load_factor * totals[region] / active[region]
        ordered = sorted(identities, key=lambda i: (i not in pinned, -weight.get(i, 1), key_hash(i), i))
        load = 0
        heaviest_kept = False
        for identity in ordered:
            w = weight.get(identity, 1)
            if identity in pinned:
                kept[identity] = shard
            elif not heaviest_kept or load + w <= limit:
                kept[identity] = shard
                heaviest_kept = True
            else:
                continue
            load += w
    return assignment.model_copy(update={"targets": kept})
