"""Many simulated nodes from one process, for demos and sharder benchmarks.

All nodes share one port: node N is `/nodes/<N>/metrics` (Prometheus reaches it through
`__metrics_path__`, which Consul Meta `metrics_path` or the controller entry's
`metrics_path` carries), so 500 nodes cost one listener and one collection thread instead
of 500 of each. Node names, regions, racks and teams are derived deterministically from
the node's position.

One node raises an XID 5-20 s after the fleet starts (seeded: `exporter.simulated.first_xid`),
so a demo shows an alert within a minute; `first_xid=False` in the settings turns it off.

Registered with the gpufed controller, every node is its own target with the explicit
identity `<node>:<job>` (they all share one host:port, the default identity). A refresh
re-PUTs every node each interval, over `REFRESH_WORKERS` keep-alive connections.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from exporter.app import advertised_address, controller_registry, http_server, split_listen
from exporter.catalogue import select_families
from exporter.collection import Collection, CollectionLoop
from exporter.errors import ConfigError
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.registration import Registrar, Registry, ServiceDefinition, ServiceRegistry, service_definition
from exporter.server import NOT_FOUND, TEXT, NodeRoutes, Response
from exporter.settings import ExporterSettings, host_label
from exporter.simulated import SimulatedBackend, first_xid
from exporter.target_entry import TargetEntry, target_entry

log = logging.getLogger(__name__)
TEAMS = ("training", "inference", "research", "platform")
#: Concurrent PUTs per refresh: 2,000 nodes one after another cost one round trip each.
REFRESH_WORKERS = 8


@dataclass(frozen=True, slots=True)
class FleetNode:
    """Where one simulated node sits."""

    name: str
    region: str
    rack: str
    team: str


def fleet_nodes(count: int, *, regions: int = 3, racks_per_region: int = 8) -> list[FleetNode]:
    """`gpu-<region>-<n>` nodes spread round-robin over regions, racks and teams."""
    if count < 1 or regions < 1 or racks_per_region < 1:
        raise ConfigError(f"a fleet needs at least one node, region and rack (got nodes={count}, "
                          f"regions={regions}, racks_per_region={racks_per_region})")
    nodes = []
    for i in range(count):
        region = f"region-{i % regions}"
        local = i // regions
        nodes.append(FleetNode(
            name=f"gpu-{region}-{local:04d}",
            region=region,
            rack=f"{region}-rack-{local % racks_per_region:02d}",
            team=TEAMS[i % len(TEAMS)],
        ))
    return nodes


class FleetApp:
    """One process, N simulated exporters behind per-node paths."""

    def __init__(
        self,
        settings: ExporterSettings,
        nodes: list[FleetNode],
        *,
        registry: ServiceRegistry | None = None,
        target_registry: Registry[TargetEntry] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        families = select_families(include=settings.families_include, exclude=settings.families_exclude)
        self.nodes = {node.name: node for node in nodes}
        self.collections: dict[str, Collection] = {}
        self.routes: dict[str, NodeRoutes] = {}
        # One seeded XID 5-20 s after start, on one node, so a demo shows an alert at once
        # (exporter.simulated: the early XID).
        names = [node.name for node in nodes]
        early = first_xid(settings.seed, names, settings.gpus) if settings.first_xid else None
        for node in nodes:
            backend = SimulatedBackend(settings.gpus, settings.gpu_model, seed=settings.seed, node=node.name,
                                       clock=clock, scheduled_xid=early)
            # Simulated reads never hang, so no per-read watchdog thread (timeout=None).
            collection = Collection(backend, families, timeout=None, health_window=settings.health_window,
                                    clock=clock)
            policy = LabelPolicy(node.name, host_label(settings),
                                 {"region": node.region, "rack": node.rack, "team": node.team,
                                  **({"cluster": settings.cluster} if settings.cluster else {})},
                                 settings.hami_legacy)
            reg = CollectorRegistry(auto_describe=False)
            reg.register(SnapshotCollector(collection, policy))
            self.collections[node.name] = collection
            self.routes[node.name] = NodeRoutes(
                reg,
                ready=lambda c=collection: c.ready(settings.max_age),  # type: ignore[misc]
                version=lambda c=collection: c.stats,  # type: ignore[misc]
                cache=settings.render_cache,
            )
        self.loop = CollectionLoop(list(self.collections.values()), interval=settings.collect_interval)
        host, _ = split_listen(settings.listen)
        self.http = http_server(settings, self.handle)
        self.registrar: Registrar[ServiceDefinition] | Registrar[TargetEntry] | None = None
        self._close_registry: Callable[[], None] = lambda: None
        if target_registry is None and settings.register_url:
            owned = controller_registry(settings)
            target_registry, self._close_registry = owned, owned.close
        if target_registry is not None:
            self.registrar = Registrar(target_registry, self.targets(host),
                                       interval=settings.register_interval, workers=REFRESH_WORKERS)
        elif registry is not None:
            self.registrar = Registrar(registry, self.services(host), interval=settings.register_interval)

    def handle(self, path: str) -> Response:
        if path in ("/healthz", "/readyz"):
            ready = all(c.ready(self.settings.max_age) for c in self.collections.values())
            if path == "/healthz" or ready:
                return 200, TEXT, b"ok\n"
            return 503, TEXT, b"not every node has collected\n"
        if path == "/nodes":
            return 200, TEXT, "".join(f"{name}\n" for name in self.nodes).encode()
        parts = path.split("/")
        if len(parts) == 4 and parts[1] == "nodes" and parts[2] in self.routes:
            return self.routes[parts[2]](f"/{parts[3]}")
        return NOT_FOUND

    def services(self, listen_host: str) -> list[ServiceDefinition]:
        s = self.settings
        address = advertised_address(s, listen_host)
        out = []
        for name, node in self.nodes.items():
            meta = {"region": node.region, "rack": node.rack, "team": node.team, "cluster": s.cluster,
                    "gpu_count": s.gpus, "gpu_model": s.gpu_model, "driver": "550.54.15",
                    "metrics_path": f"/nodes/{name}/metrics", "node": name}
            out.append(service_definition(
                s.service_name, name, address=address, port=self.http.port,
                meta={k: v for k, v in meta.items() if v != ""},
                check_path=f"/nodes/{name}/healthz", check_interval=s.check_interval,
                check_timeout=s.check_timeout, deregister_after=s.deregister_critical_after,
                check_tcp=self.http.ssl_context is not None,
            ))
        return out

    def targets(self, listen_host: str) -> list[TargetEntry]:
        s = self.settings
        address = advertised_address(s, listen_host)
        return [target_entry(address=address, port=self.http.port, job=s.register_job, node=name,
                             region=node.region, rack=node.rack, team=node.team, gpus=s.gpus,
                             metrics_path=f"/nodes/{name}/metrics", identity=f"{name}:{s.register_job}")
                for name, node in self.nodes.items()]

    def start(self) -> None:
        started = time.perf_counter()
        for collection in self.collections.values():
            collection.collect_once()
        took = time.perf_counter() - started
        log.info("fleet first collection nodes=%d seconds=%.3f", len(self.nodes), took)
        self.loop.start()
        self.http.start()
        if self.registrar:
            self.registrar.start()
        log.info("fleet serving nodes=%d port=%d", len(self.nodes), self.http.port)

    def stop(self) -> None:
        if self.registrar:
            self.registrar.stop(deregister=True)
        self._close_registry()
        self.http.stop()
        self.loop.stop()
