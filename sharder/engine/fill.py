"""The bounded-load fill shared by every placement strategy and by the incremental path.

``sharder.engine.assigning`` builds one :class:`Fill` per region and runs its stages; the
incremental assigner (``sharder.engine.incremental``) runs the same stages on the few targets a
change touches, starting from loads it keeps up to date, so both give equal results.

Stages, each offering every target that is still unplaced one shard:

0. ``pin``: pinned targets go to their shard whatever its load.
1. ``fill_fresh`` (only with a previous assignment and a new or undrained shard): the new
   shard takes its share, about the mean load, from the most loaded shards, one target
   at a time (heaviest shard first, ties to the lower index; from each, its last target
   in ring order). Those shards would have shed targets under the lower capacity anyway,
   so the new shard's share is most of what moves.
2. ``offer(was)``: every target stays on its previous shard while that fits under
   :func:`keep_limit`, so a rerun keeps everything (even after a raise) and a shard sheds
   only when the fleet shrinks or a shard is added.
3. ``offer(primary)``: the rest go to their first choice (ring owner) while that fits.
4. ``walk``: the rest take their first candidate with room, in ring order.

**Capacity** of a fill is :func:`base_capacity`, below ``c x mean``. When the walk finds
no shard with room for a target (rare; only a heavy target near the end of a tight
fill), the capacity rises to the least it takes, the least loaded shard's load plus the
target's weight. Targets already on a shard stay up to :func:`keep_limit`.
Contention for a shard is settled in ring order (``order``), so results depend on the set
of targets, never on their order.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, compress, count

Order = Callable[[list[int]], list[int]]
"""Sorts target indices into ring order (the order contention is settled in)."""


def base_capacity(total: int, *, shards: int, load_factor: float) -> int:
    """Most weight a fill puts on one shard before the walk has to raise it.

    ``c x total / (S + 1)``: the capacity the shards would have with one more shard, so
    that adding one later finds no shard it must strip below the load factor; with few
    shards that is below the mean, so never less than half the load factor's slack.
    """
    if total == 0 or shards == 0:
        return 0
    mean = total / shards
    return max(
        int(load_factor * total / (shards + 1)), int((1 + load_factor) / 2 * mean), -(-total // shards)
    )


def keep_limit(total: int, *, shards: int, heaviest: int, load_factor: float) -> int:
    """Most weight a shard may keep: ``c x mean``, or ``ceil(mean) + heaviest - 1``.

    The second bound is what v1 filled shards up to, and above what a walk may raise the
    capacity to (the least loaded shard's load plus a weight, at most
    ``(total - heaviest) // S + heaviest``); keeping up to it makes a rerun on the same
    fleet, or the first run after upgrading from v1, move nothing.
    """
    if total == 0 or shards == 0:
        return 0
    return max(int(load_factor * total / shards), -(-total // shards) + heaviest - 1)


class Fill:
    """Placement state of one region: per-shard load, capacity, and each target's shard."""

    __slots__ = ("cap", "load", "order", "result", "weights")

    def __init__(self, weights: Sequence[int], *, order: Order, load: list[int], cap: int) -> None:
        self.weights = weights
        self.order = order
        self.load = load
        self.cap = cap
        self.result = [-1] * len(weights)

    def pin(self, pinned: Sequence[int]) -> None:
        """Pinned targets go first, whatever the capacity; their weight then counts against it."""
        load, result, weights = self.load, self.result, self.weights
        for j, shard in enumerate(pinned):
            if shard >= 0:
                result[j] = shard
                load[shard] += weights[j]

    def offer(self, wanted: Sequence[int], *, limit: int | None = None) -> None:
        """Place unplaced target j on ``wanted[j]`` where it fits; -1 offers nothing.

        A shard whose offers all fit (under ``limit``, default the capacity) takes them
        all; a contended one takes them in ring order while they fit, so only contended
        shards need sorting.
        """
        load, weights, result = self.load, self.weights, self.result
        cap = self.cap if limit is None else limit
        demand = [0] * (len(load) + 1)  # the extra slot soaks up the -1s
        for shard, weight in zip(wanted, weights, strict=False):  # equal lengths; strict costs
            demand[shard] += weight
        full = {s for s, extra in enumerate(demand[:-1]) if extra and load[s] + extra > cap}
        first = demand[-1] == 0 and result.count(-1) == len(result)
        if first:
            # Everyone is offered a shard and nobody is placed yet (a first fill): copy in
            # C, then settle the contended shards, taking their losers back out.
            result[:] = wanted
            contended = list(compress(count(), map(full.__contains__, wanted))) if full else []
        else:
            contended = []
            for j, shard in enumerate(wanted):
                if shard >= 0:
                    if shard in full:
                        contended.append(j)
                    else:
                        result[j] = shard
        for s, extra in enumerate(demand[:-1]):
            if extra and s not in full:
                load[s] += extra
        groups: dict[int, list[int]] = {s: [] for s in sorted(full)}
        for j in contended:
            groups[wanted[j]].append(j)
        for shard, group in groups.items():
            self._settle(shard, self.order(group), cap=cap, placed=first)

    def _settle(self, shard: int, ordered: list[int], *, cap: int, placed: bool) -> None:
        """A contended shard takes its offers in ring order while they fit.

        The longest prefix that fits is found in C (running sums, binary search); only the
        rest is looked at one by one. ``placed``: the offers are already in ``result``
        and the ones that do not fit are taken out.
        """
        weights, result = self.weights, self.result
        room = cap - self.load[shard]
        sums = list(accumulate(map(weights.__getitem__, ordered)))
        k = bisect.bisect_right(sums, room)
        load = self.load[shard] + (sums[k - 1] if k else 0)
        if not placed:
            for j in ordered[:k]:
                result[j] = shard
        for j in ordered[k:]:
            weight = weights[j]
            if load + weight <= cap:
                load += weight
                result[j] = shard
            elif placed:
                result[j] = -1
        self.load[shard] = load

    def unplaced(self, wanted: Sequence[int]) -> list[int]:
        """``wanted`` with -1 wherever the target is already placed."""
        return [-1 if r >= 0 else w for r, w in zip(self.result, wanted, strict=True)]

    def walk(
        self, candidates: Callable[[int], Iterable[int]], *, first: Callable[[int, int], int] | None = None
    ) -> None:
        """Each unplaced target, in ring order, takes its first candidate with room.
        ``first(j, room)``: that candidate found another way (-1: none), the same answer."""
        load, weights, result = self.load, self.weights, self.result
        for j in self.order(list(compress(count(), map((-1).__eq__, result)))):
            weight = weights[j]
            room = self.cap - weight
            if first is not None:
                shard = first(j, room)
            else:
                shard = next((s for s in candidates(j) if load[s] <= room), -1)
            if shard < 0:
                self.cap = min(load) + weight
                room = self.cap - weight
                shard = next(s for s in candidates(j) if load[s] <= room)
            load[shard] += weight
            result[j] = shard

    def fill_fresh(self, was: list[int], fresh: Sequence[bool], *, total: int) -> None:
        """New shards take their share (up to ``total // S``) from the most loaded shards.

        From each donor the new shard takes one of its last targets in ring order, the
        lighter or the heavier kind as keeps its mean weight at the region's (so it moves
        about as many targets as its share in count, not only in weight). Rewrites ``was``
        so that the keep stage puts the chosen targets on the new shard.
        """
        shards, count = len(self.load), len(self.weights)
        level = total // shards if shards else 0
        weights, cap = self.weights, self.cap
        demand = list(self.load)  # pins so far
        sizes = [0] * shards
        members: list[list[int]] = [[] for _ in range(shards)]
        for j, shard in enumerate(was):
            if shard >= 0 and self.result[j] < 0:
                demand[shard] += weights[j]
                members[shard].append(j)
        for shard in self.result:
            if shard >= 0:
                sizes[shard] += 1
        takers = [(demand[s], s) for s in range(shards) if fresh[s] and demand[s] < level]
        donors = [(-demand[s], s) for s in range(shards) if not fresh[s] and members[s]]
        heapq.heapify(takers)
        heapq.heapify(donors)
        ordered: dict[int, list[int]] = {}
        while takers and donors:
            have, taker = takers[0]
            donor = donors[0][1]
            queue = ordered.get(donor)
            if queue is None:  # ascending ring order: the end is the last in ring order
                queue = ordered[donor] = self.order(members[donor])
            heavy = have * count < sizes[taker] * total  # lighter than the mean so far
            pick = _pick(queue, weights, heavy=heavy, count=count, total=total)
            j = queue[pick]
            weight = weights[j]
            if demand[donor] - weight <= have or have + weight > cap:
                heapq.heappop(takers)  # nothing left worth moving to this one
                continue
            del queue[pick]
            was[j] = taker
            demand[donor] -= weight
            demand[taker] = have + weight
            sizes[taker] += 1
            if queue:
                heapq.heapreplace(donors, (-demand[donor], donor))
            else:
                heapq.heappop(donors)
            if demand[taker] < level:
                heapq.heapreplace(takers, (demand[taker], taker))
            else:
                heapq.heappop(takers)


_LOOK = 8  # how far back from a donor's last target the kind of weight is looked for


def _pick(queue: list[int], weights: Sequence[int], *, heavy: bool, count: int, total: int) -> int:
    """Index in ``queue`` of the last target of the wanted kind among its last few, else the last."""
    for back in range(1, min(_LOOK, len(queue)) + 1):
        above = weights[queue[-back]] * count >= total
        if above == heavy:
            return len(queue) - back
    return len(queue) - 1
