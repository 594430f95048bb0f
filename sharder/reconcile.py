"""The reconcile loop: target sets pushed by sources -> one debounced, sticky assignment.

Pipeline: sources (``sharder.sources.*``, one thread each) push *full* target sets into
:meth:`Reconciler.on_change`; :meth:`Reconciler.tick` (called by :meth:`Reconciler.run`
or by a test with a fake clock) merges them, applies grace periods and shard-count
hysteresis, and assigns through ``assign_fn`` (sticky ``sharder.assign.assign`` unless
the controller injects its own). Plain Python, no I/O: time comes from ``clock``.

**Merge.** Sources merge by target identity. When two sources list the same identity
the one earlier in ``precedence`` wins; sources not named there come after, in name
order. So ``precedence=("file", "consul")`` lets a hand-kept file override Consul. A
source pushing several sets (``consul/<service>@<dc>``) ranks by the part before "/".
One endpoint is one target (``sharder.endpoints``): a second identity for an endpoint
within a source is skipped; across sources the earlier in precedence keeps it and the
other identity is left out, named in a log line and counted (``duplicate_endpoint``).

**Debounce.** The first unapplied change opens a window of ``debounce_s`` (default
1 s); everything that arrives within it lands in one assignment at its end. So a burst
costs one re-assignment and no change waits longer than ``debounce_s``, even when the
registry never settles (a trailing debounce would keep postponing it).

**Grace.** A target that vanishes from every source is kept (in its shard) for
``grace_s`` (default 2 min); one that comes back in time never left, so a flapping
target never changes shard. A source that fails keeps its last set: errors go to
:meth:`Reconciler.on_error` and only count.

**Hysteresis.** See :mod:`sharder.sizing`; its counts go to ``assign`` as ``shard_counts``.

**Incremental.** With the default ``assign_fn`` the loop keeps a
``sharder.incremental.IncrementalAssigner``: a change costs time in proportion to the
change, and the result equals ``assign(spec, targets, previous=<last>, <overrides>)``.
The operator's overrides (pins, drains, weights, shard counts) are data the loop holds
(:meth:`Reconciler.set_overrides`), not a reason to re-assign: only a change of shard
counts (hysteresis or operator), of the overrides themselves, or a custom ``assign_fn``
runs a full placement. :meth:`Reconciler.adopt` takes an assignment made elsewhere (an
applied plan, the stored one at a restart) as the engine's base without placing again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from sharder import documents, sizing
from sharder import overrides as overriding
from sharder import plan as plan_mod
from sharder.assign import assign
from sharder.assignment import Assignment
from sharder.endpoints import Duplicate, EndpointIndex, cross_source_duplicates, endpoint_of, show
from sharder.errors import SharderError
from sharder.incremental import IncrementalAssigner
from sharder.inventory import Target, sort_targets
from sharder.spec import FederationSpec
from sharder.targetsets import Delta, NodeCounts, count_nodes, merge_sets, ranked_sources, target_delta

log = logging.getLogger(__name__)


class AssignFn(Protocol):
    """How the loop assigns; ``shard_counts`` carries the hysteresis decision per region."""

    def __call__(
        self,
        spec: FederationSpec,
        targets: Sequence[Target],
        *,
        previous: Assignment | None,
        shard_counts: Mapping[str, int],
    ) -> Assignment: ...


class DiscoveryObserver(Protocol):
    """What the loop reports (``sharder.discovery_metrics.DiscoveryMetrics`` implements it)."""

    def success(self, source: str, *, targets: int) -> None: ...

    def error(self, source: str, *, reason: str, count: int = 1) -> None: ...


class LastKnownStore(Protocol):
    """Where the merged per-source sets survive a restart (``sharder.lastknown``)."""

    def save(self, sets: Mapping[str, Sequence[Target]]) -> None: ...


@runtime_checkable
class LastKnownChanges(Protocol):
    """A store that can take only what changed: source -> identity -> target (None: gone).
    ``save_changes`` returns False when it cannot, and the loop saves the whole sets."""

    def save_changes(self, changes: Mapping[str, Mapping[str, Target | None]]) -> bool: ...


def sticky_assign(
    spec: FederationSpec,
    targets: Sequence[Target],
    *,
    previous: Assignment | None,
    shard_counts: Mapping[str, int],
) -> Assignment:
    """Default ``assign_fn``: sticky ``sharder.assign.assign`` with the hysteresis counts."""
    return assign(spec, targets, previous=previous, shard_counts=shard_counts)


OnAssignment = Callable[[Assignment, plan_mod.Plan], None]


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
    ) -> None:
        self.spec = spec
        self._clock = clock
        self.debounce_s, self.grace_s = debounce_s, grace_s
        self._sizer = sizing.ShardSizer(spec, hysteresis or sizing.Hysteresis(), previous=previous)
        self._precedence = list(precedence)
        self._assign_fn = assign_fn
        self._on_assignment = on_assignment
        self._observer = observer
        self._store = store
        self.persist_interval_s = persist_interval_s
        self._persisted_at = float("-inf")
        self._persist_due = False
        self._regions = set(spec.region_names())
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._sets: dict[str, dict[str, Target]] = {}
        self._jobs = {job.name: job for job in spec.jobs}
        self._endpoints: dict[str, EndpointIndex] = {}
        """source -> its targets by endpoint, kept with ``_sets``."""
        self._duplicates: frozenset[Duplicate] = frozenset()
        self._versions: dict[str, str | None] = {}
        self._missing_since: dict[str, float] = {}
        self._first_dirty: float | None = None
        self._assignment = previous
        self._applied: dict[str, Target] = {}
        self.assignments = 0
        self._incremental: IncrementalAssigner | None = None
        self._overrides = overriding.Overrides()
        self._full_due = False
        """The overrides changed since the last placement: the next one runs in full."""
        self._prepared: Assignment | None = None
        self._unsaved: dict[str, set[str]] = {}
        """source -> identities changed since the last persist (what a delta store writes)."""
        self.touched: set[str] | None = None
        """Identities the last placement may have moved (None: unknown, a full placement)."""
        self.touched_base: Assignment | None = None
        """The assignment ``touched`` is relative to."""
        self._nodes: dict[str, Counter[str]] | None = None
        """region -> node -> targets, of what is placed (None: count at the next tick)."""
        self.changed: set[str] | None = None
        """``touched`` plus the targets whose fields changed (labels): what SD must rebuild."""
        self.generation = 0
        """Counts the changes sources pushed: a loop that waits compares it (no lost wake-up)."""

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
            if checked != self._overrides:
                self._overrides = checked
                self._incremental = None
                self._full_due = True

    @property
    def overrides(self) -> overriding.Overrides:
        return self._overrides

    # ---- input from sources (any thread) -------------------------------------------------
    def on_change(self, source: str, targets: Iterable[Target], *, version: str | None = None) -> None:
        """``targets`` is the source's whole current set (not a delta)."""
        kept: dict[str, Target] = {}
        index = EndpointIndex(self._jobs)
        unknown = duplicate = same_endpoint = 0
        with documents.gc_paused():  # a full set builds a tuple per target: no GC passes meanwhile
            for target in targets:
                identity = target.identity  # computed, so once
                if target.region not in self._regions:
                    unknown += 1
                elif identity in kept:
                    duplicate += 1
                elif index.add_as(target, identity) is not None:
                    same_endpoint += 1
                else:
                    kept[identity] = target
        for reason, count in (
            ("unknown_region", unknown),
            ("duplicate", duplicate),
            ("duplicate_endpoint", same_endpoint),
        ):
            if count:
                log.warning("discovery source=%s skipped targets reason=%s count=%d", source, reason, count)
                if self._observer is not None:
                    self._observer.error(source, reason=reason, count=count)
        if self._observer is not None:
            self._observer.success(source, targets=len(kept))
        with self._wake:
            self._versions[source] = version
            before = self._sets.get(source, {})
            if before == kept:
                return
            self._sets[source] = kept
            self._endpoints[source] = index
            if version != "persisted":  # a seed from the store is saved already
                changed = {i for i in before.keys() | kept.keys() if before.get(i) != kept.get(i)}
                self._unsaved.setdefault(source, set()).update(changed)
            now = self._clock()
            for identity in before.keys() - kept.keys():  # the grace period starts now
                if identity in self._applied and not any(identity in s for s in self._sets.values()):
                    self._missing_since.setdefault(identity, now)
            self._mark_dirty()

    def on_delta(self, source: str, *, upserted: Sequence[Target], removed: Sequence[str]) -> None:
        """What changed in ``source``'s set (the built-in registry knows): the cost of the
        change, not of the set. Targets in unknown regions are skipped as ``on_change`` does."""
        kept = [t for t in upserted if t.region in self._regions]
        if len(kept) != len(upserted):
            count = len(upserted) - len(kept)
            log.warning("discovery source=%s skipped targets reason=unknown_region count=%d", source, count)
            if self._observer is not None:
                self._observer.error(source, reason="unknown_region", count=count)
        same_endpoint = 0
        with self._wake:
            members = self._sets.setdefault(source, {})
            index = self._endpoints.setdefault(source, EndpointIndex(self._jobs))
            changed = False
            now = self._clock()
            unsaved = self._unsaved.setdefault(source, set())
            for identity in removed:
                if members.pop(identity, None) is not None:
                    index.discard(identity)
                    changed = True
                    unsaved.add(identity)
                    if identity in self._applied and not any(identity in s for s in self._sets.values()):
                        self._missing_since.setdefault(identity, now)
            for target in kept:
                identity = target.identity
                if members.get(identity) != target:
                    if index.add(target) is not None:
                        same_endpoint += 1
                        continue
                    members[identity] = target
                    changed = True
                    unsaved.add(identity)
            size = len(members)
            if changed:
                self._mark_dirty()
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
        ``excluding`` (the registry asks before it accepts an entry), else None."""
        endpoint = endpoint_of(target, self._jobs)
        with self._lock:
            for name in ranked_sources(self._endpoints, self._precedence):
                owner = self._endpoints[name].owner(endpoint) if name != excluding else None
                if owner is not None and owner != target.identity:
                    return name, owner
        return None

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
        with self._lock:
            now = self._clock()
            if not self._due(now):
                persist = self._persist_due and now >= self._persisted_at + self.persist_interval_s
            else:
                persist = None
        if persist is not None:
            if persist:
                self._persist(now)
            return None
        with self._lock:
            self._first_dirty = None
            targets = self._effective(now)
        delta = target_delta(self._applied, targets)
        nodes = self._nodes_after(delta)
        counts = self._sizer.counts_of(nodes.counts, now=now)
        same = not (delta[0] or delta[1] or delta[2])
        if same and counts == self._sizer.applied and self._assignment is not None:
            return None
        try:
            new = self._place(targets, counts, delta)
        except SharderError as exc:  # keep serving the old assignment
            log.error("assignment failed, keeping the previous one: %s", exc)
            if self._observer is not None:
                self._observer.error("reconcile", reason="assignment_failed")
            return None
        plan = plan_mod.diff(self._assignment, new, only=self.touched)
        with self._lock:
            self._assignment, self._applied = new, targets
            self._nodes = nodes.nodes
            self._sizer.applied = counts
            self.assignments += 1
        if self._on_assignment is not None:
            self._on_assignment(new, plan)
        self._persist_due = True
        if now >= self._persisted_at + self.persist_interval_s:
            self._persist(now)
        return new

    def _place(self, targets: dict[str, Target], counts: dict[str, int], delta: Delta) -> Assignment:
        """The new assignment. A custom ``assign_fn`` sees every change. With the default
        one: unchanged when only labels changed, incremental (the cost of the change, equal
        to a full sticky assignment with the same overrides) while the shard counts and
        overrides stay, else a full sticky assignment that becomes the engine's new base."""
        previous = self._assignment
        self.touched, self.touched_base, self.changed = None, previous, None
        if self._assign_fn is not sticky_assign:
            ordered = sort_targets(targets.values())
            return self._assign_fn(self.spec, ordered, previous=previous, shard_counts=counts)
        if previous is not None and counts == self._sizer.applied:
            added, removed, relabelled = delta
            if not added and not removed:
                self.touched, self.changed = set(), relabelled
                return previous  # labels only: placement cannot change
            if self._incremental is None and not self._full_due:
                self._incremental = self._engine_from(previous, self._applied, counts)
            if self._incremental is not None and self._incremental.assignment is previous:
                result = self._incremental.apply(added=added, removed=removed)
                self.touched = self._incremental.touched
                if self.touched is not None:
                    self.changed = self.touched | relabelled
                return result
        ordered = sort_targets(targets.values())
        o = self._overrides
        self._full_due = False
        self._incremental = IncrementalAssigner(
            self.spec,
            ordered,
            previous=previous,
            shard_counts={**counts, **o.shard_counts},
            pins=o.pins,
            drained=o.drained,
            weight_overrides=o.weights,
        )
        return self._incremental.assignment

    def _nodes_after(self, delta: Delta) -> NodeCounts:
        """Distinct nodes per region once ``delta`` applies to what is placed now, in the
        time of the change (the counters are built once, then follow each change)."""
        if self._nodes is None:
            self._nodes = count_nodes(self._applied.values())
        added, removed, _ = delta
        step: dict[tuple[str, str], int] = {}
        for identity in removed:
            was = self._applied[identity]
            step[(was.region, was.node)] = step.get((was.region, was.node), 0) - 1
        for target in added:
            step[(target.region, target.node)] = step.get((target.region, target.node), 0) + 1
        step = {key: n for key, n in step.items() if n}
        if not step:
            return NodeCounts(self._nodes, {r: len(c) for r, c in self._nodes.items()})
        after = {region: Counter(found) for region, found in self._nodes.items()}
        for (region, node), n in step.items():
            bucket = after.setdefault(region, Counter())
            bucket[node] += n
            if bucket[node] <= 0:
                del bucket[node]
        return NodeCounts(after, {r: len(c) for r, c in after.items()})

    def _engine_from(
        self, assignment: Assignment, targets: Mapping[str, Target], counts: Mapping[str, int]
    ) -> IncrementalAssigner | None:
        """The engine over ``assignment`` as it stands (no placement), or None when the
        assignment does not cover exactly ``targets`` (then the next change places in full)."""
        if assignment.targets.keys() != targets.keys():
            return None
        o = self._overrides
        try:
            return IncrementalAssigner.adopting(
                self.spec,
                list(targets.values()),
                assignment,
                shard_counts={**counts, **o.shard_counts},
                pins=o.pins,
                drained=o.drained,
                weight_overrides=o.weights,
            )
        except SharderError as exc:
            log.warning("the stored assignment cannot seed the engine, placing in full: %s", exc)
            return None

    def _persist(self, now: float) -> None:
        """Save what changed in the per-source sets (a delta store) or the whole sets, at most
        every ``persist_interval_s``."""
        if self._store is None:
            return
        with self._lock:
            unsaved, self._unsaved = self._unsaved, {}
            changes = {
                name: {i: self._sets.get(name, {}).get(i) for i in identities}
                for name, identities in unsaved.items()
                if identities
            }
            self._persisted_at, self._persist_due = now, False
        if not changes:
            return  # the store holds these sets already
        if isinstance(self._store, LastKnownChanges) and self._store.save_changes(changes):
            return
        with self._lock:
            sets = {name: list(members.values()) for name, members in self._sets.items()}
        self._store.save(sets)

    def next_due(self) -> float | None:
        """Seconds until ``tick`` has work (0: now), None when nothing is pending."""
        with self._lock:
            now = self._clock()
            waits = []
            if self._first_dirty is not None:
                waits.append(self._first_dirty + self.debounce_s)
            if self._missing_since:
                waits.append(min(self._missing_since.values()) + self.grace_s)
            shrink = self._sizer.next_shrink_at()
            if shrink is not None:
                waits.append(shrink)
            if self._persist_due and self._store is not None:
                waits.append(self._persisted_at + self.persist_interval_s)
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
        if self._incremental is not None and self._nodes is not None:
            return False
        if self._nodes is None:
            self._nodes = count_nodes(self._applied.values())
        if self._incremental is None and not self._full_due:
            self._incremental = self._engine_from(previous, self._applied, self._sizer.applied)
        return True

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
            self._incremental = None  # rebuilt from ``assignment`` at the next change, not placed
            self._full_due = False

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
            self._incremental = None
            self._full_due = False
            self._sizer = sizing.ShardSizer(self.spec, self._sizer.rules, previous=previous)
            if targets is not None:
                self._applied = dict(targets)
                self._nodes = None
                self._missing_since = {i: t for i, t in self._missing_since.items() if i in self._applied}
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
    def target_map(self) -> dict[str, Target]:
        """identity -> target of the current assignment (a copy)."""
        return dict(self._applied)

    @property
    def pending(self) -> bool:
        with self._lock:
            return self._first_dirty is not None

    def source_sets(self) -> dict[str, list[Target]]:
        with self._lock:
            return {name: sort_targets(members.values()) for name, members in self._sets.items()}

    def versions(self) -> dict[str, str | None]:
        with self._lock:
            return dict(self._versions)

    def grace_remaining(self) -> dict[str, float]:
        """identity -> seconds until a vanished target is dropped."""
        with self._lock:
            now = self._clock()
            return {i: max(0.0, t + self.grace_s - now) for i, t in sorted(self._missing_since.items())}

    # ---- internals (lock held) ---------------------------------------------------------
    def _mark_dirty(self) -> None:
        if self._first_dirty is None:
            self._first_dirty = self._clock()
        self.generation += 1
        self._wake.notify_all()

    def _due(self, now: float) -> bool:
        if self._assignment is None and not self._sets:
            return False
        if self._first_dirty is not None and now >= self._first_dirty + self.debounce_s:
            return True
        if any(now >= since + self.grace_s for since in self._missing_since.values()):
            return True
        shrink = self._sizer.next_shrink_at()
        return shrink is not None and now >= shrink

    def _merged(self) -> dict[str, Target]:
        merged = merge_sets(self._sets, self._precedence)
        if len(self._sets) < 2:
            return merged
        ranked = [(name, self._endpoints[name]) for name in ranked_sources(self._sets, self._precedence)]
        duplicates = cross_source_duplicates(ranked, merged)
        for dup in duplicates:
            if merged.get(dup.identity) is self._sets[dup.source].get(dup.identity):
                del merged[dup.identity]
        self._note_duplicates(frozenset(duplicates))
        return merged

    def _note_duplicates(self, duplicates: frozenset[Duplicate]) -> None:
        """Log and count each duplicate once, when it appears (not at every tick)."""
        fresh = duplicates - self._duplicates
        self._duplicates = duplicates
        for dup in sorted(fresh, key=lambda d: (d.source, d.identity))[:20]:
            log.warning(
                "discovery source=%s left out target=%s reason=duplicate_endpoint endpoint=%s"
                " kept=%s kept_source=%s",
                dup.source,
                dup.identity,
                show(dup.endpoint),
                dup.kept,
                dup.kept_source,
            )
        if self._observer is not None:
            counts = Counter(d.source for d in fresh)
            for source, count in sorted(counts.items()):
                self._observer.error(source, reason="duplicate_endpoint", count=count)

    def _effective(self, now: float) -> dict[str, Target]:
        """Merged targets plus vanished ones still in their grace period."""
        merged = self._merged()
        for identity in list(self._missing_since):
            if identity in merged:
                del self._missing_since[identity]
        for identity, target in self._applied.items():
            if identity in merged:
                continue
            since = self._missing_since.setdefault(identity, now)
            if now < since + self.grace_s:
                merged[identity] = target
            else:
                del self._missing_since[identity]
        return merged
