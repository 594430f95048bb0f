"""How the Kubernetes store cuts a document into objects under the API's 1 MiB limit.

Pure (no I/O): :mod:`federation.controller.stores.kube_store` writes what :func:`pack` gives
and reads back through :func:`unpack`. A ConfigMap holds at most 1 MiB, so a state is
split in two steps:

1. **Parts by content.** The assignment's ``targets`` and ``weights`` (all but a few KiB
   of a large state) go into ``buckets`` parts by a CRC-32 of the identity; everything
   else is the ``core`` part. A change that moves a handful of targets changes the core
   and the few buckets holding them; the other parts keep their bytes, digest and
   objects, so a save writes only what changed (the delta the ``changed`` hint asks for,
   found by digest rather than trusted from the hint).
2. **Pieces by size.** Each part is zlib-compressed and, when still over ``piece_bytes``
   (900 KiB by default), split into pieces, one object each.

Objects are named by the generation that first wrote them and the part's digest
(``<prefix>-<gen>-<digest12>-<i>``), so two writers racing for one revision never write
the same object with different bytes, and an object, once written, never changes.
"""

from __future__ import annotations

import json
import math
import zlib
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Any

from federation.controller.base.state import ControllerState
from federation.controller.stores import kvblob

PIECE_BYTES = 900 * 1024
"""Under the 1 MiB ConfigMap limit, with room for the object's metadata."""
TARGETS_PER_BUCKET = 5_000
"""About 250 KiB of JSON a bucket: a change re-encodes that much of the placements, and a
million targets make 200 buckets (a store cut in larger buckets keeps them within 4x)."""
MAX_RAW_BYTES = 1024 * 1024 * 1024
"""A head claiming a part larger than this is refused before decompressing."""


PartError = kvblob.BlobError
"""A part's pieces do not match the head (missing, torn or corrupt)."""
Part = kvblob.Blob
"""A part packed as the Consul store packs its blobs: one codec (``kvblob``) for both."""


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def encode(raw: bytes, *, piece_bytes: int = PIECE_BYTES) -> Part:
    return kvblob.encode(raw, chunk_bytes=piece_bytes)


def decode(pieces: Iterable[bytes], *, entry: Mapping[str, Any], name: str) -> bytes:
    """A part's raw bytes from its pieces, checked against its head ``entry``."""
    return kvblob.inflate(b"".join(pieces), digest=entry.get("digest"), size=entry.get("size"),
                          what=f"part {name}", limit=MAX_RAW_BYTES)  # fmt: skip


def object_names(prefix: str, *, generation: int, digest: str, count: int) -> list[str]:
    return [f"{prefix}-{generation}-{digest[:12]}-{i}" for i in range(count)]


def bucket_count(targets: int, *, current: int | None) -> int:
    """Buckets for ``targets`` identities; the current count is kept within a factor of 4,
    so a fleet that grows slowly does not re-cut (and rewrite) every part."""
    wanted = max(1, math.ceil(targets / TARGETS_PER_BUCKET))
    if current is not None and current >= 1 and current / 4 <= wanted <= current * 4:
        return current
    return wanted


def bucket_of(identity: str, buckets: int) -> int:
    return zlib.crc32(identity.encode()) % buckets


Members = list[list[str]]
"""Each bucket's identities, sorted: a list of the strings the assignment holds (8 bytes an
identity, where a set took 30 and a copy of the string 60 more at a million targets)."""


def bucket_members(identities: Iterable[str], buckets: int) -> Members:
    members: Members = [[] for _ in range(buckets)]
    for identity in identities:
        members[bucket_of(identity, buckets)].append(identity)
    for bucket in members:
        bucket.sort()
    return members


def add_member(members: list[str], identity: str) -> None:
    at = bisect_left(members, identity)
    if at == len(members) or members[at] != identity:
        members.insert(at, identity)


def drop_member(members: list[str], identity: str) -> None:
    at = bisect_left(members, identity)
    if at < len(members) and members[at] == identity:
        del members[at]


def bucket_part(targets: Mapping[str, str], weights: Mapping[str, int], members: Iterable[str]) -> bytes:
    """One bucket's raw part: its identities' shards and weights."""
    group: dict[str, dict[str, Any]] = {"targets": {}, "weights": {}}
    for identity in members:
        if identity in targets:
            group["targets"][identity] = targets[identity]
        if identity in weights:
            group["weights"][identity] = weights[identity]
    return dumps(group)


def core_part(doc: dict[str, Any]) -> bytes:
    """Everything but the assignment's targets and weights (dropped here if present)."""
    core = dict(doc)
    if isinstance(core.get("assignment"), dict):
        core["assignment"] = {k: v for k, v in core["assignment"].items() if k not in ("targets", "weights")}
    return dumps(core)


_SHARDS = "\x1egpufed-shards\x1e"
"""Stands in for the shards' JSON while the rest of a core is dumped (escaped: never data)."""


class CoreParts:
    """A state's core part (:func:`core_part` of its JSON document, byte for byte) with the
    assignment's shards encoded once per ``shards`` dict: a change that keeps the shard set
    shares that dict, and thousands of shards are most of the core."""

    def __init__(self) -> None:
        self._shards: tuple[object, bytes] | None = None

    def core(self, state: ControllerState) -> bytes:
        assignment = state.assignment
        if assignment is None:
            return core_part(state.model_dump(mode="json"))
        cached = self._shards
        if cached is None or cached[0] is not assignment.shards:
            shards = {name: info.model_dump(mode="json") for name, info in assignment.shards.items()}
            cached = self._shards = (assignment.shards, dumps(shards))
        doc = state.model_dump(mode="json", exclude={"assignment": {"targets", "weights", "shards"}})
        doc["assignment"]["shards"] = _SHARDS
        out = core_part(doc)
        token = dumps(_SHARDS)
        if out.count(token) != 1:  # cannot happen (the token is escaped); never splice blindly
            return core_part(state.model_dump(mode="json"))
        return out.replace(token, cached[1])


def split_state(
    doc: dict[str, Any], *, buckets: int, identities: Iterable[str] | None = None
) -> tuple[dict[str, bytes], Members]:
    """A state's JSON document (``model_dump(mode="json")``) as raw parts by name, and the
    identities of each bucket (what a delta save updates instead of re-cutting): the
    ``identities`` given (the assignment's own strings, not the document's copies), else
    the document's."""
    parts: dict[str, bytes] = {}
    members: Members = [[] for _ in range(buckets)]
    assignment = doc.get("assignment")
    if isinstance(assignment, dict):
        targets: dict[str, str] = assignment.get("targets", {})
        weights: dict[str, int] = assignment.get("weights", {})
        members = bucket_members(identities if identities is not None else {**weights, **targets}, buckets)
        for i, identities in enumerate(members):
            parts[f"targets-{i}"] = bucket_part(targets, weights, identities)
    parts["core"] = core_part(doc)
    return parts, members


def join_state(parts: Mapping[str, bytes]) -> dict[str, Any]:
    """The document :func:`split_state` was given."""
    if "core" not in parts:
        raise PartError("the head names no core part")
    doc: dict[str, Any] = json.loads(parts["core"])
    assignment = doc.get("assignment")
    if isinstance(assignment, dict):
        targets: dict[str, str] = {}
        weights: dict[str, int] = {}
        for name in sorted(parts):
            if name.startswith("targets-"):
                group = json.loads(parts[name])
                targets.update(group.get("targets", {}))
                weights.update(group.get("weights", {}))
        assignment["targets"], assignment["weights"] = targets, weights
    return doc


def split_sets(docs: Mapping[str, list[dict[str, Any]]], *, buckets: int) -> dict[str, bytes]:
    """The last known sets (source -> target documents) as raw parts by name.

    ``docs`` entries carry an ``identity`` key (added by the store, dropped on reading) that
    places them in a bucket; each bucket lists its entries per source in identity order.
    """
    grouped: list[dict[str, list[dict[str, Any]]]] = [{} for _ in range(buckets)]
    for source, entries in sorted(docs.items()):
        for group in grouped:
            group[source] = []
        for entry in sorted(entries, key=lambda e: str(e["identity"])):
            grouped[bucket_of(str(entry["identity"]), buckets)][source].append(
                {k: v for k, v in entry.items() if k != "identity"}
            )
    return {f"sets-{i}": dumps(group) for i, group in enumerate(grouped)}


def join_sets(parts: Mapping[str, bytes]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for name in sorted(parts):
        for source, entries in json.loads(parts[name]).items():
            out.setdefault(str(source), []).extend(entries if isinstance(entries, list) else [])
    return out
