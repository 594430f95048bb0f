"""What a discovery source pushes, screened before the reconcile loop takes it.

Every source (file, Consul, Kubernetes, the built-in registry) reaches the loop through
``Reconciler.on_change`` (a whole set), ``on_delta`` or ``offer`` (what changed; the
registry's offers may be refused); all skip targets in
regions the spec does not know, and ``on_change`` keeps the first of duplicate identities.
What was skipped is logged and counted per source and reason, never raised: one bad entry
must not stop a fleet's discovery.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from typing import Protocol

from sharder.model.endpoints import EndpointIndex
from sharder.model.inventory import Target

log = logging.getLogger(__name__)


class DiscoveryObserver(Protocol):
    """What the loop reports (``sharder.sources.discovery_metrics.DiscoveryMetrics`` implements it)."""

    def success(self, source: str, *, targets: int) -> None: ...

    def error(self, source: str, *, reason: str, count: int = 1) -> None: ...


def _skipped(source: str, reason: str, count: int, observer: DiscoveryObserver | None) -> None:
    if count:
        log.warning("discovery source=%s skipped targets reason=%s count=%d", source, reason, count)
        if observer is not None:
            observer.error(source, reason=reason, count=count)


def screen_set(
    source: str,
    targets: Iterable[Target],
    *,
    regions: Collection[str],
    observer: DiscoveryObserver | None,
    endpoints: EndpointIndex,
) -> dict[str, Target]:
    """identity -> target of a whole set, without unknown regions, repeated identities and
    a second identity for an endpoint (``endpoints`` is filled with what is kept)."""
    kept: dict[str, Target] = {}
    unknown = duplicate = same_endpoint = 0
    for target in targets:
        identity = target.identity  # computed, so once
        if target.region not in regions:
            unknown += 1
        elif identity in kept:
            duplicate += 1
        elif endpoints.add_as(target, identity) is not None:
            same_endpoint += 1
        else:
            kept[identity] = target
    _skipped(source, "unknown_region", unknown, observer)
    _skipped(source, "duplicate", duplicate, observer)
    _skipped(source, "duplicate_endpoint", same_endpoint, observer)
    if observer is not None:
        observer.success(source, targets=len(kept))
    return kept


def screen_delta(
    source: str, upserted: Sequence[Target], *, regions: Collection[str], observer: DiscoveryObserver | None
) -> list[Target]:
    """The upserted targets of a delta, without unknown regions."""
    kept = [t for t in upserted if t.region in regions]
    _skipped(source, "unknown_region", len(upserted) - len(kept), observer)
    return kept
