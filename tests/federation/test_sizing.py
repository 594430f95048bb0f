"""gpufed size (issue 40): series counted from the exporter, costs from costs.json, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from federation.commands.cli import _register, app
from federation.sizing.costs import load_costs
from federation.sizing.model import Fleet, size
from federation.sizing.series import SYNTHETIC_PER_TARGET, _exposition, node_series
from federation.spec import load_gpufed_spec

EXAMPLE = Path("examples/federation.yaml")


def _families(gpus: int, pods: int) -> set[str]:
    body = _exposition(gpus, pods, True).decode()
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in body.splitlines() if line and line[0] != "#"}


def test_series_follow_the_exporter_and_the_keep_list() -> None:
    plain = node_series(gpus=8)
    assert plain.kept == plain.exposed + SYNTHETIC_PER_TARGET
    # Doubling the GPUs roughly doubles the per-GPU series; pods multiply them.
    assert node_series(gpus=4).exposed < plain.exposed < 2.2 * node_series(gpus=4).exposed
    shared = node_series(gpus=8, pods_per_gpu=4)
    assert 3 * plain.exposed < shared.exposed < 4.5 * plain.exposed
    # A keep list drops every family it does not match, counted from the real exposition.
    only_dcgm = node_series(gpus=8, keep=["DCGM_FI_.*"])
    body = _exposition(8, 0, True).decode()
    dcgm_lines = sum(1 for line in body.splitlines() if line.startswith("DCGM_FI_"))
    assert only_dcgm.kept == dcgm_lines + SYNTHETIC_PER_TARGET
    assert node_series(gpus=8, hami=False).exposed < plain.exposed
    assert any(name.startswith("hami_") for name in _families(8, 0))


def test_the_model_grows_with_the_fleet_and_hands_over_to_thanos() -> None:
    spec = load_gpufed_spec(EXAMPLE)
    costs = load_costs()
    small, big = size(spec, Fleet(nodes=50), costs), size(spec, Fleet(nodes=5000), costs)
    by_name = {c.name: c for c in big.components}
    assert by_name["child-prometheus"].count > small.components[0].count
    assert (
        by_name["master-prometheus"].series == 5000 * big.series_per_node * spec.sharding.replication_factor
    )
    for c in big.components:
        assert c.memory_limit_mib >= c.memory_request_mib and c.cpu_limit >= c.cpu_request, c
    huge = size(spec, Fleet(nodes=100_000), costs)
    assert huge.thanos_receive_needed and any(c.name == "thanos-receive" for c in huge.components)
    assert not small.thanos_receive_needed
    # The cap it implies holds the biggest sized region with room to spare.
    assert huge.max_shards_per_region * spec.sharding.targets_per_shard > 100_000 / len(spec.regions)


def test_costs_name_where_they_came_from() -> None:
    for line in load_costs().values():
        assert {"machine", "date", "command"} <= line.measured_on.keys()
        assert line.child_agent.mib_per_1k_series > 0 and line.server.mib_per_1k_series > 0


def test_cli_json_lists_every_component() -> None:
    _register()
    result = CliRunner().invoke(app, ["size", "--nodes", "500", "--gpus", "8", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    names = {c["name"] for c in document["components"]}
    assert {"child-prometheus", "master-prometheus", "alertmanager", "controller"} <= names
    for c in document["components"]:
        for key in (
            "count",
            "cpu_request",
            "cpu_limit",
            "memory_request_mib",
            "memory_limit_mib",
            "disk_gib",
        ):
            assert key in c
    human = CliRunner().invoke(app, ["size", "--nodes", "500", "--compare"], env={"COLUMNS": "200"})
    assert human.exit_code == 0 and "5000" in human.output and "max-shards-per-region" in human.output


@pytest.mark.parametrize("args", [["--spec", "nope.yaml"], ["--nodes", "0"], ["--gpus", "99"]])
def test_bad_input_is_an_error_not_a_traceback(args: list[str]) -> None:
    _register()
    result = CliRunner().invoke(app, ["size", *args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_the_bench_fit_recovers_known_coefficients() -> None:
    """Runs made from known lines give those lines back (the fit, not the processes)."""
    from federation.testing.benches.costs import fit_costs

    def run(nodes: int, interval: int, per_series: float) -> dict[str, float]:
        series = nodes * 266.0
        sps = series / interval
        return {
            "nodes": nodes,
            "interval_s": interval,
            "child_series": series,
            "master_series": series,
            "master_samples_per_s": sps,
            "child_rss_mib": 80 + 3.0 * series / 1000 + 1.5 * sps / 1000,
            "master_rss_mib": 90 + 2.5 * series / 1000 + 0.5 * sps / 1000,
            "child_cpu_cores": 0.01 * sps / 1000,
            "master_cpu_cores": 0.02 * sps / 1000,
            "block_samples_per_series": per_series,
            "chunk_bytes_per_sample": (20 + 1.5 * per_series) / per_series,
            "index_bytes_per_series": 140.0,
        }

    fitted = fit_costs([run(60, 10, 6.0), run(240, 10, 6.0), run(240, 5, 12.0)])
    child, server = fitted["coefficients"]["child_agent"], fitted["coefficients"]["server"]
    assert child["mib_per_1k_series"] == pytest.approx(3.0, abs=0.01)
    assert child["mib_per_1k_samples_per_s"] == pytest.approx(1.5, abs=0.01)
    assert server["mib_per_1k_series"] == pytest.approx(2.5, abs=0.01)
    assert server["chunk_bytes_per_sample"] == pytest.approx(1.5, abs=0.01)
    assert server["chunk_bytes_per_series_chunk"] == pytest.approx(20, abs=0.1)
    assert fitted["cpu_cores_per_1k_samples_per_s"]["server"] == pytest.approx(0.02, abs=1e-4)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


@pytest.mark.parametrize("nodes", [50, 5000, 100_000])
def test_helm_values_use_the_charts_own_names(tmp_path: Path, nodes: int) -> None:
    """--helm-values over the chart's defaults still validates against values.schema.json."""
    _register()
    out = tmp_path / "values.yaml"
    result = CliRunner().invoke(app, ["size", "--nodes", str(nodes), "--helm-values", str(out), "--json"])
    if nodes == 100_000:  # 33,334 nodes a region need more shards than the chart takes
        assert result.exit_code == 2 and "children.perRegion" in result.output
        return
    assert result.exit_code == 0, result.output
    chart = Path("helm/gpufed")
    merged = _merge(yaml.safe_load((chart / "values.yaml").read_text()), yaml.safe_load(out.read_text()))
    merged["controller"]["token"]["value"] = "sizing-test-token-0123456789"  # the chart refuses none
    jsonschema.validate(merged, json.loads((chart / "values.schema.json").read_text()))
    sizing = json.loads(result.output)
    child = next(c for c in sizing["components"] if c["name"] == "child-prometheus")
    assert merged["children"]["resources"]["requests"]["memory"] == f"{child['memory_request_mib']}Mi"


#: The fleet the chart's default resources are sized for (the comment in values.yaml says so).
CHART_FLEET_NODES = 100


def test_chart_defaults_come_from_the_model_for_their_stated_fleet() -> None:
    """values.yaml's children and controller resources are the model's, for the fleet its comment names."""
    from federation.sizing.helm_values import helm_values
    from federation.spec import GpufedSpec

    text = Path("helm/gpufed/values.yaml").read_text()
    assert f"Sized for a {CHART_FLEET_NODES}-node fleet" in text
    values = yaml.safe_load(text)
    spec = GpufedSpec.model_validate(values["federation"])
    wanted = helm_values(size(spec, Fleet(nodes=CHART_FLEET_NODES), load_costs()))
    assert values["children"]["perRegion"] == wanted["children"]["perRegion"]
    assert values["children"]["resources"] == wanted["children"]["resources"]
    assert values["controller"]["resources"] == wanted["controller"]["resources"]


def test_chart_readme_table_is_the_models() -> None:
    """The chart README's sizing rows: the model for the chart's spec without fixed shards."""
    from federation.spec import GpufedSpec

    raw = yaml.safe_load(Path("helm/gpufed/values.yaml").read_text())["federation"]
    for region in raw["regions"]:
        region.pop("shards", None)
    spec = GpufedSpec.model_validate(raw)
    rows = re.findall(r"^\| ([\d,]+) \| (\d+) \| (\d+)m, (\d+)Mi / (\d+)Mi \| (\d+)m, (\d+)Mi / (\d+)Mi \|",
                      Path("helm/gpufed/README.md").read_text(), flags=re.M)
    assert len(rows) == 5
    for row in rows:
        s = size(spec, Fleet(nodes=int(row[0].replace(",", ""))), load_costs())
        child, master = s.components[0], s.components[1]
        assert [int(x) for x in row[1:]] == [
            child.count, round(child.cpu_request * 1000), child.memory_request_mib, child.memory_limit_mib,
            round(master.cpu_request * 1000), master.memory_request_mib, master.memory_limit_mib,
        ], row
