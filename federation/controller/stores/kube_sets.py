"""The Kubernetes store's last known sets: ConfigMap buckets by identity (``setbuckets``).

Part of ``kube_store`` (composed, not inherited): a head ConfigMap ``<prefix>-sets`` names
one part per bucket, each part's pieces in their own objects (``kube_objects.ConfigMaps``),
so a change writes the buckets it touched, then the head (the commit point). Every write
is fenced against the newest token the sets or the state head recorded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from kubernetes.client.exceptions import ApiException

from federation.controller.stores import kube_parts, setbuckets
from federation.controller.stores.kube_objects import FORMAT, ConfigMaps, Head
from federation.controller.stores.store import StoreConflict, StoreError, check_fence
from sharder.model.inventory import Target
from sharder.sources.lastknown import parse_entries

log = logging.getLogger(__name__)


class KubeSets:
    def __init__(
        self,
        maps: ConfigMaps,
        *,
        name: str,
        state: str,
        lock: threading.RLock,
        state_seen: Callable[[], int] = lambda: 0,
    ) -> None:
        self.maps, self.name, self.state, self._lock = maps, name, state, lock
        self.state_seen = state_seen
        """The newest state revision this replica saw, recorded in the head as ``state``: a
        sets head left alone after a state was committed is a leftover (``store_guard``)."""
        self.where = maps.where
        self._sets: tuple[str, dict[str, list[Target]]] | None = None
        self._mirror: setbuckets.SetBuckets | None = None
        """The sets as this store wrote them last (``save_set_changes`` writes the buckets it changes)."""

    def save_sets(self, sets: Mapping[str, Sequence[Target]], *, fence: int | None = None) -> None:
        with self._lock:
            head = self.maps.head(self.name)
            self._check_sets_fence(fence, head)
            current = head.doc.get("buckets") if head is not None else None
            counted = current if isinstance(current, int) else None
            mirror = setbuckets.SetBuckets.from_sets(sets, current=counted)
            self._write_sets(head, mirror, dirty=None, fence=fence)

    def save_set_changes(self, changes: setbuckets.Changes, *, fence: int | None = None) -> None:
        """Only the buckets holding what changed (source -> identity -> target, None: gone):
        the cost of the change, fenced like the state."""
        with self._lock:
            head = self.maps.head(self.name)
            self._check_sets_fence(fence, head)
            mirror = self._mirror
            stored = head.revision if head is not None else 0
            if mirror is None or mirror.version != stored or not mirror.fits(changes):
                mirror = self._mirror_of(head, changes)
                self._write_sets(head, mirror, dirty=None, fence=fence)
                return
            self._write_sets(head, mirror, dirty=mirror.apply(changes), fence=fence)

    def _check_sets_fence(self, fence: int | None, head: Head | None) -> None:
        """``fence`` against the newest token the sets or the state recorded (a new leader's
        first write may be either)."""
        if fence is None:
            return
        check_fence(fence, head.doc.get("fence") if head is not None else None)
        state = self.maps.head(self.state)
        check_fence(fence, state.doc.get("fence") if state is not None else None)

    def _mirror_of(self, head: Head | None, changes: setbuckets.Changes) -> setbuckets.SetBuckets:
        """The stored sets with ``changes`` applied, cut afresh (a first delta, or a store that
        another writer changed meanwhile)."""
        current = head.doc.get("buckets") if head is not None else None
        counted = current if isinstance(current, int) else None
        return setbuckets.rebuilt(self._read_sets(), changes, current=counted)

    def _write_sets(
        self, head: Head | None, mirror: setbuckets.SetBuckets, *, dirty: set[int] | None, fence: int | None
    ) -> None:
        """Write the ``dirty`` buckets (None: every one), then the head (the commit point)."""
        indexes = range(mirror.count) if dirty is None else sorted(dirty)
        raw = {f"sets-{i}": mirror.payload(i) for i in indexes}
        generation = (head.revision if head is not None else 0) + 1
        created: list[str] = []
        written = self.maps.write_parts(raw, head=head, generation=generation, created=created)
        kept = head.parts if dirty is not None and head is not None else {}
        parts = {**kept, **written}
        if head is not None and parts == head.parts:
            mirror.version = head.revision
            self._mirror = mirror
            return
        recorded = head.doc.get("fence") if head is not None else None
        newest = max(x for x in (fence, recorded, -1) if isinstance(x, int))
        doc = {
            "format": FORMAT,
            "revision": generation,
            "fence": None if newest < 0 else newest,
            "buckets": mirror.count,
            "parts": parts,
            "previous": sorted(head.objects()) if head is not None else [],
            "state": self.state_seen(),
        }
        try:
            self.maps.commit(self.name, doc, head=head, role="head")
        except ApiException as exc:
            for name in created:
                self.maps.delete(name)
            self._mirror = None
            raise StoreConflict(expected=generation - 1, found=-1) from exc
        except StoreError:
            self._mirror = None
            raise
        self.maps.collect(head, doc)
        mirror.version = generation
        self._mirror = mirror

    def load_sets(self) -> dict[str, list[Target]]:
        """The sets (parsed through the inventory validation once per stored version)."""
        with self._lock:
            return self._read_sets()

    def _read_sets(self) -> dict[str, list[Target]]:
        with self._lock:
            head, parts = self.maps.load_parts(self.name)
            version = head.version if head is not None else ""
            if self._sets is not None and self._sets[0] == version:
                return {name: list(targets) for name, targets in self._sets[1].items()}
        out: dict[str, list[Target]] = {}
        for name, entries in kube_parts.join_sets(parts).items():
            good, bad = parse_entries(entries, source=f"{self.where}:{name}")
            for message in bad:
                log.warning("skipping persisted target: %s", message)
            out[name] = sorted(good, key=lambda t: t.identity)
        with self._lock:
            self._sets = (version, out)
        return {name: list(targets) for name, targets in out.items()}
