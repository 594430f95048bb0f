"""The ``alerting`` spec section: defaults, and bad specs refused with exact messages."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import model_validator

from alertmanager.errors import AlertingError
from alertmanager.models import AlertingSpec, check_regions
from alertmanager.render import render_alerting_bundle
from federation.spec import GpufedSpec, load_gpufed_spec
from sharder.kernel.errors import SpecError
from sharder.model.loading import parse_model

ROOT = Path(__file__).resolve().parents[2]

BASE: dict[str, Any] = {
    "cluster": "gpu-test",
    "regions": [{"name": "cn-beijing"}, {"name": "cn-shanghai"}],
    "jobs": [{"name": "gpu"}],
    "alerting": {
        "replicas": [{"name": "am-0", "host": "127.0.0.1"}],
        "robots": [{"name": "bj", "url": "https://oapi.dingtalk.com/robot/send?access_token=${BJ}"}],
        "receivers": [{"name": "sre", "robots": ["bj"]}],
        "default_receiver": "sre",
        "routes": [{"region": "cn-beijing", "robot": "bj"}],
    },
}


def spec_error(**changes: Any) -> str:
    data = copy.deepcopy(BASE)
    data["alerting"].update(changes)
    with pytest.raises(SpecError) as caught:
        parse_model(GpufedSpec, data, source="federation.yaml")
    return str(caught.value)


def test_defaults() -> None:
    alerting = parse_model(GpufedSpec, BASE, source="x").alerting
    assert alerting is not None
    assert alerting.group_by == ["alertname", "region", "cluster"]
    assert alerting.severities.critical.repeat_interval == "15m"
    assert alerting.severities.warning.repeat_interval == "2h"
    assert alerting.severities.info.repeat_interval == "12h"
    assert len(alerting.all_inhibit_rules()) == 2


def test_example_routes_regions_to_their_own_robots() -> None:
    spec = load_gpufed_spec(ROOT / "examples" / "federation.yaml")
    assert spec.alerting is not None
    check_regions(spec.alerting, spec.region_names())
    robots = {route.region: route.robot for route in spec.alerting.routes}
    assert robots["cn-beijing"] != robots["cn-shanghai"]
    for robot in spec.alerting.robots:  # secrets come from the relay's environment
        assert "access_token=${" in robot.url
        assert robot.secret is not None and robot.secret.startswith("${")


def test_equal_label_not_guaranteed() -> None:
    rule = {"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"']}
    message = spec_error(inhibit_rules=[{**rule, "equal": ["node", "gpu"]}])
    assert message == (
        "federation.yaml: field 'alerting.inhibit_rules' rule [0]: equal label 'gpu' is not guaranteed on"
        " every alert; Alertmanager counts two alerts that both lack it as equal (gpufed therefore only"
        " lets sources that carry it inhibit, so for the others the rule would silently do nothing)."
        " Guaranteed: alertname, cluster, node, region, severity; declare more in"
        " alerting.guaranteed_labels"
    )


def test_equal_label_declared_guaranteed() -> None:
    data = copy.deepcopy(BASE)
    rule = {"source_matchers": ['alertname="X"'], "target_matchers": ['severity="warning"'], "equal": ["gpu"]}
    data["alerting"].update(guaranteed_labels=["gpu"], inhibit_rules=[rule])
    alerting = parse_model(GpufedSpec, data, source="x").alerting
    assert alerting is not None and alerting.all_inhibit_rules()[-1].equal == ["gpu"]


def test_bad_duration() -> None:
    assert spec_error(severities={"critical": {"repeat_interval": "15 minutes"}}) == (
        "federation.yaml: field 'alerting.severities.critical.repeat_interval' not a Prometheus duration:"
        " '15 minutes' (examples: 15s, 1m, 2h) (value '15 minutes')"
    )


def test_repeat_shorter_than_group_interval() -> None:
    assert spec_error(timing={"group_interval": "10m", "repeat_interval": "5m"}) == (
        "federation.yaml: field 'alerting.timing' repeat_interval 5m is shorter than group_interval 10m;"
        " Alertmanager would repeat only every group_interval"
    )


def test_duplicate_receiver() -> None:
    receivers = [{"name": "sre", "robots": ["bj"]}, {"name": "sre", "webhooks": [{"url": "http://x"}]}]
    assert spec_error(receivers=receivers) == (
        "federation.yaml: field 'alerting' duplicate receiver names: ['sre']"
    )


def test_receiver_clashing_with_a_generated_one() -> None:
    receivers = [{"name": "sre", "robots": ["bj"]}, {"name": "cn-beijing-dingtalk", "robots": ["bj"]}]
    assert spec_error(receivers=receivers) == (
        "federation.yaml: field 'alerting' duplicate receiver names: ['cn-beijing-dingtalk']"
        " (each route adds receivers <region>-dingtalk and <region>-<severity>; the tree adds"
        " unrouted-critical and watchdog-null)"
    )


def test_unknown_references() -> None:
    routes = [{"region": "cn-beijing", "robot": "bj"}, {"region": "cn-shanghai", "robot": "sh"}]
    assert spec_error(routes=routes) == (
        "federation.yaml: field 'alerting' routes[1].robot names unknown robot 'sh' (known: ['bj'])"
    )
    assert spec_error(default_receiver="ops") == (
        "federation.yaml: field 'alerting' default_receiver names unknown receiver 'ops' (known: ['sre'])"
    )
    assert spec_error(severities={"info": {"active_time_intervals": ["work-hours"]}}) == (
        "federation.yaml: field 'alerting' severities.info names unknown time interval 'work-hours'"
        " (known: [])"
    )


def test_env_reference_where_alertmanager_reads_it() -> None:
    receivers = [{"name": "sre", "webhooks": [{"url": "http://hook/${TOKEN}"}]}]
    assert spec_error(receivers=receivers) == (
        "federation.yaml: field 'alerting.receivers[0].webhooks[0].url' webhook url cannot hold ${ENV}"
        " references: Alertmanager does not expand them (value 'http://hook/${TOKEN}')"
    )


def test_bad_matcher() -> None:
    rule = {"source_matchers": ["severity"], "target_matchers": ['severity="warning"']}
    assert spec_error(inhibit_rules=[rule]) == (
        "federation.yaml: field 'alerting.inhibit_rules[0].source_matchers' not a matcher: 'severity'"
        ' (examples: severity="critical", node=~"bj-.*")'
    )


def test_unknown_region_in_a_route() -> None:
    data = copy.deepcopy(BASE)
    data["alerting"]["routes"].append({"region": "cn-xian", "robot": "bj"})
    alerting = AlertingSpec.model_validate(data["alerting"])
    expected = (
        "field 'alerting.routes[1].region' unknown region; the spec's regions are"
        " ['cn-beijing', 'cn-shanghai'] (value 'cn-xian')"
    )
    with pytest.raises(AlertingError) as caught:
        render_alerting_bundle(alerting, cluster="gpu-test", regions=["cn-beijing", "cn-shanghai"])
    assert str(caught.value) == expected
    assert caught.value.field == "alerting.routes[1].region"


def test_unknown_region_through_a_spec_validator() -> None:
    """How the composed spec wires it: AlertingError is a ValueError, so parse_model maps it."""

    class Spec(GpufedSpec):
        @model_validator(mode="after")
        def _regions(self) -> Spec:
            if self.alerting is not None:
                check_regions(self.alerting, self.region_names())
            return self

    data = copy.deepcopy(BASE)
    data["alerting"]["routes"][0]["region"] = "cn-xian"
    with pytest.raises(SpecError) as caught:
        parse_model(Spec, data, source="federation.yaml")
    assert str(caught.value) == (
        "federation.yaml: field 'alerting.routes[0].region' unknown region; the spec's regions are"
        " ['cn-beijing', 'cn-shanghai'] (value 'cn-xian')"
    )


def test_bad_time_interval() -> None:
    interval = {"name": "work-hours", "weekdays": ["mon-fri"]}
    assert spec_error(time_intervals=[interval]) == (
        "federation.yaml: field 'alerting.time_intervals[0].weekdays' not a weekday or range: 'mon-fri'"
        " (examples: monday, monday:friday)"
    )
    interval = {"name": "work-hours", "location": "Asia/Beijing"}
    assert spec_error(time_intervals=[interval]) == (
        "federation.yaml: field 'alerting.time_intervals[0].location' unknown time zone 'Asia/Beijing'"
        " (example: Asia/Shanghai) (value 'Asia/Beijing')"
    )
