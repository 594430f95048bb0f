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
from itertools import chain

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


class Ring:
    """A consistent-hash ring: sorted vnode positions and the shard index owning each."""

    __slots__ = ("owners", "positions")

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
