"""Who a GPU belongs to: node name, placement labels, and (optionally) the pod using it.

Node name comes from `NODE_NAME` (the Kubernetes downward API) or the host name; region,
rack, team and cluster come from settings and ride on every series. GPU -> pod mapping is
behind `PodAttribution`, refreshed in the background by the implementation and read once
per collection, never per scrape (per-scrape pod mapping is what made dcgm-exporter
scrapes time out). The default maps nothing.

The kubelet pod-resources implementation (`exporter.kubelet_podresources`) needs
`grpcio` and `protobuf`, the optional `podresources` extra; it is imported only when
chosen, so the exporter runs without them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Protocol

from exporter.errors import ConfigError

PLACEMENT_KEYS = ("region", "rack", "team", "cluster")


class PodAttribution(Protocol):
    """GPU UUID -> pod labels (`namespace`, `pod`, `container`), kept fresh in background."""

    def labels(self) -> Mapping[str, Mapping[str, str]]:
        """The latest mapping; must return immediately."""
        ...

    def close(self) -> None:
        """Stop any background refresh."""
        ...


class NoPodAttribution:
    """The default: no pod labels; the exporter is complete without them."""

    def labels(self) -> Mapping[str, Mapping[str, str]]:
        return {}

    def close(self) -> None:
        """Nothing to stop."""


def pod_attribution(kind: str, *, socket_path: str = "", interval: float = 10.0) -> PodAttribution:
    """The attribution named in settings; `kubelet` needs the `podresources` extra."""
    if kind == "none":
        return NoPodAttribution()
    if kind == "kubelet":
        try:
            from exporter import kubelet_podresources  # optional extra, not a gpufed dependency
        except ImportError as exc:
            raise ConfigError(
                "pod attribution 'kubelet' needs grpcio and protobuf (pip install 'gpufed[podresources]'); "
                f"missing: {exc.name}"
            ) from exc
        client = kubelet_podresources.PodResourcesClient(socket_path or kubelet_podresources.DEFAULT_SOCKET)
        return kubelet_podresources.KubeletPodAttribution(client, interval=interval)
    raise ConfigError(f"unknown pod attribution {kind!r}; known: none, kubelet")


def node_name(explicit: str | None = None, *, environ: Mapping[str, str] | None = None) -> str:
    """Setting, then `NODE_NAME`, then the short host name."""
    env = os.environ if environ is None else environ
    return explicit or env.get("NODE_NAME") or socket.gethostname().split(".")[0]


def placement_labels(**values: str) -> dict[str, str]:
    """Only the placement labels that are set, in a fixed order."""
    return {key: values[key] for key in PLACEMENT_KEYS if values.get(key)}
