"""``gpufed size``: what a spec and a fleet need, per component, from measured costs.

A thin edge over ``federation.sizing.model.size``: the spec (default the shipped example),
the fleet from flags, else the spec's ``fleet:``, else 500 nodes; a table for a person or one
JSON object (``--json``). ``--compare`` adds the fleet sizes of seed 002's sizing table next
to the model's figures (``federation.sizing.seed``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from federation.sizing import seed
from federation.sizing.costs import load_costs
from federation.sizing.helm_values import helm_values as chart_values
from federation.sizing.model import DEFAULT_NODES, Sizing, default_shard_cap, fleet_of, size
from federation.spec import load_gpufed_spec
from sharder.kernel.errors import SpecError
from sharder.kernel.output import dump_yaml

EXAMPLE_SPEC = Path("examples/federation.yaml")
#: Seed 002's sizing table in a line (the data: ``federation.sizing.seed.SEED_002``).
SEED_TABLE = "children 8C16G or 16C32G; master 16C32G to 64C128G; 2-4 Grafana replicas behind a load balancer"


def _table(sizing: Sizing) -> Table:
    f = sizing.fleet
    table = Table(
        title=f"gpufed size: {f.nodes} nodes x {f.gpus} GPUs, {f.pods_per_gpu} pods/GPU, "
        f"HAMi {'on' if f.hami else 'off'}; Prometheus {sizing.prometheus_line}; "
        f"{sizing.series_per_node} series per node"
    )
    for column in (
        "component",
        "count",
        "cpu req/lim",
        "memory req/lim MiB",
        "disk GiB",
        "series",
        "samples/s",
        "basis",
    ):
        table.add_column(column, justify="left" if column in ("component", "basis") else "right")
    for c in sizing.components:
        table.add_row(
            c.name,
            str(c.count),
            f"{c.cpu_request:g}/{c.cpu_limit:g}",
            f"{c.memory_request_mib}/{c.memory_limit_mib}",
            f"{c.disk_gib:g}",
            f"{c.series:,}" if c.series else "-",
            f"{c.samples_per_s:,.0f}" if c.samples_per_s else "-",
            c.basis,
        )
    return table


def _compare(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="gpufed's model next to seed 002's table (as issue #40 quotes it)")
    for column in (
        "nodes", "children", "child req", "seed child", "master req (each)", "of seed's smallest",
        "master disk GiB", "seed master", "Thanos receive", "Grafana", "seed Grafana",
    ):
        table.add_column(column, justify="left" if column.startswith("seed") else "right")
    for r in rows:
        table.add_row(
            f"{r['nodes']:,}",
            str(r["children"]),
            f"{r['child_cpu_request']:g}C {r['child_memory_request_mib']}Mi",
            r["seed_child"],
            f"{r['master_cpu_request']:g}C {r['master_memory_request_mib'] / 1024:.2f}Gi",
            f"{r['master_cpu_share_of_seed']:.1%} CPU, {r['master_memory_share_of_seed']:.1%} mem",
            f"{r['master_disk_gib']:g}",
            r["seed_master"],
            str(r["thanos_receive"] or "-"),
            str(r["grafana"] or "-"),
            r["seed_grafana"],
        )
    return table


def size_command(
    spec: Annotated[
        Path | None, typer.Option(help="spec file (default examples/federation.yaml)", dir_okay=False)
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            min=1, max=1_000_000, help=f"GPU nodes [default: the spec's fleet.nodes, else {DEFAULT_NODES}]"
        ),
    ] = None,
    gpus: Annotated[
        int | None, typer.Option(min=0, max=64, help="GPUs per node [default: fleet.gpus_per_node, else 8]")
    ] = None,
    pods_per_gpu: Annotated[
        int | None,
        typer.Option(
            min=0, max=64, help="pods sharing each GPU, 0: no pod labels [default: fleet.pods_per_gpu, or 0]"
        ),
    ] = None,
    hami: Annotated[
        bool | None,
        typer.Option("--hami/--no-hami", help="the exporter's HAMi families [default: fleet.hami, else on]"),
    ] = None,
    compare: Annotated[
        bool, typer.Option("--compare", help="also the seed's fleet sizes, side by side")
    ] = False,
    helm_values: Annotated[
        Path | None,
        typer.Option(
            "--helm-values", help="also write a values file for helm/gpufed (its value names)", dir_okay=False
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Per component: count, CPU and memory requests and limits, disk, series and samples/s."""
    path = spec or EXAMPLE_SPEC
    if not path.is_file():
        typer.echo(f"error: --spec: no spec file at {str(path)!r}", err=True)
        raise typer.Exit(2)
    try:
        loaded = load_gpufed_spec(path)
        fleet = fleet_of(loaded, nodes=nodes, gpus=gpus, pods_per_gpu=pods_per_gpu, hami=hami) or fleet_of(
            loaded, nodes=DEFAULT_NODES, gpus=gpus, pods_per_gpu=pods_per_gpu, hami=hami
        )
        assert fleet is not None
        sizing = size(loaded, fleet, load_costs())
        if helm_values is not None:
            helm_values.write_bytes(dump_yaml(chart_values(sizing)))
    except (SpecError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    rows = seed.compare(loaded, load_costs(), template=fleet) if compare else []
    if as_json:
        document = sizing.document()
        document["spec"] = str(path)
        document["seed_table"] = SEED_TABLE
        document["serve_default_max_shards_per_region"] = default_shard_cap(loaded, load_costs())
        if compare:
            document["compare"] = rows
        typer.echo(json.dumps(document, sort_keys=True))
        return
    console = Console()
    console.print(_table(sizing))
    console.print(
        f"single master holds at most {sizing.single_master_max_series:,} series"
        f" ({'exceeded: Thanos receive takes over' if sizing.thanos_receive_needed else 'not reached'});"
        f" --max-shards-per-region {sizing.max_shards_per_region} fits this fleet with headroom"
        f" (gpufed serve's default for this spec: {default_shard_cap(loaded, load_costs())})"
    )
    if sizing.not_modelled:
        console.print(f"not modelled (their series are not counted): jobs {', '.join(sizing.not_modelled)}")
    for warning in sizing.warnings:
        console.print(f"warning: {warning}")
    if compare:
        console.print(_compare(rows))


def register(app: typer.Typer) -> None:
    app.command("size")(size_command)
