"""Load-aware weights: what children really scrape -> integer weights for the assignment. Pure.

GPU count is a proxy for what a target costs its child; the cost itself is the samples
it yields per scrape (``scrape_samples_post_metric_relabeling``) over its job's scrape
interval. Pipeline::

    load_reader (Prometheus query API) -> {(job, instance, node): Observation}
      -> rates()       samples/s per target identity (a zero is "not observed": a down target)
      -> Smoother      EWMA per target, so one odd scrape does not move anything
      -> suggest()     integer weights on the GPU scale, bounded, floored at the GPU weight
      -> changes()     only the weights that differ enough from what is in force
      -> Controller.plan(use_observed_weights) -> the operator (or the auto policy) applies

**One unit for the whole fleet.** A weight is samples/s divided by ``unit``: the median,
over observed targets, of samples/s per GPU weight. A typical target therefore keeps
about its GPU weight, and a target not observed yet (new, or down since it came) keeps
exactly its GPU weight, which is the same scale: the two kinds stay comparable without
rewriting the weight of every target. A mean would let the heavy few pull the unit up
and make everyone else look lighter than their GPUs say.

**Bounds.** At least 1 (the assignment engine's minimum) and at most ``cap_factor`` x
the median weight (and ``MAX_WEIGHT``): a runaway exporter (a label explosion) must not
claim a whole shard's capacity on one reading; the EWMA and the cap together make the
weight follow such a target over several reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Protocol

from sharder.model.inventory import Target
from sharder.model.spec import MAX_WEIGHT

TargetKey = tuple[str, str, str]
"""(job, instance, node): how a series is matched to a gpufed target (as ``probe.py`` does)."""


@dataclass(frozen=True)
class Observation:
    """What one target yielded, as its children last reported it."""

    samples: float
    """Samples per scrape after metric relabelling (what the child ingests)."""
    duration_s: float | None = None
    """``scrape_duration_seconds``; reported, not weighed (it is mostly the exporter's latency)."""


class LoadReader(Protocol):
    """Where observations come from (``load_reader.PrometheusLoadReader`` is the adapter)."""

    def read(self, urls: Sequence[str]) -> dict[TargetKey, Observation] | None:
        """Per (job, instance, node), what its children reported; None when no URL answered."""
        ...


@dataclass(frozen=True)
class WeightPolicy:
    half_life_s: float = 600.0
    """EWMA half-life: a step change is half followed after this long."""
    cap_factor: float = 64.0
    """No weight above this many times the median weight."""
    tolerance: float = 0.25
    """A suggested weight within this fraction of the one in force is not offered as a change."""
    max_weight: int = MAX_WEIGHT

    def __post_init__(self) -> None:
        for name in ("half_life_s", "cap_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive (value {getattr(self, name)!r})")
        if not 0 <= self.tolerance < 10:
            raise ValueError(f"tolerance is a fraction from 0 to 10 (value {self.tolerance!r})")


def rates(
    observations: Mapping[TargetKey, Observation],
    targets: Mapping[str, Target],
    *,
    interval_s: Callable[[str], float],
) -> dict[str, float]:
    """Samples/s per identity for the targets that were observed with samples (> 0)."""
    out: dict[str, float] = {}
    for identity, target in targets.items():
        seen = observations.get((target.job, target.instance, target.node))
        if seen is not None and seen.samples > 0 and math.isfinite(seen.samples):
            out[identity] = seen.samples / interval_s(target.job)
    return out


class Smoother:
    """Per-target EWMA of samples/s with a half-life in (injected) seconds.

    The first reading of a target is taken as is (no bias towards zero). A target missing
    from a reading keeps its last value: a child that did not answer says nothing about
    the target's cost. :meth:`retain` forgets targets that left the fleet.
    """

    def __init__(self, *, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self._values: dict[str, tuple[float, float]] = {}

    def update(self, observed: Mapping[str, float], *, now: float) -> None:
        values = dict(self._values)
        for identity, rate in observed.items():
            previous = values.get(identity)
            if previous is None:
                values[identity] = (rate, now)
                continue
            value, at = previous
            alpha = 1.0 - 0.5 ** (max(0.0, now - at) / self.half_life_s)
            values[identity] = (value + alpha * (rate - value), now)
        self._values = values  # one swap: readers never see half an update

    def retain(self, identities: Collection[str]) -> None:
        self._values = {i: v for i, v in self._values.items() if i in identities}

    def values(self) -> dict[str, float]:
        return {identity: value for identity, (value, _) in self._values.items()}


def unit(observed: Mapping[str, float], base: Mapping[str, int]) -> float | None:
    """Samples/s per weight unit: the median over observed targets of rate / GPU weight."""
    ratios = [
        r for i, rate in observed.items() if i in base and (r := rate / base[i]) > 0 and math.isfinite(r)
    ]
    per_unit = median(ratios) if ratios else 0.0
    return per_unit if per_unit > 0 else None


def suggest(
    observed: Mapping[str, float], base: Mapping[str, int], *, policy: WeightPolicy
) -> dict[str, int]:
    """A weight for every target of ``base`` (identity -> GPU weight).

    Observed targets weigh ``rate / unit`` rounded, between 1 and the cap; the others keep
    their GPU weight (the floor for new targets), so nothing unobserved loses weight.
    """
    per_unit = unit(observed, base)
    if per_unit is None:
        return dict(base)
    raw = {i: observed[i] / per_unit if i in observed else float(w) for i, w in base.items()}
    cap = max(
        1, min(policy.max_weight, int(min(policy.cap_factor * median(raw.values()), policy.max_weight)))
    )
    return {i: round(min(float(cap), max(1.0, w))) for i, w in raw.items()}


def changes(
    suggested: Mapping[str, int],
    *,
    base: Mapping[str, int],
    current: Mapping[str, int],
    tolerance: float,
) -> dict[str, int | None]:
    """The ``weights`` of a plan: identity -> new weight, or None for "back to the GPU weight".

    ``current`` holds the overrides in force; a target without one weighs its ``base``.
    Suggestions within ``tolerance`` of what is in force are left out, so small drifts in
    what a target scrapes never make a plan (nor, with auto rebalancing, a move).
    """
    out: dict[str, int | None] = {}
    for identity, weight in sorted(suggested.items()):
        gpu = base[identity]
        now = current.get(identity, gpu)
        if abs(weight - now) <= tolerance * now:
            continue
        out[identity] = None if weight == gpu else weight
    return out


def shard_totals(
    owners: Mapping[str, str], values: Mapping[str, float], shards: Iterable[str]
) -> dict[str, float]:
    """Sum of ``values`` per shard over the targets each one owns (targets without a value add 0)."""
    totals = dict.fromkeys(shards, 0.0)
    for identity, shard in owners.items():
        value = values.get(identity)
        if value is not None and shard in totals:
            totals[shard] += value
    return totals


def max_over_mean(loads: Iterable[float]) -> float:
    """Heaviest over mean (1.0 = perfectly even; 0.0 when there is nothing to compare)."""
    values = list(loads)
    total = sum(values)
    if not values or total <= 0:
        return 0.0
    return max(values) / (total / len(values))


def estimated(observed: Mapping[str, float], base: Mapping[str, int]) -> dict[str, float]:
    """Samples/s of every target: observed, or its GPU weight times the unit where not yet seen."""
    per_unit = unit(observed, base)
    if per_unit is None:
        return {}
    return {i: observed.get(i, w * per_unit) for i, w in base.items()}
