"""``gpufed bench sharding`` through typer's runner, and the figures it reports."""

from __future__ import annotations

import hashlib
import json

import pytest
import typer
from typer.testing import CliRunner

from federation.commands import bench
from federation.testing.benches.sharding import run_sharding_bench, synth_targets
from sharder.engine.hashing import hashmod

KEYS = {
    "targets",
    "shards",
    "algorithm",
    "algorithm_version",
    "assign_seconds",
    "add_shard_moved_fraction",
    "add_shard_moved_fraction_worst",
    "optimal_add_fraction",
    "add_shard_ratio_to_optimal",
    "add_shard_ratio_to_optimal_worst",
    "remove_shard_moved_fraction",
    "optimal_remove_fraction",
    "remove_shard_spill_fraction",
    "max_over_mean",
    "hashmod_add_shard_moved_fraction",
    "hashmod_add_ratio_to_optimal",
    "hashmod_pass_seconds",
    "assign_over_hashmod_pass",
    "incremental_change_seconds",
    "assign_over_incremental_change",
    "add_shard_max_over_mean_worst",
}


def bench_app() -> typer.Typer:
    """The same wiring as ``federation.commands.cli``: a ``bench`` group with our command in it."""
    app = typer.Typer()
    group = typer.Typer()
    app.add_typer(group, name="bench")
    bench.register(group)
    return app


def md5_hashmod(value: str, modulus: int) -> int:
    """Prometheus' hashmod written out independently of sharder.engine.hashing."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


def test_bench_sharding_json_has_every_figure() -> None:
    args = ["bench", "sharding", "--targets", "3000", "--shards", "10", "--trials", "3", "--seed", "5"]
    result = CliRunner().invoke(bench_app(), [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data.keys() >= KEYS
    assert (data["targets"], data["shards"], data["algorithm"]) == (3000, 10, "bounded-ring")
    assert data["optimal_add_fraction"] == round(1 / 11, 6)
    assert data["max_over_mean"] <= 1.05
    assert data["add_shard_ratio_to_optimal"] <= 1.3
    assert data["remove_shard_spill_fraction"] <= 0.02
    assert data["remove_shard_moved_fraction"] >= data["optimal_remove_fraction"]
    assert data["add_shard_max_over_mean_worst"] <= 1.05
    assert data["hashmod_pass_seconds"] > 0 and data["incremental_change_seconds"] > 0
    ratio = data["assign_seconds"] / data["hashmod_pass_seconds"]
    assert data["assign_over_hashmod_pass"] == pytest.approx(ratio, rel=1e-3)

    # hashmod is Prometheus' own: known vectors, then the bench figure recomputed from scratch.
    assert hashmod(["baz"], 1000) == 976 and hashmod(["foo\nbar"], 1000) == 734
    keys = [t.identity for t in synth_targets(3000, seed=5, region="bench")]
    moved = sum(1 for k in keys if md5_hashmod(k, 10) != md5_hashmod(k, 11)) / len(keys)
    assert data["hashmod_add_shard_moved_fraction"] == round(moved, 6)
    assert moved > 0.85  # hashmod reshuffles nearly everything, the reason for this engine


def test_bench_sharding_prints_a_table_without_json() -> None:
    result = CliRunner().invoke(
        bench_app(), ["bench", "sharding", "--targets", "500", "--shards", "4", "--trials", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "add_shard_moved_fraction" in result.stdout and "bounded-ring" in result.stdout


def test_bench_sharding_refuses_an_unknown_algorithm() -> None:
    result = CliRunner().invoke(bench_app(), ["bench", "sharding", "--targets", "10", "--algorithm", "magic"])
    assert result.exit_code == 2
    assert "unknown algorithm 'magic'" in result.output


def test_bench_with_one_shard_has_no_removal_figures() -> None:
    data = run_sharding_bench(targets=200, shards=1, trials=1, repeats=1, algorithm="bounded-rendezvous")
    assert data["algorithm"] == "bounded-rendezvous" and data["vnodes"] is None
    assert data["remove_shard_moved_fraction"] is None
    assert data["max_over_mean"] == 1.0
    assert data["add_shard_moved_fraction"] <= 0.65  # optimum 0.5
