"""Who a GPU belongs to: node name, placement labels, and (optionally) the pods using it.

Node name comes from `NODE_NAME` (the Kubernetes downward API) or the host name; region,
rack, team and cluster come from settings and ride on every series. GPU -> pod mapping is
behind `PodAttribution`, refreshed in the background by the implementation and read once
per collection, never per scrape (per-scrape pod mapping is what made dcgm-exporter
scrapes time out). The default maps nothing.

The kubelet pod-resources implementation (`exporter.kubelet_podresources`) needs
`grpcio` and `protobuf`, the optional `podresources` extra; DRA devices are resolved
through the node's ResourceSlices (`exporter.resourceslices`, the `kubernetes` client)
when `dra_resource_slices` is on. Both are imported only when chosen, so the exporter
runs without them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Protocol

from exporter.errors import ConfigError
from exporter.models import AttributionStatus, GpuDevice, MigSlice, PodLabels

PLACEMENT_KEYS = ("region", "rack", "team", "cluster")


class PodAttribution(Protocol):
    """GPU UUID -> pod label sets (`namespace`, `pod`, `container`, ...), kept fresh in
    background; one label set per pod holding the GPU."""

    def labels(self) -> PodLabels:
        """The latest mapping; must return immediately."""
        ...

    def status(self) -> AttributionStatus | None:
        """How fresh the mapping is; None when there is nothing to say (no attribution)."""
        ...

    def close(self) -> None:
        """Stop any background refresh."""
        ...


class NoPodAttribution:
    """The default: no pod labels; the exporter is complete without them."""

    def labels(self) -> PodLabels:
        return {}

    def status(self) -> AttributionStatus | None:
        return None

    def close(self) -> None:
        """Nothing to stop."""


def pod_attribution(kind: str, *, socket_path: str = "", interval: float = 10.0, timeout: float = 5.0,
                    max_age: float = 60.0, backoff_cap: float = 5.0, devices: tuple[GpuDevice, ...] = (),
                    migs: tuple[MigSlice, ...] = (), resource_slices: bool = False,
                    node: str = "") -> PodAttribution:
    """The attribution named in settings; `kubelet` needs the `podresources` extra, and
    `resource_slices` the `kubernetes` client (in gpufed's runtime dependencies)."""
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
        from exporter import podmap

        slices = None
        if resource_slices:
            from exporter import resourceslices

            slices = resourceslices.ResourceSliceWatch(resourceslices.api_client(), node=node)
        client = kubelet_podresources.PodResourcesClient(
            socket_path or kubelet_podresources.DEFAULT_SOCKET, timeout=timeout, backoff_cap=backoff_cap)
        return kubelet_podresources.KubeletPodAttribution(
            client, gpus=podmap.node_gpus(devices, migs), slices=slices, interval=interval, max_age=max_age)
    raise ConfigError(f"unknown pod attribution {kind!r}; known: none, kubelet")


def node_name(explicit: str | None = None, *, environ: Mapping[str, str] | None = None) -> str:
    """Setting, then `NODE_NAME`, then the short host name."""
    env = os.environ if environ is None else environ
    return explicit or env.get("NODE_NAME") or socket.gethostname().split(".")[0]


def placement_labels(**values: str) -> dict[str, str]:
    """Only the placement labels that are set, in a fixed order."""
    return {key: values[key] for key in PLACEMENT_KEYS if values.get(key)}
