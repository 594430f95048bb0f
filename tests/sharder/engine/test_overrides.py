"""assign()'s control-plane overrides: shard_counts, pins, drained, weight_overrides."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharder.engine.assigning import STRATEGIES, assign, capacity
from sharder.engine.assignment import Assignment
from sharder.kernel.errors import AssignmentError
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec, shard_id

REGIONS = ["r-a", "r-b"]
ALGORITHMS = sorted(STRATEGIES)
FAST = settings(max_examples=40, deadline=None)


def make_spec(shards: dict[str, int | None], *, algorithm: str = "bounded-ring") -> FederationSpec:
    return FederationSpec.model_validate(
        {
            "cluster": "test",
            "regions": [{"name": name, "shards": count} for name, count in shards.items()],
            "sharding": {"targets_per_shard": 12, "algorithm": algorithm},
            "jobs": [{"name": "gpu"}],
        }
    )


def target(n: int, *, region: str, gpus: int = 8) -> Target:
    return Target(
        address=f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}",
        port=9400,
        job="gpu",
        node=f"n{n % 50}",
        region=region,
        gpus=gpus,
    )


@st.composite
def fleets(draw: st.DrawFn, *, min_size: int = 0) -> list[Target]:
    numbers = draw(st.lists(st.integers(0, (1 << 24) - 1), unique=True, min_size=min_size, max_size=100))
    return [
        target(n, region=draw(st.sampled_from(REGIONS)), gpus=draw(st.sampled_from([0, 1, 4, 8])))
        for n in numbers
    ]


def region_cap(assignment: Assignment, region: str, *, active: int) -> int:
    weights = [
        assignment.weights[i] for i, s in assignment.targets.items() if assignment.shards[s].region == region
    ]
    return capacity(sum(weights), shards=active, heaviest=max(weights, default=0), load_factor=1.05)


def moved(old: Assignment, new: Assignment) -> set[str]:
    return {i for i, s in new.targets.items() if i in old.targets and old.targets[i] != s}


# -- shard_counts ------------------------------------------------------------------------


@given(
    fleet=fleets(),
    counts=st.fixed_dictionaries({}, optional={r: st.integers(1, 7) for r in REGIONS}),
    fixed=st.sampled_from([None, 3]),
)
@FAST
def test_shard_counts_replace_the_specs_sizing(
    fleet: list[Target], counts: dict[str, int], fixed: int | None
) -> None:
    spec = make_spec(dict.fromkeys(REGIONS, fixed))
    assignment = assign(spec, fleet, shard_counts=counts)
    plain = assign(spec, fleet)
    for region in REGIONS:
        expected = counts.get(region, sum(1 for info in plain.shards.values() if info.region == region))
        have = {s for s, info in assignment.shards.items() if info.region == region}
        assert have == {shard_id(region, i) for i in range(expected)}
    for t in fleet:
        assert assignment.shards[assignment.targets[t.identity]].region == t.region
    if not counts:
        assert assignment == plain


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (
            {"eu-x": 2},
            "shard_counts names region 'eu-x', which the spec does not define (known regions: r-a, r-b)",
        ),
        ({"r-a": 0}, "shard_counts['r-a'] must be a whole number of shards, at least 1 (value 0)"),
        ({"r-b": True}, "shard_counts['r-b'] must be a whole number of shards, at least 1 (value True)"),
        ({"r-b": "3"}, "shard_counts['r-b'] must be a whole number of shards, at least 1 (value '3')"),
    ],
)
def test_bad_shard_counts_are_named(counts: dict[str, Any], message: str) -> None:
    with pytest.raises(AssignmentError) as caught:
        assign(make_spec({"r-a": 2, "r-b": 2}), [], shard_counts=counts)
    assert str(caught.value) == message


# -- pins --------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(fleet=fleets(min_size=1), data=st.data())
@FAST
def test_pinned_targets_sit_on_their_shard_and_count_against_capacity(
    algorithm: str, fleet: list[Target], data: st.DataObject
) -> None:
    spec = make_spec({"r-a": 4, "r-b": 3}, algorithm=algorithm)
    chosen = data.draw(st.lists(st.sampled_from(fleet), unique_by=lambda t: t.identity, max_size=len(fleet)))
    pins = {t.identity: shard_id(t.region, data.draw(st.integers(0, 2))) for t in chosen}
    gone = {"absent-host:9400": "r-b-1"}  # a pin of an absent target is kept, not applied
    previous = data.draw(st.sampled_from([None, assign(spec, fleet)]))
    assignment = assign(spec, fleet, pins={**pins, **gone}, previous=previous)
    for identity, shard in pins.items():
        assert assignment.targets[identity] == shard
    load = assignment.load()
    for shard, info in assignment.shards.items():
        pinned = sum(assignment.weights[i] for i, s in pins.items() if s == shard)
        cap = region_cap(assignment, info.region, active=4 if info.region == "r-a" else 3)
        assert load[shard] <= max(cap, pinned)
        if pinned > cap:  # pins alone overflow it: nobody else is put there
            assert all(i in pins for i, s in assignment.targets.items() if s == shard)


@pytest.mark.parametrize(
    ("pins", "drained", "message"),
    [
        (
            {"10.0.0.1:9400": "r-a-9"},
            None,
            "target '10.0.0.1:9400' is pinned to shard 'r-a-9', which does not exist "
            "(shards: r-a-0, r-a-1, r-b-0, r-b-1)",
        ),
        (
            {"10.0.0.1:9400": "r-b-0"},
            None,
            "target '10.0.0.1:9400' in region 'r-a' is pinned to shard 'r-b-0' of region 'r-b'; "
            "a target stays in its own region",
        ),
        (
            {"10.0.0.1:9400": "r-a-1"},
            ["r-a-1"],
            "target '10.0.0.1:9400' is pinned to shard 'r-a-1', which is drained; "
            "unpin it or undrain the shard",
        ),
        ({"10.0.0.1:9400": 3}, None, "pins['10.0.0.1:9400'] must be a shard id (value 3)"),
    ],
)
def test_bad_pins_are_named(pins: dict[str, Any], drained: list[str] | None, message: str) -> None:
    with pytest.raises(AssignmentError) as caught:
        assign(make_spec({"r-a": 2, "r-b": 2}), [target(1, region="r-a")], pins=pins, drained=drained)
    assert str(caught.value) == message


# -- drained -----------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(fleet=fleets(), data=st.data())
@FAST
def test_drained_shards_exist_empty_and_only_their_targets_move(
    algorithm: str, fleet: list[Target], data: st.DataObject
) -> None:
    spec = make_spec({"r-a": 4, "r-b": 3}, algorithm=algorithm)
    before = assign(spec, fleet)
    drained = data.draw(st.sets(st.sampled_from(["r-a-0", "r-a-1", "r-a-3", "r-b-2"]), max_size=3))
    after = assign(spec, fleet, previous=before, drained=drained)
    assert set(after.shards) == set(before.shards)
    assert after.drained == sorted(drained)
    assert not drained & set(after.targets.values())
    assert moved(before, after) == {i for i, s in before.targets.items() if s in drained}
    load = after.load()
    for region, count in (("r-a", 4), ("r-b", 3)):
        active = count - sum(1 for s in drained if s.startswith(region))
        cap = region_cap(after, region, active=active)
        assert all(load[s] <= cap for s, info in after.shards.items() if info.region == region)
    # Undraining makes the shard new again: it takes targets back without a full reshuffle.
    undrained = assign(spec, fleet, previous=after)
    assert undrained.drained == []
    assert assign(spec, fleet, previous=undrained) == undrained


def test_an_undrained_shard_gets_targets_again() -> None:
    spec = make_spec({"r-a": 5})
    fleet = [target(n, region="r-a", gpus=4) for n in range(500)]
    drained = assign(spec, fleet, drained=["r-a-2"])
    assert drained.load()["r-a-2"] == 0
    back = assign(spec, fleet, previous=drained)
    assert back.load()["r-a-2"] > 0.8 * sum(back.load().values()) / 5


@pytest.mark.parametrize(
    ("drained", "message"),
    [
        (["r-a-7"], "drained shard 'r-a-7' does not exist (shards: r-a-0, r-a-1, r-b-0, r-b-1)"),
        (
            ["r-a-0", "r-a-1"],
            "every shard of region 'r-a' is drained (r-a-0, r-a-1) but it has 1 targets; "
            "undrain at least one",
        ),
        ("r-a-0", "drained must be a collection of shard ids, not one string (value 'r-a-0')"),
    ],
)
def test_bad_drains_are_named(drained: Any, message: str) -> None:
    with pytest.raises(AssignmentError) as caught:
        assign(make_spec({"r-a": 2, "r-b": 2}), [target(1, region="r-a")], drained=drained)
    assert str(caught.value) == message


def test_a_region_may_be_drained_entirely_while_it_has_no_targets() -> None:
    assignment = assign(
        make_spec({"r-a": 2, "r-b": 1}), [target(1, region="r-b")], drained=["r-a-0", "r-a-1"]
    )
    assert assignment.load() == {"r-a-0": 0, "r-a-1": 0, "r-b-0": 8}


# -- weight_overrides --------------------------------------------------------------------


@given(fleet=fleets(min_size=1), data=st.data())
@FAST
def test_weight_overrides_replace_the_gpu_count(fleet: list[Target], data: st.DataObject) -> None:
    spec = make_spec({"r-a": 3, "r-b": 2})
    chosen = data.draw(st.lists(st.sampled_from(fleet), unique_by=lambda t: t.identity))
    overrides = {t.identity: data.draw(st.integers(1, 40)) for t in chosen}
    assignment = assign(spec, fleet, weight_overrides={**overrides, "absent:1": 3})
    assert assignment.weights == {t.identity: overrides.get(t.identity, t.weight) for t in fleet}
    load = assignment.load()
    for shard, info in assignment.shards.items():
        assert load[shard] <= region_cap(assignment, info.region, active=3 if info.region == "r-a" else 2)


@pytest.mark.parametrize("weight", [0, -4, 2.5, True, "8"])
def test_bad_weight_overrides_are_named(weight: Any) -> None:
    with pytest.raises(AssignmentError) as caught:
        assign(make_spec({"r-a": 2}), [target(1, region="r-a")], weight_overrides={"10.0.0.1:9400": weight})
    assert str(caught.value) == (
        f"weight_overrides['10.0.0.1:9400'] must be a whole number, at least 1 (value {weight!r})"
    )


def test_no_overrides_is_the_plain_assignment() -> None:
    spec = make_spec({"r-a": 3, "r-b": None})
    fleet = [target(n, region=REGIONS[n % 2], gpus=4 + 4 * (n % 3 == 0)) for n in range(300)]
    plain = assign(spec, fleet)
    assert assign(spec, fleet, shard_counts={}, pins={}, drained=(), weight_overrides={}) == plain
    assert "drained" not in plain.model_dump(mode="json")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(fleet=fleets(), data=st.data())
@FAST
def test_growing_with_pins_and_drains_keeps_every_promise(
    algorithm: str, fleet: list[Target], data: st.DataObject
) -> None:
    """Shards added, some drained, some targets pinned (to new shards too), all at once."""
    before = assign(make_spec({"r-a": 3, "r-b": 2}, algorithm=algorithm), fleet)
    spec = make_spec({"r-a": 6, "r-b": 3}, algorithm=algorithm)
    drained = data.draw(st.sets(st.sampled_from(["r-a-0", "r-a-4", "r-b-1"]), max_size=2))
    usable = {
        r: [s for s in (f"{r}-{i}" for i in range(6 if r == "r-a" else 3)) if s not in drained]
        for r in REGIONS
    }
    chosen = data.draw(st.lists(st.sampled_from(fleet), unique_by=lambda t: t.identity)) if fleet else []
    pins = {t.identity: data.draw(st.sampled_from(usable[t.region])) for t in chosen}
    after = assign(spec, fleet, previous=before, pins=pins, drained=drained)
    assert all(after.targets[i] == s for i, s in pins.items())
    assert not drained & set(after.targets.values())
    load = after.load()
    for shard, info in after.shards.items():
        pinned = sum(after.weights[i] for i, s in pins.items() if s == shard)
        active = len(usable[info.region])
        assert load[shard] <= max(region_cap(after, info.region, active=active), pinned)
    # Kept targets stay put on a rerun, and the new shards are not new any more.
    assert assign(spec, fleet, previous=after, pins=pins, drained=drained) == after
