"""``gpufed render`` and ``gpufed plan``: thin commands over ``federation.pipeline``.

Bad input (any ``SharderError``) prints one ``error: ...`` line on stderr and exits 2;
a config promtool rejects exits 1 with promtool's message. No tracebacks either way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from federation import pipeline
from sharder.errors import ConfigCheckError, SharderError
from sharder.promtool import Promtool

SpecOpt = Annotated[Path, typer.Option("--spec", help="federation.yaml")]
InventoryOpt = Annotated[Path, typer.Option("--inventory", help="static inventory (YAML or JSON)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print a machine-readable summary")]
AllowAlgoOpt = Annotated[
    bool, typer.Option("--allow-algorithm-change", help="reassign everything if the algorithm changed")
]


def one_line(exc: Exception) -> str:
    """Parser messages (PyYAML's) span lines; a CLI error is one line."""
    return re.sub(r"\s*\n\s*", " ", str(exc).strip())


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except ConfigCheckError as exc:
        typer.echo(f"error: {one_line(exc)}", err=True)
        raise typer.Exit(1) from exc
    except SharderError as exc:
        typer.echo(f"error: {one_line(exc)}", err=True)
        raise typer.Exit(2) from exc


def render_command(
    spec: SpecOpt,
    inventory: InventoryOpt,
    out: Annotated[Path, typer.Option("--out", help="output directory, replaced as a whole")],
    no_check: Annotated[bool, typer.Option("--no-check", help="skip promtool check config")] = False,
    as_json: JsonOpt = False,
    allow_algorithm_change: AllowAlgoOpt = False,
) -> None:
    """Assign targets to shards and write every child Prometheus config into OUT."""
    checker = None if no_check else Promtool.find()
    if checker is None and not no_check:
        typer.echo("warning: promtool not on PATH; configs are not checked", err=True)
    with user_errors():
        loaded_spec, targets = pipeline.load_inputs(spec, inventory)
        result = pipeline.render(
            loaded_spec, targets, out=out, checker=checker, allow_algorithm_change=allow_algorithm_change
        )
    info = pipeline.summary(result)
    if as_json:
        typer.echo(json.dumps(info, sort_keys=True, indent=2))
    else:
        print_render_summary(info)


def plan_command(
    spec: SpecOpt,
    inventory: InventoryOpt,
    previous: Annotated[Path, typer.Option("--previous", help="an earlier render's output directory")],
    as_json: JsonOpt = False,
    allow_algorithm_change: AllowAlgoOpt = False,
) -> None:
    """Show which targets a render would move, and shard loads before/after; writes nothing."""
    with user_errors():
        loaded_spec, targets = pipeline.load_inputs(spec, inventory)
        result = pipeline.plan(
            loaded_spec, targets, previous_dir=previous, allow_algorithm_change=allow_algorithm_change
        )
    data = result.to_json_dict()
    if as_json:
        typer.echo(json.dumps(data, sort_keys=True, indent=2))
    else:
        print_plan(data)


def print_render_summary(info: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=f"{info['children']} children rendered into {info['out']}")
    for column in ("region", "shards", "targets", "load", "max load", "mean load"):
        table.add_column(column, justify="left" if column == "region" else "right")
    for region, row in info["regions"].items():
        table.add_row(
            region,
            str(row["shards"]),
            str(row["targets"]),
            str(row["load"]),
            str(row["max_load"]),
            f"{row['mean_load']:.1f}",
        )
    console.print(table)
    checked = f"promtool checked {info['checked']} configs" if info["checked"] else "configs not checked"
    moved = "first run" if info["first_run"] else f"{info['moved']} targets moved"
    console.print(f"{checked}; {moved}")


def print_plan(data: dict[str, Any]) -> None:
    raise NotImplementedError  # wired once sharder.plan lands


def register(app: typer.Typer) -> None:
    app.command("render")(render_command)
    app.command("plan")(plan_command)
