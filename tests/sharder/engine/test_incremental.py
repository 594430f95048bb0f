"""IncrementalAssigner: every result equals the from-scratch sticky assignment of the same set."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharder.engine.assigning import assign
from sharder.engine.assignment import Assignment
from sharder.engine.cowmap import CowMap, _slot
from sharder.engine.incremental import IncrementalAssigner
from sharder.engine.planning import diff
from sharder.kernel.errors import AssignmentError
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec

FAST = settings(max_examples=40, deadline=None)
NEVER = float("inf")  # fallback_fraction that keeps every change on the fast path


def make_spec(shards: Mapping[str, int | None], *, targets_per_shard: int = 12) -> FederationSpec:
    return FederationSpec.model_validate(
        {
            "cluster": "test",
            "regions": [{"name": name, "shards": count} for name, count in shards.items()],
            "sharding": {"targets_per_shard": targets_per_shard},
            "jobs": [{"name": "gpu"}],
        }
    )


def target(n: int, *, region: str, gpus: int, node: str | None = None) -> Target:
    return Target(
        address=f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}",
        port=9400,
        job="gpu",
        node=node or f"n{n}",
        region=region,
        gpus=gpus,
    )


class Fleet:
    """The model: the set of targets and the overrides, assigned from scratch for comparison."""

    def __init__(self, spec: FederationSpec, targets: list[Target], **overrides: Any) -> None:
        self.spec = spec
        self.targets = {t.identity: t for t in targets}
        self.overrides = overrides

    def change(self, added: list[Target], removed: set[str]) -> None:
        for identity in removed:
            del self.targets[identity]
        self.targets.update((t.identity, t) for t in added)

    def expected(self, last: Assignment) -> Assignment:
        return assign(self.spec, list(self.targets.values()), previous=last, **self.overrides)


def _recount(assignment: Assignment) -> dict[str, int]:
    """Load per shard counted from scratch (the derived totals must equal it)."""
    totals: dict[str, int] = {}
    for identity, shard in assignment.targets.items():
        totals[shard] = totals.get(shard, 0) + assignment.weights.get(identity, 1)
    return totals


GPUS = st.sampled_from([0, 1, 4, 8])


@st.composite
def histories(draw: st.DrawFn) -> tuple[FederationSpec, list[Target], dict[str, Any], list[Any]]:
    """A spec, a first fleet, overrides, and a list of changes (added, removed, updated)."""
    regions = {"r-a": draw(st.integers(1, 6)), "r-b": draw(st.integers(1, 3))}
    spec = make_spec(regions)
    pool = iter(draw(st.permutations(range(400))))
    first = [
        target(next(pool), region=draw(st.sampled_from(list(regions))), gpus=draw(GPUS))
        for _ in range(draw(st.integers(0, 60)))
    ]
    overrides: dict[str, Any] = {}
    drain = regions["r-a"] > 1 and draw(st.booleans())
    if drain:
        overrides["drained"] = [f"r-a-{regions['r-a'] - 1}"]
    if len(first) > 0 and draw(st.booleans()):
        some = draw(st.lists(st.sampled_from(first), max_size=4, unique_by=lambda t: t.identity))
        usable = {"r-a": regions["r-a"] - drain, "r-b": regions["r-b"]}
        overrides["pins"] = {
            t.identity: f"{t.region}-{draw(st.integers(0, usable[t.region] - 1))}" for t in some
        }
    if len(first) > 0 and draw(st.booleans()):
        heavy = draw(st.lists(st.sampled_from(first), max_size=3, unique_by=lambda t: t.identity))
        overrides["weight_overrides"] = {t.identity: draw(st.integers(1, 24)) for t in heavy}
    changes = []
    for _ in range(draw(st.integers(1, 6))):
        added = [
            target(next(pool), region=draw(st.sampled_from(list(regions))), gpus=draw(GPUS))
            for _ in range(draw(st.integers(0, 12)))
        ]
        changes.append((added, draw(st.integers(0, 12)), draw(st.integers(0, 3)), draw(st.randoms())))
    return spec, first, overrides, changes


def play(spec: FederationSpec, first: list[Target], overrides: dict[str, Any], changes: list[Any]) -> int:
    """Apply every change incrementally and compare with assign(); returns targets moved."""
    fleet = Fleet(spec, first, **overrides)
    engine = IncrementalAssigner(spec, first, fallback_fraction=NEVER, **overrides)
    assert engine.assignment == assign(spec, first, **overrides)
    moves = 0
    for added, removals, updates, rnd in changes:
        present = sorted(fleet.targets)
        removed = set(rnd.sample(present, min(removals, len(present))))
        kept = [i for i in present if i not in removed]
        updated = [
            fleet.targets[i].model_copy(update={"gpus": rnd.choice([1, 4, 8])}) for i in kept[:updates]
        ]
        last = engine.assignment
        result = engine.apply(added=added + updated, removed=removed | {t.identity for t in updated})
        fleet.change(added + updated, removed)
        assert result == fleet.expected(last)
        last.load()  # the previous totals are known, so the new ones are derived from the change
        touched = engine.touched
        assert touched is not None
        assert diff(last, result, only=touched) == diff(last, result)  # the plan in the time of the change
        assert result.load() == {s: 0 for s in result.shards} | _recount(result)
        moves += sum(1 for i, s in result.targets.items() if i in last.targets and last.targets[i] != s)
    assert engine.fallbacks == 0
    return moves


@given(history=histories())
@FAST
def test_every_change_equals_the_full_sticky_assignment(history: tuple[Any, ...]) -> None:
    play(*history)


def test_capacity_edges_shed_exactly_as_the_full_assignment() -> None:
    """Heavy targets leaving lower the keep limit, so full shards shed; new heavy ones walk."""
    rnd = random.Random(3)
    spec = make_spec({"r-a": 4})
    first = [target(n, region="r-a", gpus=rnd.choice([1, 4, 8])) for n in range(80)]
    heavy = {first[0].identity: 40, first[1].identity: 40}
    engine = IncrementalAssigner(spec, first, weight_overrides=heavy, fallback_fraction=NEVER)
    fleet = Fleet(spec, first, weight_overrides=heavy)
    last = engine.assignment
    result = engine.apply(removed=set(heavy))
    fleet.change([], set(heavy))
    assert result == fleet.expected(last)
    assert any(last.targets[i] != s for i, s in result.targets.items())  # someone was shed
    changes = []
    for step in range(30):
        added = [target(1000 + step * 3 + k, region="r-a", gpus=8) for k in range(step % 3)]
        changes.append((added, 2 + step % 4, step % 2, random.Random(step)))
    play(spec, [fleet.targets[i] for i in sorted(fleet.targets)], {}, changes)


@given(data=st.data())
@settings(max_examples=5, deadline=None)
def test_bursts_of_a_thousand_registrations(data: st.DataObject) -> None:
    rnd = random.Random(data.draw(st.integers(0, 2**16)))
    spec = make_spec({"r-a": 40, "r-b": 10})
    numbers = rnd.sample(range(1 << 20), 4000)
    first = [target(n, region=rnd.choice(["r-a", "r-b"]), gpus=rnd.choice([4, 8])) for n in numbers[:2000]]
    burst = [
        target(n, region=rnd.choice(["r-a", "r-b"]), gpus=rnd.choice([4, 8])) for n in numbers[2000:3000]
    ]
    cuts = sorted(data.draw(st.lists(st.integers(0, 1000), max_size=4)))
    chunks = [burst[a:b] for a, b in zip([0, *cuts], [*cuts, 1000], strict=True)]
    changes = [(chunk, rnd.randrange(0, 200), 5, random.Random(i)) for i, chunk in enumerate(chunks)]
    play(spec, first, {}, changes)


def test_a_change_that_resizes_a_region_falls_back_and_still_matches() -> None:
    spec = make_spec({"r-a": None}, targets_per_shard=4)
    first = [target(n, region="r-a", gpus=8) for n in range(8)]
    engine = IncrementalAssigner(spec, first, fallback_fraction=NEVER)
    assert len(engine.assignment.shards) == 2
    last = engine.assignment
    # A second target on a known node changes no count: fast path.
    same_node = target(100, region="r-a", gpus=4, node="n1")
    result = engine.apply(added=[same_node])
    assert engine.fallbacks == 0
    assert result == assign(spec, [*first, same_node], previous=last)
    grown = engine.apply(added=[target(101, region="r-a", gpus=8)])  # ninth node: a third shard
    assert engine.fallbacks == 1 and len(grown.shards) == 3
    assert grown == assign(spec, engine.targets(), previous=result)
    again = engine.apply(added=[target(102, region="r-a", gpus=8)])
    assert engine.fallbacks == 1
    assert again == assign(spec, engine.targets(), previous=grown)


def test_a_large_change_runs_in_full() -> None:
    spec = make_spec({"r-a": 3})
    engine = IncrementalAssigner(spec, [target(n, region="r-a", gpus=4) for n in range(100)])
    last = engine.assignment
    added = [target(200 + n, region="r-a", gpus=8) for n in range(100)]
    assert engine.apply(added=added) == assign(spec, engine.targets(), previous=last)
    assert engine.fallbacks == 1


@pytest.mark.parametrize(
    ("added", "removed", "message"),
    [
        ([], {"10.9.9.9:9400"}, "cannot remove target '10.9.9.9:9400': it is not assigned"),
        (
            [target(1, region="r-a", gpus=4)],
            set(),
            "target '10.0.0.1:9400' is listed more than once; identities must be unique "
            "(set 'identity' on targets that share an address and port)",
        ),
        (
            [target(50, region="eu-x", gpus=4)],
            set(),
            "target '10.0.0.50:9400' is in region 'eu-x', which the spec does not define "
            "(known regions: r-a, r-b)",
        ),
        (
            [target(51, region="r-a", gpus=4)],
            set(),
            "target '10.0.0.51:9400' in region 'r-a' is pinned to shard 'r-b-0' of region 'r-b'; "
            "a target stays in its own region",
        ),
    ],
)
def test_bad_changes_are_named_and_change_nothing(
    added: list[Target], removed: set[str], message: str
) -> None:
    spec = make_spec({"r-a": 2, "r-b": 1})
    first = [target(n, region="r-a", gpus=4) for n in range(10)]
    engine = IncrementalAssigner(spec, first, pins={"10.0.0.51:9400": "r-b-0"}, fallback_fraction=NEVER)
    before = engine.assignment
    with pytest.raises(AssignmentError) as caught:
        engine.apply(added=added, removed=removed)
    assert str(caught.value) == message
    assert engine.assignment == before
    extra = target(60, region="r-a", gpus=8)
    assert engine.apply(added=[extra]) == assign(
        spec, [*first, extra], previous=before, pins={"10.0.0.51:9400": "r-b-0"}
    )


def test_no_change_returns_the_same_assignment() -> None:
    engine = IncrementalAssigner(make_spec({"r-a": 2}), [target(1, region="r-a", gpus=4)])
    assert engine.apply() is engine.assignment


@given(history=histories())
@settings(max_examples=20, deadline=None)
def test_sync_follows_full_lists_like_apply(history: tuple[Any, ...]) -> None:
    spec, first, overrides, changes = history
    engine = IncrementalAssigner(spec, first, fallback_fraction=NEVER, **overrides)
    fleet = {t.identity: t for t in first}
    for added, removals, updates, rnd in changes:
        present = sorted(fleet)
        for identity in rnd.sample(present, min(removals, len(present))):
            del fleet[identity]
        for identity in sorted(fleet)[:updates]:
            fleet[identity] = fleet[identity].model_copy(update={"gpus": rnd.choice([1, 4, 8])})
        fleet.update((t.identity, t) for t in added)
        listed = list(fleet.values())
        rnd.shuffle(listed)
        last = engine.assignment
        assert engine.sync(listed) == assign(spec, listed, previous=last, **overrides)
    assert engine.fallbacks == 0


def test_a_target_for_a_fully_drained_region_is_refused_and_changes_nothing() -> None:
    spec = make_spec({"r-a": 2, "r-b": 1})
    first = [target(n, region="r-b", gpus=4) for n in range(5)]
    engine = IncrementalAssigner(spec, first, drained=["r-a-0", "r-a-1"], fallback_fraction=NEVER)
    before = engine.assignment
    with pytest.raises(AssignmentError, match="every shard of region 'r-a' is drained"):
        engine.apply(added=[target(9, region="r-a", gpus=4)])
    assert engine.assignment == before and len(engine.targets()) == 5


@given(history=histories())
@FAST
def test_an_adopted_assignment_continues_exactly_as_the_engine_that_made_it(history: tuple[Any, ...]) -> None:
    """A restart (or an applied plan) hands the engine an assignment instead of placing again."""
    spec, first, overrides, changes = history
    made = assign(spec, first, **overrides)
    kwargs = {**overrides}
    engine = IncrementalAssigner.adopting(spec, first, made, fallback_fraction=NEVER, **kwargs)
    assert engine.assignment is made
    fleet = Fleet(spec, first, **overrides)
    for added, removals, _updates, rnd in changes:
        present = sorted(fleet.targets)
        removed = set(rnd.sample(present, min(removals, len(present))))
        last = engine.assignment
        result = engine.apply(added=added, removed=removed)
        fleet.change(added, removed)
        assert result == fleet.expected(last)
    assert engine.fallbacks == 0


def test_an_assignment_that_does_not_fit_is_refused_for_adoption() -> None:
    spec = make_spec({"r-a": 3})
    fleet = [target(n, region="r-a", gpus=8) for n in range(30)]
    made = assign(spec, fleet)
    with pytest.raises(AssignmentError, match="not listed"):
        IncrementalAssigner.adopting(spec, fleet[:-1], made)
    with pytest.raises(AssignmentError, match="drained"):
        IncrementalAssigner.adopting(spec, fleet, made, drained=["r-a-0"])
    with pytest.raises(AssignmentError, match="weight"):
        IncrementalAssigner.adopting(spec, fleet, made, weight_overrides={fleet[0].identity: 3})
    elsewhere = fleet[0].identity
    wrong = next(s for s in made.shards if s != made.targets[elsewhere])
    with pytest.raises(AssignmentError, match="pinned"):
        IncrementalAssigner.adopting(spec, fleet, made, pins={elsewhere: wrong})


def test_a_change_shares_the_untouched_placements_and_leaves_the_previous_assignment_as_it_was() -> None:
    """No copy of the fleet per change: the new assignment's maps share every bucket the
    change did not touch with the previous ones, and the previous assignment still reads
    as it did (a reader holding it sees no change)."""
    spec = make_spec({"r-a": 40})
    first = [target(n, region="r-a", gpus=8) for n in range(3000)]
    engine = IncrementalAssigner(spec, first, fallback_fraction=NEVER)
    one = engine.apply(added=[target(5000, region="r-a", gpus=8)])
    kept_targets, kept_weights = dict(one.targets), dict(one.weights)
    two = engine.apply(added=[target(5001, region="r-a", gpus=4)], removed={first[7].identity})
    assert isinstance(one.targets, CowMap) and isinstance(two.targets, CowMap)
    assert dict(one.targets) == kept_targets and dict(one.weights) == kept_weights
    assert two == assign(spec, engine.targets(), previous=one)
    touched = engine.touched or set()
    assert 0 < len(touched) < 100
    for new, old in ((two.targets, one.targets), (two.weights, one.weights)):
        copied = {k for k, (a, b) in enumerate(zip(old._buckets, new._buckets, strict=True)) if a is not b}  # type: ignore[union-attr]
        assert copied and copied <= {_slot(i, new._mask) for i in touched}  # type: ignore[union-attr]
        assert len(copied) < len(new._buckets)  # type: ignore[union-attr]


def test_a_full_result_is_held_once_as_the_maps_the_next_change_evolves() -> None:
    """The engine's own full placement (first and fallback) holds CowMaps, and they are the
    ones the next change evolves: no second copy of every placement beside it."""
    spec = make_spec({"r-a": 4})
    engine = IncrementalAssigner(spec, [target(n, region="r-a", gpus=8) for n in range(600)])
    first = engine.assignment
    assert isinstance(first.targets, CowMap) and isinstance(first.weights, CowMap)
    assert engine._maps[0] is first.targets and engine._maps[1] is first.weights
    assert first == assign(spec, engine.targets())


def test_the_engine_keys_its_targets_by_the_assignments_own_identity_strings() -> None:
    """A million identities live as long as the engine: it holds the assignment's strings,
    not a copy of each (60 MiB at a million targets, issue #44)."""
    spec = make_spec({"r1": 4})
    engine = IncrementalAssigner(spec, [target(n, region="r1", gpus=8) for n in range(300)])
    own = {id(identity) for identity in engine.assignment.targets}
    assert len(engine._targets) == 300 and all(id(identity) in own for identity in engine._targets)
