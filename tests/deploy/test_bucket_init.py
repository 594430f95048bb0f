"""bucket-init's script, as Compose hands it to the container's ``sh``: run by the real
``sh`` with a stand-in ``mc`` that records its calls (MinIO's client does not run here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from conftest import ROOT
from typer.testing import CliRunner

from federation.master import compose_objstore

FAKE_MC = """#!/bin/sh
(IFS='|'; printf '%s\\n' "$*") >> "$MC_LOG"   # one line per call, arguments split by |
if [ "$1" = pipe ]; then cat > /dev/null; fi
"""


def run_script(script: str, tmp_path: Path) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "mc").write_text(FAKE_MC)
    (bin_dir / "mc").chmod(0o755)
    log = tmp_path / "mc.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MC_LOG": str(log),
           "MINIO_ROOT_USER": "ak-0123", "MINIO_ROOT_PASSWORD": "sk with space"}
    # Compose turns $$ into $ before the container sees the command.
    done = subprocess.run(["sh", "-c", script.replace("$$", "$")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines()


def test_makes_bucket_and_prefixes_with_the_credentials(tmp_path: Path) -> None:
    script = compose_objstore.init_script(bucket="gpufed", prefixes=["loki", "/thanos/", ""])
    calls = run_script(script, tmp_path)
    assert calls == [
        "alias|set|gpufed|http://minio:9000|ak-0123|sk with space",
        "mb|--ignore-existing|gpufed/gpufed",
        "pipe|gpufed/gpufed/loki/.gpufed-prefix",
        "pipe|gpufed/gpufed/thanos/.gpufed-prefix",
        "ls|gpufed/gpufed",
    ]
    # a second run asks for the same things: nothing in it fails on a store that has them
    (tmp_path / "mc.log").unlink()
    assert run_script(script, tmp_path) == calls


def test_a_failing_mc_call_fails_the_service(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # mc that fails only on `mb`: the markers and `ls` after it must not run
    (bin_dir / "mc").write_text('#!/bin/sh\nprintf "%s\\n" "$1" >> "$MC_LOG"\n[ "$1" != mb ]\n')
    (bin_dir / "mc").chmod(0o755)
    log = tmp_path / "mc.log"
    script = compose_objstore.init_script(bucket="gpufed", prefixes=["loki"])
    done = subprocess.run(["sh", "-c", script.replace("$$", "$")], capture_output=True, text=True,
                          env={**os.environ, "MINIO_ROOT_USER": "a", "MINIO_ROOT_PASSWORD": "b",
                               "PATH": f"{bin_dir}:{os.environ['PATH']}", "MC_LOG": str(log)}, timeout=30)
    assert done.returncode != 0  # set -e: Thanos and Loki then never start on a missing bucket
    assert log.read_text().split() == ["alias", "mb"]


def test_the_rendered_service_runs_this_script(tmp_path: Path) -> None:
    import typer

    from federation.commands import render

    app = typer.Typer()
    render.register(app)
    out = tmp_path / "render" / "current"
    spec = ROOT / "compose" / "federation.yaml"
    result = CliRunner().invoke(app, ["render", "--spec", str(spec), "--out", str(out), "--target", "compose",
                                      "--no-check"])
    assert result.exit_code == 0, result.output
    services = yaml.safe_load((out / "compose" / "monitoring.yml").read_text())["services"]
    prefix = yaml.safe_load(spec.read_text())["logs"]["storage_prefix"]
    assert services["bucket-init"]["entrypoint"] == [
        "sh", "-c", compose_objstore.init_script(bucket="gpufed", prefixes=[prefix])]
    assert services["bucket-init"]["depends_on"] == {"minio": {"condition": "service_healthy"}}
