"""``gpufed bench discovery``: registry change -> assignment latency through the Consul stand-in."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from federation.commands.bench import _table
from federation.testing.benches.discovery import run_discovery_bench


def discovery(
    targets: Annotated[int, typer.Option(min=1, max=200_000, help="exporter services registered")] = 10_000,
    changes: Annotated[int, typer.Option(min=1, help="registrations to time")] = 200,
    debounce: Annotated[float, typer.Option(min=0, help="reconcile debounce window, seconds")] = 1.0,
    interval: Annotated[float, typer.Option(min=0, help="mean seconds between changes")] = 0.25,
    churn: Annotated[float, typer.Option(min=0, max=1, help="fraction replaced per minute")] = 0.01,
    churn_minutes: Annotated[float, typer.Option(min=0, help="then follow churn this long (0: skip)")] = 0.0,
    seed: Annotated[int, typer.Option(help="seed for change order and gaps")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Time registry change -> new assignment over HTTP; CPU and RSS of following the fleet."""
    result = run_discovery_bench(
        targets=targets,
        changes=changes,
        debounce_s=debounce,
        interval_s=interval,
        churn=churn,
        churn_minutes=churn_minutes,
        seed=seed,
    )
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
        return
    Console().print(_table(result, title=f"discovery: {targets} targets, {changes} changes"))


def register(bench_app: typer.Typer) -> None:
    bench_app.command("discovery")(discovery)
