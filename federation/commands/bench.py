"""``gpufed bench sharding``, ``render``, ``inventory`` and ``thanos``: thin commands over the benches."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from federation.testing.benches.inventory import MAX_NODES, run_inventory_bench
from federation.testing.benches.render import run_render_bench
from federation.testing.benches.sharding import MAX_TARGETS, run_sharding_bench
from federation.testing.benches.thanos import MAX_SERIES, run_thanos_bench
from sharder.assign import ALGORITHM, STRATEGIES


def sharding(
    targets: Annotated[int, typer.Option(min=1, max=MAX_TARGETS, help="synthetic targets")] = 100_000,
    shards: Annotated[int, typer.Option(min=1, help="shards in the one bench region")] = 100,
    seed: Annotated[int, typer.Option(help="seed for addresses and the 4/8 GPU mix")] = 0,
    trials: Annotated[int, typer.Option(min=1, help="shard-name sets to average movement over")] = 20,
    algorithm: Annotated[str, typer.Option(help=f"one of {', '.join(STRATEGIES)}")] = ALGORITHM,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Time assignment and measure balance and movement on add/remove of one shard."""
    if algorithm not in STRATEGIES:
        raise typer.BadParameter(f"unknown algorithm {algorithm!r} (known: {', '.join(STRATEGIES)})")
    result = run_sharding_bench(targets=targets, shards=shards, seed=seed, trials=trials, algorithm=algorithm)
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
        return
    Console().print(
        _table(result, title=f"sharding: {result['targets']} targets on {result['shards']} shards")
    )


def render(
    children: Annotated[int, typer.Option(min=1, max=2000, help="child configs to render")] = 100,
    workers: Annotated[int, typer.Option(min=1, max=64, help="concurrent promtool checks")] = 8,
    no_check: Annotated[bool, typer.Option("--no-check", help="skip promtool")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Time assign, render, write and promtool-check of N child configs."""
    result = run_render_bench(children=children, workers=workers, check=not no_check)
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
        return
    Console().print(_table(result, title=f"render: {children} children"))


def thanos(
    series: Annotated[int, typer.Option(min=1, max=MAX_SERIES, help="synthetic GPU series")] = 1_000_000,
    ingestors: Annotated[int, typer.Option(min=1, max=1000, help="ingestors before one joins")] = 6,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Series moved when one Receive ingestor joins: ketama vs hashmod vs the optimum 1/(K+1)."""
    result = run_thanos_bench(series=series, ingestors=ingestors)
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
        return
    Console().print(
        _table(result, title=f"thanos: {series} series, {ingestors} -> {ingestors + 1} ingestors")
    )


def inventory(
    nodes: Annotated[int, typer.Option(min=1, max=MAX_NODES, help="GPU nodes (2 targets each)")] = 400_000,
    nodes_per_shard: Annotated[int, typer.Option(min=1, help="sharding.targets_per_shard")] = 100,
    seed: Annotated[int, typer.Option(help="seed for teams and the 4/8 GPU mix")] = 0,
    anchor_nodes: Annotated[int, typer.Option(min=1, help="nodes the old-loader anchor reads")] = 20_000,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Time loading, assigning and planning a large static inventory; peak RSS."""
    result = run_inventory_bench(
        nodes=nodes, nodes_per_shard=nodes_per_shard, seed=seed, anchor_nodes=anchor_nodes
    )
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
        return
    Console().print(_table(result, title=f"inventory: {nodes} nodes"))


def _table(result: dict[str, Any], *, title: str) -> Table:
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, "-" if value is None else str(value))
    return table


def register(bench_app: typer.Typer) -> None:
    bench_app.command("sharding")(sharding)
    bench_app.command("render")(render)
    bench_app.command("thanos")(thanos)
    bench_app.command("inventory")(inventory)
