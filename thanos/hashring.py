"""A reproduction of Thanos Receive's series placement, for the bench and for tests.

Same hash and ring layout as ``pkg/receive/hashring.go`` (facts, re-implemented here):

* a series hashes to xxhash64 of ``tenant 0xff (name 0xff value 0xff)*`` over its labels
  sorted by name (``labelpb.HashWithPrefix``);
* ketama: each endpoint owns 1000 sections at xxhash64 of ``"<address>:<i>"``, i = 1..1000;
  a series goes to the first section at or after its hash (wrapping), and that section's
  replicas are the next distinct endpoints clockwise, spread evenly over availability zones;
* hashmod: endpoints sorted by address, series to ``(hash + n) mod len``.

Pure: no I/O. Only the placement is reproduced, not forwarding or quorum.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import xxhash

SEP = b"\xff"
SECTIONS_PER_NODE = 1000
_MASK = (1 << 64) - 1


class HashringError(ValueError):
    pass


@dataclass(frozen=True)
class Endpoint:
    address: str
    az: str = ""


def series_hash(tenant: str, labels: Mapping[str, str]) -> int:
    parts = [tenant.encode(), SEP]
    for name in sorted(labels):
        parts += [name.encode(), SEP, labels[name].encode(), SEP]
    return xxhash.xxh64_intdigest(b"".join(parts))


class KetamaRing:
    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        replication_factor: int = 1,
        sections_per_node: int = SECTIONS_PER_NODE,
    ) -> None:
        if len(endpoints) < replication_factor:
            raise HashringError(
                f"ketama: {len(endpoints)} endpoints cannot hold replication factor {replication_factor}"
            )
        self.endpoints = list(endpoints)
        sections = sorted(
            (xxhash.xxh64_intdigest(f"{e.address}:{i}".encode()), index)
            for index, e in enumerate(self.endpoints)
            for i in range(1, sections_per_node + 1)
        )
        self.hashes = [h for h, _ in sections]
        owners = [index for _, index in sections]
        self.replicas = _section_replicas(owners, [e.az for e in self.endpoints], replication_factor)

    def get_n(self, value: int, n: int = 0) -> Endpoint:
        if n >= len(self.endpoints):
            raise HashringError(f"insufficient nodes; have {len(self.endpoints)}, want {n + 1}")
        i = bisect_left(self.hashes, value)
        if i == len(self.hashes):
            i = 0
        return self.endpoints[self.replicas[i][n]]


def _section_replicas(owners: list[int], zones: list[str], factor: int) -> list[tuple[int, ...]]:
    """Per section: ``factor`` distinct endpoints clockwise, never more in one zone than the least used."""
    if factor == 1:
        return [(owner,) for owner in owners]
    all_zones = set(zones)
    out: list[tuple[int, ...]] = []
    size = len(owners)
    for i in range(size):
        chosen: list[int] = []
        spread = dict.fromkeys(all_zones, 0)
        j = i - 1
        while len(chosen) < factor:
            j = (j + 1) % size
            owner = owners[j]
            if owner in chosen:
                continue
            zone = zones[owner]
            if len(spread) > 1 and spread[zone] > 0 and spread[zone] > min(spread.values()):
                continue
            chosen.append(owner)
            spread[zone] += 1
        out.append(tuple(chosen))
    return out


class HashmodRing:
    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        if any(e.az for e in endpoints):
            raise HashringError("hashmod does not support az-aware endpoints; use ketama")
        self.endpoints = sorted(endpoints, key=lambda e: e.address)

    def get_n(self, value: int, n: int = 0) -> Endpoint:
        if n >= len(self.endpoints):
            raise HashringError(f"insufficient nodes; have {len(self.endpoints)}, want {n + 1}")
        return self.endpoints[((value + n) & _MASK) % len(self.endpoints)]
