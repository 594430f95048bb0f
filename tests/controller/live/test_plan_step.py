"""An applied plan goes the route a registration's step goes: a ``Step`` carried by ``live.route``
(commit -> the loop builds on it -> publish), never a hand-ordered commit in the façade."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from federation.controller.base.changing import ChangeRequest
from sharder.engine.step import Step
from tests.controller.harness import build, fleet


def test_plan_apply_is_a_step_through_the_route_and_the_loop_builds_on_it(tmp_path: Path) -> None:
    harness = build(tmp_path)
    harness.feed(fleet(40))
    controller = harness.controller
    before = controller.state.assignment
    carried: list[Step] = []
    commits: list[Any] = []
    carry, commit = controller.route.carry_plan, controller.pipeline.commit

    def record_carry(step: Step, *args: Any, **kwargs: Any) -> None:
        carried.append(step)
        carry(step, *args, **kwargs)

    def record_commit(*args: Any, **kwargs: Any) -> Any:
        commits.append(kwargs.get("audit"))
        return commit(*args, **kwargs)

    controller.route.carry_plan = record_carry  # type: ignore[method-assign]
    controller.pipeline.commit = record_commit  # type: ignore[method-assign]
    planned = controller.plan(ChangeRequest(add_shard=["r1"]))
    result = controller.apply(planned.version, actor="test")
    assert result.applied and result.plan is not None and result.plan.counts.moved > 0
    (step,) = carried
    assert step.base is before and step.assignment == controller.state.assignment
    assert step.summary.counts == result.plan.counts and not step.sets
    assert len(commits) == 1 and commits[0].action == "rebalance"  # one commit, with its audit
    assert controller.reconciler.assignment is step.assignment  # the loop's next base
    assert controller.publication.sd.assignment == step.assignment  # published
    harness.feed(fleet(41))  # a registration after it places on top of the plan
    assert set(controller.state.assignment.shards) == set(step.assignment.shards)  # type: ignore[union-attr]
