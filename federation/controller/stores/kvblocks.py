"""Placement blocks: a stored assignment's targets split per shard, so a change rewrites
only the shards it touched (``consul_store``'s delta writes).

Pure (no I/O). A block is one shard's ``identity -> weight`` map (``null``: no weight
recorded), JSON with sorted keys, stored as a ``kvblob`` under
``<prefix>/state-blocks/<generation>-<digest16>/``. The state document names each shard's
block by ``[generation, digest, chunks, size]``; a block whose bytes did not change keeps
its name, so an unchanged shard is never written again, and a reader re-reads only the
blocks whose digest it has not seen.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Mapping

from federation.controller.stores import kvblob
from sharder.engine.assignment import Assignment

Members = dict[str, int | None]
"""identity -> weight of one shard's targets."""
Blocks = dict[str, Members]
"""shard -> its members."""
Descriptor = list[int | str]
"""[generation, digest, chunks, size]: where a block lives and how to check it."""


class BlockError(ValueError):
    """A block or a descriptor that does not have the expected shape."""


def split(assignment: Assignment) -> Blocks:
    """Every shard's members (empty shards included)."""
    out: Blocks = {shard: {} for shard in assignment.shards}
    weights = assignment.weights
    for identity, shard in assignment.targets.items():
        out.setdefault(shard, {})[identity] = weights.get(identity)
    return out


def update(
    blocks: Blocks, base: Assignment, new: Assignment, touched: Collection[str]
) -> tuple[Blocks, set[str]]:
    """``blocks`` (the members of ``base``) moved on to ``new``, knowing that only the
    ``touched`` identities may differ: a new map sharing every untouched shard's members
    (``blocks`` itself is left as it was), and the shards whose members changed."""
    out = dict(blocks)
    copied: dict[str, Members] = {}

    def writable(shard: str) -> Members:
        if shard not in copied:
            copied[shard] = out[shard] = dict(out.get(shard, {}))
        return copied[shard]

    for shard in new.shards.keys() - out.keys():
        writable(shard)
    for identity in touched:
        was, now = base.targets.get(identity), new.targets.get(identity)
        weight = new.weights.get(identity)
        if was is not None and was != now:
            writable(was).pop(identity, None)
        if now is not None and (was != now or out.get(now, {}).get(identity, -1) != weight):
            writable(now)[identity] = weight
    for shard in [s for s in out if s not in new.shards and not out[s]]:
        del out[shard]
        copied.setdefault(shard, {})
    return out, set(copied)


def encode(members: Mapping[str, int | None], *, chunk_bytes: int) -> kvblob.Blob:
    payload = json.dumps(dict(sorted(members.items())), separators=(",", ":")).encode()
    return kvblob.encode(payload, chunk_bytes=chunk_bytes)


def describe(blob: kvblob.Blob, *, generation: int) -> Descriptor:
    return [generation, blob.digest, len(blob.parts), blob.raw_size]


def head_of(descriptor: object) -> dict[str, object]:
    """The fields ``kvblob.decode`` checks, from a descriptor (``BlockError`` when malformed)."""
    if (
        not isinstance(descriptor, list)
        or len(descriptor) != 4
        or not isinstance(descriptor[0], int)
        or not isinstance(descriptor[1], str)
        or not isinstance(descriptor[2], int)
        or not isinstance(descriptor[3], int)
    ):
        raise BlockError(f"not a block descriptor: {descriptor!r:.100}")
    generation, digest, chunks, size = descriptor
    return {"generation": generation, "digest": digest, "chunks": chunks, "size": size}


def members_of(payload: bytes) -> Members:
    """A block's members; identities are interned (the targets' own keys are the same strings)."""
    doc = json.loads(payload)
    if not isinstance(doc, dict) or not all(w is None or isinstance(w, int) for w in doc.values()):
        raise BlockError("a placement block is not a map of identity -> weight")
    return {sys.intern(str(identity)): weight for identity, weight in doc.items()}


def assemble(blocks: Mapping[str, Members]) -> tuple[dict[str, str], dict[str, int]]:
    """(identity -> shard, identity -> weight) of an assignment, from its blocks."""
    targets: dict[str, str] = {}
    weights: dict[str, int] = {}
    for shard, members in blocks.items():
        name = sys.intern(shard)
        for identity, weight in members.items():
            targets[identity] = name
            if weight is not None:
                weights[identity] = weight
    return targets, weights
