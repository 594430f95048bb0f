"""The shared state store in the Kubernetes API: ConfigMaps, so replicas need no Consul.

Same contract as ``sqlite_store`` and ``consul_store``
(:class:`~federation.controller.stores.store.StateStore`): every ``save`` is check-and-set,
a lost race raises ``StoreConflict`` and never overwrites, a write carrying a fencing
token older than the newest one recorded raises ``FencedOut``. The one module of
``federation`` besides ``lease`` that imports ``kubernetes`` (``.importlinter``).

Layout in the namespace, for the prefix ``P`` (``--store-prefix``, default ``gpufed-state``)::

    P                      head: data.head = {"format", "revision", "fence", "buckets",
                           "parts": {name: {digest, raw, size, objects}}, "previous", "audit"}
    P-<gen>-<digest12>-<i> one piece of one part (binaryData.data, zlib; ``kube_parts``)
    P-sets                 head of the discovery sources' last known sets (same shape)
    P-audit-<page>         16 audit entries per ConfigMap (data: "<id:012d>" -> JSON)
    P-fetched-<replica>    when each replica last served each shard's SD
    P-revision             the revision last committed (``store_guard``: a head put back
                           older than it is refused after a restart)

All carry the labels ``app.kubernetes.io/managed-by: gpufed`` and ``gpufed.io/store: P``.

**Commit.** A save writes the pieces of the parts whose content changed, then replaces
the head with the ``resourceVersion`` it read: the head is the commit point, and the API
server's optimistic lock answers 409 to a writer that read an older head. Unchanged parts
keep their objects, so moving ten targets of a million writes the core part, a bucket or
two and the head. Objects the head before last referenced and the new head does not are
deleted after the commit (a reader holding the previous head still finds its pieces; an
older reader re-reads the head, and the digest check catches anything torn).

**Fencing.** ``fence`` is the Lease's ``leaseTransitions`` (``lease.py``). The head keeps
the newest token any write carried; an older one is refused, and a deposed leader whose
write was in flight when the new leader recorded its token loses the optimistic lock.

**Audit.** A save's entry rides in the head (state and entry commit together) and is
copied into its page right after, or by the next save if that copy failed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.stores import kube_parts, setbuckets, store_guard
from federation.controller.stores.kube_objects import FORMAT, ConfigMaps, Head
from federation.controller.stores.kube_sets import KubeSets
from federation.controller.stores.store import (
    Changed,
    Commit,
    StoreConflict,
    StoreError,
    apply_in_order,
    audit_document,
    check_fence,
    check_head,
    newest_audit,
)
from sharder.model.inventory import Target

log = logging.getLogger(__name__)
AUDIT_PAGE = 16
"""Audit entries per page object (each at most ``store.MAX_AUDIT_BYTES``: under 1 MiB)."""


@dataclass
class Written:
    """What this store last committed, so a save with the ``changed`` hint cuts only the
    buckets of the changed identities (the rest of the head's parts stay as they are)."""

    revision: int
    buckets: int
    targets: Mapping[str, str]
    """The committed assignment's ``targets`` dict itself (compared by identity, as SQLite does)."""
    members: kube_parts.Members


class KubeStore:
    def __init__(
        self,
        api: CoreV1Api,
        *,
        namespace: str,
        prefix: str = "gpufed-state",
        audit_keep: int = 1000,
        piece_bytes: int = kube_parts.PIECE_BYTES,
        init: bool = False,
    ) -> None:
        """``init`` (``--init``): a missing head with leftovers starts empty (and the leftovers
        go) instead of being refused (``store_guard``)."""
        self.maps = ConfigMaps(api, namespace=namespace, prefix=prefix, piece_bytes=piece_bytes)
        self.init = init
        self._watch = store_guard.RevisionWatch()
        self._collected = False
        self.marker = f"{prefix}-revision"
        self._marker_checked = False
        """Whether this process compared the head with the revision marker (its first read)."""
        self.prefix, self.audit_keep, self.where = prefix, audit_keep, self.maps.where
        self._lock = threading.RLock()
        self._loaded: tuple[str, ControllerState] | None = None  # (head resourceVersion, state)
        self._written: Written | None = None
        self._cores = kube_parts.CoreParts()
        self.sets = KubeSets(
            self.maps, name=f"{prefix}-sets", state=prefix, lock=self._lock, state_seen=self._seen
        )
        """The discovery sources' last known sets (``kube_sets``)."""

    @property
    def sets_name(self) -> str:
        return self.sets.name

    def _seen(self) -> int:
        return self._watch.highest

    # ---- StateStore --------------------------------------------------------------------------------
    def load(self) -> ControllerState | None:
        with self._lock:
            recorded = None if self._marker_checked else self._read_marker()  # before the head
            head, parts = self.maps.load_parts(self.prefix)
            if head is None and self._without_head():  # a first commit landed meanwhile
                head, parts = self.maps.load_parts(self.prefix)
            if head is None:
                return None
            self._check_marker(head, recorded)
            self._watch.saw(head.revision, where=self.where)
            if not self._collected:
                self._collected = True
                self._collect_orphans(head)
            if self._loaded is not None and self._loaded[0] == head.version:
                return self._loaded[1]
            try:
                state = ControllerState.model_validate(kube_parts.join_state(parts))
            except (ValueError, kube_parts.PartError) as exc:
                one_line = " ".join(str(exc).split())[:300]  # pydantic's message spans lines
                raise StoreError(f"state in {self.where} does not validate: {one_line}") from exc
            if state.revision != head.revision:
                raise StoreError(
                    f"state in {self.where}: parts hold revision {state.revision}, "
                    f"the head says {head.revision}"
                )
            self._loaded = (head.version, state)
            return state

    def apply(self, commit: Commit, *, fence: int | None) -> ControllerState | None:
        return apply_in_order(self, commit, fence=fence)

    def save(
        self,
        state: ControllerState,
        *,
        expected_revision: int | None,
        audit: AuditEntry | None = None,
        fence: int | None = None,
        changed: Changed | None = None,
    ) -> ControllerState:
        with self._lock:
            marked = None if self._marker_checked else self._read_marker()  # before the head
            head = self.maps.head(self.prefix)
            if head is not None:
                self._check_marker(head, marked)
            found = head.revision if head is not None else None
            recorded = head.doc.get("fence") if head is not None else None
            check_head(fence, recorded, expected=expected_revision, found=found)
            self._flush_audit(head)
            revision = (found or 0) + 1
            stored = state.model_copy(update={"revision": revision})
            targets = len(stored.assignment.targets) if stored.assignment is not None else 0
            current = head.doc.get("buckets") if head is not None else None
            buckets = kube_parts.bucket_count(targets, current=current if isinstance(current, int) else None)
            delta = self._delta(stored, head=head, changed=changed, buckets=buckets)
            if delta is None:
                placed = stored.assignment
                identities = None if placed is None else {**placed.weights, **placed.targets}.keys()
                raw, members = kube_parts.split_state(
                    stored.model_dump(mode="json"), buckets=buckets, identities=identities
                )
            else:
                raw, members = delta
            created: list[str] = []
            newest = max(x for x in (fence, recorded, -1) if isinstance(x, int))
            try:
                written = self.maps.write_parts(raw, head=head, generation=revision, created=created)
            except StoreError:  # the head was not touched: what this save wrote is nobody's
                for name in created:
                    self.maps.delete(name)
                raise
            doc = {
                "format": FORMAT,
                "revision": revision,
                "fence": None if newest < 0 else newest,
                "buckets": buckets,
                "parts": {**(head.parts if delta is not None and head is not None else {}), **written},
                "previous": sorted(head.objects()) if head is not None else [],
                "audit": None if audit is None else audit_document(audit),
            }
            try:
                self.maps.commit(self.prefix, doc, head=head, role="head")
            except ApiException as exc:  # 409: another writer committed since we read
                for name in created:
                    self.maps.delete(name)
                now = self.maps.head(self.prefix)
                check_fence(fence, now.doc.get("fence") if now is not None else None)
                found_now = now.revision if now is not None else -1
                raise StoreConflict(expected=expected_revision, found=found_now) from exc
            # (a StoreError from the commit propagates and deletes nothing: a timed-out
            # write may have landed, and its pieces are then the state)
            self.maps.collect(head, doc)
            self._watch.saw(revision, where=self.where)
            self._write_marker(revision)
            if stored.assignment is not None:
                self._written = Written(revision, buckets, stored.assignment.targets, members)
            if audit is not None:
                try:
                    self._flush_audit(Head(doc=doc, version=""))
                except StoreError as exc:  # committed in the head; the next save copies it
                    log.warning("%s", exc)
            return stored

    def _delta(
        self, stored: ControllerState, *, head: Head | None, changed: Changed | None, buckets: int
    ) -> tuple[dict[str, bytes], kube_parts.Members] | None:
        """The core and the buckets of ``changed``'s identities, when the rest is what this
        store last wrote (``changed``'s base is the assignment of the head it reads); else None."""
        written, self._written = self._written, None  # updated in place: valid again on commit
        if changed is None or written is None or head is None or stored.assignment is None:
            return None
        base, identities = changed
        if (
            written.revision != head.revision
            or written.buckets != buckets
            or base.targets is not written.targets
        ):
            return None
        new = stored.assignment
        touched: set[int] = set()
        for identity in identities:
            bucket = kube_parts.bucket_of(identity, buckets)
            touched.add(bucket)
            if identity in new.targets or identity in new.weights:
                kube_parts.add_member(written.members[bucket], identity)
            else:
                kube_parts.drop_member(written.members[bucket], identity)
        raw = {"core": self._cores.core(stored)}
        for bucket in sorted(touched):
            raw[f"targets-{bucket}"] = kube_parts.bucket_part(
                new.targets, new.weights, written.members[bucket]
            )
        return raw, written.members

    # ---- strictness on read (``store_guard``) -------------------------------------------------
    def _read_marker(self) -> int | None:
        found = self.maps.get(self.marker)
        text = (found.data or {}).get("marker") if found is not None else None
        return store_guard.marker_revision(text, where=self.where, name=self.marker)

    def _write_marker(self, revision: int) -> None:
        """Record a commit's revision (one replace; a create the first time). A failure is
        logged: a marker behind the head is harmless, the next commit moves it on."""
        body = self.maps.body(self.marker, "marker", data={"marker": store_guard.marker_text(revision)})
        try:
            try:
                self.maps.write(body, create=False)
            except StoreError:  # 404: the first commit
                self.maps.write(body, create=True)
        except (StoreError, ApiException) as exc:
            log.warning("state store %s: recording revision %d failed: %s", self.where, revision, exc)

    def _check_marker(self, head: Head, recorded: int | None) -> None:
        """A new process's first head against the marker (read before it): older is refused."""
        if self._marker_checked:
            return
        if recorded is not None and head.revision < recorded:
            if not self.init:
                raise store_guard.rolled_back(self.where, self.prefix, head.revision, self.marker, recorded)
            log.warning(
                "state store %s: --init accepts %s at revision %d below the marker's %d",
                self.where, self.prefix, head.revision, recorded,
            )  # fmt: skip
            self._write_marker(head.revision)
        self._marker_checked = True

    def _without_head(self) -> bool:
        """No head: a first start, or a deleted state (refused unless ``--init``). Leftovers
        are audit pages and pieces the sets' head does not reference, of a generation past
        the first (a first save's pieces may be in flight before its head). True when the
        head is there after all: a first commit (and its audit page) landed between the
        read of the head and the listing, as a follower starting beside a new leader sees."""
        sets = self.maps.head(self.sets_name)
        keep = set() if sets is None else sets.objects() | {str(n) for n in sets.doc.get("previous", [])}
        unreferenced = [n for n in self.maps.list_names("piece") if n not in keep]
        leftovers = self.maps.list_names("audit") + [
            n for n in unreferenced if (_generation(self.prefix, n) or 0) > 1
        ]
        if self.maps.get(self.marker) is not None:
            leftovers.append(self.marker)
        seen = sets.doc.get("state") if sets is not None else None
        lone = seen if type(seen) is int and seen > 0 else 0  # the state revision it was written at
        if lone:  # the sets were written after a state was: that state is gone
            leftovers.append(store_guard.lone_sets(self.sets_name, lone))
        if not leftovers:
            return False
        if self.maps.head(self.prefix) is not None:
            return True
        if not self.init:
            raise store_guard.missing_head(self.where, self.prefix, leftovers)
        gone = sorted((set(leftovers) | set(unreferenced)) - {n for n in leftovers if " " in n})
        if lone and sets is not None:
            gone = sorted(set(gone) | set(self.maps.list_names("piece")) | {self.sets_name})
        log.warning("state store %s: --init removes %d objects of a lost state", self.where, len(gone))
        for name in gone:
            self.maps.delete(name)
        return False

    def _collect_orphans(self, head: Head) -> None:
        """Delete pieces no head references that no writer can still commit: a writer's pieces
        carry the generation after the head it read, so an unreferenced piece of a generation
        both heads have passed belongs to a writer that died or lost the race."""
        sets = self.maps.head(self.sets_name)
        keep = head.objects() | {str(n) for n in head.doc.get("previous", [])}
        if sets is not None:
            keep |= sets.objects() | {str(n) for n in sets.doc.get("previous", [])}
        passed = min(head.revision, sets.revision if sets is not None else head.revision)
        stale = [
            name
            for name in self.maps.list_names("piece")
            if name not in keep
            and (generation := _generation(self.prefix, name)) is not None
            and generation <= passed
        ]
        for name in stale:
            self.maps.delete(name)
        if stale:
            log.info("state store %s: collected %d orphaned pieces", self.where, len(stale))

    # ---- audit ------------------------------------------------------------------------------------
    def _page_name(self, page: int) -> str:
        return f"{self.prefix}-audit-{page}"

    def _flush_audit(self, head: Head | None) -> None:
        """Copy the audit entry a head carries into its page (idempotent)."""
        entry = head.doc.get("audit") if head is not None else None
        if head is None or not isinstance(entry, dict):
            return
        key, page = f"{head.revision:012d}", head.revision // AUDIT_PAGE
        for _ in range(3):
            found = self.maps.get(self._page_name(page))
            data = dict(found.data or {}) if found is not None else {}
            if key in data:
                return
            data[key] = json.dumps(entry, sort_keys=True)
            version = found.metadata.resource_version if found is not None and found.metadata else None
            try:
                self.maps.write(
                    self.maps.body(self._page_name(page), "audit", data=data, version=version),
                    create=found is None,
                )
            except ApiException:  # 409: the page changed under us; read it again
                continue
            if found is None:  # a new page: the pages beyond audit_keep go (a few, each time)
                cutoff = page - self.audit_keep // AUDIT_PAGE - 1
                for old in range(max(0, cutoff - 3), max(0, cutoff)):
                    self.maps.delete(self._page_name(old))
            return
        raise StoreError(f"state store {self.where}: audit page {page} kept changing")

    def audit_log(self, *, limit: int = 100, before_id: int | None = None) -> list[AuditEntry]:
        with self._lock:
            head = self.maps.head(self.prefix)
            if head is None:
                return []
            found: dict[int, Any] = {}
            if isinstance(head.doc.get("audit"), dict):  # committed, maybe not copied yet
                found[head.revision] = head.doc["audit"]
            top = min(head.revision, (before_id or head.revision + 1) - 1)
            lowest = max(0, (head.revision - self.audit_keep) // AUDIT_PAGE)
            page = top // AUDIT_PAGE
            while page >= lowest and sum(1 for i in found if i <= top) < limit:
                cm = self.maps.get(self._page_name(page))
                for key, value in ((cm.data or {}) if cm is not None else {}).items():
                    try:
                        found[int(key)] = json.loads(value)
                    except ValueError as exc:
                        log.warning("skipping unreadable audit entry %s: %s", key, exc)
                page -= 1
        return newest_audit(found, limit=limit, top=top)

    # ---- last known sets ------------------------------------------------------------------------
    def save_sets(self, sets: Mapping[str, Sequence[Target]], *, fence: int | None = None) -> None:
        self.sets.save_sets(sets, fence=fence)

    def save_set_changes(self, changes: setbuckets.Changes, *, fence: int | None = None) -> None:
        self.sets.save_set_changes(changes, fence=fence)

    def load_sets(self) -> dict[str, list[Target]]:
        return self.sets.load_sets()

    # ---- SD fetches seen by each replica (hand-over proof needs them all) ------------------------
    def note_fetches(self, replica: str, fetched: Mapping[str, float]) -> None:
        """When this replica last served each shard's SD (one small ConfigMap per replica)."""
        name = f"{self.prefix}-fetched-{_dns_label(replica)}"
        data = {"replica": replica, "fetched": json.dumps(dict(sorted(fetched.items())))}
        try:
            self.maps.write(self.maps.body(name, "fetched", data=data), create=False)
        except StoreError:  # 404 on the first note: create it
            with contextlib.suppress(ApiException):  # 409: created meanwhile; the next note replaces it
                self.maps.write(self.maps.body(name, "fetched", data=data), create=True)

    def fetches(self, *, forget_after_s: float = 86400.0) -> dict[str, float]:
        """shard -> the newest fetch any replica saw; replicas silent for a day are forgotten."""
        newest: dict[str, float] = {}
        for name, data in self.maps.list_data("fetched").items():
            try:
                seen = {str(k): float(v) for k, v in json.loads(data.get("fetched", "{}")).items()}
            except (ValueError, AttributeError):
                continue
            for shard, at in seen.items():
                newest[shard] = max(at, newest.get(shard, at))
            if seen and max(seen.values()) < time.time() - forget_after_s:
                self.maps.delete(name)
        return newest

    def close(self) -> None:
        self.maps.api.api_client.close()


def _dns_label(text: str) -> str:
    """A replica id as part of an object name: lowercase, [-a-z0-9], at most 63 characters."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40] or "replica"
    return f"{label}-{zlib.crc32(text.encode()):08x}"


def _generation(prefix: str, name: str) -> int | None:
    """The generation in a piece's name ``<prefix>-<gen>-<digest12>-<i>``, or None."""
    rest = name.removeprefix(f"{prefix}-")
    generation, _, tail = rest.partition("-")
    return int(generation) if rest != name and generation.isdigit() and tail else None
