"""Unrouted criticals, the Watchdog route and the `equal` guard on every inhibition rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_alerting_models import BASE, spec_error

from alertmanager import amtool as amtool_client
from alertmanager import render
from alertmanager.models import DEFAULT_INHIBIT_RULES, GUARANTEED_LABELS, AlertingSpec
from sharder.kernel.output import dump_yaml

PAGER = {"name": "pager", "webhooks": [{"url": "http://pager.internal/hook"}]}
DEADMAN = {"name": "deadman", "webhooks": [{"url": "http://deadman.internal/ping"}]}


def alerting(**changes: Any) -> AlertingSpec:
    data = {**BASE["alerting"], "receivers": [{"name": "sre", "robots": ["bj"]}, PAGER, DEADMAN],
            "robots": [{"name": "bj", "url": "https://x/send?access_token=${BJ}"},
                       {"name": "sh", "url": "https://x/send?access_token=${SH}"}],
            "routes": [{"region": "cn-beijing", "robot": "bj", "critical": ["pager"]},
                       {"region": "cn-shanghai", "robot": "sh"}]}
    return AlertingSpec.model_validate({**data, **changes})


def routed(tmp_path: Path, amtool: str, spec: AlertingSpec, labels: dict[str, str]) -> list[str]:
    path = tmp_path / "alertmanager.yml"
    path.write_bytes(dump_yaml(render.render_alertmanager_config(spec)))
    amtool_client.check_config(path, amtool=amtool)
    return amtool_client.routes_test(path, labels, amtool=amtool)


@pytest.mark.parametrize("region", [None, "", "cn-xian", "CN-BEIJING", "cn-beijing-2"])
def test_unrouted_critical_pages_every_region(region: str | None, tmp_path: Path, amtool: str) -> None:
    spec = alerting()
    config = render.render_alertmanager_config(spec)
    unrouted = next(r for r in config["receivers"] if r["name"] == "unrouted-critical")
    urls = {hook["url"] for hook in unrouted["webhook_configs"]}
    relay = "http://gpufed-dingtalk:8060/dingtalk"
    assert urls == {f"{relay}/bj/send", f"{relay}/sh/send", "http://pager.internal/hook"}, \
        "both region robots (bj is also the default's robot) and the pager"
    labels = {"alertname": "GPUXidError", "severity": "critical", "cluster": "c", "node": "n"}
    labels |= {"region": region} if region else {}
    assert routed(tmp_path, amtool, spec, labels) == ["unrouted-critical"]
    assert routed(tmp_path, amtool, spec, {**labels, "severity": "warning"}) == ["sre"]


def test_unrouted_critical_to_a_named_receiver(tmp_path: Path, amtool: str) -> None:
    spec = alerting(unrouted_critical="pager")
    assert routed(tmp_path, amtool, spec, {"severity": "critical", "region": "nowhere"}) == ["pager"]
    names = {r["name"] for r in render.render_alertmanager_config(spec)["receivers"]}
    assert "unrouted-critical" not in names
    beijing = {"severity": "critical", "region": "cn-beijing"}
    assert routed(tmp_path, amtool, spec, beijing) == ["cn-beijing-critical"]


def test_watchdog_goes_to_the_heartbeat_first(tmp_path: Path, amtool: str) -> None:
    spec = alerting(watchdog={"receiver": "deadman"})
    route = render.render_alertmanager_config(spec)["route"]["routes"][0]
    assert route == {"matchers": ['alertname="Watchdog"'], "receiver": "deadman", "group_wait": "10s",
                     "group_interval": "1m", "repeat_interval": "1m"}
    for region in ("cn-beijing", "cn-shanghai", "x"):
        labels = {"alertname": "Watchdog", "severity": "critical", "region": region}
        assert routed(tmp_path, amtool, spec, labels) == ["deadman"]


@pytest.mark.parametrize(("changes", "message"), [
    ({"unrouted_critical": "nobody"}, "unrouted_critical names unknown receiver (or all-regions) 'nobody'"),
    ({"watchdog": {"receiver": "ghost"}}, "watchdog.receiver names unknown receiver 'ghost'"),
    ({"watchdog": {"receiver": "sre"}}, "watchdog.receiver 'sre' posts to DingTalk robots ['bj']"),
    ({"watchdog": {"repeat_interval": "30s"}}, "repeat_interval 30s is shorter than group_interval 1m"),
    ({"receivers": [{"name": "sre", "robots": ["bj"]}, {"name": "unrouted-critical", "robots": ["bj"]}]},
     "duplicate receiver names: ['unrouted-critical']"),
])
def test_bad_unrouted_and_watchdog_settings(changes: dict[str, Any], message: str) -> None:
    assert message in spec_error(**changes)


def test_user_rule_without_equal_is_refused_with_the_reason() -> None:
    rule = {"source_matchers": ['alertname="NodeDown"'], "target_matchers": ['component="gpu"']}
    message = spec_error(inhibit_rules=[rule])
    assert "field 'alerting.inhibit_rules[0].equal' an inhibition rule needs `equal`" in message
    assert "without it ANY matching source alert" in message and "mutes EVERY matching target" in message
    assert "equal: [cluster, region, node]" in message
    twice = spec_error(inhibit_rules=[{**rule, "equal": ["node", "node"]}])
    assert "equal lists ['node'] more than once" in twice


def test_every_rule_renders_the_guard() -> None:
    for rule in DEFAULT_INHIBIT_RULES:
        assert set(rule.equal) <= GUARANTEED_LABELS
    spec = alerting(inhibit_rules=[{"source_matchers": ['severity="critical"', 'node!=""'],
                                    "target_matchers": ['severity="info"'], "equal": ["cluster", "node"]}])
    rules = render.render_alertmanager_config(spec)["inhibit_rules"]
    assert len(rules) == 3
    for rule in rules:
        guards = {f'{label}!=""' for label in rule["equal"]}
        assert guards <= set(rule["source_matchers"]), rule
    assert rules[2]["source_matchers"] == ['severity="critical"', 'node!=""', 'cluster!=""']  # no repeat
