"""Load-aware weights, pure: matching, EWMA, unit, bounds, floor, changes and shedding."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.controller.base.shed import shed
from federation.controller.load import weighing
from sharder.engine.assigning import assign
from sharder.engine.assignment import Assignment, ShardInfo
from sharder.engine.planning import diff
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec


def target(i: int, *, gpus: int = 8, job: str = "gpu", node: str | None = None) -> Target:
    return Target(
        address=f"10.0.{i // 250}.{i % 250 + 1}",
        port=9400,
        job=job,
        node=node or f"n{i}",
        region="r1",
        gpus=gpus,
    )


def spec(shards: int, *, load_factor: float = 1.05) -> FederationSpec:
    return FederationSpec.model_validate(
        {
            "cluster": "t",
            "regions": [{"name": "r1", "shards": shards}],
            "sharding": {"load_factor": load_factor},
            "jobs": [{"name": "gpu"}],
        }
    )


# ---- matching observations to targets ------------------------------------------------------
def test_rates_match_job_instance_and_node_and_divide_by_the_interval() -> None:
    a, b = target(1), target(2, job="node")
    same_address_other_node = target(1, node="elsewhere")
    targets = {"a": a, "b": b, "c": same_address_other_node}
    observations = {
        ("gpu", a.instance, "n1"): weighing.Observation(samples=300.0),
        ("node", b.instance, "n2"): weighing.Observation(samples=600.0),
    }
    intervals = {"gpu": 15.0, "node": 30.0}
    assert weighing.rates(observations, targets, interval_s=intervals.__getitem__) == {"a": 20.0, "b": 20.0}


def test_a_target_that_yielded_nothing_is_not_observed() -> None:
    a, b = target(1), target(2)
    observations = {
        ("gpu", a.instance, "n1"): weighing.Observation(samples=0.0),  # down: up == 0, no samples
        ("gpu", b.instance, "n2"): weighing.Observation(samples=math.nan),
    }
    assert weighing.rates(observations, {"a": a, "b": b}, interval_s=lambda job: 15.0) == {}


# ---- smoothing --------------------------------------------------------------------------------
def test_ewma_takes_the_first_reading_and_follows_half_way_in_one_half_life() -> None:
    smoother = weighing.Smoother(half_life_s=600)
    smoother.update({"a": 100.0}, now=0)
    assert smoother.values() == {"a": 100.0}
    smoother.update({"a": 200.0}, now=600)
    assert smoother.values()["a"] == pytest.approx(150.0)
    smoother.update({"a": 200.0}, now=1800)  # two more half-lives: 3/4 of the remaining 50
    assert smoother.values()["a"] == pytest.approx(187.5)


def test_ewma_keeps_targets_missing_from_a_reading_until_they_leave() -> None:
    smoother = weighing.Smoother(half_life_s=60)
    smoother.update({"a": 10.0, "b": 20.0}, now=0)
    smoother.update({"a": 30.0}, now=60)
    assert smoother.values() == {"a": pytest.approx(20.0), "b": 20.0}
    smoother.retain({"a"})
    assert set(smoother.values()) == {"a"}


def test_one_odd_reading_moves_a_smoothed_value_only_part_way() -> None:
    smoother = weighing.Smoother(half_life_s=600)
    smoother.update({"a": 100.0}, now=0)
    smoother.update({"a": 10_000.0}, now=60)  # a label explosion for one scrape
    assert 100.0 < smoother.values()["a"] < 1000.0


# ---- unit, bounds, floor ---------------------------------------------------------------------------
def test_unit_is_the_median_rate_per_gpu_weight_so_the_heavy_few_do_not_shift_it() -> None:
    base = {f"t{i}": 8 for i in range(10)}
    observed = {f"t{i}": 80.0 for i in range(9)} | {"t9": 8000.0}
    assert weighing.unit(observed, base) == 10.0


def test_typical_targets_keep_their_gpu_weight_and_a_heavy_one_weighs_what_it_scrapes() -> None:
    base = {f"t{i}": 4 if i % 2 else 8 for i in range(20)}
    observed = {i: 10.0 * w for i, w in base.items()}
    observed["t0"] = 10.0 * 8 * 10  # 10x what its 8 GPUs suggest
    weights = weighing.suggest(observed, base, policy=weighing.WeightPolicy())
    assert weights["t0"] == 80
    assert {i: w for i, w in weights.items() if i != "t0"} == {i: w for i, w in base.items() if i != "t0"}


def test_targets_not_observed_yet_keep_their_gpu_weight() -> None:
    base = {"seen": 8, "new": 4, "down": 8}
    weights = weighing.suggest({"seen": 160.0}, base, policy=weighing.WeightPolicy())
    assert weights == {"seen": 8, "new": 4, "down": 8}


def test_weights_are_at_least_one_and_at_most_the_cap() -> None:
    base = {f"t{i}": 2 for i in range(9)} | {"tiny": 2, "runaway": 2}
    observed = {f"t{i}": 20.0 for i in range(9)} | {"tiny": 0.01, "runaway": 1e9}
    weights = weighing.suggest(observed, base, policy=weighing.WeightPolicy(cap_factor=8))
    assert weights["tiny"] == 1
    assert weights["runaway"] == 16  # 8 x the median weight (2)
    capped = weighing.suggest(observed, base, policy=weighing.WeightPolicy(cap_factor=1e9, max_weight=10_000))
    assert capped["runaway"] == 10_000


def test_without_observations_the_suggestion_is_the_gpu_weights() -> None:
    assert weighing.suggest({}, {"a": 8, "b": 4}, policy=weighing.WeightPolicy()) == {"a": 8, "b": 4}


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([f"t{i}" for i in range(30)]),
        st.tuples(st.integers(1, 64), st.floats(0.0, 1e7, allow_nan=False)),
        min_size=1,
    )
)
def test_suggested_weights_are_always_whole_and_within_bounds(data: dict[str, tuple[int, float]]) -> None:
    base = {i: gpus for i, (gpus, _) in data.items()}
    observed = {i: rate for i, (_, rate) in data.items() if rate > 0}
    policy = weighing.WeightPolicy()
    weights = weighing.suggest(observed, base, policy=policy)
    assert weights.keys() == base.keys()
    assert all(isinstance(w, int) and 1 <= w <= policy.max_weight for w in weights.values())
    for identity in base.keys() - observed.keys():
        assert weights[identity] == min(base[identity], max(weights.values()))


def test_policy_refuses_bad_values_naming_them() -> None:
    with pytest.raises(ValueError, match="half_life_s must be positive"):
        weighing.WeightPolicy(half_life_s=0)
    with pytest.raises(ValueError, match="cap_factor"):
        weighing.WeightPolicy(cap_factor=-1)
    with pytest.raises(ValueError, match="tolerance"):
        weighing.WeightPolicy(tolerance=-0.1)


# ---- what a plan carries -----------------------------------------------------------------------
def test_changes_leave_out_small_drifts_and_reset_to_the_gpu_weight_with_null() -> None:
    base = {"a": 8, "b": 8, "c": 8, "d": 4}
    current = {"c": 40, "d": 20}
    suggested = {"a": 9, "b": 80, "c": 8, "d": 22}
    assert weighing.changes(suggested, base=base, current=current, tolerance=0.25) == {"b": 80, "c": None}


def test_max_over_mean() -> None:
    assert weighing.max_over_mean([1.0, 1.0, 4.0]) == 2.0
    assert weighing.max_over_mean([]) == 0.0
    assert weighing.max_over_mean([0.0, 0.0]) == 0.0


# ---- shedding -------------------------------------------------------------------------------------------
def manual(
    owners: dict[str, str], weights: dict[str, int], *, shards: int = 2, drained: list[str] | None = None
) -> Assignment:
    return Assignment(
        algorithm="bounded-ring",
        algorithm_version=2,
        shards={f"r1-{i}": ShardInfo(region="r1", index=i) for i in range(shards)},
        targets=owners,
        weights=weights,
        drained=drained or [],
    )


def test_shed_keeps_the_heaviest_and_drops_what_is_above_the_limit() -> None:
    owners = {"heavy": "r1-0", "a": "r1-0", "b": "r1-0", "c": "r1-1", "d": "r1-1"}
    weights = {"heavy": 10, "a": 2, "b": 2, "c": 2, "d": 2}
    trimmed = shed(manual(owners, weights), load_factor=1.05)  # mean 9, limit 9.45
    assert trimmed.targets == {"heavy": "r1-0", "c": "r1-1", "d": "r1-1"}


def test_shed_gives_up_one_target_that_covers_the_excess_rather_than_many_light_ones() -> None:
    owners = (
        {"big": "r1-0", "mid": "r1-0"}
        | {f"l{i}": "r1-0" for i in range(4)}
        | {f"m{i}": "r1-1" for i in range(10)}
    )
    weights = {"big": 10, "mid": 4} | dict.fromkeys(
        [f"l{i}" for i in range(4)] + [f"m{i}" for i in range(10)], 1
    )
    trimmed = shed(manual(owners, weights), load_factor=1.05)  # mean 14, limit 14.7: r1-0 is 3.3 over
    assert set(owners) - set(trimmed.targets) == {"mid"}


def test_shed_keeps_pinned_targets_whatever_their_weight() -> None:
    owners = {"heavy": "r1-0", "pinned": "r1-0", "c": "r1-1"}
    weights = {"heavy": 10, "pinned": 2, "c": 2}
    trimmed = shed(manual(owners, weights), load_factor=1.05, pinned={"pinned"})
    assert trimmed.targets == {"heavy": "r1-0", "pinned": "r1-0", "c": "r1-1"}


def test_shed_leaves_balanced_shards_alone() -> None:
    owners = {"a": "r1-0", "b": "r1-0", "c": "r1-1", "d": "r1-1"}
    assignment = manual(owners, dict.fromkeys(owners, 4))
    assert shed(assignment, load_factor=1.05) == assignment


def test_shed_empties_drained_shards() -> None:
    owners = {"a": "r1-0", "b": "r1-1"}
    trimmed = shed(manual(owners, {"a": 1, "b": 1}, drained=["r1-1"]), load_factor=1.05)
    assert trimmed.targets == {"a": "r1-0"}


def test_a_weights_plan_with_shedding_isolates_a_heavy_target_and_reruns_move_nothing() -> None:
    fleet_spec = spec(4)
    targets = [target(i, gpus=2) for i in range(40)]
    before = assign(fleet_spec, targets)
    heavy = targets[0].identity
    weights = {heavy: 20}  # 10x its two GPUs
    sticky = assign(fleet_spec, targets, previous=before, weight_overrides=weights)
    assert sticky.targets == before.targets  # new weights alone move nothing (the keep limit)
    after = assign(fleet_spec, targets, previous=shed(sticky, load_factor=1.05), weight_overrides=weights)
    load, was = after.load(), sticky.load()
    assert load[after.targets[heavy]] < was[sticky.targets[heavy]]
    assert weighing.max_over_mean(load.values()) < min(1.1, weighing.max_over_mean(was.values()))
    moved = diff(before, after).counts.moved
    assert 0 < moved < len(targets) / 2
    rerun = assign(fleet_spec, targets, previous=after, weight_overrides=weights)
    assert diff(after, rerun).counts.moved == 0


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 8))
def test_shedding_never_leaves_a_shard_above_the_limit_unless_one_target_is(seed: int, shards: int) -> None:
    rnd = random.Random(seed)
    names = [f"r1-{i}" for i in range(shards)]
    owners = {f"t{i}": rnd.choice(names) for i in range(rnd.randint(1, 60))}
    weights = {i: rnd.choice([1, 2, 4, 8, 80]) for i in owners}
    trimmed = shed(manual(owners, weights, shards=shards), load_factor=1.05)
    limit = 1.05 * sum(weights.values()) / shards
    for name in names:
        kept = [weights[i] for i, s in trimmed.targets.items() if s == name]
        assert sum(kept) <= limit or len(kept) == 1
        had = [i for i, s in owners.items() if s == name]
        assert bool(kept) == bool(had)  # a shard that had targets keeps at least one
