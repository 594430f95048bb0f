"""Read views: what the API and the web page show, computed on read from one snapshot.

The read model the routes depend on directly (``http.api``). A view reads the committed
state (``live.pipeline.Pipeline.state``) and the targets it was made from (the reconciler's
``target_map``), both immutable once published, and the children's last health answers;
it takes no lock and changes nothing, so a slow page never holds up discovery or a plan.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from federation.controller.base import target_index
from federation.controller.base.errors import NotFound
from federation.controller.base.state import ControllerState
from federation.controller.live.children import Children
from federation.controller.live.pipeline import Pipeline
from federation.controller.load import tracking
from federation.spec import GpufedSpec
from sharder.engine import planning
from sharder.engine.assignment import Assignment
from sharder.kernel import secrets
from sharder.model.inventory import Target
from sharder.sources.discovery_metrics import DiscoveryMetrics


class TargetsSeen(Protocol):
    """What the read views take from the live loop (``sharder.live.reconcile.Reconciler``):
    its applied targets and the per-source sets, both read without changing anything."""

    @property
    def target_map(self) -> Mapping[str, Target]: ...

    def source_sets(self) -> dict[str, list[Target]]: ...

    def source_counts(self) -> dict[str, int]: ...


class ReadViews:
    def __init__(
        self,
        *,
        spec: GpufedSpec,
        pipeline: Pipeline,
        reconciler: TargetsSeen,
        children: Children,
        load: tracking.LoadTracker | None,
        discovery: DiscoveryMetrics,
    ) -> None:
        self.spec, self.pipeline, self.reconciler = spec, pipeline, reconciler
        self.children = children
        self.load = load
        self.discovery = discovery
        self._index = target_index.IndexCache()

    def read_version(self) -> tuple[object, ...]:
        """What the target rows are built from (their ETag): the assignment and the children's
        last health answers."""
        state = self.pipeline.state
        return (state.assignment_version, id(state.assignment), self.children.health_stamp())

    def shard_rows(self) -> list[dict[str, Any]]:
        state = self.pipeline.state
        assignment = state.assignment
        if assignment is None:
            return []
        load, sizes = assignment.load(), assignment.sizes()  # per-assignment caches, not a pass
        means: dict[str, float] = {}
        for region in self.spec.region_names():
            active = [
                load[s]
                for s, i in assignment.shards.items()
                if i.region == region and s not in assignment.drained
            ]
            means[region] = sum(active) / len(active) if active else 0.0
        incoming: dict[str, int] = {}
        outgoing: dict[str, int] = {}
        for h in state.handovers:
            incoming[h.to_shard] = incoming.get(h.to_shard, 0) + 1
            outgoing[h.from_shard] = outgoing.get(h.from_shard, 0) + 1
        samples = self.load.shard_samples(assignment) if self.load is not None else {}
        rows = []
        for shard in planning._shard_order(assignment.shards):
            info = assignment.shards[shard]
            mean = means.get(info.region, 0.0)
            children = []
            for child, replica in assignment.children(shard):
                health = self.children.health.get(child)
                children.append(
                    {
                        "child": child,
                        "replica": replica,
                        "url": self.children.url(child),
                        "reachable": None if health is None else health.reachable,
                        "active_targets": None if health is None else health.active,
                        "up_targets": None if health is None else health.up,
                    }
                )
            rows.append(
                {
                    "shard": shard,
                    "region": info.region,
                    "index": info.index,
                    "children": children,
                    "targets": sizes[shard],
                    "load": load[shard],
                    "load_over_mean": round(load[shard] / mean, 3) if mean else 0.0,
                    "capacity": round(mean * self.spec.sharding.load_factor, 1),
                    "drained": shard in assignment.drained,
                    "handovers_in": incoming.get(shard, 0),
                    "handovers_out": outgoing.get(shard, 0),
                    "health": _shard_health(children),
                }
            )
            if samples.get(shard) is not None:
                rows[-1]["samples_per_s"] = samples[shard]
        return rows

    def target_page(
        self,
        *,
        region: str | None,
        shard: str | None,
        q: str | None,
        offset: int,
        limit: int,
        after: str | None = None,
    ) -> tuple[int, list[dict[str, Any]]]:
        """(how many match, the rows of one page): rows are built for the page only, over the
        index of this assignment (``target_index``). ``after``: the page starts strictly after
        this identity (a cursor, stable while the set changes) instead of at ``offset``."""
        state, targets = self.pipeline.state, self.reconciler.target_map
        selected = self.target_selection(state, targets, region=region, shard=shard, q=q)
        assignment = state.assignment
        rows = []
        start = offset if after is None else bisect.bisect_right(selected, after)
        if assignment is not None:
            for identity in selected[start : start + limit]:
                target, owner = targets.get(identity), assignment.targets.get(identity)
                if target is not None and owner is not None:
                    rows.append(self._target_row(identity, target, owner, assignment))
        return len(selected), rows

    def target_selection(
        self,
        state: ControllerState,
        targets: Mapping[str, Target],
        *,
        region: str | None,
        shard: str | None,
        q: str | None,
    ) -> Sequence[str]:
        """The identities a filter keeps, sorted (no rows built)."""
        if state.assignment is None:
            return ()
        return self._index.get(state.assignment, targets).select(region=region, shard=shard, q=q)

    def _target_row(
        self, identity: str, target: Target, owner: str, assignment: Assignment
    ) -> dict[str, Any]:
        return {
            "identity": identity,
            "instance": target.instance,
            "job": target.job,
            "node": target.node,
            "region": target.region,
            "shard": owner,
            "weight": assignment.weights.get(identity, 1),
            "children": [child for child, _ in assignment.children(owner)],
            "health": self._target_health(target, owner, assignment),
        }

    def _target_health(self, target: Target, owner: str, assignment: Assignment) -> dict[str, str]:
        """child -> how its last health check saw this target; children not checked are left out.

        ``absent``: the child answered but does not scrape the target (yet).
        """
        key = (target.job, target.instance, target.node)
        out: dict[str, str] = {}
        for child, _ in assignment.children(owner):
            health = self.children.health.get(child)
            if health is None or not health.reachable:
                continue
            scrape = health.scrapes.get(key)
            out[child] = "absent" if scrape is None else scrape.health
        return out

    def explain(self, identity: str) -> dict[str, Any]:
        state, targets = self.pipeline.state, self.reconciler.target_map
        assignment = state.assignment
        target = targets.get(identity)
        if assignment is None or target is None or identity not in assignment.targets:
            raise NotFound(f"unknown target {identity!r}")
        owner = assignment.targets[identity]
        row = self._target_row(identity, target, owner, assignment)
        ring_owner = _ring_owner(assignment, identity, target.region)
        if identity in state.desired.pins:
            reason = "pinned"
        elif ring_owner == owner:
            reason = "ring owner"
        elif ring_owner in assignment.drained:
            reason = "drain"
        else:
            reason = "capacity spill"
        handover = next((h for h in state.handovers if h.identity == identity), None)
        row.update(
            reason=reason,
            ring_owner=ring_owner,
            pinned_to=state.desired.pins.get(identity),
            weight_override=state.desired.weights.get(identity),
            handover=None if handover is None else handover.model_dump(mode="json"),
            scraped_by=sorted(
                set(row["children"])
                | (
                    {c for c, _ in assignment.children(handover.from_shard)}
                    if handover is not None and handover.from_shard in assignment.shards
                    else set()
                )
            ),
            labels=secrets.mask_labels(target.target_labels(), secrets.MASK),
        )
        return row

    def discovery_rows(self, sources: Iterable[str]) -> list[dict[str, Any]]:
        counts = self.reconciler.source_counts()  # no sort, no copy: len() per source under the lock
        names = sorted(set(sources) | counts.keys())
        rows = []
        for name in names:
            age = self.discovery.staleness(name)
            rows.append(
                {
                    "source": name,
                    "targets": counts.get(name, 0),
                    "last_success_age_s": None if age is None else round(age, 1),
                }
            )
        return rows


def _shard_health(children: list[dict[str, Any]]) -> str:
    known = [c for c in children if c["reachable"] is not None]
    if not known:
        return "unknown"
    if any(not c["reachable"] for c in known):
        return "down"
    if any(c["up_targets"] != c["active_targets"] for c in known):
        return "degraded"
    return "ok"


def _ring_owner(assignment: Assignment, identity: str, region: str) -> str | None:
    """The shard the ring alone would pick (no capacity bound), for ``explain``."""
    if assignment.algorithm != "bounded-ring":
        return None
    from sharder.engine.assigning import VNODES
    from sharder.engine.hashing import key_hash, shared_ring

    active = _active_shards(assignment).get(region)
    if not active:
        return None
    return active[shared_ring(active, vnodes=VNODES).primary(key_hash(identity))]


_ACTIVE: list[tuple[object, tuple[str, ...], dict[str, tuple[str, ...]]]] = []
"""The last shard set's live shards per region, in index order: ``explain`` is polled per
request (a client waiting for its registration), and sorting 12,501 shards each time made
a poll cost the fleet. Held for one ``shards`` dict (the engine keeps it across changes)."""


def _active_shards(assignment: Assignment) -> dict[str, tuple[str, ...]]:
    drained = tuple(assignment.drained)
    held = _ACTIVE[0] if _ACTIVE else None
    if held is not None and held[0] is assignment.shards and held[1] == drained:
        return held[2]
    out: dict[str, list[str]] = {}
    gone = set(drained)
    for shard, info in sorted(assignment.shards.items(), key=lambda kv: kv[1].index):
        if shard not in gone:
            out.setdefault(info.region, []).append(shard)
    regions = {region: tuple(names) for region, names in out.items()}
    _ACTIVE[:] = [(assignment.shards, drained, regions)]
    return regions
