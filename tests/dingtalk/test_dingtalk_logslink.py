"""Every DingTalk message links to Grafana Explore with the LogQL of its alerts' nodes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, unquote, urlsplit

from alertmanager.dingtalk.logslink import logs_link
from alertmanager.dingtalk.payload import Alert, WebhookMessage
from alertmanager.dingtalk.render import PartInfo, Renderer
from logs import formats

from .payloads import relay_config, webhook

START = datetime(2026, 5, 1, 9, 30, tzinfo=UTC)


def alert(node: str, *, start: datetime = START, **labels: str) -> Alert:
    return Alert.model_validate(
        {
            "status": "firing",
            "labels": {"alertname": "GPUXidError", "node": node, **labels},
            "startsAt": start.isoformat(),
        }
    )


def pane(url: str) -> dict:  # type: ignore[type-arg]
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    assert parts.path == "/explore" and query["schemaVersion"] == ["1"]
    (only,) = json.loads(query["panes"][0]).values()
    return dict(only)


def test_one_node_one_gpu_names_the_kernel_line_and_the_window() -> None:
    url = logs_link([alert("bj-r00-n007", pci_bus_id="00000000:3B:00.0")], "https://grafana.example/")
    assert url.startswith("https://grafana.example/explore?")
    view = pane(url)
    expr = view["queries"][0]["expr"]
    assert expr == '{node="bj-r00-n007"} |= "PCI:0000:3b:00"'
    assert formats.check_selector(expr) == {"node": ("=", "bj-r00-n007")}
    assert view["datasource"] == view["queries"][0]["datasource"]["uid"] == "loki"
    window = (int(view["range"]["from"]), int(view["range"]["to"]))
    assert window == (
        int((START - timedelta(minutes=15)).timestamp() * 1000),
        int((START + timedelta(minutes=15)).timestamp() * 1000),
    )


def test_several_nodes_one_link_over_all_their_starts() -> None:
    later = START + timedelta(minutes=40)
    view = pane(logs_link([alert("n1"), alert("n.2", start=later), alert("n1")], "http://g:3000"))
    assert view["queries"][0]["expr"] == '{node=~"n1|n\\\\.2"}'
    assert int(view["range"]["to"]) == int((later + timedelta(minutes=15)).timestamp() * 1000)


def test_no_link_without_grafana_or_without_a_node() -> None:
    assert logs_link([alert("n1")], "") == ""
    no_node = Alert.model_validate(
        {"status": "firing", "labels": {"alertname": "Watchdog"}, "startsAt": START.isoformat()}
    )
    assert logs_link([no_node], "http://g:3000") == ""


def test_the_default_template_carries_the_link_in_every_part() -> None:
    message = WebhookMessage.model_validate(
        webhook(
            [
                {
                    "status": "firing",
                    "labels": {"alertname": "GPUXidError", "region": "cn-bj", "node": "node-0007"},
                    "startsAt": START.isoformat(),
                }
            ]
        )
    )
    renderer = Renderer(relay_config())
    text = renderer.render("cn-bj", message, message.alerts, PartInfo(1, 1, 0)).text
    link = text.split("[Logs](", 1)[1].split(")", 1)[0]
    assert pane(link)["queries"][0]["expr"] == '{node="node-0007"}'
    assert unquote(link).count("node-0007") == 1
    bare = Renderer(relay_config(grafana_url=None))
    assert "[Logs](" not in bare.render("cn-bj", message, message.alerts, PartInfo(1, 1, 0)).text
