"""The only module that speaks the gpufed controller's registry API: `Registry[TargetEntry]`.

For fleets without Consul or Kubernetes, `gpufed serve` keeps a registry of targets:

    PUT    /v1/registry/targets/{identity}   one entry; 200/201 {"identity", "expires_in_s"}
    POST   /v1/registry/batch                {"put": [{identity, ...entry}], "delete": [identity]};
                                             200 {"put", "created", "deleted", "expires_in_s"}
    DELETE /v1/registry/targets/{identity}   204, or 404 when already gone
    GET    /v1/registry/targets?offset=&limit=  {"total", "offset", "limit", "targets": [...]}

every call with `Authorization: Bearer <token>`. Entries are leases: the controller drops
one `ttl` seconds after its last PUT, so `expires_entries` is True and the registrar
re-PUTs every entry each interval. Many entries (a fleet, a node with several exporters)
go through the batch route in bodies of `BATCH_CHUNK`; a controller without it (404/405,
an older one) is told once in the log and then gets one PUT per entry. Answers map onto
the exporter's errors here:

    network error, timeout, 5xx (503: a follower, naming the leader)  RegistryError (retry)
    401, 403 (token), 422 (entry refused, problem+json)               RegistryRefused (fix)

The `httpx.Client` is injected (base URL, timeouts, pool), so tests and the CLI choose
the transport; `controller_client` builds the one the CLI uses.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx

from exporter.errors import RegistryError, RegistryRefused
from exporter.target_entry import TargetEntry

log = logging.getLogger(__name__)

TARGETS = "/v1/registry/targets"
LIST_PAGE = 1000
"""``GET /v1/registry/targets`` pages (the controller's most)."""
BATCH = "/v1/registry/batch"
BATCH_CHUNK = 1000  # entries per POST: well under the controller's 1 MiB body limit
TOKEN_HINT = "--register-token, GPUFED_EXPORTER_REGISTER_TOKEN or GPUFED_TOKEN"


def controller_client(url: str, *, timeout: float = 5.0, connections: int = 16,
                      tls: ssl.SSLContext | None = None) -> httpx.Client:
    """A keep-alive client for the controller at `url` (a base URL; a path prefix is kept);
    `tls` verifies an https controller and presents the client certificate it holds
    (`webconfig.client`, from --register-http-config-file); None: the system's roots."""
    return httpx.Client(
        base_url=url.rstrip("/"), timeout=timeout, verify=tls or True,
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
        self.batch_supported: bool | None = None  # unknown until the first batch answer

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
        self._check_lease(expires)

    def _check_lease(self, expires: float) -> None:
        interval = self._refresh_interval
        if interval is not None and expires <= interval and not self._warned_lease:
            self._warned_lease = True
            log.warning("controller lease shorter than the refresh interval expires_in_s=%g "
                        "register_interval=%g: targets will expire between refreshes; lower "
                        "GPUFED_EXPORTER_REGISTER_INTERVAL", expires, interval)

    def register_many(self, services: Sequence[TargetEntry]) -> bool:
        """Register `services` through the batch route; False when the controller lacks it
        (then the caller registers them one by one)."""
        for first in range(0, len(services), BATCH_CHUNK):
            part = services[first : first + BATCH_CHUNK]
            body = {"put": [{**s.body(), "identity": s.identity} for s in part], "delete": []}
            expires = self._batch(body, f"register {len(part)} targets")
            if expires is None:
                return False
            self._check_lease(expires)
        return True

    def deregister_many(self, service_ids: Sequence[str]) -> bool:
        """Deregister through the batch route (unknown identities are fine); False without it."""
        for first in range(0, len(service_ids), BATCH_CHUNK):
            part = list(service_ids[first : first + BATCH_CHUNK])
            if self._batch({"put": [], "delete": part}, f"deregister {len(part)} targets") is None:
                return False
        return True

    def _batch(self, body: dict[str, Any], what: str) -> float | None:
        """One batch POST: the lease it grants, or None when the route is missing."""
        if self.batch_supported is False:
            return None
        response = self._send("POST", BATCH, json=body)
        if response.status_code in (404, 405):
            self.batch_supported = False
            log.warning("controller has no batch registry route status=%d: registering one target per "
                        "PUT (an older controller; upgrade it for fewer requests)", response.status_code)
            return None
        if response.status_code != 200:
            raise self._error(response, what)
        self.batch_supported = True
        answer = _json(response, what)
        expires = answer.get("expires_in_s") if isinstance(answer, dict) else None
        if not isinstance(expires, int | float):
            raise RegistryError(f"{what}: answer lacks expires_in_s: {_excerpt(response)}")
        return float(expires)

    def deregister(self, service_id: str) -> None:
        """Idempotent: 404 means the controller already forgot the entry, which is fine."""
        response = self._send("DELETE", target_path(service_id))
        if response.status_code not in (200, 204, 404):
            raise self._error(response, f"deregister {service_id}")

    def service_ids(self) -> set[str]:
        """Every registered identity, page by page (the listing is paged, 1,000 a page)."""
        found: set[str] = set()
        offset = 0
        while True:
            response = self._send("GET", TARGETS, params={"offset": offset, "limit": LIST_PAGE})
            if response.status_code != 200:
                raise self._error(response, "list targets")
            body = _json(response, "list targets")
            targets = body.get("targets") if isinstance(body, dict) else None
            if not isinstance(targets, list) or not all(
                isinstance(t, dict) and "identity" in t for t in targets
            ):
                raise RegistryError(f"list targets: not a target list: {_excerpt(response)}")
            found.update(str(t["identity"]) for t in targets)
            offset += len(targets)
            total = body.get("total") if isinstance(body, dict) else None
            if not targets or not isinstance(total, int) or offset >= total:
                return found

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
