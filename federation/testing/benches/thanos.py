"""``gpufed bench thanos``: series moved when one ingestor joins, ketama vs hashmod.

Synthetic GPU series (DCGM names x nodes x GPUs, one tenant) are placed on K ingestors
and on K+1 with the reproduction in ``thanos.hashring``; a series "moves" when its first
replica changes. The anchor is the optimum, 1/(K+1): the share the new ingestor must take.
Figures are ratios to that optimum from the same run, so a loaded machine changes only
the timings, never the fractions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from thanos.hashring import Endpoint, HashmodRing, KetamaRing, series_hash

MAX_SERIES = 5_000_000
METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE")
GPUS = 8


def synthetic_series(count: int, *, tenant: str = "default-tenant") -> Iterator[int]:
    """Hashes of ``count`` distinct GPU series, as Receive hashes them (tenant first)."""
    per_node = len(METRICS) * GPUS
    for i in range(count):
        node, rest = divmod(i, per_node)
        metric, gpu = divmod(rest, GPUS)
        labels = {
            "__name__": METRICS[metric],
            "cluster": "bench",
            "gpu": str(gpu),
            "node": f"gpu-node-{node:06d}",
            "region": f"region-{node % 3}",
        }
        yield series_hash(tenant, labels)


def _endpoints(count: int) -> list[Endpoint]:
    return [Endpoint(address=f"thanos-receive-{i}:10901") for i in range(count)]


def moved_fraction(
    hashes: list[int], before: KetamaRing | HashmodRing, after: KetamaRing | HashmodRing
) -> float:
    moved = sum(1 for h in hashes if before.get_n(h).address != after.get_n(h).address)
    return moved / len(hashes)


def run_thanos_bench(*, series: int, ingestors: int) -> dict[str, Any]:
    start = time.perf_counter()
    hashes = list(synthetic_series(series))
    hashed_s = time.perf_counter() - start
    old, new = _endpoints(ingestors), _endpoints(ingestors + 1)
    start = time.perf_counter()
    ketama = moved_fraction(hashes, KetamaRing(old), KetamaRing(new))
    ketama_s = time.perf_counter() - start
    start = time.perf_counter()
    hashmod = moved_fraction(hashes, HashmodRing(old), HashmodRing(new))
    hashmod_s = time.perf_counter() - start
    optimal = 1 / (ingestors + 1)
    return {
        "series": series,
        "ingestors_before": ingestors,
        "ingestors_after": ingestors + 1,
        "ketama_moved_fraction": round(ketama, 6),
        "hashmod_moved_fraction": round(hashmod, 6),
        "optimal_moved_fraction": round(optimal, 6),
        "ketama_ratio_to_optimal": round(ketama / optimal, 4),
        "hashmod_ratio_to_optimal": round(hashmod / optimal, 4),
        "hash_seconds": round(hashed_s, 3),
        "ketama_seconds": round(ketama_s, 3),
        "hashmod_seconds": round(hashmod_s, 3),
    }
