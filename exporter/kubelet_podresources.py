"""GPU -> pod labels from kubelet's pod-resources gRPC API, refreshed on a background thread.

The adapter for `--pod-attribution kubelet` (the only exporter module that imports
`grpc`; the `podresources` extra). Every `interval` seconds it calls `List` on kubelet's
unix socket and rebuilds the whole map; scrapes read the last map and never wait on
kubelet. A failed refresh keeps the previous map (pods rarely move in 10 s, an empty map
would blank every pod label) and is logged once per failure streak.

Two ways a GPU reaches a container, both in one `List` answer:
- device plugin: `devices[].device_ids` of resource `nvidia.com/gpu` (and MIG
  resources) are GPU UUIDs, `GPU-...::N` under time-slicing, or MIG ids;
- DRA: `dynamic_resources[].claim_resources[].cdi_devices[].name`, a CDI name whose
  device part carries the GPU UUID for NVIDIA's DRA driver; the claim's name and
  namespace become `claim_name`/`claim_namespace`.
A device whose id names no GPU UUID (another vendor, a CDI name without one) is skipped.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import grpc

from exporter.errors import BackendError
from exporter.podresources_messages import RPCS, SERVICE, message

log = logging.getLogger(__name__)
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
_GPU_ID = re.compile(r"(GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}|MIG-[0-9a-fA-F-]{36})")


def gpu_id(device_id: str) -> str | None:
    """The GPU (or MIG) UUID inside a device-plugin id or CDI name, if any."""
    found = _GPU_ID.search(device_id)
    return found.group(1) if found else None


def gpu_labels(pods: Iterable[Any]) -> dict[str, dict[str, str]]:
    """GPU UUID -> labels of the container holding it; the first container in sort order wins."""
    out: dict[str, dict[str, str]] = {}
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        for container in sorted(pod.containers, key=lambda c: c.name):
            base = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
            for devices in container.devices:
                for device in devices.device_ids:
                    uuid = gpu_id(device)
                    if uuid:
                        out.setdefault(uuid, dict(base))
            for claim in container.dynamic_resources:
                claimed = {**base, "claim_name": claim.claim_name,
                           "claim_namespace": claim.claim_namespace or pod.namespace}
                for resource in claim.claim_resources:
                    for cdi in resource.cdi_devices:
                        uuid = gpu_id(cdi.name)
                        if uuid:
                            out.setdefault(uuid, dict(claimed))
    return out


class PodResourcesClient:
    """Kubelet's PodResourcesLister over a unix socket: `list()` and `get()`."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout: float = 5.0) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self._timeout = timeout
        self._calls = {
            name: self._channel.unary_unary(
                SERVICE + name,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=message(resp).FromString,
            )
            for name, (_, resp) in RPCS.items()
        }

    def _call(self, name: str, request: Any) -> Any:
        try:
            return self._calls[name](request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise BackendError(f"kubelet pod-resources {name} failed: {exc.code().name}") from exc

    def list(self) -> list[Any]:
        """Every pod with resources on this node."""
        return list(self._call("List", message("ListPodResourcesRequest")()).pod_resources)

    def get(self, *, namespace: str, pod: str) -> Any:
        """One pod's resources (kubelet 1.34+ serves Get by default)."""
        request = message("GetPodResourcesRequest")(pod_name=pod, pod_namespace=namespace)
        return self._call("Get", request).pod_resources

    def close(self) -> None:
        self._channel.close()


class KubeletPodAttribution:
    """`PodAttribution` from kubelet: one `List` per interval on its own thread."""

    def __init__(self, client: PodResourcesClient, *, interval: float = 10.0) -> None:
        self._client = client
        self._interval = interval
        self._labels: Mapping[str, Mapping[str, str]] = {}
        self._failing = False
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="pod-resources", daemon=True)
        self._thread.start()

    def refresh(self) -> bool:
        """One List; the map is replaced whole, so readers never see half of it."""
        try:
            self._labels = gpu_labels(self._client.list())
        except BackendError as exc:
            if not self._failing:
                log.warning("pod attribution refresh failed error=%r", str(exc))
            self._failing = True
            return False
        self._failing = False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.refresh()

    def labels(self) -> Mapping[str, Mapping[str, str]]:
        return self._labels

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._client.close()
