"""``diff(old, new)``: the plan printed by ``gpufed plan`` and the REST API."""

from __future__ import annotations

import json

from sharder.engine.assigning import assign
from sharder.engine.assignment import Assignment, ShardInfo
from sharder.engine.planning import diff
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec


def assignment(
    targets: dict[str, str], *, shards: list[str], weights: dict[str, int] | None = None
) -> Assignment:
    return Assignment(
        algorithm="bounded-ring",
        algorithm_version=1,
        shards={s: ShardInfo(region=s.rsplit("-", 1)[0], index=int(s.rsplit("-", 1)[1])) for s in shards},
        targets=targets,
        weights=weights or {},
    )


OLD = assignment(
    {"t1": "r-a-0", "t2": "r-a-1", "t3": "r-a-1", "t4": "r-b-0"},
    shards=["r-a-0", "r-a-1", "r-b-0", "r-b-1"],
    weights={"t1": 8, "t2": 4, "t3": 8, "t4": 8},
)
NEW = assignment(
    {"t1": "r-a-0", "t2": "r-a-10", "t3": "r-a-1", "t5": "r-b-0"},
    shards=["r-a-0", "r-a-1", "r-a-10", "r-a-2", "r-b-0"],
    weights={"t1": 8, "t2": 4, "t3": 8, "t5": 4},
)


def test_diff_lists_moves_additions_removals_and_loads() -> None:
    plan = diff(OLD, NEW)
    assert plan.to_json_dict() == {
        "algorithm": "bounded-ring",
        "algorithm_version": 1,
        "algorithm_changed": False,
        "moves": [{"identity": "t2", "from_shard": "r-a-1", "to_shard": "r-a-10"}],
        "added_targets": [{"identity": "t5", "shard": "r-b-0"}],
        "removed_targets": [{"identity": "t4", "shard": "r-b-0"}],
        "added_shards": ["r-a-2", "r-a-10"],
        "removed_shards": ["r-b-1"],
        "load_before": {"r-a-0": 8, "r-a-1": 12, "r-b-0": 8, "r-b-1": 0},
        "load_after": {"r-a-0": 8, "r-a-1": 8, "r-a-2": 0, "r-a-10": 4, "r-b-0": 4},
        "counts": {
            "targets_before": 4,
            "targets_after": 4,
            "moved": 1,
            "added": 1,
            "removed": 1,
            "unchanged": 2,
            "shards_added": 2,
            "shards_removed": 1,
            "moved_fraction": 1 / 3,
        },
    }
    assert plan.changed
    json.dumps(plan.to_json_dict())  # the CLI prints it as it is


def test_shards_are_ordered_by_region_then_number() -> None:
    assert list(diff(OLD, NEW).load_after) == ["r-a-0", "r-a-1", "r-a-2", "r-a-10", "r-b-0"]


def test_first_run_adds_everything() -> None:
    plan = diff(None, NEW)
    assert [p.identity for p in plan.added_targets] == ["t1", "t2", "t3", "t5"]
    assert plan.added_shards == ["r-a-0", "r-a-1", "r-a-2", "r-a-10", "r-b-0"]
    assert plan.moves == [] and plan.removed_targets == [] and plan.load_before == {}
    assert plan.counts.moved_fraction == 0.0 and not plan.algorithm_changed


def test_no_change_is_an_empty_plan() -> None:
    plan = diff(NEW, NEW)
    assert not plan.changed
    assert plan.counts.unchanged == 4 and plan.load_before == plan.load_after


def test_an_algorithm_switch_is_flagged() -> None:
    other = OLD.model_copy(update={"algorithm": "hashmod"})
    assert diff(other, NEW).algorithm_changed


def test_plan_of_adding_a_shard_moves_only_to_the_new_shard_or_within_capacity() -> None:
    targets = [
        Target(address=f"10.0.{n >> 8}.{n & 255}", port=9400, job="gpu", node=f"n{n}", region="r-a", gpus=8)
        for n in range(600)
    ]

    def spec(count: int) -> FederationSpec:
        data = {"cluster": "c", "regions": [{"name": "r-a", "shards": count}], "jobs": [{"name": "gpu"}]}
        return FederationSpec.model_validate(data)

    before = assign(spec(5), targets, algorithm="bounded-ring")
    after = assign(spec(6), targets, previous=before, algorithm="bounded-ring")
    plan = diff(before, after)
    assert plan.added_shards == ["r-a-5"] and plan.removed_shards == []
    assert plan.counts.moved == len(plan.moves) > 0
    assert sum(plan.load_after.values()) == sum(plan.load_before.values()) == 600 * 8
    assert sum(1 for m in plan.moves if m.to_shard == "r-a-5") >= 0.8 * len(plan.moves)
