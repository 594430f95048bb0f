"""Consul KV plumbing under one prefix: errors mapped, heads read, blobs written and read.

The base of ``consul_store.ConsulStore`` (the state store): a *head* is a small JSON key
naming a ``kvblob`` of chunks; a reader checks the chunks against the head and reads the
head again after a torn read. Every py-consul or requests error becomes a ``StoreError``
naming the store here, at the boundary.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import consul
import requests

from federation.controller.stores import kvblob, kvblocks
from federation.controller.stores.store import StoreError

log = logging.getLogger(__name__)
FORMATS = (1, 2)
READ_ATTEMPTS = 5
RESCAN_EVERY = 100
"""Collections between two listings of an area's folders (``ConsulKV._collect_blocks``)."""


@dataclass(frozen=True)
class Head:
    doc: dict[str, Any]
    modify_index: int

    def int(self, name: str, default: int = 0) -> int:
        value = self.doc.get(name, default)
        return value if isinstance(value, int) else default


class ConsulKV:
    def __init__(self, client: consul.Consul, *, prefix: str, chunk_bytes: int, where: str) -> None:
        if not prefix or prefix.startswith("/") or prefix.endswith("/"):
            raise StoreError(
                f"Consul KV prefix must be non-empty without leading or trailing '/': {prefix!r}"
            )
        self.client = client
        self.prefix = prefix
        self.chunk_bytes = chunk_bytes
        self.where = where
        self._cache: dict[str, tuple[str, Any]] = {}  # head key -> (digest, decoded document)
        self._tracked: dict[str, Tracked] = {}
        """area -> the folders known there (``_collect_blocks``)."""

    # ---- Consul calls, errors mapped -----------------------------------------------------------
    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (consul.ConsulException, requests.RequestException) as exc:
            raise StoreError(f"state store {self.where}: {what}: {str(exc)[:300]}") from exc

    def _head(self, key: str) -> Head | None:
        _, entry = self._call(f"read {key}", self.client.kv.get, key)
        if entry is None:
            return None
        try:
            doc = json.loads(entry["Value"] or b"{}")
        except ValueError as exc:
            raise StoreError(f"state store {self.where}: {key} is not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") not in FORMATS:
            raise StoreError(f"state store {self.where}: {key} has an unknown format {doc!r:.200}")
        return Head(doc=doc, modify_index=int(entry["ModifyIndex"]))

    def _put(self, key: str, value: bytes | str, **kwargs: Any) -> bool:
        return bool(self._call(f"write {key}", self.client.kv.put, key, value, **kwargs))

    # ---- blobs ---------------------------------------------------------------------------------
    def _write_blob(self, area: str, blob: kvblob.Blob, *, generation: int) -> dict[str, object]:
        keys = kvblob.chunk_keys(
            f"{self.prefix}/{area}", generation=generation, digest=blob.digest, count=len(blob.parts)
        )
        for key, part in zip(keys, blob.parts, strict=True):
            if not self._put(key, part):
                raise StoreError(f"state store {self.where}: Consul refused {key}")
        return blob.describe(generation=generation)

    def _read_blob(self, area: str, head: Head) -> bytes:
        doc = head.doc
        keys = kvblob.chunk_keys(
            f"{self.prefix}/{area}",
            generation=head.int("generation"),
            digest=str(doc.get("digest", "")),
            count=head.int("chunks"),
        )
        parts = []
        for key in keys:
            _, entry = self._call(f"read {key}", self.client.kv.get, key)
            parts.append(None if entry is None else (entry["Value"] or b""))
        return kvblob.decode(parts, head=doc)

    def _load_blob(self, key: str, area: str) -> tuple[Head | None, Any]:
        """(head, decoded JSON document) with the torn-read retry; cached by digest."""
        for _ in range(READ_ATTEMPTS):
            head = self._head(key)
            if head is None:
                return None, None
            digest = str(head.doc.get("digest"))
            cached = self._cache.get(key)
            if cached is not None and cached[0] == digest:
                return head, cached[1]
            try:
                document = json.loads(self._read_blob(area, head))
            except kvblob.BlobError as exc:
                log.info("re-reading %s after a torn read: %s", key, exc)
                continue
            self._cache[key] = (digest, document)
            return head, document
        raise StoreError(
            f"state store {self.where}: {key} kept changing under {READ_ATTEMPTS} reads (or a chunk it "
            "names is missing); start afresh with --init if it stays so"
        )

    def _collect(self, area: str, *, current: int, digest: str | None = None) -> None:
        """Chunk sets older than the previous generation (``kvblob.collectable``); ``digest``:
        the set of generation ``current`` the commit named."""
        named: dict[str, kvblocks.Descriptor] = {} if digest is None else {"": [current, digest, 0, 0]}
        self._collect_blocks(named, current=current, area=area)

    def _collect_blocks(
        self, named: Mapping[str, kvblocks.Descriptor], *, current: int, area: str = "state-blocks"
    ) -> None:
        """Folders no longer named, once older than the previous generation
        (``kvblob.collectable``): a reader holding the previous head still finds what it names.

        The folders are listed on the first collection and every ``RESCAN_EVERY`` after it
        (a writer that lost its check-and-set leaves some nobody names); in between, the
        candidates are the folders the previous commit named and this one does not, so a
        change costs no listing of every shard's folder."""
        prefix = f"{self.prefix}/{area}/"
        keep = {f"{prefix}{kvblob.set_name(int(d[0]), str(d[1]))}/" for d in named.values()}
        tracked = self._tracked.get(area)
        try:
            if tracked is None or tracked.collections >= RESCAN_EVERY:
                _, folders = self.client.kv.get(prefix, keys=True, separator="/")
                tracked = Tracked(keep=keep, stale={str(f) for f in folders or []} - keep)
            else:
                tracked.stale = (tracked.stale | tracked.keep) - keep
                tracked.keep, tracked.collections = keep, tracked.collections + 1
            self._tracked[area] = tracked
            for folder in kvblob.collectable(sorted(tracked.stale), current=current):
                self.client.kv.delete(folder, recurse=True)
                tracked.stale.discard(folder)
        except (consul.ConsulException, requests.RequestException) as exc:  # the next save tries again
            self._tracked.pop(area, None)
            log.warning("state store %s: collecting old blocks under %s failed: %s", self.where, prefix, exc)


@dataclass
class Tracked:
    """The folders of one area a collection knows of: those the last commit named, and
    those it did not (deleted once old enough)."""

    keep: set[str]
    stale: set[str]
    collections: int = 0
