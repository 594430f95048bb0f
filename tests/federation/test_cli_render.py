"""``gpufed render`` and ``gpufed plan`` through typer's runner, with the real promtool."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from federation.commands import render
from federation.master import pipeline
from sharder.kernel import output
from sharder.kernel.errors import AssignmentError
from sharder.kernel.promtool import Promtool
from tests.conftest import stack_tool

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "federation.yaml"
INVENTORY = ROOT / "examples" / "inventory.yaml"

SMALL_SPEC = """\
cluster: gpu-test
regions:
  - name: cn-beijing
    shards: 2
jobs:
  - name: gpu
  - name: node
"""
SMALL_INVENTORY = """\
defaults: {exporters: {gpu: 9400, node: 9100}}
nodes:
  - {name: n1, address: 10.0.0.1, region: cn-beijing, gpus: 8}
  - {name: n2, address: 10.0.0.2, region: cn-beijing, gpus: 4}
  - {name: n3, address: 10.0.0.3, region: cn-beijing, gpus: 8}
"""


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)
    render.register(app)
    return app


def invoke(app: typer.Typer, *args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_inputs(
    tmp_path: Path, *, spec: str = SMALL_SPEC, inventory: str = SMALL_INVENTORY
) -> tuple[Path, Path]:
    spec_path, inventory_path = tmp_path / "federation.yaml", tmp_path / "inventory.yaml"
    spec_path.write_text(spec)
    inventory_path.write_text(inventory)
    return spec_path, inventory_path


def test_render_example_is_checked_and_repeatable(app: typer.Typer, tmp_path: Path, promtool: str) -> None:
    out = tmp_path / "out"
    first = invoke(app, "render", "--spec", SPEC, "--inventory", INVENTORY, "--out", out, "--json")
    assert first.exit_code == 0, first.output
    info = json.loads(first.stdout)
    assert info["checked"] == info["children"] > 20
    assert info["targets"] == 620 and info["first_run"] is True
    assert set(info["regions"]) == {"cn-beijing", "cn-shanghai", "cn-hangzhou"}
    assert info["regions"]["cn-hangzhou"]["shards"] == 4
    before = tree(out)
    assert set(before) >= {"manifest.json", "assignment.json"}

    again = invoke(app, "render", "--spec", SPEC, "--inventory", INVENTORY, "--out", out)
    assert again.exit_code == 0, again.output
    assert "0 added, 0 removed, 0 moved" in " ".join(again.stdout.split()) and "cn-beijing" in again.stdout
    assert tree(out) == before, "same input, same bytes"


def test_render_failing_promtool_leaves_previous_output_untouched(
    app: typer.Typer, tmp_path: Path, promtool: str
) -> None:
    spec_path, inventory_path = write_inputs(tmp_path)
    out = tmp_path / "out"
    assert (
        invoke(app, "render", "--spec", spec_path, "--inventory", inventory_path, "--out", out).exit_code == 0
    )
    before = tree(out)
    # Everything Prometheus is known to refuse (a reserved remote_write header here) is
    # refused at spec load now, exit 2, before promtool runs.
    spec_path.write_text(
        SMALL_SPEC + "remote_write:\n  - {name: m, url: 'http://m/w', headers: {User-Agent: gpufed}}\n"
    )
    refused = invoke(app, "render", "--spec", spec_path, "--inventory", inventory_path, "--out", out)
    assert refused.exit_code == 2
    assert "field 'remote_write[0].headers' User-Agent is a header Prometheus sets itself" in refused.stderr
    assert tree(out) == before
    # promtool stays the last word: a stand-in that refuses every config (the real one
    # accepts every config gpufed now renders) shows the exit code, message and no swap.
    write_inputs(tmp_path)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "promtool").write_text(
        "#!/bin/sh\necho 'Checking config'\necho '  FAILED: stand-in refuses it' >&2\nexit 1\n"
    )
    (fake / "promtool").chmod(0o755)
    args = ["render", "--spec", spec_path, "--inventory", inventory_path, "--out", out]
    result = CliRunner().invoke(app, [str(a) for a in args], env={"PATH": f"{fake}:{os.environ['PATH']}"})
    assert result.exit_code == 1
    assert result.stderr == (
        "error: children/cn-beijing-0/prometheus.yml: promtool check config failed: stand-in refuses it"
        " (and 1 more configs failed)\n"
    )
    (fake / "promtool").unlink()
    fake.rmdir()
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["federation.yaml", "inventory.yaml", "out"]


def test_no_check_skips_promtool(app: typer.Typer, tmp_path: Path) -> None:
    spec_path, inventory_path = write_inputs(tmp_path)
    out = tmp_path / "out"
    result = invoke(
        app, "render", "--spec", spec_path, "--inventory", inventory_path, "--out", out, "--no-check"
    )
    assert result.exit_code == 0, result.output
    assert "configs not checked; 6 added, 0 removed, 0 moved (first run)" in " ".join(result.stdout.split())
    assert (out / "children" / "cn-beijing-1" / "targets" / "gpu.json").is_file()


BAD_INPUTS = {
    "malformed_yaml": (
        "spec",
        "cluster: gpu-test\nregions: [\n",
        "{spec}: malformed YAML: while parsing a flow node; did not find expected node content"
        " (line 3, column 1)",
    ),
    "wrong_type": (
        "spec",
        SMALL_SPEC + "sharding: {targets_per_shard: many}\n",
        "{spec}: field 'sharding.targets_per_shard' Input should be a valid integer, unable to parse string"
        " as an integer (value 'many')",
    ),
    "zero_shards": (
        "spec",
        SMALL_SPEC.replace("shards: 2", "shards: 0"),
        "{spec}: field 'regions[0].shards' Input should be greater than or equal to 1 (value 0)",
    ),
    "unknown_region": (
        "inventory",
        SMALL_INVENTORY + "  - {name: x1, address: 10.9.0.1, region: eu-west, gpus: 8}\n",
        "target '10.9.0.1:9100' is in region 'eu-west', which the spec does not define",
    ),
    "duplicate_target": (
        "inventory",
        SMALL_INVENTORY + "  - {name: n4, address: 10.0.0.1, region: cn-beijing}\n",
        "{inventory}: field 'nodes[3].address' duplicate target (also at nodes[0]) (value '10.0.0.1:9400')",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_error_line_and_exit_2(app: typer.Typer, tmp_path: Path, case: str) -> None:
    which, text, expected = BAD_INPUTS[case]
    spec_path, inventory_path = write_inputs(tmp_path, **{which: text})
    out = tmp_path / "out"
    result = invoke(app, "render", "--spec", spec_path, "--inventory", inventory_path, "--out", out)
    assert result.exit_code == 2
    assert result.stdout == ""
    message = "error: " + expected.format(spec=spec_path, inventory=inventory_path)
    if case == "unknown_region":  # the engine's wording past the region is its own business
        assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    else:
        assert result.stderr == message + "\n"
    assert not out.exists()


def test_plan_shows_moves_without_writing(app: typer.Typer, tmp_path: Path) -> None:
    spec_path, inventory_path = write_inputs(tmp_path)
    out = tmp_path / "out"
    invoke(app, "render", "--spec", spec_path, "--inventory", inventory_path, "--out", out, "--no-check")
    before = tree(out)
    spec_path.write_text(SMALL_SPEC.replace("shards: 2", "shards: 3"))
    result = invoke(
        app, "plan", "--spec", spec_path, "--inventory", inventory_path, "--previous", out, "--json"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (
        data
        == pipeline.plan(*pipeline.load_inputs(spec_path, inventory_path), previous_dir=out).to_json_dict()
    )
    table = invoke(app, "plan", "--spec", spec_path, "--inventory", inventory_path, "--previous", out)
    assert table.exit_code == 0, table.output
    assert "cn-beijing-2" in table.stdout
    assert tree(out) == before


def test_pipeline_render_refuses_an_algorithm_switch(tmp_path: Path, promtool: str) -> None:
    spec, targets = pipeline.load_inputs(*write_inputs(tmp_path))
    out = tmp_path / "out"
    result = pipeline.render(spec, targets, out=out, checker=None)
    pinned = result.assignment.model_copy(update={"algorithm": "consistent-hash"})
    (out / output.ASSIGNMENT_FILE).write_bytes(output.dump_json(pinned.model_dump(mode="json")))
    with pytest.raises(AssignmentError, match="--allow-algorithm-change"):
        pipeline.render(spec, targets, out=out, checker=None)
    again = pipeline.render(spec, targets, out=out, checker=Promtool(promtool), allow_algorithm_change=True)
    assert again.assignment.algorithm == "bounded-ring"


@pytest.mark.parametrize(
    ("version", "path_line", "code"), [("2.53", 3, 2), ("3", 2, 2), ("2.53", 2, 0), ("3", 3, 0)]
)
def test_render_checks_with_the_promtool_of_the_specs_line(
    app: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, path_line: int, code: int
) -> None:
    spec = SMALL_SPEC + f"prometheus: {{version: '{version}'}}\n"
    spec_path, inventory_path = write_inputs(tmp_path, spec=spec)
    tools = Path(stack_tool(path_line, "promtool")).parent
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    result = invoke(app, "render", "--spec", spec_path, "--inventory", inventory_path, "--out", out)
    assert result.exit_code == code, result.output
    if code:
        said = " ".join(result.output.split())
        assert f"but the spec's prometheus.version renders for {version[0]}.x" in said
        assert not out.exists()


@pytest.mark.parametrize(("version", "path_line", "refused"), [("3", 2, True), ("2.53", 3, False)])
def test_serve_refuses_a_promtool_that_would_refuse_what_it_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, path_line: int, refused: bool
) -> None:
    """``gpufed serve``: a 2.x promtool refuses every 3.x config, so it stops at start; a 3.x one
    checks a 2.53 spec's configs (the controller image carries 3.x), so that one goes on."""
    from federation.commands import serve
    from federation.localrun.loopback import free_port

    spec_path, _ = write_inputs(tmp_path, spec=SMALL_SPEC + f"prometheus: {{version: '{version}'}}\n")
    tools = Path(stack_tool(path_line, "promtool")).parent
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    app = typer.Typer(pretty_exceptions_enable=False)
    serve.register(app)
    app.command("noop", hidden=True)(lambda: None)
    # An empty --store makes the start fail after the check: enough to tell the two apart.
    result = invoke(app, "serve", "--spec", spec_path, "--data-dir", tmp_path / "data",
                    "--listen", f"127.0.0.1:{free_port()}", "--store", "nope://")
    said = " ".join(result.output.split())
    assert ("but the spec's prometheus.version renders for 3.x" in said) == refused, said
    assert result.exit_code != 0
