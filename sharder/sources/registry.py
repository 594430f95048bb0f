"""The built-in registry: exporters register with the controller itself (no Consul, no Kubernetes).

``PUT /v1/registry/targets/{identity}`` lands in :meth:`BuiltinRegistry.put` and
``POST /v1/registry/batch`` in :meth:`BuiltinRegistry.batch`, with the same validation as
an inventory file entry (``sharder.model.loading.parse_target``). An entry lives ``ttl_s`` after
its last PUT, so an exporter that dies without deregistering goes the way a failing Consul
check would (then the reconcile loop's grace period applies).

It is one discovery source named ``registry``, but unlike the polling sources it knows
exactly what changed, and it must answer for it: a 409 when another source serves the
endpoint, a 429 when new nodes would grow a sized region past its shard cap. Both are facts
of the loop's merged view, so each change is offered to the loop
(:meth:`sharder.live.reconcile.Reconciler.offer`), which checks and applies it in one step
under its lock, on the caller's thread, and wakes the controller's worker; a
:class:`~sharder.live.offers.Refusal` comes back as this module's error and nothing is
stored. One registration among a million costs one entry's work downstream; a PUT equal to
the stored entry only extends its TTL (the cheap refresh exporters do every ``ttl_s / 3``).

The registry has no thread: :meth:`BuiltinRegistry.expire` is called by its host (the
controller's worker, once a second) and costs the entries that expire, not the registry.
What must be durable before it is answered (a deletion's journal) and the discovery
heartbeat are the HTTP routes' (``federation.controller.http.routes_registry``).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sharder.kernel.errors import InventoryError, SpecError, clip, preview
from sharder.live.offers import EndpointOwned, Refusal, RegionCapped
from sharder.live.reconcile import Reconciler
from sharder.model.addresses import normalise_identity
from sharder.model.endpoints import EndpointIndex, endpoint_of, show
from sharder.model.inventory import Target
from sharder.model.loading import parse_target
from sharder.model.spec import JobSpec

SOURCE = "registry"
MAX_ERRORS = 100
"""A batch names at most this many bad entries (the count says how many there were)."""


class IdentityMismatch(InventoryError):
    pass


class EndpointTaken(InventoryError):
    """Another identity already serves this endpoint (409): one endpoint, one target."""


class RegistryFull(InventoryError):
    """The registry holds ``max_entries`` already (``--registry-max-entries``); HTTP 429."""


class RegionFull(RegistryFull):
    """New nodes would grow a sized region past its shard cap; HTTP 429 like a full registry."""


class BatchInvalid(InventoryError):
    """A batch with bad entries; ``errors`` names each (index, identity, field, value, message)."""

    def __init__(self, errors: list[dict[str, Any]], *, total: int) -> None:
        self.errors = errors[:MAX_ERRORS]
        self.total = total
        first = errors[0]
        super().__init__(
            f"{total} of the batch's entries are invalid; nothing was applied "
            f"(first: {first['section']}[{first['index']}]: {first['message']})",
            source=SOURCE,
        )


@dataclass(frozen=True)
class Entry:
    target: Target
    expires_at: float


@dataclass(frozen=True)
class BatchResult:
    put: int
    created: int
    deleted: int


@dataclass(frozen=True)
class Batch:
    """A batch validated and checked (:meth:`BuiltinRegistry.check_batch`), to apply next
    (:meth:`BuiltinRegistry.apply_batch`); ``deleting`` is what to journal in between."""

    targets: tuple[Target, ...]
    gone: tuple[str, ...]
    """Identities to delete, normalised."""
    deleting: tuple[str, ...]
    """Those of ``gone`` registered when it was checked: what a journal must hold first."""


class BuiltinRegistry:
    name = SOURCE

    def __init__(
        self,
        *,
        loop: Reconciler,
        jobs: Mapping[str, JobSpec],
        ttl_s: float = 90.0,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 2_000_000,
        regions: Collection[str] = (),
    ) -> None:
        self._loop = loop
        self._endpoints = EndpointIndex(jobs)
        self._jobs = jobs
        self._regions = frozenset(regions)
        """Empty: any region (a registry built without a spec, in tests)."""
        self.ttl_s = ttl_s
        self._clock = clock
        self.max_entries = max_entries
        self._entries: dict[str, Entry] = {}
        """identity -> entry, in the order they expire (a refresh moves its entry to the
        end; the TTL is one for all and the clock monotonic), so ``expire`` reads the front."""
        self.members = 0
        """Bumped when an identity comes or goes (what the sorted listing is cached on)."""
        self.revision = 0
        """Bumped when an entry's target changes too (the listing's ETag)."""
        self._listing: tuple[int, list[str]] = (-1, [])
        self._lock = threading.Lock()
        """Held over the loop's ``offer``: a change is stored here exactly when the loop took it."""

    def seed(self, targets: Iterable[Target]) -> None:
        """Entries persisted before a restart, each with a fresh TTL (their exporters re-PUT).
        Nothing is pushed: the caller hands the stored sets to the loop itself."""
        expires = self._clock() + self.ttl_s
        with self._lock:
            for target in targets:
                if target.identity not in self._entries and self._endpoints.add(target) is None:
                    self._entries[target.identity] = Entry(target, expires)
                    self._member_changed()

    def put(self, identity: str, body: Any) -> tuple[Target, bool]:
        """Validate and (re)register; (target, created). Raises ``InventoryError`` naming the field."""
        target = self._admit(parse_target(body, source=SOURCE, jobs=self._jobs, strict_numbers=True))
        identity = normalise_identity(identity)
        if target.identity != identity:
            raise IdentityMismatch(
                f"the path names identity {identity!r} but the body's target is {target.identity!r} "
                "(set 'identity' in the body, or use host:port in the path)",
                field="identity",
                value=identity,
                source=SOURCE,
            )
        with self._lock:
            created = identity not in self._entries
            if created and len(self._entries) >= self.max_entries:
                raise self._full()
            other = self._endpoints.owner(endpoint_of(target, self._jobs))
            if other is not None and other != identity:
                raise _taken(target, other, SOURCE, self._jobs)
            self._offer([target], [])
            self._store(target)
        return target, created

    def check_batch(self, puts: Sequence[Any], deletes: Sequence[Any]) -> Batch:
        """Validate every entry of a batch and check it fits (``BatchInvalid`` names each bad
        one; ``RegistryFull``, ``EndpointTaken``); nothing is applied yet."""
        targets, errors = self._validate(puts, deletes)
        if errors:
            raise BatchInvalid(errors, total=len(errors))
        gone = tuple(normalise_identity(str(d)) for d in deletes)
        with self._lock:
            self._check_room(targets, gone)
            self._check_endpoints(targets, gone)
            deleting = tuple(i for i in gone if i in self._entries)
        return Batch(targets=tuple(targets), gone=gone, deleting=deleting)

    def apply_batch(self, batch: Batch) -> BatchResult:
        """Apply a checked batch, all or nothing: checked again (a PUT may have taken an
        endpoint or the room since), offered to the loop, then stored."""
        targets, gone = batch.targets, batch.gone
        with self._lock:
            fresh = self._check_room(targets, gone)
            self._check_endpoints(targets, gone)
            leaving = [i for i in dict.fromkeys(gone) if i in self._entries]
            self._offer(targets, leaving)
            for identity in leaving:  # first: a put may re-use a deleted entry's endpoint
                self._forget(identity)
            for target in targets:
                self._store(target)
        return BatchResult(put=len(targets), created=len(fresh), deleted=len(leaving))

    def registered(self, identities: Iterable[str]) -> list[str]:
        """Those of ``identities`` registered now, normalised (what a deletion journals)."""
        wanted = [normalise_identity(i) for i in identities]
        with self._lock:
            return [i for i in dict.fromkeys(wanted) if i in self._entries]

    def delete(self, identity: str) -> bool:
        """Forget ``identity`` (the caller journalled it first, when it must be durable)."""
        identity = normalise_identity(identity)
        with self._lock:
            found = identity in self._entries
            if found:
                self._offer([], [identity])
                self._forget(identity)
        return found

    def entries(self) -> list[tuple[Target, float]]:
        """(target, seconds until it expires), by identity."""
        now = self._clock()
        with self._lock:
            return [(e.target, max(0.0, e.expires_at - now)) for _, e in sorted(self._entries.items())]

    def page(
        self, *, offset: int, limit: int, after: str | None = None
    ) -> tuple[int, list[tuple[Target, float]]]:
        """(entries in all, one page of (target, seconds until it expires) by identity): the
        identities are sorted once per membership change, then sliced, so a page costs its rows.
        ``after``: start strictly after this identity instead of at ``offset`` (a cursor)."""
        now = self._clock()
        with self._lock:
            members, keys = self._listing
            if members != self.members:
                keys = sorted(self._entries)
                self._listing = (self.members, keys)
            start = offset if after is None else bisect.bisect_right(keys, after)
            page = [self._entries[i] for i in keys[start : start + limit]]
            return len(keys), [(e.target, max(0.0, e.expires_at - now)) for e in page]

    def targets(self) -> list[Target]:
        with self._lock:
            return [e.target for e in self._entries.values()]

    def expire(self) -> int:
        """Drop entries past their TTL; how many went. Reads the entries from the front (the
        first to expire) and stops at the first one alive: it costs what expires."""
        now = self._clock()
        with self._lock:
            gone: list[str] = []
            for identity, entry in self._entries.items():
                if entry.expires_at > now:
                    break
                gone.append(identity)
            if gone:
                self._offer([], gone)
                for identity in gone:
                    self._forget(identity)
        return len(gone)

    # ---- internals -------------------------------------------------------------------------
    def _check_room(self, targets: Sequence[Target], gone: Sequence[str]) -> set[str]:
        """The identities ``targets`` would add (lock held); ``RegistryFull`` when over the cap."""
        fresh = {t.identity for t in targets} - self._entries.keys()
        leaving = sum(1 for d in gone if d in self._entries)
        if len(self._entries) + len(fresh) - leaving > self.max_entries:
            raise self._full()
        return fresh

    def _admit(self, target: Target) -> Target:
        """Refuse what the render could not place: a job the spec does not define (it would
        stop every config bundle) or a region without shards (it would never be scraped)."""
        if target.job not in self._jobs:
            raise InventoryError(
                f"job {target.job!r} is not defined by the spec (jobs: {sorted(self._jobs)})",
                field="job",
                value=target.job,
                source=SOURCE,
            )
        if self._regions and target.region not in self._regions:
            raise InventoryError(
                f"region {target.region!r} is not defined by the spec (regions: {sorted(self._regions)})",
                field="region",
                value=target.region,
                source=SOURCE,
            )
        return target

    def _offer(self, targets: Sequence[Target], gone: Sequence[str]) -> None:
        """Offer a change to the loop (lock held): checked and applied there, or refused
        with nothing applied (raised as this module's error)."""
        refusal = self._loop.offer(SOURCE, upserted=targets, removed=gone)
        if refusal is not None:
            raise self._refused(refusal)

    def _refused(self, refusal: Refusal) -> InventoryError:
        if isinstance(refusal, EndpointOwned):
            return _taken(refusal.target, refusal.identity, refusal.source, self._jobs)
        if isinstance(refusal, RegionCapped):
            return RegionFull(refusal.reason, field="region", value=refusal.region, source=SOURCE)
        return InventoryError(refusal.reason, source=SOURCE)

    def _store(self, target: Target) -> bool:
        """Store with a fresh TTL, last in expiry order (lock held); True when the target
        itself changed."""
        identity = target.identity
        old = self._entries.pop(identity, None)
        changed = old is None or old.target != target
        if changed:
            self._endpoints.add(target)  # callers checked the endpoint is free
        self._entries[identity] = Entry(
            old.target if old and not changed else target, self._clock() + self.ttl_s
        )
        if changed:
            self.revision += 1
            if old is None:
                self.members += 1
        return changed

    def _forget(self, identity: str) -> None:
        """Remove a registered entry (lock held)."""
        del self._entries[identity]
        self._endpoints.discard(identity)
        self._member_changed()

    def _member_changed(self) -> None:
        self.members += 1
        self.revision += 1

    def _validate(
        self, puts: Sequence[Any], deletes: Sequence[Any]
    ) -> tuple[list[Target], list[dict[str, Any]]]:
        targets: list[Target] = []
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        freed = {normalise_identity(d) for d in deletes if isinstance(d, str)}
        batch_endpoints: dict[Any, str] = {}
        for index, raw in enumerate(puts):
            named = raw.get("identity") if isinstance(raw, dict) else None
            try:
                target = self._admit(parse_target(raw, source=SOURCE, jobs=self._jobs, strict_numbers=True))
            except SpecError as exc:
                errors.append(_error("put", index, named, exc.field or "body", exc.value, exc.reason))
                continue
            if target.identity in seen:
                errors.append(
                    _error("put", index, target.identity, "identity", target.identity, "listed twice")
                )
                continue
            other = self._endpoint_taken(target, batch_endpoints, freed)
            if other is not None:
                errors.append(_error("put", index, target.identity, "address", target.instance, other))
                continue
            seen.add(target.identity)
            targets.append(target)
        for index, identity in enumerate(deletes):
            if not isinstance(identity, str) or not identity:
                errors.append(
                    _error("delete", index, None, "delete", identity, "expected an identity string")
                )
            elif normalise_identity(identity) in seen:  # 10.0.0.1:9400 is [::ffff:a00:1]:9400 too
                errors.append(
                    _error("delete", index, identity, "delete", identity, "both put and deleted in one batch")
                )
        return targets, errors

    def _check_endpoints(self, targets: Sequence[Target], gone: Sequence[str]) -> None:
        for target in targets:
            other = self._endpoints.owner(endpoint_of(target, self._jobs))
            if other is not None and other != target.identity and other not in gone:
                raise _taken(target, other, SOURCE, self._jobs)

    def _endpoint_taken(self, target: Target, batch: dict[Any, str], freed: set[str]) -> str | None:
        """Why a batch entry's endpoint is taken (in the batch, the registry, another source), or None."""
        endpoint = endpoint_of(target, self._jobs)
        other = batch.setdefault(endpoint, target.identity)
        if other != target.identity:
            return str(_taken(target, other, "this batch", self._jobs).reason)
        with self._lock:
            held = self._endpoints.owner(endpoint)
        if held is not None and held != target.identity and held not in freed:
            return str(_taken(target, held, SOURCE, self._jobs).reason)
        found = self._loop.endpoint_owner(target, excluding=SOURCE)
        if found is not None:
            return str(_taken(target, found[1], found[0], self._jobs).reason)
        return None

    def _full(self) -> RegistryFull:
        return RegistryFull(
            f"the built-in registry holds its maximum of {self.max_entries} targets "
            "(--registry-max-entries); deregister some or raise the limit",
            source=SOURCE,
        )


def _taken(target: Target, other: str, where: str, jobs: Mapping[str, JobSpec]) -> EndpointTaken:
    return EndpointTaken(
        f"endpoint {show(endpoint_of(target, jobs))} is already served by identity {other!r} ({where});"
        " one endpoint is one target",
        field="address",
        value=target.instance,
        source=SOURCE,
    )


def _error(section: str, index: int, identity: Any, field_: str, value: Any, message: str) -> dict[str, Any]:
    return {
        "section": section,
        "index": index,
        "identity": clip(identity) if isinstance(identity, str) else None,
        "field": clip(field_),
        "value": preview(value) if value is not None else None,
        "message": clip(message, limit=240),
    }
