"""Self-registration: what we tell the service registry, and a loop that keeps it told.

`service_definition` is pure (ID, tags, Meta within Consul's limits, HTTP check).
`Registrar` registers every entry, then keeps the registry told, and deregisters on stop.
How it keeps it told depends on the registry (`Registry.expires_entries`):

- Consul keeps what it was given until told otherwise, so every `interval` the registrar
  lists the agent's services and re-registers any it forgot (anti-entropy: a restarted
  agent gets us back).
- The gpufed controller's registry leases entries (they expire `ttl` after the last PUT),
  so every `interval` the registrar re-registers everything; a PUT is an idempotent refresh.

While the registry is unreachable it backs off exponentially. Many entries (fleet mode)
go out over `workers` threads, and a pass stops at the first failure: a dead registry
fails every call, each after a timeout. The registry is a small generic Protocol;
`exporter.consul_registry` and `exporter.controller_registry` are the only modules that
talk to one.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeAlias, TypeVar, runtime_checkable

from exporter.errors import RegistryError, RegistryRefused

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
    check_tcp: bool = False
    """The exporter serves TLS: the agent's check only connects (Consul presents no client
    certificate, and the scrape's scheme comes from the spec's job, not from here)."""

    @property
    def check_url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}{self.check_path}"

    @property
    def registration_id(self) -> str:
        return self.service_id


class Registered(Protocol):
    """Anything the registrar registers: it is known to the registry by one ID."""

    @property
    def registration_id(self) -> str: ...


E = TypeVar("E", bound=Registered)
E_contra = TypeVar("E_contra", contravariant=True)


class Registry(Protocol[E_contra]):
    """The few registry calls the registrar needs; errors surface as `RegistryError`.

    `expires_entries`: the registry drops an entry that is not re-registered in time, so
    the registrar refreshes every entry each interval instead of listing what is missing.
    """

    @property
    def expires_entries(self) -> bool: ...

    def register(self, service: E_contra) -> None: ...

    def deregister(self, service_id: str) -> None: ...

    def service_ids(self) -> set[str]: ...


ServiceRegistry: TypeAlias = Registry[ServiceDefinition]


@runtime_checkable
class BatchRegistry(Protocol[E_contra]):
    """A registry that takes many entries per request (the controller's batch route).

    Each returns False when this registry turns out not to support it (an older server);
    the registrar then goes one entry at a time.
    """

    def register_many(self, services: Sequence[E_contra]) -> bool: ...

    def deregister_many(self, service_ids: Sequence[str]) -> bool: ...


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
    check_tcp: bool = False,
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
        check_tcp=check_tcp,
    )


class Registrar(Generic[E]):
    """Background registration with anti-entropy (or refresh) and backoff; `stop()` deregisters."""

    def __init__(
        self,
        registry: Registry[E],
        services: Sequence[E],
        *,
        interval: float = 30.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        workers: int = 1,
    ) -> None:
        self._registry = registry
        self._services = list(services)
        self._interval = interval
        self._backoff_initial, self._backoff_max = backoff_initial, backoff_max
        self._workers = max(1, workers)
        self._stop = threading.Event()
        self._synced_once = False
        self._failing = False
        self.failures = 0
        self.last_sync_seconds: float | None = None
        self._thread = threading.Thread(target=self._run, name="registrar", daemon=True)

    def sync_once(self) -> bool:
        """Register what the registry lacks (everything, the first time or for a leasing
        registry). True on success."""
        started = time.perf_counter()
        try:
            if self._synced_once and not self._registry.expires_entries:
                known = self._registry.service_ids()
                missing = [s for s in self._services if s.registration_id not in known]
            else:
                missing = self._services
            if not self._register_batch(missing):
                error = self._each(self._registry.register, missing, until=self._stop)
                if error is not None:
                    raise error
        except RegistryError as exc:
            self.failures += 1
            self._failing = True
            if isinstance(exc, RegistryRefused):
                log.error("registration refused error=%r", str(exc))
            else:
                log.warning("registration failed error=%r", str(exc))
            return False
        self.last_sync_seconds = time.perf_counter() - started
        if missing and (not self._synced_once or self._failing):
            log.info("registered services count=%d seconds=%.3f", len(missing), self.last_sync_seconds)
        elif missing and not self._registry.expires_entries:
            log.info("re-registered forgotten services count=%d", len(missing))
        elif missing:
            log.debug("refreshed services count=%d seconds=%.3f", len(missing), self.last_sync_seconds)
        self._synced_once, self._failing = True, False
        return True

    def _register_batch(self, items: Sequence[E]) -> bool:
        """True when ``items`` (two or more) went through the registry's batch form."""
        batch = self._registry if isinstance(self._registry, BatchRegistry) else None
        return batch is not None and len(items) > 1 and batch.register_many(items)

    def _each(
        self, action: Callable[[E], None], items: Sequence[E], *, until: threading.Event | None = None
    ) -> RegistryError | None:
        """Apply `action` to every item on up to `workers` threads; the first error stops it."""
        errors: list[RegistryError] = []

        def one(item: E) -> None:
            if errors or (until is not None and until.is_set()):
                return
            try:
                action(item)
            except RegistryError as exc:
                errors.append(exc)

        if self._workers == 1 or len(items) < 2:
            for item in items:
                one(item)
        else:
            with ThreadPoolExecutor(min(self._workers, len(items)), thread_name_prefix="registrar") as pool:
                for _ in pool.map(one, items):
                    pass
        return errors[0] if errors else None

    def _run(self) -> None:
        delay = self._backoff_initial
        while not self._stop.is_set():
            started = time.monotonic()
            if self.sync_once():
                # From the start of the pass: a lease is renewed every `interval`, however
                # long a fleet's pass takes.
                delay = self._backoff_initial
                wait = max(0.0, self._interval - (time.monotonic() - started))
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
        ids = [service.registration_id for service in self._services]
        batch = self._registry if isinstance(self._registry, BatchRegistry) else None
        if batch is not None and len(ids) > 1:
            try:
                if batch.deregister_many(ids):
                    return
            except RegistryError as exc:
                log.warning("deregistration failed left=%d error=%r", len(ids), str(exc))
                return
        done: list[str] = []

        def deregister_one(service: E) -> None:
            self._registry.deregister(service.registration_id)
            done.append(service.registration_id)

        error = self._each(deregister_one, self._services)
        if error is not None:
            log.warning("deregistration failed left=%d error=%r", len(self._services) - len(done), str(error))
