"""Hand-overs in the live controller: which targets a new assignment hands over, and which
hand-overs a settle pass may finish.

The rules are pure (``handover``); this component adds what they need from the running
controller (the children's answers and SD fetch times, the wall clock, the options) and
keeps the work in proportion to the change: after an incremental tick only the targets
the engine touched are looked at, never the whole fleet.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from federation.controller.base.metrics import ControllerMetrics
from federation.controller.base.options import ControllerOptions
from federation.controller.base.state import ControllerState, Handover
from federation.controller.live import handover
from federation.controller.live.children import Answers, Children
from federation.spec import GpufedSpec
from sharder.engine.assignment import Assignment
from sharder.model.inventory import Target

Settled = tuple[list[Handover], list[tuple[Handover, str]]]
"""(hand-overs still pending, [(finished hand-over, result)])."""


class HandoverSettler:
    def __init__(
        self,
        *,
        spec: GpufedSpec,
        options: ControllerOptions,
        children: Children,
        metrics: ControllerMetrics,
    ) -> None:
        self.spec = spec
        self.options = options
        self.children = children
        self.metrics = metrics

    def window_s(self, job: str) -> float:
        if self.options.handover_window_s is not None:
            return self.options.handover_window_s
        return handover.default_window_s(self.spec, job)

    def for_change(
        self,
        previous: Assignment | None,
        current: Assignment,
        *,
        existing: list[Handover],
        targets: Mapping[str, Target],
        touched: Collection[str] | None,
        now: float,
    ) -> list[Handover]:
        """The hand-overs after ``previous`` -> ``current``; ``touched``: the only identities
        that may have moved (None: any of ``targets``)."""
        if not self.options.handover or (previous is None and not existing):
            return []  # off, or a first assignment: nothing was scraped anywhere before it
        candidates = targets.keys() if touched is None else [i for i in touched if i in targets]
        return handover.reconcile(
            previous,
            current,
            existing,
            now=now,
            job_of={i: targets[i].job for i in candidates},
            max_wait_s=self.options.handover_max_wait_s,
            only=touched,
        )

    def ask(self, state: ControllerState) -> Answers:
        """What the new shards' children scrape now: each asked once, before the state lock
        is taken (a slow child must not hold up plans and discovery)."""
        return self.children.answers(state.assignment, {h.to_shard for h in state.handovers})

    def settle(
        self, state: ControllerState, targets: Mapping[str, Target], answers: Answers, *, now: float
    ) -> Settled | None:
        """The hand-overs left after this pass, None when none finished."""
        if not state.handovers:
            return None
        pending, done = handover.settle(
            state.handovers,
            now=now,
            scraped=lambda h: self.children.scraped(h, targets, answers, state.assignment),
            fetched=self.children.fetched,
            window_s=self.window_s,
        )
        if pending == state.handovers:
            return None
        return pending, done

    def count(self, done: list[tuple[Handover, str]]) -> None:
        for _, result in done:
            self.metrics.handovers.labels(result=result).inc()
