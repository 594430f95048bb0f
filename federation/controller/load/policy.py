"""Load policy: measured load turns into weights, and weights reach placement only through a plan.

The policy reads the children's load (``load.LoadTracker``) and, when the auto-rebalance
threshold says so, answers with the change to plan (:meth:`LoadPolicy.wanted`, a
:class:`Rebalance` value) and whether the plan made of it helps (:meth:`LoadPolicy.helps`).
It holds nothing of the façade and calls nothing back: the façade's load loop plans and
applies through the same ``plan``/``apply`` the REST API uses, so an automatic rebalance is
audited and fenced like an operator's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from federation.controller.base import changing
from federation.controller.base.errors import Invalid, NotFound
from federation.controller.base.plans import PlannedChange
from federation.controller.base.state import ControllerState
from federation.controller.live.children import Children
from federation.controller.load import tracking
from federation.spec import GpufedSpec
from sharder.engine.assignment import Assignment
from sharder.kernel.models import parse_duration
from sharder.model.inventory import Target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rebalance:
    """A load-aware change the policy wants planned: ``change`` to plan, and what a plan of it
    must beat (``worst`` max/mean samples per second over the regions of ``assignment``)."""

    change: changing.ChangeRequest
    assignment: Assignment
    targets: Mapping[str, Target]
    worst: float


class LoadPolicy:
    def __init__(
        self,
        *,
        spec: GpufedSpec,
        load: tracking.LoadTracker | None,
        children: Children,
        can_write: Callable[[], bool],
        targets: Callable[[], Mapping[str, Target]],
    ) -> None:
        self.spec = spec
        self.load = load
        self.children = children
        self._can_write = can_write
        self._targets = targets
        self._jobs = {job.name: job for job in spec.jobs}
        self._auto_rebalanced_at = float("-inf")

    def with_observed_weights(
        self, change: changing.ChangeRequest, targets: Mapping[str, Target], *, current: Mapping[str, int]
    ) -> changing.ChangeRequest:
        if self.load is None:
            raise Invalid(
                "this controller reads no load (start gpufed serve with --load-url, or run full-Prometheus "
                "children with --child-url)",
                field="use_observed_weights",
            )
        if not self.load.rates():
            raise Invalid(
                "no load observed yet; try again after the first reading", field="use_observed_weights"
            )
        observed = self.load.weight_changes(targets, current=dict(current))
        return change.model_copy(update={"weights": {**observed, **change.weights}})

    def _scrape_interval_s(self, job: str) -> float:
        spec_job = self._jobs.get(job)
        return parse_duration(spec_job.scrape_interval if spec_job else self.spec.children.scrape_interval)

    def observe(self, state: ControllerState) -> bool:
        """Read the children's load once (the load loop calls this); False when nothing was read."""
        if self.load is None:
            return False
        assignment = state.assignment
        urls: list[str] = []
        if assignment is not None and not self.spec.children.agent_mode:
            for shard in assignment.shards:
                found = (self.children.url(c) for c, _ in assignment.children(shard))
                urls.extend(u for u in found if u is not None)
        return self.load.refresh(targets=self._targets(), interval_s=self._scrape_interval_s, child_urls=urls)

    def report(self, state: ControllerState) -> dict[str, Any]:
        if self.load is None:
            raise NotFound("this controller reads no load (start gpufed serve with --load-url)")
        return self.load.report(
            assignment=state.assignment, targets=self._targets(), current=state.desired.weights
        )

    def wanted(self, state: ControllerState) -> Rebalance | None:
        """The load-aware change to plan now, if the policy allows one (threshold, cooldown,
        this replica writes); None otherwise. Asking starts the cooldown."""
        load, assignment = self.load, state.assignment
        if load is None or assignment is None or not self._can_write():
            return None
        threshold = load.options.auto_rebalance_imbalance
        if threshold is None or not load.rates():
            return None
        if time.monotonic() - self._auto_rebalanced_at < load.options.auto_rebalance_cooldown_s:
            return None
        targets = self._targets()
        before = load.region_imbalance(assignment, targets)
        worst = max(before.values(), default=0.0)
        if worst <= threshold:
            return None
        self._auto_rebalanced_at = time.monotonic()  # also after a plan that does not help
        reason = f"auto: samples/s max/mean {worst:.2f} above {threshold:g}"
        change = changing.ChangeRequest(use_observed_weights=True, reason=reason)
        return Rebalance(change=change, assignment=assignment, targets=targets, worst=worst)

    def helps(self, wanted: Rebalance, planned: PlannedChange) -> bool:
        """Does ``planned`` (made of ``wanted.change``) lower the worst region's imbalance?"""
        assert self.load is not None  # ``wanted`` answers None without a load tracker
        after = self.load.region_imbalance(wanted.assignment, wanted.targets, plan=planned.plan)
        if not planned.plan.changed or max(after.values(), default=0.0) >= wanted.worst:
            log.info("auto rebalance skipped: the plan would not lower max/mean %.2f", wanted.worst)
            return False
        log.info("auto rebalance: %s; applying %s", wanted.change.reason, planned.version)
        return True
