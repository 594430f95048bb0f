"""The route of a change through the pipeline: place -> commit -> publish, handed down.

The third part of the live route (inbox -> **place -> commit -> publish**): the worker
(``loop``) asks for one reconcile step and this module carries it forward, each stage
handed the value the one before returned: the reconciler's frozen
:class:`~sharder.engine.step.Step`, the state :func:`~federation.controller.live.place.state_after`
makes of it, the one fenced commit (``Pipeline.commit``: state, audit, the step's set
changes) and the publication of what it touched. Finished hand-overs go the same way
(``settle``), and so does an operator's applied plan (``carry_plan``: a step of its own,
after which the loop builds on it). Nothing here calls back: a lost check-and-set or fence
propagates to the caller, which adopts the stored state (``ha.adoption``).
"""

from __future__ import annotations

from collections.abc import Callable

from federation.controller.base.metrics import ControllerMetrics
from federation.controller.base.state import AuditEntry, ControllerState, Desired, overrides_of
from federation.controller.live.pipeline import Pipeline
from federation.controller.live.place import state_after
from federation.controller.live.settling import HandoverSettler
from federation.controller.stores.store import StoreError
from sharder.engine.step import Step
from sharder.live.reconcile import Reconciler


class Route:
    def __init__(
        self,
        *,
        reconciler: Reconciler,
        pipeline: Pipeline,
        settler: HandoverSettler,
        metrics: ControllerMetrics,
        wall_clock: Callable[[], float],
    ) -> None:
        self.reconciler, self.pipeline, self.settler = reconciler, pipeline, settler
        self.metrics, self._wall = metrics, wall_clock

    def tick(self, *, idle: bool) -> Step | None:
        """One reconcile step, committed and published (the step, or None when nothing was
        due); idle after a restart: index for the first change."""
        with self.pipeline.lock:
            step = self.reconciler.step()
            if step is not None:
                self._carry(step)
            elif idle:
                self.reconciler.prepare()
            return step

    def _carry(self, step: Step) -> None:
        """place (hand-overs, audit) -> commit -> publish (lock held)."""
        base = self.pipeline.state.assignment
        state, audit = state_after(self.pipeline.state, step, settler=self.settler, now=self._wall())
        try:
            self.pipeline.commit(state, audit=audit, changed=step.delta_of(base), sets=step.sets)
        except StoreError:
            self.reconciler.requeue_set_changes(step.sets)  # written with the next step
            raise
        self.metrics.moves.labels(cause="discovery").inc(step.summary.counts.moved)
        self.pipeline.publish(step.targets, changed=step.sd_delta_of(base))

    def carry_plan(
        self, step: Step, state: ControllerState, *, audit: AuditEntry | None, desired: Desired
    ) -> None:
        """An applied plan, forward (the pipeline's lock held): commit its state, make its
        assignment and overrides the loop's base (nothing placed again), then publish."""
        base = self.pipeline.state.assignment
        self.pipeline.commit(state, audit=audit, changed=step.delta_of(base), sets=step.sets)
        self.reconciler.set_overrides(**overrides_of(desired))
        self.reconciler.adopt(step.assignment)
        self.pipeline.publish(step.targets, changed=step.sd_delta_of(base))

    def settle(self) -> int:
        """Finish hand-overs whose new children scrape the target (or whose window passed)."""
        if not self.pipeline.state.handovers:
            return 0
        answers = self.settler.ask(self.pipeline.state)  # the children, outside the lock
        with self.pipeline.lock:
            state = self.pipeline.state
            targets = self.reconciler.target_map
            settled = self.settler.settle(state, targets, answers, now=self._wall())
            if settled is None:
                return 0
            pending, done = settled
            self.pipeline.commit(state.model_copy(update={"handovers": pending}))
            self.settler.count(done)
            self.pipeline.publish(targets)
            return len(done)
