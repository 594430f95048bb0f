"""A notification's alerts -> one Grafana Explore link to their nodes' logs around their starts.

A pure Jinja filter for the relay's templates (``{{ message.alerts | logs_link(grafana_url) }}``):
empty when the relay has no ``grafana_url`` or no alert names a machine in ``node``. Alerts
about the federation itself (a shard missing, a child's remote_write) carry the rule pack's
``node="*"`` placeholder (``NO_NODE``): no log stream has that label, and ``{node="*"}``
finds nothing, so such an alert adds no node; a message of only those has no Logs link. An
alert about a child that names the child's host in ``node`` (PrometheusChildDown) links to
that host's logs. The link opens Loki (the
``loki`` datasource uid gpufed provisions) on ``{node="<node>"}`` for one node, narrowed to
the GPU's kernel lines when the one alert carries a ``pci_bus_id``, or ``{node=~"a|b"}``
for several (at most ``MAX_NODES``, the first ones in the message), from 15 minutes before
the earliest start to 15 minutes after the latest. One link per message, not per alert:
a 400-character link on each of 300 alerts would triple the parts DingTalk receives. The
default template passes the whole notification's alerts, so every part of a split message
carries the same link, and ``split``'s per-alert size estimate (which renders one alert,
then two) already counts it exactly.
Kept apart from ``render`` so the message layout and this link change independently.
"""

from __future__ import annotations

from collections.abc import Sequence

from alertmanager.dingtalk.payload import Alert
from logs import explore

MAX_NODES = 20
#: The rule pack's ``node`` of alerts not about one machine (federation/rules/federation.yml).
NO_NODE = "*"


def logs_link(alerts: Sequence[Alert], grafana_url: str) -> str:
    named = [a for a in alerts if a.labels.get("node", NO_NODE) not in ("", NO_NODE)]
    if not grafana_url or not named:
        return ""
    nodes = list(dict.fromkeys(a.labels["node"] for a in named))[:MAX_NODES]
    pci = named[0].labels.get("pci_bus_id", "") if len(named) == 1 else ""
    starts = [a.startsAt for a in named]
    return explore.explore_url(
        grafana_url, explore.nodes_query(nodes, pci_bus_id=pci), start=min(starts), end=max(starts)
    )
