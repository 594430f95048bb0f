"""What one ``gpufed demo`` run is, decided before anything starts. Pure.

Pipeline position: ``federation.demo.stack`` allocates ports and secrets, then asks this
module for the spec (the embedded ``default-spec.yaml`` with the run's regions, shard
counts, ports and paths filled in), the built-in registry entries of the simulated fleet
and the DingTalk robot credentials; ``federation.demo.components`` turns those into
command lines. Nothing here opens a socket or starts a process.

Regions and node names come from ``exporter.fleet.fleet_nodes`` (``gpu-region-<r>-<n>``
round-robin over ``region-<r>``), the same function ``gpufed-exporter fleet`` serves, so
what the demo registers is exactly what the fleet answers for. Shard counts are fixed per
region (about ``nodes_per_child`` nodes each) rather than sized live, so the children are
known before the controller starts and each gets its ``--child-url`` up front.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from exporter.fleet import fleet_nodes
from federation.spec import GpufedSpec
from sharder.kernel.prometheus_versions import Release

DEFAULT_SPEC = "default-spec.yaml"
JOB = "gpu"
#: Nodes per child Prometheus on one small machine: 200 nodes over 3 regions -> 6 children.
NODES_PER_CHILD = 40
ALERTMANAGERS = 2
SRE_ROBOT = "sre"


@dataclass(frozen=True)
class Layout:
    """The simulated fleet and how it is sharded."""

    nodes: int = 200
    gpus: int = 8
    regions: int = 3
    replication_factor: int = 1
    nodes_per_child: int = NODES_PER_CHILD

    def __post_init__(self) -> None:
        for name in ("nodes", "regions", "replication_factor", "nodes_per_child"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.gpus <= 64:
            raise ValueError(f"--gpus must be from 0 to 64, got {self.gpus}")
        if self.replication_factor > 3:
            raise ValueError(f"--replication-factor must be 1, 2 or 3, got {self.replication_factor}")
        if self.regions > self.nodes:
            raise ValueError(f"--regions ({self.regions}) cannot exceed --nodes ({self.nodes})")

    def region_names(self) -> list[str]:
        return [f"region-{i}" for i in range(self.regions)]

    def nodes_in(self, index: int) -> int:
        """Nodes of region ``index``: the fleet deals nodes round-robin over regions."""
        return len(range(index, self.nodes, self.regions))

    def shard_counts(self) -> dict[str, int]:
        return {
            name: max(1, math.ceil(self.nodes_in(i) / self.nodes_per_child))
            for i, name in enumerate(self.region_names())
        }


@dataclass(frozen=True)
class Ports:
    """Loopback ports of one run; children get theirs as they start."""

    controller: int
    master: int
    relay: int
    sink: int
    fleet: int
    router: int
    alertmanagers: tuple[tuple[int, int], ...]
    """(web, cluster) per replica."""

    @classmethod
    def allocate(cls, free_port: Callable[[], int]) -> Ports:
        return cls(
            controller=free_port(),
            master=free_port(),
            relay=free_port(),
            sink=free_port(),
            fleet=free_port(),
            router=free_port(),
            alertmanagers=tuple((free_port(), free_port()) for _ in range(ALERTMANAGERS)),
        )


def url(port: int, path: str = "", *, tls: bool = False) -> str:
    return f"{'https' if tls else 'http'}://127.0.0.1:{port}{path}"


#: ``gpufed demo --tls``: the certificates (``gpufed certs``) in the data dir's ``tls/``.
TLS_DIR = "tls"
#: The demo's own client certificate's common name (what the servers' logs show).
TLS_CLIENT_NAME = "gpufed-demo"


@dataclass(frozen=True)
class TlsFiles:
    """``gpufed demo --tls``: the rendered files every process serves and calls with."""

    certs: Path
    """``ca.crt``, ``server.*``, ``client.*`` (``webconfig.certs.make_certs``)."""
    web_config: Path
    """``config/tls/web-config.yml``: ``--web.config.file`` of every server (client certs required)."""
    http_config: Path
    """``config/tls/http-client.yml``: the CA and client certificate of every gpufed client."""
    cluster_config: Path
    """``config/tls/cluster-tls.yml``: the Alertmanagers' ``--cluster.tls-config`` (gossip over mTLS)."""


def tls_section(certs: Path) -> dict[str, Any]:
    """The spec's ``tls`` section for certificates in ``certs``: every hop over TLS, and the
    children, the master and the Alertmanagers serving it with client certificates required."""
    return {
        "ca_file": str(certs / "ca.crt"),
        "cert_file": str(certs / "client.crt"),
        "key_file": str(certs / "client.key"),
        "serve": {"cert_file": str(certs / "server.crt"), "key_file": str(certs / "server.key"),
                  "client_auth_type": "RequireAndVerifyClientCert"},
    }


def robot_name(region: str) -> str:
    return f"{region}-oncall"


def credential_env(robot: str) -> tuple[str, str]:
    """Environment variables holding a robot's access token and signing secret."""
    stem = "GPUFED_DEMO_" + robot.upper().replace("-", "_")
    return f"{stem}_TOKEN", f"{stem}_SECRET"


def robots(layout: Layout) -> list[str]:
    return [*(robot_name(region) for region in layout.region_names()), SRE_ROBOT]


def load_default_spec() -> dict[str, Any]:
    text = resources.files("federation.demo").joinpath(DEFAULT_SPEC).read_text(encoding="utf-8")
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def demo_spec(
    base: Mapping[str, Any],
    *,
    layout: Layout,
    ports: Ports,
    master_data: str,
    prometheus: Release | None = None,
    alertmanager: Release | None = None,
    tls: Path | None = None,
) -> dict[str, Any]:
    """``base`` (the default spec) with this run's regions, shards, ports and paths, and the
    releases of the binaries it runs where ``base`` names none; with ``tls`` (the certificates'
    folder) a ``tls`` section and https on every hop but the DingTalk stand-in's."""
    on = tls is not None
    spec = copy.deepcopy(dict(base))
    for section, release in (("prometheus", prometheus), ("alertmanager", alertmanager)):
        if release is not None:
            spec.setdefault(section, {}).setdefault("version", f"{release.major}.{release.minor}")
    spec["regions"] = [{"name": name, "shards": n} for name, n in layout.shard_counts().items()]
    spec["sharding"]["replication_factor"] = layout.replication_factor
    spec["remote_write"][0]["url"] = url(ports.master, "/api/v1/write", tls=on)
    spec["children"]["http_sd_url"] = url(ports.controller, tls=on)
    alerting = spec["alerting"]
    alerting["relay_url"] = url(ports.relay, tls=on)
    alerting["relay_listen"] = f"127.0.0.1:{ports.relay}"
    alerting["replicas"] = [
        {"name": f"am-{i}", "host": "127.0.0.1", "port": web, "cluster_port": cluster}
        for i, (web, cluster) in enumerate(ports.alertmanagers)
    ]
    alerting["robots"] = [
        {
            "name": robot,
            "url": url(ports.sink, "/robot/send?access_token=${" + credential_env(robot)[0] + "}"),
            "secret": "${" + credential_env(robot)[1] + "}",
        }
        for robot in robots(layout)
    ]
    for receiver in alerting["receivers"]:
        for hook in receiver.get("webhooks", []):
            hook["url"] = url(ports.sink, "/heartbeat")
    alerting["routes"] = [
        {"region": region, "robot": robot_name(region), "critical": [SRE_ROBOT]}
        for region in layout.region_names()
    ]
    # The links in alerts: the master's and the first Alertmanager's loopback URLs, not
    # this machine's host name (which the browser that opens the message may not resolve).
    alerting["external_url"] = url(ports.alertmanagers[0][0], tls=on)
    spec["master"]["external_url"] = url(ports.master, tls=on)
    spec["master"]["port"] = ports.master
    spec["master"]["data_dir"] = master_data
    # Children listen on ports chosen as they start: the master reaches each by name
    # through the router, as the controller does (federation.demo.router).
    spec["master"]["monitoring"] = {"child_url": url(ports.router, "/{child}", tls=on)}
    if tls is not None:
        spec["tls"] = tls_section(tls)
    return spec


def left_out(spec: GpufedSpec, *, consul: bool) -> list[str]:
    """What a compose or Helm install of ``spec`` also runs that one machine does not, and why."""
    missing = ["Grafana (import federation/dashboards/*.json into yours; the master is the data source)"]
    if spec.thanos is not None:
        missing.append("Thanos and MinIO (the master keeps its own retention here)")
    else:
        missing.append("Thanos and MinIO (opt-in; not in this spec)")
    if not consul:
        missing.append("Consul (the controller's built-in registry instead; --consul to use one)")
    return missing


def fleet_entries(layout: Layout, *, port: int, host: str = "127.0.0.1") -> list[dict[str, Any]]:
    """Built-in registry entries (``PUT /v1/registry/targets/{identity}`` bodies), one per node.

    The contract ``gpufed-exporter fleet --register-url`` follows: identity
    ``<node>:<job>`` (every node shares the fleet's host:port), metrics under
    ``/nodes/<node>/metrics``.
    """
    return [
        {
            "address": host,
            "port": port,
            "job": JOB,
            "node": node.name,
            "region": node.region,
            "rack": node.rack,
            "team": node.team,
            "gpus": layout.gpus,
            "metrics_path": f"/nodes/{node.name}/metrics",
            "identity": f"{node.name}:{JOB}",
        }
        for node in fleet_nodes(layout.nodes, regions=layout.regions)
    ]
