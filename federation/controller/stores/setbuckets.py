"""The discovery sources' last known sets, cut in buckets by identity, so a change rewrites
the buckets it touched only (the shared stores' ``save_set_changes``).

Pure (no I/O). A store keeps a :class:`SetBuckets` mirror of what it wrote last, tagged
with the stored version it matches; a change (source -> identity -> target, None: gone)
updates the mirror and names the dirty buckets, whose bytes the store then writes. A bucket
is ``{source: [target document, ...]}`` in identity order, naming the sources it holds
entries of (``kube_parts.join_sets`` reads it; the Consul store stores one blob per bucket):
a source seen for the first time (the registry's first entry) dirties its buckets only.

The mirror holds each entry already encoded (its JSON bytes, not a document): a dirty
bucket's payload is those bytes joined, so a change encodes the entries it names, not the
bucket's 2,000, and the mirror of a million targets is bytes, not a million dicts.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
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


class SetBuckets:
    def __init__(self, *, count: int, sources: Sequence[str] = (), version: object = None) -> None:
        self.count = count
        self.version = version
        """The stored version these buckets match (a head's digest or resourceVersion)."""
        self.sources = set(sources)
        self.groups: list[dict[str, dict[str, bytes]]] = [
            {source: {} for source in self.sources} for _ in range(count)
        ]

    @classmethod
    def from_sets(
        cls, sets: Mapping[str, Sequence[Target]], *, current: int | None, version: object = None
    ) -> SetBuckets:
        total = sum(len(targets) for targets in sets.values())
        out = cls(count=bucket_count(total, current=current), sources=list(sets), version=version)
        for source, targets in sets.items():
            for target in targets:
                bucket = out.groups[bucket_of(target.identity, out.count)]
                bucket[source][target.identity] = _entry(target)
        return out

    @property
    def total(self) -> int:
        return sum(len(entries) for group in self.groups for entries in group.values())

    def fits(self, changes: Changes) -> bool:
        """The change keeps the bucket count (else the store writes whole sets, cut afresh)."""
        grown = self.total + sum(len(found) for found in changes.values())
        return bucket_count(grown, current=self.count) == self.count

    def apply(self, changes: Changes) -> set[int]:
        """Take ``changes`` in; the buckets whose bytes may differ now."""
        dirty: set[int] = set()
        for source, found in changes.items():
            for identity, target in found.items():
                index = bucket_of(identity, self.count)
                entries = self.groups[index].setdefault(source, {})
                if target is None:
                    if entries.pop(identity, None) is not None:
                        dirty.add(index)
                else:
                    entries[identity] = _entry(target)
                    dirty.add(index)
        return dirty

    def payload(self, index: int) -> bytes:
        """``dumps({source: [document, ...]})`` in identity order, byte for byte, from the
        entries' bytes."""
        parts = [
            dumps(source) + b":[" + b",".join([found[i] for i in sorted(found)]) + b"]"
            for source, found in sorted(self.groups[index].items())
            if found
        ]
        return b"{" + b",".join(parts) + b"}"

    def payloads(self) -> dict[int, bytes]:
        return {index: self.payload(index) for index in range(self.count)}
