"""The controller's view of measured load: smoothed samples/s per target, and what follows from it.

Sits between the reader (``load_reader``, HTTP) and the controller core: the core calls
:meth:`LoadTracker.refresh` from its load loop (every ``interval_s``), and builds
``GET /v1/load``, the ``samples_per_s`` of ``/v1/shards`` and the weights of a
``use_observed_weights`` plan from here. No I/O of its own: the reader is injected.

Nothing here moves a target. Weights reach the assignment only through a plan; the
auto policy (``auto_rebalance_imbalance``, off by default) makes and applies that plan
itself when a region's samples/s max/mean is above the threshold, at most once per
``auto_rebalance_cooldown_s``, and only when the plan predicts a lower max/mean.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from federation.controller.load import weighing
from sharder.engine import planning
from sharder.engine.assignment import Assignment
from sharder.model.inventory import Target


@dataclass(frozen=True)
class LoadOptions:
    urls: tuple[str, ...] = ()
    """Prometheus query APIs to read (the master); empty: each child's, for full-Prometheus children."""
    interval_s: float = 60.0
    policy: weighing.WeightPolicy = field(default_factory=weighing.WeightPolicy)
    auto_rebalance_imbalance: float | None = None
    """e.g. 1.3: apply a load-aware plan when a region's samples/s max/mean exceeds it. None: off."""
    auto_rebalance_cooldown_s: float = 900.0

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"load interval must be positive (value {self.interval_s!r})")
        threshold = self.auto_rebalance_imbalance
        if threshold is not None and not threshold > 1.0:
            raise ValueError(
                f"auto_rebalance_imbalance is a max/mean ratio above 1.0, e.g. 1.3 (value {threshold!r})"
            )


def base_weights(targets: Mapping[str, Target]) -> dict[str, int]:
    """Each target's weight without overrides: its job's rule (GPU count for GPU exporters)."""
    return {identity: target.weight for identity, target in targets.items()}


class LoadTracker:
    def __init__(
        self, *, reader: weighing.LoadReader, options: LoadOptions, clock: Callable[[], float] = time.time
    ) -> None:
        self.reader = reader
        self.options = options
        self.smoother = weighing.Smoother(half_life_s=options.policy.half_life_s)
        self._clock = clock
        self.observed_at: float | None = None
        self.sources: list[str] = []
        self.busy: dict[str, float] = {}
        """identity -> scrape_duration_seconds / interval: the share of time a child spends scraping it."""

    def refresh(
        self,
        *,
        targets: Mapping[str, Target],
        interval_s: Callable[[str], float],
        child_urls: Sequence[str],
    ) -> bool:
        """Read once and fold the reading in; False when there was nothing to read or no answer."""
        urls = list(self.options.urls) or list(child_urls)
        if not urls:
            return False
        seen = self.reader.read(urls)
        if seen is None:
            return False
        now = self._clock()
        self.smoother.update(weighing.rates(seen, targets, interval_s=interval_s), now=now)
        self.smoother.retain(targets.keys())
        busy = {}
        for identity, target in targets.items():
            obs = seen.get((target.job, target.instance, target.node))
            if obs is not None and obs.duration_s is not None:
                busy[identity] = obs.duration_s / interval_s(target.job)
        self.busy = busy
        self.observed_at, self.sources = now, urls
        return True

    def rates(self) -> dict[str, float]:
        return self.smoother.values()

    def weight_changes(
        self, targets: Mapping[str, Target], *, current: Mapping[str, int]
    ) -> dict[str, int | None]:
        """The ``weights`` a ``use_observed_weights`` plan carries."""
        base = base_weights(targets)
        suggested = weighing.suggest(self.rates(), base, policy=self.options.policy)
        return weighing.changes(
            suggested, base=base, current=current, tolerance=self.options.policy.tolerance
        )

    def region_imbalance(
        self, assignment: Assignment, targets: Mapping[str, Target], *, plan: planning.Plan | None = None
    ) -> dict[str, float]:
        """Per region, samples/s max/mean over its active shards, now or once ``plan`` is applied
        (targets not observed yet count at their GPU weight x the unit)."""
        owners = assignment.targets if plan is None else owners_after(assignment, plan)
        return imbalance(owners, assignment, weighing.estimated(self.rates(), base_weights(targets)))

    def report(
        self, *, assignment: Assignment | None, targets: Mapping[str, Target], current: Mapping[str, int]
    ) -> dict[str, Any]:
        rates = self.rates()
        base = base_weights(targets)
        changes = self.weight_changes(targets, current=current) if rates else {}
        body: dict[str, Any] = {
            "observed_at": self.observed_at,
            "age_s": None if self.observed_at is None else round(self._clock() - self.observed_at, 1),
            "sources": self.sources,
            "targets": len(targets),
            "observed_targets": sum(1 for i in targets if i in rates),
            "unit_samples_per_s": _round(weighing.unit(rates, base)),
            "auto_rebalance_imbalance": self.options.auto_rebalance_imbalance,
            "suggested_changes": len(changes),
            "suggested_weights": dict(list(changes.items())[:1000]),
            "regions": [],
            "shards": [],
        }
        if assignment is None:
            return body
        suggested = weighing.suggest(rates, base, policy=self.options.policy)
        estimate = weighing.estimated(rates, base)
        shards = list(assignment.shards)
        observed = weighing.shard_totals(assignment.targets, rates, shards)
        counted = weighing.shard_totals(assignment.targets, dict.fromkeys(rates, 1.0), shards)
        busy = weighing.shard_totals(assignment.targets, self.busy, shards)
        load = assignment.load()
        proposed = weighing.shard_totals(
            assignment.targets, {i: float(w) for i, w in suggested.items()}, shards
        )
        sizes = weighing.shard_totals(assignment.targets, dict.fromkeys(assignment.targets, 1.0), shards)
        ratios = imbalance(assignment.targets, assignment, estimate)
        for region in sorted({info.region for info in assignment.shards.values()}):
            active = _active(assignment, region)
            body["regions"].append(
                {
                    "region": region,
                    "shards": len(active),
                    "load_max_over_mean": round(weighing.max_over_mean(load[s] for s in active), 3),
                    "samples_per_s_max_over_mean": round(ratios.get(region, 0.0), 3),
                    "suggested_load_max_over_mean": round(
                        weighing.max_over_mean(proposed[s] for s in active), 3
                    ),
                }
            )
        for shard in planning._shard_order(assignment.shards):
            body["shards"].append(
                {
                    "shard": shard,
                    "region": assignment.shards[shard].region,
                    "drained": shard in assignment.drained,
                    "targets": int(sizes[shard]),
                    "load": load[shard],
                    "samples_per_s": round(observed[shard], 1) if counted[shard] else None,
                    "observed_targets": int(counted[shard]),
                    "scrape_busy": round(busy[shard], 3),
                    "suggested_load": int(proposed[shard]),
                }
            )
        return body

    def shard_samples(self, assignment: Assignment) -> dict[str, float | None]:
        """Observed samples/s per shard; None where none of its targets was observed."""
        rates = self.rates()
        totals = weighing.shard_totals(assignment.targets, rates, assignment.shards)
        counted = weighing.shard_totals(assignment.targets, dict.fromkeys(rates, 1.0), assignment.shards)
        return {s: round(totals[s], 1) if counted[s] else None for s in assignment.shards}


def imbalance(
    owners: Mapping[str, str], assignment: Assignment, values: Mapping[str, float]
) -> dict[str, float]:
    """Per region of ``assignment``, max/mean of ``values`` summed per active shard under ``owners``."""
    totals = weighing.shard_totals(owners, values, assignment.shards)
    regions = {info.region for info in assignment.shards.values()}
    return {r: weighing.max_over_mean(totals[s] for s in _active(assignment, r)) for r in sorted(regions)}


def owners_after(assignment: Assignment, plan: planning.Plan) -> dict[str, str]:
    """Target -> shard once ``plan`` is applied on ``assignment``."""
    owners = dict(assignment.targets)
    for move in plan.moves:
        owners[move.identity] = move.to_shard
    for placed in plan.added_targets:
        owners[placed.identity] = placed.shard
    for gone in plan.removed_targets:
        owners.pop(gone.identity, None)
    return owners


def _active(assignment: Assignment, region: str) -> list[str]:
    return [s for s, i in assignment.shards.items() if i.region == region and s not in assignment.drained]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
