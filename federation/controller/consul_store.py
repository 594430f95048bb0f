"""The shared state store: Consul KV, so several ``gpufed serve`` replicas see one state.

Same contract as ``sqlite_store`` (:class:`~federation.controller.store.StateStore`):
every ``save`` is check-and-set, a lost CAS raises ``StoreConflict`` and never
overwrites, and a write carrying a fencing token older than the newest one recorded
raises ``FencedOut``. The only module of the controller that imports py-consul besides
``consul_lock``.

Layout under the prefix ``P`` (``--store consul://host:8500/P``, default ``gpufed``)::

    P/state                          head: {"format", "revision", "fence", "audit",
                                            "generation", "digest", "chunks", "size", ...}
    P/state-chunks/<gen>-<digest16>/<i>   the state JSON, zlib-compressed, split in chunks
                                          under Consul's 512 KiB value limit (``kvblob``)
    P/audit/<revision:012d>          one audit entry per key, its id the revision that
                                     committed it; the newest ``audit_keep`` are kept
    P/sets, P/sets-chunks/...        the discovery sources' last known sets, same scheme
    P/leader                         the election lock (``consul_lock``), not written here
    P/fetched/<replica>              when each replica last served each shard's SD: children
                                     poll any replica, the leader's hand-overs need them all

A save writes the new chunks first, then the small head with ``?cas=<ModifyIndex of the
head it read>``: the head is the commit point, so a reader never meets a half-written
state, and a writer that lost the race leaves only orphan chunks, collected later. After
a commit, chunk sets older than the previous generation are deleted (a reader that read
the old head a moment ago still finds its chunks; one that comes later re-reads the head,
and the digest check catches anything torn). The audit entry of a save rides in the head
itself (so state and entry commit together, as in SQLite's one transaction) and is
copied to its own key right after, or by the next save if that copy failed; two writers
racing for one revision therefore never share an audit key. Heads and audit entries are
JSON, so ``consul kv get gpufed/state`` shows an operator where things stand.

**Fencing.** ``fence`` is the leader lock's acquisition index. The head keeps the newest
token any write carried; a write with an older one is refused, and the CAS on the head
makes "check the token, then write" one step: a deposed leader whose request was already
in flight when a new leader recorded its token fails the CAS. A new leader records its
token with its first write (``Controller.take_over``), before it does anything else.

**Reads.** ``load`` fetches the head (one small GET) and the chunks only when the digest
changed, so a follower polling every second costs Consul one request per second.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import consul
import requests

from federation.controller import kvblob
from federation.controller.state import AuditEntry, ControllerState
from federation.controller.store import Changed, FencedOut, StoreConflict, StoreError
from sharder.inventory import Target
from sharder.lastknown import parse_entries, target_document

log = logging.getLogger(__name__)
FORMAT = 1
READ_ATTEMPTS = 5
MAX_AUDIT_BYTES = 32 * 1024
"""An audit entry larger than this (a change naming thousands of targets) keeps its
summary only, so the head stays small."""


@dataclass(frozen=True)
class Head:
    doc: dict[str, Any]
    modify_index: int

    def int(self, name: str, default: int = 0) -> int:
        value = self.doc.get(name, default)
        return value if isinstance(value, int) else default


class ConsulStore:
    def __init__(
        self,
        client: consul.Consul,
        *,
        prefix: str = "gpufed",
        audit_keep: int = 1000,
        chunk_bytes: int = kvblob.CHUNK_BYTES,
        where: str = "consul",
    ) -> None:
        if not prefix or prefix.startswith("/") or prefix.endswith("/"):
            raise StoreError(
                f"Consul KV prefix must be non-empty without leading or trailing '/': {prefix!r}"
            )
        self.client = client
        self.prefix = prefix
        self.audit_keep = audit_keep
        self.chunk_bytes = chunk_bytes
        self.where = where
        self._lock = threading.RLock()
        self._cache: dict[str, tuple[str, Any]] = {}  # head key -> (digest, decoded document)
        self._sets: tuple[str, dict[str, list[Target]]] | None = None  # (digest, parsed sets)
        self._audit_writes = 0

    # ---- keys -------------------------------------------------------------------------------
    @property
    def state_key(self) -> str:
        return f"{self.prefix}/state"

    @property
    def sets_key(self) -> str:
        return f"{self.prefix}/sets"

    def _audit_key(self, audit_id: int) -> str:
        return f"{self.prefix}/audit/{audit_id:012d}"

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
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
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
        raise StoreError(f"state store {self.where}: {key} kept changing under {READ_ATTEMPTS} reads")

    def _collect(self, area: str, *, current: int) -> None:
        prefix = f"{self.prefix}/{area}/"
        try:
            _, folders = self.client.kv.get(prefix, keys=True, separator="/")
            for folder in kvblob.collectable(folders or [], current=current):
                self.client.kv.delete(folder, recurse=True)
        except (consul.ConsulException, requests.RequestException) as exc:  # the next save tries again
            log.warning("state store %s: collecting old chunks under %s failed: %s", self.where, prefix, exc)

    # ---- StateStore ------------------------------------------------------------------------------
    def load(self) -> ControllerState | None:
        with self._lock:
            head, document = self._load_blob(self.state_key, "state-chunks")
        if head is None:
            return None
        try:
            state = ControllerState.model_validate(document)
        except ValueError as exc:
            raise StoreError(
                f"state in {self.where}/{self.state_key} does not validate: {str(exc)[:300]}"
            ) from exc
        if state.revision != head.int("revision"):
            raise StoreError(
                f"state in {self.where}: chunks hold revision {state.revision}, "
                f"the head says {head.int('revision')}"
            )
        return state

    def save(
        self,
        state: ControllerState,
        *,
        expected_revision: int | None,
        audit: AuditEntry | None = None,
        fence: int | None = None,
        changed: Changed | None = None,
    ) -> ControllerState:
        del changed  # the state is one compressed document: nothing to gain from the hint
        with self._lock:
            head = self._head(self.state_key)
            found = head.int("revision") if head is not None else None
            recorded = head.doc.get("fence") if head is not None else None
            if fence is not None and isinstance(recorded, int) and fence < recorded:
                raise FencedOut(
                    f"write fenced out: token {fence} is older than {recorded} (a newer leader wrote)"
                )
            if found != expected_revision:
                raise StoreConflict(expected=expected_revision, found=-1 if found is None else found)
            self._flush_audit(head)
            revision = (found or 0) + 1
            stored = state.model_copy(update={"revision": revision})
            payload = stored.model_dump_json().encode()
            described = self._write_blob(
                "state-chunks", kvblob.encode(payload, chunk_bytes=self.chunk_bytes), generation=revision
            )
            newest = max(x for x in (fence, recorded, -1) if isinstance(x, int))
            doc = {
                "format": FORMAT,
                "revision": revision,
                "fence": None if newest < 0 else newest,
                "audit": None if audit is None else _audit_document(audit),
                **described,
            }
            cas = head.modify_index if head is not None else 0
            if not self._put(self.state_key, json.dumps(doc, sort_keys=True), cas=cas):
                now = self._head(self.state_key)
                now_fence = now.doc.get("fence") if now is not None else None
                if fence is not None and isinstance(now_fence, int) and fence < now_fence:
                    raise FencedOut(f"write fenced out: token {fence} is older than {now_fence}")
                raise StoreConflict(expected=expected_revision, found=now.int("revision") if now else -1)
            self._cache[self.state_key] = (str(described["digest"]), json.loads(payload))
            self._collect("state-chunks", current=revision)
            if audit is not None:
                try:
                    self._flush_audit(Head(doc=doc, modify_index=0))
                except StoreError as exc:  # committed in the head; the next save copies it
                    log.warning("%s", exc)
            return stored

    def _flush_audit(self, head: Head | None) -> None:
        """Copy the audit entry a head carries to its own key (idempotent)."""
        entry = head.doc.get("audit") if head is not None else None
        if not isinstance(entry, dict):
            return
        revision = head.int("revision") if head is not None else 0
        if not self._put(self._audit_key(revision), json.dumps(entry, sort_keys=True)):
            raise StoreError(f"state store {self.where}: Consul refused audit entry {revision}")
        self._audit_writes += 1
        if self._audit_writes % 50 == 1:
            self._trim_audit()

    def _trim_audit(self) -> None:
        """Keep the newest ``audit_keep`` entries (run every 50 entries: at most 50 over)."""
        try:
            _, keys = self.client.kv.get(f"{self.prefix}/audit/", keys=True)
            ids = sorted(k for k in keys or [] if k.rsplit("/", 1)[-1].isdigit())
            for key in ids[: max(0, len(ids) - self.audit_keep)]:
                self.client.kv.delete(key)
        except (consul.ConsulException, requests.RequestException) as exc:
            log.warning("state store %s: trimming the audit log failed: %s", self.where, exc)

    def audit_log(self, *, limit: int = 100, before_id: int | None = None) -> list[AuditEntry]:
        with self._lock:
            head = self._head(self.state_key)
            if head is None:
                return []
            _, entries = self._call(
                "read the audit log", self.client.kv.get, f"{self.prefix}/audit/", recurse=True
            )
        found: dict[int, Any] = {}
        for entry in entries or []:
            suffix = str(entry["Key"]).rsplit("/", 1)[-1]
            if suffix.isdigit():
                try:
                    found[int(suffix)] = json.loads(entry["Value"] or b"{}")
                except ValueError as exc:
                    log.warning("skipping unreadable audit entry %s: %s", entry["Key"], exc)
        if isinstance(head.doc.get("audit"), dict):  # committed, maybe not copied yet
            found[head.int("revision")] = head.doc["audit"]
        out = []
        for audit_id in sorted(found, reverse=True):
            if before_id is not None and audit_id >= before_id:
                continue
            try:
                out.append(AuditEntry.model_validate({**found[audit_id], "id": audit_id}))
            except ValueError as exc:
                log.warning("skipping invalid audit entry %d: %s", audit_id, exc)
            if len(out) >= limit:
                break
        return out

    def save_sets(self, sets: Mapping[str, Sequence[Target]]) -> None:
        doc = {
            name: [target_document(t) for t in sorted(targets, key=lambda t: t.identity)]
            for name, targets in sorted(sets.items())
        }
        payload = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        with self._lock:
            head = self._head(self.sets_key)
            blob = kvblob.encode(payload, chunk_bytes=self.chunk_bytes)
            if head is not None and head.doc.get("digest") == blob.digest:
                return
            generation = (head.int("generation") if head is not None else 0) + 1
            described = self._write_blob("sets-chunks", blob, generation=generation)
            body = json.dumps({"format": FORMAT, **described}, sort_keys=True)
            if not self._put(self.sets_key, body, cas=head.modify_index if head is not None else 0):
                raise StoreConflict(expected=generation - 1, found=-1)
            self._cache[self.sets_key] = (str(described["digest"]), doc)
            self._collect("sets-chunks", current=generation)

    def load_sets(self) -> dict[str, list[Target]]:
        """The sets (parsed through the inventory validation once per stored version)."""
        with self._lock:
            head, document = self._load_blob(self.sets_key, "sets-chunks")
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

    # ---- SD fetches seen by each replica (hand-over proof needs them all) ---------------------------
    def note_fetches(self, replica: str, fetched: Mapping[str, float]) -> None:
        """When this replica last served each shard's SD (one small key per replica)."""
        body = json.dumps(dict(sorted(fetched.items())), separators=(",", ":"))
        self._put(f"{self.prefix}/fetched/{replica}", body)

    def fetches(self, *, forget_after_s: float = 86400.0) -> dict[str, float]:
        """shard -> the newest fetch any replica saw; keys of replicas silent for a day go."""
        _, entries = self._call(
            "read SD fetches", self.client.kv.get, f"{self.prefix}/fetched/", recurse=True
        )
        newest: dict[str, float] = {}
        for entry in entries or []:
            try:
                seen = {str(k): float(v) for k, v in json.loads(entry["Value"] or b"{}").items()}
            except (ValueError, AttributeError):
                continue
            for shard, at in seen.items():
                newest[shard] = max(at, newest.get(shard, at))
            if seen and max(seen.values()) < time.time() - forget_after_s:
                self._call("forget a replica", self.client.kv.delete, entry["Key"])
        return newest

    def close(self) -> None:
        session = getattr(self.client.http, "session", None)
        if session is not None:
            session.close()


def _audit_document(audit: AuditEntry) -> dict[str, Any]:
    doc = audit.model_dump(mode="json", exclude={"id"})
    size = len(json.dumps(doc))
    if size > MAX_AUDIT_BYTES:
        doc["detail"] = {"truncated": True, "bytes": size, "keys": sorted(audit.detail)[:50]}
    return doc
