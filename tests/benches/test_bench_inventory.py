"""``gpufed bench inventory`` through typer's runner, on a small fleet."""

from __future__ import annotations

import json
from pathlib import Path

import typer
import yaml
from typer.testing import CliRunner

from federation.commands import bench
from federation.testing.benches.inventory import write_inventory
from sharder.model.loading import parse_inventory

KEYS = {
    "nodes",
    "targets",
    "shards",
    "inventory_mb",
    "yaml_loader",
    "load_seconds",
    "assign_seconds",
    "plan_seconds",
    "plan_command_seconds",
    "moved_on_replan",
    "peak_rss_mb",
    "setup_peak_rss_mb",
    "plan_budget_seconds",
    "rss_budget_mb",
    "plan_over_budget",
    "rss_over_budget",
    "anchor_nodes",
    "anchor_safe_load_seconds",
    "anchor_parse_yaml_seconds",
    "load_speedup_vs_safe_load",
}


def test_bench_inventory_prints_the_figures_as_json() -> None:
    app = typer.Typer()
    bench.register(app)
    result = CliRunner().invoke(app, ["inventory", "--nodes", "300", "--anchor-nodes", "50", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert set(figures) == KEYS
    assert (figures["nodes"], figures["targets"], figures["moved_on_replan"]) == (300, 600, 0)
    assert figures["shards"] == 3 and figures["peak_rss_mb"] > 0
    assert figures["plan_command_seconds"] >= figures["load_seconds"]


def test_the_synthetic_inventory_is_valid_and_unique(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    size = write_inventory(path, nodes=1000, seed=3)
    assert size == path.stat().st_size
    targets = parse_inventory(yaml.safe_load(path.read_text()), source=str(path))
    assert len(targets) == 2000 and len({t.address for t in targets}) == 1000
