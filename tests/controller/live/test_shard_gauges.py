"""Shard gauges follow a change by the shards it touched, and still name every shard."""

from __future__ import annotations

from pathlib import Path

from sharder.model.inventory import Target
from tests.controller.harness import build, fleet


def test_a_change_updates_its_shards_gauges_and_keeps_the_others(tmp_path: Path) -> None:
    harness = build(tmp_path)
    controller = harness.controller
    base = [*fleet(40), *fleet(20, region="r2", start=100)]
    harness.feed(base)
    registry = controller.metrics.registry

    def sizes() -> dict[str, float]:
        assignment = controller.state.assignment
        assert assignment is not None
        out = {}
        for shard, info in assignment.shards.items():
            value = registry.get_sample_value(
                "gpufed_controller_targets", {"region": info.region, "shard": shard}
            )
            assert value is not None
            out[shard] = value
        return out

    before = sizes()
    newcomer = Target(address="10.7.0.1", port=9400, job="gpu", node="new-1", region="r2", gpus=8)
    harness.feed([*base, newcomer])
    after = sizes()
    assignment = controller.state.assignment
    assert assignment is not None
    home = assignment.targets[newcomer.identity]
    assert after == {**before, home: before[home] + 1}
    assert after == {shard: float(size) for shard, size in assignment.sizes().items()}
