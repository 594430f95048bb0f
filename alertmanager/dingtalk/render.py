"""Webhook payload -> DingTalk markdown parts, each under the robot's byte limit.

Pure: Jinja2 templates in, ``Part`` values out. The default template ships in
``templates/default.md.j2``; ``template:`` in the config (global or per robot) replaces it.
Splitting lives in ``split``; this module renders one part and finishes it (keyword and
``@mobile`` mentions that DingTalk requires in the text).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import jinja2

from alertmanager.dingtalk import logslink
from alertmanager.dingtalk.config import RelayConfig, RobotConfig
from alertmanager.dingtalk.errors import ConfigError
from alertmanager.dingtalk.labels import folded, lead
from alertmanager.dingtalk.payload import EARLIEST, LATEST, ZERO_TIME, Alert, WebhookMessage

_SPLIT_MOBILES = re.compile(r"[\s,;]+")


@dataclass(frozen=True)
class Part:
    """One DingTalk markdown message (or a merge of several)."""

    title: str
    text: str
    at_mobiles: tuple[str, ...] = ()
    at_user_ids: tuple[str, ...] = ()
    at_all: bool = False
    alerts: int = 0

    def body(self) -> dict[str, Any]:
        return {
            "msgtype": "markdown",
            "markdown": {"title": self.title, "text": self.text},
            "at": {"atMobiles": list(self.at_mobiles), "atUserIds": list(self.at_user_ids),
                   "isAtAll": self.at_all},
        }

    def size(self) -> int:
        """UTF-8 bytes of the JSON body exactly as ``client`` sends it."""
        return len(json.dumps(self.body(), ensure_ascii=False).encode())

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.body(), sort_keys=True).encode()).hexdigest()[:32]


def merge(parts: Sequence[Part]) -> Part:
    """Several queued parts for one robot as one message (mentions are the union)."""
    if len(parts) == 1:
        return parts[0]
    title = f"{parts[0].title} (+{len(parts) - 1} more)"
    return Part(
        title=title,
        text="\n\n---\n\n".join(part.text for part in parts),
        at_mobiles=tuple(dict.fromkeys(m for part in parts for m in part.at_mobiles)),
        at_user_ids=tuple(dict.fromkeys(u for part in parts for u in part.at_user_ids)),
        at_all=any(part.at_all for part in parts),
        alerts=sum(part.alerts for part in parts),
    )


@dataclass(frozen=True)
class PartInfo:
    part: int
    parts: int
    more: int


class Renderer:
    """Compiled templates for one config; rebuilt on reload."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self._zone = ZoneInfo(config.timezone)
        self._env = jinja2.Environment(autoescape=False, keep_trailing_newline=True)
        self._env.filters["localtime"] = self._localtime
        self._env.filters["since"] = self._since
        self._env.filters["labelstr"] = _labelstr
        self._env.filters["lead"] = lead
        self._env.filters["folded"] = folded
        self._env.filters["logs_link"] = logslink.logs_link
        default = resources.files("alertmanager.dingtalk").joinpath("templates/default.md.j2").read_text()
        self._default = self._compile(config.template) if config.template else self._env.from_string(default)
        self._robots = {name: self._compile(robot.template) for name, robot in config.robots.items()
                        if robot.template is not None}

    def _compile(self, path: Path) -> jinja2.Template:
        try:
            return self._env.from_string(path.read_text(encoding="utf-8"))
        except (OSError, jinja2.TemplateError) as exc:
            raise ConfigError(f"template {path}: {exc}", field="template") from exc

    def _localtime(self, value: datetime) -> str:
        if value <= ZERO_TIME:
            return ""
        return value.astimezone(self._zone).strftime("%Y-%m-%d %H:%M:%S %Z")

    def _since(self, alert: Alert) -> str:
        """When the fault began: the rule pack's ``since`` annotation, else ``startsAt``."""
        return self._localtime(fault_start(alert))

    def render(self, robot: str, message: WebhookMessage, alerts: Sequence[Alert], info: PartInfo) -> Part:
        """One part holding ``alerts`` (whole), finished for ``robot``."""
        template = self._robots.get(robot, self._default)
        firing = [a for a in alerts if a.status == "firing"]
        firing_total = sum(1 for a in message.alerts if a.status == "firing")
        module = template.make_module({
            "message": message, "firing": firing, "resolved": [a for a in alerts if a.status != "firing"],
            "part": info.part, "parts": info.parts, "more": info.more, "total": len(message.alerts),
            "firing_total": firing_total, "resolved_total": len(message.alerts) - firing_total,
            "am_url": (self.config.alertmanager_url or message.externalURL).rstrip("/"),
            "grafana_url": (self.config.grafana_url or "").rstrip("/"), "robot": robot,
        })
        title = str(getattr(module, "title", "") or f"[{message.status.upper()}] {message.receiver}")
        return finish(self.config.robots[robot], title=title, text=str(module).strip(), alerts=alerts)


def finish(robot: RobotConfig, *, title: str, text: str, alerts: Sequence[Alert]) -> Part:
    """Add what DingTalk insists on: a configured keyword, and ``@who`` for each mention."""
    rule = robot.mentions
    mobiles = list(rule.mobiles)
    for alert in alerts:
        mobiles += [m for m in _SPLIT_MOBILES.split(alert.labels.get(rule.label, "")) if m]
    mobiles = list(dict.fromkeys(mobiles))
    at_all = rule.all_on_critical and any(
        a.status == "firing" and a.labels.get("severity") == "critical" for a in alerts)
    suffix = [f"@{who}" for who in [*mobiles, *rule.user_ids]]
    if robot.keywords and not any(kw in text for kw in robot.keywords):
        suffix.append(robot.keywords[0])
    if suffix:
        text = f"{text}\n\n{' '.join(suffix)}"
    return Part(title=title, text=text, at_mobiles=tuple(mobiles), at_user_ids=tuple(rule.user_ids),
                at_all=at_all, alerts=len(alerts))


#: Go's ``time.Time.String()`` as Prometheus' ``humanizeTimestamp`` writes it:
#: ``2026-11-26 12:00:00.123 +0000 UTC`` (fraction optional).
_GO_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? ([+-]\d{4})\b")


def fault_start(alert: Alert) -> datetime:
    """The ``since`` annotation (the alert's active time) when it parses, else ``startsAt``.

    Prometheus sends the firing time (after ``for``) as ``startsAt``; the rule pack carries
    when the condition began as ``since``.
    """
    match = _GO_TIME.match(alert.annotations.get("since", "").strip())
    if match is None:
        return alert.startsAt
    since = datetime.strptime(f"{match.group(1)} {match.group(2)}", "%Y-%m-%d %H:%M:%S %z")
    # An annotation is free text: one outside the payload's own time range is ignored.
    return since if EARLIEST <= since < LATEST else alert.startsAt


def _labelstr(labels: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
