"""``gpufed bench failover``: a thin command over ``federation.testing.benches.failover``."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console


def failover(
    replicas: Annotated[int, typer.Option(min=2, max=9, help="gpufed serve processes")] = 3,
    nodes: Annotated[int, typer.Option(min=1, max=50_000, help="GPU nodes (two targets each)")] = 2000,
    ttl: Annotated[int, typer.Option(min=10, max=600, help="--lock-ttl of the replicas, seconds")] = 15,
    lock_delay: Annotated[int, typer.Option(min=0, max=60, help="--lock-delay of the replicas")] = 1,
    rounds: Annotated[int, typer.Option(min=1, max=20, help="leaders killed one after another")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Kill -9 the leader: take-over time, SD errors meanwhile, targets moved."""
    from federation.testing.benches.failover import run_failover_bench

    result = run_failover_bench(
        replicas=replicas, nodes=nodes, ttl_s=ttl, lock_delay_s=lock_delay, rounds=rounds
    )
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
    else:
        Console().print(result)


def register(app: typer.Typer) -> None:
    app.command("failover")(failover)
