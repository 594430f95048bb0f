"""Load policy: measured load turns into weights, and weights reach placement only through a plan.

The policy reads the children's load (``load.LoadTracker``) on its own thread and, when
the auto-rebalance threshold says so, plans a load-aware change and applies it through
the same :class:`Operator` calls the REST API uses (``plan``/``apply``), so an automatic
rebalance is audited and fenced like an operator's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from federation.controller.base import changing
from federation.controller.base.errors import Invalid, NotFound
from federation.controller.base.plans import ApplyResult, PlannedChange
from federation.controller.base.state import ControllerState
from federation.controller.live.children import Children
from federation.controller.load import tracking
from federation.spec import GpufedSpec
from sharder.kernel.models import parse_duration
from sharder.model.inventory import Target

log = logging.getLogger(__name__)


class Operator(Protocol):
    """What the policy acts through (the controller façade)."""

    state: ControllerState

    def plan(self, change: changing.ChangeRequest) -> PlannedChange: ...

    def apply(self, version: str, *, actor: str) -> ApplyResult: ...


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

    def auto_rebalance(self, operator: Operator) -> ApplyResult | None:
        """Apply a load-aware plan if the policy allows it and it helps; None when nothing was applied."""
        load, assignment = self.load, operator.state.assignment
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
        planned = operator.plan(changing.ChangeRequest(use_observed_weights=True, reason=reason))
        after = load.region_imbalance(assignment, targets, plan=planned.plan)
        if not planned.plan.changed or max(after.values(), default=0.0) >= worst:
            log.info("auto rebalance skipped: the plan would not lower max/mean %.2f", worst)
            return None
        log.info("auto rebalance: %s; applying %s", reason, planned.version)
        return operator.apply(planned.version, actor="auto-rebalance")

    def loop(self, stop: threading.Event, operator: Operator) -> None:
        assert self.load is not None
        while not stop.wait(self.load.options.interval_s):
            try:
                if self.observe(operator.state):
                    self.auto_rebalance(operator)
            except Exception:  # a bad reading must not end the loop
                log.exception("load reading failed")
