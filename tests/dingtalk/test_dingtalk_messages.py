"""Messages a person can trust: the title counts what fires, links go only where something runs.

Federation alerts (the rule pack's ``node="*"``) never get ``{node="*"}`` as their LogQL, and
the demo, which runs no Grafana, renders a relay config without Grafana or Logs links.
"""

from __future__ import annotations

import json
from itertools import count
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import yaml

from alertmanager.dingtalk.config import parse_config
from alertmanager.dingtalk.payload import WebhookMessage
from alertmanager.dingtalk.render import PartInfo, Renderer
from alertmanager.render import RELAY_FILE
from federation.demo import plan
from federation.master.pipeline import alerting_part
from federation.spec import GpufedSpec
from sharder.engine.assignment import Assignment
from sharder.model.loading import parse_model

from .payloads import alert, relay_config, webhook

ONE = PartInfo(1, 1, 0)


def message(alerts: list[dict[str, Any]], **extra: Any) -> WebhookMessage:
    return WebhookMessage.model_validate({**webhook(alerts), **extra})


def shard_missing(status: str = "firing") -> dict[str, Any]:
    """FederationShardMissing as the rule pack labels it: about a shard, not a machine."""
    body = alert(9, status=status, alertname="FederationShardMissing", shard="region-0-0", node="*")
    del body["labels"]["gpu"]
    return body


def logs_query(text: str) -> str | None:
    if "[Logs](" not in text:
        return None
    link = text.split("[Logs](", 1)[1].split(")", 1)[0]
    (pane,) = json.loads(parse_qs(urlsplit(link).query)["panes"][0]).values()
    return str(pane["queries"][0]["expr"])


def test_title_counts_firing_alerts_and_a_resolved_message_counts_its_alerts() -> None:
    renderer = Renderer(relay_config())
    mixed = message([alert(1), alert(2, status="resolved"), alert(3, status="resolved")])
    part = renderer.render("cn-bj", mixed, mixed.alerts, ONE)
    assert part.title == "[FIRING:1] GPUXidError cn-bj"
    assert "#### Firing (1)" in part.text and "#### Resolved (2)" in part.text
    ended = message([alert(1, status="resolved"), alert(2, status="resolved")])
    assert renderer.render("cn-bj", ended, ended.alerts, ONE).title == "[RESOLVED:2] GPUXidError cn-bj"
    # Split in parts, every part's title counts the whole notification's firing alerts.
    assert renderer.render("cn-bj", mixed, mixed.alerts[1:], PartInfo(2, 2, 0)).title.startswith("[FIRING:1]")


def test_a_federation_alert_gets_no_logs_link_and_a_mixed_message_links_only_the_machines() -> None:
    renderer = Renderer(relay_config())
    alone = message([shard_missing()])
    text = renderer.render("cn-bj", alone, alone.alerts, ONE).text
    assert logs_query(text) is None and 'node="*"' not in text and "node%3D%22*" not in text
    assert "[Grafana](http://grafana:3000)" in text  # Grafana itself is configured
    mixed = message([shard_missing(), alert(1)])
    assert logs_query(renderer.render("cn-bj", mixed, mixed.alerts, ONE).text) == '{node="node-0001"}'


def test_no_grafana_url_no_grafana_or_logs_link() -> None:
    bare = Renderer(relay_config(grafana_url=None))
    msg = message([alert(1)])
    text = bare.render("cn-bj", msg, msg.alerts, ONE).text
    assert "[Grafana]" not in text and "[Logs]" not in text and ":3000" not in text
    assert "[Alertmanager](http://am.example:9093/" in text


def test_the_demo_relay_config_has_no_grafana_url() -> None:
    """The demo runs no Grafana: its rendered relay config must not point DingTalk at one."""
    doc = plan.demo_spec(plan.load_default_spec(), layout=plan.Layout(nodes=4, gpus=2, regions=1),
                         ports=plan.Ports.allocate(count(30000).__next__), master_data="/data/master")
    spec = parse_model(GpufedSpec, doc, source="demo")
    bundle = alerting_part(spec, [], cast(Assignment, None))  # routing ignores the placement
    data = yaml.safe_load(bundle[RELAY_FILE])
    assert "grafana_url" not in data
    env = {ref: "tok-0123456789abcdef" for ref in _env_refs(data)}
    config = parse_config(data, env=env)
    assert config.grafana_url is None


def _env_refs(value: Any) -> set[str]:
    if isinstance(value, str):
        return {part.split("}", 1)[0] for part in value.split("${")[1:]}
    if isinstance(value, dict):
        return set().union(*(_env_refs(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_env_refs(v) for v in value)) if value else set()
    return set()
