"""`gpufed-exporter`: `serve` (the default), `fleet` and `bench`; thin over app/fleet/bench.

Settings come from `GPUFED_EXPORTER_*` environment variables; flags given on the command
line override them. Both are merged into one `ExporterSettings` here, in `main()`.

Every start-up failure (bad flag or variable, address in use, unresolvable host) is one
`error: ...` line on stderr and exit status 2, in every command: `main` maps click's
usage errors, `settings_error` pydantic's, and the commands the exporter's own.
"""

from __future__ import annotations

import gc
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, NoReturn, Protocol

import typer
from pydantic import ValidationError
from typer.exceptions import TyperException

from exporter import logs
from exporter.errors import ExporterError
from exporter.settings import ExporterSettings

cli = typer.Typer(add_completion=False, help="GPU metrics exporter with DCGM-compatible names.",
                  pretty_exceptions_enable=False, rich_markup_mode=None)
bench_cli = typer.Typer(help="Measure scrape latency, CPU per scrape, RSS and fleet capacity.",
                        rich_markup_mode=None)
COMMANDS = ("serve", "fleet", "bench")
#: Settings fields whose flag is not simply `--<field-with-dashes>`.
FLAGS = {"families_include": "--families", "families_exclude": "--exclude"}

Backend = Annotated[str | None, typer.Option(help="nvml (default) or simulated")]
Gpus = Annotated[int | None, typer.Option(help="simulated GPUs per node")]
Listen = Annotated[str | None, typer.Option(help="host:port to serve on (default 0.0.0.0:9400)")]
Consul = Annotated[str | None, typer.Option(help="local Consul agent host:port; enables registration")]
Interval = Annotated[float | None, typer.Option(help="seconds between collections (default 5)")]
Families = Annotated[str | None, typer.Option(help="comma-separated families to add: pcie,gpm,process")]
Deny = Annotated[str | None, typer.Option(help="comma-separated families to drop")]
HostLabel = Annotated[str | None, typer.Option(
    help="Hostname or hostname (default: hostname with --dcgm-names 4)")]
Seed = Annotated[int | None, typer.Option(help="simulation seed")]
RegisterUrl = Annotated[str | None, typer.Option(
    help="gpufed controller base URL: register there (not with --consul)")]
RegisterToken = Annotated[str | None, typer.Option(
    help="controller bearer token (prefer GPUFED_EXPORTER_REGISTER_TOKEN or GPUFED_TOKEN)")]
RegisterJob = Annotated[str | None, typer.Option(help="job of the registered GPU target (default gpu)")]
RegisterHttpConfig = Annotated[Path | None, typer.Option(
    help="Prometheus http_config file (tls_config: ca_file, cert_file, key_file, server_name) for the "
    "registry calls to an https controller; env GPUFED_EXPORTER_REGISTER_HTTP_CONFIG_FILE")]
WebConfig = Annotated[Path | None, typer.Option(
    "--web.config.file", help="exporter-toolkit web config (TLS, basic auth, headers); "
    "env GPUFED_EXPORTER_WEB_CONFIG_FILE")]
Advertise = Annotated[str | None, typer.Option(help="address registries hand to Prometheus "
                                                    "(default: listen host, else this host's IP)")]


class Runnable(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


def build_settings(**flags: Any) -> ExporterSettings:
    """Environment first, then every flag that was actually given."""
    given = {key: value for key, value in flags.items() if value is not None}
    for key in ("families_include", "families_exclude"):
        if isinstance(given.get(key), str):
            given[key] = [part.strip() for part in given[key].split(",") if part.strip()]
    try:
        return ExporterSettings(**given)
    except ValidationError as exc:
        fail(settings_error(exc, given=set(given)))


def settings_error(exc: ValidationError, *, given: set[str]) -> str:
    """One line naming each bad setting as the user spelled it: the flag, or the variable."""
    problems = []
    for error in exc.errors(include_url=False):
        if not error["loc"]:  # a rule across settings (one registry): its message names them
            problems.append(str(error["msg"]).removeprefix("Value error, "))
            continue
        field = str(error["loc"][0])
        where = FLAGS.get(field, "--" + field.replace("_", "-")) if field in given \
            else f"GPUFED_EXPORTER_{field.upper()}"
        message = str(error["msg"]).removeprefix("Value error, ")
        value = error.get("input")
        secret = field.endswith("_token")
        shown = "" if isinstance(value, dict) or secret else f" (got {str(value)[:80]!r})"
        problems.append(f"{where}: {message}{shown}")
    return "invalid settings: " + "; ".join(problems)


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def run_until_signal(app: Runnable) -> None:
    """Start, wait for SIGTERM/SIGINT, stop (which deregisters from the registry first)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        app.start()
        # Everything built so far lives as long as the process. Freezing it keeps the
        # cyclic GC from re-scanning it: a full collection over a 2,000-node fleet took
        # 0.1-0.4 s, a stall of every scrape in flight (the fleet benchmark's tail).
        gc.collect()
        gc.freeze()
        while not stop.wait(1.0):
            pass
    finally:
        app.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@cli.command()
def serve(
    backend: Backend = None, gpus: Gpus = None, listen: Listen = None, consul: Consul = None,
    collect_interval: Interval = None, families: Families = None, exclude: Deny = None,
    hostname_label: HostLabel = None, seed: Seed = None,
    dcgm_names: Annotated[str | None, typer.Option(
        help="DCGM names: 3 (default), 4 (DCGM 4.6.0), both (migration) or 4-draft "
        "(4 plus unproven names)")] = None,
    nvlink_series: Annotated[str | None, typer.Option(
        help="per-link series of --families nvlink: gpufed (default) or dcgm (DCGM per-link fields, "
        "dcgm-exporter's link labels)")] = None,
    pod_attribution: Annotated[str | None, typer.Option(
        help="none (default) or kubelet: pod labels from kubelet's pod-resources API")] = None,
    pod_resources_socket: Annotated[str | None, typer.Option(help="kubelet pod-resources socket")] = None,
    pod_resources_interval: Annotated[float | None, typer.Option(
        help="seconds between kubelet List calls (default 10)")] = None,
    pod_resources_timeout: Annotated[float | None, typer.Option(
        help="seconds one kubelet call may take (default 10)")] = None,
    pod_resources_max_age: Annotated[float | None, typer.Option(
        help="drop pod labels when kubelet's last answer is older (seconds, default 60)")] = None,
    dra_resource_slices: Annotated[bool | None, typer.Option(
        help="resolve DRA devices through the node's ResourceSlices (list/watch resourceslices)")] = None,
    node_name: Annotated[str | None, typer.Option(help="node name (default $NODE_NAME or host)")] = None,
    region: Annotated[str | None, typer.Option()] = None,
    rack: Annotated[str | None, typer.Option()] = None,
    team: Annotated[str | None, typer.Option()] = None,
    cluster: Annotated[str | None, typer.Option()] = None,
    kubernetes: Annotated[bool | None, typer.Option(help="DaemonSet mode: never register")] = None,
    register_url: RegisterUrl = None, register_token: RegisterToken = None, register_job: RegisterJob = None,
    node_exporter_port: Annotated[int | None, typer.Option(
        help="also register this node's node-exporter (job node) with the controller")] = None,
    advertise_address: Advertise = None, web_config_file: WebConfig = None,
    register_http_config_file: RegisterHttpConfig = None,
) -> None:
    """Serve one node's GPUs on /metrics (default command)."""
    settings = build_settings(
        backend=backend, gpus=gpus, listen=listen, consul=consul, collect_interval=collect_interval,
        families_include=families, families_exclude=exclude, hostname_label=hostname_label, seed=seed,
        dcgm_names=dcgm_names, nvlink_series=nvlink_series, pod_attribution=pod_attribution,
        pod_resources_socket=pod_resources_socket,
        pod_resources_interval=pod_resources_interval, pod_resources_timeout=pod_resources_timeout,
        pod_resources_max_age=pod_resources_max_age, dra_resource_slices=dra_resource_slices,
        node_name=node_name, region=region, rack=rack, team=team, cluster=cluster, kubernetes=kubernetes,
        register_url=register_url, register_token=register_token, register_job=register_job,
        node_exporter_port=node_exporter_port, advertise_address=advertise_address,
        web_config_file=web_config_file, register_http_config_file=register_http_config_file,
    )
    logs.configure(level=settings.log_level, fmt=settings.log_format)
    from exporter.app import ExporterApp

    try:
        run_until_signal(ExporterApp(settings))
    except ExporterError as exc:
        fail(str(exc))


@cli.command()
def fleet(
    nodes: Annotated[int, typer.Option(help="simulated nodes", min=1)] = 100,
    regions: Annotated[int, typer.Option(help="regions to spread nodes over", min=1)] = 3,
    gpus: Gpus = None, listen: Listen = None, consul: Consul = None, collect_interval: Interval = None,
    families: Families = None, exclude: Deny = None, seed: Seed = None,
    register_url: RegisterUrl = None, register_token: RegisterToken = None, register_job: RegisterJob = None,
    advertise_address: Advertise = None, web_config_file: WebConfig = None,
    register_http_config_file: RegisterHttpConfig = None,
) -> None:
    """Serve many simulated nodes on one port at /nodes/<node>/metrics."""
    settings = build_settings(
        backend="simulated", gpus=gpus, listen=listen, consul=consul, collect_interval=collect_interval,
        families_include=families, families_exclude=exclude, seed=seed, register_url=register_url,
        register_token=register_token, register_job=register_job, advertise_address=advertise_address,
        web_config_file=web_config_file, register_http_config_file=register_http_config_file,
    )
    logs.configure(level=settings.log_level, fmt=settings.log_format)
    from exporter.app import consul_registry
    from exporter.fleet import FleetApp, fleet_nodes

    try:
        registry = consul_registry(settings) if settings.consul else None
        run_until_signal(FleetApp(settings, fleet_nodes(nodes, regions=regions), registry=registry))
    except ExporterError as exc:
        fail(str(exc))


@bench_cli.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    gpus: Annotated[int, typer.Option(min=0, max=64)] = 8,
    scrapes: Annotated[int, typer.Option(min=1)] = 2000,
    fleet_nodes: Annotated[int, typer.Option(help="nodes for the fleet run; 0 skips it", min=0)] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    backend: Annotated[str, typer.Option(help="serve run's backend: simulated or nvml (real GPUs)")]
    = "simulated",
    families: Families = None,
    collect_rounds: Annotated[int, typer.Option(help="collections timed for wall p50/p99")] = 20,
    dcgm_names: Annotated[str | None, typer.Option(
        help="serve run's DCGM names: 3, 4, both or 4-draft")] = None,
) -> None:
    """Single-process figures (no sub-command); `bench fleet` loads a fleet like Prometheus does."""
    if ctx.invoked_subcommand is not None:
        return
    from exporter.testing.bench import bench_fleet, bench_serve

    # validates the flags
    settings = build_settings(backend=backend, families_include=families, dcgm_names=dcgm_names)
    try:
        serve_run = bench_serve(gpus=gpus, scrapes=scrapes, backend=settings.backend,
                                families=tuple(settings.families_include), collect_rounds=collect_rounds,
                                dcgm_names=settings.dcgm_names)
    except ExporterError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    result: dict[str, Any] = {"serve": serve_run}
    if fleet_nodes:
        result["fleet"] = bench_fleet(nodes=fleet_nodes, gpus=gpus, scrapes=scrapes)
    _print(result, as_json=as_json)


@bench_cli.command("fleet")
def bench_fleet_load(
    nodes: Annotated[int, typer.Option(help="simulated nodes", min=1)] = 2000,
    concurrency: Annotated[int, typer.Option(help="scrapers, each one keep-alive connection", min=1,
                                             max=1024)] = 64,
    scrapes: Annotated[int, typer.Option(help="measured scrapes in total", min=1)] = 20000,
    gpus: Annotated[int, typer.Option(min=0, max=64)] = 8,
    gzip: Annotated[bool, typer.Option(help="send Accept-Encoding: gzip, as Prometheus does")] = True,
    cache: Annotated[bool, typer.Option(help="server reuses a render within a collection (default)")] = True,
    keep_alive: Annotated[bool, typer.Option(help="reuse connections, as Prometheus does")] = True,
    rate: Annotated[float | None, typer.Option(help="scrapes per second in all (open loop); default: "
                                               "each scraper back to back", min=1)] = None,
    target: Annotated[str | None, typer.Option(help="HOST:PORT of a running fleet to load instead")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """`gpufed-exporter fleet` in its own process under N concurrent scrapers (loopback)."""
    from exporter.testing.loadgen import run_fleet_load

    try:
        result = run_fleet_load(nodes=nodes, concurrency=concurrency, scrapes=scrapes, gpus=gpus, gzip=gzip,
                                cache=cache, keep_alive=keep_alive, target=target, rate=rate)
    except ExporterError as exc:
        fail(str(exc))
    _print({"fleet_load": result}, as_json=as_json)


@bench_cli.command("attribution")
def bench_attribution_cmd(
    containers: Annotated[int, typer.Option(help="containers in kubelet's answer", min=1)] = 10_000,
    gpus: Annotated[int, typer.Option(min=1, max=64)] = 8,
    shared: Annotated[int, typer.Option(help="pods holding each GPU (time-slicing, DRA)", min=1)] = 4,
    rounds: Annotated[int, typer.Option(help="refreshes timed", min=1)] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Kubelet pod attribution: refresh cost off the scrape path, series per shared GPU."""
    try:
        from exporter.testing.attribution_bench import bench_attribution
    except ImportError as exc:  # grpc and protobuf: the `podresources` extra
        fail(f"bench attribution needs the podresources extra; missing: {exc.name}")
    _print({"attribution": bench_attribution(containers=containers, gpus=gpus, shared=shared, rounds=rounds)},
           as_json=as_json)


@bench_cli.command("tls")
def bench_tls_cmd(
    gpus: Annotated[int, typer.Option(min=0, max=64)] = 8,
    scrapes: Annotated[int, typer.Option(help="keep-alive scrapes per server", min=4)] = 2000,
    reconnect_scrapes: Annotated[int, typer.Option(
        help="scrapes per server on a new connection each (a handshake each)", min=4)] = 400,
    rounds: Annotated[int, typer.Option(help="turns each server takes", min=1, max=100)] = 4,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Plain vs TLS with client certificates required: scrape p99 and server CPU per scrape."""
    from exporter.testing.tls_bench import bench_tls

    try:
        result = bench_tls(gpus=gpus, scrapes=scrapes, reconnect_scrapes=reconnect_scrapes, rounds=rounds)
    except ExporterError as exc:
        fail(str(exc))
    _print({"tls": result}, as_json=as_json)
    if not result["ok"]:
        raise typer.Exit(1)


cli.add_typer(bench_cli, name="bench")


def _print(result: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    for section, values in result.items():
        typer.echo(f"[{section}]")
        for key, value in sorted(values.items()):
            typer.echo(f"  {key}: {value}")


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("gpufed")
    except metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    """Console script entry: a bare flag list means `serve`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        typer.echo(f"gpufed-exporter {_version()}")
        return
    if not args or args[0] not in (*COMMANDS, "--help", "-h"):
        args = ["serve", *args]
    try:
        code = cli(args=args, prog_name="gpufed-exporter", standalone_mode=False)
    except TyperException as exc:
        # Usage errors: one line, not the boxed usage screen; the message names the flag and value.
        typer.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    if isinstance(code, int) and code:
        sys.exit(code)
