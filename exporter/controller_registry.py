"""The only module that speaks the gpufed controller's registry API: `Registry[TargetEntry]`.

For fleets without Consul or Kubernetes, `gpufed serve` keeps a registry of targets:

    PUT    /v1/registry/targets/{identity}   one entry; 200/201 {"identity", "expires_in_s"}
    DELETE /v1/registry/targets/{identity}   204, or 404 when already gone
    GET    /v1/registry/targets              {"targets": [{identity, ...fields, expires_in_s}]}

every call with `Authorization: Bearer <token>`. Entries are leases: the controller drops
one `ttl` seconds after its last PUT, so `expires_entries` is True and the registrar
re-PUTs every entry each interval. Answers map onto the exporter's errors here:

    network error, timeout, 5xx (503: a follower, naming the leader)  RegistryError (retry)
    401, 403 (token), 422 (entry refused, problem+json)               RegistryRefused (fix)

The `httpx.Client` is injected (base URL, timeouts, pool), so tests and the CLI choose
the transport; `controller_client` builds the one the CLI uses.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import httpx

from exporter.errors import RegistryError, RegistryRefused
from exporter.target_entry import TargetEntry

log = logging.getLogger(__name__)

TARGETS = "/v1/registry/targets"
TOKEN_HINT = "--register-token, GPUFED_EXPORTER_REGISTER_TOKEN or GPUFED_TOKEN"


def controller_client(url: str, *, timeout: float = 5.0, connections: int = 16) -> httpx.Client:
    """A keep-alive client for the controller at `url` (a base URL; a path prefix is kept)."""
    return httpx.Client(
        base_url=url.rstrip("/"), timeout=timeout,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        headers={"User-Agent": "gpufed-exporter"},
    )


def target_path(identity: str) -> str:
    """The entry's URL path; the identity is one path segment, so ':' '/' '[' are escaped."""
    return f"{TARGETS}/{quote(identity, safe='')}"


class ControllerRegistry:
    """Registers `TargetEntry`s with the controller; every failure is a `RegistryError`.

    `refresh_interval`, when given, is compared with the lease the controller grants: a
    lease that ends before the next refresh would make targets blink out between PUTs, so
    that is logged once as a warning.
    """

    #: The controller drops an entry `ttl` after its last PUT: refresh, do not list.
    expires_entries = True

    def __init__(
        self, client: httpx.Client, *, token: str | None = None, refresh_interval: float | None = None
    ) -> None:
        self._client = client
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._refresh_interval = refresh_interval
        self._warned_lease = False

    def close(self) -> None:
        """Close the client's connection pool; for whoever built this registry and its client."""
        self._client.close()

    def register(self, service: TargetEntry) -> None:
        response = self._send("PUT", target_path(service.identity), json=service.body())
        if response.status_code not in (200, 201):
            raise self._error(response, f"register {service.identity}")
        what = f"register {service.identity}"
        body = _json(response, what)
        expires = body.get("expires_in_s") if isinstance(body, dict) else None
        if not isinstance(expires, int | float):
            raise RegistryError(f"{what}: answer lacks expires_in_s: {_excerpt(response)}")
        interval = self._refresh_interval
        if interval is not None and expires <= interval and not self._warned_lease:
            self._warned_lease = True
            log.warning("controller lease shorter than the refresh interval expires_in_s=%g "
                        "register_interval=%g: targets will expire between refreshes; lower "
                        "GPUFED_EXPORTER_REGISTER_INTERVAL", expires, interval)

    def deregister(self, service_id: str) -> None:
        """Idempotent: 404 means the controller already forgot the entry, which is fine."""
        response = self._send("DELETE", target_path(service_id))
        if response.status_code not in (200, 204, 404):
            raise self._error(response, f"deregister {service_id}")

    def service_ids(self) -> set[str]:
        response = self._send("GET", TARGETS)
        if response.status_code != 200:
            raise self._error(response, "list targets")
        body = _json(response, "list targets")
        targets = body.get("targets") if isinstance(body, dict) else None
        if not isinstance(targets, list) or not all(isinstance(t, dict) and "identity" in t for t in targets):
            raise RegistryError(f"list targets: not a target list: {_excerpt(response)}")
        return {str(t["identity"]) for t in targets}

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._client.request(method, path, headers=self._headers, **kwargs)
        except httpx.HTTPError as exc:
            where = str(self._client.base_url).rstrip("/") + path
            raise RegistryError(f"{method} {where}: {type(exc).__name__}: {exc}") from exc

    def _error(self, response: httpx.Response, what: str) -> RegistryError:
        status = response.status_code
        where = f"{what}: controller {self._client.base_url} answered {status}"
        if status in (401, 403):
            token = "no token was sent" if not self._headers else "the token was refused"
            return RegistryRefused(f"{where} ({token}; set {TOKEN_HINT}): {_excerpt(response)}")
        if status == 422:
            return RegistryRefused(f"{where} (entry refused): {_excerpt(response)}")
        if status == 503:
            body = _maybe_json(response)
            leader = body.get("leader") if isinstance(body, dict) else None
            return RegistryError(f"{where} (a follower; leader {leader or 'unknown'}): retrying")
        return RegistryError(f"{where}: {_excerpt(response)}")


def _maybe_json(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return None


def _json(response: httpx.Response, what: str) -> object:
    try:
        return response.json()
    except ValueError as exc:
        raise RegistryError(f"{what}: answer is not JSON: {_excerpt(response)}") from exc


def _excerpt(response: httpx.Response, limit: int = 300) -> str:
    """The body as one short line, for log lines people read."""
    text = " ".join(response.text.split())
    return (text[:limit] + "...") if len(text) > limit else (text or "(empty body)")
