"""The discovery sources' last known sets, cut in buckets by identity, so a change rewrites
the buckets it touched only (the shared stores' ``save_set_changes``).

Pure (no I/O). A store keeps a :class:`SetBuckets` mirror of what it wrote last, tagged
with the stored version it matches; a change (source -> identity -> target, None: gone)
updates the mirror and names the dirty buckets, whose bytes the store then writes. A bucket
is ``{source: [target document, ...]}`` in identity order, naming the sources it holds
entries of (``kube_parts.join_sets`` reads it; the Consul store stores one blob per bucket):
a source seen for the first time (the registry's first entry) dirties its buckets only.

The mirror holds each entry already encoded (its JSON bytes, not a document), packed per
bucket and source (:class:`Packed`: one compressed bytes object and 4 bytes an entry): a
dirty bucket's payload joins them, so a change encodes the entries it names, not the
bucket's 2,000, and the mirror of a million targets is a few hundred bytes objects, not a
million.
"""

from __future__ import annotations

import json
import math
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sharder.model.inventory import Target
from sharder.sources.lastknown import target_document

TARGETS_PER_BUCKET = 2_000
"""About 0.3 MB of JSON a bucket: one registration rewrites that, not the fleet."""

Changes = Mapping[str, Mapping[str, Target | None]]


def bucket_of(identity: str, buckets: int) -> int:
    return zlib.crc32(identity.encode()) % buckets


def bucket_count(targets: int, *, current: int | None) -> int:
    """Buckets for ``targets`` entries; a current count within a factor of 4 is kept, so a
    fleet that grows slowly does not re-cut (and rewrite) every bucket."""
    wanted = max(1, math.ceil(targets / TARGETS_PER_BUCKET))
    if current is not None and current >= 1 and current / 4 <= wanted <= current * 4:
        return current
    return wanted


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def dumps(doc: Any) -> bytes:
    return _ENCODER.encode(doc).encode()


def _entry(target: Target) -> bytes:
    return _ENCODER.encode(target_document(target)).encode()


@dataclass(frozen=True)
class Packed:
    """One source's entries in one bucket, kept zlib-compressed (level 1): their identities
    (a JSON list) and their encoded documents joined by commas (the inside of the JSON
    array), with where each document starts (plus the end, one past the last).

    Compressed because it is held for the process's life: at a million targets the
    documents were about 140 MiB and the identities' strings (a copy of each, made for the
    mirror) 60 more, where this is under 40 MiB. A change unpacks the buckets it touches
    only (``SetBuckets.apply``, ``payload``): a few hundred KiB, a millisecond or two."""

    count: int
    blob: bytes
    starts: array[int]

    @classmethod
    def of(cls, entries: Mapping[str, bytes]) -> Packed:
        ids = sorted(entries)
        starts, at = array("I"), 0
        for identity in ids:
            starts.append(at)
            at += len(entries[identity]) + 1
        starts.append(at)
        content = b",".join([entries[i] for i in ids])
        blob = zlib.compress(_ENCODER.encode(ids).encode() + b"\n" + content, 1)  # JSON holds no newline
        return cls(count=len(ids), blob=blob, starts=starts)

    def _unpacked(self) -> tuple[bytes, bytes]:
        ids, _, content = zlib.decompress(self.blob).partition(b"\n")
        return ids, content

    @property
    def ids(self) -> list[str]:
        """The identities, in order."""
        ids: list[str] = json.loads(self._unpacked()[0])
        return ids

    @property
    def content(self) -> bytes:
        return self._unpacked()[1]

    def entries(self) -> dict[str, bytes]:
        raw_ids, content = self._unpacked()
        starts = self.starts
        return {i: content[starts[k] : starts[k + 1] - 1] for k, i in enumerate(json.loads(raw_ids))}


EMPTY_SOURCE = Packed.of({})


class SetBuckets:
    def __init__(self, *, count: int, sources: Sequence[str] = (), version: object = None) -> None:
        self.count = count
        self.version = version
        """The stored version these buckets match (a head's digest or resourceVersion)."""
        self.sources = set(sources)
        self.groups: list[dict[str, Packed]] = [
            dict.fromkeys(self.sources, EMPTY_SOURCE) for _ in range(count)
        ]

    @classmethod
    def from_sets(
        cls, sets: Mapping[str, Sequence[Target]], *, current: int | None, version: object = None
    ) -> SetBuckets:
        """Cut bucket by bucket (a bucket's entries are encoded, then packed: at most one
        bucket's worth of separate entries lives at once)."""
        total = sum(len(targets) for targets in sets.values())
        out = cls(count=bucket_count(total, current=current), sources=list(sets), version=version)
        for source, targets in sets.items():
            placed: list[list[Target]] = [[] for _ in range(out.count)]
            for target in targets:
                placed[bucket_of(target.identity, out.count)].append(target)
            for index, members in enumerate(placed):
                if members:
                    out.groups[index][source] = Packed.of({t.identity: _entry(t) for t in members})
        return out

    @property
    def total(self) -> int:
        return sum(packed.count for group in self.groups for packed in group.values())

    def fits(self, changes: Changes) -> bool:
        """The change keeps the bucket count (else the store writes whole sets, cut afresh)."""
        grown = self.total + sum(len(found) for found in changes.values())
        return bucket_count(grown, current=self.count) == self.count

    def apply(self, changes: Changes) -> set[int]:
        """Take ``changes`` in; the buckets whose bytes may differ now."""
        dirty: set[int] = set()
        for source, found in changes.items():
            by_bucket: dict[int, list[tuple[str, Target | None]]] = {}
            for identity, target in found.items():
                by_bucket.setdefault(bucket_of(identity, self.count), []).append((identity, target))
            for index, named in by_bucket.items():
                group = self.groups[index]
                entries = group.get(source, EMPTY_SOURCE).entries()
                changed = False
                for identity, target in named:
                    if target is None:
                        changed |= entries.pop(identity, None) is not None
                    else:
                        entries[identity], changed = _entry(target), True
                group[source] = Packed.of(entries) if changed or source not in group else group[source]
                if changed:
                    dirty.add(index)
        return dirty

    def payload(self, index: int) -> bytes:
        """``dumps({source: [document, ...]})`` in identity order, byte for byte, from the
        entries' bytes."""
        parts = [
            dumps(source) + b":[" + packed.content + b"]"
            for source, packed in sorted(self.groups[index].items())
            if packed.count
        ]
        return b"{" + b",".join(parts) + b"}"

    def payloads(self) -> dict[int, bytes]:
        return {index: self.payload(index) for index in range(self.count)}


def rebuilt(stored: Mapping[str, Sequence[Target]], changes: Changes, *, current: int | None) -> SetBuckets:
    """The ``stored`` sets with ``changes`` applied, cut afresh: what a shared store writes
    when its mirror does not match the stored sets (a first change, another writer's
    sets, a count that no longer fits)."""
    sets = {name: {t.identity: t for t in targets} for name, targets in stored.items()}
    for name, found in changes.items():
        entries = sets.setdefault(name, {})
        for identity, target in found.items():
            if target is None:
                entries.pop(identity, None)
            else:
                entries[identity] = target
    return SetBuckets.from_sets({name: list(found.values()) for name, found in sets.items()}, current=current)
