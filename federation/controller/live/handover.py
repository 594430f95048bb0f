"""Make-before-break: a moved target is offered to its new shard first, kept on its old one.

Prometheus Operator and the OpenTelemetry target allocator drop a moved target from
the old shard and add it to the new one at once; the new child scrapes it only after
its next SD refresh and first scrape, so dashboards see a gap and staleness markers.
Here the old shard keeps serving the target until the new shard's children have
scraped it (``probe`` says so) or its hand-over window has passed.

During the overlap both children send the same series; the copies differ only in the
``shard`` (and ``replica``) external labels, which is what the master tier deduplicates
on (``max without (shard, replica)`` in rules, ``--query.replica-label`` in Thanos).
The target's own labels stay the same on both sides, so neither child's scrape loop
restarts: the old child's series ends with one staleness marker when it lets go, and the
new child's series has been running since its first scrape.

Pure: time is passed in; :func:`reconcile` is called on every new assignment and
:func:`settle` on every tick.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from federation.controller.base.state import Handover
from federation.spec import GpufedSpec
from sharder.engine.assignment import Assignment
from sharder.kernel.models import parse_duration

DISCOVERY_THROTTLE_S = 5.0
"""Prometheus' discovery-to-scrape update throttle (``discovery.Manager``)."""

Scraped = Callable[[Handover], bool]
Fetched = Callable[[str], float | None]
"""shard -> Unix time one of its children last fetched its HTTP SD (None: never)."""
"""Whether every reachable child of ``to_shard`` has scraped the target since ``started_at``."""


def reconcile(
    previous: Assignment | None,
    current: Assignment,
    handovers: Iterable[Handover],
    *,
    now: float,
    job_of: Mapping[str, str],
    max_wait_s: float,
    only: Collection[str] | None = None,
) -> list[Handover]:
    """The hand-overs after ``previous`` -> ``current``.

    A target that moves starts one (from its old shard); one already in flight keeps its
    original ``from_shard`` (that child is still scraping) and follows a second move; a
    target back on its ``from_shard``, or gone, ends its hand-over. ``only``: the
    identities that may have moved (the engine knows them), so a change costs its size.
    """
    kept: dict[str, Handover] = {}
    settled: set[str] = set()  # back on a shard that never stopped scraping it: no new overlap
    for h in handovers:
        owner = current.targets.get(h.identity)
        if owner is None or owner == h.from_shard:
            settled.add(h.identity)
            continue
        if owner != h.to_shard:
            h = h.model_copy(
                update={
                    "to_shard": owner,
                    "started_at": now,
                    "offered_at": None,
                    "deadline": now + max_wait_s,
                }
            )
        kept[h.identity] = h
    if previous is not None:
        before, after = previous.targets, current.targets
        candidates = after if only is None else (i for i in only if i in after)
        for identity in candidates:
            owner = after[identity]
            old = before.get(identity)
            if old is None or old == owner or identity in kept or identity in settled:
                continue
            job = job_of.get(identity, "")
            kept[identity] = Handover(
                identity=identity,
                job=job,
                from_shard=old,
                to_shard=owner,
                started_at=now,
                deadline=now + max_wait_s,
            )
    return [kept[i] for i in sorted(kept)]


def settle(
    handovers: Iterable[Handover],
    *,
    now: float,
    scraped: Scraped | None,
    fetched: Fetched,
    window_s: Callable[[str], float],
) -> tuple[list[Handover], list[tuple[Handover, str]]]:
    """(still in flight, finished with the reason ``scraped``, ``window`` or ``timeout``).

    The window (default: SD refresh + two scrape intervals) runs from the moment the new
    shard's child first fetched its targets, since before that it cannot be scraping;
    ``deadline`` bounds the wait for a child that never shows up.
    """
    pending: list[Handover] = []
    done: list[tuple[Handover, str]] = []
    for h in handovers:
        if h.offered_at is None:
            last = fetched(h.to_shard)
            if last is not None and last >= h.started_at:
                h = h.model_copy(update={"offered_at": last})
        if scraped is not None and h.offered_at is not None and scraped(h):
            done.append((h, "scraped"))
        elif h.offered_at is not None and now >= h.offered_at + window_s(h.job):
            done.append((h, "window"))
        elif now >= h.deadline:
            done.append((h, "timeout"))
        else:
            pending.append(h)
    return pending, done


def outgoing(handovers: Iterable[Handover]) -> dict[str, set[str]]:
    """shard -> identities it still serves for a hand-over (beyond what it owns)."""
    out: dict[str, set[str]] = {}
    for h in handovers:
        out.setdefault(h.from_shard, set()).add(h.identity)
    return out


def default_window_s(spec: GpufedSpec, job: str) -> float:
    """How long the old child keeps a moved target once the new child has fetched it, when no
    proof comes: the SD refresh, Prometheus' discovery-to-scrape update throttle and two
    scrape intervals of the target's job."""
    spec_job = next((j for j in spec.jobs if j.name == job), None)
    interval = parse_duration(spec_job.scrape_interval if spec_job else spec.children.scrape_interval)
    refresh = (
        parse_duration(spec.children.http_sd_refresh_interval)
        if spec.children.target_discovery == "http_sd"
        else 60.0
    )
    return refresh + DISCOVERY_THROTTLE_S + 2 * interval
