"""Kubernetes source: exporter endpoints (EndpointSlices or Pods) joined with Nodes.

The only sharder module that imports the official ``kubernetes`` client. Two streams
are followed, each by list-then-watch with ``resourceVersion`` bookkeeping:

* the exporters: EndpointSlices labelled ``kubernetes.io/service-name=<service>``, or
  Pods matching ``pod_selector``; only ready endpoints/pods by default;
* Nodes, for topology labels (``topology.kubernetes.io/region``/``zone`` by default)
  and the GPU count (``status.allocatable["nvidia.com/gpu"]`` or a node label).

Watches ask for bookmarks (so a quiet stream still advances its resourceVersion) and end
after ``watch_timeout_s``, then resume from the last version. A watch answered with
410 Gone (history compacted), as an ERROR event or as the HTTP status of the watch
request, relists; the known objects are replaced only once the new
list has arrived, so nothing is dropped in between. Other errors back off with jitter.
Raw JSON is used (``_preload_content=False``): the client's model classes are not needed.
Every endpoint becomes an inventory entry validated by ``sharder.sources.lastknown.parse_entries``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes
from kubernetes.watch.watch import iter_resp_lines

from sharder.model.inventory import Target
from sharder.model.spec import JobSpec
from sharder.sources.base import Backoff, DiscoverySink
from sharder.sources.lastknown import Parsed, parse_entries

log = logging.getLogger(__name__)

#: Skipped endpoints kept for ``/v1/status`` (the rest are only counted).
SKIPPED_LIMIT = 50
_WHERE = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class KubernetesConfig:
    namespace: str = "monitoring"
    service: str | None = "gpufed-exporter"
    """Follow this Service's EndpointSlices; None: follow Pods by ``pod_selector``."""
    pod_selector: str = "app.kubernetes.io/name=gpufed-exporter"
    port: str | int = "metrics"
    """Port name (EndpointSlice port / container port) or number."""
    job: str = "gpu"
    region_label: str = "topology.kubernetes.io/region"
    zone_label: str = "topology.kubernetes.io/zone"
    team_label: str = "gpufed.io/team"
    gpu_resource: str = "nvidia.com/gpu"
    gpu_label: str | None = None
    """Read the GPU count from this node label instead of ``status.allocatable``."""
    default_region: str = ""
    """The region of a node without ``region_label`` (kubeadm and bare-metal nodes lack it)."""
    region_map: tuple[tuple[str, str], ...] = ()
    """(label value, spec region) pairs: ACK's ``cn-hangzhou`` or a node pool's name -> a
    ``federation.regions`` name; a value not in the map is taken as it is."""
    ready_only: bool = True
    metrics_path: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    watch_timeout_s: int = 300


def make_api_client(config: KubernetesConfig) -> kubernetes.client.ApiClient:
    """In-cluster credentials when running in a pod, else the kubeconfig."""
    configuration = kubernetes.client.Configuration()
    if config.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    else:
        kubernetes.config.load_kube_config(
            config_file=config.kubeconfig, context=config.context, client_configuration=configuration
        )
    return kubernetes.client.ApiClient(configuration)


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class _Stream:
    """List + watch state of one resource."""

    def __init__(self, kind: str, call: Callable[..., Any]) -> None:
        self.kind = kind
        self.call = call
        self.answered = False
        """One list has ended, pushed or failed (``KubernetesSource.answered``)."""
        self.version: str | None = None
        self.objects: dict[str, dict[str, Any]] = {}
        self.relists = 0

    def relist(self) -> None:
        response = self.call(_preload_content=False)
        body = json.loads(response.data)
        self.objects = {_key(o): o for o in body.get("items") or [] if isinstance(o, dict)}
        self.version = str((body.get("metadata") or {}).get("resourceVersion") or "") or None
        self.relists += 1

    def events(self, *, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Watch from ``version``; yields each change after applying it to ``objects``."""
        try:
            response = self.call(
                watch=True,
                resource_version=self.version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_s,
                _preload_content=False,
            )
        except kubernetes.client.ApiException as exc:
            # The server may refuse the watch itself with HTTP 410 instead of an ERROR event
            # (client-go's reflector handles both); retrying the same version would loop.
            if exc.status == 410:
                raise Gone(exc.reason or "resource version too old") from exc
            raise
        try:
            for line in iter_resp_lines(response):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(obj.get("message", "resource version too old"))
                    raise kubernetes.client.ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.version = str(version)
                if kind in ("ADDED", "MODIFIED"):
                    self.objects[_key(obj)] = obj
                elif kind == "DELETED":
                    self.objects.pop(_key(obj), None)
                yield event
        finally:
            response.release_conn()


class KubernetesSource:
    def __init__(
        self,
        config: KubernetesConfig,
        *,
        sink: DiscoverySink,
        name: str = "kubernetes",
        api_client: kubernetes.client.ApiClient | None = None,
        backoff: Callable[[], Backoff] = Backoff,
        jobs: Mapping[str, JobSpec] | None = None,
        regions: Collection[str] = (),
    ) -> None:
        """``regions``: the spec's regions, so an endpoint whose node maps elsewhere is
        listed in :attr:`skipped` with the label value that put it there."""
        self.config = config
        self.jobs = jobs
        self.regions = frozenset(regions)
        self.skipped: tuple[dict[str, str], ...] = ()
        """At most ``SKIPPED_LIMIT`` endpoints left out of the last set: node, address, reason, detail."""
        self.skipped_total = 0
        self.name = name
        self._sink = sink
        client = api_client or make_api_client(config)
        core = kubernetes.client.CoreV1Api(client)
        if config.service is not None:
            discovery = kubernetes.client.DiscoveryV1Api(client)
            selector = f"kubernetes.io/service-name={config.service}"
            endpoints = _bind(discovery.list_namespaced_endpoint_slice, config.namespace, selector)
            self.endpoints = _Stream("endpointslices", endpoints)
        else:
            pods = _bind(core.list_namespaced_pod, config.namespace, config.pod_selector)
            self.endpoints = _Stream("pods", pods)
        self.nodes = _Stream("nodes", core.list_node)
        self._backoff_factory = backoff
        self._lock = threading.Lock()
        self._parsed: Parsed = {}
        self.last_error = ""

    # ---- steps (tests call these directly) ---------------------------------------------
    def sync(self) -> bool:
        """List both resources and push; on failure the last set stays."""
        return self.relist(self.nodes) and self.relist(self.endpoints)

    def relist(self, stream: _Stream) -> bool:
        try:
            stream.relist()
        except Exception as exc:  # any client failure: keep the last objects, count it
            listed = self._fail(stream, exc)
        else:
            self._push()
            listed = True
        stream.answered = True  # after the sink took the set (or the error)
        return listed

    @property
    def answered(self) -> bool:
        """Both resources were listed (or failed) once: a set pushed after the nodes alone
        holds no endpoint yet (``Source.answered``)."""
        return self.nodes.answered and self.endpoints.answered

    def watch_once(self, stream: _Stream) -> bool:
        """One watch request until the server ends it; False when it failed."""
        if stream.version is None and not self.relist(stream):
            return False
        try:
            for _ in stream.events(timeout_s=self.config.watch_timeout_s):
                self._push()
        except Gone as exc:
            log.info("kubernetes watch expired, relisting kind=%s reason=%s", stream.kind, exc)
            self._sink.on_error(self.name, "gone")
            return self.relist(stream)
        except Exception as exc:
            return self._fail(stream, exc)
        return True

    def poll_once(self) -> None:
        self.sync()

    def run(self, stop: threading.Event) -> None:
        threads = [
            threading.Thread(target=self._follow, args=(s, stop), name=f"k8s-{s.kind}", daemon=True)
            for s in (self.nodes, self.endpoints)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _follow(self, stream: _Stream, stop: threading.Event) -> None:
        backoff = self._backoff_factory()
        while not stop.is_set():
            if self.watch_once(stream):
                backoff.reset()
            else:
                stop.wait(backoff.next())

    # ---- targets -------------------------------------------------------------------------
    def targets(self) -> list[Target]:
        nodes = {o.get("metadata", {}).get("name", ""): o for o in self.nodes.objects.values()}
        entries: list[dict[str, Any]] = []
        for obj in list(self.endpoints.objects.values()):
            rows = _slice_rows(obj, self.config) if self.endpoints.kind == "endpointslices" else _pod_rows(
                obj, self.config
            )
            entries.extend(self._entry(row, nodes.get(row["node"])) for row in rows)
        source = f"kubernetes {self.config.namespace}"
        good, bad = parse_entries(entries, source=source, jobs=self.jobs, cache=self._parsed)
        skipped: list[dict[str, str]] = []
        for message in bad:
            log.warning("kubernetes endpoint skipped: %s", message)
            self._sink.on_error(self.name, "invalid_target")
            where = _WHERE.search(message)
            entry = entries[int(where[1])] if where and int(where[1]) < len(entries) else {}
            skipped.append(self._skip(entry, message))
        if self.regions:
            for target in good:
                if target.region not in self.regions:
                    skipped.append(self._skip({"node": target.node, "address": target.address,
                                               "region": target.region}, ""))
        skipped.sort(key=lambda row: (row["node"], row["address"]))
        self.skipped, self.skipped_total = tuple(skipped[:SKIPPED_LIMIT]), len(skipped)
        return good

    def _skip(self, entry: Mapping[str, Any], message: str) -> dict[str, str]:
        """One row of :attr:`skipped`: which node, and what to set so it is not skipped."""
        c = self.config
        row = {"node": str(entry.get("node") or ""), "address": str(entry.get("address") or "")}
        if entry and not entry.get("region"):
            return {**row, "reason": "no_region", "detail": f"node has no label {c.region_label} and no "
                    "default region: label the node, or set --k8s-default-region (discovery.defaultRegion)"}
        if entry.get("region") and self.regions and entry["region"] not in self.regions:
            return {**row, "reason": "unknown_region", "detail": f"region {entry['region']!r} (node label "
                    f"{c.region_label}) is not in federation.regions {sorted(self.regions)}: map it with "
                    "--k8s-region-map (discovery.regionMap)"}
        return {**row, "reason": "invalid_target", "detail": message}

    def _entry(self, row: dict[str, Any], node: Mapping[str, Any] | None) -> dict[str, Any]:
        c = self.config
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        doc: dict[str, Any] = {"address": row["address"], "port": row["port"], "job": c.job}
        doc["node"] = row["node"]
        value = labels.get(c.region_label)
        region = dict(c.region_map).get(value, value) if value else c.default_region
        if region:
            doc["region"] = region
        if labels.get(c.zone_label):
            doc["rack"] = labels[c.zone_label]
        if labels.get(c.team_label):
            doc["team"] = labels[c.team_label]
        gpus = labels.get(c.gpu_label) if c.gpu_label else (
            ((node or {}).get("status") or {}).get("allocatable") or {}
        ).get(c.gpu_resource)
        if gpus not in (None, ""):
            doc["gpus"] = gpus
        if c.metrics_path:
            doc["metrics_path"] = c.metrics_path
        if row.get("pod"):
            doc["labels"] = {"pod": row["pod"], "namespace": row["namespace"]}
        return doc

    def _push(self) -> None:
        with self._lock:
            targets = self.targets()
            version = f"nodes:{self.nodes.version},{self.endpoints.kind}:{self.endpoints.version}"
            self.last_error = ""
            self._sink.on_change(self.name, targets, version=version)

    def _fail(self, stream: _Stream, exc: Exception) -> bool:
        reason = "unreachable"
        if isinstance(exc, kubernetes.client.ApiException):
            reason = {401: "unauthorized", 403: "forbidden", 410: "gone"}.get(exc.status or 0, "api_error")
        elif isinstance(exc, ValueError):
            reason = "invalid_json"
        message = f"{stream.kind}: {type(exc).__name__}: {exc}"
        if message != self.last_error:
            log.warning("kubernetes source keeps its last set reason=%s error=%s", reason, message)
        self.last_error = message
        self._sink.on_error(self.name, reason)
        return False


def _bind(call: Callable[..., Any], namespace: str, selector: str) -> Callable[..., Any]:
    def bound(**kwargs: Any) -> Any:
        return call(namespace, label_selector=selector, **kwargs)

    return bound


def _port(ports: list[Any], wanted: str | int) -> int | None:
    for port in ports:
        if not isinstance(port, dict):
            continue
        number = port.get("port", port.get("containerPort"))
        if wanted == number or (isinstance(wanted, str) and port.get("name") == wanted):
            return number if isinstance(number, int) else None
    return None


def _slice_rows(obj: Mapping[str, Any], config: KubernetesConfig) -> list[dict[str, Any]]:
    if obj.get("addressType") not in ("IPv4", "IPv6"):
        return []
    port = _port(obj.get("ports") or [], config.port)
    rows = []
    for endpoint in obj.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        # A nil "ready" means unknown, which consumers should take as ready.
        if config.ready_only and conditions.get("ready") is False:
            continue
        ref = endpoint.get("targetRef") or {}
        for address in endpoint.get("addresses") or []:
            rows.append({"address": address, "port": port, "node": endpoint.get("nodeName") or "",
                         "pod": ref.get("name") if ref.get("kind") == "Pod" else None,
                         "namespace": ref.get("namespace") or (obj.get("metadata") or {}).get("namespace")})
    return rows


def _pod_rows(obj: Mapping[str, Any], config: KubernetesConfig) -> list[dict[str, Any]]:
    status, spec, meta = obj.get("status") or {}, obj.get("spec") or {}, obj.get("metadata") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    if (config.ready_only and not ready) or not status.get("podIP") or meta.get("deletionTimestamp"):
        return []
    ports = [p for c in spec.get("containers") or [] for p in c.get("ports") or []]
    port = _port(ports, config.port)
    return [{"address": status["podIP"], "port": port, "node": spec.get("nodeName") or "",
             "pod": meta.get("name"), "namespace": meta.get("namespace")}]
