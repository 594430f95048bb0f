"""Alerting bundle rendering: golden trees checked by the real amtool and promtool.

Regenerate the golden trees with ``GPUFED_REGEN_GOLDEN=1 pytest tests/alertmanager`` and
review the diff; without the flag a mismatch fails and nothing is written.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alertmanager import ha, render
from alertmanager.amtool import Amtool
from alertmanager.dingtalk.config import parse_config
from alertmanager.errors import AmtoolError
from alertmanager.models import AlertingSpec
from federation.spec import GpufedSpec, load_gpufed_spec
from sharder.kernel.output import Bundle
from tests.conftest import stack_tool
from tests.golden_tree import GOLDEN, check_golden_tree

ROOT = Path(__file__).resolve().parents[2]
CASES = {
    "alertmanager-example": ROOT / "examples" / "federation.yaml",
    "alertmanager-webhooks": GOLDEN / "alertmanager-webhooks" / "spec.yaml",
}


def load_case(name: str) -> GpufedSpec:
    spec = load_gpufed_spec(CASES[name])
    assert spec.alerting is not None
    return spec


def bundle_for(name: str) -> Bundle:
    spec = load_case(name)
    assert spec.alerting is not None
    return render.render_alerting_bundle(spec.alerting, cluster=spec.cluster, regions=spec.region_names())


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    bundle = bundle_for(name)
    check_golden_tree(GOLDEN / name, bundle)


def test_rendering_is_deterministic() -> None:
    assert bundle_for("alertmanager-example") == bundle_for("alertmanager-example")


# alertmanager.yml is one file for every supported release: amtool 0.28.1 and 0.33.1 both check it.
@pytest.mark.parametrize("line", [2, 3])
@pytest.mark.parametrize("name", sorted(CASES))
def test_amtool_accepts_every_golden(line: int, name: str) -> None:
    Amtool(stack_tool(line, "amtool")).check_config(GOLDEN / name / render.ALERTMANAGER_FILE)


@pytest.mark.parametrize("line", [2, 3])
@pytest.mark.parametrize("name", sorted(CASES))
def test_promtool_accepts_the_prometheus_alerting_block(line: int, name: str) -> None:
    path = GOLDEN / name / render.PROMETHEUS_ALERTING_FILE
    args = [stack_tool(line, "promtool"), "check", "config", str(path)]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_relay_file_without_robots() -> None:
    assert render.RELAY_FILE not in bundle_for("alertmanager-webhooks")


def test_relay_config_loads_in_the_relay() -> None:
    """The robots file is the relay's own format: its loader takes it once ${ENV} is set."""
    data = yaml.safe_load(bundle_for("alertmanager-example")[render.RELAY_FILE])
    env = {
        f"DINGTALK_{who}_{what}": f"{who.lower()}{what.lower()}9f3a2c"
        for who in ("BJ", "SH", "SRE")
        for what in ("TOKEN", "SECRET")
    }
    relay = parse_config(data, env=env)
    assert sorted(relay.robots) == ["bj-oncall", "sh-oncall", "sre"]
    assert relay.robots["bj-oncall"].secret is not None
    assert relay.robots["bj-oncall"].secret.get_secret_value() == "bjsecret9f3a2c"
    assert relay.robots["bj-oncall"].mentions.all_on_critical is True


def test_region_receivers_point_at_the_relay() -> None:
    config = yaml.safe_load(bundle_for("alertmanager-example")[render.ALERTMANAGER_FILE])
    receivers = {r["name"]: r for r in config["receivers"]}
    hooks = receivers["cn-beijing-dingtalk"]["webhook_configs"]
    assert hooks == [
        {"url": "http://gpufed-dingtalk:8060/dingtalk/bj-oncall/send", "send_resolved": True, "max_alerts": 0}
    ]
    critical = [h["url"] for h in receivers["cn-beijing-critical"]["webhook_configs"]]
    assert critical == [
        "http://gpufed-dingtalk:8060/dingtalk/bj-oncall/send",
        "http://pager.internal:8080/alert",
    ]
    assert receivers["cn-beijing-critical"]["email_configs"][0]["to"] == "gpu-sre@example.com"


def test_routes_use_matchers_only_and_never_group_by_everything() -> None:
    text = bundle_for("alertmanager-example")[render.ALERTMANAGER_FILE].decode()
    assert "match:" not in text and "match_re:" not in text and "'...'" not in text
    config = yaml.safe_load(text)
    assert config["route"]["group_by"] == ["alertname", "region", "cluster"]


def test_region_group_by_override() -> None:
    alerting = AlertingSpec.model_validate(
        {
            "replicas": [{"name": "a", "host": "h"}],
            "robots": [{"name": "bj", "url": "https://oapi.dingtalk.com/robot/send?access_token=${T}"}],
            "receivers": [{"name": "sre", "robots": ["bj"]}],
            "default_receiver": "sre",
            "routes": [{"region": "cn-beijing", "robot": "bj", "group_by": ["alertname", "node"]}],
        }
    )
    route: dict[str, Any] = render.render_alertmanager_config(alerting)["route"]["routes"][1]  # 0: Watchdog
    assert route["group_by"] == ["alertname", "node"]
    assert [r["receiver"] for r in route["routes"]] == ["cn-beijing-dingtalk"] * 3


def test_ha_flags_peer_with_every_other_replica() -> None:
    spec = load_case("alertmanager-example")
    assert spec.alerting is not None
    flags = ha.all_replica_flags(spec.alerting)
    assert flags["am-1"] == [
        "--web.listen-address=0.0.0.0:9093",
        "--cluster.listen-address=0.0.0.0:9094",
        "--cluster.advertise-address=alertmanager-1:9094",
        "--cluster.peer=alertmanager-0:9094",
        "--cluster.peer=alertmanager-2:9094",
    ]
    document = json.loads(bundle_for("alertmanager-example")[render.HA_FILE])
    assert document["replicas"]["am-0"]["flags"] == flags["am-0"]
    targets = document["prometheus_alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert targets == ["alertmanager-0:9093", "alertmanager-1:9093", "alertmanager-2:9093"]
    with_url = spec.alerting.model_copy(update={"external_url": "https://am.example.com"})
    assert ha.replica_flags(with_url, with_url.replicas[0])[-1] == "--web.external-url=https://am.example.com"


def test_amtool_reports_a_broken_config(amtool: str, tmp_path: Path) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_text("route: {receiver: nobody}\nreceivers: [{name: somebody}]\n")
    with pytest.raises(AmtoolError) as caught:
        Amtool(amtool).check_config(path)
    assert 'undefined receiver "nobody" used in route' in str(caught.value)
    assert str(caught.value).startswith(f"{path}: amtool failed: ")
