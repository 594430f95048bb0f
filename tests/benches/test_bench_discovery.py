"""``gpufed bench discovery`` end to end at a tiny size: the keys scripts rely on are there."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from federation.commands import bench

KEYS = {"debounce_s", "change_to_assignment_p50_s", "change_to_assignment_p99_s", "cpu_seconds", "rss_mib"}


@pytest.mark.e2e
def test_bench_discovery_prints_the_named_keys() -> None:
    app = typer.Typer()
    bench.register(app)
    result = CliRunner().invoke(app, ["discovery", "--targets", "60", "--changes", "6", "--debounce", "0.2",
                                      "--interval", "0.05", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.splitlines()[-1])
    assert figures.keys() >= KEYS
    assert figures["changes_unresolved"] == 0 and figures["debounce_s"] == 0.2
    assert 0 < figures["change_to_assignment_p50_s"] <= figures["change_to_assignment_p99_s"] < 10
