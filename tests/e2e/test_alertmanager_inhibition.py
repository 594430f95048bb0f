"""End to end: the rendered inhibition rules, evaluated by a real Alertmanager 0.25.

Alertmanager counts a label that two alerts both lack as equal, so before the guard a
NodeDown without ``node`` muted every GPU alert without ``node``, and a critical alert
without cluster/region/node muted every warning of its name without them. The alerts
here are posted to a replica running the rendered config (default inhibition rules plus
one user rule); ``/api/v2/alerts`` then reports what each alert is inhibited by. Each
case has a positive control in its own region, so "mutes nothing" is not "never ran".
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import require_tool, wait_for

from alertmanager.models import AlertingSpec
from alertmanager.render import ALERTMANAGER_FILE, render_alerting_bundle
from federation.localrun.loopback import free_port
from federation.testing.harnesses.alertmanager import AlertmanagerHA, loopback_replicas

pytestmark = pytest.mark.e2e

CLUSTER = "e2e"
REGIONS = ["r-node", "r-node-ok", "r-crit-ok", "r-user"]


def labels(alertname: str, severity: str, **more: str) -> dict[str, str]:
    return {"alertname": alertname, "severity": severity, **more}


C = {"cluster": CLUSTER}
# name -> (labels, inhibited?)
ALERTS: dict[str, tuple[dict[str, str], bool]] = {
    # 1. A NodeDown without a node label mutes nothing ...
    "nodedown-no-node": (labels("NodeDown", "critical", component="node", region="r-node", **C), False),
    "gpu-no-node": (labels("GPUClusterMemoryAllocationHigh", "warning", component="gpu", region="r-node",
                           **C), False),
    "gpu-node": (labels("GPUXidError", "critical", component="gpu", region="r-node", node="n1", **C), False),
    # ... while a NodeDown with one mutes that node's GPU alerts (control).
    "nodedown-dead": (labels("NodeDown", "critical", component="node", region="r-node-ok", node="dead", **C),
                      False),
    "gpu-on-dead": (labels("GPUXidError", "critical", component="gpu", region="r-node-ok", node="dead", **C),
                    True),
    # 2. A critical alert missing cluster/region/node mutes nothing ...
    "critical-bare": (labels("GPUTemperatureHigh", "critical", component="gpu"), False),
    "warning-bare": (labels("GPUTemperatureHigh", "warning", component="gpu"), False),
    "critical-no-region": (labels("GPUPowerNearLimit", "critical", component="gpu", node="n2", **C), False),
    "warning-no-region": (labels("GPUPowerNearLimit", "warning", component="gpu", node="n2", **C), False),
    # ... while a fully labelled one mutes the same alert's warning (control).
    "critical-full": (labels("GPUTemperatureHigh", "critical", component="gpu", region="r-crit-ok", node="n3",
                             **C), False),
    "warning-full": (labels("GPUTemperatureHigh", "warning", component="gpu", region="r-crit-ok", node="n3",
                            **C), True),
    # 3. The user rule (equal: [cluster, team]) is guarded too: a source without team mutes nothing.
    "maint-no-team": (labels("Maintenance", "info", component="ops", region="r-user", **C), False),
    "exporter-no-team": (labels("ExporterDown", "warning", component="exporter", region="r-user", **C),
                         False),
    "maint-team": (labels("Maintenance", "info", component="ops", region="r-user", team="ml", **C),
                   False),
    "exporter-team": (labels("ExporterDown", "warning", component="exporter", region="r-user", team="ml",
                             **C), True),
}


@pytest.fixture(scope="module")
def am() -> Iterator[AlertmanagerHA]:
    binary = require_tool("prometheus-alertmanager")
    spec = AlertingSpec.model_validate({
        "replicas": [r.model_dump() for r in loopback_replicas(1)],
        "receivers": [{"name": "sink", "webhooks": [{"url": f"http://127.0.0.1:{free_port()}/hook"}]}],
        "default_receiver": "sink",
        "guaranteed_labels": ["team"],
        "inhibit_rules": [{"source_matchers": ['alertname="Maintenance"'],
                           "target_matchers": ['component="exporter"'], "equal": ["cluster", "team"]}],
    })
    bundle = render_alerting_bundle(spec, cluster=CLUSTER, regions=REGIONS)
    amtool = require_tool("amtool")
    with AlertmanagerHA(spec, config=bundle[ALERTMANAGER_FILE], binary=binary) as running:
        check = subprocess.run([amtool, "check-config", str(running.config_path)], capture_output=True,
                               text=True, timeout=30, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
        yield running


def statuses(am: AlertmanagerHA) -> dict[str, dict[str, Any]]:
    answer = httpx.get(f"{am.urls[0]}/api/v2/alerts", timeout=10).json()
    by_labels = {tuple(sorted(a["labels"].items())): a["status"] for a in answer}
    return {name: by_labels[key] for name, (lbls, _) in ALERTS.items()
            if (key := tuple(sorted(lbls.items()))) in by_labels}


def test_inhibition_guard_with_a_real_alertmanager(am: AlertmanagerHA) -> None:
    am.post_alerts([{"labels": lbls, "annotations": {"summary": name}} for name, (lbls, _) in ALERTS.items()])
    controls = [name for name, (_, inhibited) in ALERTS.items() if inhibited]
    # Wait until every control is inhibited: the inhibitor has seen the sources.
    def settled() -> dict[str, dict[str, Any]] | None:
        now = statuses(am)
        return now if len(now) == len(ALERTS) and all(now[name]["inhibitedBy"] for name in controls) else None

    seen = wait_for(settled, timeout=20, what="controls inhibited")
    wrong = {name: status["inhibitedBy"] for name, status in seen.items()
             if bool(status["inhibitedBy"]) != ALERTS[name][1]}
    assert wrong == {}, f"inhibited differently than expected: {wrong}"
    assert all(seen[name]["state"] == "active" for name, (_, inhibited) in ALERTS.items() if not inhibited)
