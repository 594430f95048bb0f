"""``gpufed serve``: the controller as a service (HTTP SD, shard map, plans, rebalances).

A thin command over ``federation.controller.http.service``; uvicorn serves the app. Bad
settings (spec, tokens, flags) print one ``error:`` line and exit 2.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

import webconfig.client
import webconfig.model
import webconfig.serving
from federation.commands.render import SpecOpt, promtool_line_error, user_errors
from federation.controller.base.options import ControllerOptions
from federation.controller.http.auth import TokenError
from federation.controller.http.client_address import ProxyListError, parse_trusted
from federation.controller.http.service import ServeSettings, SettingsError, build_service
from federation.controller.load.tracking import LoadOptions
from federation.controller.stores.store import StoreError
from federation.sizing.costs import load_costs
from federation.sizing.model import default_shard_cap
from federation.spec import GpufedSpec, load_gpufed_spec
from sharder.engine.sizing import MAX_SHARDS_BOUND, Hysteresis
from sharder.kernel.promtool import Promtool
from sharder.model.addresses import normalise_host
from sharder.sources.consul import ConsulConfig
from sharder.sources.kubernetes import KubernetesConfig


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); port 0 asks the OS for a free one."""
    host, sep, port = listen.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT with a port from 0 to 65535, got {listen[:80]!r}")
    try:
        return normalise_host(host), int(port)  # the one host check targets get too
    except ValueError as exc:
        raise ValueError(f"host {host[:80]!r}: {exc}") from None


def bind_free_port(host: str, port: int = 0) -> socket.socket:
    """Bind ``--listen`` before anything else starts (a busy port exits before the state is
    opened or an election run); for port 0 the OS picks one, said on stderr in one line,
    ``gpufed serve: listening on http://HOST:PORT``, for whoever started this process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    # Accepted connections inherit it (Linux). asyncio sets TCP_NODELAY only on sockets made
    # with proto IPPROTO_TCP, and create_server's is proto 0: without it uvicorn's head and
    # body, two writes, meet Nagle and the client's delayed ACK, 40 ms on every keep-alive
    # answer (a poll of /v1/sd took 44 ms instead of 1 ms).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if port == 0:
        port = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        print(f"gpufed serve: listening on http://{shown}:{port}", file=sys.stderr, flush=True)
    return sock


#: JOB=[NAMESPACE/]SERVICE:PORT, or JOB=[NAMESPACE/]{LABEL-SELECTOR}:PORT for pods by label.
K8S_JOB = re.compile(
    r"^(?P<job>[a-z0-9][a-z0-9-]*)=(?:(?P<namespace>[a-z0-9][a-z0-9.-]*)/)?"
    r"(?:(?P<service>[a-z0-9][a-z0-9.-]*)|\{(?P<selector>[^{}\s]+)\}):(?P<port>[A-Za-z0-9-]+)\Z"
)


def _k8s_job(value: str, *, base: KubernetesConfig, jobs: GpufedSpec) -> KubernetesConfig:
    """``--k8s-job`` -> the watch settings of one more job: a Service's EndpointSlices or pods by label."""
    match = K8S_JOB.match(value)
    if match is None:
        raise typer.BadParameter(
            "expected JOB=[NAMESPACE/]SERVICE:PORT or JOB=[NAMESPACE/]{LABEL-SELECTOR}:PORT, e.g."
            f" node=gpufed-node-exporter:metrics, got {value!r}",
            param_hint="--k8s-job",
        )
    job, port = match["job"], match["port"]
    if job not in {j.name for j in jobs.jobs}:
        raise typer.BadParameter(
            f"job {job!r} is not in the spec's jobs ({', '.join(j.name for j in jobs.jobs)})",
            param_hint="--k8s-job",
        )
    return dataclasses.replace(
        base,
        job=job,
        service=match["service"],
        pod_selector=match["selector"] or base.pod_selector,
        namespace=match["namespace"] or base.namespace,
        port=int(port) if port.isdigit() else port,
    )


@dataclasses.dataclass(frozen=True)
class RegionFlags:
    """Region flags checked against the spec: a region the spec does not name would skip
    every target it reaches, so it is refused at start, naming the flag."""

    spec: GpufedSpec

    def known(self, region: str, *, flag: str) -> str:
        names = [r.name for r in self.spec.regions]
        if region not in names:
            raise typer.BadParameter(f"region {region!r} is not in the spec's regions ({', '.join(names)})",
                                     param_hint=flag)
        return region

    def mapping(self, values: list[str]) -> tuple[tuple[str, str], ...]:
        pairs: dict[str, str] = {}
        for value in values:
            label, sep, region = value.partition("=")
            if not sep or not label or not region:
                raise typer.BadParameter(f"expected VALUE=REGION, e.g. cn-hangzhou=hz, got {value!r}",
                                         param_hint="--k8s-region-map")
            pairs[label] = self.known(region, flag="--k8s-region-map")
        return tuple(sorted(pairs.items()))


def _child_urls(values: list[str]) -> dict[str, str]:
    urls = {}
    for value in values:
        child, sep, url = value.partition("=")
        if not sep or not child or not url.startswith(("http://", "https://")):
            raise typer.BadParameter(
                f"expected CHILD=http://host:port, got {value!r}", param_hint="--child-url"
            )
        urls[child] = url
    return urls


def _check_numbers(**flags: tuple[float | None, float]) -> None:
    """Refuse a non-finite (``inf``, ``nan``) or absurd number at start: ``--registry-ttl inf``
    once started and then answered every PUT with 500."""
    for name, (value, most) in flags.items():
        if value is not None and not (math.isfinite(value) and value <= most):
            raise typer.BadParameter(
                f"expected a finite number of at most {most:g}, got {value!r}",
                param_hint="--" + name.replace("_", "-"),
            )


def _bind(host: str, port: int) -> socket.socket:
    try:
        return bind_free_port(host, port)
    except OSError as exc:
        reason = exc.strerror or exc
        raise typer.BadParameter(f"cannot bind {host}:{port}: {reason}", param_hint="--listen") from None


def _check_rates(**rates: float) -> None:
    """A rate is 0 (off) or at least ``MIN_RATE``: ``1e-300`` would answer a 300-digit Retry-After."""
    from federation.controller.http.ratelimit import MIN_RATE

    for name, value in rates.items():
        if 0 < value < MIN_RATE:
            raise typer.BadParameter(
                f"expected 0 (off) or at least {MIN_RATE:g} per second, got {value!r}",
                param_hint="--" + name.replace("_", "-"),
            )


def serve_command(
    spec: SpecOpt,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="state (SQLite) and rendered configs")],
    listen: Annotated[str, typer.Option(
        "--listen", help="HOST:PORT to serve on (port 0: a free one, said on stderr)")] = "127.0.0.1:8080",
    inventory: Annotated[Path | None, typer.Option("--inventory", help="inventory file, followed")] = None,
    consul: Annotated[str | None, typer.Option("--consul", help="Consul address host:port or URL")] = None,
    service: Annotated[list[str] | None, typer.Option("--service", help="Consul service, repeatable")] = None,
    kubeconfig: Annotated[Path | None, typer.Option("--kubeconfig", help="kubeconfig file")] = None,
    in_cluster: Annotated[bool, typer.Option(help="use the pod's service account")] = False,
    namespace: Annotated[str, typer.Option(help="namespace of the exporters")] = "monitoring",
    k8s_service: Annotated[
        str,
        typer.Option(
            "--k8s-service",
            help="Service whose EndpointSlices are the exporters; empty: none (the gpu job then comes from"
            " a --k8s-job, e.g. gpu=gpu-operator/nvidia-dcgm-exporter:gpu-metrics)",
        ),
    ] = "gpufed-exporter",
    k8s_job: Annotated[
        list[str] | None,
        typer.Option(
            "--k8s-job",
            help="JOB=[NAMESPACE/]SERVICE:PORT: one more job from a Service's EndpointSlices, e.g."
            " node=gpufed-node-exporter:metrics, or JOB=[NAMESPACE/]{LABEL-SELECTOR}:PORT from pods"
            " by label (repeatable; PORT is the port's name or number)",
        ),
    ] = None,
    k8s_region_label: Annotated[
        str, typer.Option("--k8s-region-label", help="Node label whose value is a target's region")
    ] = "topology.kubernetes.io/region",
    k8s_default_region: Annotated[
        str | None,
        typer.Option(
            "--k8s-default-region", help="region of a node without --k8s-region-label (a spec region)"
        ),
    ] = None,
    k8s_region_map: Annotated[
        list[str] | None,
        typer.Option(
            "--k8s-region-map",
            help="VALUE=REGION: a --k8s-region-label value (e.g. cn-hangzhou, or a node pool's name with"
            " --k8s-region-label cloud.google.com/gke-nodepool) -> a spec region (repeatable)",
        ),
    ] = None,
    consul_default_region: Annotated[
        str | None,
        typer.Option("--consul-default-region", help="region of a Consul service without region metadata"),
    ] = None,
    tokens: Annotated[Path | None, typer.Option("--tokens", help="tokens file (name, token, scopes)")] = None,
    dev: Annotated[
        bool, typer.Option("--dev", help="allow running without a token (local trials only)")
    ] = False,
    no_check: Annotated[
        bool, typer.Option("--no-check", help="publish configs without promtool/amtool")
    ] = False,
    debounce: Annotated[float, typer.Option(min=0, help="seconds a burst of changes is collected")] = 1.0,
    grace: Annotated[float, typer.Option(min=0, help="seconds a vanished target is kept")] = 120.0,
    handover_window: Annotated[
        float | None,
        typer.Option(
            min=0, help="max seconds both children scrape a moved target (default: SD refresh + 2 scrapes)"
        ),
    ] = None,
    no_handover: Annotated[
        bool, typer.Option("--no-handover", help="move targets at once (no make-before-break overlap)")
    ] = False,
    registry_ttl: Annotated[float, typer.Option(min=1, help="built-in registry entry lifetime")] = 90.0,
    registry_max_entries: Annotated[
        int, typer.Option(min=1, help="targets the built-in registry holds at most (more: 429)")
    ] = 2_000_000,
    registry_rate: Annotated[
        float,
        typer.Option(min=0, help="registrations/s per token, a batch entry counts one (more: 429); 0: off"),
    ] = 50_000.0,
    registry_burst: Annotated[
        int, typer.Option(min=1, help="registrations a token may send at once before --registry-rate applies")
    ] = 100_000,
    max_shards_per_region: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=MAX_SHARDS_BOUND,
            help="shards a sized region grows to at most; past it the registry refuses new nodes (429)"
            " [default: 2000, or what the spec's fleet: needs with 1.5x headroom when more (gpufed size)]",
        ),
    ] = None,
    read_rate: Annotated[
        float,
        typer.Option(
            min=0,
            help="list-read units/s per client without a token (a request or 100 rows; "
            "more: 429); 0: off",
        ),
    ] = 20.0,
    read_burst: Annotated[
        int, typer.Option(min=1, help="list-read units a client without a token may spend at once")
    ] = 100,
    init: Annotated[
        bool,
        typer.Option(
            "--init",
            help="start afresh: an empty state where a previous run left one (else an error, exit 2)",
        ),
    ] = False,
    child_url: Annotated[
        list[str] | None, typer.Option("--child-url", help="CHILD=URL of a child Prometheus (repeatable)")
    ] = None,
    child_url_template: Annotated[str | None, typer.Option(help="e.g. http://{child}:9090")] = None,
    load_url: Annotated[
        list[str] | None,
        typer.Option(
            "--load-url", help="Prometheus (the master) to read samples/s per target from (repeatable)"
        ),
    ] = None,
    load_interval: Annotated[float, typer.Option(min=1, help="seconds between load readings")] = 60.0,
    auto_rebalance_imbalance: Annotated[
        float | None,
        typer.Option(
            min=1.0,
            help="apply a load-aware plan when a region's samples/s max/mean exceeds this (e.g. 1.3)",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="shared state: kubernetes (ConfigMaps) or consul://HOST:PORT/PREFIX, prefix optional "
            "(default: SQLite)",
        ),
    ] = None,
    store_namespace: Annotated[
        str | None,
        typer.Option(
            "--store-namespace", help="the state's namespace for --store kubernetes (default: POD_NAMESPACE)"
        ),
    ] = None,
    store_prefix: Annotated[
        str,
        typer.Option("--store-prefix", help="name prefix of the state's ConfigMaps for --store kubernetes"),
    ] = "gpufed-state",
    leader_election: Annotated[
        str,
        typer.Option(
            "--leader-election",
            help="kubernetes (a Lease) or consul (a session lock), replicas sharing --store; or none",
        ),
    ] = "none",
    lease_name: Annotated[
        str, typer.Option("--lease-name", help="the Lease for --leader-election kubernetes")
    ] = "gpufed-controller",
    lease_namespace: Annotated[
        str | None,
        typer.Option("--lease-namespace", help="the Lease's namespace (default: POD_NAMESPACE, this pod's)"),
    ] = None,
    lease_kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--lease-kubeconfig",
            help="kubeconfig for the Lease (default: --kubeconfig, else the service account)",
        ),
    ] = None,
    advertise_url: Annotated[
        str | None,
        typer.Option("--advertise-url", help="URL clients reach this replica at (default http://LISTEN)"),
    ] = None,
    lock_ttl: Annotated[
        int,
        typer.Option(
            "--lock-ttl", min=10, max=86400, help="leader session TTL or Lease duration, seconds (10-86400)"
        ),
    ] = 15,
    lock_delay: Annotated[
        int,
        typer.Option("--lock-delay", min=0, max=60, help="Consul lock-delay after a leader's session ends"),
    ] = 1,
    trusted_proxies: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-proxies",
            help="CIDR blocks of proxies whose X-Forwarded-For names the client (repeatable or "
            "comma-separated); default none: the client is the TCP peer",
        ),
    ] = None,
    web_config_file: Annotated[Path | None, typer.Option(
        "--web.config.file", help="exporter-toolkit web config: TLS (reloaded on change), basic auth, "
        "headers")] = None,
    http_config_file: Annotated[Path | None, typer.Option(
        "--http.config.file", help="Prometheus http_config file (tls_config: CA, client certificate, "
        "server_name) for this controller's calls to the children and --load-url; e.g. gpufed render's "
        "tls/http-client.yml")] = None,
) -> None:
    """Run the controller: discovery loop, HTTP SD, REST plans and rebalances."""
    import uvicorn
    from uvicorn.main import STARTUP_FAILURE

    from federation.controller.http.http_guards import DeadlineH11Protocol
    from federation.controller.http.redact import RedactingFilter

    _check_numbers(
        debounce=(debounce, 3600.0),
        grace=(grace, 30 * 86400.0),
        handover_window=(handover_window, 86400.0),
        registry_ttl=(registry_ttl, 30 * 86400.0),
        registry_rate=(registry_rate, 1e9),
        read_rate=(read_rate, 1e9),
        load_interval=(load_interval, 86400.0),
        auto_rebalance_imbalance=(auto_rebalance_imbalance, 1000.0),
    )
    _check_rates(registry_rate=registry_rate, read_rate=read_rate)
    try:
        proxies = parse_trusted(trusted_proxies or [])
    except ProxyListError as exc:
        raise typer.BadParameter(str(exc), param_hint="--trusted-proxies") from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for handler in logging.getLogger().handlers:  # the same list as the spec and the API's masking
        handler.addFilter(RedactingFilter())
    try:
        host, port = split_listen(listen)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--listen") from exc
    try:
        served = webconfig.serving.load_web_config(web_config_file)
    except webconfig.model.WebConfigError as exc:
        typer.echo(f"error: --web.config.file: {exc.detail}", err=True)
        raise typer.Exit(2) from exc
    if served.config.basic_auth_users:  # one Authorization header cannot carry both
        typer.echo("error: --web.config.file: basic_auth_users: gpufed serve authenticates changes with "
                   "bearer tokens in the Authorization header; authenticate clients with certificates "
                   "(tls_server_config.client_auth_type) instead", err=True)
        raise typer.Exit(2)
    try:
        client_tls = webconfig.client.client_context(http_config_file)
    except webconfig.model.WebConfigError as exc:
        typer.echo(f"error: --http.config.file: {exc.detail}", err=True)
        raise typer.Exit(2) from exc
    bound = _bind(host, 0) if port == 0 else None  # port 0: the advertised URL needs the port
    if bound is not None:
        port = bound.getsockname()[1]
    with user_errors():
        loaded = load_gpufed_spec(spec)
    checker = None if no_check else Promtool.find()
    problem = None if checker is None else promtool_line_error(
        checker, loaded.prometheus.release(), older_only=True
    )
    if problem is not None:  # every config it publishes would be refused
        if bound is not None:
            bound.close()
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    consul_config = None
    if consul or service:
        consul_config = ConsulConfig(services=tuple(service or ["gpufed-exporter"]), address=consul)
        regions = RegionFlags(spec=loaded)
        if consul_default_region is not None:
            region = regions.known(consul_default_region, flag="--consul-default-region")
            mapping = dataclasses.replace(consul_config.mapping, default_region=region)
            consul_config = dataclasses.replace(consul_config, mapping=mapping)
    elif consul_default_region is not None:
        raise typer.BadParameter("needs --consul or --service", param_hint="--consul-default-region")
    k8s_config = None
    k8s_jobs: tuple[KubernetesConfig, ...] = ()
    if kubeconfig or in_cluster:
        regions = RegionFlags(spec=loaded)
        k8s_config = KubernetesConfig(
            namespace=namespace, service=k8s_service, kubeconfig=str(kubeconfig) if kubeconfig else None,
            region_label=k8s_region_label,
            default_region=regions.known(k8s_default_region, flag="--k8s-default-region")
            if k8s_default_region is not None else "",
            region_map=regions.mapping(k8s_region_map or []),
        )
        k8s_jobs = tuple(_k8s_job(value, base=k8s_config, jobs=loaded) for value in k8s_job or [])
    elif k8s_job:
        raise typer.BadParameter("needs --in-cluster or --kubeconfig", param_hint="--k8s-job")
    options = ControllerOptions(
        debounce_s=debounce,
        grace_s=grace,
        handover=not no_handover,
        handover_window_s=handover_window,
        registry_ttl_s=registry_ttl,
        registry_max_entries=registry_max_entries,
        registry_rate=registry_rate,
        registry_burst=registry_burst,
        read_rate=read_rate,
        read_burst=read_burst,
        hysteresis=Hysteresis(
            max_shards=max_shards_per_region
            if max_shards_per_region is not None
            else default_shard_cap(loaded, load_costs())
        ),
        child_urls=_child_urls(child_url or []),
        child_url_template=child_url_template,
    )
    if advertise_url is None and host not in ("0.0.0.0", "::", ""):
        advertise_url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    if advertise_url is not None and not advertise_url.startswith(("http://", "https://")):
        raise typer.BadParameter(
            f"expected an http(s) URL, got {advertise_url!r}", param_hint="--advertise-url"
        )
    for url in load_url or []:
        if not url.startswith(("http://", "https://")):
            raise typer.BadParameter(f"expected http://host:port, got {url!r}", param_hint="--load-url")
    if auto_rebalance_imbalance is not None and auto_rebalance_imbalance <= 1.0:
        raise typer.BadParameter(
            f"a max/mean ratio above 1.0, e.g. 1.3 (got {auto_rebalance_imbalance:g})",
            param_hint="--auto-rebalance-imbalance",
        )
    load = LoadOptions(
        urls=tuple(load_url or ()),
        interval_s=load_interval,
        auto_rebalance_imbalance=auto_rebalance_imbalance,
    )
    settings = ServeSettings(
        spec=loaded,
        data_dir=data_dir,
        inventory=inventory,
        consul=consul_config,
        kubernetes=k8s_config if k8s_service else None,
        kubernetes_jobs=k8s_jobs,
        tokens_file=tokens,
        dev=dev,
        init=init,
        check_configs=not no_check,
        options=options,
        store_url=store,
        store_namespace=store_namespace,
        store_prefix=store_prefix,
        election=leader_election,
        advertise_url=advertise_url,
        lock_ttl_s=lock_ttl,
        lock_delay_s=lock_delay,
        lease_name=lease_name,
        lease_namespace=lease_namespace,
        kubeconfig=next((str(p) for p in (lease_kubeconfig, kubeconfig) if p is not None), None),
        load=load,
        trusted_proxies=proxies,
        client_tls=client_tls,
    )
    if bound is None:  # before the state is opened or an election run: a busy port exits here
        bound = _bind(host, port)
    try:
        built = build_service(settings)
    except (TokenError, StoreError, SettingsError) as exc:
        typer.echo(f"error: {exc}", err=True)
        bound.close()
        raise typer.Exit(2) from exc
    built.controller.metrics.registry.register(served.collector())  # the refusals, on /metrics
    if built.auth.dev:
        for _ in range(3):
            print(
                "WARNING: gpufed serve --dev: NO TOKEN IS NEEDED to change shards. Never expose this port.",
                file=sys.stderr,
            )
    try:
        built.start()
    except StoreError as exc:  # e.g. Consul unreachable: exit, the supervisor restarts us
        typer.echo(f"error: {exc}", err=True)
        built.stop()
        bound.close()
        raise typer.Exit(2) from exc
    config = uvicorn.Config(
        served.wrap(built.app),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http=DeadlineH11Protocol,  # request heads within seconds: no slowloris
        proxy_headers=False,  # the client is the TCP peer (client_address); uvicorn trusts loopback
    )
    webconfig.serving.for_uvicorn(config, served)
    server = uvicorn.Server(config)  # uvicorn.run, but able to take the socket bound above
    try:
        server.run(sockets=[bound])
    except KeyboardInterrupt:
        pass
    finally:
        built.stop()
    if not server.started:  # the port was taken, say: exit as uvicorn.run does
        sys.exit(STARTUP_FAILURE)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
