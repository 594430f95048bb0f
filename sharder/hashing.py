"""Stable hashes for the sharder, and Prometheus' ``hashmod`` for comparison.

Everything the assignment depends on is hashed here, with xxh3-64 (fast, fixed across
platforms and processes), never with the built-in ``hash()``, which is salted per
process. ``sharder.assign`` builds its ring from :func:`ring_points` and keys targets on
:func:`key_hash` of their identity; changing either changes every placement, so both are
covered by ``ALGORITHM_VERSION`` in ``sharder.assign``.

:func:`hashmod` reproduces Prometheus' ``action: hashmod`` relabelling exactly, so that
benchmarks can compare our movement with the classic ``hashmod``/``keep`` sharding.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterator, Sequence
from functools import partial
from itertools import accumulate, chain, compress, count, repeat
from operator import rshift

import xxhash

_xxh3 = xxhash.xxh3_64_intdigest


def key_hash(key: str) -> int:
    """64-bit position of a target on the ring; identical in every process."""
    return _xxh3(key.encode())


def key_hashes(keys: Sequence[str]) -> list[int]:
    """:func:`key_hash` of many keys; one call so the hot loop stays in C."""
    return [_xxh3(raw) for raw in map(str.encode, keys)]


def ring_points(shard: str, count: int) -> list[int]:
    """Positions of a shard's ``count`` virtual nodes: xxh3 of its name, seeded 0..count-1.

    Seeding by the vnode index keeps points of one shard independent of every other
    shard's, so adding a shard inserts points and moves none.
    """
    raw = shard.encode()
    return [_xxh3(raw, seed) for seed in range(count)]


_BUCKET_BITS = 16
_SHIFT = 64 - _BUCKET_BITS


class Ring:
    """A consistent-hash ring: sorted vnode positions and the shard index owning each.

    :meth:`owners_of` looks most keys up in a table of 2^16 equal slices of the hash
    space: a slice holding no vnode has one owner for all its keys, so only keys in the
    other slices need a binary search (with 128 vnodes on 100 shards, about one in five).
    """

    __slots__ = ("_table", "owners", "positions")

    def __init__(self, shards: Sequence[str], *, vnodes: int) -> None:
        # Packing owner into the low bits lets one int sort do the work of a tuple sort;
        # ties between equal positions (astronomically rare) then break by shard index.
        width = max(1, len(shards)).bit_length()
        packed = sorted(
            (point << width) | index
            for index, shard in enumerate(shards)
            for point in ring_points(shard, vnodes)
        )
        mask = (1 << width) - 1
        self.positions: list[int] = [p >> width for p in packed]
        self.owners: list[int] = [p & mask for p in packed]
        self._table: list[int] | None = None

    def _slices(self) -> list[int]:
        """Per slice of the hash space, the owner of all its keys, or -1 if it holds a vnode."""
        if self._table is None:
            counts = [0] * (1 << _BUCKET_BITS)
            for position in self.positions:
                counts[position >> _SHIFT] += 1
            wrapped = [*self.owners, self.owners[0]]
            # A key in an empty slice b belongs to the first vnode after it: index starts[b].
            starts = accumulate(counts, initial=0)
            self._table = [wrapped[s] if not c else -1 for s, c in zip(starts, counts, strict=False)]
        return self._table

    def owners_of(self, points: Sequence[int]) -> list[int]:
        """:meth:`primary` of many points; equal to it, only faster."""
        if not self.positions:
            raise ValueError("a ring without shards owns nothing")
        found = list(map(self._slices().__getitem__, map(rshift, points, repeat(_SHIFT))))
        positions, wrapped = self.positions, [*self.owners, self.owners[0]]
        for j in compress(count(), map((-1).__eq__, found)):
            found[j] = wrapped[bisect.bisect_right(positions, points[j])]
        return found

    def __len__(self) -> int:
        return len(self.positions)

    def slot(self, point: int) -> int:
        """Index of the first vnode clockwise from ``point`` (wrapping round)."""
        index = bisect.bisect_right(self.positions, point)
        return 0 if index == len(self.positions) else index

    def primary(self, point: int) -> int:
        """Shard index that owns ``point`` when no shard is full."""
        return self.owners[self.slot(point)]

    def slots(self, points: Sequence[int]) -> list[int]:
        """:meth:`slot` of many points, in one C-level pass."""
        size = len(self.positions)
        found = list(map(partial(bisect.bisect_right, self.positions), points))
        if size and size in found:
            return [0 if s == size else s for s in found]
        return found

    def clockwise(self, slot: int) -> Iterator[int]:
        """Shard indices of the vnodes from ``slot`` on, wrapping round once."""
        owners = self.owners
        return map(owners.__getitem__, chain(range(slot, len(owners)), range(slot)))


def rendezvous_seeds(shards: Sequence[str]) -> list[int]:
    """Per-shard seeds for rendezvous (highest random weight) hashing."""
    return [_xxh3(shard.encode()) for shard in shards]


def _scores(point: int, seeds: Sequence[int]) -> list[int]:
    raw = point.to_bytes(8, "big")
    return [_xxh3(raw, seed) for seed in seeds]


def rendezvous_winner(point: int, seeds: Sequence[int]) -> int:
    """Index of the shard with the highest score for a key hash (ties: lowest index)."""
    scores = _scores(point, seeds)
    return scores.index(max(scores))


def rendezvous_ranking(point: int, seeds: Sequence[int]) -> list[int]:
    """Shard indices from highest score to lowest (ties: lowest index first)."""
    scores = _scores(point, seeds)
    return sorted(range(len(seeds)), key=lambda i: (-scores[i], i))


def hashmod(values: Sequence[str], modulus: int, *, separator: str = ";") -> int:
    """Prometheus ``hashmod``: MD5 of the joined source label values, low 8 bytes, mod N.

    Prometheus takes bytes 8..15 of the digest as a big-endian uint64 ("the last 8 bytes,
    to give the same result as earlier versions"), see ``model/relabel/relabel.go``.
    """
    if modulus < 1:
        raise ValueError(f"hashmod modulus must be at least 1, got {modulus}")
    digest = hashlib.md5(separator.join(values).encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % modulus
