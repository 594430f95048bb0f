"""The balance benchmark behind ``gpufed bench balance``: GPU-count weights vs load-aware weights.

Pure and in one process: the assignment engine and the controller's load-aware path
(``load_weights`` -> ``shed`` -> the engine with ``weight_overrides``) on a seeded fleet
whose series counts are skewed. No Prometheus runs; what children would report is
modelled from what the simulated exporter serves:

* every target is a GPU exporter on a node with 4 or 8 GPUs (``federation.testing.benches.sharding``'s mix),
  serving ``NODE_SERIES + PER_GPU x gpus`` samples per scrape (the simulated exporter's
  counts), times a per-target spread (``noise``, uniform +-), every ``interval_s``;
* a ``heavy_fraction`` of them serve ``heavy_factor`` times that (MIG slices, extra
  families, a label that exploded): their GPU count says nothing of it.

What the controller would see is ``readings`` noisy readings (``jitter``, +-) a minute
apart, smoothed by the same EWMA; weights are made from the smoothed values, the
balance is judged on the true samples/s. Figures (max/mean of samples/s across shards):

* ``gpu_weighted_max_over_mean``: the assignment by GPU count (what runs before).
* ``load_aware_max_over_mean``: after applying the load-aware plan on top of it (new
  weights, overloaded shards shed, sticky otherwise), as ``POST /v1/plan
  {"use_observed_weights": true}`` does; ``moved_fraction`` is the share of targets
  that plan moves, ``moved_samples_fraction`` the share of samples/s.
* ``load_aware_sticky_max_over_mean``: the same weights without shedding: what new
  weights alone achieve under the engine's keep limit (why the plan sheds).
* ``load_aware_fresh_max_over_mean``: the weights assigned from scratch (no previous
  assignment), the balance a fresh start would reach, and its ``moved_fraction_fresh``.
"""

from __future__ import annotations

import random
import time
from typing import Any

from federation.controller.base.shed import shed
from federation.controller.load import weighing
from federation.testing.benches.sharding import bench_spec, synth_targets
from sharder.engine import planning
from sharder.engine.assigning import assign
from sharder.engine.assignment import Assignment

NODE_SERIES, PER_GPU = 5, 21
"""Per scrape: series of a simulated exporter not tied to a GPU, and per GPU."""
REGION = "bench"


def samples_by_shard(assignment: Assignment, rates: dict[str, float]) -> dict[str, float]:
    return weighing.shard_totals(assignment.targets, rates, assignment.shards)


def moved_samples(before: Assignment, after: Assignment, rates: dict[str, float]) -> float:
    """Share of all samples/s whose target changed shard (the history continuity at stake)."""
    total = sum(rates.values())
    moved = sum(rates[i] for i, shard in after.targets.items() if before.targets.get(i, shard) != shard)
    return moved / total if total else 0.0


def run_balance_bench(
    *,
    targets: int = 1000,
    shards: int = 20,
    heavy_fraction: float = 0.1,
    heavy_factor: float = 10.0,
    noise: float = 0.1,
    jitter: float = 0.05,
    readings: int = 5,
    interval_s: float = 15.0,
    load_factor: float = 1.05,
    seed: int = 0,
) -> dict[str, Any]:
    if not 1 <= shards <= targets:
        raise ValueError(f"shards must be between 1 and the number of targets ({targets}), got {shards}")
    spec = bench_spec(region=REGION, shards=shards, load_factor=load_factor)
    fleet = synth_targets(targets, seed=seed, region=REGION)
    rnd = random.Random(seed + 1)
    heavy = set(rnd.sample([t.identity for t in fleet], round(heavy_fraction * targets)))
    truth: dict[str, float] = {}
    for target in fleet:
        samples = (NODE_SERIES + PER_GPU * target.gpus) * rnd.uniform(1 - noise, 1 + noise)
        truth[target.identity] = samples * (heavy_factor if target.identity in heavy else 1.0) / interval_s
    by_identity = {t.identity: t for t in fleet}
    base = {t.identity: t.weight for t in fleet}

    before = assign(spec, fleet)
    started = time.process_time()
    smoother = weighing.Smoother(half_life_s=weighing.WeightPolicy().half_life_s)
    for reading in range(readings):
        observations = {
            (t.job, t.instance, t.node): weighing.Observation(
                samples=truth[i] * interval_s * rnd.uniform(1 - jitter, 1 + jitter)
            )
            for i, t in by_identity.items()
        }
        smoother.update(
            weighing.rates(observations, by_identity, interval_s=lambda job: interval_s), now=60.0 * reading
        )
    policy = weighing.WeightPolicy()
    suggested = weighing.suggest(smoother.values(), base, policy=policy)
    changes = weighing.changes(suggested, base=base, current={}, tolerance=policy.tolerance)
    overrides = {i: w for i, w in changes.items() if w is not None}
    sticky = assign(spec, fleet, previous=before, weight_overrides=overrides)
    after = assign(spec, fleet, previous=shed(sticky, load_factor=load_factor), weight_overrides=overrides)
    plan_seconds = time.process_time() - started
    fresh = assign(spec, fleet, weight_overrides=overrides)

    def ratio(assignment: Assignment) -> float:
        return round(weighing.max_over_mean(samples_by_shard(assignment, truth).values()), 4)

    heavy_weights = sorted(suggested[i] for i in heavy)
    return {
        "targets": targets,
        "shards": shards,
        "heavy_fraction": heavy_fraction,
        "heavy_factor": heavy_factor,
        "noise": noise,
        "jitter": jitter,
        "readings": readings,
        "interval_s": interval_s,
        "load_factor": load_factor,
        "seed": seed,
        "gpu_weighted_max_over_mean": ratio(before),
        "gpu_weighted_gpu_load_max_over_mean": round(weighing.max_over_mean(before.load().values()), 4),
        "load_aware_max_over_mean": ratio(after),
        "load_aware_sticky_max_over_mean": ratio(sticky),
        "load_aware_fresh_max_over_mean": ratio(fresh),
        "moved_fraction": round(planning.diff(before, after).counts.moved_fraction, 4),
        "moved_samples_fraction": round(moved_samples(before, after, truth), 4),
        "moved_fraction_sticky": round(planning.diff(before, sticky).counts.moved_fraction, 4),
        "moved_fraction_fresh": round(planning.diff(before, fresh).counts.moved_fraction, 4),
        "weight_changes": len(changes),
        "heavy_weight_median": heavy_weights[len(heavy_weights) // 2] if heavy_weights else None,
        "plan_cpu_seconds": round(plan_seconds, 4),
    }
