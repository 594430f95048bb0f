"""Template rendering, mentions, keywords and splitting under DingTalk's byte limit."""

from __future__ import annotations

import re
from pathlib import Path

from alertmanager.dingtalk.config import DINGTALK_MAX_BYTES
from alertmanager.dingtalk.labels import FOLD_MAX_BYTES, folded, lead
from alertmanager.dingtalk.payload import WebhookMessage
from alertmanager.dingtalk.render import PartInfo, Renderer, merge
from alertmanager.dingtalk.split import split

from .payloads import alert, relay_config, webhook

ONE = PartInfo(part=1, parts=1, more=0)


def message(alerts: list[dict[str, object]]) -> WebhookMessage:
    return WebhookMessage.model_validate(webhook(alerts))  # type: ignore[arg-type]


def test_default_template_sections_times_links() -> None:
    msg = message([alert(1), alert(2, status="resolved")])
    part = Renderer(relay_config()).render("cn-bj", msg, msg.alerts, ONE)
    assert part.title == "[FIRING:1] GPUXidError cn-bj"  # one firing; the resolved one is not counted
    assert "#### Firing (1)" in part.text and "#### Resolved (1)" in part.text
    assert "2024-05-01 18:00:00 CST" in part.text  # 10:00Z in Asia/Shanghai
    assert "2024-05-01 18:00:00 CST -> 2024-05-01 19:00:00 CST" in part.text
    assert "[Alertmanager](http://am.example:9093/#/alerts?receiver=dingtalk-cn-bj)" in part.text
    assert "[Grafana](http://grafana:3000)" in part.text
    assert "[source](http://prometheus:9090/graph?g0.expr=up)" in part.text
    body = part.body()
    assert body["msgtype"] == "markdown" and body["markdown"]["title"] == part.title


def test_timezone_is_configurable() -> None:
    msg = message([alert(1)])
    part = Renderer(relay_config(timezone="UTC")).render("cn-bj", msg, msg.alerts, ONE)
    assert "2024-05-01 10:00:00 UTC" in part.text


def test_mentions_from_label_and_rule_written_into_text() -> None:
    config = relay_config(robot={"mentions": {"mobiles": ["13800000000"], "user_ids": ["ops1"],
                                              "all_on_critical": True}})
    msg = message([alert(1, dingtalk_at="13900000001, 13900000002", severity="critical")])
    part = Renderer(config).render("cn-bj", msg, msg.alerts, ONE)
    assert part.body()["at"] == {"atMobiles": ["13800000000", "13900000001", "13900000002"],
                                 "atUserIds": ["ops1"], "isAtAll": True}
    for who in ("@13800000000", "@13900000001", "@13900000002", "@ops1"):
        assert who in part.text


def test_keyword_added_only_when_missing() -> None:
    msg = message([alert(1)])
    text = Renderer(relay_config(robot={"keywords": ["告警"]})).render("cn-bj", msg, msg.alerts, ONE).text
    assert text.endswith("@13800000000 告警")
    config = relay_config(robot={"keywords": ["Firing"]})
    assert not Renderer(config).render("cn-bj", msg, msg.alerts, ONE).text.endswith("Firing")


def test_custom_template_path(tmp_path: Path) -> None:
    template = tmp_path / "t.md.j2"
    template.write_text('{% set title = "custom " ~ total %}'
                        "{% for a in firing %}* {{ a.labels.node }}\n{% endfor %}")
    msg = message([alert(1), alert(2)])
    part = Renderer(relay_config(template=str(template))).render("cn-bj", msg, msg.alerts, ONE)
    assert part.title == "custom 2"
    assert part.text.startswith("* node-0001\n* node-0002")


def test_split_keeps_every_alert_under_the_limit() -> None:
    alerts = [alert(i, dingtalk_at="13900000001") for i in range(600)]
    msg = message([*alerts, alert(9999, status="resolved")])
    parts = split(Renderer(relay_config()), "cn-bj", msg, limit=19_000)
    assert len(parts) > 1
    assert all(part.size() < DINGTALK_MAX_BYTES for part in parts)
    nodes = [n for part in parts for n in re.findall(r"node=(node-\d{4})", part.text)]
    assert sorted(nodes) == sorted({f"node-{i:04d}" for i in [*range(600), 9999]})
    assert len(nodes) == len(set(nodes)), "an alert appears in two parts"
    assert f"+{601 - parts[0].alerts} more alert(s)" in parts[0].text
    assert f"(1/{len(parts)})" in parts[0].text
    assert all("@13900000001" in part.text for part in parts)


def test_single_huge_alert_is_truncated_with_a_note() -> None:
    msg = message([alert(1, description="显" * 30_000), alert(2)])
    parts = split(Renderer(relay_config()), "cn-bj", msg, limit=19_000)
    assert all(part.size() <= 19_000 for part in parts)
    assert "alert truncated" in parts[0].text
    assert "node=node-0002" in "".join(part.text for part in parts)


def test_merge_joins_parts_within_one_message() -> None:
    renderer = Renderer(relay_config())
    msgs = [message([alert(i)]) for i in (1, 2)]
    one, two = (renderer.render("cn-bj", msg, msg.alerts, ONE) for msg in msgs)
    merged = merge([one, two])
    assert one.text in merged.text and two.text in merged.text
    assert merged.alerts == 2 and merged.title.endswith("(+1 more)")


UUID = "GPU-5f3c1a2e-8b7d-4c1e-9a0f-2d6b7e8c9f01"
NOISY = {"Hostname": "gpu-node-07", "UUID": UUID, "cluster": "ack-bj-prod",
         "component": "gpu", "device": "nvidia3", "env": "prod", "err_code": "79", "team": "llm-pretrain",
         "instance": "10.0.7.7:9400", "severity": "critical"}


def test_alert_leads_with_node_gpu_region_team_then_summary_runbook_and_folded_details() -> None:
    raw = alert(7, **NOISY)
    raw["annotations"]["runbook_url"] = "https://runbooks.example/gpu/xid-79"
    msg = message([raw])
    text = Renderer(relay_config()).render("cn-bj", msg, msg.alerts, ONE).text
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("- **GPUXidError**"))
    assert lines[head] == ("- **GPUXidError** critical "
                           "node=node-0007 · gpu=7 · region=cn-bj · team=llm-pretrain")
    assert lines[head + 1].startswith("  Xid 79 on GPU 7")
    assert lines[head + 2] == "  Runbook: https://runbooks.example/gpu/xid-79"
    assert lines[head + 3] == ("  <font color=#888888>details: Hostname=gpu-node-07 "
                               f"UUID={UUID} cluster=ack-bj-prod component=gpu "
                               "device=nvidia3 env=prod err_code=79 instance=10.0.7.7:9400</font>")
    assert "severity=" not in text and "alertname=" not in text


def test_lead_falls_back_to_hostname_and_drops_its_duplicate() -> None:
    labels = {"Hostname": "n7", "gpus": "0,3", "region": "r", "alertname": "GPUTemperatureHigh", "x": "1"}
    assert lead(labels) == "node=n7 · gpu=0,3 · region=r"
    assert folded(labels) == "x=1"
    assert folded({"node": "n7", "Hostname": "n7", "y": "2"}) == "y=2"
    assert lead({"alertname": "A"}) == ""


def test_folded_labels_are_capped_with_a_count() -> None:
    labels = {f"label{i:02d}": "v" * 30 for i in range(40)}
    out = folded(labels)
    assert len(out.encode()) <= FOLD_MAX_BYTES + len(" (+99 more)")
    kept = out.count("=")
    assert out.endswith(f"(+{40 - kept} more)") and 0 < kept < 40


def test_many_noisy_alerts_still_split_under_the_limit_and_all_lead() -> None:
    msg = message([alert(i, **NOISY) for i in range(300)])
    parts = split(Renderer(relay_config()), "cn-bj", msg, limit=19_000)
    assert len(parts) > 1 and all(part.size() <= 19_000 for part in parts)
    heads = [line for part in parts for line in part.text.splitlines() if line.startswith("- **")]
    assert len(heads) == 300 and all(" · team=llm-pretrain" in line for line in heads)


def test_lead_reads_dcgm_exporters_newer_hostname_label_too() -> None:
    labels = {"hostname": "n8", "gpu": "1", "alertname": "GPURowRemapping", "x": "1"}
    assert lead(labels) == "node=n8 · gpu=1"
    assert folded(labels) == "x=1"


def test_since_is_the_fault_start_from_the_rule_pack_annotation() -> None:
    """Prometheus' startsAt is the firing time (after `for`); the pack's `since` is the start."""
    fired = alert(1)
    fired["startsAt"] = "2024-05-01T10:05:00Z"  # NodeDown, `for: 5m`
    fired["annotations"]["since"] = "2024-05-01 10:00:00.25 +0000 UTC"  # humanizeTimestamp
    garbled = alert(2)
    garbled["annotations"]["since"] = "{{ not a time }}"
    msg = message([fired, garbled])
    part = Renderer(relay_config()).render("cn-bj", msg, msg.alerts, ONE)
    first, second = part.text.split("node-0002", 1)  # the logs link at the end names it again
    assert "since 2024-05-01 18:00:00 CST" in first and "18:05" not in first
    assert "since 2024-05-01 18:00:00 CST" in second  # unparsable: startsAt, never the raw text
    assert "not a time" not in part.text
    ended = alert(1, status="resolved")
    ended["startsAt"], ended["annotations"]["since"] = fired["startsAt"], fired["annotations"]["since"]
    msg = message([ended])
    resolved = Renderer(relay_config()).render("cn-bj", msg, msg.alerts, ONE)
    assert "2024-05-01 18:00:00 CST -> 2024-05-01 19:00:00 CST" in resolved.text
