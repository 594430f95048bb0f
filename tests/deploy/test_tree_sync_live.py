"""The chart's tree-sync script against a real ``gpufed serve`` (issue 38, item 1).

A 40-team Grafana tree is more files than a client without a token may fetch at once
(``--read-burst``): the chart gives its readers a read-scope token (``GPUFED_READ_TOKEN``
in the controller's Secret, derived from the write token), so with the chart's default
read settings the tree syncs on the first try. Without it the same script, one try, is
throttled: the budget is real, and the token is what lets the install through.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import ROOT, require_tool, wait_for
from test_logs_deploy import LOGS_VALUES, _chart_objects, _named

from tests.controller.serve_process import ServeProcess

TEAMS = 40


def _chart() -> list[dict[str, Any]]:
    values = yaml.safe_load(LOGS_VALUES.read_text())
    values["controller"]["token"] = {"existingSecret": "", "value": "9f3c2a7b5e1d4c8a6b0e2f4d"}
    return _chart_objects(values)


def _spec(path: Path) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "federation.yaml").read_text())
    doc["grafana"]["teams"] = {f"team-{i:02d}": {"namespaces": [f"ns-{i:02d}"]} for i in range(TEAMS)}
    path.write_text(yaml.safe_dump(doc))
    return path


def _sync(script: Path, *, url: str, into: Path, token: str | None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "GPUFED_URL": url, "CONFIG_DIR": str(into), "RETRIES": "1"}
    env["PREFIX"] = "grafana/"
    if token is not None:
        env["GPUFED_READ_TOKEN"] = token
    return subprocess.run(
        [require_tool("sh"), str(script)], capture_output=True, text=True, timeout=300, check=False, env=env
    )


@pytest.fixture
def serving(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """``gpufed serve`` with the chart's default read settings; ``indirect`` parameters add flags."""
    flags: tuple[str, ...] = getattr(request, "param", ())
    objects = _chart()
    secret = _named(objects, "Secret", "gpufed-controller-token")["stringData"]
    deployment = _named(objects, "Deployment", "gpufed-grafana")
    init = deployment["spec"]["template"]["spec"]["initContainers"][0]
    wired = {e["name"]: e for e in init["env"]}["GPUFED_READ_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (wired["name"], wired["key"]) == ("gpufed-controller-token", "GPUFED_READ_TOKEN")
    script = tmp_path / "tree-sync.sh"
    script.write_text(_named(objects, "ConfigMap", "gpufed-tree-sync")["data"]["tree-sync.sh"])
    serve = ServeProcess(
        spec=_spec(tmp_path / "spec.yaml"),
        data_dir=tmp_path / "data",
        log=tmp_path / "serve.log",
        extra=("--no-check", "--inventory", str(ROOT / "examples" / "inventory.yaml"), *flags),
        env={"GPUFED_READ_TOKEN": secret["GPUFED_READ_TOKEN"]},  # the Secret's keys, as envFrom gives them
    )
    with serve:
        auth = {"Authorization": f"Bearer {secret['GPUFED_READ_TOKEN']}"}

        def published() -> dict[str, int] | None:
            files = httpx.get(f"{serve.url}/v1/configs", headers=auth, timeout=10).json()["files"]
            grafana = {f["path"]: f["bytes"] for f in files if f["path"].startswith("grafana/")}
            return grafana if len(grafana) > 2 * TEAMS else None

        files = wait_for(published, timeout=120, what="the grafana/ tree published")
        yield serve, script, secret["GPUFED_READ_TOKEN"], files


def test_a_40_team_grafana_tree_syncs_on_the_first_try(serving: Any, tmp_path: Path) -> None:
    serve, script, token, files = serving
    done = _sync(script, url=serve.url, into=tmp_path / "config", token=token)
    assert done.returncode == 0, done.stderr
    copied = {
        p.relative_to(tmp_path / "config").as_posix(): p.stat().st_size
        for p in (tmp_path / "config").rglob("*")
        if p.is_file()
    }
    assert copied == files


@pytest.mark.parametrize("serving", [("--read-rate", "0.001")], indirect=True)
def test_without_the_read_token_the_same_tree_is_throttled(serving: Any, tmp_path: Path) -> None:
    """The default burst, refilled (almost) not at all so the count decides, not the clock:
    more files than --read-burst (100) units, so one tokenless try stops part way."""
    serve, script, _token, files = serving
    assert len(files) > 100
    done = _sync(script, url=serve.url, into=tmp_path / "config", token=None)
    assert done.returncode == 1
    tree = (tmp_path / "config").rglob("*")
    copied = [p for p in tree if p.is_file() and p.suffix not in (".tmp", ".done")]
    assert 0 < len(copied) < len(files)
    limited = httpx.get(f"{serve.url}/v1/configs", timeout=10)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
