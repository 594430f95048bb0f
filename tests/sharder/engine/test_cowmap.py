"""CowMap: a read-only mapping whose next version copies only the buckets a change touches."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharder.engine.assignment import Assignment
from sharder.engine.cowmap import DELETE, MIN_BUCKET, CowMap, bucket_count

KEYS = st.text(alphabet="abcdefgh.:/0123456789", min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    start=st.dictionaries(KEYS, st.integers(), max_size=60),
    steps=st.lists(st.dictionaries(KEYS, st.one_of(st.integers(), st.just(None)), max_size=8), max_size=6),
    buckets=st.sampled_from([1, 2, 8]),
)
def test_every_version_reads_as_its_dict_and_earlier_ones_do_not_change(
    start: dict[str, int], steps: list[dict[str, int | None]], buckets: int
) -> None:
    model = dict(start)
    versions = [(CowMap(start, buckets=buckets), dict(model))]
    for step in steps:
        for key, value in step.items():
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        changes = {k: DELETE if v is None else v for k, v in step.items()}
        versions.append((versions[-1][0].evolve(changes), dict(model)))
    for cow, expected in versions:  # each as it was made, whatever came after it
        assert cow == expected and expected == cow
        assert len(cow) == len(expected) and dict(cow.items()) == expected
        assert sorted(cow) == sorted(expected) and sorted(cow.values()) == sorted(expected.values())
        for key in expected:
            assert key in cow and cow[key] == expected[key] and cow.get(key) == expected[key]
        assert cow.get("absent-key-z") is None and "absent-key-z" not in cow
        assert cow.keys() - expected.keys() == set()


def test_a_change_copies_only_the_buckets_it_touches() -> None:
    base = CowMap({f"t{i}": f"s{i % 7}" for i in range(5000)})
    assert len(base._buckets) == bucket_count(5000) > 1
    after = base.evolve({"t1": "moved", "t2": DELETE, "new": "s0"})
    touched = {"t1", "t2", "new"}
    slots = {k: i for i, b in enumerate(after._buckets) for k in b}
    touched_slots = {slots["t1"], slots["new"]} | {i for i, b in enumerate(base._buckets) if "t2" in b}
    for i, (was, now) in enumerate(zip(base._buckets, after._buckets, strict=True)):
        assert (was is now) == (i not in touched_slots)
    outside = [k for k in base if k not in touched and slots.get(k) not in touched_slots]
    assert outside and all(after.shares_bucket_with(base, k) for k in outside)
    assert base["t1"] == "s1" and "t2" in base and "new" not in base  # the old version is as it was
    assert after["t1"] == "moved" and "t2" not in after and after["new"] == "s0" and len(after) == 5000


def test_a_small_map_is_one_bucket_and_the_size_is_checked() -> None:
    assert bucket_count(MIN_BUCKET) == 1 and bucket_count(4 * MIN_BUCKET) == 4
    with pytest.raises(ValueError, match="power of two"):
        CowMap({}, buckets=3)
    empty = CowMap({})
    assert empty.evolve({}) is empty and len(empty.evolve({"a": DELETE})) == 0


def test_an_assignment_holding_cowmaps_serialises_and_compares_as_with_dicts() -> None:
    targets = {f"t{i}": "s0" if i % 2 else "s1" for i in range(700)}
    weights = dict.fromkeys(targets, 8)
    fields = {"algorithm": "bounded-ring", "algorithm_version": 1,
              "shards": {"s0": {"region": "r", "index": 0}, "s1": {"region": "r", "index": 1}}}  # fmt: skip
    plain = Assignment.model_validate({**fields, "targets": targets, "weights": weights})
    cow = plain.model_copy(update={"targets": CowMap(targets), "weights": CowMap(weights)})
    assert cow == plain and plain == cow
    assert json.loads(cow.model_dump_json()) == json.loads(plain.model_dump_json())
    assert cow.model_dump() == plain.model_dump()
    assert Assignment.model_validate_json(cow.model_dump_json()) == plain
    assert pickle.loads(pickle.dumps(CowMap(targets))) == targets


def test_a_map_filled_from_empty_is_bucketed_for_its_size() -> None:
    """An empty map that one big change fills (the first registrations of a fleet) does not
    stay one bucket, which every later change would copy whole."""
    filled = CowMap({}).evolve({f"t{i}": i for i in range(20000)})
    assert len(filled._buckets) == bucket_count(20000) > 1 and dict(filled.items()) == {
        f"t{i}": i for i in range(20000)
    }
    grown = CowMap({}).evolve({"a": 1})
    for step in range(40):
        grown = grown.evolve({f"k{step}-{j}": j for j in range(100)})
    assert len(grown) == 4001 and len(grown._buckets) * 4 * MIN_BUCKET > len(grown)
