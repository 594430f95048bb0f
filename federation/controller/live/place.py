"""Place: a reconcile :class:`~sharder.engine.step.Step` becomes the state to commit.

The second stage of the live route (inbox -> **place** -> commit -> publish): the new
assignment, its version, the hand-overs it starts (make-before-break, ``settling``) and,
when the shard set changed, the audit entry naming it. An operator's applied plan enters the
same route as a :class:`~sharder.engine.step.Step` of its own (:func:`plan_step`). Pure over
its arguments (the time is passed in); the route commits what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.live.settling import HandoverSettler
from sharder.engine import planning
from sharder.engine.assignment import Assignment
from sharder.engine.step import Step
from sharder.model.inventory import Target


def state_after(
    state: ControllerState, step: Step, *, settler: HandoverSettler, now: float
) -> tuple[ControllerState, AuditEntry | None]:
    """(the state ``step`` makes of ``state``, its audit entry or None)."""
    base = state.assignment
    touched = set(step.touched) if step.touched is not None and step.base is base else None
    handovers = settler.for_change(
        base, step.assignment, existing=state.handovers, targets=step.targets, touched=touched, now=now
    )
    counts = step.summary.counts
    audit = None
    if counts.shards_added or counts.shards_removed:
        audit = AuditEntry(
            at=now,
            actor="discovery",
            action="resize",
            detail={"added_shards": step.summary.added_shards, "removed_shards": step.summary.removed_shards},
            moved=counts.moved,
        )
    update = {
        "assignment": step.assignment,
        "assignment_version": state.assignment_version + 1,
        "handovers": handovers,
    }
    return state.model_copy(update=update), audit


def plan_step(
    base: Assignment | None, assignment: Assignment, plan: planning.Plan, targets: Mapping[str, Target]
) -> Step:
    """An applied plan as a step from ``base``: placed whole (what moved is not narrowed, so
    the store and SD rebuild it all, as a full placement), with no set changes."""
    summary = planning.PlanSummary(
        counts=plan.counts, added_shards=plan.added_shards, removed_shards=plan.removed_shards
    )
    return Step(base=base, assignment=assignment, summary=summary, touched=None, changed=None,
                targets=MappingProxyType(dict(targets)))  # fmt: skip
