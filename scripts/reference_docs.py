"""Writes docs/reference/{metrics,alerts}.md from the code, so the reference cannot drift.

The metrics come from the objects that serve them: the exporter's exposition of a simulated
node with every family switched on, and the metric classes of the controller, the relay and
the web guard, each on a registry of its own. The alerts and recording rules come from the
rule pack's files. ``--check`` exits 1 when the committed pages differ from what the code
gives (the suite runs it); without it the pages are written.

    python scripts/reference_docs.py [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages, whatever the virtualenv installed
OUT = ROOT / "docs" / "reference"
RULES = ROOT / "federation" / "rules"


@dataclass(frozen=True)
class MetricRow:
    name: str
    kind: str
    labels: tuple[str, ...]
    help: str
    note: str = ""


def cell(text: str) -> str:
    """Markdown table cell: one line, pipes escaped."""
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def exporter_rows() -> tuple[list[MetricRow], set[str]]:
    """Every series family one simulated node serves with all families on, and the labels
    every plain per-GPU series carries (shown once, not on every row)."""
    from exporter import catalogue, textformat
    from exporter.collection import Collection
    from exporter.exposition import LabelPolicy, SnapshotCollector
    from exporter.simulated import SimulatedBackend

    default = catalogue.select_families()
    families = catalogue.select_families(include=catalogue.FAMILIES)
    family_of = {spec.name: spec.family for spec in catalogue.METRICS}
    backend = SimulatedBackend(2, node="node-0", xid_probability=0.0)
    collection = Collection(backend, families, attribution=None, timeout=None)
    collection.collect_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(collection, LabelPolicy("node-0", "Hostname", {"region": "r"})))
    body = (textformat.render(registry.collect()) or b"").decode()
    helps: dict[str, str] = {}
    kinds: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for line in body.splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[7:].partition(" ")
            helps[name] = text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            kinds[name] = kind
        elif line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            found = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', line.split(" ", 1)[0] if "{" not in line
                               else line[line.index("{") : line.rindex("}")])
            labels.setdefault(name, set()).update(found)
    common = labels.get("DCGM_FI_DEV_GPU_UTIL", set())

    rows = []
    for name in sorted(labels):
        base = re.sub(r"_(total|created|bucket|count|sum)$", "", name)
        family = family_of.get(name) or family_of.get(base, "")
        note = f"family `{family}`" + ("" if family in default else ", opt-in") if family else ""
        own = labels[name]
        shown = (("GPU labels",) if common and common <= own else ()) + tuple(
            sorted(own - common if common <= own else own))
        rows.append(MetricRow(name, kinds.get(name, kinds.get(base, "")), shown,
                              helps.get(name, helps.get(base, "")), note))
    return rows, common - {"region"}


def registry_rows(build: Iterable[object]) -> list[MetricRow]:
    """The metrics the given metric objects registered, with their label names."""
    rows: dict[str, MetricRow] = {}
    for metrics in build:
        for value in vars(metrics).values():
            name = getattr(value, "_name", None)
            if not isinstance(name, str) and callable(getattr(value, "collect", None)):
                for family in value.collect():  # a custom collector (the per-shard gauges' text)
                    rows[family.name] = MetricRow(family.name, family.type,
                                                  tuple(getattr(family, "_labelnames", ())),
                                                  family.documentation)
                continue
            if not isinstance(name, str):
                continue
            kind = str(getattr(value, "_type", ""))
            rows[name] = MetricRow(name, kind, tuple(getattr(value, "_labelnames", ())),
                                   str(getattr(value, "_documentation", "")))
    return [rows[n] for n in sorted(rows)]


def controller_metrics() -> Iterator[object]:
    from federation.controller.base.metrics import ControllerMetrics

    yield ControllerMetrics(registry=CollectorRegistry())


def relay_metrics() -> Iterator[object]:
    from alertmanager.dingtalk.metrics import RelayMetrics

    yield RelayMetrics(CollectorRegistry())


def metric_table(rows: list[MetricRow], *, notes: bool = False) -> list[str]:
    head = "| metric | type | labels | what it is |" + (" collected |" if notes else "")
    out = [head, "|---|---|---|---|" + ("---|" if notes else "")]
    for r in rows:
        labels = ", ".join(label if label == "GPU labels" else f"`{label}`" for label in r.labels)
        line = f"| `{r.name}` | {r.kind} | {labels} | {cell(r.help)} |"
        out.append(line + (f" {cell(r.note)} |" if notes else ""))
    return out


def rule_groups() -> Iterator[tuple[str, dict]]:
    for path in sorted(RULES.glob("*.yml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for group in doc.get("groups", []):
            yield path.name, group


def metrics_page() -> str:
    gpu_rows, gpu_labels = exporter_rows()
    common = ", ".join(f"`{x}`" for x in sorted(gpu_labels))
    lines = [
        "# Metrics reference",
        "",
        "Generated by `python scripts/reference_docs.py` from the code that serves each metric;",
        "`tests/test_docs.py` fails when this page and the code disagree.",
        "",
        "## GPU exporter (`gpufed-exporter`)",
        "",
        "One simulated node with every family switched on; the last column names the family",
        "(`--families` and `--exclude` pick them) and says which are off by default.",
        f"\"GPU labels\" are the labels every per-GPU series carries: {common}, plus the",
        "node's placement labels (`region`, `rack`, `team`) as registered.",
        "",
        *metric_table(gpu_rows, notes=True),
        "",
        "## Controller (`gpufed serve`, `/metrics`)",
        "",
        *metric_table(registry_rows(controller_metrics())),
        "",
        "## DingTalk relay (`gpufed-dingtalk`, `/metrics`)",
        "",
        *metric_table(registry_rows(relay_metrics())),
        "",
        "## Recording rules (master)",
        "",
        "| record | file | group | expression |",
        "|---|---|---|---|",
    ]
    for file, group in rule_groups():
        for rule in group.get("rules", []):
            if "record" in rule:
                record, expr = rule["record"], cell(rule["expr"])
                lines.append(f"| `{record}` | `{file}` | {cell(group['name'])} | `{expr}` |")
    return "\n".join(lines) + "\n"


def alerts_page() -> str:
    lines = [
        "# Alerts reference",
        "",
        "Generated by `python scripts/reference_docs.py` from the rule pack (`federation/rules/`),",
        "as the master loads it; `tests/test_docs.py` fails when this page and the files disagree.",
        "Each alert has promtool unit tests under `federation/rules/tests/`.",
    ]
    current = ""
    for file, group in rule_groups():
        alerts = [r for r in group.get("rules", []) if "alert" in r]
        if not alerts:
            continue
        if file != current:
            lines += ["", f"## `{file}`"]
            current = file
        lines += ["", f"### {cell(group['name'])}", "",
                  "| alert | severity | for | summary | expression |", "|---|---|---|---|---|"]
        for rule in alerts:
            annotations = rule.get("annotations", {})
            summary = annotations.get("summary") or annotations.get("description", "")
            lines.append(
                f"| `{rule['alert']}` | {cell(str(rule.get('labels', {}).get('severity', '')))} "
                f"| {cell(str(rule.get('for', '')))} | {cell(str(summary))} | `{cell(rule['expr'])}` |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed page is stale")
    args = parser.parse_args(argv)
    pages = {OUT / "metrics.md": metrics_page(), OUT / "alerts.md": alerts_page()}
    stale = [p for p, text in pages.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run python scripts/reference_docs.py", file=sys.stderr)
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for path, text in pages.items():
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
