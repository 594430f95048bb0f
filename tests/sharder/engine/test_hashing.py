"""Stable hashes and the exact reproduction of Prometheus' ``hashmod`` relabel action."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharder.engine.hashing import (
    Ring,
    hashmod,
    key_hash,
    rendezvous_ranking,
    rendezvous_seeds,
    rendezvous_winner,
    ring_points,
    shared_ring,
)

# From prometheus/prometheus model/relabel/relabel_test.go, TestRelabel: a hashmod rule
# with modulus 1000 and separator ";" sets the target label to these values.
PROMETHEUS_VECTORS = [
    (["baz"], 1000, 976),  # source_labels [c], c="baz" -> d="976"
    (["foo\nbar"], 1000, 734),  # source_labels [a], a="foo\nbar" -> b="734"
]


@pytest.mark.parametrize(("values", "modulus", "expected"), PROMETHEUS_VECTORS)
def test_hashmod_matches_prometheus_test_vectors(values: list[str], modulus: int, expected: int) -> None:
    assert hashmod(values, modulus) == expected


def test_hashmod_joins_source_labels_with_the_separator() -> None:
    assert hashmod(["a", "b"], 7) == hashmod(["a;b"], 7)
    assert hashmod(["a", "b"], 1000, separator=",") == hashmod(["a,b"], 1000)


@given(st.lists(st.text(max_size=20), min_size=1, max_size=3), st.integers(min_value=1, max_value=2**64 - 1))
@settings(max_examples=50, deadline=None)
def test_hashmod_is_low_eight_md5_bytes_big_endian(values: list[str], modulus: int) -> None:
    digest = hashlib.md5(";".join(values).encode()).digest()
    assert hashmod(values, modulus) == int.from_bytes(digest[8:16], "big") % modulus


def test_hashmod_refuses_a_zero_modulus() -> None:
    with pytest.raises(ValueError, match="hashmod modulus must be at least 1, got 0"):
        hashmod(["x"], 0)


def test_key_hash_and_ring_points_are_pinned() -> None:
    """These values are part of bounded-ring (v1 and v2): changing them needs a new algorithm_version."""
    assert key_hash("10.0.0.1:9400") == 8787868372495930868
    assert ring_points("cn-beijing-0", 2) == [3963773915032914100, 17766971323521326534]


def test_ring_is_sorted_and_gives_each_shard_its_vnodes() -> None:
    ring = Ring(["a-0", "a-1", "a-2"], vnodes=64)
    assert list(ring.positions) == sorted(ring.positions)
    assert len(ring) == 192
    assert sorted(ring.owners.count(i) for i in range(3)) == [64, 64, 64]


def test_adding_a_shard_keeps_every_existing_point() -> None:
    small = Ring(["a-0", "a-1"], vnodes=32)
    big = Ring(["a-0", "a-1", "a-2"], vnodes=32)
    old = set(zip(small.positions, small.owners, strict=True))
    assert old <= set(zip(big.positions, big.owners, strict=True))


def first_vnode_at_or_after(ring: Ring, point: int) -> int:
    """The slot the ring's slice table must give, found by a plain search."""
    start = point >> (64 - 16) << (64 - 16)  # 2^16 slices for rings under 2^14 vnodes
    return next((i for i, p in enumerate(ring.positions) if p >= start), 0)


@given(st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=50))
@settings(max_examples=50, deadline=None)
def test_a_key_belongs_to_the_first_vnode_from_the_start_of_its_slice(points: list[int]) -> None:
    ring = Ring(["a-0", "a-1", "a-2"], vnodes=16)
    points += [0, 2**64 - 1, *ring.positions[:3], ring.positions[-1], ring.positions[-1] + 1]
    for point in points:
        slot = first_vnode_at_or_after(ring, point)
        assert ring.slot(point) == slot
        assert ring.primary(point) == ring.owners[slot]
    assert ring.owners_of(points) == [ring.primary(p) for p in points]
    assert ring.primary(2**64 - 1) == ring.owners[0]  # past the last vnode: wraps round


@given(st.lists(st.integers(min_value=0, max_value=2**64 - 1), min_size=1, max_size=200))
@settings(max_examples=50, deadline=None)
def test_adding_a_shard_moves_keys_only_to_it(points: list[int]) -> None:
    names = [f"r-{i}" for i in range(9)]
    small, big = Ring(names[:8], vnodes=128), Ring(names, vnodes=128)
    for before, after in zip(small.owners_of(points), big.owners_of(points), strict=True):
        assert after in (before, 8)


@given(st.integers(min_value=0, max_value=2**64 - 1))
@settings(max_examples=50, deadline=None)
def test_rendezvous_winner_heads_its_ranking(point: int) -> None:
    seeds = rendezvous_seeds([f"a-{i}" for i in range(7)])
    ranking = rendezvous_ranking(point, seeds)
    assert sorted(ranking) == list(range(7))
    assert ranking[0] == rendezvous_winner(point, seeds)


@pytest.mark.parametrize("seed", range(6))
def test_first_fitting_is_the_first_clockwise_shard_with_room(seed: int) -> None:
    """The shortcut over the ring (few shards with room) answers what the walk answers."""
    rng = random.Random(seed)
    names = [f"s-{i}" for i in range(rng.randint(1, 60))]
    ring = Ring(names, vnodes=16)
    for _ in range(40):
        load = [rng.choice((96, 96, 96, 88, 104)) for _ in names]
        room = rng.choice((80, 88, 96))
        slot = rng.randrange(len(ring))
        walked = next((s for s in ring.clockwise(slot) if load[s] <= room), -1)
        assert ring.first_fitting(slot, load, room, scan=rng.choice((0, 3, 256))) == walked


def test_a_shared_ring_is_one_object_per_shard_set_and_goes_when_nobody_holds_it() -> None:
    import gc
    import weakref

    from sharder.engine import hashing

    names = tuple(f"shared-{i}" for i in range(5))
    ring = shared_ring(names, vnodes=8)
    assert shared_ring(tuple(list(names)), vnodes=8) is ring  # an equal tuple, the same ring
    assert shared_ring(names, vnodes=16) is not ring
    gone = weakref.ref(ring)
    del ring
    for k in range(hashing._KEEP_RECENT):  # pushed out of the recent few
        shared_ring((f"other-{k}",), vnodes=8)
    gc.collect()
    assert gone() is None
