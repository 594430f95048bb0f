"""What the sources say, merged: the reconcile loop's view of every source's set.

:class:`MergedSources` holds each source's last set and its endpoint index, the
cross-source duplicates left out, the targets that vanished and are in their grace
period, and the identities changed since the last tick. :class:`sharder.live.reconcile.Reconciler`
owns one and decides *when* to place; this module says *what* there is to place.

**Merge.** Sources merge by target identity; the source earlier in ``precedence`` wins,
the others follow in name order (``consul/<service>@<dc>`` ranks as "consul"). One
endpoint is one target (``sharder.model.endpoints``): across sources the earlier one keeps it
and the other identity is left out, logged once and counted (``duplicate_endpoint``).

**Grace.** A placed target that no source names any more stays for ``grace_s``.

**Cost.** Sources name what they change (:meth:`MergedSources.replace`,
:meth:`MergedSources.apply_delta`), so :meth:`MergedSources.effective` looks at those
identities alone; after :meth:`MergedSources.look_at_everything` it merges every set.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence

from sharder.engine.cowmap import DELETE, CowMap
from sharder.engine.targetsets import Delta, merge_sets, note_change, ranked_sources, target_delta
from sharder.live.intake import DiscoveryObserver
from sharder.model.endpoints import (
    Duplicate,
    Endpoint,
    EndpointIndex,
    cross_source_duplicates,
    endpoint_of,
    sharing,
    show,
    winner,
)
from sharder.model.inventory import Target, sort_targets
from sharder.model.spec import JobSpec

log = logging.getLogger(__name__)


class MergedSources:
    """Per-source target sets and their merge. Not thread-safe: the owner
    (:class:`sharder.live.reconcile.Reconciler`) calls every method under its own lock."""

    def __init__(
        self,
        *,
        jobs: Mapping[str, JobSpec],
        precedence: Sequence[str],
        grace_s: float,
        observer: DiscoveryObserver | None,
    ) -> None:
        self._jobs = jobs
        self._precedence = list(precedence)
        self.grace_s = grace_s
        self._observer = observer
        self.sets: dict[str, dict[str, Target]] = {}
        """source -> identity -> target: each source's last set, as screened."""
        self._endpoints: dict[str, EndpointIndex] = {}
        """source -> its targets by endpoint, kept with ``sets``."""
        self.duplicates: frozenset[Duplicate] = frozenset()
        """Identities left out because an earlier source serves their endpoint."""
        self._versions: dict[str, str | None] = {}
        self._missing_since: dict[str, float] = {}
        self._dirty: set[str] | None = set()
        self._dirty_endpoints: set[Endpoint] = set()
        """Identities whose merged target may differ from what is placed (None: look at
        all of them). Sources name them as they push, so a tick costs the change."""

    def new_index(self) -> EndpointIndex:
        """An empty endpoint index for a set being screened (outside the owner's lock)."""
        return EndpointIndex(self._jobs)

    # ---- input ---------------------------------------------------------------------------
    def replace(
        self,
        source: str,
        kept: dict[str, Target],
        *,
        index: EndpointIndex,
        version: str | None,
        applied: Mapping[str, Target],
        now: float,
    ) -> set[str] | None:
        """``source``'s whole new set (screened into ``index``); the identities that
        changed, or None when the set is the same as before."""
        self._versions[source] = version
        before = self.sets.get(source, {})
        # a source's first answer counts even when empty: "no targets yet" is an answer, and
        # the first assignment (empty shards, children configs) must not wait for a target
        if source in self.sets and before == kept:
            return None
        self.sets[source] = kept
        self._endpoints[source] = index
        changed = {i for i in before.keys() | kept.keys() if before.get(i) != kept.get(i)}
        for identity in changed:
            self._note_dirty(identity, before.get(identity), kept.get(identity))
        for identity in before.keys() - kept.keys():  # the grace period starts now
            if identity in applied and not any(identity in s for s in self.sets.values()):
                self._missing_since.setdefault(identity, now)
        return changed

    def apply_delta(
        self,
        source: str,
        *,
        upserted: Sequence[Target],
        removed: Sequence[str],
        applied: Mapping[str, Target],
        now: float,
    ) -> tuple[set[str], int]:
        """What changed in ``source``'s set; (identities that changed, upserts skipped
        because another identity of the source serves their endpoint)."""
        members = self.sets.setdefault(source, {})
        index = self._endpoints.setdefault(source, EndpointIndex(self._jobs))
        changed: set[str] = set()
        same_endpoint = 0
        for identity in removed:
            if (gone := members.pop(identity, None)) is not None:
                index.discard(identity)
                changed.add(identity)
                self._note_dirty(identity, gone)
                if identity in applied and not any(identity in s for s in self.sets.values()):
                    self._missing_since.setdefault(identity, now)
        for target in upserted:
            identity = target.identity
            if members.get(identity) != target:
                if index.add(target) is not None:
                    same_endpoint += 1
                    continue
                self._note_dirty(identity, members.get(identity), target)
                members[identity] = target
                changed.add(identity)
        return changed, same_endpoint

    def look_at_everything(self) -> None:
        """The next :meth:`effective` merges every source (what is placed was replaced)."""
        self._dirty = None

    def keep_grace_of(self, applied: Mapping[str, Target]) -> None:
        """Forget grace periods of targets that ``applied`` (a new base) does not hold."""
        self._missing_since = {i: t for i, t in self._missing_since.items() if i in applied}

    # ---- the merge -----------------------------------------------------------------------
    def effective(self, applied: Mapping[str, Target], now: float) -> tuple[Mapping[str, Target], Delta]:
        """What to place now (merged targets plus vanished ones within their grace) and its
        delta from ``applied``; ``applied`` itself when nothing differs. Takes the dirty set.
        The map is a :class:`~sharder.engine.cowmap.CowMap`: the next change's map shares
        its untouched buckets instead of copying every target."""
        dirty, self._dirty = self._dirty, set()
        endpoints, self._dirty_endpoints = self._dirty_endpoints, set()
        if dirty is None:
            targets = CowMap(self._effective(applied, now))
            return targets, target_delta(applied, targets)
        return self._effective_delta(applied, dirty, endpoints, now)

    def _note_dirty(self, identity: str, *targets: Target | None) -> None:
        """``identity`` changed (its targets before and after): it and whoever shares one of
        their endpoints in another source are looked at by the next tick."""
        if self._dirty is not None:
            self._dirty.add(identity)
            self._dirty_endpoints.update(endpoint_of(t, self._jobs) for t in targets if t is not None)

    def _effective_delta(
        self, applied: Mapping[str, Target], dirty: set[str], endpoints: set[Endpoint], now: float
    ) -> tuple[Mapping[str, Target], Delta]:
        """:meth:`_effective` and :func:`target_delta` for the ``dirty`` identities alone (and
        those sharing their endpoints, and any whose grace period ended): the same result,
        at the cost of the change."""
        endpoints.update(endpoint_of(applied[i], self._jobs) for i in dirty if i in applied)
        looked_at = dirty | sharing(endpoints, self._endpoints)
        looked_at.update(i for i, since in self._missing_since.items() if now >= since + self.grace_s)
        order = ranked_sources(self.sets, self._precedence)
        duplicates = {d for d in self.duplicates if d.identity not in looked_at}
        added: list[Target] = []
        removed: list[str] = []
        relabelled: set[str] = set()
        updates: dict[str, Target | None] = {}
        for identity in looked_at:
            target, duplicate = winner(identity, order, self.sets, self._endpoints, self._jobs)
            if duplicate is not None:
                duplicates.add(duplicate)
            if target is not None:
                self._missing_since.pop(identity, None)
            elif identity in applied:
                since = self._missing_since.setdefault(identity, now)
                if now < since + self.grace_s:
                    target = applied[identity]
                else:
                    del self._missing_since[identity]
            before = applied.get(identity)
            if before is target:
                continue
            updates[identity] = target
            note_change((added, removed, relabelled), identity, before, target)
        self._note_duplicates(frozenset(duplicates))
        if not updates:
            return applied, (added, removed, relabelled)
        writes = {identity: DELETE if target is None else target for identity, target in updates.items()}
        return CowMap.of(applied).evolve(writes), (added, removed, relabelled)

    def _merged(self) -> dict[str, Target]:
        merged = merge_sets(self.sets, self._precedence)
        if len(self.sets) < 2:
            return merged
        ranked = [(name, self._endpoints[name]) for name in ranked_sources(self.sets, self._precedence)]
        duplicates = cross_source_duplicates(ranked, merged)
        for dup in duplicates:
            if merged.get(dup.identity) is self.sets[dup.source].get(dup.identity):
                del merged[dup.identity]
        self._note_duplicates(frozenset(duplicates))
        return merged

    def _effective(self, applied: Mapping[str, Target], now: float) -> dict[str, Target]:
        """Merged targets plus vanished ones still in their grace period."""
        merged = self._merged()
        for identity in list(self._missing_since):
            if identity in merged:
                del self._missing_since[identity]
        for identity, target in applied.items():
            if identity in merged:
                continue
            since = self._missing_since.setdefault(identity, now)
            if now < since + self.grace_s:
                merged[identity] = target
            else:
                del self._missing_since[identity]
        return merged

    def _note_duplicates(self, duplicates: frozenset[Duplicate]) -> None:
        """Log and count each duplicate once, when it appears (not at every tick)."""
        fresh = duplicates - self.duplicates
        self.duplicates = duplicates
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

    # ---- reads ---------------------------------------------------------------------------
    def endpoint_owner(self, target: Target, *, excluding: str) -> tuple[str, str] | None:
        """(source, identity) of another identity serving ``target``'s endpoint outside
        ``excluding``, else None."""
        endpoint = endpoint_of(target, self._jobs)
        for name in ranked_sources(self._endpoints, self._precedence):
            owner = self._endpoints[name].owner(endpoint) if name != excluding else None
            if owner is not None and owner != target.identity:
                return name, owner
        return None

    def grace_ends(self) -> float | None:
        """When the first grace period ends (clock time), None when none runs."""
        return min(self._missing_since.values()) + self.grace_s if self._missing_since else None

    def grace_ended(self, now: float) -> bool:
        return any(now >= since + self.grace_s for since in self._missing_since.values())

    def grace_remaining(self, now: float) -> dict[str, float]:
        """identity -> seconds until a vanished target is dropped."""
        return {i: max(0.0, t + self.grace_s - now) for i, t in sorted(self._missing_since.items())}

    def source_sets(self) -> dict[str, list[Target]]:
        return {name: sort_targets(members.values()) for name, members in self.sets.items()}

    def source_counts(self) -> dict[str, int]:
        """Targets per source, counted without sorting (``/v1/status``)."""
        return {name: len(members) for name, members in self.sets.items()}

    def whole_sets(self) -> dict[str, list[Target]]:
        return {name: list(members.values()) for name, members in self.sets.items()}

    def versions(self) -> dict[str, str | None]:
        return dict(self._versions)
