"""Self-registration: what we tell the service registry, and a loop that keeps it told.

`service_definition` is pure (ID, tags, Meta within Consul's limits, HTTP check).
`Registrar` registers every definition, then every `interval` lists the agent's services
and re-registers any it forgot (anti-entropy: a restarted agent gets us back), backs off
exponentially while the agent is unreachable, and deregisters on stop. The registry is a
small Protocol; `exporter.consul_registry` is the only implementation that talks to Consul.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from exporter.errors import RegistryError

log = logging.getLogger(__name__)

META_MAX_KEYS = 64
META_MAX_KEY_LEN = 128
META_MAX_VALUE_LEN = 512
_META_KEY_BAD = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class ServiceDefinition:
    """One Consul service for one exporter (or one simulated node in fleet mode)."""

    service_id: str
    name: str
    address: str
    port: int
    tags: tuple[str, ...] = ("gpu", "prometheus")
    meta: Mapping[str, str] = field(default_factory=dict)
    check_path: str = "/healthz"
    check_interval: str = "10s"
    check_timeout: str = "2s"
    deregister_after: str = "5m"

    @property
    def check_url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}{self.check_path}"


class ServiceRegistry(Protocol):
    """The few registry calls the registrar needs; errors surface as `RegistryError`."""

    def register(self, service: ServiceDefinition) -> None: ...

    def deregister(self, service_id: str) -> None: ...

    def service_ids(self) -> set[str]: ...


def clean_meta(meta: Mapping[str, object]) -> dict[str, str]:
    """Meta that Consul accepts: 64 keys, keys [A-Za-z0-9_-] <= 128 chars, values <= 512."""
    cleaned: dict[str, str] = {}
    for raw_key in sorted(meta):
        key = _META_KEY_BAD.sub("_", str(raw_key))[:META_MAX_KEY_LEN]
        if not key or key.startswith("consul-") or key in cleaned:
            continue  # "consul-" is reserved by Consul itself
        if len(cleaned) == META_MAX_KEYS:
            log.warning("consul meta truncated to %d keys", META_MAX_KEYS)
            break
        cleaned[key] = str(meta[raw_key])[:META_MAX_VALUE_LEN]
    return cleaned


def service_id(name: str, host: str, port: int) -> str:
    """`name-host-port`, with characters Consul IDs and URLs dislike replaced."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{name}-{host}-{port}")


def service_definition(
    name: str,
    host: str,
    *,
    address: str,
    port: int,
    meta: Mapping[str, object],
    check_path: str = "/healthz",
    check_interval: str = "10s",
    check_timeout: str = "2s",
    deregister_after: str = "5m",
) -> ServiceDefinition:
    return ServiceDefinition(
        service_id=service_id(name, host, port),
        name=name,
        address=address,
        port=port,
        meta=clean_meta(meta),
        check_path=check_path,
        check_interval=check_interval,
        check_timeout=check_timeout,
        deregister_after=deregister_after,
    )


class Registrar:
    """Background registration with anti-entropy and backoff; `stop()` deregisters."""

    def __init__(
        self,
        registry: ServiceRegistry,
        services: Sequence[ServiceDefinition],
        *,
        interval: float = 30.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
    ) -> None:
        self._registry = registry
        self._services = list(services)
        self._interval = interval
        self._backoff_initial, self._backoff_max = backoff_initial, backoff_max
        self._stop = threading.Event()
        self._synced_once = False
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="registrar", daemon=True)

    def sync_once(self) -> bool:
        """Register what the agent lacks (everything, the first time). True on success."""
        try:
            known = self._registry.service_ids() if self._synced_once else set()
            missing = [s for s in self._services if s.service_id not in known]
            for service in missing:
                self._registry.register(service)
        except RegistryError as exc:
            self.failures += 1
            log.warning("registration failed error=%r", str(exc))
            return False
        if missing and self._synced_once:
            log.info("re-registered forgotten services count=%d", len(missing))
        elif missing:
            log.info("registered services count=%d", len(missing))
        self._synced_once = True
        return True

    def _run(self) -> None:
        delay = self._backoff_initial
        while not self._stop.is_set():
            if self.sync_once():
                delay = self._backoff_initial
                wait = self._interval
            else:
                wait, delay = delay, min(delay * 2, self._backoff_max)
            self._stop.wait(wait)

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, deregister: bool = True) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if not deregister:
            return
        for service in self._services:
            try:
                self._registry.deregister(service.service_id)
            except RegistryError as exc:
                log.warning("deregistration failed service_id=%s error=%r", service.service_id, str(exc))
