"""Log links on the GPU dashboards: every panel opens Loki on the nodes it shows."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from federation.dashboards import DASHBOARDS_DIR
from logs import explore, formats

GPU_DASHBOARDS = ("gpufed-cluster", "gpufed-node")


def pane_of(url: str, values: dict[str, str]) -> dict[str, Any]:
    """The Explore pane a link opens once Grafana has filled in ``values``."""
    for placeholder, value in values.items():
        url = url.replace(placeholder, value)
    assert "${" not in url, url
    (pane,) = json.loads(parse_qs(urlsplit(url).query)["panes"][0]).values()
    return dict(pane)


FILLED = {
    "${__from}": "1714556700000",
    "${__to}": "1714558500000",
    "${__field.labels.node}": "bj-r00-n007",
    "${region:percentencode}": "cn-beijing%7Ccn-shanghai",
    "${node:percentencode}": ".%2A",
}


@pytest.mark.parametrize("uid", GPU_DASHBOARDS)
def test_every_gpu_panel_links_to_the_logs_of_what_it_shows(uid: str) -> None:
    model = json.loads((DASHBOARDS_DIR / f"{uid}.json").read_text())
    variables = {v["name"] for v in model["templating"]["list"]}
    panels = [p for p in model["panels"] if p["type"] != "row"]
    for panel in panels:
        (link,) = panel["links"]
        for name in re.findall(r"\$\{(\w+):percentencode\}", link["url"]):
            assert name in variables, (uid, panel["title"], name)
        expr = pane_of(link["url"], FILLED)["queries"][0]["expr"]
        matchers = formats.check_selector(expr)
        assert matchers["region"] == ("=~", "cn-beijing|cn-shanghai")
    data_linked = [p for p in panels if p["fieldConfig"]["defaults"].get("links")]
    assert data_linked, uid
    for panel in data_linked:
        for target in panel["targets"]:  # the series it draws keep a node label: the first `by` names it
            first_by = re.search(r"by \(([^)]*)\)", target["expr"])
            assert first_by and "node" in first_by[1].split(", "), (panel["title"], target["expr"])
        pane = pane_of(panel["fieldConfig"]["defaults"]["links"][0]["url"], FILLED)
        assert pane["queries"][0]["expr"] == '{node="bj-r00-n007"}'
        assert pane["range"] == {"from": "1714556700000", "to": "1714558500000"}
        assert pane["datasource"] == explore.LOKI_UID


def test_every_node_dashboard_panel_but_clock_skew_has_a_per_node_link() -> None:
    model = json.loads((DASHBOARDS_DIR / "gpufed-node.json").read_text())
    panels = [p for p in model["panels"] if p["type"] != "row"]
    assert all(p["fieldConfig"]["defaults"].get("links") for p in panels)


def test_kernel_pci_matches_the_driver_line() -> None:
    assert explore.kernel_pci("00000000:3B:00.0") == "PCI:0000:3b:00"
    assert explore.kernel_pci("0000:af:00.0") == "PCI:0000:af:00"
    assert explore.kernel_pci("GPU-1234") is None
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
    from logs.promtail import XID_REGEX

    match = re.search(XID_REGEX, line)
    assert match and match["pci"] == explore.kernel_pci("00000000:3B:00.0") and match["xid"] == "79"
