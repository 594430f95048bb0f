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
    # Every node's series on every replica, and each child's heartbeat (5 series a child).
    children = by_name["child-prometheus"].count
    assert by_name["master-prometheus"].series == (
        5000 * big.series_per_node * spec.sharding.replication_factor + children * SYNTHETIC_PER_TARGET)
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
    assert human.exit_code == 0 and "5,000" in human.output and "max-shards-per-region" in human.output


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


def _chart_values() -> dict[str, Any]:
    return yaml.safe_load(Path("helm/gpufed/values.yaml").read_text())


#: values.yaml paths whose defaults are `gpufed size --helm-values` for the stated fleet.
CHART_SIZED = (
    ("children", "perRegion"),
    ("children", "resources"),
    ("controller", "resources"),
    ("master", "resources"),
    ("alertmanager", "resources"),
    ("dingtalk", "resources"),
    ("thanos", "receive", "resources"),
)


def _at(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        values = values[key]
    return values


def test_chart_defaults_come_from_the_model_for_their_stated_fleet(tmp_path: Path) -> None:
    """values.yaml's sized defaults are what `gpufed size --helm-values` writes for the fleet its
    comments name, on the chart's own `federation`: a change to the model or the costs fails here."""
    text = Path("helm/gpufed/values.yaml").read_text()
    assert text.count(f"Sized for a {CHART_FLEET_NODES}-node fleet") >= 3
    values = yaml.safe_load(text)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(values["federation"]))
    out = tmp_path / "values.yaml"
    _register()
    result = CliRunner().invoke(app, ["size", "--spec", str(tmp_path / "spec.yaml"), "--nodes",
                                      str(CHART_FLEET_NODES), "--helm-values", str(out)])
    assert result.exit_code == 0, result.output
    wanted = yaml.safe_load(out.read_text())
    for path in CHART_SIZED:
        assert _at(values, path) == _at(wanted, path), path


def test_chart_and_docs_tables_are_the_models() -> None:
    """The chart README's and docs/sizing.md's tables are rendered from the model now (the script
    that writes them exits 1 when they drifted)."""
    import runpy

    module = runpy.run_path("scripts/sizing_tables.py")
    for path, (name, table) in module["wanted"]().items():
        from federation.sizing.tables import block

        assert block(path.read_text(), name) == table, f"{path} ({name}): scripts/sizing_tables.py --write"


def test_the_master_pays_for_the_rule_pack() -> None:
    """The master's CPU is ingest plus the rule pack's measured seconds per evaluation over the
    spec's evaluation interval; a spec without the pack, or a slower interval, costs less."""
    spec = load_gpufed_spec(EXAMPLE)
    costs = load_costs()
    rules = costs["3"].rules
    assert rules.eval_s_per_1k_series > 0, "costs.json has no rule pack cost: gpufed bench costs --into"
    sized = size(spec, Fleet(nodes=5000), costs)
    master = sized.components[1]
    expected = rules.cpu_cores(series=master.series, evaluation_interval_s=30.0)
    assert sized.master_rule_cpu_cores == pytest.approx(expected, abs=1e-4)
    ingest = costs["3"].server.cpu_cores(samples_per_s=master.samples_per_s)
    assert master.cpu_request >= ingest + expected - 0.1
    assert sized.master_rule_cpu_cores > size(spec, Fleet(nodes=500), costs).master_rule_cpu_cores
    assert spec.master is not None
    slower = spec.model_copy(update={"master": spec.master.model_copy(update={"evaluation_interval": "2m"})})
    quarter = size(slower, Fleet(nodes=5000), costs).master_rule_cpu_cores
    assert quarter == pytest.approx(expected / 4, abs=1e-4)
    off = spec.model_copy(update={"master": spec.master.model_copy(update={"rule_pack": False})})
    assert size(off, Fleet(nodes=5000), costs).master_rule_cpu_cores == 0


def test_the_bench_fits_the_rule_pack_and_writes_costs_json() -> None:
    from federation.testing.benches.costs import fit_costs, merge_costs

    def run(nodes: int) -> dict[str, Any]:
        series = nodes * 266.0
        return {
            "nodes": nodes, "interval_s": 10, "child_series": series, "master_series": series * 1.1,
            "ingested_series": series, "master_samples_per_s": series / 10,
            "child_rss_mib": 80 + 3.0 * series / 1000, "master_rss_mib": 90 + 2.5 * series / 1000,
            "child_cpu_cores": 0.01, "master_cpu_cores": 0.02,
            "rule_eval_s": 0.004 + 0.0007 * series / 1000,
        }

    fitted = fit_costs([run(60), run(240)])
    assert fitted["rules"]["eval_s_per_1k_series"] == pytest.approx(0.0007, abs=1e-6)
    assert fitted["rules"]["eval_base_s"] == pytest.approx(0.004, abs=1e-5)
    # The master's memory is fitted against what it ingests, not its head (which holds the records).
    assert fitted["coefficients"]["server"]["mib_per_1k_series"] == pytest.approx(2.5, abs=0.01)
    provenance = {"machine": "m", "date": "d", "command": "c"}
    result = {"version": "3.9.9", **fitted, "runs": [], "measured_on": provenance}
    text = merge_costs(Path("federation/sizing/costs.py").with_name("costs.json").read_text(), result)
    merged = load_costs(text)
    assert merged["3"].version == "3.9.9" and merged["3"].rules.eval_s_per_1k_series == pytest.approx(0.0007)
    assert merged["2"] == load_costs()["2"]  # the other line is kept


def test_the_spec_states_the_fleet_and_flags_win(tmp_path: Path) -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["fleet"] = {"nodes": 1000, "gpus_per_node": 4, "pods_per_gpu": 2}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(document))
    _register()

    def fleet(*args: str) -> dict[str, Any]:
        result = CliRunner().invoke(app, ["size", "--spec", str(path), "--json", *args])
        assert result.exit_code == 0, result.output
        return dict(json.loads(result.output)["fleet"])

    assert fleet() == {"nodes": 1000, "gpus": 4, "pods_per_gpu": 2, "hami": True}
    assert fleet("--nodes", "50", "--gpus", "8") == {"nodes": 50, "gpus": 8, "pods_per_gpu": 2, "hami": True}
    assert json.loads(
        CliRunner().invoke(app, ["size", "--json"]).output
    )["fleet"]["nodes"] == 500  # neither: the example spec states none
    document["fleet"] = {"nodes": 0}
    path.write_text(yaml.safe_dump(document))
    bad = CliRunner().invoke(app, ["size", "--spec", str(path)])
    assert bad.exit_code == 2 and "fleet.nodes" in bad.output and "Traceback" not in bad.output


def test_compare_puts_the_seed_table_beside_the_model() -> None:
    from federation.sizing.seed import SEED_002

    _register()
    result = CliRunner().invoke(app, ["size", "--compare", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["compare"]
    assert [r["nodes"] for r in rows] == [50, 200, 500, 1000, 5000] == list(SEED_002.sizes)
    spec, costs = load_gpufed_spec(EXAMPLE), load_costs()
    for row in rows:
        master = size(spec, Fleet(nodes=row["nodes"]), costs).components[1]
        assert row["master_memory_request_mib"] == master.memory_request_mib
        assert row["master_memory_share_of_seed"] == round(master.memory_request_mib / (32 * 1024), 4)
        assert row["seed_master"] == "16C32G to 64C128G" and row["seed_child"] == "8C16G or 16C32G"
    assert rows[0]["children"] < rows[-1]["children"]


def test_150000_nodes_on_the_example_spec_fit_or_are_told_the_value() -> None:
    """Issue 40: 300,000 targets (150,000 nodes) on the shipped spec got a bare 429. With the
    generic cap the refusal names the setting and the value that fits; with the fleet stated in
    the spec, the controller's default cap holds it."""
    from federation.sizing.model import default_shard_cap
    from federation.spec import FleetSpec
    from sharder.engine.sizing import Hysteresis, region_refusal

    spec, costs = load_gpufed_spec(EXAMPLE), load_costs()
    nodes = 150_000
    per_region = nodes // len(spec.regions)  # the sized regions get a third each
    known = {f"n{i}" for i in range(per_region - 1000)}
    new = [f"n{i}" for i in range(per_region - 1000, per_region)]
    assert default_shard_cap(spec, costs) == Hysteresis().max_shards  # no fleet stated
    refused = region_refusal(spec, Hysteresis(max_shards=default_shard_cap(spec, costs)), "cn-beijing",
                             known=known, new=new)
    fits = -(-per_region // spec.sharding.targets_per_shard)
    assert refused is not None and f"--max-shards-per-region={fits} would fit" in refused
    stated = spec.model_copy(update={"fleet": FleetSpec(nodes=nodes)})
    cap = default_shard_cap(stated, costs)
    assert cap >= fits * 1.4 and cap == size(stated, Fleet(nodes=nodes), costs).max_shards_per_region
    assert region_refusal(spec, Hysteresis(max_shards=cap), "cn-beijing", known=known, new=new) is None
    _register()
    shown = CliRunner().invoke(app, ["size", "--nodes", str(nodes)], env={"COLUMNS": "200"})
    assert f"--max-shards-per-region {cap} fits" in shown.output
