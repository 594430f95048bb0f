"""The committed dashboard JSON: equal to the generator's output, and well-formed for Grafana.

Regenerate after changing a definition with ``python -m federation.dashboards.build --write``.
Every PromQL expression is executed against a real Prometheus in ``test_dashboards_e2e.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from federation.dashboards import DASHBOARDS_DIR, build, dashboard_files
from federation.dashboards.grafana import (
    DATASOURCE,
    GRID_COLUMNS,
    SCHEMA_VERSION,
    Panel,
    Query,
    Row,
    layout,
)

ROOT = Path(__file__).resolve().parents[2]
BUILTINS = {"__rate_interval", "__range", "__interval", "__all"}
VARIABLE_REF = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
EXPECTED = {"gpufed-cluster", "gpufed-node", "gpufed-workloads", "gpufed-quota", "gpufed-federation",
            "gpufed-training", "gpufed-distributed", "gpufed-host"}


def load(path: Path) -> dict[str, Any]:
    model: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return model


DASHBOARDS = {path.stem: load(path) for path in dashboard_files()}


def panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in model["panels"] if p["type"] != "row"]


def refs(text: str) -> set[str]:
    return {a or b for a, b in VARIABLE_REF.findall(text)}


def test_committed_json_equals_generator_output() -> None:
    stale = build.differences(DASHBOARDS_DIR, build.render_all())
    assert stale == [], f"{stale} differ from the generator: python -m federation.dashboards.build --write"


def test_the_dashboards_ship_as_package_files() -> None:
    assert set(DASHBOARDS) == EXPECTED
    assert all(path.parent == DASHBOARDS_DIR for path in dashboard_files())


def test_render_is_deterministic() -> None:
    assert build.render_all() == build.render_all()


@pytest.mark.parametrize("uid", sorted(EXPECTED))
def test_dashboard_structure(uid: str) -> None:
    model = DASHBOARDS[uid]
    assert model["uid"] == uid and model["id"] is None
    assert model["schemaVersion"] == SCHEMA_VERSION
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = [p["title"] for p in panels(model)]
    assert len(titles) == len(set(titles)), "panel titles must be unique within a dashboard"
    for panel in model["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] >= 1 and grid["h"] >= 1 and grid["y"] >= 0
        assert grid["x"] + grid["w"] <= GRID_COLUMNS, panel["title"]
    for a, b in combinations(model["panels"], 2):
        ga, gb = a["gridPos"], b["gridPos"]
        overlap = (ga["x"] < gb["x"] + gb["w"] and gb["x"] < ga["x"] + ga["w"]
                   and ga["y"] < gb["y"] + gb["h"] and gb["y"] < ga["y"] + ga["h"])
        assert not overlap, f"{a['title']!r} overlaps {b['title']!r}"
    for panel in panels(model):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["description"].strip(), f"{panel['title']!r} has no description"
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip()


@pytest.mark.parametrize("uid", sorted(EXPECTED))
def test_template_variables(uid: str) -> None:
    model = DASHBOARDS[uid]
    variables = model["templating"]["list"]
    assert variables[0]["type"] == "datasource" and variables[0]["query"] == "prometheus"
    assert variables[0]["name"] == DATASOURCE["uid"].strip("${}")
    names = [v["name"] for v in variables]
    assert len(names) == len(set(names))
    defined: set[str] = set()
    for variable in variables:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE
            assert variable["query"]["query"] == variable["definition"]
            # A chained variable may only use variables defined before it.
            assert refs(variable["definition"]) <= defined | BUILTINS, variable["name"]
            if variable["includeAll"]:
                assert variable["allValue"] == ".*"
        defined.add(variable["name"])
    used: set[str] = set()
    for panel in panels(model):
        for target in panel["targets"]:
            used |= refs(target["expr"])
        used |= refs(json.dumps(panel["datasource"]))
    assert used - BUILTINS <= defined, f"undefined variables: {sorted(used - BUILTINS - defined)}"
    unused = defined - used - {v["name"] for v in variables if refs_in_others(variables, v["name"])}
    assert not unused, f"variables no panel uses: {sorted(unused)}"


def refs_in_others(variables: list[dict[str, Any]], name: str) -> bool:
    return any(name in refs(v.get("definition", "")) for v in variables)


def test_required_variables() -> None:
    def names(uid: str) -> set[str]:
        return {v["name"] for v in DASHBOARDS[uid]["templating"]["list"]}

    assert {"region", "node", "gpu"} <= names("gpufed-node")
    assert "region" in names("gpufed-cluster")
    assert {"namespace", "pod"} <= names("gpufed-workloads")
    assert {"region", "shard"} <= names("gpufed-federation")


def test_layout_wraps_at_24_columns_and_refuses_wider_panels() -> None:
    wide = Panel("a", "stat", (Query("up"),), "d", width=16)
    out = layout((Row("r", (wide, wide)),))
    assert [p["gridPos"] for p in out[1:]] == [
        {"h": 8, "w": 16, "x": 0, "y": 1}, {"h": 8, "w": 16, "x": 0, "y": 9},
    ]
    with pytest.raises(ValueError, match="width 25"):
        layout((Row("r", (Panel("b", "stat", (Query("up"),), "d", width=25),)),))


def test_check_and_write_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--dir", str(tmp_path), "--write"]) == 0
    assert build.main(["--dir", str(tmp_path)]) == 0
    (tmp_path / "gpufed-node.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "orphan.json").write_text("{}\n", encoding="utf-8")
    assert build.main(["--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "gpufed-node.json" in err and "orphan.json" in err
    assert build.main(["--dir", str(tmp_path), "--write"]) == 0
    assert not (tmp_path / "orphan.json").exists()


def test_readme_check_command_runs_as_written() -> None:
    text = (ROOT / "docs" / "dashboards.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    assert [b.strip() for b in blocks] == ["python -m federation.dashboards.build"]
    done = subprocess.run([sys.executable, "-m", "federation.dashboards.build"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_dcgm4_table_matches_the_exporter() -> None:
    """The dashboards' 3.x -> 4.x table is the exporter's (federation does not import it)."""
    from exporter.naming import DCGM4 as EXPORTER_DCGM4
    from federation.dashboards import dcgm

    assert {old: (new.name, 1 / new.scale) for old, new in EXPORTER_DCGM4.items()} == dcgm.DCGM4
    assert dcgm.metric("DCGM_FI_DEV_GPU_UTIL", 'node="a"') == (
        '(DCGM_FI_DEV_GPU_UTIL{node="a"} or DCGM_FI_DEV_GPU_UTIL_RATIO{node="a"})')
    assert dcgm.metric("DCGM_FI_DEV_FB_USED", 'node="a"') == 'DCGM_FI_DEV_FB_USED{node="a"}'  # same in 4.6.0
    assert dcgm.metric("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == (
        "(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{} or DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL{} * 1000)")
    assert dcgm.metric("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL") == "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{}"
    expected = '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_GPU_UTIL_RATIO"}'
    assert dcgm.any_name("DCGM_FI_DEV_GPU_UTIL") == expected
