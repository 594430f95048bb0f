"""The sharding benchmark behind ``gpufed bench sharding``: speed, balance and movement.

Figures it reports, all on seeded synthetic targets (unique 10.x.y.z:9400 addresses,
each with 4 or 8 GPUs as its weight) in one region with a fixed shard count S:

* ``assign_seconds``: :func:`sharder.engine.assigning.assign` from scratch, best of 5 (timings on a
  shared machine are noisy; the best run is the least disturbed one). All timings are CPU
  seconds of this process (``time.process_time``), see ``_clock``.
* ``max_over_mean``: heaviest shard over the mean shard, by weight.
* Adding one shard (S -> S+1) with the previous assignment given, as the controller runs
  it; the optimum is 1/(S+1). Hash luck depends on the shard names, so this is averaged
  over ``trials`` name sets (regions ``bench0``, ``bench1`` ...), with the worst reported
  too. ``*_stateless`` is the same without ``previous``.
* Removing one shard (S -> S-1): the unavoidable part is the removed shard's own targets;
  ``remove_shard_spill_fraction`` is everything moved beyond that.
* Prometheus ``hashmod`` on the same addresses, S -> S+1, for comparison.
* ``hashmod_pass_seconds``: a bare pass computing Prometheus' MD5 ``hashmod`` of every
  address, timed alternately with ``assign_seconds`` in the same process (best of the
  same number of runs), the anchor of ``assign_over_hashmod_pass``.
* ``incremental_change_seconds``: one target registering on the whole fleet through
  :class:`sharder.engine.incremental.IncrementalAssigner` (best of ``repeats`` changes), against
  ``assign_seconds`` as ``assign_over_incremental_change``.
* ``add_shard_max_over_mean_worst``: the balance right after adding a shard, worst trial.

Movement trials call :func:`sharder.engine.assigning.place` (the per-region core of ``assign``) on
plain lists, so renaming shards does not mean rebuilding a million ``Target`` models.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Sequence
from statistics import fmean
from typing import Any

from sharder.engine.assigning import ALGORITHM, VNODES, Placer, assign, strategy
from sharder.engine.hashing import hashmod
from sharder.engine.incremental import IncrementalAssigner
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec, JobSpec, RegionSpec, ShardingSpec, shard_id

GPU_MIX = (4, 8)
# CPU time of this process: the timed code is single-threaded, so on an idle machine this
# is the wall time, and on a shared one other processes do not inflate it.
_clock = time.process_time
MAX_TARGETS = 1 << 24  # distinct 10.x.y.z addresses


def bench_spec(*, region: str, shards: int, load_factor: float = 1.05) -> FederationSpec:
    """One region with a fixed shard count, one job."""
    return FederationSpec(
        cluster="bench",
        regions=[RegionSpec(name=region, shards=shards)],
        sharding=ShardingSpec(load_factor=load_factor),
        jobs=[JobSpec(name="gpu")],
    )


def synth_targets(count: int, *, seed: int, region: str) -> list[Target]:
    """``count`` GPU-exporter targets with distinct seeded addresses and a 4/8 GPU mix."""
    if not 1 <= count <= MAX_TARGETS:
        raise ValueError(f"targets must be between 1 and {MAX_TARGETS}, got {count}")
    rnd = random.Random(seed)
    addresses = rnd.sample(range(MAX_TARGETS), count)
    # model_construct: these are valid by construction and a million validations take seconds.
    return [
        Target.model_construct(
            address=f"10.{a >> 16}.{(a >> 8) & 255}.{a & 255}",
            port=9400,
            job="gpu",
            node=f"node-{a:06x}",
            region=region,
            gpus=rnd.choice(GPU_MIX),
        )
        for a in addresses
    ]


def _moved(
    before: Sequence[int], after: Sequence[int], *, before_names: Sequence[str], after_names: Sequence[str]
) -> int:
    return sum(1 for b, a in zip(before, after, strict=True) if before_names[b] != after_names[a])


def _max_over_mean(owner: Sequence[int], weights: Sequence[int], *, shards: int) -> float:
    load = [0] * shards
    for shard, weight in zip(owner, weights, strict=True):
        load[shard] += weight
    return max(load) / (sum(load) / shards)


def _movement(
    place: Placer, keys: list[str], weights: list[int], *, shards: int, trials: int, load_factor: float
) -> dict[str, Any]:
    """Add/remove-one-shard movement, averaged over ``trials`` shard-name sets."""
    count = len(keys)
    add, add_stateless, remove, remove_own, balance = [], [], [], [], []
    for trial in range(trials):
        names = [shard_id(f"bench{trial}", i) for i in range(shards + 1)]
        old_names = names[:shards]
        base = place(old_names, keys, weights, load_factor=load_factor)
        previous = dict(zip(keys, (old_names[s] for s in base), strict=True))
        grown = place(
            names, keys, weights, load_factor=load_factor, previous=previous, previous_shards=old_names
        )
        add.append(_moved(base, grown, before_names=old_names, after_names=names) / count)
        balance.append(_max_over_mean(grown, weights, shards=shards + 1))
        fresh = place(names, keys, weights, load_factor=load_factor)
        add_stateless.append(_moved(base, fresh, before_names=old_names, after_names=names) / count)
        if shards > 1:
            kept = old_names[:-1]
            shrunk = place(
                kept, keys, weights, load_factor=load_factor, previous=previous, previous_shards=old_names
            )
            remove.append(_moved(base, shrunk, before_names=old_names, after_names=kept) / count)
            remove_own.append(base.count(shards - 1) / count)
    optimal = 1 / (shards + 1)
    result: dict[str, Any] = {
        "optimal_add_fraction": optimal,
        "add_shard_moved_fraction": fmean(add),
        "add_shard_moved_fraction_worst": max(add),
        "add_shard_ratio_to_optimal": fmean(add) / optimal,
        "add_shard_ratio_to_optimal_worst": max(add) / optimal,
        "add_shard_max_over_mean_worst": max(balance),
        "add_shard_moved_fraction_stateless": fmean(add_stateless),
        "add_shard_ratio_to_optimal_stateless": fmean(add_stateless) / optimal,
        "remove_shard_moved_fraction": fmean(remove) if remove else None,
        "optimal_remove_fraction": fmean(remove_own) if remove else None,
        "remove_shard_spill_fraction": fmean(r - o for r, o in zip(remove, remove_own, strict=True))
        if remove
        else None,
        "remove_shard_spill_fraction_worst": max(r - o for r, o in zip(remove, remove_own, strict=True))
        if remove
        else None,
    }
    return result


def _hashmod_pass(addresses: list[str], *, shards: int) -> float:
    """Seconds for Prometheus' ``hashmod`` (MD5, low 8 bytes, big-endian, mod N) of each address.

    Written out as a bare loop (no per-call checks) so the anchor is as fast as Python gets.
    """
    md5 = hashlib.md5
    started = _clock()
    placed = [
        int.from_bytes(md5(raw, usedforsecurity=False).digest()[8:], "big") % shards
        for raw in map(str.encode, addresses)
    ]
    elapsed = _clock() - started
    if placed and not 0 <= placed[0] < shards:
        raise AssertionError("hashmod out of range")
    return elapsed


def _incremental_change(spec: FederationSpec, items: list[Target], *, repeats: int) -> float:
    """Best time of one registration on the whole fleet, through the incremental path."""
    engine = IncrementalAssigner(spec, items)
    region = spec.regions[0].name
    best = float("inf")
    for k in range(repeats):
        newcomer = Target.model_construct(
            address=f"10.250.0.{k}", port=9401, job="gpu", node=f"node-new-{k}", region=region, gpus=8
        )
        started = _clock()
        engine.apply(added=[newcomer])
        best = min(best, _clock() - started)
        if engine.fallbacks:
            raise AssertionError("the incremental bench took the full path")
    return best


def _hashmod(keys: list[str], weights: list[int], *, shards: int) -> dict[str, float]:
    before = [hashmod([k], shards) for k in keys]
    after = [hashmod([k], shards + 1) for k in keys]
    moved = sum(1 for b, a in zip(before, after, strict=True) if b != a) / len(keys)
    return {
        "hashmod_add_shard_moved_fraction": moved,
        "hashmod_add_ratio_to_optimal": moved * (shards + 1),
        "hashmod_max_over_mean": _max_over_mean(before, weights, shards=shards),
    }


def run_sharding_bench(
    *,
    targets: int,
    shards: int,
    seed: int = 0,
    trials: int = 20,
    repeats: int = 5,
    algorithm: str = ALGORITHM,
) -> dict[str, Any]:
    """Every figure of the sharding benchmark as one flat JSON-ready dict."""
    if shards < 1 or trials < 1 or repeats < 1:
        raise ValueError("shards, trials and repeats must be at least 1")
    chosen = strategy(algorithm)
    spec = bench_spec(region="bench", shards=shards)
    items = synth_targets(targets, seed=seed, region="bench")
    keys = [t.identity for t in items]
    best = anchor = float("inf")
    for _ in range(repeats):
        started = _clock()
        assignment = assign(spec, items, algorithm=chosen.name)
        best = min(best, _clock() - started)
        anchor = min(anchor, _hashmod_pass(keys, shards=shards))
    load = assignment.load()
    weights = [t.weight for t in items]
    load_factor = spec.sharding.load_factor
    result: dict[str, Any] = {
        "targets": targets,
        "shards": shards,
        "seed": seed,
        "trials": trials,
        "algorithm": chosen.name,
        "algorithm_version": chosen.version,
        "vnodes": VNODES if chosen.name == ALGORITHM else None,
        "load_factor": load_factor,
        "assign_seconds": best,
        "hashmod_pass_seconds": anchor,
        "assign_over_hashmod_pass": best / anchor,
        "max_over_mean": max(load.values()) / (sum(load.values()) / shards),
    }
    if chosen.name == ALGORITHM:
        change = _incremental_change(spec, items, repeats=repeats)
        result.update(incremental_change_seconds=change, assign_over_incremental_change=best / change)
    result.update(
        _movement(chosen.place, keys, weights, shards=shards, trials=trials, load_factor=load_factor)
    )
    result.update(_hashmod(keys, weights, shards=shards))
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in result.items()}
