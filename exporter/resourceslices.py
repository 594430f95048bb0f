"""The node's DRA ResourceSlices, listed and watched through the `kubernetes` client.

The adapter for `--dra-resource-slices` (the only exporter module that imports
`kubernetes`). It lists `resource.k8s.io/v1` ResourceSlices with
`fieldSelector=spec.nodeName=<node>`, then watches from the list's resourceVersion and
keeps the objects current; `devices()` answers the (driver, pool, device) -> GPU index
that `exporter.podmap.slice_devices` builds from them, rebuilt on each change. A failed
list or watch keeps the last objects and retries after a capped backoff; a 410 (expired
resourceVersion) relists. This is what dcgm-exporter's DRAResourceSliceManager does
with an informer; the exporter needs `list` and `watch` on `resourceslices` (the Helm
chart's ClusterRole grants them when DRA attribution is on).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import kubernetes
from kubernetes.watch.watch import iter_resp_lines

from exporter import podmap

log = logging.getLogger(__name__)


def api_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig (`$KUBECONFIG`, read
    now: the client reads it once, when it is imported)."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    else:
        kubernetes.config.load_kube_config(config_file=kubeconfig or os.environ.get("KUBECONFIG"),
                                           client_configuration=configuration)
    return kubernetes.client.ApiClient(configuration)


class ResourceSliceWatch:
    """List + watch of one node's ResourceSlices on a thread; `devices()` never blocks."""

    def __init__(self, client: kubernetes.client.ApiClient, *, node: str, watch_timeout_s: int = 300,
                 backoff_cap: float = 30.0, start: bool = True) -> None:
        self._api = kubernetes.client.ResourceV1Api(client)
        self._selector = f"spec.nodeName={node}"
        self._watch_timeout_s = watch_timeout_s
        self._backoff_cap = backoff_cap
        self._objects: dict[str, dict[str, Any]] = {}
        self._version: str | None = None
        self._devices: Mapping[podmap.SliceKey, podmap.DraDevice] = {}
        self._response: Any = None
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resource-slices", daemon=True)
        if start:
            self._thread.start()

    def devices(self) -> Mapping[podmap.SliceKey, podmap.DraDevice]:
        return self._devices

    def _rebuild(self) -> None:
        self._devices = podmap.slice_devices(self._objects.values())

    def relist(self) -> None:
        response: Any = self._api.list_resource_slice(field_selector=self._selector, _preload_content=False)
        body = json.loads(response.data)
        self._objects = {o["metadata"]["name"]: o for o in body.get("items") or []}
        self._version = str((body.get("metadata") or {}).get("resourceVersion") or "") or None
        self._rebuild()

    def _events(self) -> Iterator[dict[str, Any]]:
        response: Any = self._api.list_resource_slice(
            field_selector=self._selector, watch=True, resource_version=self._version,
            allow_watch_bookmarks=True, timeout_seconds=self._watch_timeout_s, _preload_content=False)
        self._response = response
        try:
            for line in iter_resp_lines(response):
                if line.strip():
                    yield json.loads(line)
        finally:
            response.release_conn()

    def watch_once(self) -> None:
        """One watch request until the server ends it; raises on failure."""
        for event in self._events():
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                self._version = None  # 410 Expired or another error: relist next
                raise RuntimeError(f"resourceslices watch: {obj.get('code')} {obj.get('message')}")
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self._version = str(version)
            name = (obj.get("metadata") or {}).get("name", "")
            if kind in ("ADDED", "MODIFIED"):
                self._objects[name] = obj
            elif kind == "DELETED":
                self._objects.pop(name, None)
            else:
                continue
            self._rebuild()

    def _run(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                if self._version is None:
                    self.relist()
                self.watch_once()
                delay = 0.5
            except Exception as exc:  # the client's errors are many; keep the last slices, retry
                if self._stop.is_set():
                    return  # close() shut the watch's socket
                self.errors += 1
                self._version = None
                log.warning("resourceslices list/watch failed error=%r retry_s=%.1f", str(exc), delay)
                if self._stop.wait(delay):
                    return
                delay = min(self._backoff_cap, delay * 2)

    def close(self) -> None:
        """Stop the thread: shutting the watch's socket ends a watch in flight."""
        self._stop.set()
        response = self._response
        if response is not None:
            shutdown = getattr(response, "shutdown", None)  # urllib3 >= 2.3
            (shutdown or response.close)()
        self._thread.join(timeout=5)
        self._api.api_client.close()
