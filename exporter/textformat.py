"""Prometheus text format 0.0.4 for the metric shapes the exporter emits, byte-equal to
`prometheus_client.generate_latest` but about ten times cheaper.

Why it exists: `generate_latest` validates and escapes every label of every sample. A
node's series share one label set per GPU, so this writer formats each distinct label
set once per render. Measured on 8 simulated GPUs: 1.8 ms -> ~0.2 ms per render, which
is what lets one fleet process answer 64 concurrent scrapers of 2,000 nodes.

`render` returns None for anything outside the subset it knows (other metric types,
timestamps, exemplars, names outside the legacy character set); the caller then uses
`generate_latest`, so output never depends on which path ran. Tests compare both paths.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_TYPES = {"gauge": "gauge", "counter": "counter", "unknown": "untyped", "untyped": "untyped"}
_OPENMETRICS_SUFFIXES = ("_created", "_gsum", "_gcount")


class ExactCounter(Metric):
    """A counter whose series keep their own name: DCGM's, as dcgm-exporter writes them
    (`# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter`, no `_total` added).

    `generate_latest` would head such a family `NAME_total`, so for these families only
    this writer's bytes are right; the fallback below is never taken for them."""

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, "counter")


def fallback(registry: Collector) -> bytes:
    """`generate_latest`, with the headers of `ExactCounter` families named as their series.

    Used where `render` defers (an odd label name, a histogram): only the two header lines
    of each exact counter differ from prometheus-client's, so they are rewritten here."""
    exact = {m.name for m in registry.collect() if isinstance(m, ExactCounter)}
    text = generate_latest(registry)
    if not exact:
        return text
    out = []
    for line in text.split(b"\n"):
        if line.startswith((b"# HELP ", b"# TYPE ")):
            head, name, rest = line[:7], *line[7:].split(b" ", 1)
            if name.endswith(b"_total") and name[:-6].decode() in exact:
                line = head + name[:-6] + b" " + rest
        out.append(line)
    return b"\n".join(out)


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labelstr(labels: Mapping[str, str]) -> str | None:
    if not labels:
        return ""
    parts = []
    for name, value in sorted(labels.items()):
        if not _LABEL_NAME.match(name):
            return None
        parts.append(f'{name}="{_value(value)}"')
    return "{" + ",".join(parts) + "}"


def _number(value: float) -> str:
    """`floatToGoString` with its common case (a finite value below 1e6) inlined."""
    text = repr(float(value))
    dot = text.find(".")
    if 0 < dot <= 6 and text[-1] != "f" and text[-1] != "n":
        return text
    return floatToGoString(value)


#: Label sets seen before, per caller (one node); cleared when it grows past this.
MAX_REMEMBERED_LABEL_SETS = 4096


LabelCache = dict[tuple[tuple[str, str], ...], str | None]


def render(metrics: Iterable[Metric], *, remembered: LabelCache | None = None) -> bytes | None:
    """The text exposition of `metrics`, or None when `generate_latest` must do it.

    `remembered` (owned by the caller, e.g. one node's routes) keeps formatted label sets
    across renders: a node's label sets rarely change between collections.
    """
    metrics = list(metrics)  # keeps every label dict alive, so id() keys stay unique
    cache: dict[int, str | None] = {}
    if remembered is None:
        remembered = {}
    elif len(remembered) > MAX_REMEMBERED_LABEL_SETS:
        remembered.clear()
    names: set[str] = set()
    out: list[str] = []
    for metric in metrics:
        kind = _TYPES.get(metric.type)
        if kind is None:
            return None
        exact = isinstance(metric, ExactCounter)
        name = metric.name + "_total" if metric.type == "counter" and not exact else metric.name
        if not _METRIC_NAME.match(name):
            return None
        out.append(f"# HELP {name} {_help(metric.documentation)}\n# TYPE {name} {kind}\n")
        openmetrics_only = set() if exact else {metric.name + suffix for suffix in _OPENMETRICS_SUFFIXES}
        for sample in metric.samples:
            if sample.timestamp is not None or sample.exemplar is not None or sample.name in openmetrics_only:
                return None
            if sample.name not in names:
                if not _METRIC_NAME.match(sample.name):
                    return None
                names.add(sample.name)
            key = id(sample.labels)
            if key in cache:
                labels = cache[key]
            else:
                items = tuple(sample.labels.items())
                if items in remembered:
                    labels = remembered[items]
                else:
                    labels = remembered[items] = _labelstr(sample.labels)
                cache[key] = labels
            if labels is None:
                return None
            out.append(f"{sample.name}{labels} {_number(sample.value)}\n")
    return "".join(out).encode("utf-8")
