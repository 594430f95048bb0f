"""Incremental re-assignment: the cost of a change is proportional to the change.

The reconcile loop holds one :class:`IncrementalAssigner` per spec and overrides and
feeds it what discovery reports (``apply(added=..., removed=...)``). Each result is
*equal* to ``assign(spec, all_targets, previous=<last result>, <same overrides>)``, the
from-scratch sticky assignment, because it runs the same stages of :mod:`sharder.engine.fill`:

* stage 0 and 2 (pins, keep) are the state itself: per shard, the load of its pinned
  targets and its other members sorted in ring order, kept up to date. A shard sheds only
  when it is above the keep limit after the change (the fleet shrank); then its members
  are walked in ring order exactly as the keep stage would.
* stages 3 and 4 (first choice, walk) run on the few unplaced targets (new ones and the
  shed ones) over the current loads, with the same :class:`~sharder.engine.fill.Fill` code.
* stage 1 (a new shard's share) never applies: the shard set does not change here.

Where the fast path cannot be exact it falls back to a full ``assign``: when sizing by
``targets_per_shard`` changes a region's shard count, for a strategy other than
``bounded-ring``, or when a change touches more than an eighth of the fleet (a full run
is then as cheap). Invalid changes raise :class:`AssignmentError` and leave the state
as it was.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from sharder.engine import assigning, overriding
from sharder.engine.assignment import Assignment
from sharder.engine.cowmap import DELETE, CowMap
from sharder.engine.fill import Fill, base_capacity, keep_limit
from sharder.engine.hashing import Ring, key_hash, shared_ring
from sharder.kernel.errors import AssignmentError
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec

Member = tuple[int, str]  # (key hash, identity): ring order, ties broken by identity


@dataclass
class _Region:
    """One region's part of the state: shards, ring, loads and ring-ordered members."""

    names: list[str]
    ring: Ring
    pinned_load: list[int]
    member_load: list[int]
    members: list[list[Member]]
    weights: Counter[int] = field(default_factory=Counter)
    nodes: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.pinned_load) + sum(self.member_load)


class IncrementalAssigner:
    """Sticky assignment that follows a changing fleet at the cost of each change."""

    def __init__(
        self,
        spec: FederationSpec,
        targets: Sequence[Target],
        *,
        previous: Assignment | None = None,
        allow_algorithm_change: bool = False,
        shard_counts: Mapping[str, int] | None = None,
        pins: Mapping[str, str] | None = None,
        drained: Collection[str] | None = None,
        weight_overrides: Mapping[str, int] | None = None,
        fallback_fraction: float = 0.125,
    ) -> None:
        """Assign ``targets`` in full once (sticky to ``previous``); later changes are incremental.

        A change of more than ``fallback_fraction`` of the fleet (plus 64) runs in full.
        """
        self.spec = spec
        self.fallback_fraction = fallback_fraction
        self._overrides = overriding.build(
            spec, shard_counts=shard_counts, pins=pins, drained=drained, weight_overrides=weight_overrides
        )
        self.fallbacks = 0
        """How many changes took the full path (for metrics and tests)."""
        self.touched: set[str] | None = None
        """Identities whose placement the last change may have altered (None: a full run)."""
        first = self._full(list(targets), previous=previous, allow_algorithm_change=allow_algorithm_change)
        self._reset(list(targets), _own_maps(first))

    @classmethod
    def adopting(
        cls,
        spec: FederationSpec,
        targets: Sequence[Target],
        assignment: Assignment,
        *,
        shard_counts: Mapping[str, int] | None = None,
        pins: Mapping[str, str] | None = None,
        drained: Collection[str] | None = None,
        weight_overrides: Mapping[str, int] | None = None,
        fallback_fraction: float = 0.125,
    ) -> IncrementalAssigner:
        """The engine over an assignment made earlier with these overrides (the stored one
        at a restart, an applied plan), without placing again: a million stored targets
        cost one pass to index, not a placement. ``AssignmentError`` when it does not fit."""
        self = cls.__new__(cls)
        self.spec = spec
        self.touched = None
        self.fallback_fraction = fallback_fraction
        self._overrides = overriding.build(
            spec, shard_counts=shard_counts, pins=pins, drained=drained, weight_overrides=weight_overrides
        )
        self.fallbacks = 0
        if assignment.algorithm != spec.sharding.algorithm:
            raise AssignmentError(f"the assignment was made by {assignment.algorithm!r}")
        live = {name for name in assignment.shards if name not in set(assignment.drained)}
        if set(assignment.drained) != set(self._overrides.drained):
            raise AssignmentError("the assignment's drained shards differ from the overrides'")
        listed = list(targets)
        for target in listed:
            shard = assignment.targets.get(target.identity)
            if shard not in live or assignment.shards[shard].region != target.region:
                raise AssignmentError(f"target {target.identity!r} has no live shard of its region")
            weight = self._overrides.weights.get(target.identity, target.weight)
            if assignment.weights.get(target.identity) != weight:
                raise AssignmentError(f"target {target.identity!r} was placed with another weight")
            pinned = self._overrides.pins.get(target.identity)
            if pinned is not None and pinned != shard:
                raise AssignmentError(f"target {target.identity!r} is not on the shard it is pinned to")
        if len(listed) != len(assignment.targets):
            raise AssignmentError("the assignment places targets that are not listed")
        self._reset(listed, assignment)
        return self

    @property
    def assignment(self) -> Assignment:
        return self._assignment

    def targets(self) -> list[Target]:
        """The current fleet, in no particular order."""
        return list(self._targets.values())

    def sync(self, targets: Sequence[Target]) -> Assignment:
        """Follow a full target list (what ``on_change`` delivers): apply its difference.

        Targets whose identity is new are added, missing ones removed, and ones whose
        fields changed are updated (removed and added back, keeping their shard).
        """
        current = self._targets
        incoming: dict[str, Target] = {}
        for target in targets:
            identity = target.identity
            if identity in incoming:
                raise AssignmentError(
                    f"target {identity!r} is listed more than once; identities must be unique "
                    "(set 'identity' on targets that share an address and port)"
                )
            incoming[identity] = target
        removed = current.keys() - incoming.keys()
        changed = [t for i, t in incoming.items() if i in current and current[i] != t]
        added = [t for i, t in incoming.items() if i not in current]
        return self.apply(added=added + changed, removed=removed | {t.identity for t in changed})

    def apply(self, *, added: Sequence[Target] = (), removed: Collection[str] = ()) -> Assignment:
        """Remove identities ``removed``, add ``added`` (an identity in both is updated)."""
        gone = set(removed)
        unknown = sorted(i for i in gone if i not in self._targets)  # not `- keys()`: a pass over them
        if unknown:
            raise AssignmentError(f"cannot remove target {unknown[0]!r}: it is not assigned")
        fresh: dict[str, Target] = {}
        for target in added:
            identity = target.identity
            if identity in fresh or (identity in self._targets and identity not in gone):
                raise AssignmentError(
                    f"target {identity!r} is listed more than once; identities must be unique "
                    "(set 'identity' on targets that share an address and port)"
                )
            if target.region not in self._regions:
                raise AssignmentError(
                    f"target {identity!r} is in region {target.region!r}, which the spec does not "
                    f"define (known regions: {', '.join(sorted(self._regions))})"
                )
            fresh[identity] = target
        if not gone and not fresh:
            self.touched = set()
            return self._assignment
        if self._needs_full(gone, fresh):
            self.touched = None
            return self._fall_back(gone, fresh)
        self._check_pins(fresh.values())
        self._apply(gone, fresh)
        return self._assignment

    # -- the full path ---------------------------------------------------------------------

    def _full(
        self, targets: list[Target], *, previous: Assignment | None, allow_algorithm_change: bool = False
    ) -> Assignment:
        o = self._overrides
        return assigning.assign(
            self.spec,
            targets,
            previous=previous,
            allow_algorithm_change=allow_algorithm_change,
            shard_counts=o.shard_counts,
            pins=o.pins,
            drained=o.drained,
            weight_overrides=o.weights,
        )

    def _fall_back(self, gone: set[str], fresh: dict[str, Target]) -> Assignment:
        kept = [t for i, t in self._targets.items() if i not in gone and i not in fresh]
        everything = kept + list(fresh.values())
        result = _own_maps(self._full(everything, previous=self._assignment))
        self.fallbacks += 1
        self._reset(everything, result)
        return result

    def _needs_full(self, gone: set[str], fresh: dict[str, Target]) -> bool:
        if self.spec.sharding.algorithm != assigning.ALGORITHM:
            return True
        if len(gone) + len(fresh) > self.fallback_fraction * len(self._targets) + 64:
            return True
        if any(not self._regions[t.region].names for t in fresh.values()):
            return True  # every shard drained: the full path names the problem
        delta: dict[str, Counter[str]] = {}
        for identity in gone:
            target = self._targets[identity]
            delta.setdefault(target.region, Counter())[target.node] -= 1
        for target in fresh.values():
            delta.setdefault(target.region, Counter())[target.node] += 1
        for name, change in delta.items():
            if not self._overrides.needs_nodes(self.spec, name):
                continue
            nodes = self._regions[name].nodes
            count = len(nodes)
            for node, step in change.items():
                before = nodes.get(node, 0)
                count += (before + step > 0) - (before > 0)
            if self.spec.shard_count(name, nodes=count) != len(self._shards_of[name]):
                return True
        return False

    def _reset(self, targets: list[Target], assignment: Assignment) -> None:
        """Rebuild the state from a full assignment of ``targets``."""
        self._assignment = assignment
        # the maps the next change evolves (its result shares their untouched buckets);
        # ``assignment`` itself keeps its own dicts: whoever holds it sees them unchanged
        self._maps = (CowMap.of(assignment.targets), CowMap.of(assignment.weights))
        # keyed by the assignment's own identity strings, not a copy made here (and held as
        # long as the engine: about 60 MiB at a million targets)
        own = {identity: identity for identity in assignment.targets}
        self._targets = {}
        for target in targets:
            identity = target.identity
            self._targets[own.get(identity, identity)] = target
        del own
        self._shards_of: dict[str, list[str]] = {}
        for name, info in assignment.shards.items():
            self._shards_of.setdefault(info.region, []).append(name)
        drained = set(assignment.drained)
        self._regions: dict[str, _Region] = {}
        for region in self.spec.region_names():
            every = sorted(self._shards_of.setdefault(region, []), key=lambda n: assignment.shards[n].index)
            self._shards_of[region] = every
            names = [n for n in every if n not in drained]
            size = len(names)
            self._regions[region] = _Region(
                names=names,
                ring=shared_ring(tuple(names), vnodes=assigning.VNODES),  # the placement's own
                pinned_load=[0] * size,
                member_load=[0] * size,
                members=[[] for _ in range(size)],
            )
        index_of = {n: i for r in self._regions.values() for i, n in enumerate(r.names)}
        pins = self._overrides.pins
        for identity, target in self._targets.items():
            state = self._regions[target.region]
            shard = index_of[assignment.targets[identity]]
            weight = assignment.weights[identity]
            state.weights[weight] += 1
            state.nodes[target.node] += 1
            if identity in pins:
                state.pinned_load[shard] += weight
            else:
                state.members[shard].append((key_hash(identity), identity))
                state.member_load[shard] += weight
        for state in self._regions.values():
            state.ring.vnodes_by_shard()  # indexed now, not by the first change (``first_fitting``)
            for members in state.members:
                members.sort()
        self._index_of = index_of

    # -- the incremental path ----------------------------------------------------------------

    def _check_pins(self, targets: Collection[Target]) -> None:
        for target in targets:
            shard = self._overrides.pins.get(target.identity)
            if shard is not None and shard not in self._regions[target.region].names:
                raise AssignmentError(
                    f"target {target.identity!r} in region {target.region!r} is pinned to shard "
                    f"{shard!r} of region {self._assignment.shards[shard].region!r}; a target stays "
                    "in its own region"
                )

    def _apply(self, gone: set[str], fresh: dict[str, Target]) -> None:
        """One change: the new assignment's maps are the previous ones evolved by what the
        change wrote (``targets``/``weights`` below are those writes), not copies of them."""
        previous = self._assignment
        before_targets, before_weights = self._maps
        targets: dict[str, str] = {}
        weights: dict[str, int] = {}
        pins, overrides = self._overrides.pins, self._overrides.weights
        touched: set[str] = set()
        for identity in gone:
            target = self._targets.pop(identity)
            state = self._regions[target.region]
            shard = self._index_of[before_targets[identity]]
            weight = before_weights[identity]
            targets[identity] = weights[identity] = DELETE
            _forget(state, weight=weight, node=target.node)
            if identity in pins:
                state.pinned_load[shard] -= weight
            else:
                members = state.members[shard]
                del members[bisect.bisect_left(members, (key_hash(identity), identity))]
                state.member_load[shard] -= weight
            touched.add(target.region)
        unplaced: dict[str, list[tuple[Member, int]]] = {}
        for identity, target in fresh.items():
            state = self._regions[target.region]
            weight = overrides.get(identity, target.weight)
            state.weights[weight] += 1
            state.nodes[target.node] += 1
            self._targets[identity] = target
            weights[identity] = weight
            touched.add(target.region)
            pinned = pins.get(identity)
            if pinned is not None:
                shard = self._index_of[pinned]
                state.pinned_load[shard] += weight
                targets[identity] = pinned
                continue
            member = (key_hash(identity), identity)
            was = before_targets.get(identity)
            if was is not None and previous.shards[was].region == target.region:
                # removed and added back in one change (an update): it keeps its shard
                shard = self._index_of[was]
                bisect.insort(state.members[shard], member)
                state.member_load[shard] += weight
                targets[identity] = was
            else:
                unplaced.setdefault(target.region, []).append((member, weight))
        moved: set[str] = set(gone) | fresh.keys()
        new_weights = before_weights.evolve(weights)
        for region in touched:
            state = self._regions[region]
            placed = self._settle(state, unplaced.get(region, []), targets=targets, weights=new_weights)
            moved.update(member[1] for member, _ in placed)
        self.touched = moved
        new_targets = before_targets.evolve(targets)
        self._maps = (new_targets, new_weights)
        self._assignment = Assignment.model_construct(
            algorithm=previous.algorithm,
            algorithm_version=previous.algorithm_version,
            replication_factor=previous.replication_factor,
            shards=previous.shards,
            targets=new_targets,
            weights=new_weights,
            drained=previous.drained,
        )

    def _settle(
        self,
        state: _Region,
        unplaced: list[tuple[Member, int]],
        *,
        targets: dict[str, str],
        weights: Mapping[str, int],
    ) -> list[tuple[Member, int]]:
        """Keep stage over the changed loads, then first choice and walk for the rest; what
        was placed (new and shed members)."""
        total, shards = state.total + sum(w for _, w in unplaced), len(state.names)
        if not shards:
            return []
        load_factor = self.spec.sharding.load_factor
        heaviest = max((w for w, n in state.weights.items() if n > 0), default=0)
        limit = keep_limit(total, shards=shards, heaviest=heaviest, load_factor=load_factor)
        for s, members in enumerate(state.members):
            if members and state.pinned_load[s] + state.member_load[s] > limit:
                unplaced.extend(_shed(state, s, limit=limit, weights=weights))
        if not unplaced:
            return []
        unplaced.sort()
        loads = [p + m for p, m in zip(state.pinned_load, state.member_load, strict=True)]
        fill = Fill(
            [w for _, w in unplaced],
            order=lambda indices: sorted(indices, key=lambda j: unplaced[j][0]),
            load=loads,
            cap=base_capacity(total, shards=shards, load_factor=load_factor),
        )
        ring = state.ring
        fill.offer(ring.owners_of([member[0] for member, _ in unplaced]))
        fill.walk(
            lambda j: ring.clockwise(ring.slot(unplaced[j][0][0])),
            first=lambda j, room: ring.first_fitting(ring.slot(unplaced[j][0][0]), loads, room),
        )
        for (member, weight), shard in zip(unplaced, fill.result, strict=True):
            bisect.insort(state.members[shard], member)
            state.member_load[shard] += weight
            targets[member[1]] = state.names[shard]
        return unplaced


def _own_maps(fresh: Assignment) -> Assignment:
    """A full result no one has seen yet, its maps as the :class:`CowMap`s the next change
    evolves: the engine does not hold them twice (80 MiB at a million targets)."""
    return fresh.model_copy(update={"targets": CowMap(fresh.targets), "weights": CowMap(fresh.weights)})


def _forget(state: _Region, *, weight: int, node: str) -> None:
    state.weights[weight] -= 1
    state.nodes[node] -= 1
    if state.nodes[node] <= 0:
        del state.nodes[node]


def _shed(state: _Region, shard: int, *, limit: int, weights: Mapping[str, int]) -> list[tuple[Member, int]]:
    """The keep stage on a contended shard: members stay in ring order while they fit."""
    load = state.pinned_load[shard]
    kept: list[Member] = []
    shed: list[tuple[Member, int]] = []
    for member in state.members[shard]:
        weight = weights[member[1]]
        if load + weight <= limit:
            load += weight
            kept.append(member)
        else:
            shed.append((member, weight))
    state.members[shard] = kept
    state.member_load[shard] = load - state.pinned_load[shard]
    return shed
