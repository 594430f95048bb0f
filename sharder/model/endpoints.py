"""One endpoint, one target: the key every path de-duplicates by.

An *endpoint* is what Prometheus would scrape: scheme, host, port and metrics path, with
the job's defaults filled in. Hosts and ``host:port`` identities are already in one
spelling when a ``Target`` exists (``sharder.model.addresses``), so the key is plain data.

Three places use it, none with a copy: the inventory loader (``sharder.model.loading.TargetIndex``
refuses the second entry), the built-in registry (refuses an entry whose endpoint another
identity serves) and the reconcile loop's merge of sources (:func:`cross_source_duplicates`:
the source earlier in precedence keeps the endpoint, the other identity is left out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sharder.model.inventory import Target
from sharder.model.spec import JobSpec

Endpoint = tuple[str, str, int, str]
"""(scheme, host, port, metrics_path)."""
_PLAIN = ("http", "/metrics")


def endpoint_of(target: Target, jobs: Mapping[str, JobSpec]) -> Endpoint:
    job = jobs.get(target.job)
    scheme, path = (job.scheme, job.metrics_path) if job is not None else ("http", "/metrics")
    return (scheme, target.address, target.port, target.metrics_path or path)


def show(endpoint: Endpoint) -> str:
    scheme, host, port, path = endpoint
    return f"{scheme}://{host}:{port}{path}" if ":" not in host else f"{scheme}://[{host}]:{port}{path}"


@dataclass(frozen=True)
class Duplicate:
    """``identity`` from ``source`` was left out: ``kept`` from ``kept_source`` serves its endpoint."""

    identity: str
    source: str
    kept: str
    kept_source: str
    endpoint: Endpoint


class EndpointIndex:
    """endpoint -> identity for one set of targets, kept up to date as targets come and go."""

    def __init__(self, jobs: Mapping[str, JobSpec]) -> None:
        self.jobs = jobs
        self.owners: dict[Endpoint, str] = {}
        self._of: dict[str, Endpoint] = {}
        # scheme and path per job, looked up once: a full set costs one pass of tuple builds
        self._defaults = {name: (job.scheme, job.metrics_path) for name, job in jobs.items()}

    def owner(self, endpoint: Endpoint) -> str | None:
        return self.owners.get(endpoint)

    def add(self, target: Target) -> str | None:
        """Index ``target``; the other identity that already serves its endpoint (then nothing changes)."""
        return self.add_as(target, target.identity)

    def add_as(self, target: Target, identity: str) -> str | None:
        """:meth:`add` with the identity already computed (the loop over a full set has it)."""
        scheme, path = self._defaults.get(target.job, _PLAIN)
        endpoint = (scheme, target.address, target.port, target.metrics_path or path)
        owners = self.owners
        other = owners.get(endpoint)
        if other is not None and other != identity:
            return other
        before = self._of.get(identity)
        if before is not None and before != endpoint and owners.get(before) == identity:
            del owners[before]
        owners[endpoint] = identity
        self._of[identity] = endpoint
        return None

    def discard(self, identity: str) -> None:
        endpoint = self._of.pop(identity, None)
        if endpoint is not None and self.owners.get(endpoint) == identity:
            del self.owners[endpoint]

    def __len__(self) -> int:
        return len(self.owners)


def cross_source_duplicates(
    ranked: Sequence[tuple[str, EndpointIndex]], merged: Mapping[str, Target]
) -> list[Duplicate]:
    """Identities to leave out of ``merged`` because an earlier-ranked source serves their endpoint.

    ``ranked`` is every source's index, first in precedence first. The work is the
    smaller index of each pair (a C-level key intersection), not the fleet.
    """
    out: list[Duplicate] = []
    for i, (first_name, first) in enumerate(ranked):
        for later_name, later in ranked[i + 1 :]:
            for endpoint in first.owners.keys() & later.owners.keys():  # CPython walks the smaller
                kept, lost = first.owners[endpoint], later.owners[endpoint]
                if kept != lost and lost in merged:
                    out.append(Duplicate(lost, later_name, kept, first_name, endpoint))
    return out


def winner(
    identity: str,
    ranked: Sequence[str],
    sets: Mapping[str, Mapping[str, Target]],
    indexes: Mapping[str, EndpointIndex],
    jobs: Mapping[str, JobSpec],
) -> tuple[Target | None, Duplicate | None]:
    """What the merge of ``sets`` (first in ``ranked`` wins) plus :func:`cross_source_duplicates`
    gives for one identity: its target, or None with the duplicate that left it out. The
    reconcile loop asks this for the identities a change names, not for the fleet."""
    for position, name in enumerate(ranked):
        target = sets[name].get(identity)
        if target is None:
            continue
        if position == 0:
            return target, None
        endpoint = endpoint_of(target, jobs)
        for earlier in ranked[:position]:
            index = indexes.get(earlier)
            kept = index.owner(endpoint) if index is not None else None
            if kept is not None and kept != identity:
                return None, Duplicate(identity, name, kept, earlier, endpoint)
        return target, None
    return None, None


def sharing(endpoints: set[Endpoint], indexes: Mapping[str, EndpointIndex]) -> set[str]:
    """Every identity that serves one of ``endpoints`` in any source: whose merge a change
    to another identity at the same endpoint can decide."""
    return {owner for index in indexes.values() for e in endpoints if (owner := index.owner(e)) is not None}
