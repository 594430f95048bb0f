"""The child Prometheus servers as the controller sees them: addresses, health, SD fetches.

One collaborator asks the children (through ``probe.ChildProbe``) and remembers what
they said, so hand-over settling, the read views and reloads share one picture: which
child is reachable, which targets it scrapes, when its HTTP SD was last fetched (here or,
through the shared store, on another replica).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from federation.controller.base.metrics import ControllerMetrics
from federation.controller.base.options import ControllerOptions
from federation.controller.base.state import Handover
from federation.controller.live.probe import ChildProbe, ScrapeState, TargetKey
from federation.spec import GpufedSpec
from sharder.engine.assignment import Assignment
from sharder.model.inventory import Target

Answers = dict[str, dict[TargetKey, ScrapeState] | None]
"""child -> its active targets (None: unreachable or no URL)."""


@dataclass
class ChildHealth:
    reachable: bool | None = None
    active: int = 0
    up: int = 0
    checked_at: float = 0.0
    scrapes: dict[TargetKey, ScrapeState] = field(default_factory=dict)


class Children:
    def __init__(
        self,
        *,
        spec: GpufedSpec,
        options: ControllerOptions,
        probe: ChildProbe | None,
        metrics: ControllerMetrics,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.options = options
        self.probe = probe
        self.metrics = metrics
        self._wall = wall_clock
        self.health: dict[str, ChildHealth] = {}
        self._health_rounds = 0
        self.sd_fetched: dict[str, float] = {}
        """shard -> when one of its children last fetched HTTP SD from this replica."""
        self.remote_fetched: dict[str, float] = {}
        """The same, as other replicas served it (the leader reads the shared store)."""

    def url(self, child: str) -> str | None:
        url = self.options.child_urls.get(child)
        if url is None and self.options.child_url_template:
            url = self.options.child_url_template.format(child=child)
        return url

    def note_fetch(self, shard: str) -> None:
        """A child of ``shard`` fetched its HTTP SD (called by the SD route; one dict write)."""
        self.sd_fetched[shard] = self._wall()

    def fetched(self, shard: str) -> float | None:
        if self.spec.children.target_discovery != "http_sd":
            return self._wall()  # file_sd: the files are written now; nothing to wait for
        seen = [t for t in (self.sd_fetched.get(shard), self.remote_fetched.get(shard)) if t is not None]
        return max(seen) if seen else None  # fetches other replicas served count too

    def answers(self, assignment: Assignment | None, shards: set[str]) -> Answers:
        """What the children of ``shards`` scrape now: each child asked once."""
        if assignment is None or self.probe is None:
            return {}
        answers: Answers = {}
        for shard in shards & assignment.shards.keys():
            for child, _replica in assignment.children(shard):
                url = self.url(child)
                answers[child] = self.probe.active_targets(url) if url is not None else None
        return answers

    @staticmethod
    def scraped(
        h: Handover, targets: Mapping[str, Target], answers: Answers, assignment: Assignment | None
    ) -> bool:
        """Every child of the new shard has scraped the target since the hand-over began."""
        target = targets.get(h.identity)
        if target is None or assignment is None or h.to_shard not in assignment.shards:
            return False
        key = (target.job, target.instance, target.node)
        children = [child for child, _replica in assignment.children(h.to_shard)]
        for child in children:
            state = (answers.get(child) or {}).get(key)
            if state is None or state.health != "up" or state.last_scrape < h.started_at:
                return False
        return bool(children)

    def health_stamp(self) -> int:
        """Changes whenever a health answer does (for the ETag of the target list)."""
        return self._health_rounds

    def check_health(self, assignment: Assignment | None) -> None:
        if assignment is None or self.probe is None:
            return
        for shard in assignment.shards:
            for child, _ in assignment.children(shard):
                url = self.url(child)
                if url is None:
                    continue
                scrapes = self.probe.active_targets(url)
                health = ChildHealth(reachable=scrapes is not None, checked_at=self._wall())
                if scrapes is not None:
                    health.active = len(scrapes)
                    health.up = sum(1 for s in scrapes.values() if s.health == "up")
                    health.scrapes = scrapes
                self.health[child] = health
                self._health_rounds += 1

    def health_loop(self, stop: threading.Event, assignment: Callable[[], Assignment | None]) -> None:
        while not stop.wait(self.options.health_interval_s):
            self.check_health(assignment())

    def reload(self, children: list[str]) -> None:
        """POST ``/-/reload`` to each child (run with ``--web.enable-lifecycle``) whose config changed;
        a child we cannot reach picks its config up when it starts."""
        if self.probe is None or not children:
            return
        for child in children:
            url = self.url(child)
            if url is not None:
                result = "ok" if self.probe.reload(url) else "failed"
                self.metrics.reloads.labels(result=result).inc()
