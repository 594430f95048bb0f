"""Stable hashes for the sharder, and Prometheus' ``hashmod`` for comparison.

Everything the assignment depends on is hashed here, with xxh3-64 (fast, fixed across
platforms and processes), never with the built-in ``hash()``, which is salted per
process. ``sharder.engine.assigning`` builds its ring from :func:`ring_points` and keys targets on
:func:`key_hash` of their identity; changing either changes every placement, so both are
covered by ``ALGORITHM_VERSION`` in ``sharder.engine.assigning``.

:func:`hashmod` reproduces Prometheus' ``action: hashmod`` relabelling exactly, so that
benchmarks can compare our movement with the classic ``hashmod``/``keep`` sharding.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain, repeat
from operator import and_, rshift

import xxhash

_xxh3 = xxhash.xxh3_64_intdigest


def key_hash(key: str) -> int:
    """64-bit position of a target on the ring; identical in every process."""
    return _xxh3(key.encode())


def key_hashes(keys: Sequence[str]) -> list[int]:
    """:func:`key_hash` of many keys; one call so the hot loop stays in C."""
    return list(map(_xxh3, map(str.encode, keys)))


def ring_points(shard: str, count: int) -> list[int]:
    """Positions of a shard's ``count`` virtual nodes: xxh3 of its name, seeded 0..count-1.

    Seeding by the vnode index keeps points of one shard independent of every other
    shard's, so adding a shard inserts points and moves none.
    """
    raw = shard.encode()
    return [_xxh3(raw, seed) for seed in range(count)]


class Ring:
    """A consistent-hash ring, read through a table of equal slices of the hash space.

    The vnodes sit at their exact positions (sorted, with the shard index owning each),
    but a key is placed by the *slice* it falls in: 2^k equal slices (k from 16 to 20,
    about four slices per vnode), each owned by the first vnode at or after the slice's
    start. Looking a key up is then one shift and one list index, run in C for a whole
    fleet, instead of a binary search per key. Adding a shard only inserts vnodes, so
    only slices whose first vnode is a new one change owner, to the new shard: the ring
    stays consistent. The slicing is part of the placement, so covered by the strategy's
    version in ``sharder.engine.assigning``.
    """

    __slots__ = ("__weakref__", "_by_shard", "_shards", "_shift", "owners", "positions", "slice_owners",
                 "slice_slots")  # fmt: skip

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
        self._shards = len(shards)
        self._by_shard: array[int] | None = None
        # Arrays, not lists: a list holds an int object per entry (36 bytes for a position,
        # 28 for an index past 256, plus the pointer), and a million targets' rings held
        # about 290 MiB that way (3 regions of 680,000 vnodes and 2^20 slices each); 8 bytes
        # a position and 4 an index now (issue #44). Built from iterators: no list of them.
        self.positions: array[int] = array("Q", map(rshift, packed, repeat(width)))
        self.owners: array[int] = array("I", map(and_, packed, repeat(mask)))
        del packed
        size = len(self.positions)
        bits = min(20, max(16, size.bit_length() + 2))
        self._shift = 64 - bits
        counts = [0] * (1 << bits)  # small ints: shared objects
        for position in self.positions:
            counts[position >> self._shift] += 1
        # Vnodes before slice b = index of the first vnode at or after its start; past the
        # last vnode the ring wraps to the first.
        slots = array("I", accumulate(counts[:-1], initial=0))
        del counts
        past = bisect.bisect_left(slots, size)  # slices after the last vnode
        slots[past:] = array("I", bytes(4 * (len(slots) - past)))
        self.slice_slots: array[int] = slots
        self.slice_owners: array[int] = array("I", map(self.owners.__getitem__, slots) if size else ())

    def __len__(self) -> int:
        return len(self.positions)

    def slot(self, point: int) -> int:
        """Index of the first vnode a key at ``point`` meets going clockwise."""
        return self.slice_slots[point >> self._shift]

    def primary(self, point: int) -> int:
        """Shard index that owns ``point`` when no shard is full."""
        return self.slice_owners[point >> self._shift]

    def owners_of(self, points: Sequence[int]) -> list[int]:
        """:meth:`primary` of many points, in one C-level pass."""
        return list(map(self.slice_owners.__getitem__, map(rshift, points, repeat(self._shift))))

    def clockwise(self, slot: int) -> Iterator[int]:
        """Shard indices of the vnodes from ``slot`` on, wrapping round once."""
        owners = self.owners
        return map(owners.__getitem__, chain(range(slot, len(owners)), range(slot)))

    def first_fitting(self, slot: int, load: Sequence[int], room: int, *, scan: int = 256) -> int:
        """``next((s for s in clockwise(slot) if load[s] <= room), -1)``, found without a walk
        round the ring when few shards have room (a fleet of full shards: 12 nodes a child
        leaves only a handful with room, and the walk passed most of a million vnodes): the
        first ``scan`` vnodes one by one, then, per shard with room, its first vnode from
        ``slot`` on (a binary search over its own vnodes), the nearest of those winning."""
        owners = self.owners
        size = len(owners)
        for i in range(slot, min(size, slot + scan)):
            if load[owners[i]] <= room:
                return owners[i]
        free = [s for s, held in enumerate(load) if held <= room]
        if not free or not size:
            return -1
        by_shard = self.vnodes_by_shard()
        per = size // self._shards
        best = 2 * size
        for shard in free:
            lo, hi = shard * per, (shard + 1) * per
            k = bisect.bisect_left(by_shard, slot, lo, hi)
            at = by_shard[k] if k < hi else by_shard[lo] + size  # wrapped round
            best = min(best, at)
        return owners[best % size]

    def vnodes_by_shard(self) -> array[int]:
        """Vnode indices grouped by shard (each shard's ``vnodes`` of them, ascending), built
        once per ring when first needed: 4 bytes a vnode."""
        if self._by_shard is None:
            owners = self.owners
            self._by_shard = array("I", sorted(range(len(owners)), key=owners.__getitem__))
        return self._by_shard


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


_RINGS: weakref.WeakValueDictionary[tuple[tuple[str, ...], int], Ring] = weakref.WeakValueDictionary()
_RECENT: OrderedDict[tuple[tuple[str, ...], int], Ring] = OrderedDict()
_KEEP_RECENT = 3
_RINGS_LOCK = threading.Lock()


def shared_ring(shards: tuple[str, ...], *, vnodes: int) -> Ring:
    """The ring over ``shards``, one object per shard set for everyone who asks: the
    placement, the incremental engine and the read paths (why does this target sit on that
    shard?, asked per request). A ring of a million targets' region is about 130 MiB, and
    each of them building its own (or a cache keeping every shard set it saw after a region
    grew) was much of the memory the first changes added (issue #44). Held as long as a
    user holds it, plus the last ``_KEEP_RECENT`` asked for (a follower's reads)."""
    key = (shards, vnodes)
    with _RINGS_LOCK:
        ring = _RINGS.get(key)
    if ring is None:
        built = Ring(shards, vnodes=vnodes)  # outside the lock: seconds at a million
        with _RINGS_LOCK:
            ring = _RINGS.setdefault(key, built)
    with _RINGS_LOCK:
        _RECENT[key] = ring
        _RECENT.move_to_end(key)
        while len(_RECENT) > _KEEP_RECENT:
            _RECENT.popitem(last=False)
    return ring
