"""``gpufed bench live``: a thin command over ``federation.testing.benches.live`` (the names of
its options and JSON keys are fixed: scripts read them)."""

from __future__ import annotations

import json
import signal
from typing import Annotated

import typer
from rich.console import Console

VIA = ("file", "registry")
FORMATS = ("yaml", "json")
STORES = ("sqlite", "consul", "kubernetes")
DISCOVERY = ("file_sd", "http_sd")


def live(
    targets: Annotated[int, typer.Option(min=2, max=1_000_000, help="targets the controller follows")]
    = 20_000,
    changes: Annotated[int, typer.Option(min=1, max=10_000, help="registrations timed")] = 30,
    rate: Annotated[float, typer.Option(min=0.01, max=1000, help="registrations per second")] = 1.0,
    via: Annotated[str, typer.Option(help="file (an inventory) or registry (pre-registered)")] = "file",
    debounce: Annotated[float, typer.Option(min=0, max=60, help="--debounce of gpufed serve")] = 1.0,
    batch: Annotated[int, typer.Option(min=0, max=62_500, help="entries in the timed batch POST; 0 skips")]
    = 20_000,
    change_timeout: Annotated[float, typer.Option(min=1, max=600, help="seconds a change may take")] = 60.0,
    inventory_format: Annotated[str, typer.Option(help="yaml or json: the inventory's format")]
    = "yaml",
    spec: Annotated[str | None, typer.Option(
        help="spec file (default examples/federation.yaml as shipped); builtin: the bench's own")] = None,
    store: Annotated[str, typer.Option(help="sqlite, consul or kubernetes (a stand-in in its own process)")]
    = "sqlite",
    discovery: Annotated[str | None, typer.Option(help="file_sd or http_sd (default: what the spec says)")]
    = None,
    targets_per_shard: Annotated[int | None, typer.Option(min=1, help="override the spec's sharding size")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """A real `gpufed serve`: registration -> its child's SD answer, CPU, RSS, ready, batch rate."""
    if via not in VIA:
        raise typer.BadParameter(f"expected one of {', '.join(VIA)}, got {via!r}", param_hint="--via")
    if inventory_format not in FORMATS:
        raise typer.BadParameter(
            f"expected one of {', '.join(FORMATS)}, got {inventory_format!r}", param_hint="--inventory-format"
        )
    if store not in STORES:
        raise typer.BadParameter(f"expected one of {', '.join(STORES)}, got {store!r}", param_hint="--store")
    if discovery is not None and discovery not in DISCOVERY:
        raise typer.BadParameter(
            f"expected one of {', '.join(DISCOVERY)}, got {discovery!r}", param_hint="--discovery"
        )
    from federation.testing.benches.live import LiveBenchError, run_live_bench

    # SIGTERM (a CI timeout) unwinds like Ctrl-C, so the serve process and the temp dir go too.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        result = run_live_bench(targets=targets, changes=changes, rate=rate, via=via, debounce_s=debounce,
                                batch=batch, change_timeout_s=change_timeout,
                                inventory_format=inventory_format, spec=spec, store=store,
                                discovery=discovery, targets_per_shard=targets_per_shard)  # fmt: skip
    except (LiveBenchError, TimeoutError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
    else:
        Console().print(result)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def register(app: typer.Typer) -> None:
    app.command("live")(live)
