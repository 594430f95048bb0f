"""The built-in registry: exporters register with the controller itself (no Consul, no Kubernetes).

``PUT /v1/registry/targets/{identity}`` lands in :meth:`BuiltinRegistry.put` and
``POST /v1/registry/batch`` in :meth:`BuiltinRegistry.batch`, with the same validation as
an inventory file entry (``sharder.model.loading.parse_target``). An entry lives ``ttl_s`` after
its last PUT, so an exporter that dies without deregistering goes the way a failing Consul
check would (then the reconcile loop's grace period applies).

It is one discovery source named ``registry``, but unlike the polling sources it knows
exactly what changed: it pushes deltas (:meth:`DeltaSink.on_delta`), so one registration
among a million costs one entry's work downstream. A PUT equal to the stored entry only
extends its TTL and pushes nothing (the cheap refresh exporters do every ``ttl_s / 3``).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sharder.kernel.errors import InventoryError, SpecError, clip, preview
from sharder.model.addresses import normalise_identity
from sharder.model.endpoints import EndpointIndex, endpoint_of, show
from sharder.model.inventory import Target
from sharder.model.loading import parse_target
from sharder.model.spec import JobSpec

SOURCE = "registry"
MAX_ERRORS = 100
"""A batch names at most this many bad entries (the count says how many there were)."""


class DeltaSink(Protocol):
    """Where the registry pushes; ``sharder.live.reconcile.Reconciler`` implements it."""

    def on_change(self, source: str, targets: Iterable[Target], *, version: str | None = None) -> None: ...

    def on_delta(self, source: str, *, upserted: Sequence[Target], removed: Sequence[str]) -> None: ...

    def on_error(self, source: str, reason: str) -> None: ...


class IdentityMismatch(InventoryError):
    pass


class EndpointTaken(InventoryError):
    """Another identity already serves this endpoint (409): one endpoint, one target."""


EndpointOwner = Callable[[Target], "tuple[str, str] | None"]
"""(source, identity) serving a target's endpoint in another source (the reconcile loop knows)."""


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


@dataclass
class _Pending:
    """Changes not yet pushed: identity -> target (put) or None (deleted)."""

    changes: dict[str, Target | None] = field(default_factory=dict)


Journal = Callable[[Mapping[str, Target | None]], None]
"""Writes identity -> None (deleted) to the state store before a deletion is acknowledged."""


class BuiltinRegistry:
    name = SOURCE

    def __init__(
        self,
        *,
        sink: DeltaSink,
        jobs: Mapping[str, JobSpec],
        ttl_s: float = 90.0,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 2_000_000,
        endpoint_owner: EndpointOwner | None = None,
        regions: Collection[str] = (),
        journal: Journal | None = None,
        region_room: Callable[[str, set[str]], str | None] | None = None,
        on_accepted: Callable[[], None] | None = None,
    ) -> None:
        self._sink = sink
        # Every accepted write (a change or a plain TTL refresh): the registry is being fed.
        # Discovery health reads this, not the last change: a stable fleet refreshes
        # without changing anything, and is healthy.
        self._on_accepted = on_accepted
        self._endpoint_owner = endpoint_owner
        self._endpoints = EndpointIndex(jobs)
        self._jobs = jobs
        self._regions = frozenset(regions)
        """Empty: any region (a registry built without a spec, in tests)."""
        self._journal = journal
        self._region_room = region_room
        """(region, nodes) -> why those nodes may not join it (a sized region at its shard cap)."""
        self.ttl_s = ttl_s
        self._clock = clock
        self.max_entries = max_entries
        self._entries: dict[str, Entry] = {}
        self.members = 0
        """Bumped when an identity comes or goes (what the sorted listing is cached on)."""
        self.revision = 0
        """Bumped when an entry's target changes too (the listing's ETag)."""
        self._listing: tuple[int, list[str]] = (-1, [])
        self._lock = threading.Lock()
        self._push_lock = threading.Lock()  # keeps pushes in the order of their changes
        self._pending = _Pending()
        self._dirty = threading.Event()
        self._running = False

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
        self._check_elsewhere(target)
        self._check_regions([target])
        with self._lock:
            created = identity not in self._entries
            if created and len(self._entries) >= self.max_entries:
                raise self._full()
            other = self._endpoints.owner(endpoint_of(target, self._jobs))
            if other is not None and other != identity:
                raise _taken(target, other, SOURCE, self._jobs)
            changed = self._store(target)
        if changed:
            self._push()
        self._accepted()
        return target, created

    def batch(self, puts: Sequence[Any], deletes: Sequence[Any]) -> BatchResult:
        """Validate every entry first; apply all or nothing (``BatchInvalid`` names each bad one)."""
        targets, errors = self._validate(puts, deletes)
        if errors:
            raise BatchInvalid(errors, total=len(errors))
        gone = [normalise_identity(str(d)) for d in deletes]
        self._check_regions(targets)
        with self._lock:
            self._check_room(targets, gone)
            self._check_endpoints(targets, gone)
        self._write_deletions(gone)
        with self._lock:
            fresh = self._check_room(targets, gone)
            self._check_endpoints(targets, gone)  # a PUT may have taken one since
            deleted = 0
            for identity in gone:  # first: a put may re-use a deleted entry's endpoint
                if self._entries.pop(identity, None) is not None:
                    self._endpoints.discard(identity)
                    self._pending.changes[identity] = None
                    self._member_changed()
                    deleted += 1
            changed = sum(self._store(t) for t in targets)
        if changed or deleted:
            self._push()
        self._accepted()
        return BatchResult(put=len(targets), created=len(fresh), deleted=deleted)

    def delete(self, identity: str) -> bool:
        """Forget ``identity``; durable (journalled) before it returns True."""
        identity = normalise_identity(identity)
        self._write_deletions([identity])
        with self._lock:
            found = self._entries.pop(identity, None) is not None
            if found:
                self._member_changed()
                self._endpoints.discard(identity)
                self._pending.changes[identity] = None
        if found:
            self._push()
        self._accepted()
        return found

    def _accepted(self) -> None:
        if self._on_accepted is not None:
            self._on_accepted()

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
        """Drop entries past their TTL; how many went."""
        now = self._clock()
        with self._lock:
            gone = [i for i, e in self._entries.items() if e.expires_at <= now]
            for identity in gone:
                del self._entries[identity]
                self._member_changed()
                self._endpoints.discard(identity)
                self._pending.changes[identity] = None
        if gone:
            self._push()
        return len(gone)

    def poll_once(self) -> int:
        return self.expire()

    def run(self, stop: threading.Event) -> None:
        """Push changes as they come, coalesced, and expire entries every second."""
        self._running = True
        next_expiry = self._clock() + 1.0
        try:
            while not stop.is_set():
                if self._dirty.wait(timeout=max(0.0, min(1.0, next_expiry - self._clock()))):
                    self._dirty.clear()
                    self._send()
                if self._clock() >= next_expiry:
                    next_expiry = self._clock() + 1.0
                    self.expire()
        finally:
            self._running = False
            self._send()

    # ---- internals -------------------------------------------------------------------------
    def _check_room(self, targets: Sequence[Target], gone: Sequence[str]) -> set[str]:
        """The identities ``targets`` would add (lock held); ``RegistryFull`` when over the cap."""
        fresh = {t.identity for t in targets} - self._entries.keys()
        leaving = sum(1 for d in gone if d in self._entries)
        if len(self._entries) + len(fresh) - leaving > self.max_entries:
            raise self._full()
        return fresh

    def _write_deletions(self, identities: Sequence[str]) -> None:
        """Store the deletions first: a restart must not bring back what a caller was told is
        gone (the reconcile loop saves its sets only every few seconds)."""
        if self._journal is None:
            return
        with self._lock:
            known = [i for i in identities if i in self._entries]
        if known:
            self._journal(dict.fromkeys(known))

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

    def _store(self, target: Target) -> bool:
        """Store with a fresh TTL (lock held); True when the target itself changed."""
        identity = target.identity
        old = self._entries.get(identity)
        changed = old is None or old.target != target
        if changed:
            self._endpoints.add(target)  # callers checked the endpoint is free
        self._entries[identity] = Entry(
            old.target if old and not changed else target, self._clock() + self.ttl_s
        )
        if changed:
            self._pending.changes[identity] = target
            self.revision += 1
            if old is None:
                self.members += 1
        return changed

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

    def _check_elsewhere(self, target: Target) -> None:
        if self._endpoint_owner is not None:
            found = self._endpoint_owner(target)
            if found is not None:
                raise _taken(target, found[1], found[0], self._jobs)

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
        try:
            self._check_elsewhere(target)
        except EndpointTaken as exc:
            return str(exc.reason)
        return None

    def _check_regions(self, targets: Sequence[Target]) -> None:
        """``RegionFull`` when new nodes would grow a sized region past its shard cap."""
        if self._region_room is None:
            return
        by_region: dict[str, set[str]] = {}
        for target in targets:
            by_region.setdefault(target.region, set()).add(target.node)
        for region, nodes in sorted(by_region.items()):
            why = self._region_room(region, nodes)
            if why is not None:
                raise RegionFull(why, field="region", value=region, source=SOURCE)

    def _full(self) -> RegistryFull:
        return RegistryFull(
            f"the built-in registry holds its maximum of {self.max_entries} targets "
            "(--registry-max-entries); deregister some or raise the limit",
            source=SOURCE,
        )

    def _push(self) -> None:
        """Something changed: push now, or let the running loop push it (coalescing a burst)."""
        if self._running:
            self._dirty.set()
        else:
            self._send()

    def _send(self) -> None:
        with self._push_lock:
            with self._lock:
                changes, self._pending = self._pending.changes, _Pending()
            if not changes:
                return
            upserted = [t for t in changes.values() if t is not None]
            removed = [i for i, t in changes.items() if t is None]
            self._sink.on_delta(SOURCE, upserted=upserted, removed=removed)


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
