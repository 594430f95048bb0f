"""``gpufed demo``: the whole federation live on one machine, until Ctrl-C or ``--duration``.

A thin command over ``federation.demo.stack.DemoStack``. Progress, URLs and the DingTalk
messages go to stdout, or to stderr with ``--json``, which prints one JSON object on
stdout once everything has stopped (also after a failure, with ``error`` set; exit 1).
Ctrl-C (SIGINT), SIGTERM and SIGHUP all stop the demo the same way, however it was
started: every process it started is stopped (SIGTERM, then SIGKILL) before it exits. A
shell starts a background job (``gpufed demo &`` in a script) with SIGINT ignored, and
Python then installs no handler of its own; the demo installs its handler for all three.
"""

from __future__ import annotations

import atexit
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from federation.demo.plan import NODES_PER_CHILD, Layout
from federation.demo.stack import ComponentFailed, DemoError, DemoOptions, DemoStack, dump_summary


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def demo_command(
    nodes: Annotated[int, typer.Option(min=1, max=100_000, help="simulated GPU nodes")] = 200,
    gpus: Annotated[int, typer.Option(min=0, max=64, help="GPUs per node")] = 8,
    regions: Annotated[int, typer.Option(min=1, max=50, help="regions the nodes are spread over")] = 3,
    duration: Annotated[
        float | None, typer.Option(min=1, help="seconds to run once ready, then stop (default: until Ctrl-C)")
    ] = None,
    replication_factor: Annotated[
        int, typer.Option(min=1, max=3, help="children per shard (2: HA pairs)")
    ] = 1,
    nodes_per_child: Annotated[
        int, typer.Option(min=1, help="nodes per child Prometheus (sets the shard count per region)")
    ] = NODES_PER_CHILD,
    as_json: Annotated[
        bool, typer.Option("--json", help="print one JSON summary on stdout after stopping")
    ] = False,
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="everything the demo writes; emptied at start")
    ] = Path(".gpufed-demo"),
    keep: Annotated[
        bool, typer.Option("--keep", help="reuse --data-dir's state (controller, TSDBs), do not empty it")
    ] = False,
    consul: Annotated[
        str | None,
        typer.Option("--consul", help="a real Consul agent (host:port): the fleet and the controller use it"),
    ] = None,
    restart: Annotated[
        bool, typer.Option("--restart", help="start a component that exits again (counted in the JSON)")
    ] = False,
    prometheus: Annotated[
        str | None,
        typer.Option("--prometheus", help="the Prometheus binary (default: prometheus on PATH); promtool is"
                     " taken from beside it, and its release is the spec's prometheus.version"),
    ] = None,
    alertmanager: Annotated[
        str | None,
        typer.Option("--alertmanager", help="the Alertmanager binary (default: prometheus-alertmanager on"
                     " PATH); amtool is taken from beside it"),
    ] = None,
    tls: Annotated[
        bool, typer.Option("--tls", help="TLS on every hop: a private CA and certificates in --data-dir "
                           "(gpufed certs), the spec's tls section, client certificates required")
    ] = False,
) -> None:
    """Run the federation on this machine: simulated fleet, controller, child Prometheus
    servers, master with the rule pack, Alertmanager HA pair and DingTalk relay."""
    try:
        layout = Layout(nodes=nodes, gpus=gpus, regions=regions, replication_factor=replication_factor,
                        nodes_per_child=nodes_per_child)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    out = sys.stderr if as_json else sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    stack = DemoStack(
        DemoOptions(layout=layout, data_dir=data_dir, keep=keep, consul=consul, restart=restart,
                    prometheus=prometheus, alertmanager=alertmanager, tls=tls),
        say=say,
    )
    atexit.register(stack.stop)
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    error = ""
    try:
        stack.start()
        if duration is None:
            say("running; Ctrl-C stops everything")
        stack.run(duration)
    except KeyboardInterrupt:
        say("stopping")
    except (DemoError, ComponentFailed) as exc:
        error = str(exc)
        say(f"error: {error}")
    finally:
        # A second Ctrl-C must not cut the shutdown short: stopping is bounded (SIGKILL
        # after a timeout per process), so signals wait until it is done.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        summary = stack.finish(duration=duration, error=error)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if as_json:
        print(dump_summary(summary), flush=True)
    else:
        say(
            f"stopped: {summary['targets_up_at_master']}/{summary['targets_expected']} targets were up at"
            f" the master, {summary['series_at_master']:,} series, {summary['alerts_delivered']} DingTalk"
            f" messages; stopped in {summary['shutdown_s']} s,"
            f" {summary['leftover_processes']} processes left behind"
        )
    if error or summary["leftover_processes"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_command)
