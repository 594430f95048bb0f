"""Builders for Alertmanager webhook payloads and relay configs used across relay tests."""

from __future__ import annotations

from typing import Any

from alertmanager.dingtalk.config import RelayConfig, parse_config

TOKEN = "tok-0123456789abcdef"
SECRET = "SECtest-secret-0123456789"


def alert(i: int, *, status: str = "firing", alertname: str = "GPUXidError", region: str = "cn-bj",
          description: str = "", **labels: str) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": alertname, "region": region, "node": f"node-{i:04d}", "gpu": str(i % 8),
                   **labels},
        "annotations": {"summary": f"Xid 79 on GPU {i % 8} 显卡掉卡", "description": description},
        "startsAt": "2024-05-01T10:00:00Z",
        "endsAt": "2024-05-01T11:00:00Z" if status == "resolved" else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=up",
        "fingerprint": f"{i:016x}",
    }


def webhook(alerts: list[dict[str, Any]], *, group: str = "g1", status: str | None = None) -> dict[str, Any]:
    firing = any(a["status"] == "firing" for a in alerts)
    return {
        "version": "4", "groupKey": f'{{}}:{{group="{group}"}}', "truncatedAlerts": 0,
        "status": status or ("firing" if firing else "resolved"), "receiver": "dingtalk-cn-bj",
        "groupLabels": {"alertname": alerts[0]["labels"]["alertname"], "region": "cn-bj"},
        "commonLabels": {"region": "cn-bj"}, "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093", "alerts": alerts,
    }


def relay_config(url: str = f"https://oapi.dingtalk.com/robot/send?access_token={TOKEN}", **extra: Any
                 ) -> RelayConfig:
    robot = {"url": url, "secret": SECRET, "keywords": ["alert"], "rate_per_minute": 18,
             "mentions": {"mobiles": ["13800000000"], "label": "dingtalk_at"}}
    robot.update(extra.pop("robot", {}))
    data: dict[str, Any] = {"alertmanager_url": "http://am.example:9093", "grafana_url": "http://grafana:3000",
                            "max_wait": "1s", "robots": {"cn-bj": robot}}
    data.update(extra)
    return parse_config(data, env={})
