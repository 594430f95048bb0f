"""The only module that imports py-consul: `ServiceRegistry` over a local Consul agent.

Maps `ServiceDefinition` onto `agent.service.register` (with an HTTP check, a TCP one when the
exporter serves TLS, and
`replace_existing_checks=True`, so a changed check replaces the old one) and every
py-consul / requests failure onto `RegistryError`.
"""

from __future__ import annotations

import consul
import requests

from exporter.errors import ConfigError, RegistryError
from exporter.registration import ServiceDefinition

_FAILURES = (consul.ConsulException, requests.RequestException, OSError, ValueError)


def split_address(address: str, default_port: int = 8500) -> tuple[str, int]:
    """`host[:port]` (or an http:// URL) into host and port."""
    text = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, default_port
    try:
        return host.strip("[]"), int(port)
    except ValueError as exc:
        raise ConfigError(f"bad Consul address {address!r}") from exc


class ConsulAgentRegistry:
    """Registers services with the local agent over its HTTP API."""

    #: The agent keeps a service until it is deregistered (or its check stays critical).
    expires_entries = False

    def __init__(self, address: str, *, token: str | None = None, timeout: float = 5.0) -> None:
        host, port = split_address(address)
        self._client = consul.Consul(host=host, port=port, token=token, connections_timeout=timeout)

    def register(self, service: ServiceDefinition) -> None:
        if service.check_tcp:
            check = consul.Check.tcp(service.address, service.port, service.check_interval,
                                     timeout=service.check_timeout, deregister=service.deregister_after)
        else:
            check = consul.Check.http(
                service.check_url,
                service.check_interval,
                timeout=service.check_timeout,
                deregister=service.deregister_after,
            )
        try:
            ok = self._client.agent.service.register(
                service.name,
                service_id=service.service_id,
                address=service.address,
                port=service.port,
                tags=list(service.tags),
                meta=dict(service.meta),
                check=check,
                replace_existing_checks=True,
            )
        except _FAILURES as exc:
            raise RegistryError(f"register {service.service_id}: {exc}") from exc
        if not ok:
            raise RegistryError(f"register {service.service_id}: agent refused")

    def deregister(self, service_id: str) -> None:
        """Idempotent: an agent that already forgot the service answers 404, which is fine."""
        try:
            self._client.agent.service.deregister(service_id)
        except _FAILURES as exc:
            raise RegistryError(f"deregister {service_id}: {exc}") from exc

    def service_ids(self) -> set[str]:
        try:
            return set(self._client.agent.services())
        except _FAILURES as exc:
            raise RegistryError(f"list services: {exc}") from exc
