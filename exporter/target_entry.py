"""What the exporter tells the gpufed controller's built-in registry: one inventory target.

The controller's `PUT /v1/registry/targets/{identity}` takes one entry with the fields of
a `targets:` entry in a gpufed inventory file, and refuses a path whose identity is not
the entry's own: its explicit `identity`, else `host:port` of its address. The sharder
(which owns `Target`) is off limits to the exporter, so this module restates the little
it needs: the entry's fields, how its identity is spelt, and the address normalisation
the controller applies before comparing (lower-case names, compressed IPv6 without
brackets), so that the path we build is the identity the controller computes.

Pure: `exporter.controller_registry` sends what `TargetEntry.body()` returns.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

GPU_JOB = "gpu"
NODE_JOB = "node"


def normalise_address(host: str) -> str:
    """The controller's spelling of a host: IPs canonical, names lower-case, no brackets."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text.rstrip(".").lower()


def host_port(host: str, port: int) -> str:
    """`host:port` as Prometheus (and the controller's identities) spell it: IPv6 bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class TargetEntry:
    """One target in the controller's registry; `identity` is both its key and its path."""

    address: str
    port: int
    job: str
    node: str
    region: str
    rack: str = ""
    team: str = ""
    gpus: int = 0
    metrics_path: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    explicit_identity: str | None = None

    @property
    def identity(self) -> str:
        return self.explicit_identity or host_port(self.address, self.port)

    @property
    def registration_id(self) -> str:
        return self.identity

    def body(self) -> dict[str, object]:
        """The PUT body: required fields always, optional ones only when set (as a file would)."""
        out: dict[str, object] = {"address": self.address, "port": self.port, "job": self.job,
                                  "node": self.node, "region": self.region, "gpus": self.gpus}
        if self.rack:
            out["rack"] = self.rack
        if self.team:
            out["team"] = self.team
        if self.metrics_path is not None:
            out["metrics_path"] = self.metrics_path
        if self.labels:
            out["labels"] = dict(sorted(self.labels.items()))
        if self.explicit_identity is not None:
            out["identity"] = self.explicit_identity
        return dict(sorted(out.items()))


def target_entry(
    *,
    address: str,
    port: int,
    job: str,
    node: str,
    region: str,
    rack: str = "",
    team: str = "",
    gpus: int = 0,
    metrics_path: str | None = None,
    labels: Mapping[str, str] | None = None,
    identity: str | None = None,
) -> TargetEntry:
    """A `TargetEntry` with its address spelt the way the controller compares identities."""
    return TargetEntry(
        address=normalise_address(address), port=port, job=job, node=node, region=region, rack=rack,
        team=team, gpus=gpus, metrics_path=metrics_path, labels=dict(labels or {}),
        explicit_identity=identity,
    )
