"""A small, pure builder for Grafana dashboard JSON: typed panels in, plain dicts out.

Pipeline position: ``federation.dashboards.{gpu,workloads,health}`` describe dashboards
with these types; ``federation.dashboards.build`` renders them and dumps the JSON that
``federation/dashboards/*.json`` holds (the one source compose and Helm provision from).

The builder owns what hand-written JSON gets wrong: panel ids (sequential, unique),
``gridPos`` (rows laid out left to right, wrapping at 24 columns, never overlapping),
the datasource (every panel and query points at the ``${datasource}`` variable), refIds
(A, B, ...), and template variables (regex-all ``.*`` so ``=~"$var"`` matches anything).
It does no I/O and keeps no state, so output is deterministic.

Why a generator and not hand-written JSON or Grafana's ``grafana-foundation-sdk``: what
breaks dashboards is PromQL, variable references and layout, and neither JSON by hand nor
the SDK's typed builders (versioned with one Grafana release) check those. Here each
query is data the tests run against a real Prometheus, and the committed JSON is checked
to equal this output byte for byte. (SDK ``1769699379!11.6.0`` tried: it lays panels out
and refuses widths over 24 as ``layout`` does, leaves panel ids null, and checks no query;
see the README's "Logs and Grafana".)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

SCHEMA_VERSION = 39
"""Grafana 10.4 / 11.x dashboards; older servers migrate nothing they do not know."""
GRID_COLUMNS = 24
DATASOURCE_VAR = "datasource"
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": f"${{{DATASOURCE_VAR}}}"}
ALL_VALUE = ".*"

PanelKind = Literal["timeseries", "stat", "table", "bargauge", "gauge"]


@dataclass(frozen=True)
class Query:
    """One PromQL target. ``instant`` for tables and stats that show the latest value."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Link:
    """A link Grafana shows on a panel (``links``) or on each of its series (data links)."""

    title: str
    url: str


@dataclass(frozen=True)
class Panel:
    """One visualisation. ``description`` is required: it says what the panel shows and
    what it shows when its source metrics are absent."""

    title: str
    kind: PanelKind
    queries: tuple[Query, ...]
    description: str
    unit: str = "short"
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    decimals: int | None = None
    no_value: str | None = None
    thresholds: tuple[tuple[str, float | None], ...] = (("green", None),)
    mappings: tuple[tuple[str, str, str], ...] = ()
    """(value, display text, colour) value mappings, e.g. health 0/1."""
    stacked: bool = False
    legend_table: bool = False
    data_links: tuple[Link, ...] = ()
    """Per-series links (``fieldConfig.defaults.links``); left out of the JSON when empty."""


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    """A query variable: ``label_values(source, label)``, or with ``union`` set,
    ``query_result(source)`` whose ``label`` values a regex picks out (several metric
    families that spell the label differently feed one variable)."""

    name: str
    label: str
    source: str
    """A series selector (``label_values``) or a PromQL expression (``query_result``)."""
    label_name: str = ""
    """The label read, when it differs from the variable name."""
    union: bool = False
    multi: bool = True
    include_all: bool = True

    @property
    def source_label(self) -> str:
        return self.label_name or self.name

    @property
    def definition(self) -> str:
        if self.union:
            return f"query_result({self.source})"
        return f"label_values({self.source}, {self.source_label})"

    @property
    def regex(self) -> str:
        return f'/{self.source_label}="([^"]+)"/' if self.union else ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    tags: tuple[str, ...]
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...]
    links_tag: str = "gpufed"
    time_from: str = "now-6h"
    refresh: str = "1m"
    panel_links: tuple[Link, ...] = ()
    """Links every panel carries (its corner menu); left out of the JSON when empty."""


def _ref_id(index: int) -> str:
    return chr(ord("A") + index)


def render_target(query: Query, index: int, *, table: bool) -> dict[str, Any]:
    target: dict[str, Any] = {
        "datasource": dict(DATASOURCE),
        "editorMode": "code",
        "expr": query.expr,
        "instant": query.instant,
        "legendFormat": query.legend or "__auto",
        "range": not query.instant,
        "refId": _ref_id(index),
    }
    if table:
        target["format"] = "table"
    return target


def _field_config(panel: Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "color": {"mode": "palette-classic" if panel.kind == "timeseries" else "thresholds"},
        "thresholds": {
            "mode": "absolute",
            "steps": [{"color": colour, "value": value} for colour, value in panel.thresholds],
        },
        "mappings": [
            {"type": "value", "options": {value: {"text": text, "color": colour, "index": i}}}
            for i, (value, text, colour) in enumerate(panel.mappings)
        ],
    }
    for key in ("min", "max", "decimals"):
        value = getattr(panel, key)
        if value is not None:
            defaults[key] = value
    if panel.no_value is not None:
        defaults["noValue"] = panel.no_value
    if panel.data_links:
        defaults["links"] = [_link(link) for link in panel.data_links]
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if panel.stacked else 0,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"},
        }
    return {"defaults": defaults, "overrides": []}


def _options(panel: Panel) -> dict[str, Any]:
    reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
    if panel.kind == "timeseries":
        return {
            "legend": {
                "showLegend": True,
                "displayMode": "table" if panel.legend_table else "list",
                "placement": "right" if panel.legend_table else "bottom",
                "calcs": ["mean", "max", "lastNotNull"] if panel.legend_table else [],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    if panel.kind == "stat":
        return {"reduceOptions": reduce, "colorMode": "value", "graphMode": "area", "textMode": "auto",
                "orientation": "auto", "justifyMode": "auto"}
    if panel.kind in ("bargauge", "gauge"):
        extra = {"displayMode": "gradient", "orientation": "horizontal"} if panel.kind == "bargauge" else {}
        return {"reduceOptions": reduce, "showThresholdLabels": False, "showThresholdMarkers": True, **extra}
    return {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}


def _link(link: Link) -> dict[str, Any]:
    return {"title": link.title, "url": link.url, "targetBlank": True}


def render_panel(panel: Panel, *, panel_id: int, x: int, y: int) -> dict[str, Any]:
    table = panel.kind == "table"
    out: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": dict(DATASOURCE),
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "targets": [render_target(q, i, table=table) for i, q in enumerate(panel.queries)],
        "fieldConfig": _field_config(panel),
        "options": _options(panel),
    }
    if table:
        # Instant queries in table format: one row per series, values side by side.
        out["transformations"] = [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ]
    return out


def render_variable(variable: Variable) -> dict[str, Any]:
    return {
        "name": variable.name,
        "label": variable.label,
        "type": "query",
        "datasource": dict(DATASOURCE),
        "definition": variable.definition,
        "query": {"query": variable.definition, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,  # on time-range change: nodes come and go
        "multi": variable.multi,
        "includeAll": variable.include_all,
        "allValue": ALL_VALUE if variable.include_all else None,
        "current": {},
        "options": [],
        "regex": variable.regex,
        "sort": 3,  # natural sort: gpu-2 before gpu-10
        "hide": 0,
        "skipUrlSync": False,
    }


def datasource_variable() -> dict[str, Any]:
    return {
        "name": DATASOURCE_VAR,
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "options": [],
        "refresh": 1,
        "regex": "",
        "hide": 0,
        "skipUrlSync": False,
    }


def layout(rows: tuple[Row, ...], links: tuple[Link, ...] = ()) -> list[dict[str, Any]]:
    """Rows and their panels with sequential ids and non-overlapping grid positions."""
    panels: list[dict[str, Any]] = []
    next_id, y = 1, 0
    for row in rows:
        panels.append({"id": next_id, "type": "row", "title": row.title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": GRID_COLUMNS, "x": 0, "y": y}})
        next_id, y = next_id + 1, y + 1
        x, line_height = 0, 0
        for panel in row.panels:
            if not 1 <= panel.width <= GRID_COLUMNS:
                raise ValueError(f"panel {panel.title!r}: width {panel.width} not in 1..{GRID_COLUMNS}")
            if x + panel.width > GRID_COLUMNS:
                x, y, line_height = 0, y + line_height, 0
            panels.append(render_panel(panel, panel_id=next_id, x=x, y=y))
            if links:
                panels[-1]["links"] = [_link(link) for link in links]
            next_id, x, line_height = next_id + 1, x + panel.width, max(line_height, panel.height)
        y += line_height
    return panels


def render_dashboard(dashboard: Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model, ready for file provisioning (``id`` null)."""
    return {
        "id": None,
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": list(dashboard.tags),
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,  # shared crosshair across panels
        "timezone": "browser",
        "time": {"from": dashboard.time_from, "to": "now"},
        "refresh": dashboard.refresh,
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "annotations": {"list": []},
        "links": [{"title": "gpufed dashboards", "type": "dashboards", "tags": [dashboard.links_tag],
                   "asDropdown": True, "includeVars": True, "keepTime": True}],
        "templating": {"list": [datasource_variable(), *(render_variable(v) for v in dashboard.variables)]},
        "panels": layout(dashboard.rows, dashboard.panel_links),
    }
