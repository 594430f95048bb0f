"""Plans and changes: what an operator's change would move, made reproducible.

A plan is made against ``desired_revision`` (operator changes only), so discovery churn
does not make every plan stale; applying one re-runs the placement on the targets of that
moment, sticky to the current assignment, and reports what really moved. Plan and apply
both place through :func:`assign_change`, so applying reproduces what the plan showed.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from federation.controller.base import changing
from federation.controller.base.errors import Conflict, Invalid, NotFound
from federation.controller.base.metrics import ControllerMetrics
from federation.controller.base.shed import shed
from federation.controller.base.state import AuditEntry, ControllerState, Desired, Handover
from federation.spec import GpufedSpec
from sharder.engine import planning
from sharder.engine.assigning import assign
from sharder.engine.assignment import Assignment
from sharder.kernel.errors import AssignmentError
from sharder.model.inventory import Target


@dataclass(frozen=True)
class PlannedChange:
    version: str
    base_revision: int
    change: changing.ChangeRequest
    desired: Desired
    plan: planning.Plan
    created_at: float
    assignment_version: int = 0
    """The assignment the plan was made from: while it is still served, applying reuses the result."""
    result: Assignment | None = None


@dataclass(frozen=True)
class ApplyResult:
    applied: bool
    version: str
    plan: planning.Plan | None
    message: str


def assign_desired(
    spec: GpufedSpec,
    desired: Desired,
    targets: Sequence[Target],
    *,
    previous: Assignment | None,
) -> Assignment:
    """A full sticky placement under the operator's overrides (what a plan shows)."""
    return assign(
        spec,
        targets,
        previous=previous,
        shard_counts=desired.shard_counts or None,
        pins=desired.pins or None,
        drained=desired.drained or None,
        weight_overrides=desired.weights or None,
    )


def assign_change(
    spec: GpufedSpec,
    change: changing.ChangeRequest,
    desired: Desired,
    targets: Mapping[str, Target],
    *,
    previous: Assignment | None,
) -> Assignment:
    """The assignment a change leads to; a load-aware one sheds overloaded shards first."""
    listed = list(targets.values())
    assignment = assign_desired(spec, desired, listed, previous=previous)
    if not change.use_observed_weights or previous is None:
        return assignment
    trimmed = shed(assignment, load_factor=spec.sharding.load_factor, pinned=desired.pins.keys())
    return assign_desired(spec, desired, listed, previous=trimmed)


class Planner:
    """Makes plans and keeps the newest ``max_plans`` of them (in memory) for ``apply``."""

    def __init__(
        self, *, spec: GpufedSpec, metrics: ControllerMetrics, max_plans: int, wall_clock: Callable[[], float]
    ) -> None:
        self.spec = spec
        self.metrics = metrics
        self.max_plans = max_plans
        self._wall = wall_clock
        self._plans: OrderedDict[str, PlannedChange] = OrderedDict()

    def make(
        self, state: ControllerState, targets: Mapping[str, Target], change: changing.ChangeRequest
    ) -> PlannedChange:
        """What ``change`` would do to ``state``; ``Invalid``/``NotFound`` name what is wrong."""
        try:
            desired = changing.apply_request(
                state.desired, change, spec=self.spec, assignment=state.assignment
            )
        except changing.ChangeError as exc:
            raise Invalid(str(exc), field=exc.field) from exc
        for field_name, identities in (("pin", change.pin), ("weights", change.weights)):
            for identity in identities:
                if identity not in targets:
                    raise NotFound(f"unknown target {identity!r} (in {field_name})")
        for identity in change.unpin:  # like a pin: naming what is not there is refused
            if identity not in state.desired.pins:
                known = "target" if identity in targets else "unknown target"
                raise NotFound(f"{known} {identity!r} is not pinned (in unpin)")
        try:
            assignment = assign_change(self.spec, change, desired, targets, previous=state.assignment)
        except AssignmentError as exc:
            raise Invalid(str(exc)) from exc
        plan = planning.diff(state.assignment, assignment)
        digest = hashlib.sha256(desired.model_dump_json().encode()).hexdigest()[:12]
        version = f"{state.desired_revision}-{digest}"
        planned = PlannedChange(
            version=version,
            base_revision=state.desired_revision,
            change=change,
            desired=desired,
            plan=plan,
            created_at=self._wall(),
            assignment_version=state.assignment_version,
            result=assignment,
        )
        self._plans[version] = planned
        self._plans.move_to_end(version)
        while len(self._plans) > self.max_plans:
            self._plans.popitem(last=False)
        self.metrics.plans.inc()
        return planned

    def to_apply(self, version: str, state: ControllerState) -> PlannedChange | None:
        """The plan ``version`` if it may be applied to ``state`` now; None when it already is."""
        if version == state.last_plan:
            self.metrics.rebalances.labels(result="noop").inc()
            return None
        base = version.split("-", 1)[0]
        if base != str(state.desired_revision):
            self.metrics.rebalances.labels(result="conflict").inc()
            raise Conflict(
                f"plan {version!r} was made against revision {base}, which another change "
                f"replaced; plan again",
                current_version=str(state.desired_revision),
            )
        planned = self._plans.get(version)
        if planned is None:
            raise NotFound(f"no plan with version {version!r} (plans are kept in memory; plan again)")
        return planned

    def placement(
        self, planned: PlannedChange, state: ControllerState, targets: Mapping[str, Target]
    ) -> Assignment:
        """The plan's result while its assignment is still served, else placed again (sticky)."""
        if planned.result is not None and planned.assignment_version == state.assignment_version:
            return planned.result
        try:
            return assign_change(
                self.spec, planned.change, planned.desired, targets, previous=state.assignment
            )
        except AssignmentError as exc:
            raise Invalid(str(exc)) from exc

    def applied(
        self,
        planned: PlannedChange,
        state: ControllerState,
        *,
        assignment: Assignment,
        plan: planning.Plan,
        handovers: list[Handover],
        actor: str,
    ) -> tuple[ControllerState, AuditEntry]:
        """The state to commit when ``planned`` is applied to ``state``, and its audit entry."""
        change = planned.change.model_dump(mode="json", exclude_defaults=True)
        audit = AuditEntry(
            at=self._wall(),
            actor=actor,
            action="rebalance",
            moved=plan.counts.moved,
            detail={
                "version": planned.version,
                "change": change,
                "counts": plan.counts.model_dump(mode="json"),
            },
        )
        update = {
            "desired": planned.desired,
            "desired_revision": state.desired_revision + 1,
            "assignment": assignment,
            "assignment_version": state.assignment_version + 1,
            "last_plan": planned.version,
            "handovers": handovers,
        }
        return state.model_copy(update=update), audit


def dump_plan(planned: PlannedChange) -> dict[str, Any]:
    return {
        "version": planned.version,
        "base_version": str(planned.base_revision),
        "change": json.loads(planned.change.model_dump_json(exclude_defaults=True)),
        **planned.plan.to_json_dict(),
    }
