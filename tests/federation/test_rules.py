"""The GPU rule pack: real ``promtool check rules`` and ``promtool test rules`` on every file.

Both pinned Prometheus lines run every file: 2.53.3 and 3.5.3 (``stack_tool``). Prometheus 3
made range selectors and the lookback left-open (a sample exactly ``range`` old is left out),
so a window sized for 2.x can hold one sample fewer on 3.x; the rule files say why each
window is what it is, and the unit tests pass unchanged on both lines.

Beyond promtool, the pack must cover the alerts the issue lists, and every alert must
carry the labels Alertmanager's inhibition compares (``GUARANTEED_LABELS``): each alert
is fired by at least one unit test, and every expected alert there has them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import stack_tool

from alertmanager.models import DEFAULT_INHIBIT_RULES, GUARANTEED_LABELS, SEVERITIES, WatchdogSpec
from federation.master import meta_monitoring

RULES = Path(__file__).resolve().parents[2] / "federation" / "rules"
RULE_FILES = sorted(RULES.glob("*.yml"))
TEST_FILES = sorted((RULES / "tests").glob("*_test.yml"))

REQUIRED_ALERTS = {
    "GPUMemoryUsageHigh",
    "GPUMemoryNearlyExhausted",
    "GPUCoreSaturated",
    "GPUIdle",
    "GPUXidError",
    "GPUXidErrorsIncreasing",
    "GPUEccDoubleBitErrors",
    "GPUTemperatureHigh",
    "GPUPowerNearLimit",
    "VGPUContainerMemoryNearLimit",
    "GPUClusterMemoryAllocationHigh",
    "GPUOvershared",
    "GPUSchedulingFailureRateHigh",
    "VGPUContainerIdle",
    "HAMiMonitorDown",
    "NodeDown",
    "GPUExporterDown",
    "ExporterDown",
    "PrometheusChildDown",
    "FederationShardTargetsDown",
    "FederationShardMissing",
    "PrometheusRemoteWriteBehind",
    "PrometheusRemoteWriteFailedSamples",
    "HostFilesystemFillingUp",
    "PrometheusStorageNearRetentionLimit",
    "LokiIngestionErrors",
    "LokiDiscardingLogs",
    "ObjectStoreUnreachable",
    "Watchdog",
}
#: Alerts about no series: their cluster/region are the evaluating Prometheus' external
#: labels (absent in promtool's unit tests). Watchdog is routed before everything else
#: and every inhibition source requires the `equal` labels, so it can mute nothing.
NO_SERIES = {"Watchdog"}
#: The master's own scrapes: their series carry no cluster in its TSDB (nor in a unit test);
#: the master adds its external cluster label when it sends the alert.
MASTER_JOBS = re.compile("|".join([
    meta_monitoring.CHILD_JOB, meta_monitoring.MASTER_JOB, meta_monitoring.CONTROLLER_JOB,
    meta_monitoring.ALERTMANAGER_JOB, meta_monitoring.RELAY_JOB, "thanos-.*",
]))
#: The pinned stack lines (requirements/stack.lock) and the promtool version each must be.
LINES = {2: "2.53.", 3: "3.5."}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def alert_rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in load(path)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def expected_alerts() -> list[tuple[str, dict[str, str]]]:
    """(alertname, labels) of every alert some unit test expects to fire."""
    out = []
    for path in TEST_FILES:
        for case in load(path)["tests"]:
            for check in case.get("alert_rule_test", []):
                out += [(check["alertname"], alert["exp_labels"]) for alert in check.get("exp_alerts") or []]
    return out


def run(args: list[str], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("line", sorted(LINES))
def test_each_line_runs_its_own_promtool(line: int) -> None:
    """Two parametrized runs of one binary would prove nothing: each line is its version."""
    done = run([stack_tool(line, "promtool"), "--version"], cwd=RULES)
    found = re.search(r"version (\S+)", done.stdout + done.stderr)
    assert found and found.group(1).startswith(LINES[line]), done.stdout + done.stderr


@pytest.mark.parametrize("line", sorted(LINES))
@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(line: int, path: Path) -> None:
    done = run([stack_tool(line, "promtool"), "check", "rules", path.name], cwd=RULES)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("line", sorted(LINES))
@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(line: int, path: Path) -> None:
    done = run([stack_tool(line, "promtool"), "test", "rules", path.name], cwd=path.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_file_has_unit_tests() -> None:
    tested = {name for path in TEST_FILES for name in load(path)["rule_files"]}
    assert {f"../{path.name}" for path in RULE_FILES} == tested


def test_pack_covers_the_issue_list() -> None:
    names = {rule["alert"] for rule in alert_rules()}
    assert not REQUIRED_ALERTS - names, sorted(REQUIRED_ALERTS - names)


def test_every_alert_declares_severity_and_component() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["labels"].get("component"), rule["alert"]
        assert {"summary", "description"} <= rule.get("annotations", {}).keys(), rule["alert"]


def test_every_alert_fires_in_a_unit_test_with_the_guaranteed_labels() -> None:
    expected = expected_alerts()
    fired = {(name, labels["severity"]) for name, labels in expected}
    declared = {(rule["alert"], rule["labels"]["severity"]) for rule in alert_rules()}
    assert declared <= fired, sorted(declared - fired)
    for name, labels in expected:
        missing = GUARANTEED_LABELS - {"alertname"} - labels.keys()
        if name in NO_SERIES:
            missing -= {"cluster", "region"}
        if MASTER_JOBS.fullmatch(labels.get("job", "")):
            missing -= {"cluster"}
        assert not missing, f"{name} {labels} lacks {sorted(missing)}"


def test_watchdog_alert_matches_the_rendered_route() -> None:
    rule = next(rule for rule in alert_rules() if rule["alert"] == WatchdogSpec().alertname)
    assert rule["expr"] == "vector(1)" and "for" not in rule


def test_default_inhibition_matches_the_pack() -> None:
    """The default inhibit rules name NodeDown and component="gpu": both must exist here."""
    names = {rule["alert"] for rule in alert_rules()}
    components = {rule["labels"]["component"] for rule in alert_rules()}
    sources = [m for rule in DEFAULT_INHIBIT_RULES for m in rule.source_matchers]
    targets = [m for rule in DEFAULT_INHIBIT_RULES for m in rule.target_matchers]
    assert 'alertname="NodeDown"' in sources and "NodeDown" in names
    assert 'component="gpu"' in targets and "gpu" in components
