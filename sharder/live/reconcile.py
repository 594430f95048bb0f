"""The reconcile loop: target sets pushed by sources -> one debounced, sticky assignment.

Pipeline: sources (``sharder.sources.*``, one thread each) push *full* target sets into
:meth:`Reconciler.on_change`; the built-in registry, which must answer each registration,
offers its deltas through :meth:`Reconciler.offer` on the caller's thread (checked against
the merged view and applied in one step under the lock, or refused as a value,
``sharder.live.offers``); :meth:`Reconciler.tick` (called by :meth:`Reconciler.run`
or by a test with a fake clock) merges them, applies grace periods and shard-count
hysteresis, and assigns through ``assign_fn`` (sticky ``sharder.engine.assigning.assign`` unless
the controller injects its own). Plain Python, no I/O: time comes from ``clock``.

**Merge.** What the sources say, merged, is :class:`sharder.live.merging.MergedSources`'s:
by target identity, the source earlier in ``precedence`` first (so ``precedence=("file",
"consul")`` lets a hand-kept file override Consul), one target per endpoint. Within a
source a second identity for an endpoint is skipped; across sources the later one is
left out, logged and counted (``duplicate_endpoint``). This module decides when to place.

**Debounce.** The first unapplied change opens a window of ``debounce_s`` (default
1 s); everything that arrives within it lands in one assignment at its end. So a burst
costs one re-assignment and no change waits longer than ``debounce_s``, even when the
registry never settles (a trailing debounce would keep postponing it).

**Grace.** A target that vanishes from every source is kept (in its shard) for
``grace_s`` (default 2 min, kept by ``MergedSources``); one that comes back in time never left, so a flapping
target never changes shard. A source that fails keeps its last set: errors go to
:meth:`Reconciler.on_error` and only count.

**Hysteresis.** See :mod:`sharder.engine.sizing`; its counts go to ``assign`` as ``shard_counts``.

**Incremental.** Placement is :class:`sharder.live.placer.Placer`'s: with the default
``assign_fn`` it keeps a ``sharder.engine.incremental.IncrementalAssigner``, so a change costs
time in proportion to the change, and the result equals ``assign(spec, targets,
previous=<last>, <overrides>)``. The operator's overrides (pins, drains, weights, shard
counts) are data it holds (:meth:`Reconciler.set_overrides`), not a reason to re-assign:
only a change of shard counts (hysteresis or operator), of the overrides themselves, or a
custom ``assign_fn`` runs a full placement. :meth:`Reconciler.adopt` takes an assignment made elsewhere (an
applied plan, the stored one at a restart) as the engine's base without placing again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from types import MappingProxyType

from sharder.engine import overriding, planning, sizing
from sharder.engine.assignment import Assignment
from sharder.engine.cowmap import CowMap
from sharder.engine.incremental import IncrementalAssigner
from sharder.engine.step import Step
from sharder.engine.targetsets import Delta, NodeCounts, NodeMap, count_nodes, nodes_after
from sharder.kernel import documents
from sharder.kernel.errors import SharderError
from sharder.live import intake, offers
from sharder.live.intake import DiscoveryObserver
from sharder.live.merging import MergedSources
from sharder.live.offers import EndpointOwned, Refusal, RegionCapped
from sharder.live.persisting import LastKnownStore, SetPersister
from sharder.live.placer import AssignFn, Placer, sticky_assign
from sharder.model.inventory import Target, sort_targets
from sharder.model.spec import FederationSpec

log = logging.getLogger(__name__)


OnAssignment = Callable[[Assignment, planning.Plan], None]


class Reconciler:
    """Thread-safe: sources call ``on_change``/``on_error`` from their own threads."""

    def __init__(
        self,
        *,
        spec: FederationSpec,
        previous: Assignment | None = None,
        clock: Callable[[], float] = time.monotonic,
        debounce_s: float = 1.0,
        grace_s: float = 120.0,
        hysteresis: sizing.Hysteresis | None = None,
        precedence: Sequence[str] = (),
        assign_fn: AssignFn = sticky_assign,
        on_assignment: OnAssignment | None = None,
        observer: DiscoveryObserver | None = None,
        store: LastKnownStore | None = None,
        persist_interval_s: float = 5.0,
        sets_in_steps: bool = False,
    ) -> None:
        """``sets_in_steps``: every :class:`~sharder.engine.step.Step` carries the per-source set
        changes not stored yet, for a caller that commits them with the step (then give no
        ``store``: the loop writes none itself)."""
        self.spec = spec
        self._clock = clock
        self.debounce_s = debounce_s
        self._sizer = sizing.ShardSizer(spec, hysteresis or sizing.Hysteresis(), previous=previous)
        self.placer = Placer(spec, assign_fn=assign_fn)
        self._on_assignment = on_assignment
        self._sets_in_steps = sets_in_steps
        self._observer = observer
        self._persister = SetPersister(store, interval_s=persist_interval_s)
        self._regions = set(spec.region_names())
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        jobs = {job.name: job for job in spec.jobs}
        self.sources = MergedSources(jobs=jobs, precedence=precedence, grace_s=grace_s, observer=observer)
        """What the sources say, merged; used only under ``_lock``."""
        self._first_dirty: float | None = None
        self._assignment = previous
        self._applied: Mapping[str, Target] = {}
        self.assignments = 0
        self._prepared: Assignment | None = None
        self._nodes: NodeMap | None = None
        """region -> node -> targets, of what is placed (None: count at the next tick)."""
        self._offered = offers.PendingNodes()
        """Nodes offered (``offer``) and not placed yet, for the region cap."""
        self.generation = 0
        """Counts the changes sources pushed: a loop that waits compares it (no lost wake-up)."""
        self.placed_through = 0
        """The newest ``generation`` a step has taken in (placed, found unchanged, or failed
        to place, keeping the old assignment): what a settling controller waits for."""

    # ---- the operator's overrides ----------------------------------------------------------
    def set_overrides(
        self,
        *,
        shard_counts: Mapping[str, int] | None = None,
        pins: Mapping[str, str] | None = None,
        drained: Iterable[str] | None = None,
        weights: Mapping[str, int] | None = None,
    ) -> None:
        """The overrides every later placement honours (checked here: ``AssignmentError``).
        Unchanged ones keep the engine; changed ones make the next placement a full one."""
        checked = overriding.build(
            self.spec,
            shard_counts=shard_counts,
            pins=pins,
            drained=frozenset(drained or ()),
            weight_overrides=weights,
        )
        with self._lock:
            self.placer.set_overrides(checked)

    @property
    def grace_s(self) -> float:
        return self.sources.grace_s

    @grace_s.setter
    def grace_s(self, value: float) -> None:
        self.sources.grace_s = value

    @property
    def overrides(self) -> overriding.Overrides:
        return self.placer.overrides

    @property
    def engine(self) -> IncrementalAssigner | None:
        """The incremental engine over the current assignment (None: not built yet)."""
        return self.placer.engine

    # ---- input from sources (any thread) -------------------------------------------------
    def on_change(self, source: str, targets: Iterable[Target], *, version: str | None = None) -> None:
        """``targets`` is the source's whole current set (not a delta)."""
        index = self.sources.new_index()
        with documents.gc_paused():  # a full set builds a tuple per target: no GC passes meanwhile
            kept = intake.screen_set(
                source, targets, regions=self._regions, observer=self._observer, endpoints=index
            )
        with self._wake:
            changed = self.sources.replace(
                source, kept, index=index, version=version, applied=self._applied, now=self._clock()
            )
            if changed is None:
                return
            if version != "persisted":  # a seed from the store is saved already
                self._persister.note(source).update(changed)
            self._mark_dirty()

    def on_delta(self, source: str, *, upserted: Sequence[Target], removed: Sequence[str]) -> None:
        """What changed in ``source``'s set (a source that knows): the cost of the change,
        not of the set. Targets in unknown regions are skipped as ``on_change`` does."""
        kept = intake.screen_delta(source, upserted, regions=self._regions, observer=self._observer)
        with self._wake:
            size, same_endpoint = self._apply_delta(source, kept, removed)
        self._delta_taken(source, size, same_endpoint)

    def offer(self, source: str, *, upserted: Sequence[Target], removed: Sequence[str]) -> Refusal | None:
        """A change the source must answer for (the built-in registry's PUT, batch, DELETE):
        checked and applied in one step under the loop's lock, then the inbox is woken.

        Refused, nothing applied: an upserted target's endpoint served by another source
        (:class:`~sharder.live.offers.EndpointOwned`), or new nodes that would grow a sized
        region past ``--max-shards-per-region`` (:class:`~sharder.live.offers.RegionCapped`),
        counting the nodes placed and those offered since (``offers.PendingNodes``), so
        back-to-back offers between two steps cannot overshoot the cap. ``upserted`` may
        hold unchanged targets (a refresh): they are checked, not applied again."""
        kept = intake.screen_delta(source, upserted, regions=self._regions, observer=self._observer)
        with self._wake:
            refusal = self._refusal(source, kept)
            if refusal is not None:
                return refusal
            before = self.generation
            size, same_endpoint = self._apply_delta(source, kept, removed)
            changed = self.generation != before
        if changed or same_endpoint:  # a refresh that changed nothing reports nothing
            self._delta_taken(source, size, same_endpoint)
        return None

    def _refusal(self, source: str, upserted: Sequence[Target]) -> Refusal | None:
        """Why ``upserted`` may not join (lock held), or None."""
        for target in upserted:
            owner = self.sources.endpoint_owner(target, excluding=source)
            if owner is not None:
                return EndpointOwned(
                    reason=f"endpoint of {target.identity!r} is served by identity {owner[1]!r} ({owner[0]})",
                    target=target,
                    source=owner[0],
                    identity=owner[1],
                )
        for region, nodes in sorted(_nodes_by_region(upserted).items()):
            known = self._offered.known(region, self.nodes_in(region))
            why = sizing.region_refusal(self.spec, self._sizer.rules, region, known=known, new=nodes)
            if why is not None:
                return RegionCapped(reason=why, region=region)
        return None

    def _apply_delta(
        self, source: str, upserted: Sequence[Target], removed: Sequence[str]
    ) -> tuple[int, int]:
        """Apply a delta (lock held); (the source's size after it, upserts skipped because
        another identity of the source serves their endpoint)."""
        changed, same_endpoint = self.sources.apply_delta(
            source, upserted=upserted, removed=removed, applied=self._applied, now=self._clock()
        )
        self._persister.note(source).update(changed)
        if changed:
            self._mark_dirty()
            fresh = [t for t in upserted if t.identity in changed]
            for region, nodes in _nodes_by_region(fresh).items():
                self._offered.note(region, nodes, placed=self.nodes_in(region), generation=self.generation)
        return len(self.sources.sets[source]), same_endpoint

    def _delta_taken(self, source: str, size: int, same_endpoint: int) -> None:
        if same_endpoint:
            log.warning(
                "discovery source=%s skipped targets reason=duplicate_endpoint count=%d",
                source,
                same_endpoint,
            )
            if self._observer is not None:
                self._observer.error(source, reason="duplicate_endpoint", count=same_endpoint)
        if self._observer is not None:
            self._observer.success(source, targets=size)

    def endpoint_owner(self, target: Target, *, excluding: str) -> tuple[str, str] | None:
        """(source, identity) of another identity serving ``target``'s endpoint outside
        ``excluding`` (the registry names it in a batch's errors), else None."""
        with self._lock:
            return self.sources.endpoint_owner(target, excluding=excluding)

    def on_error(self, source: str, reason: str) -> None:
        """A failed poll or watch: the source's last set stays; only the count moves."""
        if self._observer is not None:
            self._observer.error(source, reason=reason)

    def seed(self, sets: Mapping[str, Sequence[Target]]) -> None:
        """Start from persisted last-known sets (a restart while a registry is down)."""
        for source, targets in sets.items():
            self.on_change(source, targets, version="persisted")

    # ---- the loop ------------------------------------------------------------------------
    def tick(self) -> Assignment | None:
        """Apply what is due now; the new assignment, or None when nothing changed."""
        step = self.step()
        return None if step is None else step.assignment

    def step(self) -> Step | None:
        """Apply what is due now: the change as one value (:class:`~sharder.engine.step.Step`),
        or None when nothing changed."""
        with self._lock:
            now = self._clock()
            persist = None if self._due(now) else self._persister.wants(now)
        if persist is not None:
            if persist:
                self._persist(now)
            return None
        with self._lock:
            self._first_dirty = None
            targets, delta = self.sources.effective(self._applied, now)
            placing = self.generation  # every offer up to it is in ``targets``
        try:
            return self._place(now, targets, delta, placing)
        finally:  # placed, found the same, or failed (the old assignment stays): looked at
            with self._lock:
                self.placed_through = max(self.placed_through, placing)

    def _place(self, now: float, targets: Mapping[str, Target], delta: Delta, placing: int) -> Step | None:
        """The rest of :meth:`step`: ``targets`` and ``delta`` as of ``generation`` ``placing``."""
        nodes = self._nodes_after(delta)
        counts = self._sizer.counts_of(nodes.counts, now=now)
        same = not (delta[0] or delta[1] or delta[2])
        if same and counts == self._sizer.applied and self._assignment is not None:
            self._forget_offered(placing)
            return None
        try:
            placed = self.placer.place(
                previous=self._assignment,
                applied=self._applied,
                targets=targets,
                counts=counts,
                applied_counts=self._sizer.applied,
                delta=delta,
            )
        except SharderError as exc:  # keep serving the old assignment
            log.error("assignment failed, keeping the previous one: %s", exc)
            if self._observer is not None:
                self._observer.error("reconcile", reason="assignment_failed")
            return None
        previous, new = self._assignment, placed.assignment
        only = None if placed.touched is None else set(placed.touched)
        plan = planning.diff(previous, new, only=only) if self._on_assignment is not None else None
        summary = planning.summarize(previous, new, only=only)
        with self._lock:
            self._assignment, self._applied = new, targets
            self._nodes = nodes.nodes
            self._offered.placed(placing)
            self._sizer.applied = counts
            self.assignments += 1
            sets = self._persister.take(now, self.sources.sets, every=True) if self._sets_in_steps else {}
        if self._on_assignment is not None and plan is not None:
            self._on_assignment(new, plan)
        if not self._sets_in_steps:
            self._persister.due = True
            if self._persister.wants(now):
                self._persist(now)
        return Step(base=previous, assignment=new, summary=summary, touched=placed.touched,
                    changed=placed.changed, targets=MappingProxyType(targets), sets=sets)  # fmt: skip

    def _forget_offered(self, upto: int) -> None:
        """Nothing to place: the offers up to ``upto`` are placed or gone again."""
        with self._lock:
            self._offered.placed(upto)

    def nodes_in(self, region: str) -> Collection[str]:
        """The distinct nodes of ``region`` placed now (for the region cap)."""
        nodes = self._nodes
        if nodes is None:  # a racing tick may build it too: the same counts, twice
            nodes = self._nodes = count_nodes(self._applied.values())
        return nodes.get(region, ())

    def _nodes_after(self, delta: Delta) -> NodeCounts:
        if self._nodes is None:  # built once, then follows each change
            self._nodes = count_nodes(self._applied.values())
        return nodes_after(self._nodes, self._applied, delta)

    def _persist(self, now: float) -> None:
        """Save what changed in the per-source sets (``sharder.live.persisting``)."""
        if self._persister.store is None:
            return
        with self._lock:
            changes = self._persister.take(now, self.sources.sets)
        self._persister.write(changes, self._whole_sets)

    def take_set_changes(self) -> dict[str, dict[str, Target | None]]:
        """Every change to the per-source sets not written yet, for a caller that writes them
        with its own commit (the controller, before a state that places them); it hands back
        what it could not write through :meth:`requeue_set_changes`."""
        with self._lock:
            return self._persister.take(self._clock(), self.sources.sets, every=True)

    def requeue_set_changes(self, changes: Mapping[str, Mapping[str, Target | None]]) -> None:
        with self._lock:
            self._persister.requeue(changes)

    def _whole_sets(self) -> dict[str, list[Target]]:
        with self._lock:
            return self.sources.whole_sets()

    def next_due(self) -> float | None:
        """Seconds until ``tick`` has work (0: now), None when nothing is pending."""
        with self._lock:
            now = self._clock()
            waits = []
            if self._assignment is None and not self.sources.sets:
                return None  # ``tick`` has nothing to place yet: a due time now would spin the loop
            if self._first_dirty is not None:
                waits.append(self._first_dirty + self.debounce_s)
            grace_ends = self.sources.grace_ends()
            if grace_ends is not None:
                waits.append(grace_ends)
            shrink = self._sizer.next_shrink_at()
            if shrink is not None:
                waits.append(shrink)
            persist_at = self._persister.next_at()
            if persist_at is not None:
                waits.append(persist_at)
            return max(0.0, min(waits) - now) if waits else None

    def run(self, stop: threading.Event, *, idle_s: float = 1.0) -> None:
        """Tick whenever something is due, until ``stop`` is set (real clock only)."""
        while not stop.is_set():
            due = self.next_due()
            if due is None or due > 0:
                with self._wake:
                    self._wake.wait(timeout=idle_s if due is None else min(due, idle_s))
            self.tick()

    def prepare(self) -> bool:
        """Index the current assignment for the engine now, if not yet (an idle loop calls
        it after a restart), so the first change does not pay for it; True when it did work.
        Not concurrently with :meth:`tick` (the controller holds one lock over both)."""
        previous = self._assignment
        if previous is None or self._prepared is previous:
            return False
        self._prepared = previous  # once per assignment, whether or not it can be indexed
        if self.placer.engine is not None and self._nodes is not None:
            return False
        if self._nodes is None:
            self._nodes = count_nodes(self._applied.values())
        self.placer.prepare(previous, self._applied, self._sizer.applied)
        return True

    @property
    def prepared(self) -> bool:
        """The assignment placed now is indexed for the engine (or cannot be, or there is
        none): the first change pays for no index (what a settling controller waits for)."""
        with self._lock:
            current = self._assignment
            return current is None or self._prepared is current or self.placer.engine is not None

    def wait_for_change(self, seen: int, timeout: float) -> bool:
        """Block until a source pushes a change after ``generation`` was ``seen``, or
        ``timeout`` passes; True on a change. What a driving loop sleeps on (no polling)."""
        with self._wake:
            return self._wake.wait_for(lambda: self.generation != seen, timeout=max(0.0, timeout))

    def interrupt(self) -> None:
        """Wake every waiter now (a stopping loop)."""
        with self._wake:
            self.generation += 1
            self._wake.notify_all()

    def adopt(self, assignment: Assignment) -> None:
        """Make ``assignment`` (an operator's applied plan) the base of the next change.

        The caller must not run :meth:`tick` concurrently (the controller holds one lock
        over both), or the tick in flight would replace it with one made from the old base.
        """
        with self._lock:
            self._assignment = assignment
            self.placer.forget()  # rebuilt from ``assignment`` at the next change, not placed

    def reset(
        self, *, previous: Assignment | None, targets: Mapping[str, Target] | None = None, dirty: bool = False
    ) -> None:
        """Start again from a stored assignment: a replica that takes over as leader, a
        follower adopting the leader's state, or a writer whose check-and-set lost.

        The next change builds on ``previous``; ``targets`` (identity -> target), when given,
        become what it was made from, so they are served at once and one that vanished gets
        its grace period instead of leaving at the first tick. ``dirty`` makes the next tick
        look again (it assigns only if something really differs). Not concurrently with
        :meth:`tick` (the controller holds one lock over both).
        """
        with self._lock:
            self._assignment = previous
            self.placer.forget()
            self._sizer = sizing.ShardSizer(self.spec, self._sizer.rules, previous=previous)
            if targets is not None:
                self._applied = CowMap(targets)
                self._nodes = None
                self.sources.look_at_everything()  # compare every source with what is now placed
                self.sources.keep_grace_of(self._applied)
            if dirty:
                self._mark_dirty()

    # ---- state -------------------------------------------------------------------------
    @property
    def assignment(self) -> Assignment | None:
        return self._assignment

    @property
    def targets(self) -> list[Target]:
        """The targets of the current assignment (including those within their grace)."""
        return sort_targets(self._applied.values())

    @property
    def target_map(self) -> Mapping[str, Target]:
        """identity -> target of the current assignment, read-only and never changed in
        place (a tick builds a new map), so a reader may keep it without a copy."""
        return MappingProxyType(self._applied)

    @property
    def pending(self) -> bool:
        with self._lock:
            return self._first_dirty is not None

    def source_sets(self) -> dict[str, list[Target]]:
        with self._lock:
            return self.sources.source_sets()

    def source_counts(self) -> dict[str, int]:
        with self._lock:
            return self.sources.source_counts()

    def versions(self) -> dict[str, str | None]:
        with self._lock:
            return self.sources.versions()

    def grace_remaining(self) -> dict[str, float]:
        """identity -> seconds until a vanished target is dropped."""
        with self._lock:
            return self.sources.grace_remaining(self._clock())

    # ---- internals (lock held) ---------------------------------------------------------
    def _mark_dirty(self) -> None:
        if self._first_dirty is None:
            self._first_dirty = self._clock()
        self.generation += 1
        self._wake.notify_all()

    def _due(self, now: float) -> bool:
        if self._assignment is None and not self.sources.sets:
            return False
        if self._first_dirty is not None and now >= self._first_dirty + self.debounce_s:
            return True
        if self.sources.grace_ended(now):
            return True
        shrink = self._sizer.next_shrink_at()
        return shrink is not None and now >= shrink


def _nodes_by_region(targets: Iterable[Target]) -> dict[str, set[str]]:
    by_region: dict[str, set[str]] = {}
    for target in targets:
        by_region.setdefault(target.region, set()).add(target.node)
    return by_region
