"""``gpufed bench live`` at a tiny size against a real ``gpufed serve``: the keys scripts read,
sane values, and the batch route's absence reported, not raised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from federation.commands import bench, serve
from federation.testing.benches.live import percentile, post_batch, proc_cpu_s, registration, shard_cap
from sharder.engine.sizing import MAX_SHARDS_BOUND

KEYS = {
    "change_to_served_p50_s", "change_to_served_p99_s", "controller_cpu_share", "rss_mib", "ready_s",
    "registry_batch_per_s", "engine_incremental_change_s", "engine_full_assign_s", "debounce_s",
    "load_average", "cpu_ms_per_change", "rss_mib_after_changes", "settle_s", "rss_mib_settled",
}  # fmt: skip


def _app() -> typer.Typer:
    app = typer.Typer()
    bench.register(app)
    return app


@pytest.mark.e2e
def test_bench_live_prints_the_named_keys_with_sane_values() -> None:
    result = CliRunner().invoke(_app(), ["live", "--targets", "500", "--changes", "5", "--rate", "5",
                                         "--debounce", "0.2", "--batch", "200", "--inventory-format", "json",
                                         "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.splitlines()[-1])
    assert figures.keys() >= KEYS and figures["inventory_format"] == "json"
    assert figures["targets"] == 500 and figures["changes_missed"] == 0 and figures["debounce_s"] == 0.2
    assert 0 < figures["change_to_served_p50_s"] <= figures["change_to_served_p99_s"] < 30
    assert figures["controller_cpu_share"] >= 0 and figures["rss_mib"] > 10 and figures["ready_s"] > 0
    assert figures["cpu_ms_per_change"] > 0 and figures["settle_s"] >= figures["ready_s"]
    assert figures["rss_after_changes"] == 5 and figures["rss_mib_after_changes"] > 10
    assert figures["engine_incremental_change_s"] > 0 and figures["engine_full_assign_s"] > 0
    if figures["registry_batch_per_s"] is None:  # a controller without the batch route says why
        assert "/v1/registry/batch" in figures["registry_batch_error"]
    else:
        assert figures["registry_batch_per_s"] > 0


@pytest.mark.e2e
def test_bench_live_via_the_registry_preregisters_every_target() -> None:
    result = CliRunner().invoke(_app(), ["live", "--targets", "200", "--changes", "2", "--rate", "5",
                                         "--via", "registry", "--debounce", "0.2", "--batch", "0", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.splitlines()[-1])
    assert figures["via"] == "registry" and figures["preregistered_with"] in ("batch", "put")
    assert figures["targets"] == 200 and figures["changes_missed"] == 0 and figures["ready_s"] > 0
    assert figures["registry_batch_per_s"] is None and "skipped" in figures["registry_batch_error"]


def test_bench_live_refuses_an_unknown_via() -> None:
    result = CliRunner().invoke(_app(), ["live", "--via", "consul", "--json"])
    assert result.exit_code == 2 and "--via" in result.output and "consul" in result.output


def test_bench_live_refuses_an_unknown_inventory_format() -> None:
    result = CliRunner().invoke(_app(), ["live", "--inventory-format", "toml", "--json"])
    assert result.exit_code == 2 and "--inventory-format" in result.output and "toml" in result.output


def _client(status: int, seen: list[dict[str, Any]]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        if status == 200:
            return httpx.Response(200, json={"put": 1, "created": 1, "deleted": 0, "expires_in_s": 90})
        return httpx.Response(status, json={"title": "Not Found"})

    return httpx.Client(transport=httpx.MockTransport(handler), base_url="http://controller")


@pytest.mark.parametrize("status", [404, 405])
def test_post_batch_reports_an_older_controller_instead_of_raising(status: int) -> None:
    seen: list[dict[str, Any]] = []
    entries = [registration(i, prefix="10.240", node="b") for i in range(3)]
    seconds, error = post_batch(_client(status, seen), entries)
    assert seconds is None and error is not None and f"answered {status}" in error and "older" in error
    assert len(seen) == 1  # stops at the first refusal


def test_post_batch_sends_the_contract_in_chunks() -> None:
    seen: list[dict[str, Any]] = []
    entries = [registration(i, prefix="10.240", node="b") for i in range(5)]
    seconds, error = post_batch(_client(200, seen), entries, chunk=2)
    assert error is None and seconds is not None and seconds >= 0
    assert [len(body["put"]) for body in seen] == [2, 2, 1] and all(body["delete"] == [] for body in seen)
    first = seen[0]["put"][0]
    assert first == {"identity": "10.240.0.1:9400", "address": "10.240.0.1", "port": 9400, "job": "gpu",
                     "node": "b-00000", "region": "region-a", "gpus": 8}  # fmt: skip


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile([3.0], 99) == 3


@pytest.mark.e2e
@pytest.mark.parametrize(("store", "discovery"), [("kubernetes", "file_sd"), ("consul", "http_sd")])
def test_bench_live_runs_the_shipped_spec_on_a_shared_store(store: str, discovery: str) -> None:
    """The shapes users deploy: the shipped spec, a stand-in store in its own process, and the
    time until the target is in what its child reads (its target file with file_sd)."""
    result = CliRunner().invoke(_app(), ["live", "--targets", "300", "--changes", "2", "--rate", "4",
                                         "--debounce", "0.2", "--batch", "0", "--store", store,
                                         "--discovery", discovery, "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.splitlines()[-1])
    assert figures["spec"] == "examples/federation.yaml" and figures["store"] == store
    assert figures["discovery"] == discovery and figures["served_missed"] == 0
    assert figures["children"] > 3  # the shipped spec's sizing, not the bench's own
    assert figures["listed_p50_s"] > 0 and 0 < figures["served_p99_s"] < 30
    assert figures["rss_mib"] > 10 and figures["controller_cpu_share"] >= 0


@pytest.mark.parametrize(("flag", "value"), [("--store", "etcd"), ("--discovery", "dns_sd")])
def test_bench_live_refuses_an_unknown_store_or_discovery(flag: str, value: str) -> None:
    result = CliRunner().invoke(_app(), ["live", flag, value, "--json"])
    assert result.exit_code == 2 and flag in result.output and value in result.output


@pytest.mark.e2e
def test_bench_live_sweeps_sizes_one_row_each_then_a_summary() -> None:
    result = CliRunner().invoke(_app(), ["live", "--sizes", "200,400", "--changes", "2", "--rate", "4",
                                         "--debounce", "0.2", "--batch", "0", "--no-anchors",
                                         "--rss-after-changes", "3", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [row.get("size") for row in rows[:2]] == [200, 400] and rows[1]["targets"] == 400
    assert all(row["rss_after_changes"] == 3 and row["cpu_ms_per_change"] > 0 for row in rows[:2])
    summary = rows[2]
    assert summary["sizes"] == [200, 400] and summary["cpu_ms_per_change_ratio"]["200"] == 1.0
    assert summary["cpu_ms_per_change"]["400"] == rows[1]["cpu_ms_per_change"]


@pytest.mark.parametrize("sizes", ["10,x", "1", "500,500", "2000000"])
def test_bench_live_refuses_bad_sizes(sizes: str) -> None:
    result = CliRunner().invoke(_app(), ["live", "--sizes", sizes, "--json"])
    assert result.exit_code == 2 and "--sizes" in result.output


def test_bench_live_says_when_a_fleet_cannot_fit_serves_shard_cap() -> None:
    """Past --max-shards-per-region's bound every new node would be refused (429): the bench
    says so before it starts a controller, naming the sizing that fits."""
    result = CliRunner().invoke(_app(), ["live", "--targets", "1000000", "--targets-per-shard", "1",
                                         "--changes", "1", "--json"])  # fmt: skip
    assert result.exit_code == 1 and "--targets-per-shard" in result.output and "166667" in result.output


def test_bench_live_fits_the_shipped_spec_at_a_million_targets() -> None:
    """The shipped spec (12 nodes a child) at 1M targets needs about 13,889 shards a sized
    region: the bench's derived cap holds them with room, within serve's bound."""
    cap = shard_cap(1_000_000, 3, 12)
    assert 13_889 < cap <= MAX_SHARDS_BOUND


@pytest.mark.parametrize("value", ["0", str(MAX_SHARDS_BOUND + 1)])
def test_serve_refuses_a_shard_cap_out_of_range(value: str) -> None:
    """Out of range is a usage error naming the flag, never a traceback."""
    app = typer.Typer()
    serve.register(app)
    app.command("unused")(lambda: None)  # two commands: "serve" is then a subcommand
    result = CliRunner().invoke(app, ["serve", "--max-shards-per-region", value])
    assert result.exit_code == 2 and "--max-shards-per-region" in result.output


def test_the_phase_cpu_is_read_from_proc_outside_the_metrics_request() -> None:
    """``/proc/<pid>/stat`` CPU (own plus waited-for children) for a live process; None for
    one that does not exist, where the bench falls back to ``/metrics``."""
    child = subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    assert child.returncode == 0
    own = proc_cpu_s(os.getpid())
    assert own is not None and own > 0
    assert proc_cpu_s(2**22 + 12345) is None
