"""The routing tree, asked of the real ``amtool config routes test``: region x severity.

Runs on the golden ``alertmanager.yml`` of the bundled example, which is what
``test_alerting_render`` proves the renderer produces.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from alertmanager import amtool as amtool_client
from alertmanager.errors import AmtoolError
from alertmanager.render import ALERTMANAGER_FILE

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
EXAMPLE = GOLDEN / "alertmanager-example" / ALERTMANAGER_FILE
WEBHOOKS = GOLDEN / "alertmanager-webhooks" / ALERTMANAGER_FILE

# (region, severity) -> receivers; None leaves the label off the alert.
TABLE: list[tuple[str | None, str | None, list[str]]] = [
    ("cn-beijing", "critical", ["cn-beijing-critical"]),
    ("cn-beijing", "warning", ["cn-beijing-dingtalk"]),
    ("cn-beijing", "info", ["cn-beijing-dingtalk"]),
    ("cn-beijing", None, ["cn-beijing-dingtalk"]),
    ("cn-shanghai", "critical", ["cn-shanghai-critical"]),
    ("cn-shanghai", "warning", ["cn-shanghai-dingtalk"]),
    ("cn-shanghai", "info", ["cn-shanghai-dingtalk"]),
    ("cn-hangzhou", "critical", ["cn-hangzhou-dingtalk"]),
    ("cn-hangzhou", "warning", ["cn-hangzhou-dingtalk"]),
    ("cn-hangzhou", "info", ["cn-hangzhou-dingtalk"]),
    # Unknown, missing, empty or mis-cased region: critical pages every region's pager
    # (unrouted_critical: all-regions), everything else reaches the default receiver.
    ("cn-xian", "critical", ["unrouted-critical"]),
    ("cn-xian", "warning", ["sre"]),
    ("cn-xian", "info", ["sre"]),
    (None, "critical", ["unrouted-critical"]),
    ("", "critical", ["unrouted-critical"]),
    ("CN-Beijing", "critical", ["unrouted-critical"]),
    ("CN-Beijing", "warning", ["sre"]),
    (None, None, ["sre"]),
    # A matcher is exact: a region's prefix is not the region.
    ("cn-beijing-2", "critical", ["unrouted-critical"]),
]


@pytest.mark.parametrize(("region", "severity", "receivers"), TABLE)
def test_routing_table(amtool: str, region: str | None, severity: str | None, receivers: list[str]) -> None:
    labels = {"alertname": "GPUMemoryUsageHigh", "cluster": "gpu-prod", "node": "n1"}
    if region:
        labels["region"] = region
    if severity is not None:
        labels["severity"] = severity
    assert amtool_client.routes_test(EXAMPLE, labels, amtool=amtool) == receivers


@pytest.mark.parametrize("region", ["cn-beijing", "cn-xian", None])
@pytest.mark.parametrize("severity", ["critical", "warning", None])
def test_watchdog_never_reaches_a_robot(amtool: str, region: str | None, severity: str | None) -> None:
    labels = {"alertname": "Watchdog", "cluster": "gpu-prod", "node": "*"}
    labels |= {"region": region} if region else {}
    labels |= {"severity": severity} if severity else {}
    assert amtool_client.routes_test(EXAMPLE, labels, amtool=amtool) == ["watchdog-null"]
    assert amtool_client.routes_test(WEBHOOKS, labels, amtool=amtool) == ["deadman"]


def test_without_routes_criticals_page_the_named_receiver(amtool: str) -> None:
    # unrouted_critical: pager; everything else reaches the default receiver.
    for severity, receiver in (("critical", "pager"), ("warning", "ops-mail"), ("info", "ops-mail")):
        labels = {"region": "cn-beijing", "severity": severity}
        assert amtool_client.routes_test(WEBHOOKS, labels, amtool=amtool) == [receiver]


def test_routes_test_on_a_missing_file(amtool: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yml"
    with pytest.raises(AmtoolError) as caught:
        amtool_client.routes_test(missing, {"region": "cn-beijing"}, amtool=amtool)
    assert str(caught.value).startswith(f"{missing}: amtool failed: ")


def test_amtool_not_installed(tmp_path: Path) -> None:
    with pytest.raises(AmtoolError, match="amtool not found at"):
        amtool_client.check_config(tmp_path / "x.yml", amtool=str(tmp_path / "no-amtool"))
