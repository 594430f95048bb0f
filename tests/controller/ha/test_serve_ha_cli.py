"""``gpufed serve`` replication flags through typer's runner: bad values name their flag."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from federation.commands.cli import _register, app
from tests.controller.harness import TOKEN, write_spec


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lock-ttl", "5"], "--lock-ttl"),
        (["--lock-delay", "61"], "--lock-delay"),
        (["--leader-election", "consul"], "--leader-election consul needs a shared store"),
        (["--store", "etcd://127.0.0.1:2379"], "--store: expected consul://HOST:PORT[/prefix]"),
        (
            ["--leader-election", "raft", "--store", "consul://127.0.0.1:1"],
            "expected kubernetes, consul or none",
        ),
        (
            ["--store", "consul://127.0.0.1:1", "--leader-election", "consul", "--listen", "0.0.0.0:8080"],
            "--advertise-url",
        ),
        (["--advertise-url", "ftp://x"], "--advertise-url"),
    ],
)
def test_bad_replication_settings_exit_naming_the_flag(tmp_path: Path, args: list[str], message: str) -> None:
    _register()
    spec = tmp_path / "spec.yaml"
    write_spec(spec)
    result = CliRunner().invoke(
        app,
        ["serve", "--spec", str(spec), "--data-dir", str(tmp_path / "d"), *args],
        env={"GPUFED_TOKEN": TOKEN},
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
