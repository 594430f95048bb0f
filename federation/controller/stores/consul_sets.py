"""The Consul store's last known sets: one blob per bucket of identities (``setbuckets``).

Part of ``consul_store`` (composed, not inherited), over its ``consul_kv`` plumbing::

    P/sets                               head: one descriptor per bucket, the newest fence
    P/sets-blocks/<gen>-<digest16>/<i>   one bucket (``kvblob`` chunks)

A change writes the buckets it touched, then the head with ``?cas`` (the commit point).
Every write is fenced against the newest token the sets or the state head recorded. A head
of the layout before buckets (one blob under ``P/sets-chunks``) is still read.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from federation.controller.stores import kvblob, kvblocks, setbuckets
from federation.controller.stores.consul_kv import ConsulKV, Head
from federation.controller.stores.store import StoreConflict, StoreError, check_fence
from sharder.model.inventory import Target
from sharder.sources.lastknown import parse_entries

log = logging.getLogger(__name__)
FORMAT = 2


class ConsulSets:
    def __init__(
        self,
        kv: ConsulKV,
        *,
        key: str,
        state_key: str,
        lock: threading.RLock,
        state_seen: Callable[[], int] = lambda: 0,
    ) -> None:
        self.kv, self.key, self.state_key, self._lock = kv, key, state_key, lock
        self.state_seen = state_seen
        """The newest state revision this replica saw, recorded in the head as ``state``: a
        sets head left alone after a state was committed is a leftover (``store_guard``)."""
        self.where = kv.where
        self._sets: tuple[str, dict[str, list[Target]]] | None = None  # (digest, parsed sets)
        self._mirror: setbuckets.SetBuckets | None = None
        """The sets as this store wrote them last (``save_set_changes`` writes the buckets it changes)."""

    def save_sets(self, sets: Mapping[str, Sequence[Target]], *, fence: int | None = None) -> None:
        with self._lock:
            head = self._sets_head(fence)
            current = head.doc.get("buckets") if head is not None else None
            count = len(current) if isinstance(current, list) else None
            mirror = setbuckets.SetBuckets.from_sets(sets, current=count)
            self._write_sets(head, mirror, dirty=None, fence=fence)

    def save_set_changes(self, changes: setbuckets.Changes, *, fence: int | None = None) -> None:
        """Only the buckets holding what changed (source -> identity -> target, None: gone):
        the cost of the change, fenced like the state."""
        with self._lock:
            head = self._sets_head(fence)
            mirror = self._mirror
            stored = head.int("generation") if head is not None else 0
            if mirror is None or mirror.version != stored or not mirror.fits(changes):
                current = head.doc.get("buckets") if head is not None else None
                counted = len(current) if isinstance(current, list) else None
                mirror = setbuckets.rebuilt(self.load_sets(), changes, current=counted)
                self._write_sets(head, mirror, dirty=None, fence=fence)
                return
            self._write_sets(head, mirror, dirty=mirror.apply(changes), fence=fence)

    def _sets_head(self, fence: int | None) -> Head | None:
        """The sets' head, after checking ``fence`` against the newest token the sets or the
        state recorded (a new leader's first write may be either)."""
        head = self.kv._head(self.key)
        if fence is not None:
            state = self.kv._head(self.state_key)
            for found in (head, state):
                check_fence(fence, found.doc.get("fence") if found is not None else None)
        return head

    def _write_sets(
        self, head: Head | None, mirror: setbuckets.SetBuckets, *, dirty: set[int] | None, fence: int | None
    ) -> None:
        """The ``dirty`` buckets (None: every one) as blobs, then the head with ``?cas``."""
        before = head.doc.get("buckets") if head is not None else None
        named: list[kvblocks.Descriptor | None] = [None] * mirror.count
        if dirty is not None and isinstance(before, list) and len(before) == mirror.count:
            named = list(before)
        generation = (head.int("generation") if head is not None else 0) + 1
        for index in range(mirror.count) if dirty is None else sorted(dirty):
            blob = kvblob.encode(mirror.payload(index), chunk_bytes=self.kv.chunk_bytes)
            old = before[index] if isinstance(before, list) and index < len(before) else None
            if isinstance(old, list) and len(old) == 4 and old[1] == blob.digest:
                named[index] = old
                continue
            self.kv._write_blob("sets-blocks", blob, generation=generation)
            named[index] = kvblocks.describe(blob, generation=generation)
        if head is not None and named == before:
            mirror.version = head.int("generation")
            self._mirror = mirror
            return
        recorded = head.doc.get("fence") if head is not None else None
        newest = max(x for x in (fence, recorded, -1) if isinstance(x, int))
        doc = {"format": FORMAT, "generation": generation, "buckets": named,
               "fence": None if newest < 0 else newest, "state": self.state_seen()}  # fmt: skip
        cas = head.modify_index if head is not None else 0
        if not self.kv._put(self.key, json.dumps(doc, sort_keys=True), cas=cas):
            self._mirror = None
            raise StoreConflict(expected=generation - 1, found=-1)
        mirror.version = generation
        self._mirror = mirror
        self.kv._collect_blocks({str(i): d for i, d in enumerate(named) if d is not None},
                             current=generation, area="sets-blocks")  # fmt: skip
        self.kv._collect("sets-chunks", current=generation + 1)  # the whole-blob layout before buckets

    def load_sets(self) -> dict[str, list[Target]]:
        """The sets (parsed through the inventory validation once per stored version)."""
        with self._lock:
            head = self.kv._head(self.key)
            document: Any = None
            if head is None:  # no sets yet; not read again (a head written since is no old layout)
                digest = ""
            elif isinstance(head.doc.get("buckets"), list):
                digest = json.dumps(head.doc["buckets"])
                if self._sets is None or self._sets[0] != digest:
                    document = self._read_buckets(head)
            else:
                head, document = self.kv._load_blob(self.key, "sets-chunks")
                digest = str(head.doc.get("digest")) if head is not None else ""
            if self._sets is not None and self._sets[0] == digest:
                return {name: list(targets) for name, targets in self._sets[1].items()}
        out: dict[str, list[Target]] = {}
        for name, entries in (document or {}).items():
            good, bad = parse_entries(
                entries if isinstance(entries, list) else [], source=f"{self.where}:{name}"
            )
            for message in bad:
                log.warning("skipping persisted target: %s", message)
            out[str(name)] = good
        with self._lock:
            self._sets = (digest, out)
        return {name: list(targets) for name, targets in out.items()}

    def _read_buckets(self, head: Head) -> dict[str, list[Any]]:
        joined: dict[str, list[Any]] = {}
        try:
            for descriptor in head.doc["buckets"]:
                found = json.loads(self.kv._read_blob("sets-blocks", Head(kvblocks.head_of(descriptor), 0)))
                for source, entries in (found if isinstance(found, dict) else {}).items():
                    joined.setdefault(str(source), []).extend(entries if isinstance(entries, list) else [])
        except (kvblocks.BlockError, kvblob.BlobError, ValueError) as exc:
            raise StoreError(f"sets in {self.where}: {exc}") from exc
        return joined
