"""Place: a reconcile :class:`~sharder.engine.step.Step` becomes the state to commit.

The second stage of the live route (inbox -> **place** -> commit -> publish): the new
assignment, its version, the hand-overs it starts (make-before-break, ``settling``) and,
when the shard set changed, the audit entry naming it. Pure over its arguments (the time
is passed in); the façade commits what it returns.
"""

from __future__ import annotations

from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.live.settling import HandoverSettler
from sharder.engine.step import Step


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
