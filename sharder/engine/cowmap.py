"""A read-only mapping whose next version costs the change, not the size: copy-on-write buckets.

The incremental engine makes a new assignment per registration; its ``targets`` and
``weights`` (identity -> shard, identity -> weight) differ from the previous one's in a
few keys, and a flat ``dict`` copy per change is a pass over the fleet (about 3 ms to copy
and 2.5 ms to free 300,000 entries, for each of the maps). A :class:`CowMap` keeps its
keys in buckets of plain dicts; :meth:`CowMap.evolve` copies the tuple of buckets and the
buckets the change touches, and shares every other bucket with the version it came from.
Both versions stay valid and never change (a reader in another thread may iterate either).

Buckets are chosen by a CRC-32 of the key, so two processes put a key in the same bucket;
iteration order is bucket by bucket (insertion order within one), like a dict's order
only in being stable for one object. Serialisers that need bytes sort, as before.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from typing import Any, TypeVar, cast

V = TypeVar("V")

DELETE: Any = object()
"""A value in :meth:`CowMap.evolve`'s changes: the key is removed."""

MIN_BUCKET = 256
"""Keys a bucket is sized for: a map of fewer stays one bucket (a small fleet pays nothing)."""


def bucket_count(size: int) -> int:
    """A power of two near ``size / MIN_BUCKET``, at least 1 (so a change copies a bucket of
    a few hundred keys and a tuple of about as many)."""
    count = 1
    while count * MIN_BUCKET * 2 <= size:
        count *= 2
    return count


def _slot(key: str, mask: int) -> int:
    return zlib.crc32(key.encode()) & mask if mask else 0


class CowMap(Mapping[str, V]):
    """Immutable ``str`` -> value mapping; :meth:`evolve` shares the untouched buckets."""

    __slots__ = ("_buckets", "_mask", "_size")

    def __init__(
        self, data: Mapping[str, V] | Iterable[tuple[str, V]] = (), *, buckets: int | None = None
    ) -> None:
        items = list(data.items()) if isinstance(data, Mapping) else list(data)
        count = buckets if buckets is not None else bucket_count(len(items))
        if count < 1 or count & (count - 1):
            raise ValueError(f"buckets must be a power of two, got {count}")
        parts: list[dict[str, V]] = [{} for _ in range(count)]
        mask = count - 1
        for key, value in items:
            parts[_slot(key, mask)][key] = value
        self._buckets: tuple[dict[str, V], ...] = tuple(parts)
        self._mask = mask
        self._size = sum(len(p) for p in parts)

    @classmethod
    def of(cls, data: Mapping[str, V]) -> CowMap[V]:
        """``data`` itself when it is a :class:`CowMap`, else one built from it."""
        return data if isinstance(data, CowMap) else cls(data)

    def evolve(self, changes: Mapping[str, V]) -> CowMap[V]:
        """A new map: this one with ``changes`` applied (a value of :data:`DELETE` removes
        the key; removing a missing key is a no-op). Only the buckets the changes touch are
        copied; this map is left as it was. A map that grew to four times what its buckets
        are sized for is bucketed again (an empty map filled by one big change)."""
        if not changes:
            return self
        parts = list(self._buckets)
        copied: set[int] = set()
        size, mask = self._size, self._mask
        for key, value in changes.items():
            at = _slot(key, mask)
            if at not in copied:
                parts[at] = dict(parts[at])
                copied.add(at)
            bucket = parts[at]
            if value is DELETE:
                if key in bucket:
                    del bucket[key]
                    size -= 1
            else:
                size += key not in bucket
                bucket[key] = value
        out = cast(CowMap[V], CowMap.__new__(CowMap))
        out._buckets, out._mask, out._size = tuple(parts), mask, size
        if bucket_count(size) >= 4 * len(parts):  # grown past its buckets (built small): once per 4x
            return CowMap(out.items())
        return out

    def shares_bucket_with(self, other: CowMap[Any], key: str) -> bool:
        """Whether ``key``'s bucket is the same object in both (for tests: untouched buckets
        are shared, not copied)."""
        if other._mask != self._mask:
            return False
        at = _slot(key, self._mask)
        return self._buckets[at] is other._buckets[at]

    def __getitem__(self, key: str) -> V:
        return self._buckets[_slot(key, self._mask)][key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._buckets[_slot(key, self._mask)].get(key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._buckets[_slot(key, self._mask)]

    def __iter__(self) -> Iterator[str]:
        return itertools.chain.from_iterable(self._buckets)

    def __len__(self) -> int:
        return self._size

    def items(self) -> ItemsView[str, V]:
        return _Items(self)

    def values(self) -> ValuesView[V]:
        return _Values(self)

    def __repr__(self) -> str:
        return f"CowMap({self._size} keys in {len(self._buckets)} buckets)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (CowMap, (dict(self.items()),))


class _Items(ItemsView[str, Any]):
    """``items()`` at C speed (a chain of the buckets' own views); set operations as any
    mapping's view."""

    _mapping: CowMap[Any]

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return itertools.chain.from_iterable(b.items() for b in self._mapping._buckets)


class _Values(ValuesView[Any]):
    _mapping: CowMap[Any]

    def __iter__(self) -> Iterator[Any]:
        return itertools.chain.from_iterable(b.values() for b in self._mapping._buckets)
