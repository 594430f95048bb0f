"""GPU -> pod labels from kubelet's pod-resources gRPC API, refreshed on a background thread.

The adapter for `--pod-attribution kubelet` (the only exporter module that imports
`grpc`; the `podresources` extra). Every `interval` seconds it calls `List` (and
`GetAllocatableResources`) on kubelet's unix socket, and `exporter.podmap` turns the
answer into GPU UUID -> label sets; scrapes read the last map and never wait on kubelet.

Staleness, said out loud instead of lying:
- start-up never waits on kubelet: the first `List` runs on the thread;
- each call has its own timeout (`--pod-resources-timeout`, 10 s as dcgm-exporter allows: a
  List that takes 5 s on a busy kubelet always hit the former 5 s and never landed); the
  next refresh waits `interval` after the last one ends, so slow calls never overlap and a
  cycle (List + GetAllocatableResources, 2 x 10 s, + 10 s) stays within `max_age` (60 s);
  the channel's reconnect
  backoff is capped (`backoff_cap`, default 5 s; gRPC's default grows to 120 s), so a
  restarted kubelet is read again within about one interval plus the cap;
- a failed refresh keeps the last map and counts the error by gRPC status code; once the
  last good answer is older than `max_age` (`--pod-resources-max-age`), the map is
  dropped (series lose their pod labels) and `status().stale` is set;
- answers up to `max_message_bytes` (16 MiB, as dcgm-exporter's client allows) are read;
  gRPC's default of 4 MiB fails on nodes with many containers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import grpc

from exporter import podmap
from exporter.errors import BackendError
from exporter.models import AttributionStatus, PodLabels
from exporter.podresources_messages import RPCS, SERVICE, message

log = logging.getLogger(__name__)
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class SliceSource(Protocol):
    """The node's ResourceSlices as a device index (`exporter.resourceslices.ResourceSliceWatch`)."""

    def devices(self) -> Mapping[podmap.SliceKey, podmap.DraDevice]: ...

    def close(self) -> None: ...


class PodResourcesError(BackendError):
    """A pod-resources call failed; `code` is the gRPC status code name (e.g. UNAVAILABLE)."""

    def __init__(self, method: str, code: str) -> None:
        super().__init__(f"kubelet pod-resources {method} failed: {code}")
        self.code = code


class PodResourcesClient:
    """Kubelet's PodResourcesLister over a unix socket: `list`, `get` and `allocatable`."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout: float = 10.0, backoff_cap: float = 5.0,
                 max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        cap_ms = max(100, int(backoff_cap * 1000))
        self._channel = grpc.insecure_channel(f"unix://{socket_path}", options=[
            ("grpc.initial_reconnect_backoff_ms", min(500, cap_ms)),
            ("grpc.min_reconnect_backoff_ms", min(500, cap_ms)),
            ("grpc.max_reconnect_backoff_ms", cap_ms),
            ("grpc.max_receive_message_length", max_message_bytes),
        ])
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
            raise PodResourcesError(name, exc.code().name) from exc

    def list(self) -> list[Any]:
        """Every pod with resources on this node."""
        return list(self._call("List", message("ListPodResourcesRequest")()).pod_resources)

    def get(self, *, namespace: str, pod: str) -> Any:
        """One pod's resources (kubelet 1.34+ serves Get by default)."""
        request = message("GetPodResourcesRequest")(pod_name=pod, pod_namespace=namespace)
        return self._call("Get", request).pod_resources

    def allocatable(self) -> Any:
        """Every device kubelet can allocate on this node (`AllocatableResourcesResponse`)."""
        return self._call("GetAllocatableResources", message("AllocatableResourcesRequest")())

    def close(self) -> None:
        self._channel.close()


class KubeletPodAttribution:
    """`PodAttribution` from kubelet: one `List` per interval on its own thread."""

    def __init__(self, client: PodResourcesClient, *, gpus: podmap.NodeGpus | None = None,
                 slices: SliceSource | None = None, interval: float = 10.0, max_age: float = 60.0,
                 clock: Callable[[], float] = time.time, start: bool = True) -> None:
        self._client = client
        self._gpus = gpus or podmap.NodeGpus()
        self._slices = slices
        self._interval, self._max_age, self._clock = interval, max_age, clock
        self._labels: PodLabels = {}
        self._allocatable: dict[str, int] = {}
        self._allocatable_unimplemented = False
        self._errors: dict[str, int] = {}
        self._last_success: float | None = None
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-resources", daemon=True)
        if start:
            self._thread.start()

    def refresh(self) -> bool:
        """One List (and GetAllocatableResources); the map is replaced whole."""
        try:
            pods = self._client.list()
        except PodResourcesError as exc:
            self._count(exc.code)
            if not self._failing:
                log.warning("pod attribution refresh failed error=%r (labels kept until max age)", str(exc))
            self._failing = True
            return False
        slices = self._slices.devices() if self._slices is not None else {}
        labels = podmap.gpu_labels(pods, gpus=self._gpus, slices=slices)
        self._refresh_allocatable()  # first, so a reader that sees the new map sees its allocatable too
        self._labels = labels
        self._last_success = self._clock()
        self._failing = False
        return True

    def _refresh_allocatable(self) -> None:
        if self._allocatable_unimplemented:
            return
        try:
            self._allocatable = podmap.allocatable_gpus(self._client.allocatable())
        except PodResourcesError as exc:
            if exc.code == "UNIMPLEMENTED":  # kubelet without the feature: ask once
                self._allocatable_unimplemented = True
                return
            self._count(exc.code)

    def _count(self, code: str) -> None:
        # replaced whole, never mutated: status() copies it from another thread
        self._errors = {**self._errors, code: self._errors.get(code, 0) + 1}

    def _run(self) -> None:
        self.refresh()
        while not self._stop.wait(self._interval):
            self.refresh()

    def _stale(self) -> bool:
        last = self._last_success
        return last is not None and self._clock() - last > self._max_age

    def labels(self) -> PodLabels:
        return {} if self._stale() else self._labels

    def status(self) -> AttributionStatus:
        return AttributionStatus(last_success=self._last_success, stale=self._stale(),
                                 errors=dict(self._errors), allocatable=dict(self._allocatable))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._client.close()
        if self._slices is not None:
            self._slices.close()
