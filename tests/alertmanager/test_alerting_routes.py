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
    # Unknown or missing region: the default receiver, whatever the severity.
    ("cn-xian", "critical", ["sre"]),
    ("cn-xian", "warning", ["sre"]),
    ("cn-xian", "info", ["sre"]),
    (None, "critical", ["sre"]),
    (None, None, ["sre"]),
    # A matcher is exact: a region's prefix is not the region.
    ("cn-beijing-2", "critical", ["sre"]),
]


@pytest.mark.parametrize(("region", "severity", "receivers"), TABLE)
def test_routing_table(amtool: str, region: str | None, severity: str | None, receivers: list[str]) -> None:
    labels = {"alertname": "GPUMemoryUsageHigh", "cluster": "gpu-prod", "node": "n1"}
    if region is not None:
        labels["region"] = region
    if severity is not None:
        labels["severity"] = severity
    assert amtool_client.routes_test(EXAMPLE, labels, amtool=amtool) == receivers


def test_without_routes_everything_reaches_the_default(amtool: str) -> None:
    for severity in ("critical", "warning", "info"):
        labels = {"region": "cn-beijing", "severity": severity}
        assert amtool_client.routes_test(WEBHOOKS, labels, amtool=amtool) == ["ops-mail"]


def test_routes_test_on_a_missing_file(amtool: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yml"
    with pytest.raises(AmtoolError) as caught:
        amtool_client.routes_test(missing, {"region": "cn-beijing"}, amtool=amtool)
    assert str(caught.value).startswith(f"{missing}: amtool failed: ")


def test_amtool_not_installed(tmp_path: Path) -> None:
    with pytest.raises(AmtoolError, match="amtool not found at"):
        amtool_client.check_config(tmp_path / "x.yml", amtool=str(tmp_path / "no-amtool"))
