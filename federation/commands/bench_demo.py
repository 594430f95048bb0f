"""``gpufed bench gap`` and ``gpufed bench first-sample``: benchmarks over a live demo stack.

Thin commands over ``federation.testing.benches.demo``. Each starts the whole demo (real children,
master, Alertmanagers) in a fresh data directory, measures, stops everything and prints
one JSON object (``--json``) or a short summary. Progress goes to stderr.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from federation.demo.plan import NODES_PER_CHILD, Layout
from federation.demo.stack import ComponentFailed, DemoError
from federation.testing.benches.demo import run_first_sample_bench, run_gap_bench

AsJson = Annotated[bool, typer.Option("--json", help="print one JSON object")]
DataDir = Annotated[
    Path | None, typer.Option("--data-dir", help="where the demo writes (default: a temporary directory)")
]


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(data_dir: Path | None, bench: Callable[[Path], dict[str, Any]], as_json: bool) -> None:
    scratch = data_dir is None
    where = Path(tempfile.mkdtemp(prefix="gpufed-bench-")) if data_dir is None else data_dir
    try:
        result = bench(where / "demo" if scratch else where)
    except (DemoError, ComponentFailed, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    finally:
        if scratch:
            shutil.rmtree(where, ignore_errors=True)
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
    else:
        for key in sorted(k for k, v in result.items() if not isinstance(v, dict)):
            typer.echo(f"{key:32} {result[key]}")
    if result.get("leftover_processes"):
        raise typer.Exit(1)


def _layout(**kwargs: int) -> Layout:
    try:
        return Layout(**kwargs)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def gap(
    nodes: Annotated[int, typer.Option(min=2, max=100_000, help="simulated GPU nodes")] = 60,
    regions: Annotated[int, typer.Option(min=1, max=50)] = 3,
    replication_factor: Annotated[int, typer.Option(min=1, max=3, help="children per shard")] = 1,
    nodes_per_child: Annotated[int, typer.Option(min=1)] = NODES_PER_CHILD,
    data_dir: DataDir = None,
    as_json: AsJson = False,
) -> None:
    """Largest gap per moved target at the master: make-before-break vs --no-handover, one run."""
    layout = _layout(nodes=nodes, regions=regions, replication_factor=replication_factor,
                     nodes_per_child=nodes_per_child)
    _run(data_dir, lambda where: run_gap_bench(layout=layout, data_dir=where, say=_say), as_json)


def first_sample(
    nodes: Annotated[int, typer.Option(min=1, max=100_000, help="simulated GPU nodes running already")] = 30,
    late: Annotated[int, typer.Option(min=1, max=500, help="nodes registered while it runs")] = 8,
    spacing: Annotated[float, typer.Option(min=0.1, help="seconds between two registrations")] = 1.7,
    data_dir: DataDir = None,
    as_json: AsJson = False,
) -> None:
    """Time from a node's registration (PUT to the registry) to its first sample at the master."""
    layout = _layout(nodes=nodes)
    _run(data_dir, lambda where: run_first_sample_bench(layout=layout, late=late, spacing_s=spacing,
                                                       data_dir=where, say=_say), as_json)


def register(app: typer.Typer) -> None:
    app.command("gap")(gap)
    app.command("first-sample")(first_sample)
