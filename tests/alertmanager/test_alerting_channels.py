"""Channels: WeCom receivers, severity -> channel routes and the info digest, as rendered.

The golden ``alertmanager-channels`` case is seed 002's layout (critical -> DingTalk + WeCom
+ SMS, warning -> DingTalk + e-mail, info -> the relay's digest). Both Alertmanager lines
judge it with their own amtool: 0.33.1 takes it; 0.28.1 refuses ``api_secret_file``, which
is why the spec refuses WeCom below alertmanager.version 0.31. The same routing without
WeCom passes both, and ``amtool config routes test`` of both lines says which receivers
each severity reaches.

Regenerate the golden tree with ``GPUFED_REGEN_GOLDEN=1 pytest tests/alertmanager``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from alertmanager import render
from alertmanager.amtool import Amtool
from alertmanager.dingtalk.config import parse_config
from alertmanager.errors import AmtoolError
from federation.spec import GpufedSpec, load_gpufed_spec
from sharder.kernel.errors import SpecError
from sharder.model.loading import parse_model, read_document
from tests.conftest import stack_tool
from tests.golden_tree import GOLDEN, check_golden_tree

CASE = GOLDEN / "alertmanager-channels"
CONFIG = CASE / render.ALERTMANAGER_FILE


def case_data() -> dict[str, Any]:
    data = read_document(CASE / "spec.yaml")
    assert isinstance(data, dict)
    return data


def bundle_of(data: dict[str, Any]) -> dict[str, bytes]:
    spec = parse_model(GpufedSpec, data, source="spec.yaml")
    assert spec.alerting is not None
    return render.render_alerting_bundle(spec.alerting, cluster=spec.cluster, regions=spec.region_names())


def without_wecom(version: str) -> dict[str, Any]:
    """The case for an Alertmanager that cannot read a WeCom secret file: SMS pages alone."""
    data = copy.deepcopy(case_data())
    data["alertmanager"] = {"version": version}
    alerting = data["alerting"]
    alerting["receivers"] = [r for r in alerting["receivers"] if "wecom" not in r]
    alerting["severity_routes"]["critical"] = ["sms"]
    return data


def test_golden() -> None:
    check_golden_tree(CASE, bundle_of(case_data()))


def test_amtool_033_accepts_wecom_with_a_secret_file() -> None:
    Amtool(stack_tool(3, "amtool")).check_config(CONFIG)
    receivers = {r["name"]: r for r in yaml.safe_load(CONFIG.read_text())["receivers"]}
    wechat = receivers["wecom-oncall"]["wechat_configs"]
    assert wechat == [{
        "agent_id": "1000002", "api_secret_file": "/etc/alertmanager/secrets/wecom-secret",
        "api_url": "https://qyapi.weixin.qq.com/cgi-bin/", "corp_id": "ww0123456789abcdef",
        "message_type": "markdown", "send_resolved": True, "to_party": "2|3", "to_user": "@all",
    }]
    assert "api_secret:" not in CONFIG.read_text()


def test_amtool_028_refuses_the_secret_file_which_is_why_the_spec_does() -> None:
    with pytest.raises(AmtoolError, match="field api_secret_file not found"):
        Amtool(stack_tool(2, "amtool")).check_config(CONFIG)
    data = copy.deepcopy(case_data())
    data["alertmanager"] = {"version": "0.28"}
    with pytest.raises(SpecError) as caught:
        parse_model(GpufedSpec, data, source="federation.yaml")
    message = str(caught.value)
    assert "field 'alertmanager.version'" in message and "['wecom-oncall']" in message
    assert "'0.31' or later" in message


@pytest.mark.parametrize("line", [2, 3])
def test_both_lines_accept_the_routing_without_wecom(line: int, tmp_path: Path) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_bytes(bundle_of(without_wecom("0.28"))[render.ALERTMANAGER_FILE])
    Amtool(stack_tool(line, "amtool")).check_config(path)


# (region, severity) -> receivers in routing-tree order; None leaves the label off.
TABLE: list[tuple[str | None, str | None, list[str]]] = [
    ("cn-beijing", "critical", ["wecom-oncall", "sms", "cn-beijing-dingtalk"]),
    ("cn-beijing", "warning", ["ops-mail", "cn-beijing-dingtalk"]),
    ("cn-beijing", "info", ["cn-beijing-dingtalk"]),  # the relay batches it into the digest
    ("cn-shanghai", "critical", ["wecom-oncall", "sms", "cn-shanghai-dingtalk"]),
    ("cn-shanghai", "warning", ["ops-mail", "cn-shanghai-dingtalk"]),
    ("cn-beijing", None, ["cn-beijing-dingtalk"]),
    # A region no route names: the channels still reach it, then the unrouted fallbacks.
    ("cn-xian", "critical", ["wecom-oncall", "sms", "unrouted-critical"]),
    ("cn-xian", "warning", ["ops-mail", "sre"]),
    (None, "info", ["sre"]),
]


def _labels(region: str | None, severity: str | None) -> dict[str, str]:
    labels = {"alertname": "GPUXidError", "cluster": "gpu-prod", "node": "n1"}
    labels |= {"region": region} if region else {}
    return labels | ({"severity": severity} if severity else {})


@pytest.mark.parametrize(("region", "severity", "receivers"), TABLE)
def test_each_severity_reaches_its_channels_033(region: str | None, severity: str | None,
                                                receivers: list[str]) -> None:
    assert Amtool(stack_tool(3, "amtool")).routes_test(CONFIG, _labels(region, severity)) == receivers


@pytest.mark.parametrize("line", [2, 3])
def test_each_severity_reaches_its_channels_both_lines(line: int, tmp_path: Path) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_bytes(bundle_of(without_wecom("0.28"))[render.ALERTMANAGER_FILE])
    tool = Amtool(stack_tool(line, "amtool"))
    for region, severity, receivers in TABLE:
        expected = [name for name in receivers if name != "wecom-oncall"]
        assert tool.routes_test(path, _labels(region, severity)) == expected, (line, region, severity)


@pytest.mark.parametrize("line", [2, 3])
def test_watchdog_reaches_no_channel(line: int, tmp_path: Path) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_bytes(bundle_of(without_wecom("0.28"))[render.ALERTMANAGER_FILE])
    labels = {"alertname": "Watchdog", "severity": "critical", "region": "cn-beijing"}
    assert Amtool(stack_tool(line, "amtool")).routes_test(path, labels) == ["watchdog-null"]


def test_channel_routes_continue_and_keep_their_severity_timing() -> None:
    routes = yaml.safe_load(CONFIG.read_text())["route"]["routes"]
    channels = [r for r in routes if r.get("continue")]
    assert [(r["matchers"], r["receiver"]) for r in channels] == [
        (['severity="critical"'], "wecom-oncall"), (['severity="critical"'], "sms"),
        (['severity="warning"'], "ops-mail"),
    ]
    assert channels[0]["repeat_interval"] == "15m" and channels[2]["repeat_interval"] == "2h"
    assert routes[0]["matchers"] == ['alertname="Watchdog"'] and "continue" not in routes[0]


def test_sms_is_a_plain_webhook_with_a_bearer_file() -> None:
    receivers = {r["name"]: r for r in yaml.safe_load(CONFIG.read_text())["receivers"]}
    assert receivers["sms"]["webhook_configs"] == [{
        "url": "http://sms-adapter.monitoring:9097/alert", "send_resolved": False, "max_alerts": 10,
        "http_config": {"authorization": {"credentials_file": "/etc/alertmanager/secrets/sms-token"}},
    }]


def test_the_relay_file_carries_the_digest_and_loads_in_the_relay() -> None:
    data = yaml.safe_load((CASE / render.RELAY_FILE).read_text())
    assert data["digest"] == {"period": "604800s", "anchor": "2024-01-01T09:00:00", "email": {
        "to": ["sre@example.com"], "from": "gpufed@example.com", "smarthost": "smtp.example.com:587",
        "require_tls": True, "auth_username": "gpufed", "auth_password": "${SMTP_PASSWORD}"}}
    env = {"DINGTALK_BJ_TOKEN": "bjtoken9f3a", "DINGTALK_BJ_SECRET": "bjsecret9f3a",
           "DINGTALK_SH_TOKEN": "shtoken9f3a", "DINGTALK_SRE_TOKEN": "sretoken9f3a",
           "SMTP_PASSWORD": "smtppass9f3a"}
    relay = parse_config(data, env=env)
    assert relay.digest is not None and relay.digest.period == 7 * 86400
    email = relay.digest.email
    assert email is not None and email.sender == "gpufed@example.com" and email.to == ["sre@example.com"]
    assert email.auth_password is not None and email.auth_password.get_secret_value() == "smtppass9f3a"


def test_the_example_renders_no_digest_and_no_channel_route() -> None:
    spec = load_gpufed_spec(Path(__file__).resolve().parents[2] / "examples" / "federation.yaml")
    assert spec.alerting is not None
    config = render.render_alertmanager_config(spec.alerting)
    assert not any(r.get("continue") for r in config["route"]["routes"])
    assert "digest" not in render.render_relay_config(spec.alerting)


def spec_error(mutate: Any) -> str:
    data = copy.deepcopy(case_data())
    mutate(data["alerting"])
    with pytest.raises(SpecError) as caught:
        parse_model(GpufedSpec, data, source="federation.yaml")
    return str(caught.value)


def _wecom(alerting: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = alerting["receivers"][1]["wecom"][0]
    return entry


@pytest.mark.parametrize(("mutate", "field", "words"), [
    (lambda a: _wecom(a).update(api_secret="s3cr3t-value"), "alerting.receivers[1].wecom[0]",
     "api_secret: WeCom secrets are files only"),
    (lambda a: _wecom(a).update(agent_id="app-2"), "alerting.receivers[1].wecom[0].agent_id", "digits"),
    (lambda a: _wecom(a).update(api_url="https://qyapi.weixin.qq.com/cgi-bin"),
     "alerting.receivers[1].wecom[0].api_url", "must end with '/'"),
    (lambda a: _wecom(a).update(api_secret_file="secrets/wecom"),
     "alerting.receivers[1].wecom[0].api_secret_file", "absolute path"),
    (lambda a: [_wecom(a).pop(k) for k in ("to_user", "to_party")], "alerting.receivers[1].wecom[0]",
     "needs to_user, to_party or to_tag"),
    (lambda a: _wecom(a).update(message_type="news"), "alerting.receivers[1].wecom[0].message_type", "text"),
    (lambda a: _wecom(a).update(corp_id="${CORP}"), "alerting.receivers[1].wecom[0].corp_id",
     "cannot hold ${ENV}"),
    (lambda a: a["severity_routes"].update(critical=["sms", "sms"]), "alerting.severity_routes",
     "more than once"),
    (lambda a: a["severity_routes"].update(info=["pager"]), "alerting",
     "severity_routes.info names unknown receiver 'pager'"),
    (lambda a: a["severity_routes"].update(warning=["sre"]), "alerting",
     "reach too: every such alert would be sent to it twice"),
    (lambda a: a["routes"][0].update(critical=["sms"]), "alerting", "severity_routes.critical names ['sms']"),
    (lambda a: a["receivers"].append({"name": "bj-again", "robots": ["bj-oncall"]})
     or a["severity_routes"].update(critical=["bj-again"]),
     "alerting", "posts to robots ['bj-oncall'], which every alert already reaches"),
    (lambda a: a.update(robots=[], routes=[], receivers=a["receivers"][1:], default_receiver="ops-mail",
                        severity_routes={}), "alerting", "info_digest is the DingTalk relay's"),
    (lambda a: a.update(info_digest={"period": "30s"}), "alerting.info_digest.period",
     "from a minute to a year"),
    (lambda a: a.update(info_digest={"anchor": "2024-01-01T09:00:00+08:00"}), "alerting.info_digest.anchor",
     "drop the offset"),
    (lambda a: a["info_digest"]["email"].update(auth_password="s3cr3t-value"),
     "alerting.info_digest.email.auth_password", "the SMTP password is"),
    (lambda a: a["info_digest"]["email"].update(to=["sre"]), "alerting.info_digest.email.to[0]",
     "must be an address like ops@example.com"),
    (lambda a: a["info_digest"]["email"].update(smarthost="smtp.example.com"),
     "alerting.info_digest.email.smarthost", "host:port"),
    (lambda a: a["info_digest"]["email"].pop("auth_password"), "alerting.info_digest.email",
     "go together"),
])
def test_bad_channels_are_refused_naming_the_field(mutate: Any, field: str, words: str) -> None:
    message = spec_error(mutate)
    assert f"field '{field}'" in message, message
    assert words in message, message
    assert "s3cr3t-value" not in message
