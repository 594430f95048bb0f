"""Compose v2's resolved model (``docker-compose config --format json``) as typed services.

Only what the runner acts on is read; everything else Compose resolved (``logging``,
``deploy``, ``runtime``) is kept in ``ignored`` so the runner can say what it did not do.
Compose has already interpolated ``${VAR}``, merged ``env_file`` into ``environment``,
made bind sources absolute and applied profiles, so nothing here re-implements that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: Keys the runner honours; any other key a service sets is reported as ignored.
HONOURED = frozenset(
    {
        "command",
        "entrypoint",
        "environment",
        "volumes",
        "ports",
        "healthcheck",
        "depends_on",
        "restart",
        "network_mode",
        "networks",
        "hostname",
        "image",
        "profiles",
        "pid",
        "container_name",
    }
)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class ModelError(ValueError):
    """The resolved model has something the runner cannot run (names the service and key)."""


def seconds(text: str | None, default: float) -> float:
    """A Compose duration (``1m30s``) in seconds; ``default`` when unset."""
    if not text:
        return default
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ModelError(f"not a duration: {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


@dataclass(frozen=True)
class Volume:
    kind: str  # bind | volume | tmpfs
    source: str  # absolute host path (bind) or the project's volume name
    target: str
    read_only: bool


@dataclass(frozen=True)
class Port:
    target: int
    published: int
    protocol: str


@dataclass(frozen=True)
class Healthcheck:
    test: tuple[str, ...]  # argv to exec (CMD), or ("/bin/sh", "-c", line) for CMD-SHELL
    interval: float
    timeout: float
    retries: int
    start_period: float
    start_interval: float


@dataclass(frozen=True)
class Dependency:
    service: str
    condition: str  # service_started | service_healthy | service_completed_successfully
    required: bool


@dataclass(frozen=True)
class Service:
    project: str
    name: str
    image: str
    command: tuple[str, ...] | None
    entrypoint: tuple[str, ...] | None
    environment: dict[str, str | None]
    volumes: tuple[Volume, ...]
    ports: tuple[Port, ...]
    healthcheck: Healthcheck | None
    depends_on: tuple[Dependency, ...]
    restart: str
    network_mode: str | None
    hostname: str
    aliases: tuple[str, ...]
    ignored: tuple[str, ...] = field(default=())
    stop_grace_period: float = 10.0  # Docker's default: SIGKILL 10 s after the stop signal
    stop_signal: str = "SIGTERM"


@dataclass(frozen=True)
class Project:
    name: str
    services: dict[str, Service]
    volumes: dict[str, str]  # the project's volume key -> its resolved name


def _argv(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ModelError(f"{where}: expected a list of strings, got {value!r}")


def _healthcheck(raw: dict[str, Any] | None, where: str) -> Healthcheck | None:
    if not raw or raw.get("disable"):
        return None
    test = list(raw.get("test") or [])
    if not test or test[0] == "NONE":
        return None
    if test[0] == "CMD":
        argv = tuple(test[1:])
    elif test[0] == "CMD-SHELL":
        argv = ("/bin/sh", "-c", " ".join(test[1:]))
    else:
        raise ModelError(f"{where}.healthcheck.test: expected CMD, CMD-SHELL or NONE first, got {test[0]!r}")
    # Docker's defaults: 30s interval and timeout, 3 retries, no start period, 5s start interval.
    return Healthcheck(
        test=argv,
        interval=seconds(raw.get("interval"), 30.0),
        timeout=seconds(raw.get("timeout"), 30.0),
        retries=int(raw.get("retries", 3)),
        start_period=seconds(raw.get("start_period"), 0.0),
        start_interval=seconds(raw.get("start_interval"), 5.0),
    )


def _volume(raw: dict[str, Any], where: str) -> Volume:
    kind = raw.get("type")
    if kind not in ("bind", "volume", "tmpfs"):
        raise ModelError(f"{where}.volumes: type {kind!r} is not bind, volume or tmpfs")
    return Volume(kind, str(raw.get("source") or ""), str(raw["target"]), bool(raw.get("read_only")))


def _port(raw: dict[str, Any], where: str) -> Port:
    published = raw.get("published")
    if published in (None, ""):
        raise ModelError(f"{where}.ports: target {raw.get('target')} has no published port")
    return Port(int(raw["target"]), int(published), str(raw.get("protocol", "tcp")))


def _service(project: str, name: str, raw: dict[str, Any]) -> Service:
    where = f"{project}.services.{name}"
    networks = raw.get("networks") or {}
    aliases = tuple(a for net in networks.values() for a in ((net or {}).get("aliases") or []))
    return Service(
        project=project,
        name=name,
        image=str(raw.get("image") or ""),
        command=_argv(raw.get("command"), f"{where}.command"),
        entrypoint=_argv(raw.get("entrypoint"), f"{where}.entrypoint"),
        environment={
            str(k): (None if v is None else str(v)) for k, v in (raw.get("environment") or {}).items()
        },
        volumes=tuple(_volume(v, where) for v in raw.get("volumes") or []),
        ports=tuple(_port(p, where) for p in raw.get("ports") or []),
        healthcheck=_healthcheck(raw.get("healthcheck"), where),
        depends_on=tuple(
            Dependency(dep, str(spec.get("condition", "service_started")), bool(spec.get("required", True)))
            for dep, spec in sorted((raw.get("depends_on") or {}).items())
        ),
        restart=str(raw.get("restart") or "no"),
        network_mode=raw.get("network_mode"),
        hostname=str(raw.get("hostname") or name),
        aliases=aliases,
        ignored=tuple(sorted(k for k in raw if k not in HONOURED)),
        stop_grace_period=seconds(raw.get("stop_grace_period"), 10.0),
        stop_signal=str(raw.get("stop_signal") or "SIGTERM"),
    )


def parse_project(data: dict[str, Any]) -> Project:
    """``docker-compose config --format json`` output as a ``Project``."""
    name = str(data.get("name") or "")
    services = {n: _service(name, n, raw) for n, raw in sorted((data.get("services") or {}).items())}
    for service in services.values():
        for dep in service.depends_on:
            if dep.service not in services and dep.required:
                raise ModelError(f"{name}.services.{service.name}.depends_on: no service {dep.service!r}")
        if service.network_mode not in (None, "host") and not str(service.network_mode).startswith(
            "service:"
        ):
            raise ModelError(
                f"{name}.services.{service.name}.network_mode: {service.network_mode!r} "
                "is not run here (host, service:NAME or the default network)"
            )
    volumes = {k: str((v or {}).get("name") or f"{name}_{k}") for k, v in (data.get("volumes") or {}).items()}
    return Project(name, services, volumes)


def start_order(services: dict[str, Service]) -> list[str]:
    """Services in ``depends_on`` order (dependencies first, then by name); a cycle is an error."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise ModelError(f"depends_on cycle: {' -> '.join((*path, name))}")
        state[name] = "visiting"
        for dep in services[name].depends_on:
            if dep.service in services:
                visit(dep.service, (*path, name))
        state[name] = "done"
        order.append(name)

    for name in sorted(services):
        visit(name, ())
    return order
