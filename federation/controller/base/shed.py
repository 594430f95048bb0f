"""What a load-aware plan takes off overloaded shards before the sticky assignment runs. Pure.

The assignment engine keeps every target on its shard while the shard stays under the
keep limit, ``max(c x mean, ceil(mean) + heaviest - 1)`` (``sharder.engine.fill.keep_limit``):
generous on purpose, so that a rerun moves nothing. With load-aware weights that bound
is the problem: one target that really weighs 10 units lifts the limit by 9, and the
shard it sits on keeps its full share of other targets besides. New weights alone then
move little or nothing (``gpufed bench balance`` reports what they reach as
``load_aware_sticky_max_over_mean``).

So a load-aware plan first *sheds*: a shard above ``c x`` its region's mean gives up
targets until it is within that bound, choosing each time the lightest target that
covers the rest of the excess on its own, or, when none does, the heaviest there is.
That moves few targets (one heavy one rather than thirty light ones; the samples that
move, and so the history continuity lost, are the excess either way). Never shed:

* pinned targets (an operator put them there);
* the shard's heaviest unpinned target: a target cannot be split, so one heavier than
  the bound would overload wherever it went; its neighbours leave instead, which is
  what leaves a node that scrapes 10x its GPU count's worth alone on its shard.

The targets shed lose their previous shard and the engine places them as it places new
targets: ring owner under the fill capacity, else the clockwise walk. Everything else
stays. The result is stable under later reruns, as every shard ends within the keep limit.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Mapping

from sharder.engine.assignment import Assignment
from sharder.engine.hashing import key_hash


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
    dropped: set[str] = set()
    for shard, identities in members.items():
        region = assignment.shards[shard].region
        if shard in assignment.drained or not active.get(region):
            dropped.update(identities)
            continue
        limit = load_factor * totals[region] / active[region]
        dropped.update(_excess(identities, weight, limit=limit, pinned=pinned))
    kept = {i: s for i, s in assignment.targets.items() if i not in dropped}
    return assignment.model_copy(update={"targets": kept})


def _excess(
    identities: list[str], weight: Mapping[str, int], *, limit: float, pinned: Collection[str]
) -> list[str]:
    """The targets one shard gives up to get within ``limit`` (best fit, see the module docstring)."""
    excess = sum(weight.get(i, 1) for i in identities) - limit
    if excess <= 0:
        return []
    # Ascending by weight; ties in hash order, so the choice never depends on input order.
    candidates = sorted((weight.get(i, 1), key_hash(i), i) for i in identities if i not in pinned)
    if candidates:
        candidates.pop()  # the heaviest unpinned target stays
    weights = [w for w, _, _ in candidates]
    out: list[str] = []
    while excess > 0 and candidates:
        at = bisect.bisect_left(weights, excess)
        at = at if at < len(candidates) else len(candidates) - 1
        w, _, identity = candidates.pop(at)
        del weights[at]
        out.append(identity)
        excess -= w
    return out
