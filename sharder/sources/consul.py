"""Consul source: blocking queries on ``/v1/health/service/<name>`` -> targets.

The only sharder module that imports py-consul. One blocking loop per (service,
datacenter); each keeps its own ``X-Consul-Index`` by Consul's documented rules:
reset to 0 when the index goes backwards, never below 1 once blocking, and at least
``min_interval_s`` between two requests so an index that does not move never spins.
Errors back off exponentially with jitter and keep the last good set.

**Mapping.** Each health entry is flattened into the labels Prometheus' consul_sd would
give it (``__meta_consul_service_address``, ``__meta_consul_service_metadata_<key>``,
``__meta_consul_metadata_<key>`` for node Meta, ``__meta_consul_tags``, ...). Every
target field reads the first non-empty label of its list in :class:`ConsulMapping`;
the defaults read what ``gpufed-exporter`` registers (Meta region/rack/team/gpu_count/
metrics_path/node). Every entry then goes through the inventory validation
(``sharder.sources.lastknown.parse_entries``); an entry that fails is skipped and counted
(``invalid_target``) while the good entries of the same answer are kept.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import consul
import requests

from sharder.model.inventory import Target
from sharder.model.spec import JobSpec
from sharder.sources.base import Backoff, DiscoverySink
from sharder.sources.entries import NotAList, decode_answer
from sharder.sources.lastknown import parse_entries

log = logging.getLogger(__name__)
PREFIX = "__meta_consul_"


@dataclass(frozen=True)
class ConsulMapping:
    """Target field -> ``__meta_consul_*`` labels tried in order (first non-empty wins)."""

    address: tuple[str, ...] = ("__meta_consul_service_address", "__meta_consul_address")
    port: tuple[str, ...] = ("__meta_consul_service_port",)
    node: tuple[str, ...] = ("__meta_consul_service_metadata_node", "__meta_consul_node")
    region: tuple[str, ...] = ("__meta_consul_service_metadata_region", "__meta_consul_metadata_region")
    rack: tuple[str, ...] = (
        "__meta_consul_service_metadata_rack",
        "__meta_consul_service_metadata_zone",
        "__meta_consul_metadata_rack",
    )
    team: tuple[str, ...] = ("__meta_consul_service_metadata_team", "__meta_consul_metadata_team")
    gpus: tuple[str, ...] = ("__meta_consul_service_metadata_gpu_count", "__meta_consul_metadata_gpu_count")
    metrics_path: tuple[str, ...] = ("__meta_consul_service_metadata_metrics_path",)
    job: tuple[str, ...] = ("__meta_consul_service_metadata_job",)
    identity: tuple[str, ...] = ("__meta_consul_service_metadata_identity",)
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra target label -> one ``__meta_consul_*`` label."""
    default_job: str = "gpu"
    default_region: str = ""
    """Used when no region label is set (e.g. the datacenter name via ``__meta_consul_dc``)."""


@dataclass(frozen=True)
class ConsulConfig:
    services: tuple[str, ...] = ("gpufed-exporter",)
    address: str | None = None
    """``host:port`` or a URL; None: ``CONSUL_HTTP_ADDR``, else 127.0.0.1:8500."""
    token: str | None = None
    """ACL token; None: ``CONSUL_HTTP_TOKEN``."""
    datacenters: tuple[str | None, ...] = (None,)
    tag: str | None = None
    allow_warning: bool = False
    """Whether a service whose worst check is ``warning`` counts as up."""
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    wait: str = "30s"
    min_interval_s: float = 0.1
    timeout_s: float = 10.0
    mapping: ConsulMapping = field(default_factory=ConsulMapping)


def split_address(address: str) -> tuple[str, str, int]:
    """``[scheme://]host[:port]`` -> (scheme, host, port)."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "http", address
    rest = rest.rstrip("/")
    host, colon, port = rest.rpartition(":")
    if not colon or "]" in port:
        return scheme, rest.strip("[]"), 8500
    return scheme, host.strip("[]"), int(port)


def make_client(config: ConsulConfig) -> consul.Consul:
    address = config.address or os.environ.get("CONSUL_HTTP_ADDR") or "127.0.0.1:8500"
    scheme, host, port = split_address(address)
    if config.ca_file or config.cert_file:
        scheme = "https"
    cert = (config.cert_file, config.key_file) if config.cert_file and config.key_file else config.cert_file
    client = consul.Consul(
        host=host, port=port, scheme=scheme, verify=config.ca_file or True, cert=cert, dc=None
    )
    client.http.connections_timeout = config.timeout_s
    # py-consul lets CONSUL_HTTP_TOKEN override an explicit token; the CLI flag should win.
    client.token = config.token or os.environ.get("CONSUL_HTTP_TOKEN")
    return client


def health_status(checks: Sequence[Any]) -> str:
    """The worst status among an entry's checks, as ``__meta_consul_health`` reports it."""
    order = {"passing": 0, "warning": 1, "critical": 2, "maintenance": 3}
    worst = "passing"
    for check in checks:
        status = check.get("Status", "critical") if isinstance(check, dict) else "critical"
        if order.get(status, 2) > order[worst]:
            worst = status if status in order else "critical"
    return worst


def meta_labels(entry: Mapping[str, Any], *, dc: str) -> dict[str, str]:
    """One health entry as the ``__meta_consul_*`` labels consul_sd would attach."""
    node = entry.get("Node") or {}
    service = entry.get("Service") or {}
    labels = {
        f"{PREFIX}address": str(node.get("Address") or ""),
        f"{PREFIX}dc": str(node.get("Datacenter") or dc),
        f"{PREFIX}node": str(node.get("Node") or ""),
        f"{PREFIX}health": health_status(entry.get("Checks") or []),
        f"{PREFIX}service": str(service.get("Service") or ""),
        f"{PREFIX}service_id": str(service.get("ID") or ""),
        f"{PREFIX}service_address": str(service.get("Address") or ""),
        f"{PREFIX}service_port": str(service.get("Port") if service.get("Port") is not None else ""),
        f"{PREFIX}tags": "," + ",".join(map(str, service.get("Tags") or [])) + ",",
    }
    for key, value in (node.get("Meta") or {}).items():
        labels[f"{PREFIX}metadata_{key}"] = str(value)
    for key, value in (node.get("TaggedAddresses") or {}).items():
        labels[f"{PREFIX}tagged_address_{key}"] = str(value)
    for key, value in (service.get("Meta") or {}).items():
        labels[f"{PREFIX}service_metadata_{key}"] = str(value)
    return labels


def target_document(labels: Mapping[str, str], mapping: ConsulMapping) -> dict[str, Any]:
    """An inventory ``targets`` entry built from the labels; validation happens later."""

    def first(names: Sequence[str]) -> str:
        return next((labels[n] for n in names if labels.get(n)), "")

    doc: dict[str, Any] = {"job": first(mapping.job) or mapping.default_job}
    region = first(mapping.region) or mapping.default_region
    if region:
        doc["region"] = region
    for name in ("address", "port", "node", "rack", "team", "gpus", "metrics_path", "identity"):
        value = first(getattr(mapping, name))
        if value:
            doc[name] = value
    path = doc.get("metrics_path")
    if "identity" not in doc and path and path != "/metrics" and "address" in doc:
        # Several nodes behind one listener (exporter fleet mode) share address:port.
        host = f"[{doc['address']}]" if ":" in doc["address"] else doc["address"]
        doc["identity"] = f"{host}:{doc.get('port', '')}{path}"
    extra = {name: labels[src] for name, src in mapping.labels.items() if labels.get(src)}
    if extra:
        doc["labels"] = extra
    return doc


class _Watch:
    """Blocking-query state of one (service, datacenter)."""

    def __init__(self, service: str, dc: str | None) -> None:
        self.service, self.dc = service, dc
        self.index = 0
        self.targets: list[Target] = []
        self.ok = False
        self.answered = False
        """A query has ended, the set pushed or the error told (``ConsulSource.answered``)."""
        self.last_request = float("-inf")
        self.cache: dict[bytes, tuple[Target | None, str]] = {}

    @property
    def key(self) -> str:
        return f"{self.service}@{self.dc or 'local'}"

    def advance(self, header: Any) -> None:
        """Consul's rules for the next ``index`` from the ``X-Consul-Index`` just received."""
        try:
            new = int(header)
        except (TypeError, ValueError):
            new = 0
        if new < self.index:
            self.index = 0  # went backwards (snapshot restore, new leader): start over
        else:
            self.index = max(new, 1)


_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (consul.ACLPermissionDenied, "acl_denied"),
    (consul.ACLDisabled, "acl_denied"),
    (requests.Timeout, "timeout"),
    (requests.ConnectionError, "unreachable"),
    (requests.RequestException, "unreachable"),
    (OSError, "unreachable"),
)


def error_reason(exc: BaseException) -> str:
    for kind, reason in _REASONS:
        if isinstance(exc, kind):
            return reason
    text = str(exc)
    if text.startswith("Failed to decode JSON"):
        return "invalid_json"
    if text.startswith("Missing index header"):
        return "missing_index"
    if text[:1] == "5":
        return "server_error"
    return "client_error"


class ConsulSource:
    """Follows services in Consul and pushes their healthy instances to a sink."""

    def __init__(
        self,
        config: ConsulConfig,
        *,
        sink: DiscoverySink,
        name: str = "consul",
        client: consul.Consul | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff: Callable[[], Backoff] = Backoff,
        jobs: Mapping[str, JobSpec] | None = None,
    ) -> None:
        self.config = config
        self.jobs = jobs
        self.name = name
        self._sink = sink
        self._client = client or make_client(config)
        self._clock = clock
        self._backoff_factory = backoff
        self.watches = [_Watch(s, dc) for s in config.services for dc in config.datacenters]
        self.last_error = ""

    def poll_once(
        self, watch: _Watch | None = None, *, sleep: Callable[[float], object] = time.sleep
    ) -> bool:
        """One blocking query on ``watch`` (the first by default); True if it succeeded."""
        watch = watch or self.watches[0]
        try:
            return self._poll(watch, sleep=sleep)
        finally:
            watch.answered = True  # after the sink took the set (or the error)

    def _poll(self, watch: _Watch, *, sleep: Callable[[float], object]) -> bool:
        gap = watch.last_request + self.config.min_interval_s - self._clock()
        if gap > 0:
            sleep(gap)  # never spin on an index that does not move
        watch.last_request = self._clock()
        try:
            header, body = self._query(watch)
        except (consul.ConsulException, requests.RequestException, OSError, ValueError) as exc:
            return self._fail(watch, error_reason(exc), f"{watch.key}: {exc}")
        try:
            keys, parsed = decode_answer(body, known=watch.cache, convert=partial(self._parse, watch=watch))
        except NotAList as exc:
            return self._fail(watch, "invalid_answer", f"{watch.key}: {exc}")
        except ValueError as exc:
            return self._fail(watch, "invalid_json", f"{watch.key}: Failed to decode JSON: {exc}")
        watch.advance(header)
        watch.targets = self._targets(watch, keys, parsed)
        watch.ok = True
        self.last_error = ""
        self._push(watch)
        return True

    def _query(self, watch: _Watch) -> tuple[str | None, bytes]:
        """GET /v1/health/service/<name> through py-consul's HTTP client, body undecoded."""
        params: list[tuple[str, Any]] = []
        if watch.index:
            params += [("index", watch.index), ("wait", self.config.wait)]
        if not self.config.allow_warning:
            params.append(("passing", "1"))
        if self.config.tag:
            params.append(("tag", self.config.tag))
        if watch.dc:
            params.append(("dc", watch.dc))
        path = f"/v1/health/service/{watch.service}"
        headers = self._client.prepare_headers()
        answer: tuple[str | None, bytes] = self._client.http.get(
            _raw_answer, path, params=params, headers=headers, raw=True
        )
        return answer

    @property
    def answered(self) -> bool:
        """Every (service, datacenter) has answered or failed once (``Source.answered``)."""
        return all(watch.answered for watch in self.watches)

    def run(self, stop: threading.Event) -> None:
        """One thread per (service, datacenter) until ``stop`` is set."""
        threads = [
            threading.Thread(target=self._follow, args=(w, stop), name=f"consul-{w.key}", daemon=True)
            for w in self.watches
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _follow(self, watch: _Watch, stop: threading.Event) -> None:
        backoff = self._backoff_factory()
        while not stop.is_set():
            if self.poll_once(watch, sleep=stop.wait):
                backoff.reset()
            else:
                stop.wait(backoff.next())

    def _targets(
        self, watch: _Watch, keys: list[bytes], parsed: Mapping[bytes, tuple[Target | None, str]]
    ) -> list[Target]:
        """Targets of an answer; an entry whose bytes did not change is not decoded again."""
        allowed = ("passing", "warning") if self.config.allow_warning else ("passing",)
        cache: dict[bytes, tuple[Target | None, str]] = {}
        good: list[Target] = []
        bad = 0
        for key in keys:
            hit = watch.cache.get(key) or parsed[key]
            cache[key] = hit
            target, status = hit
            if target is None:
                bad += 1
            elif status in allowed:
                good.append(target)
        watch.cache = cache
        for _ in range(bad):
            self._sink.on_error(self.source_name(watch), "invalid_target")
        return good

    def _parse(self, entry: Any, *, watch: _Watch) -> tuple[Target | None, str]:
        dc, where = watch.dc or "", watch.key
        if not isinstance(entry, dict):
            log.warning("consul entry skipped source=%s error=not an object", where)
            return None, ""
        labels = meta_labels(entry, dc=dc)
        doc = target_document(labels, self.config.mapping)
        service_id = labels[f"{PREFIX}service_id"] or "?"
        good, errors = parse_entries([doc], source=f"consul {where} service {service_id}", jobs=self.jobs)
        for message in errors:
            log.warning("consul entry skipped: %s", message)
        return (good[0] if good else None), labels[f"{PREFIX}health"]

    def source_name(self, watch: _Watch) -> str:
        """One sink source per (service, datacenter), so one unreachable datacenter keeps its
        own last set (and staleness) while the others move on; just ``name`` when single."""
        return self.name if len(self.watches) == 1 else f"{self.name}/{watch.key}"

    def _push(self, watch: _Watch) -> None:
        self._sink.on_change(self.source_name(watch), watch.targets, version=str(watch.index))

    def _fail(self, watch: _Watch, reason: str, message: str) -> bool:
        if message != self.last_error:
            log.warning("consul source keeps its last set reason=%s error=%s", reason, message)
        self.last_error = message
        if reason in ("invalid_json", "missing_index", "invalid_answer"):
            watch.index = 0  # a garbled answer says nothing about the index: ask afresh
        self._sink.on_error(self.source_name(watch), reason)
        return False


def _raw_answer(response: Any) -> tuple[str | None, bytes]:
    """py-consul callback: map error statuses to its exceptions, keep the body as bytes."""
    code, body = response.code, response.body
    text = body[:200].decode("utf-8", "replace") if isinstance(body, bytes) else str(body)[:200]
    if code == 403:
        raise consul.ACLPermissionDenied(text)
    if code == 401:
        raise consul.ACLDisabled(text)
    if code >= 400:
        raise consul.ConsulException(f"{code} {text}")
    index = response.headers.get("X-Consul-Index")
    if index is None:
        raise consul.ConsulException("Missing index header")
    return index, body if isinstance(body, bytes) else str(body).encode()
