"""Every command's ``--help`` renders (rich markup in a help text once broke ``gpufed serve --help``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from federation.commands import cli


def commands() -> list[list[str]]:
    cli._register()
    out: list[list[str]] = [[]]
    for command in cli.app.registered_commands:
        out.append([command.name or command.callback.__name__])  # type: ignore[union-attr]
    for group in cli.app.registered_groups:
        for command in group.typer_instance.registered_commands:  # type: ignore[union-attr]
            out.append([str(group.name), command.name or command.callback.__name__])  # type: ignore[union-attr]
    return out


@pytest.mark.parametrize("words", commands(), ids=lambda words: " ".join(words) or "gpufed")
def test_help_renders(words: list[str]) -> None:
    result = CliRunner().invoke(cli.app, [*words, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
