"""``gpufed render --target compose``: no inventory needed, and the render root (the parent
of ``--out``, which every compose service mounts at /gpufed) holds only rendered trees."""

from __future__ import annotations

import json
from pathlib import Path

import typer
import yaml
from conftest import ROOT
from typer.testing import CliRunner, Result

from federation.commands import render

SPEC = ROOT / "compose" / "federation.yaml"


def invoke(*args: str | Path) -> Result:
    app = typer.Typer()
    render.register(app)
    return CliRunner().invoke(app, [str(a) for a in args])


def compose_render(out: Path, *extra: str | Path) -> Result:
    return invoke("render", "--spec", SPEC, "--out", out, "--target", "compose", "--no-check", *extra)


def test_compose_renders_without_inventory_and_teams_come_from_the_spec(tmp_path: Path) -> None:
    out = tmp_path / "render" / "current"
    result = compose_render(out)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "assignment.json").read_text())["targets"] == {}
    providers = yaml.safe_load((out / "grafana" / "provisioning" / "dashboards" / "gpufed.yml").read_text())
    folders = {p["folder"] for p in providers["providers"]}
    spec_teams = set(yaml.safe_load(SPEC.read_text())["grafana"]["teams"])
    assert {f for f in folders if f != "gpufed"} == {f"Team {t}" for t in spec_teams}  # none from elsewhere


def test_the_example_inventorys_teams_would_have_become_folders(tmp_path: Path) -> None:
    """The same render with the example inventory adds its teams: the no-inventory render
    above is what keeps them out."""
    out = tmp_path / "render" / "current"
    assert compose_render(out, "--inventory", ROOT / "examples" / "inventory.yaml").exit_code == 0
    providers = yaml.safe_load((out / "grafana" / "provisioning" / "dashboards" / "gpufed.yml").read_text())
    assert len({p["folder"] for p in providers["providers"]}) > 2


def test_prometheus_target_still_needs_an_inventory(tmp_path: Path) -> None:
    result = invoke("render", "--spec", ROOT / "examples" / "federation.yaml", "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert "--inventory" in result.output and not (tmp_path / "out").exists()


def test_render_root_refuses_foreign_files(tmp_path: Path) -> None:
    root = tmp_path / "render"
    root.mkdir()
    (root / "monitoring.env").write_text("GPUFED_TOKEN=secret\n")
    result = compose_render(root / "current")
    assert result.exit_code == 2
    assert "monitoring.env" in result.output and "only rendered trees" in result.output
    assert not (root / "current").exists()


def test_rerender_swaps_beside_other_trees(tmp_path: Path) -> None:
    root = tmp_path / "render"
    assert compose_render(root / "current").exit_code == 0
    assert compose_render(root / "staging-test").exit_code == 0  # a second tree is allowed
    first = (root / "current" / "compose" / "monitoring.yml").read_bytes()
    assert compose_render(root / "current").exit_code == 0  # swap by rename, lock file beside
    assert (root / "current" / "compose" / "monitoring.yml").read_bytes() == first
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["current", "staging-test"]


def test_repository_root_is_refused(tmp_path: Path) -> None:
    # the old documented `--out out` from the repository root: the root holds source and env files
    result = compose_render(ROOT / "out-test-never-written")
    assert result.exit_code == 2 and "only rendered trees" in result.output
    assert not (ROOT / "out-test-never-written").exists()
