"""``gpufed bench balance``: the JSON figures come from the same run, and bad input is refused."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from federation.commands import bench


def app() -> typer.Typer:
    cli = typer.Typer()
    bench.register(cli)
    return cli


def balance(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(app(), ["balance", "--json", "--targets", "300", "--shards", "10", *args])
    assert result.exit_code == 0, result.output
    figures: dict[str, object] = json.loads(result.output)
    return figures


def test_load_aware_weights_balance_samples_better_than_gpu_counts_on_a_skewed_fleet() -> None:
    figures = balance("--heavy-fraction", "0.1", "--heavy-factor", "10")
    assert figures["targets"] == 300 and figures["shards"] == 10
    gpu, aware = figures["gpu_weighted_max_over_mean"], figures["load_aware_max_over_mean"]
    assert isinstance(gpu, float) and isinstance(aware, float)
    assert aware < gpu
    assert figures["weight_changes"] == 30  # the 10% whose series their GPU count does not explain
    moved = figures["moved_fraction"]
    assert isinstance(moved, float) and 0 < moved < 0.5


def test_without_skew_nothing_changes_and_nothing_moves() -> None:
    figures = balance("--heavy-fraction", "0")
    assert figures["weight_changes"] == 0 and figures["moved_fraction"] == 0.0
    assert figures["load_aware_max_over_mean"] == figures["gpu_weighted_max_over_mean"]


def test_more_shards_than_targets_is_refused_naming_the_flag() -> None:
    result = CliRunner().invoke(app(), ["balance", "--targets", "5", "--shards", "6"])
    assert result.exit_code == 2
    assert "--shards" in result.output
