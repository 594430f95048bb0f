"""The docs are a site that builds, a README that fits on a screen or two, a reference that
matches the code, and CLI help that reads whole at 80 columns."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines: move detail into docs/"


def test_site_builds_strict(tmp_path: Path) -> None:
    """A broken link, a page missing from the nav or a bad anchor fails the build."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "alerts" / "index.html").is_file()


def test_reference_pages_match_the_code() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "reference_docs.py"), "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr


def test_reference_lists_every_alert_of_the_pack() -> None:
    import yaml

    text = (ROOT / "docs" / "reference" / "alerts.md").read_text(encoding="utf-8")
    for path in (ROOT / "federation" / "rules").glob("*.yml"):
        for group in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("groups", []):
            for rule in group["rules"]:
                if "alert" in rule:
                    assert f"`{rule['alert']}`" in text, rule["alert"]


@pytest.mark.parametrize(
    "command",
    [["gpufed", "serve"], ["gpufed", "demo"], ["gpufed", "render"], ["gpufed", "size"],
     ["gpufed-exporter", "serve"], ["gpufed-dingtalk"]],
)
def test_help_reads_whole_at_80_columns(command: list[str]) -> None:
    exe = shutil.which(command[0], path=str(Path(sys.executable).parent))
    assert exe, command[0]
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"}
    done = subprocess.run([exe, *command[1:], "--help"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    cut = [line for line in done.stdout.splitlines() if "…" in line]
    assert not cut, "cut at 80 columns:\n" + "\n".join(cut)
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
