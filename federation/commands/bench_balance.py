"""``gpufed bench balance``: samples/s max/mean across shards, GPU-count vs load-aware weights."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from federation.commands.bench import _table
from federation.testing.benches.balance import run_balance_bench


def balance(
    targets: Annotated[int, typer.Option(min=1, max=200_000, help="GPU-exporter targets")] = 1000,
    shards: Annotated[int, typer.Option(min=1, help="shards in the one bench region")] = 20,
    heavy_fraction: Annotated[
        float, typer.Option(min=0, max=1, help="share of targets with skewed series")
    ] = 0.1,
    heavy_factor: Annotated[
        float, typer.Option(min=1, max=1000, help="their series over what GPUs suggest")
    ] = 10.0,
    noise: Annotated[
        float, typer.Option(min=0, max=0.9, help="per-target spread of series per GPU, +-")
    ] = 0.1,
    jitter: Annotated[float, typer.Option(min=0, max=0.9, help="per-reading noise, +-")] = 0.05,
    readings: Annotated[int, typer.Option(min=1, max=1000, help="readings smoothed before planning")] = 5,
    seed: Annotated[int, typer.Option(help="seed for addresses, GPU mix and skew")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Compare shard balance by samples/s with GPU-count weights and with load-aware weights."""
    if shards > targets:
        raise typer.BadParameter(
            f"at most one shard per target ({targets}), got {shards}", param_hint="--shards"
        )
    result = run_balance_bench(
        targets=targets,
        shards=shards,
        heavy_fraction=heavy_fraction,
        heavy_factor=heavy_factor,
        noise=noise,
        jitter=jitter,
        readings=readings,
        seed=seed,
    )
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
        return
    Console().print(_table(result, title=f"balance: {targets} targets on {shards} shards"))


def register(bench_app: typer.Typer) -> None:
    bench_app.command("balance")(balance)
