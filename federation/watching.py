"""Live discovery for ``gpufed watch``: sources -> reconcile loop -> a view or JSON lines.

:func:`sharder.sources.build.build_sources` turns the CLI's choices into source adapters
pushing into one ``sharder.live.reconcile.Reconciler``; :class:`Watcher` owns the threads and the recent
history; :func:`assignment_record` (one JSON object per new assignment) and
:func:`render_view` (regions -> shards -> load, recent changes, registry health) are
pure functions of that state, so the CLI stays a few lines and tests need no terminal.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from rich.console import Group
from rich.table import Table

from sharder.engine.assignment import Assignment
from sharder.engine.planning import Plan
from sharder.live.reconcile import Reconciler
from sharder.model.spec import FederationSpec
from sharder.sources.build import WatchOptions, build_sources
from sharder.sources.discovery_metrics import DiscoveryMetrics
from sharder.sources.lastknown import LastKnownFile


@dataclass
class Change:
    at: float
    summary: str


@dataclass
class Watcher:
    """The running pieces of one ``gpufed watch``; ``records`` collects JSON lines."""

    spec: FederationSpec
    options: WatchOptions
    on_record: Callable[[dict[str, Any]], None] | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    changes: deque[Change] = field(default_factory=lambda: deque(maxlen=12))

    def __post_init__(self) -> None:
        self.metrics = DiscoveryMetrics(registry=self.registry)
        store = LastKnownFile(self.options.state) if self.options.state is not None else None
        self.reconciler = Reconciler(
            spec=self.spec,
            debounce_s=self.options.debounce_s,
            grace_s=self.options.grace_s,
            hysteresis=self.options.hysteresis,
            precedence=self.options.precedence,
            on_assignment=self._assigned,
            observer=self.metrics,
            store=store,
        )
        if store is not None:
            self.reconciler.seed(store.load())  # a restart while the registry is down
        self.sources = build_sources(self.options, sink=self.reconciler, spec=self.spec)
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        loops = [self.reconciler.run, *(s.run for s in self.sources)]
        self._threads = [threading.Thread(target=loop, args=(self.stop,), daemon=True) for loop in loops]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=2)

    def _assigned(self, assignment: Assignment, plan: Plan) -> None:
        c = plan.counts
        self.changes.appendleft(Change(time.time(), (
            f"+{c.added} -{c.removed} moved {c.moved}, shards +{c.shards_added} -{c.shards_removed}, "
            f"{c.targets_after} targets"
        )))
        if self.on_record is not None:
            self.on_record(assignment_record(assignment, plan, number=self.reconciler.assignments))


def assignment_record(assignment: Assignment, plan: Plan, *, number: int) -> dict[str, Any]:
    """One JSON line per new assignment: counts, per-shard load and what moved."""
    return {
        "assignment": number,
        "time": round(time.time(), 3),
        "targets": len(assignment.targets),
        "shards": len(assignment.shards),
        "counts": plan.counts.model_dump(mode="json"),
        "load": plan.load_after,
        "added": [p.identity for p in plan.added_targets],
        "removed": [p.identity for p in plan.removed_targets],
        "moved": [m.model_dump(mode="json") for m in plan.moves],
    }


def render_view(watcher: Watcher, *, now: float | None = None) -> Group:
    """Regions -> shards -> load; the last changes; registry health."""
    now = time.time() if now is None else now
    assignment = watcher.reconciler.assignment
    regions = Table(title="regions -> shards -> load", expand=True)
    for column in ("region", "shards", "targets", "load min / mean / max"):
        regions.add_column(column)
    if assignment is not None:
        load = assignment.load()
        counts: dict[str, int] = {}
        for target_shard in assignment.targets.values():
            region = assignment.shards[target_shard].region
            counts[region] = counts.get(region, 0) + 1
        for region in watcher.spec.region_names():
            loads = [load[s] for s, info in assignment.shards.items() if info.region == region]
            if loads:
                spread = f"{min(loads)} / {sum(loads) / len(loads):.1f} / {max(loads)}"
                regions.add_row(region, str(len(loads)), str(counts.get(region, 0)), spread)
    changes = Table(title="last changes", expand=True)
    changes.add_column("age")
    changes.add_column("change")
    for change in watcher.changes:
        changes.add_row(f"{now - change.at:.0f}s", change.summary)
    health = Table(title="registries", expand=True)
    for column in ("source", "targets", "last success", "errors"):
        health.add_column(column)
    errors: dict[str, list[str]] = {}
    for metric in watcher.metrics.errors.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.value:
                errors.setdefault(sample.labels["source"], []).append(
                    f"{sample.labels['reason']}={sample.value:.0f}"
                )
    sets = watcher.reconciler.source_sets()
    for name in sorted({s.name for s in watcher.sources} | sets.keys()):
        age = watcher.metrics.staleness(name)
        health.add_row(name, str(len(sets.get(name, []))), "never" if age is None else f"{age:.0f}s ago",
                       ", ".join(errors.get(name, [])) or "-")
    pending = watcher.reconciler.grace_remaining()
    footer = f"{len(pending)} target(s) in their grace period" if pending else ""
    return Group(regions, changes, health, footer)
