"""``gpufed bench sd`` and ``gpufed bench rebalance``: thin commands over the controller benches
(``federation.testing.benches.controller``)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from federation.testing.benches.abuse import run_abuse_bench
from federation.testing.benches.controller import MAX_TARGETS, run_rebalance_bench, run_sd_bench


def sd(
    targets: Annotated[
        int, typer.Option(min=1, max=MAX_TARGETS, help="targets the controller serves")
    ] = 10_000,
    shards: Annotated[int, typer.Option(min=1, max=2000, help="shards (one child each)")] = 100,
    pollers: Annotated[int, typer.Option(min=0, max=2000, help="children polling once a second")] = 100,
    clients: Annotated[int, typer.Option(min=0, max=2000, help="clients asking back to back")] = 200,
    duration: Annotated[float, typer.Option(min=1, max=600, help="seconds of load per server")] = 10.0,
    abuse: Annotated[
        int,
        typer.Option(
            min=0,
            max=200,
            help="N clients without a token loop on list reads, then on /readyz (the floor); "
            "prints SD p99 under each (0: the plain SD bench)",
        ),
    ] = 0,
    read_rate: Annotated[
        float | None,
        typer.Option(min=0, help="with --abuse: the controller's --read-rate (0: no read budget)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """HTTP SD latency under load, against uvicorn serving constant bytes (the floor)."""
    if abuse:
        result = run_abuse_bench(
            targets=targets,
            shards=shards,
            abusers=abuse,
            pollers=pollers,
            clients=clients,
            duration_s=duration,
            read_rate=read_rate,
        )
    else:
        result = run_sd_bench(
            targets=targets, shards=shards, pollers=pollers, clients=clients, duration_s=duration
        )
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
    else:
        Console().print(result)


def rebalance(
    targets: Annotated[int, typer.Option(min=1, max=MAX_TARGETS, help="targets in the region")] = 10_000,
    shards: Annotated[int, typer.Option(min=1, max=2000, help="shards before one is added")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Plan + apply one added shard; time to first serve the new lists."""
    result = run_rebalance_bench(targets=targets, shards=shards)
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
    else:
        Console().print(result)


def register(app: typer.Typer) -> None:
    app.command("sd")(sd)
    app.command("rebalance")(rebalance)
