"""``gpufed demo`` through typer's runner: input it refuses before starting anything."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner, Result

from federation.commands import demo


def invoke(*args: str | Path) -> Result:
    app = typer.Typer(pretty_exceptions_enable=False)
    demo.register(app)
    app.command("noop", hidden=True)(lambda: None)  # keeps "demo" a named subcommand
    return CliRunner().invoke(app, ["demo", *(str(a) for a in args)])


def test_a_bad_layout_is_one_line_naming_the_flags(tmp_path: Path) -> None:
    result = invoke("--nodes", "2", "--regions", "3", "--data-dir", tmp_path / "demo")
    assert result.exit_code == 2
    assert result.output.strip() == "error: --regions (3) cannot exceed --nodes (2)"
    assert not (tmp_path / "demo").exists()


def test_a_directory_the_demo_did_not_write_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    result = invoke("--data-dir", tmp_path, "--json")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert "holds files gpufed demo did not write" in summary["error"]
    assert summary["leftover_processes"] == 0 and set(summary["processes"]) == {"demo"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
