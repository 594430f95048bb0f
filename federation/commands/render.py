"""``gpufed render`` and ``gpufed plan``: thin commands over ``federation.master.pipeline``.

Bad input (any ``SharderError``) prints one ``error: ...`` line on stderr and exits 2;
a config promtool rejects exits 1 with promtool's message. No tracebacks either way;
running out of memory (say under ``ulimit -v``) is one line and exit 2 as well, and
the output tree is left as it was. Repaired oddities in the previous state print
``warning: ...`` lines on stderr.
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

from alertmanager.amtool import Amtool
from alertmanager.errors import AmtoolError
from federation.master import pipeline
from federation.sizing.compose_resources import compose_resources
from federation.sizing.costs import load_costs
from federation.sizing.model import fleet_of, size
from sharder.engine.planning import Plan
from sharder.kernel.errors import ConfigCheckError, SharderError
from sharder.kernel.prometheus_versions import Release
from sharder.kernel.promtool import Promtool

SpecOpt = Annotated[Path, typer.Option("--spec", help="federation.yaml")]
InventoryOpt = Annotated[Path, typer.Option("--inventory", help="static inventory (YAML or JSON)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print a machine-readable summary")]
AllowAlgoOpt = Annotated[
    bool, typer.Option("--allow-algorithm-change", help="reassign everything if the algorithm changed")
]
AllowRemovalOpt = Annotated[
    bool,
    typer.Option(
        "--allow-mass-removal",
        help="allow removing more than sharding.max_removal_share (default 50%) of the targets at once",
    ),
]
LockTimeoutOpt = Annotated[
    float,
    typer.Option("--lock-timeout", min=0, help="seconds to wait for another run writing the same --out"),
]


def one_line(exc: Exception) -> str:
    """Parser messages (PyYAML's) span lines; a CLI error is one line."""
    return re.sub(r"\s*\n\s*", " ", str(exc).strip())


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except (ConfigCheckError, AmtoolError) as exc:
        typer.echo(f"error: {one_line(exc)}", err=True)
        raise typer.Exit(1) from exc
    except SharderError as exc:
        typer.echo(f"error: {one_line(exc)}", err=True)
        raise typer.Exit(2) from exc
    except MemoryError as exc:
        typer.echo("error: out of memory (the output directory was left as it was)", err=True)
        raise typer.Exit(2) from exc


def warn(message: str) -> None:
    typer.echo(f"warning: {one_line(Exception(message))}", err=True)


OptionalInventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        help="static inventory (YAML or JSON); not needed for --target compose, where nodes "
        "register themselves",
    ),
]


def render_command(
    spec: SpecOpt,
    out: Annotated[Path, typer.Option("--out", help="output directory, replaced as a whole")],
    inventory: OptionalInventoryOpt = None,
    no_check: Annotated[bool, typer.Option("--no-check", help="skip promtool/amtool checks")] = False,
    as_json: JsonOpt = False,
    allow_algorithm_change: AllowAlgoOpt = False,
    target: Annotated[
        str, typer.Option("--target", help="prometheus (configs) or compose (plus compose/monitoring.yml)")
    ] = "prometheus",
    allow_mass_removal: AllowRemovalOpt = False,
    lock_timeout: LockTimeoutOpt = 30.0,
    fleet_nodes: Annotated[int | None, typer.Option(
        "--fleet-nodes", min=1, max=1_000_000,
        help="--target compose: set each service's resources from `gpufed size` for this many nodes"
        " (default: the spec's fleet.nodes, else none are set)")] = None,
) -> None:
    """Assign targets to shards and write every child Prometheus config into OUT."""
    checker = None if no_check else Promtool.find()
    alert_checker = None if no_check else Amtool.find()
    if not no_check and (checker is None or alert_checker is None):
        typer.echo("warning: promtool or amtool not on PATH; configs are not all checked", err=True)
    with user_errors():
        if inventory is None and target != "compose":
            raise typer.BadParameter(
                f"--inventory is required with --target {target} (only compose nodes register themselves)",
                param_hint="--inventory",
            )
        if fleet_nodes is not None and target != "compose":
            raise typer.BadParameter(
                f"--fleet-nodes {fleet_nodes} sizes compose: needs --target compose; --target is {target}",
                param_hint="--fleet-nodes",
            )
        loaded_spec, targets = pipeline.load_inputs(spec, inventory)
        resources = None
        fleet = fleet_of(loaded_spec, nodes=fleet_nodes) if target == "compose" else None
        if fleet is not None:
            resources = compose_resources(size(loaded_spec, fleet, load_costs()))
        if checker is not None:
            _same_line(checker, loaded_spec.prometheus.release())
        result = pipeline.render(
            loaded_spec,
            targets,
            out=out,
            checker=checker,
            alert_checker=alert_checker,
            allow_algorithm_change=allow_algorithm_change,
            parts=pipeline.target_parts(target, out=out, resources=resources),
            allow_mass_removal=allow_mass_removal,
            lock_timeout=lock_timeout,
            warn=warn,
        )
    info = pipeline.summary(result)
    if as_json:
        typer.echo(json.dumps(info, sort_keys=True, indent=2))
    else:
        print_render_summary(info)


def promtool_line_error(checker: Promtool, wanted: Release, *, older_only: bool = False) -> str | None:
    """Why ``checker`` cannot check configs rendered for ``wanted``'s line, or None.

    A 2.x promtool refuses 3.x's fields; a 3.x one accepts a 2.53 config but cannot vouch
    for it (``older_only`` lets that pass, as the controller image does).
    """
    found = checker.release()
    if found is None or found.major == wanted.major or (older_only and found.major > wanted.major):
        return None
    return (
        f"promtool {checker.binary} is {found}, but the spec's prometheus.version renders for"
        f" {wanted.major}.x: put that line's promtool first on PATH (. scripts/stack_path.sh with"
        f" GPUFED_STACK={wanted.major}) or pass --no-check"
    )


def _same_line(checker: Promtool, wanted: Release) -> None:
    problem = promtool_line_error(checker, wanted)
    if problem is not None:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)


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
            loaded_spec,
            targets,
            previous_dir=previous,
            allow_algorithm_change=allow_algorithm_change,
            warn=warn,
        )
    if as_json:
        typer.echo(json.dumps(result.to_json_dict(), sort_keys=True, indent=2))
    else:
        print_plan(result)


def print_render_summary(info: dict[str, Any]) -> None:
    console = Console()
    table = Table(
        title=f"{info['children']} children rendered into {info['out']}",
        caption="load: weight units (a GPU exporter target counts its node's GPUs, other targets 1);"
        " max and mean: load per shard",
    )
    table.add_column("region", no_wrap=True)
    for column in ("shards", "children", "targets", "load", "max", "mean"):
        table.add_column(column, justify="right")
    for region, row in info["regions"].items():
        table.add_row(
            region,
            str(row["shards"]),
            str(row["children"]),
            str(row["targets"]),
            str(row["load"]),
            str(row["max_load"]),
            f"{row['mean_load']:.1f}",
        )
    console.print(table)
    checked = f"promtool checked {info['checked']} configs" if info["checked"] else "configs not checked"
    if info["alerting_checked"]:
        checked += ", amtool checked alertmanager.yml"
    if info.get("master_checked"):
        checked += ", promtool checked master/prometheus.yml"
    changes = f"{info['added']} added, {info['removed']} removed, {info['moved']} moved"
    console.print(f"{checked}; {changes}" + (" (first run)" if info["first_run"] else ""))


def shard_order(shard: str) -> tuple[str, int, str]:
    """``<region>-<index>`` by region then numeric index, so ``-10`` follows ``-9``."""
    region, _, index = shard.rpartition("-")
    return (region, int(index), "") if index.isdigit() else (shard, -1, shard)


def print_plan(plan: Plan, *, max_moves: int = 50) -> None:
    """Moves (the first ``max_moves``), then load per shard before/after."""
    console = Console()
    c = plan.counts
    console.print(
        f"{c.moved} moved, {c.added} added, {c.removed} removed, {c.unchanged} unchanged;"
        f" shards +{c.shards_added} -{c.shards_removed}"
        + ("; algorithm changed" if plan.algorithm_changed else "")
    )
    if plan.moves:
        moves = Table(title=f"moves ({c.moved_fraction:.1%} of kept targets)")
        for column in ("target", "from", "to"):
            moves.add_column(column)
        for move in plan.moves[:max_moves]:
            moves.add_row(move.identity, move.from_shard, move.to_shard)
        if len(plan.moves) > max_moves:
            moves.add_row(f"... {len(plan.moves) - max_moves} more (--json lists all)", "", "")
        console.print(moves)
    loads = Table(title="load per shard (weight units)")
    for column in ("shard", "before", "after", "change"):
        loads.add_column(column, justify="left" if column == "shard" else "right")
    for shard in sorted({*plan.load_before, *plan.load_after}, key=shard_order):
        before, after = plan.load_before.get(shard), plan.load_after.get(shard)
        change = (after or 0) - (before or 0)
        loads.add_row(
            shard,
            "-" if before is None else str(before),
            "-" if after is None else str(after),
            f"{change:+d}" if change else "",
        )
    console.print(loads)


def register(app: typer.Typer) -> None:
    app.command("render")(render_command)
    app.command("plan")(plan_command)
