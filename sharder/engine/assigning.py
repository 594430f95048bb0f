"""Targets -> shards: consistent hashing with bounded loads on a vnode ring, per region.

Pipeline: sources list targets -> :func:`assign` (here, pure) -> ``sharder.engine.planning.diff``
against the saved assignment -> renderers write one config per child. The reconcile loop
follows a live fleet with ``sharder.engine.incremental``, whose results equal :func:`assign`'s.

**Algorithm** ``bounded-ring`` (Mirrokni, Thorup, Zadimoghaddam, "Consistent hashing with
bounded loads", 2018): a hash ring with :data:`VNODES` virtual nodes per shard; every
target goes to the shard owning the first vnode clockwise from its key hash unless that
would lift the shard above its capacity; targets left over walk on clockwise, in ring
order, to the first shard with room. The stages and capacities live in
:mod:`sharder.engine.fill`. ``bounded-rendezvous`` (weighted rendezvous/HRW, the same fill)
scores all S shards per target and is kept as the measured alternative (~10x slower).
Both sit in :data:`STRATEGIES` behind one :class:`Placer` signature;
``spec.sharding.algorithm`` picks one and the result is pinned by name and version.

**v2** (v1 placed changes differently; a v1 ``assignment.json`` is taken as the sticky
start and kept whole, see :class:`Strategy`):

* With a previous assignment, a new shard (or an undrained one) takes its share from the
  most loaded shards, instead of its ring owners' targets plus whatever shards above the
  lower capacity shed. ``gpufed bench sharding --targets 2400 --shards 100`` (about 24
  targets per child, the sizing users run) moved 2.9x the optimum on adding a shard in
  v1 (worst 3.3x) and moves 1.01x in v2; 100,000 targets 1.048x -> 1.001x.
* A fill leaves the room one more shard would take (capacity ``c x total / (S + 1)``),
  so right after adding a shard no shard is above the load factor and none has to shed
  on top of the new shard's share; max/mean stays below c.
* Keys are placed by the ring's slice table (``sharder.engine.hashing.Ring``), one C-level pass
  for the fleet instead of a binary search per key, and the ring has 128 vnodes per shard
  instead of 512: with new shards filled from the most loaded, the ring only decides where
  new and orphaned targets go, and a smaller ring is built faster. 100,000 targets on 100
  shards are assigned in about 2.3x the time of a bare MD5 ``hashmod`` pass over the same
  addresses (v1: 3.7x), measured by ``gpufed bench sharding`` in CPU seconds.

**Stickiness.** With ``previous``, every target keeps its shard while that shard exists,
is not drained and stays within the keep limit; the rest go to their ring owner, then
walk. So removing a shard moves only its own targets, and a rerun moves nothing.
Contention for a shard is settled in ring order (sorted key hashes), so the result
depends on the *set* of targets, never on their order.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

from sharder.engine import overriding
from sharder.engine.assignment import Assignment, ShardInfo
from sharder.engine.fill import Fill, Order, base_capacity, keep_limit
from sharder.engine.hashing import (
    key_hashes,
    rendezvous_ranking,
    rendezvous_seeds,
    rendezvous_winner,
    shared_ring,
)
from sharder.kernel.errors import AssignmentError
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec, shard_id

ALGORITHM = "bounded-ring"
ALGORITHM_VERSION = 2
VNODES = 128


def capacity(total: int, *, shards: int, heaviest: int, load_factor: float) -> int:
    """Most weight one shard can end up with, pins aside: :func:`sharder.engine.fill.keep_limit`.

    A fill places targets under :func:`sharder.engine.fill.base_capacity` (below ``c x mean``)
    and only a walk that finds no room raises that, never beyond this bound; targets
    already on a shard may stay up to it.
    """
    return keep_limit(total, shards=shards, heaviest=heaviest, load_factor=load_factor)


def ring_order(hashes: list[int], keys: Sequence[str]) -> Order:
    """Sorts target indices by key hash; should two keys share one (a 64-bit collision,
    checked once, on first use), by hash then key, so the order never depends on input."""
    by_hash = hashes.__getitem__
    unique: list[bool] = []

    def order(indices: list[int]) -> list[int]:
        if not unique:
            unique.append(len(set(hashes)) == len(hashes))
        if unique[0]:
            return sorted(indices, key=by_hash)
        return sorted(indices, key=lambda j: (hashes[j], keys[j]))

    return order


class Placer(Protocol):
    """One region's placement: the shard index of each unique key, in input order.

    ``previous`` maps key -> shard name; ``previous_shards`` are the shard names that
    took targets then (a shard not among them counts as new and gets its share from the
    most loaded ones). ``pinned`` holds, per key, the shard index it must go to, or -1.
    """

    def __call__(
        self,
        shards: Sequence[str],
        keys: Sequence[str],
        weights: Sequence[int],
        *,
        load_factor: float,
        previous: Mapping[str, str] | None = None,
        previous_shards: Collection[str] = (),
        pinned: Sequence[int] | None = None,
    ) -> list[int]: ...


def run_stages(
    fill: Fill,
    primary: list[int],
    candidates: Callable[[int], Iterable[int]],
    *,
    was: list[int] | None,
    fresh: Sequence[bool],
    pinned: Sequence[int] | None,
    load_factor: float,
) -> list[int]:
    """Pins, new shards' share, keep, first choice, walk: the stages of :mod:`sharder.engine.fill`."""
    placed = False
    if pinned is not None:
        fill.pin(pinned)
        placed = True
    if was is not None:
        total = sum(fill.weights)
        if any(fresh):
            fill.fill_fresh(was, fresh, total=total)
        limit = keep_limit(total, shards=len(fill.load), heaviest=max(fill.weights), load_factor=load_factor)
        fill.offer(fill.unplaced(was) if placed else was, limit=limit)
        placed = True
    fill.offer(fill.unplaced(primary) if placed else primary)
    fill.walk(candidates)
    return fill.result


def new_fill(weights: Sequence[int], *, order: Order, shards: int, load_factor: float) -> Fill:
    cap = base_capacity(sum(weights), shards=shards, load_factor=load_factor)
    return Fill(weights, order=order, load=[0] * shards, cap=cap)


def place(
    shards: Sequence[str],
    keys: Sequence[str],
    weights: Sequence[int],
    *,
    load_factor: float,
    previous: Mapping[str, str] | None = None,
    previous_shards: Collection[str] = (),
    pinned: Sequence[int] | None = None,
    vnodes: int = VNODES,
) -> list[int]:
    """``bounded-ring``: the core of :func:`assign` for one region, on plain lists (see Placer)."""
    if not keys:
        return []
    hashes = key_hashes(keys)
    ring = shared_ring(tuple(shards), vnodes=vnodes)  # the engine and the read paths reuse it
    fill = new_fill(weights, order=ring_order(hashes, keys), shards=len(shards), load_factor=load_factor)
    return run_stages(
        fill,
        ring.owners_of(hashes),
        lambda j: ring.clockwise(ring.slot(hashes[j])),
        was=_was(shards, keys, previous),
        fresh=_fresh(shards, previous_shards),
        pinned=pinned,
        load_factor=load_factor,
    )


def place_rendezvous(
    shards: Sequence[str],
    keys: Sequence[str],
    weights: Sequence[int],
    *,
    load_factor: float,
    previous: Mapping[str, str] | None = None,
    previous_shards: Collection[str] = (),
    pinned: Sequence[int] | None = None,
) -> list[int]:
    """``bounded-rendezvous``: highest-random-weight order instead of the ring (see Placer).

    Kept as the measured alternative: S hash calls per target make it ~10x slower.
    """
    if not keys:
        return []
    hashes = key_hashes(keys)
    seeds = rendezvous_seeds(shards)
    fill = new_fill(weights, order=ring_order(hashes, keys), shards=len(shards), load_factor=load_factor)
    return run_stages(
        fill,
        [rendezvous_winner(h, seeds) for h in hashes],
        lambda j: rendezvous_ranking(hashes[j], seeds),
        was=_was(shards, keys, previous),
        fresh=_fresh(shards, previous_shards),
        pinned=pinned,
        load_factor=load_factor,
    )


def _was(shards: Sequence[str], keys: Sequence[str], previous: Mapping[str, str] | None) -> list[int] | None:
    """Previous shard index of each key; -1 where it was elsewhere or nowhere."""
    if not previous:
        return None
    index_of = {name: i for i, name in enumerate(shards)}
    get = previous.get
    return [index_of.get(get(key, ""), -1) for key in keys]


def _fresh(shards: Sequence[str], previous_shards: Collection[str]) -> list[bool]:
    return [name not in previous_shards for name in shards]


@dataclass(frozen=True)
class Strategy:
    """A named, versioned placement; ``keeps`` lists older versions whose results it keeps.

    A version that only changes how *changes* are placed (not what a fresh assignment
    looks like) can take an older version's assignment as its sticky start: nothing moves
    on upgrade, and the next ``assignment.json`` records the new version.
    """

    name: str
    version: int
    place: Placer
    keeps: frozenset[int] = frozenset()


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(ALGORITHM, ALGORITHM_VERSION, place, keeps=frozenset({1})),
        Strategy("bounded-rendezvous", 2, place_rendezvous, keeps=frozenset({1})),
    )
}


def strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise AssignmentError(
            f"unknown assignment algorithm {name!r} (known: {', '.join(STRATEGIES)})"
        ) from None


def check_algorithm(
    previous: Assignment | None, chosen: Strategy, *, allow_algorithm_change: bool
) -> Assignment | None:
    """The previous assignment if its placements may be kept; refuse a silent reshuffle."""
    if previous is None or (
        previous.algorithm == chosen.name
        and (previous.algorithm_version == chosen.version or previous.algorithm_version in chosen.keeps)
    ):
        return previous
    if not allow_algorithm_change:
        raise AssignmentError(
            f"the previous assignment was made by {previous.algorithm} v{previous.algorithm_version} "
            f"but this run assigns with {chosen.name} v{chosen.version}; switching moves most "
            "targets to another shard (their children lose the recent history of those targets). "
            "Pass allow_algorithm_change=True (--allow-algorithm-change) to accept the reshuffle"
        )
    return None  # old placements came from another algorithm: start afresh


def _by_region(spec: FederationSpec, targets: Sequence[Target]) -> dict[str, Sequence[Target]]:
    names = sorted(spec.region_names())
    present = set(map(attrgetter("region"), targets))
    if not present.issubset(names):
        unknown = [t for t in targets if t.region not in names]
        first = min(unknown, key=lambda t: t.identity)
        others = len(unknown) - 1
        more = f" ({others} more in unknown regions)" if others else ""
        raise AssignmentError(
            f"target {first.identity!r} is in region {first.region!r}, which the spec does not "
            f"define (known regions: {', '.join(names)}){more}"
        )
    if len(present) <= 1:  # the common case, without a pass in Python
        return {name: targets if name in present else [] for name in names}
    grouped: dict[str, list[Target]] = {name: [] for name in names}
    for target in targets:
        grouped[target.region].append(target)
    return dict(grouped)


_IDENTITY_PARTS = attrgetter("explicit_identity", "address", "port")


def _identities(targets: Sequence[Target]) -> list[str]:
    """``Target.identity`` of many targets, spelled out: two property calls per target are
    a fifth of a 100k assignment. ``test_identities_match_the_target_property`` keeps the
    two equal."""
    return [
        explicit or (f"{host}:{port}" if ":" not in host else f"[{host}]:{port}")
        for explicit, host, port in map(_IDENTITY_PARTS, targets)
    ]


def _duplicate(targets: Sequence[Target]) -> str:
    seen: set[str] = set()
    for identity in sorted(t.identity for t in targets):
        if identity in seen:
            return identity
        seen.add(identity)
    return ""


def assign(
    spec: FederationSpec,
    targets: Sequence[Target],
    *,
    previous: Assignment | None = None,
    allow_algorithm_change: bool = False,
    algorithm: str | None = None,
    shard_counts: Mapping[str, int] | None = None,
    pins: Mapping[str, str] | None = None,
    drained: Collection[str] | None = None,
    weight_overrides: Mapping[str, int] | None = None,
) -> Assignment:
    """Assign every target to one shard of its own region; pure and deterministic.

    The algorithm is ``spec.sharding.algorithm`` unless ``algorithm`` names another
    (benchmarks compare them). ``shard_counts``, ``pins``, ``drained`` and
    ``weight_overrides`` are the control plane's overrides, described and checked in
    :mod:`sharder.engine.overriding`; a bad one raises :class:`AssignmentError` naming it.

    Shards are listed by region name then index; targets by region, then in input order
    (re-sorting 1M keys would cost more than the assignment), so compare assignments with
    ``==`` and write them with sorted keys for byte-identical files.
    """
    chosen = strategy(algorithm or spec.sharding.algorithm)
    checked = overriding.build(
        spec, shard_counts=shard_counts, pins=pins, drained=drained, weight_overrides=weight_overrides
    )
    kept = check_algorithm(previous, chosen, allow_algorithm_change=allow_algorithm_change)
    grouped = _by_region(spec, targets)
    shards: dict[str, ShardInfo] = {}
    names_of: dict[str, list[str]] = {}
    for region, members in grouped.items():
        # Counting distinct nodes costs a pass over the targets; only sizing needs it.
        nodes = len({t.node for t in members}) if checked.needs_nodes(spec, region) else 0
        names = [shard_id(region, index) for index in range(checked.shard_count(spec, region, nodes=nodes))]
        shards.update((name, ShardInfo(region=region, index=index)) for index, name in enumerate(names))
        names_of[region] = names
    checked.check_shards({name: info.region for name, info in shards.items()})
    previous_shards = set(kept.shards).difference(kept.drained) if kept is not None else set()
    owners: dict[str, str] = {}
    weights: dict[str, int] = {}
    for region, members in grouped.items():
        active = [name for name in names_of[region] if name not in checked.drained]
        keys = _identities(members)
        # Target.weight (the job's weight when the loader set one, else max(1, gpus)), read
        # through two C-level attribute passes instead of a property call per target.
        loads = [
            explicit or gpus or 1
            for explicit, gpus in zip(
                map(attrgetter("explicit_weight"), members), map(attrgetter("gpus"), members), strict=True
            )
        ]
        if checked.weights:
            loads = [checked.weights.get(k, w) for k, w in zip(keys, loads, strict=True)]
        if keys and not active:
            raise AssignmentError(
                f"every shard of region {region!r} is drained ({', '.join(names_of[region])}) "
                f"but it has {len(keys)} targets; undrain at least one"
            )
        owner = chosen.place(
            active,
            keys,
            loads,
            load_factor=spec.sharding.load_factor,
            previous=kept.targets if kept is not None else None,
            previous_shards=previous_shards,
            pinned=_pinned(region, active, keys, checked.pins, shards),
        )
        owners.update(zip(keys, map(active.__getitem__, owner), strict=True))
        weights.update(zip(keys, loads, strict=True))
    if len(owners) != len(targets):
        raise AssignmentError(
            f"target {_duplicate(targets)!r} is listed more than once; identities must be unique "
            "(set 'identity' on targets that share an address and port)"
        )
    # Built from validated parts, so skip re-validating 100k-entry dicts.
    return Assignment.model_construct(
        algorithm=chosen.name,
        algorithm_version=chosen.version,
        replication_factor=spec.sharding.replication_factor,
        shards=shards,
        targets=owners,
        weights=weights,
        drained=sorted(checked.drained),
    )


def _pinned(
    region: str,
    active: Sequence[str],
    keys: Sequence[str],
    pins: Mapping[str, str],
    shards: Mapping[str, ShardInfo],
) -> list[int] | None:
    """Per key, the index in ``active`` of its pinned shard, or -1; None without pins here."""
    if not pins or not keys:
        return None
    position = {key: j for j, key in enumerate(keys)}
    index_of = {name: i for i, name in enumerate(active)}
    pinned = [-1] * len(keys)
    found = False
    for identity, shard in pins.items():
        j = position.get(identity)
        if j is None:
            continue
        if shards[shard].region != region:
            raise AssignmentError(
                f"target {identity!r} in region {region!r} is pinned to shard {shard!r} of region "
                f"{shards[shard].region!r}; a target stays in its own region"
            )
        pinned[j] = index_of[shard]
        found = True
    return pinned if found else None
