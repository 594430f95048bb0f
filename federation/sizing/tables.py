"""The sizing tables the docs carry, rendered from the model so they cannot drift. Pure.

``scripts/sizing_tables.py --write`` puts them between ``<!-- sizing-table:NAME -->`` and
``<!-- /sizing-table:NAME -->`` in ``helm/gpufed/README.md`` (``chart``) and
``docs/sizing.md`` (``seed``); the tests render them again and compare the bytes.
"""

from __future__ import annotations

import re
from typing import Any

from federation.sizing.costs import LineCosts
from federation.sizing.model import Fleet, size
from federation.sizing.seed import SEED_002, compare
from federation.spec import GpufedSpec


def _millicores(cores: float) -> str:
    return f"{round(cores * 1000)}m"


def chart_table(
    spec: GpufedSpec, costs: dict[str, LineCosts], *, sizes: tuple[int, ...] = SEED_002.sizes
) -> str:
    """The chart README's rows: children and master per fleet size for the chart's spec."""
    lines = [
        "| nodes | children (`children.perRegion`) | each child: request, memory limit"
        " | each master: request, memory limit (ingest + rule pack) | of which rule pack CPU"
        " | master disk, retention | master series |",
        "|---|---|---|---|---|---|---|",
    ]
    for nodes in sizes:
        s = size(spec, Fleet(nodes=nodes), costs)
        child, master = s.components[0], s.components[1]
        cells = [
            f"{nodes:,}",
            str(child.count),
            f"{_millicores(child.cpu_request)}, {child.memory_request_mib}Mi / {child.memory_limit_mib}Mi",
            f"{_millicores(master.cpu_request)}, {master.memory_request_mib}Mi / {master.memory_limit_mib}Mi",
            _millicores(s.master_rule_cpu_cores),
            f"{master.disk_gib:g} Gi",
            f"{master.series:,}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def seed_table(spec: GpufedSpec, costs: dict[str, LineCosts]) -> str:
    """docs/sizing.md's comparison: ``gpufed size --compare --json``'s rows as a table."""
    rows: list[dict[str, Any]] = compare(spec, costs, template=Fleet(nodes=1))
    lines = [
        "| nodes | children, each request | seed: children | master request (each of N) | share of the"
        " seed's smallest master (16C32G) | master disk | seed: master | Grafana (model / seed) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            f"{r['nodes']:,}",
            f"{r['children']} x {r['child_cpu_request']:g}C {r['child_memory_request_mib']}Mi",
            r["seed_child"],
            f"{r['master_cpu_request']:g}C {r['master_memory_request_mib']}Mi (N={r['masters']})",
            f"{r['master_cpu_share_of_seed']:.1%} CPU, {r['master_memory_share_of_seed']:.1%} memory",
            f"{r['master_disk_gib']:g} GiB",
            r["seed_master"],
            f"{r['grafana']} / {r['seed_grafana']}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def marked(name: str) -> re.Pattern[str]:
    """The block a document keeps the table ``name`` in (markers included)."""
    return re.compile(rf"(<!-- sizing-table:{name} -->\n)(.*?)(<!-- /sizing-table:{name} -->)", re.S)


def replace_block(text: str, name: str, table: str) -> str:
    """``text`` with the block ``name`` holding ``table``; ValueError when it has no such block."""
    pattern = marked(name)
    if not pattern.search(text):
        raise ValueError(f"no <!-- sizing-table:{name} --> block to write into")
    return pattern.sub(lambda m: m.group(1) + table + m.group(3), text, count=1)


def block(text: str, name: str) -> str | None:
    found = marked(name).search(text)
    return found.group(2) if found else None
