"""``gpufed demo`` for real: every process started, data through to the master, nothing left behind.

The first test runs the command as scripts do (``--duration 20 --nodes 12 --json``) and
checks the summary against the processes themselves (their PIDs are gone afterwards).
The second makes one component fail at start and checks that everything already
started is stopped. The third drives a running ``DemoStack`` the way the end-to-end
proofs of issue 13 will: a REST add-shard starts a child the controller reaches only
through the demo's router, a child is killed and restarted by name, and removing the
shard stops its child.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, require_tool, stack_tool, wait_for

from federation.demo.plan import Layout
from federation.demo.stack import DemoOptions, DemoStack
from federation.localrun import procstat

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SERVICES = {"controller", "fleet", "master", "relay", "alertmanager-0", "alertmanager-1"}


def run_demo(data: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-m", "federation.commands.cli", "demo", "--json", f"--data-dir={data}", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=env, check=False,
    )
    return done.returncode, json.loads(done.stdout), done.stderr


def assert_gone(processes: dict[str, dict[str, float]]) -> None:
    """Every process the demo reported (but itself) has exited: checked by PID, not by name."""
    alive = {name: p["pid"] for name, p in processes.items()
             if name != "demo" and procstat.read(int(p["pid"])) is not None}
    assert alive == {}


# Line 3 (first on PATH, the suite's default) and the one shared live run that keeps the
# 2.x line honest: 2.53.3 and Alertmanager 0.28.1 given with --prometheus/--alertmanager.
@pytest.mark.parametrize("line", [3, 2])
def test_demo_json_summary_after_the_duration(line: int, tmp_path: Path) -> None:
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    binaries = [] if line == 3 else [f"--prometheus={stack_tool(2, 'prometheus')}",
                                     f"--alertmanager={stack_tool(2, 'prometheus-alertmanager')}"]
    code, summary, stderr = run_demo(tmp_path / "demo", "--duration=20", "--nodes=12", *binaries)
    assert code == 0, stderr
    # The demo read the binaries' releases and wrote them into its spec.
    prometheus, alertmanager = {3: ("3.", "0.33."), 2: ("2.53.", "0.28.")}[line]
    assert summary["prometheus_version"].startswith(prometheus), summary["prometheus_version"]
    assert summary["alertmanager_version"].startswith(alertmanager), summary["alertmanager_version"]
    written = (tmp_path / "demo" / "spec.yaml").read_text()
    assert f"version: '{summary['prometheus_version'].rsplit('.', 1)[0]}'" in written
    assert (summary["nodes"], summary["gpus"], summary["targets_expected"]) == (12, 96, 12)
    assert summary["shards"] == summary["children"] == 3
    # Every simulated node's series reached the master, per region as the fleet deals them.
    assert summary["targets_up_at_master"] == 12, stderr
    assert summary["targets_up_by_region"] == {"region-0": 4, "region-1": 4, "region-2": 4}
    assert summary["series_at_master"] > 12 * 100  # ~175 series a node, plus the master's own
    # The master's rendered meta-monitoring: every component found and up, no job added here.
    meta = {"alertmanager": 2, "gpufed-child": 3, "gpufed-controller": 1, "gpufed-dingtalk": 1,
            "gpufed-master": 1}
    assert summary["up_count_by_job_at_master"] == {**meta, "gpu": 12}, stderr
    assert summary["up_by_job_at_master"] == {**meta, "gpu": 12}, stderr
    # The rule pack's Watchdog went master -> both Alertmanagers -> the heartbeat receiver.
    assert summary["alerts_firing_at_master"].get("Watchdog") == 1
    assert summary["heartbeats"] >= 1, stderr
    assert summary["alerts_refused"] == 0  # every relay message was signed as DingTalk wants
    assert summary["leftover_processes"] == 0
    # As run, not as asked: from ready to the stop (the 0.5 s run loop may overshoot a little).
    assert summary["duration_requested_s"] == 20 and 19.5 <= summary["duration_s"] <= 30
    assert summary["exited"] == [] and summary["restarts"] == {} and summary["restart_enabled"] is False
    names = set(summary["processes"])
    assert SERVICES | {"demo", "child/region-0-0", "child/region-1-0", "child/region-2-0"} == names
    assert all(p["cpu_s"] > 0 and p["rss_mib"] > 0 for p in summary["processes"].values())
    assert_gone(summary["processes"])
    assert summary["urls"]["web"].endswith("/") and summary["urls"]["api_docs"].endswith("/docs")
    assert "ready in" in stderr and "✓ master" in stderr
    assert "left out (what compose or Helm would also run): Grafana" in stderr


READY = re.compile(r"ready in \d+ s")
"""The demo's own ready line (a bare "ready in" also matches "already in use")."""


def _background_demo(tmp_path: Path, attempt: int) -> tuple[subprocess.Popen[str], int, Path, Path, Path]:
    """``gpufed demo --restart`` started as a script's ``&`` job; (shell, demo pid, data, out, err)."""
    data, out, err = (tmp_path / f"demo{attempt}", tmp_path / f"out{attempt}.json",
                      tmp_path / f"err{attempt}.txt")
    script = '"$@" > "$OUT" 2> "$ERR" & echo $!; wait'  # no job control: the job ignores SIGINT
    argv = [sys.executable, "-m", "federation.commands.cli", "demo", "--json", f"--data-dir={data}",
            "--nodes=3", "--regions=1", "--restart"]
    shell = subprocess.Popen(["/bin/sh", "-c", script, "sh", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "OUT": str(out), "ERR": str(err)})
    assert shell.stdout is not None
    with shell.stdout:
        pid = int(shell.stdout.readline())
    return shell, pid, data, out, err


def _stop(shell: subprocess.Popen[str], pid: int) -> None:
    if shell.poll() is None:
        os.kill(pid, 15)  # the demo stops what it started
        try:
            shell.wait(timeout=60)
        except subprocess.TimeoutExpired:
            shell.kill()
            shell.wait()


def test_sigint_stops_a_demo_started_in_the_background_and_restart_brings_back_a_dead_child(
    tmp_path: Path,
) -> None:
    """A script's ``gpufed demo &`` starts with SIGINT ignored: the demo installs its own.

    ``--restart`` starts a killed child again, and the JSON lists the exit and the count. The
    demo picks its ports free up front; when another test's process binds one first (two
    workers share the machine), the demo stops with "address already in use" and the test
    starts it once more.
    """
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    for attempt in range(2):
        shell, pid, data, out, err = _background_demo(tmp_path, attempt)
        try:
            # the background job opens its redirections after `echo $!`: err.txt may not exist yet
            def settled(err: Path = err, shell: subprocess.Popen[str] = shell) -> bool:
                return err.exists() and bool(READY.search(err.read_text()) or shell.poll() is not None)

            wait_for(settled, timeout=180, what="the demo ready or stopped")
            text = err.read_text()
            if READY.search(text):
                break
            assert attempt == 0 and "address already in use" in text, text
        finally:
            if not READY.search(err.read_text() if err.exists() else ""):
                _stop(shell, pid)
    try:
        child = json.loads((data / "pids.json").read_text())["child/region-0-0"]["pid"]
        os.kill(child, 9)
        wait_for(lambda: "restarting it (restart 1)" in err.read_text(), timeout=30, what="the restart")
        os.kill(pid, 2)  # SIGINT
        assert shell.wait(timeout=120) == 0, err.read_text()
    finally:
        _stop(shell, pid)
    summary = json.loads(out.read_text())
    assert summary["restarts"] == {"child/region-0-0": 1} and summary["restart_enabled"] is True
    (exit_,) = summary["exited"]
    assert exit_["name"] == "child/region-0-0" and exit_["status"] == -9 and exit_["at"].endswith("Z")
    assert summary["duration_requested_s"] is None and summary["duration_s"] > 0
    assert summary["leftover_processes"] == 0 and "stopping" in err.read_text()
    assert_gone(summary["processes"])


def test_a_component_failing_at_start_stops_everything_started_before(tmp_path: Path) -> None:
    require_tool("prometheus-alertmanager")
    fake = tmp_path / "bin"
    fake.mkdir()
    # It names its release (the demo reads it first), then refuses to start.
    (fake / "prometheus").write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && echo 'prometheus, version 3.5.3' && exit 0\n"
        "echo 'prometheus: this one refuses to start' >&2\nexit 1\n"
    )
    (fake / "prometheus").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    code, summary, _ = run_demo(tmp_path / "demo", "--duration=5", "--nodes=3", env=env)
    assert code == 1
    assert re.search(r"master exited with status 1", summary["error"]), summary["error"]
    assert "this one refuses to start" in summary["error"]
    assert SERVICES - {"master"} <= set(summary["processes"])
    assert summary["leftover_processes"] == 0
    assert_gone(summary["processes"])


def test_stack_follows_shards_added_and_removed_over_rest(tmp_path: Path) -> None:
    require_tool("prometheus")
    lines: list[str] = []
    stack = DemoStack(DemoOptions(layout=Layout(nodes=12), data_dir=tmp_path / "demo"), say=lines.append,
                      show_messages=False)
    api, auth = stack.controller_url, {"Authorization": f"Bearer {stack.token}"}

    def change(body: dict[str, Any]) -> dict[str, Any]:
        planned = stack.http.post(f"{api}/v1/plan", json=body, headers=auth).json()
        applied: dict[str, Any] = stack.http.post(
            f"{api}/v1/rebalance", json={"version": planned["version"]}, headers=auth).json()
        assert applied["applied"], applied
        return applied

    def shard_row(shard: str) -> dict[str, Any] | None:
        rows = stack.http.get(f"{api}/v1/shards").json()["shards"]
        return next((row for row in rows if row["shard"] == shard), None)

    try:
        stack.start()
        assert stack.running_children() == ["region-0-0", "region-1-0", "region-2-0"]
        added = change({"add_shard": ["region-0"], "reason": "e2e"})
        assert added["counts"]["shards_added"] == 1 and added["counts"]["moved"] >= 1
        wait_for(lambda: "region-0-1" in stack.running_children(), timeout=90,
                 what="a child for the new shard")
        # Not given to `gpufed serve` at start: the controller reaches it through the router.
        wait_for(lambda: (shard_row("region-0-1") or {}).get("children", [{}])[0].get("reachable"),
                 timeout=60, what="the controller reaching child region-0-1")
        wait_for(lambda: stack.http.get(f"{api}/v1/handovers").json()["handovers"] == [], timeout=90,
                 what="the hand-overs to finish")

        first = stack.supervisor.get("child/region-0-1").pid
        stack.supervisor.kill("child/region-0-1")
        wait_for(lambda: "child/region-0-1" in stack.supervisor.exited(), timeout=30, what="the kill")
        assert "region-0-1" not in stack.running_children()  # nothing restarts by itself
        assert stack.supervisor.restart("child/region-0-1").pid != first
        assert "region-0-1" in stack.running_children()

        change({"remove_shard": ["region-0"]})
        wait_for(lambda: "region-0-1" not in stack.running_children(), timeout=90,
                 what="the removed shard's child stopped")
        assert shard_row("region-0-1") is None
    finally:
        summary = stack.finish(duration=None)
    assert summary["leftover_processes"] == 0, summary
    assert any("+ child/region-0-1 started" in line for line in lines)
    assert any("- child/region-0-1 stopped" in line for line in lines)
    assert_gone(summary["processes"])


def test_a_killed_child_fires_the_rule_packs_child_down_alert(tmp_path: Path) -> None:
    """The shipped rule pack over the master's rendered config: no scrape job added by this test."""
    require_tool("prometheus")
    require_tool("prometheus-alertmanager")
    stack = DemoStack(DemoOptions(layout=Layout(nodes=6), data_dir=tmp_path / "demo"), say=lambda _: None,
                      show_messages=False)
    config = (tmp_path / "demo" / "config" / "master" / "prometheus.yml")

    def child_down() -> list[dict[str, Any]]:
        alerts = stack.http.get(f"{stack.master_url}/api/v1/alerts").json()["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "PrometheusChildDown"]

    try:
        stack.start()
        rendered = config.read_text()
        assert "/v1/sd-children" in rendered and "file_sd" not in rendered
        stack.supervisor.kill("child/region-1-0")
        wait_for(lambda: [a["state"] for a in child_down()] == ["pending"], timeout=60, interval=1,
                 what="the alert pending")
        wait_for(lambda: [a["state"] for a in child_down()] == ["firing"], timeout=240, interval=2,
                 what="PrometheusChildDown firing (for: 3m)")
        (alert,) = child_down()
        assert (alert["labels"]["child"], alert["labels"]["region"]) == ("region-1-0", "region-1")
        assert alert["labels"]["job"] == "gpufed-child" and alert["labels"]["severity"] == "critical"
        assert config.read_text() == rendered  # the demo never rewrote the master's config
    finally:
        summary = stack.finish(duration=None)
    assert summary["leftover_processes"] == 0, summary
