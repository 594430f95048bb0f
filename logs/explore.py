"""Grafana Explore links with the LogQL for one node (and GPU), over a window: pure.

Used by the DingTalk relay (one link per message: its alerts' nodes around their starts) and the dashboards (a
data link per series, ``${__field.labels.node}`` over the dashboard's range). The URL is
Explore's pane state (Grafana 10.1+: ``/explore?schemaVersion=1&panes=<JSON>``, one pane
keyed by an id, with the datasource uid, the queries and the range), as Grafana's own
links write it (grafana/grafana public/app/core/utils/explore.ts, ``urlUtil.renderUrl``).

The query reads the streams Promtail ships (``logs.promtail``): the node's journal (kernel
ring with the XID lines, fabric manager, kubelet, containerd) and its container logs. The
GPU is named in the kernel's XID lines by its PCI address (``NVRM: Xid (PCI:0000:3b:00)``),
so a GPU alert's ``pci_bus_id`` (NVML: ``00000000:3B:00.0``) becomes a line filter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from urllib.parse import quote, unquote

LOKI_UID = "loki"
DEFAULT_BEFORE = timedelta(minutes=15)
DEFAULT_AFTER = timedelta(minutes=15)
_REGEX_META = re.compile(r"[.+*?()\[\]{}|^$\\]")
_NVML_PCI = re.compile(r"^[0-9A-Fa-f]{4,8}:([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.[0-7]\Z")


def kernel_pci(pci_bus_id: str) -> str | None:
    """NVML's ``00000000:3B:00.0`` -> the kernel's ``PCI:0000:3b:00``; None if not a bus id."""
    match = _NVML_PCI.match(pci_bus_id.strip())
    if match is None:
        return None
    domain = pci_bus_id.strip().split(":", 1)[0][-4:].lower()
    return f"PCI:{domain}:{match[1].lower()}:{match[2].lower()}"


def _quote_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def node_query(node: str, *, pci_bus_id: str = "", node_is_template: bool = False) -> str:
    """LogQL for every stream of ``node``; with a PCI bus id, only lines naming that GPU.

    ``node_is_template``: ``node`` is a Grafana placeholder (``${__field.labels.node}``)
    inserted verbatim."""
    value = node if node_is_template else _quote_label(node)
    query = f'{{node="{value}"}}'
    pci = kernel_pci(pci_bus_id) if pci_bus_id else None
    if pci:
        query += f' |= "{pci}"'
    return query


def nodes_query(nodes: Sequence[str], *, pci_bus_id: str = "") -> str:
    """LogQL for several nodes at once (``node=~"a|b"``); one node is :func:`node_query`."""
    if len(nodes) == 1:
        return node_query(nodes[0], pci_bus_id=pci_bus_id)
    alternation = "|".join(_REGEX_META.sub(r"\\\g<0>", n) for n in nodes)
    return f'{{node=~"{_quote_label(alternation)}"}}'


def _pane(query: str, *, start: str, end: str, datasource: str) -> str:
    panes = {
        "gpufed": {
            "datasource": datasource,
            "queries": [
                {
                    "refId": "A",
                    "expr": query,
                    "queryType": "range",
                    "datasource": {"type": "loki", "uid": datasource},
                }
            ],
            "range": {"from": start, "to": end},
        }
    }
    return json.dumps(panes, separators=(",", ":"), sort_keys=True)


def explore_url(
    grafana_url: str,
    query: str,
    *,
    start: datetime,
    end: datetime | None = None,
    before: timedelta = DEFAULT_BEFORE,
    after: timedelta = DEFAULT_AFTER,
    datasource: str = LOKI_UID,
    org_id: int = 1,
) -> str:
    """An absolute Explore link over ``[start - before, (end or start) + after]`` (epoch ms)."""
    begin = int((start - before).timestamp() * 1000)
    until = int(((end or start) + after).timestamp() * 1000)
    panes = _pane(query, start=str(begin), end=str(until), datasource=datasource)
    return f"{grafana_url.rstrip('/')}/explore?schemaVersion=1&orgId={org_id}&panes={quote(panes, safe='')}"


def _templated(query: str, placeholders: dict[str, str], *, datasource: str) -> str:
    """A relative Explore URL whose markers Grafana fills in when the link is opened: the
    JSON around them is percent-encoded, the ``${...}`` placeholders stay as they are."""
    pane = _pane(query, start="@@FROM@@", end="@@TO@@", datasource=datasource)
    encoded = quote(pane, safe="")
    for marker, placeholder in {**placeholders, "@@FROM@@": "${__from}", "@@TO@@": "${__to}"}.items():
        encoded = encoded.replace(quote(marker, safe=""), placeholder)
    return f"/explore?schemaVersion=1&orgId=1&panes={encoded}"


def data_link_url(*, datasource: str = LOKI_UID) -> str:
    """A data link (per series): that series' node over the dashboard's range."""
    return _templated(node_query("@@NODE@@", node_is_template=True),
                      {"@@NODE@@": "${__field.labels.node}"}, datasource=datasource)


def panel_link_url(variables: Sequence[str] = ("region", "node"), *, datasource: str = LOKI_UID) -> str:
    """A panel link: the streams the dashboard's variables select (``region``, ``node``:
    each a stream label of the same name), over its range.

    ``:percentencode`` keeps ``|`` of several values (and a ``.*`` "All") URL-safe; the
    ``job=~".+"`` matcher keeps the selector valid when every variable is "All" (Loki
    refuses a selector whose every matcher matches the empty string)."""
    matchers = ", ".join(['job=~".+"', *(f'{v}=~"@@{v.upper()}@@"' for v in variables)])
    return _templated(f"{{{matchers}}}", {f"@@{v.upper()}@@": f"${{{v}:percentencode}}" for v in variables},
                      datasource=datasource)


_PLACEHOLDER = re.compile(r"%24%7B(.+?)%7D")


def scope_link(url: str, labels: dict[str, str]) -> str:
    """An Explore link (as :func:`panel_link_url` makes them) whose LogQL selector also
    requires ``labels``, e.g. a team dashboard's ``team``; Grafana placeholders stay intact."""
    head, _, panes = url.partition("panes=")
    state = json.loads(unquote(panes))
    matchers = ", ".join(f'{k}="{_quote_label(v)}"' for k, v in sorted(labels.items()))
    for pane in state.values():
        for query in pane["queries"]:
            query["expr"] = query["expr"].replace("{", f"{{{matchers}, ", 1)
    encoded = quote(json.dumps(state, separators=(",", ":"), sort_keys=True), safe="")
    return head + "panes=" + _PLACEHOLDER.sub(lambda m: "${" + unquote(m[1]) + "}", encoded)
