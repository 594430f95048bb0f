"""Split one notification into DingTalk messages under the byte limit, losing no alert.

Each part lists whole alerts and says how many follow ("+N more"); one alert too big on
its own is truncated with a note. Sizes are estimated per alert (render with the alert
twice minus render with it once), packed greedily, then every part is rendered for real
and re-split if the estimate was off, so the limit holds for any template. ``@all``
stays on the first part that asks for it: once per notification, not once per part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from alertmanager.dingtalk.payload import Alert, WebhookMessage
from alertmanager.dingtalk.render import Part, PartInfo, Renderer

_TRUNCATED = "\n\n> (alert truncated: {cut} bytes over the DingTalk limit)"
# The note's numbers grow with the part count; estimate with wide ones.
_PROBE = PartInfo(part=9999, parts=9999, more=999_999)


def split(renderer: Renderer, robot: str, message: WebhookMessage, *, limit: int) -> list[Part]:
    """All alerts of ``message`` as parts for ``robot``, each ``size() <= limit``."""
    alerts = sorted(message.alerts, key=lambda a: a.status != "firing")  # firing first, stable
    groups: list[list[Alert]] = []
    used = 0
    for alert in alerts:
        # Marginal cost: headers and shared mentions are paid once per part, not per alert.
        alone = renderer.render(robot, message, [alert], _PROBE).size()
        cost = renderer.render(robot, message, [alert, alert], _PROBE).size() - alone
        if groups and used + cost <= limit:
            groups[-1].append(alert)
            used += cost
        else:
            groups.append([alert])
            used = alone
    groups = _refine(renderer, robot, message, groups, limit=limit)
    parts: list[Part] = []
    remaining = len(alerts)
    for index, group in enumerate(groups, start=1):
        remaining -= len(group)
        info = PartInfo(part=index, parts=len(groups), more=remaining)
        part = renderer.render(robot, message, group, info)
        parts.append(part if part.size() <= limit else _truncate(renderer, robot, message, group, info,
                                                                  limit=limit))
    return _at_all_once(parts)


def _at_all_once(parts: list[Part]) -> list[Part]:
    """``@all`` pages the whole group: once per notification, on its first part that asks."""
    first = next((i for i, part in enumerate(parts) if part.at_all), None)
    return [replace(part, at_all=False) if part.at_all and i != first else part
            for i, part in enumerate(parts)]


def _refine(renderer: Renderer, robot: str, message: WebhookMessage, groups: list[list[Alert]], *,
            limit: int) -> list[list[Alert]]:
    """Halve any multi-alert group whose real rendering is over the limit."""
    out: list[list[Alert]] = []
    pending = list(reversed(groups))
    while pending:
        group = pending.pop()
        if len(group) > 1 and renderer.render(robot, message, group, _PROBE).size() > limit:
            half = len(group) // 2
            pending += [group[half:], group[:half]]
        else:
            out.append(group)
    return out


def _truncate(renderer: Renderer, robot: str, message: WebhookMessage, group: Sequence[Alert],
              info: PartInfo, *, limit: int) -> Part:
    """A single oversized alert: cut its text (keeping the mention/keyword suffix)."""
    alert = group[0]
    fat = renderer.render(robot, message, group, info)
    over = fat.size() - limit
    while True:
        budget = max(0, sum(len(v.encode()) for v in alert.annotations.values()) - over - 200)
        slim = _shrink(alert, budget)
        part = renderer.render(robot, message, [slim], info)
        note = _TRUNCATED.format(cut=fat.size() - part.size())
        part = replace(part, text=part.text + note)
        if part.size() <= limit or budget == 0:
            return part if part.size() <= limit else _hard_cut(part, limit)
        over += part.size() - limit


def _shrink(alert: Alert, budget: int) -> Alert:
    """Keep annotations up to ``budget`` UTF-8 bytes in total (labels are kept whole)."""
    kept: dict[str, str] = {}
    for key, value in alert.annotations.items():
        raw = value.encode()[:budget].decode(errors="ignore")
        kept[key] = raw
        budget -= len(raw.encode())
    return alert.model_copy(update={"annotations": kept})


def _hard_cut(part: Part, limit: int) -> Part:
    """Last resort when labels alone are too big: cut the text itself."""
    while part.size() > limit:
        raw = part.text.encode()
        keep = max(0, len(raw) - (part.size() - limit) - 64)
        part = replace(part, text=raw[:keep].decode(errors="ignore") + "\n\n> (truncated)")
    return part
