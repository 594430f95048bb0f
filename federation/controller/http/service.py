"""Wiring for ``gpufed serve``: settings in, a running controller and its ASGI app out.

Kept apart from the CLI so tests (and ``gpufed demo``) build the same service in-process.
The store is SQLite in the data directory unless ``store_url`` names Consul
(``consul://HOST:PORT[/prefix]``) or is ``kubernetes`` (ConfigMaps, ``kube_store``),
which several replicas share; ``election="consul"``
(a session lock, ``consul_lock``) or ``election="kubernetes"`` (a ``coordination.k8s.io``
Lease, ``lease``) then makes one of them the leader, the others followers.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from alertmanager.amtool import Amtool
from federation.controller.base.metrics import ControllerMetrics, register_process
from federation.controller.base.options import ControllerOptions
from federation.controller.controller import Controller
from federation.controller.ha.consul_lock import ConsulLock
from federation.controller.ha.leader import AlwaysLeader, LeaderElector
from federation.controller.ha.replicating import Replication
from federation.controller.http import api, client_address
from federation.controller.http.auth import Authenticator, load_tokens
from federation.controller.live.probe import ChildProbe
from federation.controller.live.publisher import Publisher
from federation.controller.load.reader import PrometheusLoadReader
from federation.controller.load.tracking import LoadOptions, LoadTracker
from federation.controller.load.weighing import LoadReader
from federation.controller.stores import store_watch
from federation.controller.stores.consul_store import ConsulStore
from federation.controller.stores.sqlite_store import SqliteStore
from federation.controller.stores.store import StateStore
from federation.spec import GpufedSpec
from sharder.kernel.promtool import Promtool
from sharder.sources.build import WatchOptions, build_sources
from sharder.sources.consul import ConsulConfig, make_client
from sharder.sources.kubernetes import KubernetesConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeSettings:
    spec: GpufedSpec
    data_dir: Path
    inventory: Path | None = None
    consul: ConsulConfig | None = None
    kubernetes: KubernetesConfig | None = None
    kubernetes_jobs: tuple[KubernetesConfig, ...] = ()
    """More jobs from other Services (``--k8s-job``), e.g. node-exporter as job ``node``."""
    tokens_file: Path | None = None
    dev: bool = False
    init: bool = False
    """``--init``: start from an empty state although a previous run left one (SQLite: an
    unreadable file is moved aside; Kubernetes/Consul: a lost head's leftovers are removed)."""
    check_configs: bool = True
    options: ControllerOptions = field(default_factory=ControllerOptions)
    load: LoadOptions | None = None
    """Measured load (``--load-url``); None: read it only from full-Prometheus children, if any are known."""
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    store_url: str | None = None
    """None: SQLite in ``data_dir``; ``consul://HOST:PORT[/prefix]``: Consul KV, shared;
    ``kubernetes``: ConfigMaps named ``store_prefix`` in ``store_namespace``, shared."""
    store_namespace: str | None = None
    """Default: ``POD_NAMESPACE`` (downward API), else the service account's namespace."""
    store_prefix: str = "gpufed-state"
    election: str = "none"
    """``none`` (one replica), ``consul`` (a session lock next to the Consul store) or
    ``kubernetes`` (a Lease; the state still needs ``store_url``)."""
    advertise_url: str | None = None
    """This replica's URL as followers report it to callers (the lock's value)."""
    lock_ttl_s: int = 15
    """Consul session TTL, or the Lease's ``leaseDurationSeconds``."""
    lock_delay_s: int = 1
    lease_name: str = "gpufed-controller"
    lease_namespace: str | None = None
    """Default: ``POD_NAMESPACE`` (downward API), else the service account's namespace."""
    kubeconfig: str | None = None
    """Where the Lease is: a kubeconfig file; None: the pod's service account."""
    store_stall_s: float = store_watch.STALL_S
    """``/readyz`` turns 503 once the state store has not answered this long."""
    trusted_proxies: tuple[client_address.Network, ...] = ()
    """``--trusted-proxies``: whose ``X-Forwarded-For`` names the client (default: none, the TCP peer)."""
    client_tls: ssl.SSLContext | None = None
    """``--http.config.file``: what the controller's own calls (children, ``--load-url``) verify
    servers with and present as their client certificate; None: the system's roots, no certificate."""


class SettingsError(ValueError):
    """A setting that cannot work; the message names the flag."""


def parse_store_url(url: str) -> tuple[str, str]:
    """``consul://HOST:PORT[/prefix]`` -> (``HOST:PORT``, prefix, default ``gpufed``)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("consul", "consul+https"):
        raise SettingsError(f"--store: expected consul://HOST:PORT[/prefix], got {url!r}")
    address, _, prefix = rest.partition("/")
    prefix = prefix.strip("/") or "gpufed"
    _host, colon, port = address.rpartition(":")
    if not address or (colon and not port.isdigit()) or not re.fullmatch(r"[A-Za-z0-9,._/-]+", prefix):
        raise SettingsError(f"--store: expected consul://HOST:PORT[/prefix], got {url!r}")
    return ("https://" if scheme == "consul+https" else "") + address, prefix


def build_store(settings: ServeSettings) -> StateStore:
    if settings.store_url is None:
        return SqliteStore(settings.data_dir / "state.db", init=settings.init)
    if settings.store_url == "kubernetes":
        from federation.controller.stores.kube_objects import api_from_cluster  # imports kubernetes
        from federation.controller.stores.kube_store import KubeStore

        namespace = pod_namespace(
            settings.store_namespace, settings.env, flag="--store-namespace", what="state"
        )
        api = api_from_cluster(settings.kubeconfig)
        return KubeStore(api, namespace=namespace, prefix=settings.store_prefix, init=settings.init)
    address, prefix = parse_store_url(settings.store_url)
    client = make_client(ConsulConfig(address=address, timeout_s=5.0))
    return ConsulStore(client, prefix=prefix, where=settings.store_url, init=settings.init)


ELECTIONS = ("kubernetes", "consul", "none")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def build_elector(settings: ServeSettings) -> LeaderElector:
    if settings.election == "none":
        return AlwaysLeader(address=settings.advertise_url)
    if settings.election not in ELECTIONS:
        raise SettingsError(
            f"--leader-election: expected kubernetes, consul or none, got {settings.election!r}"
        )
    if settings.store_url is None:  # an elected leader is only useful over state the others read
        raise SettingsError(
            f"--leader-election {settings.election} needs a shared store: "
            "--store kubernetes or --store consul://HOST:PORT[/prefix]"
        )
    if not settings.advertise_url:
        raise SettingsError(
            f"--leader-election {settings.election} needs --advertise-url (how clients reach this replica)"
        )
    if settings.election == "kubernetes":
        return lease_elector(settings)
    address, prefix = parse_store_url(settings.store_url)
    client = make_client(ConsulConfig(address=address, timeout_s=5.0))
    try:
        return ConsulLock(
            client,
            key=f"{prefix}/leader",
            address=settings.advertise_url,
            ttl_s=settings.lock_ttl_s,
            lock_delay_s=settings.lock_delay_s,
        )
    except ValueError as exc:
        raise SettingsError(f"--lock-ttl/--lock-delay: {exc}") from exc


def lease_elector(settings: ServeSettings) -> LeaderElector:
    """A Lease named ``lease_name`` in this pod's namespace, held as this pod (its name).

    Identity and namespace come from the downward API (``POD_NAME``, ``POD_NAMESPACE``);
    a pod's host name is its name, so that is the fallback identity.
    """
    from federation.controller.ha.lease import LeaseConfig, LeaseElector  # imports kubernetes

    if not _K8S_NAME.match(settings.lease_name):
        raise SettingsError(f"--lease-name: not a Kubernetes object name: {settings.lease_name!r}")
    namespace = pod_namespace(settings.lease_namespace, settings.env, flag="--lease-namespace", what="Lease")
    identity = settings.env.get("POD_NAME") or socket.gethostname()
    try:
        config = LeaseConfig(
            identity=identity,
            address=settings.advertise_url,
            name=settings.lease_name,
            namespace=namespace,
            lease_duration_s=settings.lock_ttl_s,
        )
    except ValueError as exc:
        raise SettingsError(f"--lock-ttl: {exc}") from exc
    try:
        return LeaseElector.from_cluster(config, kubeconfig=settings.kubeconfig)
    except Exception as exc:  # the client's ConfigException, or an unreadable kubeconfig
        where = f"--kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "the pod's service account"
        raise SettingsError(
            f"--leader-election kubernetes: no cluster credentials from {where} ({exc})"
        ) from exc


def pod_namespace(given: str | None, env: Mapping[str, str], *, flag: str, what: str) -> str:
    """``given``, else this pod's namespace (``POD_NAMESPACE``, else the service account's)."""
    namespace = given or env.get("POD_NAMESPACE")
    if not namespace and SERVICE_ACCOUNT_NAMESPACE.is_file():
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
    if not namespace or not _K8S_NAME.match(namespace):
        raise SettingsError(
            f"{flag}: give the {what}'s namespace (or POD_NAMESPACE from the downward API), got {namespace!r}"
        )
    return namespace


@dataclass
class Service:
    controller: Controller
    app: FastAPI
    auth: Authenticator
    store: StateStore
    http: httpx.Client
    sources: list[Any]
    elector: LeaderElector = field(default_factory=AlwaysLeader)
    _election_stop: threading.Event = field(default_factory=threading.Event)
    _election: threading.Thread | None = None

    def start(self) -> None:
        self.controller.restore()  # freezes what it read (``adoption.restore``)
        self._election = threading.Thread(
            target=self.elector.run, args=(self._election_stop,), daemon=True, name="leader-election"
        )
        self._election.start()
        self.controller.start(self.sources)

    def stop(self) -> None:
        self.controller.stop()  # no more writes, then give the lock up (resign)
        self._election_stop.set()
        if self._election is not None:
            self._election.join(timeout=10)
        self.http.close()
        self.controller.audit_pages.close()
        self.store.close()


def build_service(
    settings: ServeSettings,
    *,
    store: StateStore | None = None,
    load_reader: LoadReader | None = None,
    elector: LeaderElector | None = None,
) -> Service:
    """Raises ``TokenError`` for missing/placeholder tokens (unless ``dev``) and store errors.
    ``store``, ``load_reader`` and ``elector`` replace what the settings would build."""
    tokens = load_tokens(settings.tokens_file, env=settings.env)
    if not tokens and not settings.dev:
        from federation.controller.http.auth import TokenError

        raise TokenError(
            "no write token: set GPUFED_TOKEN or pass --tokens FILE (or --dev for a local trial)"
        )
    auth = Authenticator(tokens, dev=settings.dev)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.data_dir, 0o700)
    elector = elector or build_elector(settings)
    health = store_watch.StoreHealth(stall_s=settings.store_stall_s)
    store = cast(StateStore, store_watch.WatchedStore(store or build_store(settings), health))
    options = settings.options  # every store commits a step's set changes with its state
    registry = CollectorRegistry()
    register_process(registry)  # process_cpu_seconds_total, process_resident_memory_bytes
    metrics = ControllerMetrics(registry=registry)
    http = httpx.Client(timeout=httpx.Timeout(2.0), verify=settings.client_tls or True)
    publisher = Publisher(
        out=settings.data_dir / "rendered",
        checker=Promtool() if settings.check_configs else None,
        alert_checker=Amtool() if settings.check_configs else None,
        agent=settings.spec.children.agent_mode,
        on_result=lambda result: metrics.config_checks.labels(result=result).inc(),
    )
    controller = Controller(
        spec=settings.spec,
        store=store,
        metrics=metrics,
        options=options,
        probe=ChildProbe(http),
        publisher=publisher,
        load=_load_tracker(
            settings, load_reader or PrometheusLoadReader(http, jobs=[job.name for job in settings.spec.jobs])
        ),
        replication=Replication(
            store=store,
            metrics=metrics,
            can_write=elector.is_leader,
            fence=elector.fence,
            leader=elector.leader_address,
        ),
    )
    watch = WatchOptions(
        consul=settings.consul,
        kubernetes=settings.kubernetes,
        kubernetes_jobs=settings.kubernetes_jobs,
        file=settings.inventory,
    )
    sources = build_sources(watch, sink=controller.reconciler, spec=settings.spec)
    app = api.create_app(
        controller,
        auth=auth,
        clients=client_address.ClientAddress(trusted=settings.trusted_proxies),
        store_health=health,
    )
    return Service(
        controller=controller, app=app, auth=auth, store=store, http=http, sources=sources, elector=elector
    )


def _load_tracker(settings: ServeSettings, reader: LoadReader) -> LoadTracker | None:
    """Read load from ``--load-url``; else from the children, when they are full Prometheus servers
    the controller can reach (agents have no query API)."""
    options = settings.load or LoadOptions()
    children_readable = not settings.spec.children.agent_mode and bool(
        settings.options.child_urls or settings.options.child_url_template
    )
    if not options.urls and not children_readable:
        if options.auto_rebalance_imbalance is not None:
            log.warning("auto rebalancing is off: no --load-url and no full-Prometheus children to read")
        return None
    return LoadTracker(reader=reader, options=options)
