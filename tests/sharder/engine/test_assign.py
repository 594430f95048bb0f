"""The assignment engine: property tests for balance, movement and determinism, bad input."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from statistics import fmean

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharder.engine.assigning import ALGORITHM, STRATEGIES, assign, capacity, place
from sharder.engine.assignment import Assignment
from sharder.engine.planning import diff
from sharder.kernel.errors import AssignmentError, InventoryError, SpecError
from sharder.model.inventory import Target
from sharder.model.loading import parse_inventory, parse_model
from sharder.model.spec import FederationSpec, shard_id

ROOT = Path(__file__).resolve().parents[3]
REGIONS = ["r-a", "r-b", "r-c"]
ALGORITHMS = sorted(STRATEGIES)
FAST = settings(max_examples=40, deadline=None)
Scenario = tuple[dict[str, int | None], list[Target]]


def make_spec(
    shards: dict[str, int | None], *, replication_factor: int = 1, algorithm: str = ALGORITHM
) -> FederationSpec:
    # model_construct on the sharding part: the spec may still only list older algorithm names.
    spec = FederationSpec.model_validate(
        {
            "cluster": "test",
            "regions": [{"name": name, "shards": count} for name, count in shards.items()],
            "sharding": {"replication_factor": replication_factor, "targets_per_shard": 12},
            "jobs": [{"name": "gpu"}],
        }
    )
    sharding = spec.sharding.model_copy(update={"algorithm": algorithm})
    return spec.model_copy(update={"sharding": sharding})


def ip(n: int) -> str:
    return f"{10 + (n >> 24)}.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def gpu_target(n: int, *, region: str, gpus: int = 8, node: str | None = None) -> Target:
    return Target(address=ip(n), port=9400, job="gpu", node=node or f"n{n}", region=region, gpus=gpus)


def seeded_targets(count: int, *, region: str, seed: int = 0) -> list[Target]:
    rnd = random.Random(seed)
    return [gpu_target(n, region=region, gpus=rnd.choice((4, 8))) for n in rnd.sample(range(1 << 24), count)]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    regions = REGIONS[: draw(st.integers(min_value=1, max_value=3))]
    shards = {r: draw(st.one_of(st.none(), st.integers(min_value=1, max_value=6))) for r in regions}
    numbers = draw(st.lists(st.integers(min_value=0, max_value=(1 << 24) - 1), unique=True, max_size=120))
    targets = [
        gpu_target(
            n,
            region=draw(st.sampled_from(regions)),
            gpus=draw(st.sampled_from([0, 1, 4, 8])),
            node=f"n{n % 40}",
        )
        for n in numbers
    ]
    return shards, targets


def loads_by_region(assignment: Assignment) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for shard, load in assignment.load().items():
        out.setdefault(assignment.shards[shard].region, []).append(load)
    return out


def moved(old: Assignment, new: Assignment) -> set[str]:
    return {i for i, s in new.targets.items() if i in old.targets and old.targets[i] != s}


# -- determinism -------------------------------------------------------------------------

BUILD = """
import random
from sharder.engine.assigning import assign
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec

def build():
    rnd = random.Random(7)
    spec = {"cluster": "c", "jobs": [{"name": "gpu"}],
            "regions": [{"name": "r-a", "shards": 5}, {"name": "r-b"}]}
    targets = [Target(address=f"10.1.{n >> 8}.{n & 255}", port=9400, job="gpu", node=f"n{n % 300}",
                      region=rnd.choice(["r-a", "r-b"]), gpus=rnd.choice([4, 8]))
               for n in rnd.sample(range(1 << 16), 1500)]
    previous = assign(FederationSpec.model_validate({**spec, "regions": [{"name": "r-a", "shards": 4},
                                                                         {"name": "r-b", "shards": 9}]}),
                      targets)
    return assign(FederationSpec.model_validate(spec), targets, previous=previous)
"""


def canonical(assignment: Assignment) -> str:
    return json.dumps(assignment.model_dump(mode="json"), sort_keys=True)


def test_same_result_in_processes_with_different_hash_seeds() -> None:
    namespace: dict[str, object] = {}
    exec(BUILD, namespace)
    here = canonical(namespace["build"]())  # type: ignore[operator]
    script = BUILD + "\nimport json\nprint(json.dumps(build().model_dump(mode='json'), sort_keys=True))"
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == here


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(scenario=scenarios(), seed=st.integers(min_value=0, max_value=2**32))
@FAST
def test_any_order_gives_the_same_assignment(algorithm: str, scenario: Scenario, seed: int) -> None:
    shards, targets = scenario
    spec = make_spec(shards, algorithm=algorithm)
    shuffled = list(targets)
    random.Random(seed).shuffle(shuffled)
    first = assign(spec, targets)
    assert assign(spec, shuffled) == first
    assert canonical(assign(spec, shuffled)) == canonical(first)
    grown = make_spec({r: (n or 1) + 1 for r, n in shards.items()}, algorithm=algorithm)
    assert assign(grown, shuffled, previous=first) == assign(grown, targets, previous=first)


# -- balance and regions -----------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(scenario=scenarios())
@FAST
def test_no_shard_above_capacity(algorithm: str, scenario: Scenario) -> None:
    shards, targets = scenario
    assignment = assign(make_spec(shards, algorithm=algorithm), targets)
    for region, loads in loads_by_region(assignment).items():
        weights = [t.weight for t in targets if t.region == region]
        total, heaviest = sum(weights), max(weights, default=0)
        cap = capacity(total, shards=len(loads), heaviest=heaviest, load_factor=1.05)
        assert max(loads) <= cap
        assert cap <= max(1.05 * total / len(loads), -(-total // len(loads)) + heaviest - 1)


def test_weighted_max_over_mean_is_within_the_load_factor() -> None:
    targets = seeded_targets(20_000, region="r-a")
    loads = list(assign(make_spec({"r-a": 20}), targets).load().values())
    assert max(loads) / fmean(loads) <= 1.05


@given(scenario=scenarios())
@FAST
def test_targets_stay_in_their_region_and_every_region_gets_its_shards(
    scenario: Scenario,
) -> None:
    shards, targets = scenario
    spec = make_spec(shards)
    assignment = assign(spec, targets)
    expected = set()
    for region, fixed in shards.items():
        nodes = {t.node for t in targets if t.region == region}
        count = fixed if fixed is not None else max(1, -(-len(nodes) // 12))
        expected |= {shard_id(region, i) for i in range(count)}
    assert set(assignment.shards) == expected
    for target in targets:
        assert assignment.shards[assignment.targets[target.identity]].region == target.region
    assert assignment.weights == {t.identity: t.weight for t in targets}


def test_a_region_without_targets_still_gets_its_shards() -> None:
    assignment = assign(make_spec({"r-a": None, "r-b": 3}), [gpu_target(1, region="r-a")])
    assert sorted(assignment.shards) == ["r-a-0", "r-b-0", "r-b-1", "r-b-2"]
    assert assignment.load() == {"r-a-0": 8, "r-b-0": 0, "r-b-1": 0, "r-b-2": 0}


@given(scenario=scenarios(), replicas=st.integers(min_value=1, max_value=3))
@FAST
def test_replicas_are_distinct_children_in_the_targets_region(scenario: Scenario, replicas: int) -> None:
    shards, targets = scenario
    assignment = assign(make_spec(shards, replication_factor=replicas), targets)
    assert assignment.replication_factor == replicas
    for target in targets:
        shard = assignment.targets[target.identity]
        children = assignment.children(shard)
        assert len({child for child, _ in children}) == replicas
        assert [k for _, k in children] == list(range(replicas))
        assert all(child.startswith(shard) for child, _ in children)
        assert assignment.shards[shard].region == target.region


# -- movement and stickiness -------------------------------------------------------------


def test_adding_a_shard_moves_about_its_share() -> None:
    targets = seeded_targets(6000, region="r-a")
    ratios = []
    for name in ("r-a", "r-b", "r-c", "r-d", "r-e"):
        here = [t.model_copy(update={"region": name}) for t in targets]
        before = assign(make_spec({name: 12}), here)
        after = assign(make_spec({name: 13}), here, previous=before)
        assert set(after.targets.values()) >= {f"{name}-12"}
        ratios.append(len(moved(before, after)) / len(here) * 13)
    assert fmean(ratios) <= 1.25 and max(ratios) <= 1.4, ratios


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(scenario=scenarios())
@FAST
def test_removing_a_shard_moves_only_its_targets(algorithm: str, scenario: Scenario) -> None:
    shards, targets = scenario
    fixed = {r: (n or 1) + 1 for r, n in shards.items()}
    before = assign(make_spec(fixed, algorithm=algorithm), targets)
    region = REGIONS[0]
    fixed[region] -= 1
    after = assign(make_spec(fixed, algorithm=algorithm), targets, previous=before)
    gone = shard_id(region, fixed[region])
    assert moved(before, after) == {i for i, s in before.targets.items() if s == gone}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(scenario=scenarios(), extra=st.integers(min_value=1, max_value=30))
@FAST
def test_sticky_runs_are_stable_and_new_targets_move_nobody(
    algorithm: str, scenario: Scenario, extra: int
) -> None:
    shards, targets = scenario
    spec = make_spec({r: n or 2 for r, n in shards.items()}, algorithm=algorithm)
    first = assign(spec, targets)
    assert assign(spec, targets, previous=first) == first
    newcomers = [gpu_target((1 << 24) + i, region=REGIONS[i % len(shards)]) for i in range(extra)]
    grown = assign(spec, targets + newcomers, previous=first)
    assert not moved(first, grown)


# -- pinning and bad input ----------------------------------------------------------------


def test_a_previous_assignment_from_another_algorithm_is_refused() -> None:
    spec = make_spec({"r-a": 2})
    targets = [gpu_target(n, region="r-a") for n in range(10)]
    old = assign(spec, targets).model_copy(update={"algorithm": "hashmod", "algorithm_version": 3})
    with pytest.raises(AssignmentError) as caught:
        assign(spec, targets, previous=old)
    assert str(caught.value) == (
        "the previous assignment was made by hashmod v3 but this run assigns with bounded-ring v2; "
        "switching moves most targets to another shard (their children lose the recent history of "
        "those targets). Pass allow_algorithm_change=True (--allow-algorithm-change) to accept the reshuffle"
    )
    fresh = assign(spec, targets, previous=old, allow_algorithm_change=True)
    assert fresh == assign(spec, targets)


def test_a_target_in_an_unknown_region_is_named() -> None:
    spec = make_spec({"r-a": 1, "r-b": 1})
    targets = [gpu_target(1, region="r-a"), gpu_target(9, region="eu-west"), gpu_target(5, region="eu-x")]
    with pytest.raises(AssignmentError) as caught:
        assign(spec, targets)
    assert str(caught.value) == (
        "target '10.0.0.5:9400' is in region 'eu-x', which the spec does not define "
        "(known regions: r-a, r-b) (1 more in unknown regions)"
    )


def test_duplicate_identities_are_refused() -> None:
    spec = make_spec({"r-a": 2})
    with pytest.raises(AssignmentError) as caught:
        assign(spec, [gpu_target(1, region="r-a"), gpu_target(2, region="r-a"), gpu_target(1, region="r-a")])
    assert str(caught.value) == (
        "target '10.0.0.1:9400' is listed more than once; identities must be unique "
        "(set 'identity' on targets that share an address and port)"
    )


def test_an_unknown_algorithm_is_refused() -> None:
    with pytest.raises(AssignmentError) as caught:
        assign(make_spec({"r-a": 1}), [], algorithm="magic")
    assert (
        str(caught.value) == "unknown assignment algorithm 'magic' (known: bounded-ring, bounded-rendezvous)"
    )


def test_zero_shards_cannot_be_specified() -> None:
    data = {"cluster": "c", "regions": [{"name": "r-a", "shards": 0}], "jobs": [{"name": "gpu"}]}
    with pytest.raises(SpecError) as caught:
        parse_model(FederationSpec, data, source="federation.yaml")
    assert caught.value.field == "regions[0].shards"
    assert str(caught.value) == (
        "federation.yaml: field 'regions[0].shards' Input should be greater than or equal to 1 (value 0)"
    )


def test_duplicate_targets_are_refused_when_loading() -> None:
    target = {"address": "10.0.0.1", "port": 9400, "job": "gpu", "node": "n1", "region": "r-a"}
    with pytest.raises(InventoryError) as caught:
        parse_inventory({"targets": [target, target]}, source="inventory.yaml")
    assert str(caught.value) == (
        "inventory.yaml: field 'targets[1].address' duplicate target (also at targets[0])"
        " (value '10.0.0.1:9400')"
    )


def test_an_assignment_from_v1_is_kept_whole_on_upgrade() -> None:
    """v2 changes only how changes are placed, so a v1 assignment.json moves nobody."""
    spec = make_spec({"r-a": 7, "r-b": 3})
    targets = seeded_targets(900, region="r-a") + seeded_targets(300, region="r-b", seed=1)
    # A v1 file: any valid placement, e.g. the one written before the upgrade.
    placed = assign(spec, targets)
    rotated = {
        i: shard_id(s.rsplit("-", 1)[0], (int(s.rsplit("-", 1)[1]) + 1) % (7 if s.startswith("r-a") else 3))
        for i, s in placed.targets.items()
    }
    v1 = Assignment.model_validate(
        {**placed.model_dump(mode="json"), "algorithm_version": 1, "targets": rotated}
    )
    upgraded = assign(spec, targets, previous=v1)
    assert upgraded.algorithm_version == 2
    assert upgraded.targets == v1.targets
    plan = diff(v1, upgraded)
    assert plan.algorithm_changed and plan.counts.moved == 0


@given(scenario=scenarios(), seed=st.integers(min_value=0, max_value=2**32))
@FAST
def test_any_placement_v1_could_write_is_kept_on_upgrade(scenario: Scenario, seed: int) -> None:
    """v1 filled shards up to capacity(); v2 keeps every such placement, even at that edge."""
    shards, targets = scenario
    fixed = {r: n or 3 for r, n in shards.items()}
    spec = make_spec(fixed)
    rnd = random.Random(seed)
    placed: dict[str, str] = {}
    for region, count in fixed.items():
        members = [t for t in targets if t.region == region]
        weights = [t.weight for t in members]
        cap = capacity(sum(weights), shards=count, heaviest=max(weights, default=0), load_factor=1.05)
        load = [0] * count
        for t in sorted(members, key=lambda t: -t.weight):  # heaviest first, as full as allowed
            room = [s for s in range(count) if load[s] + t.weight <= cap]
            s = max(room, key=lambda s: (load[s], rnd.random())) if room else load.index(min(load))
            load[s] += t.weight
            placed[t.identity] = shard_id(region, s)
    v1 = assign(spec, targets).model_copy(update={"algorithm_version": 1, "targets": placed})
    assert assign(spec, targets, previous=v1).targets == placed


def test_a_v1_shard_filled_to_its_bound_keeps_everything() -> None:
    """105 GPUs on 10 shards, one 8-GPU target: v1 allowed 11 + 8 - 1 = 18 on one shard."""
    spec = make_spec({"r-a": 10})
    heavy = gpu_target(0, region="r-a", gpus=8)
    ones = [gpu_target(n, region="r-a", gpus=1) for n in range(1, 98)]
    placed = {heavy.identity: "r-a-0"}
    placed.update((t.identity, "r-a-0" if n < 10 else f"r-a-{1 + n % 9}") for n, t in enumerate(ones))
    v1 = assign(spec, [heavy, *ones]).model_copy(update={"algorithm_version": 1, "targets": placed})
    assert v1.load()["r-a-0"] == 18 == capacity(105, shards=10, heaviest=8, load_factor=1.05)
    assert assign(spec, [heavy, *ones], previous=v1).targets == placed


@pytest.mark.parametrize("trial", range(3))
def test_at_24_targets_per_shard_adding_a_shard_moves_about_its_share(trial: int) -> None:
    """The sizing users run (about 24 targets per child): the new shard's share and little more."""
    rnd = random.Random(trial)
    keys = [f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}:9400" for n in rnd.sample(range(1 << 24), 2400)]
    weights = [rnd.choice((4, 8)) for _ in keys]
    names = [shard_id(f"t{trial}", i) for i in range(101)]
    base = place(names[:100], keys, weights, load_factor=1.05)
    previous = {k: names[s] for k, s in zip(keys, base, strict=True)}
    grown = place(names, keys, weights, load_factor=1.05, previous=previous, previous_shards=names[:100])
    moved = sum(1 for b, g in zip(base, grown, strict=True) if b != g)
    assert moved <= 1.2 * len(keys) / 101
    assert all(g == 100 for b, g in zip(base, grown, strict=True) if b != g)  # all to the new shard
    load = [0] * 101
    for shard, weight in zip(grown, weights, strict=True):
        load[shard] += weight
    assert max(load) / fmean(load) <= 1.05
    assert load[100] >= 0.9 * fmean(load)


def test_several_new_shards_share_the_growth() -> None:
    targets = seeded_targets(1300, region="r-a")
    before = assign(make_spec({"r-a": 10}), targets)
    after = assign(make_spec({"r-a": 13}), targets, previous=before)
    loads = after.load()
    mean = fmean(loads.values())
    assert all(loads[f"r-a-{i}"] >= 0.9 * mean for i in (10, 11, 12))
    assert max(loads.values()) <= 1.05 * mean
    assert len(moved(before, after)) <= 1.1 * len(targets) * 3 / 13


def test_identities_match_the_target_property() -> None:
    """assign() spells Target.identity out for speed; it must stay the same function."""
    from sharder.engine.assigning import _identities

    targets = [
        Target(address="10.0.0.1", port=9400, job="gpu", node="n1", region="r-a"),
        Target(address="fd00::1", port=9100, job="gpu", node="n2", region="r-a"),
        Target(address="gpu-node-7.example", port=1, job="gpu", node="n3", region="r-a"),
        Target.model_validate(
            {
                "address": "10.0.0.2",
                "port": 9400,
                "job": "gpu",
                "node": "n4",
                "region": "r-a",
                "identity": "n4-gpu",
            }
        ),
    ]
    assert _identities(targets) == [t.identity for t in targets]
    assert set(assign(make_spec({"r-a": 2}), targets).targets) == {t.identity for t in targets}


def test_a_jobs_weight_counts_in_the_full_assignment_as_in_the_incremental_one() -> None:
    from sharder.engine.incremental import IncrementalAssigner

    spec = make_spec({"r": 3})
    nodes = [gpu_target(n, region="r") for n in range(30)]
    exporters = [t.model_copy(update={"port": 9100, "job": "node", "explicit_weight": 1}) for t in nodes]
    full = assign(spec, nodes + exporters)
    assert {full.weights[t.identity] for t in exporters} == {1}  # a node exporter is not 8 GPUs
    assert sum(full.load().values()) == 30 * 8 + 30
    grown = IncrementalAssigner(spec, nodes + exporters[:-1]).apply(added=[exporters[-1]], removed=[])
    assert grown == assign(spec, nodes + exporters, previous=assign(spec, nodes + exporters[:-1]))
