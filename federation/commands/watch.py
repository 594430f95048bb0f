"""``gpufed watch``: follow Consul, Kubernetes and/or a file and show the shard map live.

A thin command over ``federation.watching``: ``--json`` prints one JSON line per new
assignment (for scripts); otherwise a rich live view. ``--duration`` stops after N
seconds (0: until Ctrl-C).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live

from federation.commands.render import SpecOpt, user_errors
from federation.spec import load_gpufed_spec
from federation.watching import Watcher, render_view
from sharder.engine.sizing import Hysteresis
from sharder.sources.build import WatchOptions
from sharder.sources.consul import ConsulConfig
from sharder.sources.kubernetes import KubernetesConfig


def watch_command(
    spec: SpecOpt,
    consul: Annotated[str | None, typer.Option("--consul", help="Consul address host:port or URL")] = None,
    service: Annotated[list[str] | None, typer.Option("--service", help="Consul service, repeatable")] = None,
    consul_token: Annotated[str | None, typer.Option(help="ACL token (default CONSUL_HTTP_TOKEN)")] = None,
    consul_dc: Annotated[list[str] | None, typer.Option(help="datacenter (repeatable)")] = None,
    consul_tag: Annotated[str | None, typer.Option(help="only services with this tag")] = None,
    consul_ca: Annotated[Path | None, typer.Option(help="CA bundle for HTTPS")] = None,
    consul_cert: Annotated[Path | None, typer.Option(help="client certificate")] = None,
    consul_key: Annotated[Path | None, typer.Option(help="client key")] = None,
    warning_is_up: Annotated[bool, typer.Option(help="count 'warning' checks as up")] = False,
    kubeconfig: Annotated[Path | None, typer.Option("--kubeconfig", help="kubeconfig file")] = None,
    in_cluster: Annotated[bool, typer.Option(help="use the pod's service account")] = False,
    namespace: Annotated[str, typer.Option(help="namespace of the exporters")] = "monitoring",
    k8s_service: Annotated[str, typer.Option(help="exporter Service (EndpointSlices)")] = "gpufed-exporter",
    file: Annotated[Path | None, typer.Option("--file", help="inventory file, followed")] = None,
    state: Annotated[Path | None, typer.Option(help="where the last known targets persist")] = None,
    debounce: Annotated[float, typer.Option(min=0, help="seconds a burst is collected")] = 1.0,
    grace: Annotated[float, typer.Option(min=0, help="seconds a vanished target is kept")] = 120.0,
    grow_margin: Annotated[float, typer.Option(min=0, help="add a shard past target x (1 + this)")] = 0.10,
    shrink_margin: Annotated[float, typer.Option(min=0, max=0.9, help="shrink only this far below")] = 0.25,
    shrink_after: Annotated[float, typer.Option(min=0, help="... for this many seconds")] = 600.0,
    duration: Annotated[float, typer.Option(min=0, help="stop after N seconds (0: never)")] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per new assignment")] = False,
) -> None:
    """Follow the registries and show regions -> shards -> load as it changes."""
    if not (consul or service or kubeconfig or in_cluster or file):
        raise typer.BadParameter("name at least one source: --consul/--service, --kubeconfig or --file")
    with user_errors():
        loaded = load_gpufed_spec(spec)
    consul_config = None
    if consul or service:
        consul_config = ConsulConfig(
            services=tuple(service or ["gpufed-exporter"]),
            address=consul,
            token=consul_token,
            datacenters=tuple(consul_dc or [None]),
            tag=consul_tag,
            allow_warning=warning_is_up,
            ca_file=str(consul_ca) if consul_ca else None,
            cert_file=str(consul_cert) if consul_cert else None,
            key_file=str(consul_key) if consul_key else None,
        )
    k8s_config = None
    if kubeconfig or in_cluster:
        k8s_config = KubernetesConfig(
            namespace=namespace, service=k8s_service, kubeconfig=str(kubeconfig) if kubeconfig else None
        )
    hysteresis = Hysteresis(grow_margin=grow_margin, shrink_margin=shrink_margin, shrink_after_s=shrink_after)
    options = WatchOptions(
        consul=consul_config,
        kubernetes=k8s_config,
        file=file,
        state=state,
        debounce_s=debounce,
        grace_s=grace,
        hysteresis=hysteresis,
    )

    def emit(record: dict[str, Any]) -> None:
        typer.echo(json.dumps(record, sort_keys=True))

    watcher = Watcher(spec=loaded, options=options, on_record=emit if as_json else None)
    watcher.start()
    end = time.monotonic() + duration if duration else float("inf")
    try:
        if as_json:
            _wait(watcher.stop, end)
        else:
            with Live(render_view(watcher), console=Console(), refresh_per_second=2) as live:
                while time.monotonic() < end and not watcher.stop.wait(0.5):
                    live.update(render_view(watcher))
    except KeyboardInterrupt:
        pass
    finally:
        watcher.close()


def _wait(stop: threading.Event, end: float) -> None:
    while not stop.is_set() and time.monotonic() < end:
        stop.wait(min(0.2, max(0.0, end - time.monotonic())))


def register(app: typer.Typer) -> None:
    app.command("watch")(watch_command)
