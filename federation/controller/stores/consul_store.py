"""The shared state store: Consul KV, so several ``gpufed serve`` replicas see one state.

Same contract as ``sqlite_store`` (``store.StateStore``): every write is check-and-set, a
lost CAS raises ``StoreConflict`` and never overwrites, and a write carrying a fencing token
older than the newest recorded raises ``FencedOut``. With ``consul_lock``, the only module
of the controller that imports py-consul.

Layout under the prefix ``P`` (``--store consul://host:8500/P``, default ``gpufed``)::

    P/state                          head: {"format", "revision", "fence", "audit",
                                            "generation", "digest", "chunks", "size", ...}
    P/state-chunks/<gen>-<digest16>/<i>   the state JSON without its placements, and the
                                          name of each shard's placement block, zlib-
                                          compressed, split in chunks under Consul's 512 KiB
                                          value limit (``kvblob``)
    P/state-blocks/<gen>-<digest16>/<i>   one shard's placements (``kvblocks``): a change
                                          writes the blocks of the shards it touched only
    P/audit/<revision:012d>          one audit entry per key, its id the revision that
                                     committed it; the newest ``audit_keep`` are kept
    P/sets                           head of the discovery sources' last known sets: one
                                     descriptor per bucket (``setbuckets``: by identity)
    P/sets-blocks/<gen>-<digest16>/<i>   one bucket of the sets; a commit writes the buckets
                                          it touched only (``store.apply``, fenced)
    P/revision                       the revision last committed (``store_guard``: a head
                                     put back older than it is refused after a restart)
    P/leader                         the election lock (``consul_lock``), not written here
    P/fetched/<replica>              when each replica last served each shard's SD: children
                                     poll any replica, the leader's hand-overs need them all

A save writes the changed blocks and new chunks, then the small head with ``?cas=<the
head's ModifyIndex>``: the head is the commit point, so a reader never meets a half-written
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
token with its first write (``Adoption.take_over``), before anything else.

**Reads.** ``load`` fetches the head (one small GET) and the chunks only when the digest
changed, and of the blocks only those it has not seen: a follower polling every second
costs Consul one request per second. A ``format`` 1 head (an older gpufed: one blob) is
read as it is; the next save writes format 2.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import consul
import requests

from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.stores import kvblob, kvblocks, setbuckets, store_guard
from federation.controller.stores.consul_kv import READ_ATTEMPTS, ConsulKV, Head
from federation.controller.stores.consul_sets import ConsulSets
from federation.controller.stores.store import (
    Changed,
    Commit,
    StateDocuments,
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
FORMAT = 2
AUDIT_SINGLE_READS = 32
"""An audit page of at most this many entries is read key by key (an entry over
``store.MAX_AUDIT_BYTES`` keeps its summary only, so the head stays small)."""


class ConsulStore(ConsulKV):
    def __init__(
        self,
        client: consul.Consul,
        *,
        prefix: str = "gpufed",
        audit_keep: int = 1000,
        chunk_bytes: int = kvblob.CHUNK_BYTES,
        where: str = "consul",
        init: bool = False,
    ) -> None:
        super().__init__(client, prefix=prefix, chunk_bytes=chunk_bytes, where=where)
        self.init = init
        """``--init``: a missing head with leftovers starts empty (``store_guard``)."""
        self._watch = store_guard.RevisionWatch()
        self.audit_keep = audit_keep
        self._lock = threading.RLock()
        self._audit_writes = 0
        self._blocks: kvblocks.Blocks = {}
        self._documents = StateDocuments()
        """The members of ``_blocks_of`` per shard, as stored (a change updates its shards only)."""
        self._blocks_of: Any = None
        self._block_cache: dict[str, kvblocks.Members] = {}  # digest -> members, for reads
        self._loaded: tuple[str, ControllerState] | None = None  # (state-chunks digest, state)
        self._marker_checked = False
        """Whether this process compared the head with the revision marker (its first read)."""
        self.sets = ConsulSets(
            self,
            key=f"{prefix}/sets",
            state_key=f"{prefix}/state",
            lock=self._lock,
            state_seen=lambda: self._watch.highest,
        )
        """The discovery sources' last known sets (``consul_sets``)."""

    # ---- keys -------------------------------------------------------------------------------
    @property
    def state_key(self) -> str:
        return f"{self.prefix}/state"

    @property
    def marker_key(self) -> str:
        return f"{self.prefix}/revision"

    def _audit_key(self, audit_id: int) -> str:
        return f"{self.prefix}/audit/{audit_id:012d}"

    # ---- StateStore ------------------------------------------------------------------------------
    def load(self) -> ControllerState | None:
        with self._lock:
            for _ in range(READ_ATTEMPTS):
                recorded = None if self._marker_checked else self._read_marker()  # before the head
                head, document = self._load_blob(self.state_key, "state-chunks")
                if head is None and self._without_head():  # a first commit landed meanwhile
                    continue
                if head is None:
                    return None
                self._check_marker(head, recorded)
                self._watch.saw(head.int("revision"), where=self.where)
                if head.doc.get("format") == 1:
                    return self._validated(document, head)
                digest = str(head.doc.get("digest"))
                if self._loaded is not None and self._loaded[0] == digest:
                    return self._loaded[1]
                if "state" not in document:  # a save cached its block names, not its state
                    self._cache.pop(self.state_key, None)
                    continue
                try:
                    state = self._with_blocks(self._validated(document.get("state"), head), document)
                except kvblob.BlobError as exc:
                    log.info("re-reading %s after a torn block read: %s", self.state_key, exc)
                    continue
                self._loaded = (digest, state)
                return state
        raise StoreError(
            f"state store {self.where}: {self.state_key} kept changing under {READ_ATTEMPTS} reads "
            f"(or a block it names is missing); {store_guard.INIT_HINT} if it stays so"
        )

    def _without_head(self) -> bool:
        """No head: a first start, or a deleted state (refused unless ``--init``). Leftovers are
        audit entries and chunk or block sets past the first generation (a first save's
        chunks may be in flight before its head). True: the head is there after all (a first
        commit and its audit entry landed between the two reads)."""
        leftovers: list[str] = []
        for area in ("audit", "state-chunks", "state-blocks"):
            _, keys = self._call(f"list {area}", self.client.kv.get, f"{self.prefix}/{area}/", keys=True)
            for key in keys or []:
                generation = str(key).removeprefix(f"{self.prefix}/{area}/").partition("-")[0]
                if area == "audit" or (generation.isdigit() and int(generation) > 1):
                    leftovers.append(str(key))
        if self._read_marker() is not None:
            leftovers.append(self.marker_key)
        sets = self._head(self.sets.key)
        seen = sets.doc.get("state") if sets is not None else None
        lone = seen if type(seen) is int and seen > 0 else 0  # the state revision it was written at
        if lone:  # the sets were written after a state was: that state is gone
            leftovers.append(store_guard.lone_sets(self.sets.key, lone))
        if not leftovers:
            return False
        if self._head(self.state_key) is not None:
            return True
        if not self.init:
            raise store_guard.missing_head(self.where, self.state_key, leftovers)
        log.warning("state store %s: --init removes %d keys of a lost state", self.where, len(leftovers))
        for area in ("audit", "state-chunks", "state-blocks"):
            self._call(f"delete {area}", self.client.kv.delete, f"{self.prefix}/{area}/", recurse=True)
        self._call("delete the revision marker", self.client.kv.delete, self.marker_key)
        if lone:
            self._call("delete the sets", self.client.kv.delete, self.sets.key)
            for area in ("sets-blocks", "sets-chunks"):
                self._call(f"delete {area}", self.client.kv.delete, f"{self.prefix}/{area}/", recurse=True)
        return False

    def _read_marker(self) -> int | None:
        _, entry = self._call("read the revision marker", self.client.kv.get, self.marker_key)
        text = entry["Value"] if entry is not None else None
        return store_guard.marker_revision(text, where=self.where, name=self.marker_key)

    def _write_marker(self, revision: int) -> None:
        """Record a commit's revision (one PUT). A failure is logged: a marker behind the
        head is harmless, the next commit moves it on."""
        try:
            self._put(self.marker_key, store_guard.marker_text(revision))
        except StoreError as exc:
            log.warning("state store %s: recording revision %d failed: %s", self.where, revision, exc)

    def _check_marker(self, head: Head, recorded: int | None) -> None:
        """A new process's first head against the marker (read before it): older is refused."""
        if self._marker_checked:
            return
        found = head.int("revision")
        if recorded is not None and found < recorded:
            if not self.init:
                raise store_guard.rolled_back(self.where, self.state_key, found, self.marker_key, recorded)
            log.warning(
                "state store %s: --init accepts %s at revision %d below the marker's %d",
                self.where, self.state_key, found, recorded,
            )  # fmt: skip
            self._write_marker(found)
        self._marker_checked = True

    def _validated(self, document: Any, head: Head) -> ControllerState:
        try:
            state = ControllerState.model_validate(document)
        except ValueError as exc:
            raise StoreError(
                f"state in {self.where}/{self.state_key} does not validate: "
                f"{' '.join(str(exc).split())[:300]}"  # pydantic's message spans lines
            ) from exc
        if state.revision != head.int("revision"):
            raise StoreError(
                f"state in {self.where}: chunks hold revision {state.revision}, "
                f"the head says {head.int('revision')}"
            )
        return state

    def _with_blocks(self, state: ControllerState, document: dict[str, Any]) -> ControllerState:
        """``state`` with its placements read from its blocks (those not seen yet)."""
        if state.assignment is None:
            return state
        described = document.get("blocks")
        if not isinstance(described, dict):
            raise StoreError(f"state in {self.where}: no placement blocks named in format 2")
        blocks: kvblocks.Blocks = {}
        try:
            for shard, descriptor in described.items():
                head = kvblocks.head_of(descriptor)
                members = self._block_cache.get(str(head["digest"]))
                if members is None:
                    members = kvblocks.members_of(self._read_blob("state-blocks", Head(head, 0)))
                blocks[str(shard)] = members
        except kvblocks.BlockError as exc:
            raise StoreError(f"state in {self.where}: {exc}") from exc
        unknown = blocks.keys() - state.assignment.shards.keys()
        if any(blocks[s] for s in unknown):
            raise StoreError(f"state in {self.where}: targets are placed on unknown shard {min(unknown)!r}")
        self._block_cache = {str(kvblocks.head_of(d)["digest"]): blocks[str(s)] for s, d in described.items()}
        targets, weights = kvblocks.assemble(blocks)
        full = state.assignment.model_copy(update={"targets": targets, "weights": weights})
        self._blocks, self._blocks_of = blocks, full
        return state.model_copy(update={"assignment": full})

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
            head = self._head(self.state_key)
            if head is not None:
                self._check_marker(head, marked)
            found = head.int("revision") if head is not None else None
            recorded = head.doc.get("fence") if head is not None else None
            check_head(fence, recorded, expected=expected_revision, found=found)
            self._flush_audit(head)
            revision = (found or 0) + 1
            stored = state.model_copy(update={"revision": revision})
            blocks, named = self._write_blocks(head, stored.assignment, changed, generation=revision)
            rest = self._documents.json(stored)
            payload = f'{{"blocks":{json.dumps(named, sort_keys=True)},"state":{rest}}}'.encode()
            described = self._write_blob(
                "state-chunks", kvblob.encode(payload, chunk_bytes=self.chunk_bytes), generation=revision
            )
            newest = max(x for x in (fence, recorded, -1) if isinstance(x, int))
            doc = {
                "format": FORMAT,
                "revision": revision,
                "fence": None if newest < 0 else newest,
                "audit": None if audit is None else audit_document(audit),
                **described,
            }
            cas = head.modify_index if head is not None else 0
            if not self._put(self.state_key, json.dumps(doc, sort_keys=True), cas=cas):
                now = self._head(self.state_key)
                check_fence(fence, now.doc.get("fence") if now is not None else None)
                raise StoreConflict(expected=expected_revision, found=now.int("revision") if now else -1)
            self._cache[self.state_key] = (str(described["digest"]), {"blocks": named})  # + _loaded
            self._blocks, self._blocks_of = blocks, stored.assignment
            self._block_cache = {str(d[1]): blocks[shard] for shard, d in named.items()}
            self._loaded = (str(described["digest"]), stored)
            self._watch.saw(revision, where=self.where)
            self._write_marker(revision)
            self._collect("state-chunks", current=revision, digest=str(described["digest"]))
            self._collect_blocks(named, current=revision)
            if audit is not None:
                try:
                    self._flush_audit(Head(doc=doc, modify_index=0))
                except StoreError as exc:  # committed in the head; the next save copies it
                    log.warning("%s", exc)
            return stored

    def _write_blocks(
        self, head: Head | None, assignment: Any, changed: Changed | None, *, generation: int
    ) -> tuple[kvblocks.Blocks, dict[str, kvblocks.Descriptor]]:
        """Each shard's block named, written first where its bytes are new: with ``changed``
        relative to the assignment stored last, only the touched shards are encoded."""
        if assignment is None:
            return {}, {}
        before = self._named(head)
        if changed is not None and changed[0] is self._blocks_of and self._blocks_of is not None:
            blocks, dirty = kvblocks.update(self._blocks, changed[0], assignment, changed[1])
        else:
            blocks = kvblocks.split(assignment)
            dirty = set(blocks) | set(before)
        named = {shard: d for shard, d in before.items() if shard in blocks and shard not in dirty}
        for shard in sorted(dirty & blocks.keys()):
            blob = kvblocks.encode(blocks[shard], chunk_bytes=self.chunk_bytes)
            old = before.get(shard)
            if old is not None and old[1] == blob.digest:
                named[shard] = old
                continue
            self._write_blob("state-blocks", blob, generation=generation)
            named[shard] = kvblocks.describe(blob, generation=generation)
        return blocks, named

    def _named(self, head: Head | None) -> dict[str, kvblocks.Descriptor]:
        """The block names the stored state (``head``) uses; none for a format-1 head."""
        if head is None or head.doc.get("format") == 1:
            return {}
        cached = self._cache.get(self.state_key)
        if cached is None or cached[0] != str(head.doc.get("digest")):
            _, document = self._load_blob(self.state_key, "state-chunks")
            cached = ("", document)
        named = cached[1].get("blocks") if isinstance(cached[1], dict) else None
        return {str(k): v for k, v in named.items()} if isinstance(named, dict) else {}

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
            entries = self._audit_page(limit=limit, before_id=before_id)
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
        return newest_audit(found, limit=limit, top=None if before_id is None else before_id - 1)

    def _audit_page(self, *, limit: int, before_id: int | None) -> list[dict[str, Any]]:
        """The entries of one page: the key names first (cheap), then only the page's keys,
        so a page of one costs one entry, not the whole log (``audit_keep`` entries)."""
        prefix = f"{self.prefix}/audit/"
        _, keys = self._call("list the audit log", self.client.kv.get, prefix, keys=True)
        ids = sorted(
            (int(k.rsplit("/", 1)[-1]) for k in keys or [] if str(k).rsplit("/", 1)[-1].isdigit()),
            reverse=True,
        )
        wanted = [i for i in ids if before_id is None or i < before_id][:limit]
        if len(wanted) > AUDIT_SINGLE_READS:  # a big page: one recursive read beats many GETs
            _, entries = self._call("read the audit log", self.client.kv.get, prefix, recurse=True)
            return list(entries or [])
        page = []
        for audit_id in wanted:
            _, entry = self._call("read an audit entry", self.client.kv.get, self._audit_key(audit_id))
            if entry is not None:
                page.append(entry)
        return page

    def save_sets(self, sets: Mapping[str, Sequence[Target]], *, fence: int | None = None) -> None:
        self.sets.save_sets(sets, fence=fence)

    def save_set_changes(self, changes: setbuckets.Changes, *, fence: int | None = None) -> None:
        self.sets.save_set_changes(changes, fence=fence)

    def load_sets(self) -> dict[str, list[Target]]:
        return self.sets.load_sets()

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
