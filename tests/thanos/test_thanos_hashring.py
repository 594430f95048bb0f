"""The ketama/hashmod reproduction against Thanos' own published expectations, and the bench.

The fixed vectors are the expected placements in Thanos' ``TestKetamaHashringGet``
(ring of 10 sections per node, tenant ``"tenant"``, series ``{pod="nginx"}``): facts about
Thanos' output that our re-implementation must reproduce bit for bit.
"""

from __future__ import annotations

import json

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from federation.commands import bench
from federation.testing.benches.thanos import synthetic_series
from thanos.hashring import Endpoint, HashmodRing, HashringError, KetamaRing, series_hash


def ring(*addresses: str, factor: int = 1, sections: int = 10) -> KetamaRing:
    return KetamaRing([Endpoint(a) for a in addresses], replication_factor=factor, sections_per_node=sections)


@pytest.mark.parametrize(
    ("addresses", "pod", "n", "expected"),
    [
        (("node-1", "node-2", "node-3"), "nginx", 0, "node-2"),
        (("node-1", "node-2", "node-3"), "nginx", 1, "node-1"),
        (("node-1", "node-2", "node-3"), "nginx", 2, "node-3"),
        (("node-1", "node-3", "node-2"), "nginx", 2, "node-3"),
        (("node-0", "node-1", "node-2", "node-3"), "nginx", 0, "node-2"),
        (("node-1", "node-2", "node-3", "node-4"), "nginx", 0, "node-2"),
        (("node-1", "node-2", "node-3"), "thanos", 0, "node-3"),
    ],
)
def test_matches_thanos_ketama_vectors(addresses: tuple[str, ...], pod: str, n: int, expected: str) -> None:
    placed = ring(*addresses, factor=n + 1).get_n(series_hash("tenant", {"pod": pod}), n)
    assert placed.address == expected


def test_replication_factor_above_endpoints_is_refused() -> None:
    with pytest.raises(HashringError):
        ring("node-1", factor=2)


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=2, max_value=6), st.integers(min_value=0, max_value=2**32))
def test_adding_an_ingestor_moves_series_only_to_it(count: int, salt: int) -> None:
    before = ring(*(f"r-{i}" for i in range(count)), sections=50)
    after = ring(*(f"r-{i}" for i in range(count + 1)), sections=50)
    for i in range(200):
        h = series_hash("t", {"__name__": "m", "i": str(i), "salt": str(salt)})
        old, new = before.get_n(h).address, after.get_n(h).address
        assert new in (old, f"r-{count}")


def test_az_aware_replicas_land_in_distinct_zones() -> None:
    endpoints = [Endpoint(f"r-{i}", az="ab"[i % 2]) for i in range(4)]
    zoned = KetamaRing(endpoints, replication_factor=2, sections_per_node=50)
    zone = {e.address: e.az for e in endpoints}
    for i in range(300):
        h = series_hash("t", {"i": str(i)})
        assert {zone[zoned.get_n(h, 0).address], zone[zoned.get_n(h, 1).address]} == {"a", "b"}


def test_hashmod_refuses_zones_and_sorts_endpoints() -> None:
    with pytest.raises(HashringError):
        HashmodRing([Endpoint("a", az="1")])
    h = series_hash("t", {"i": "1"})
    assert HashmodRing([Endpoint("b"), Endpoint("a")]).get_n(h) == HashmodRing(
        [Endpoint("a"), Endpoint("b")]
    ).get_n(h)


def test_synthetic_series_are_distinct() -> None:
    hashes = list(synthetic_series(5000))
    assert len(set(hashes)) == len(hashes)


def test_bench_cli_prints_the_issue_keys() -> None:
    app = typer.Typer()
    bench.register(app)
    result = CliRunner().invoke(app, ["thanos", "--series", "20000", "--ingestors", "6", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["optimal_moved_fraction"] == round(1 / 7, 6)
    # ketama moves about the optimum; hashmod reshuffles about K/(K+1) of all series.
    assert 0.8 < figures["ketama_ratio_to_optimal"] < 1.25
    assert figures["hashmod_moved_fraction"] > 0.8
