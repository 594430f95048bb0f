"""The benchmark's own measurements: what `gpufed-exporter bench` reports must be what ran."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from typer.testing import CliRunner

from exporter.catalogue import select_families
from exporter.collection import Collection
from exporter.commands.cli import cli
from exporter.models import Reading
from exporter.simulated import SimulatedBackend
from exporter.testing import bench

BURN_S = 0.03


class BurningBackend(SimulatedBackend):
    """Spends BURN_S of CPU in every read, on whatever thread the read runs."""

    def read(self, families: Iterable[str]) -> dict[int, Reading]:
        start = time.thread_time()
        while time.thread_time() - start < BURN_S:
            pass
        return super().read(families)


def test_collect_cpu_counts_the_read_on_the_worker_thread() -> None:
    # With a collect timeout the read runs on a "gpu-read" worker thread; on the H100 the
    # bench reported the calling thread's CPU only, so the driver calls never showed up.
    collection = Collection(BurningBackend(1), select_families(), timeout=3.0)
    assert bench._collect_cpu([collection], rounds=2) >= BURN_S * 0.9


def test_collect_wall_reports_percentiles() -> None:
    collection = Collection(BurningBackend(1), select_families(), timeout=None)
    wall = bench._collect_wall(collection, 3)
    assert wall["collect_rounds"] == 3
    assert BURN_S * 1000 * 0.9 <= wall["collect_wall_p50_ms"] <= wall["collect_wall_max_ms"]


def test_cli_bench_backend_and_families() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["bench", "--backend", "simulated", "--gpus", "1", "--scrapes", "20",
                                 "--fleet-nodes", "0", "--families", "pcie,gpm", "--collect-rounds", "4",
                                 "--dcgm-names", "4", "--json"])
    assert result.exit_code == 0, result.output
    serve = json.loads(result.output)["serve"]
    assert serve["backend"] == "simulated"
    assert {"pcie", "gpm"} <= set(serve["families"])
    assert serve["collect_rounds"] == 4
    assert serve["dcgm_names"] == "4"
    assert serve["collect_wall_p99_ms"] >= serve["collect_wall_p50_ms"] > 0
    bad = runner.invoke(cli, ["bench", "--backend", "cuda", "--fleet-nodes", "0"])
    assert bad.exit_code == 2
    bad_names = runner.invoke(cli, ["bench", "--dcgm-names", "5", "--fleet-nodes", "0"])
    assert bad_names.exit_code == 2 and "--dcgm-names" in bad_names.output


def test_bench_attribution_counts_what_it_served() -> None:
    """`bench attribution`: the stand-in kubelet's pods are all mapped, and a GPU held by N pods
    is written N times (the one series per pod that shared GPUs cost)."""
    result = CliRunner().invoke(cli, ["bench", "attribution", "--containers", "200", "--gpus", "2",
                                      "--shared", "3", "--rounds", "1", "--json"])
    assert result.exit_code == 0, result.output
    run = json.loads(result.output)["attribution"]
    assert run["label_sets"] == 2 * 3
    assert run["with_pods"]["series"] > 2.5 * run["without_pods"]["series"]
    assert run["refresh_wall_ms_p50"] > 0 and run["answer_bytes"] > 0
