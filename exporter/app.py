"""Wiring for `serve`: backend -> collection loop -> snapshot collector -> HTTP (+ registry).

`ExporterApp` owns the lifecycle: start collects once before serving so the first scrape
has data, and `stop` (SIGTERM/SIGINT) deregisters (from Consul, or from the gpufed
controller's registry) before closing the listener, so the sharder stops scraping us
before we disappear.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

import webconfig.client
import webconfig.model
import webconfig.serving
from exporter.attribution import node_name, placement_labels, pod_attribution
from exporter.backend import GpuBackend
from exporter.catalogue import select_families
from exporter.collection import Collection, CollectionLoop
from exporter.errors import ConfigError
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.registration import Registrar, Registry, ServiceDefinition, ServiceRegistry, service_definition
from exporter.server import Handler, HttpServer, NodeRoutes
from exporter.settings import ExporterSettings, host_label, parse_listen
from exporter.simulated import SimulatedBackend
from exporter.target_entry import NODE_JOB, TargetEntry, target_entry

if TYPE_CHECKING:
    from exporter.controller_registry import ControllerRegistry

log = logging.getLogger(__name__)


def split_listen(listen: str) -> tuple[str, int]:
    """`host:port` (host may be empty or bracketed IPv6) into its parts; `ConfigError` if not."""
    try:
        return parse_listen(listen)
    except ValueError as exc:
        raise ConfigError(f"--listen: {exc}") from exc


def web_config(settings: ExporterSettings) -> webconfig.serving.Served:
    """``--web.config.file`` read and built; ``ConfigError`` naming the field if it is bad."""
    try:
        return webconfig.serving.load_web_config(settings.web_config_file)
    except webconfig.model.WebConfigError as exc:
        raise ConfigError(f"--web.config.file: {exc.detail}") from exc


def http_server(settings: ExporterSettings, handler: Handler, *,
                served: webconfig.serving.Served | None = None) -> HttpServer:
    """The HTTP edge with the settings' limits; binds now, so a bad address fails first."""
    host, port = split_listen(settings.listen)
    served = served if served is not None else web_config(settings)
    return HttpServer(handler, host=host, port=port, backlog=settings.listen_backlog,
                      idle_timeout=settings.idle_timeout, request_timeout=settings.request_timeout,
                      max_body=settings.max_request_body, ssl_context=served.ssl_context,
                      guard=served.guard if served.guard.active else None)


def advertised_address(settings: ExporterSettings, listen_host: str) -> str:
    """What Consul should hand to Prometheus: explicit, else the listen host, else our IP."""
    if settings.advertise_address:
        return settings.advertise_address
    if listen_host not in ("0.0.0.0", "::", ""):
        return listen_host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def build_backend(
    settings: ExporterSettings, *, node: str = "", clock: Callable[[], float] = time.time
) -> GpuBackend:
    if settings.backend == "simulated":
        return SimulatedBackend(settings.gpus, settings.gpu_model, seed=settings.seed, node=node, clock=clock)
    from exporter.nvml_backend import NvmlBackend

    return NvmlBackend(clock=clock)


def consul_registry(settings: ExporterSettings) -> ServiceRegistry:
    from exporter.consul_registry import ConsulAgentRegistry

    assert settings.consul is not None
    return ConsulAgentRegistry(settings.consul, token=settings.consul_token)


def controller_registry(settings: ExporterSettings) -> ControllerRegistry:
    """The controller's registry at `register_url`; the caller closes it (its HTTP pool)."""
    from exporter.controller_registry import ControllerRegistry, controller_client

    assert settings.register_url is not None
    token = settings.register_token.get_secret_value() if settings.register_token else None
    try:
        tls = webconfig.client.client_context(settings.register_http_config_file)
    except webconfig.model.WebConfigError as exc:
        raise ConfigError(f"--register-http-config-file: {exc.detail}") from exc
    if tls is not None and not settings.register_url.startswith("https://"):
        raise ConfigError(f"--register-http-config-file has a tls_config but --register-url "
                          f"{settings.register_url} is not https://")
    return ControllerRegistry(controller_client(settings.register_url, tls=tls), token=token,
                              refresh_interval=settings.register_interval)


class ExporterApp:
    """One node's exporter. Backend and registry are injectable for tests."""

    def __init__(
        self,
        settings: ExporterSettings,
        *,
        backend: GpuBackend | None = None,
        registry: ServiceRegistry | None = None,
        target_registry: Registry[TargetEntry] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        to_controller = not settings.kubernetes and (settings.register_url or target_registry is not None)
        if to_controller and not settings.region:
            raise ConfigError("--register-url needs --region (GPUFED_EXPORTER_REGION): the controller "
                              "places every target in a region")
        # Built first: a bad --register-http-config-file stops here, before anything is opened.
        owned = controller_registry(settings) if to_controller and target_registry is None else None
        self.node = node_name(settings.node_name)
        families = select_families(include=settings.families_include, exclude=settings.families_exclude)
        self.backend = backend or build_backend(settings, node=self.node, clock=clock)
        migs = getattr(self.backend, "mig_slices", None)
        try:
            self._attribution = pod_attribution(
                settings.pod_attribution, socket_path=settings.pod_resources_socket,
                interval=settings.pod_resources_interval, timeout=settings.pod_resources_timeout,
                max_age=settings.pod_resources_max_age, backoff_cap=settings.pod_resources_backoff_cap,
                devices=self.backend.devices(),
                migs=migs() if migs and settings.pod_attribution != "none" else (),
                resource_slices=settings.dra_resource_slices, node=self.node,
            )
        except Exception:
            self.backend.close()
            raise
        self.collection = Collection(
            self.backend, families, attribution=self._attribution, timeout=settings.collect_timeout,
            health_window=settings.health_window, clock=clock,
        )
        placement = placement_labels(region=settings.region, rack=settings.rack, team=settings.team,
                                     cluster=settings.cluster)
        policy = LabelPolicy(self.node, host_label(settings), placement, settings.hami_legacy)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(self.collection, policy, dcgm_names=settings.dcgm_names,
                                                 nvlink_series=settings.nvlink_series))
        self.loop = CollectionLoop([self.collection], interval=settings.collect_interval)
        host, _ = split_listen(settings.listen)
        self._render_key: tuple[object, int] = (None, -1)
        self.routes = NodeRoutes(self.registry, ready=lambda: self.collection.ready(settings.max_age),
                                 version=self._render_version, cache=settings.render_cache)
        try:
            self.served = web_config(settings)
            self.http = http_server(settings, self.routes, served=self.served)
        except ConfigError:
            self._attribution.close()
            self.backend.close()
            raise
        self.registry.register(self.served.collector())
        if self.http.ssl_context is not None and (settings.consul or settings.register_url):
            # A registration names host, port and path; the scheme and tls_config of a scrape are
            # the spec's, per job (tls.hops.scrape or jobs[].scheme), as with a static inventory.
            log.info("serving TLS (--web.config.file): the children scrape job %s over https when the "
                     "spec's tls.hops.scrape (or the job's scheme) says so; Consul's check is a TCP "
                     "connect", settings.register_job)
        self.registrar: Registrar[ServiceDefinition] | Registrar[TargetEntry] | None = None
        self._close_registry: Callable[[], None] = lambda: None
        if (settings.consul or settings.register_url) and settings.kubernetes:
            log.info("kubernetes mode: registration skipped; the sharder reads pod labels")
        elif to_controller:
            if owned is not None:
                target_registry, self._close_registry = owned, owned.close
            assert target_registry is not None  # to_controller: --register-url (owned) or one given
            self.registrar = Registrar(target_registry, self.targets(host),
                                       interval=settings.register_interval)
        elif settings.consul or registry is not None:
            self.registrar = Registrar(registry or consul_registry(settings), [self.service(host)],
                                       interval=settings.register_interval)

    def _render_version(self) -> object:
        """The render cache's key: the collection's stats (a new object per collection) and the
        web config's refusal count, so a refused scrape shows in the next one."""
        stats, generation = self.collection.stats, self.served.generation
        if self._render_key[0] is not stats or self._render_key[1] != generation:
            self._render_key = (stats, generation)
        return self._render_key

    def service(self, listen_host: str) -> ServiceDefinition:
        s, devices = self.settings, self.collection.devices
        meta = {
            **placement_labels(region=s.region, rack=s.rack, team=s.team, cluster=s.cluster),
            "gpu_count": len(devices),
            "gpu_model": devices[0].model if devices else "",
            "driver": self.collection.driver,
            "metrics_path": "/metrics",
            "node": self.node,
        }
        return service_definition(
            s.service_name, self.node, address=advertised_address(s, listen_host), port=self.http.port,
            meta=meta, check_interval=s.check_interval, check_timeout=s.check_timeout,
            deregister_after=s.deregister_critical_after, check_tcp=self.http.ssl_context is not None,
        )

    def targets(self, listen_host: str) -> list[TargetEntry]:
        """The GPU exporter as job `register_job`, and node-exporter as job `node` if given."""
        s = self.settings
        address, gpus = advertised_address(s, listen_host), len(self.collection.devices)
        out = [target_entry(address=address, port=self.http.port, job=s.register_job, node=self.node,
                            region=s.region, rack=s.rack, team=s.team, gpus=gpus)]
        if s.node_exporter_port is not None:
            out.append(target_entry(address=address, port=s.node_exporter_port, job=NODE_JOB, node=self.node,
                                    region=s.region, rack=s.rack, team=s.team, gpus=gpus))
        return out

    def start(self) -> None:
        self.collection.collect_once()
        self.loop.start()
        self.http.start()
        if self.registrar:
            self.registrar.start()
        log.info("serving node=%s port=%d gpus=%d", self.node, self.http.port, len(self.collection.devices))

    def stop(self) -> None:
        if self.registrar:
            self.registrar.stop(deregister=True)
        self._close_registry()
        self.http.stop()
        self.loop.stop()
        self._attribution.close()
        self.backend.close()
        log.info("stopped node=%s", self.node)
