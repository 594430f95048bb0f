"""Registers the simulated fleet's nodes with the controller's built-in registry, and keeps them.

A stand-in for ``gpufed-exporter fleet --register-url`` (branch ``register``) until it is
merged: the same calls (``PUT /v1/registry/targets/{identity}`` with a bearer token that
has the ``register`` scope, one per node), the same bodies (``federation.demo.plan.
fleet_entries``), refreshed every ``interval`` seconds because entries expire after the
controller's TTL (90 s by default). When the exporter registers itself the demo stops
starting this (``federation.demo.components.FLEET_SELF_REGISTERS``).

Entries are not deleted at shutdown: the controller stops right after, and a
``--keep`` run starts from the persisted set.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx

log = logging.getLogger(__name__)
PATH = "/v1/registry/targets"


class FleetRegistrar:
    def __init__(
        self,
        client: httpx.Client,
        entries: Sequence[dict[str, Any]],
        *,
        token: str,
        interval: float = 30.0,
        retry: float = 2.0,
    ) -> None:
        self._client = client
        self._entries = {str(e["identity"]): dict(e) for e in entries}
        self._headers = {"Authorization": f"Bearer {token}"}
        self.interval = interval
        self.retry = retry
        self.registered = 0
        self.failures = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def register_all(self) -> int:
        """PUT every entry once; how many the controller refused or could not take."""
        with self._lock:
            entries = list(self._entries.items())
        failed = 0
        for identity, body in entries:
            if self._stop.is_set():
                break
            try:
                response = self._client.put(
                    f"{PATH}/{quote(identity, safe='')}", json=body, headers=self._headers
                )
            except httpx.HTTPError as exc:
                failed += 1
                self.last_error = f"PUT {identity}: {type(exc).__name__}: {exc}"
                continue
            if response.status_code not in (200, 201):
                failed += 1
                self.last_error = f"PUT {identity}: {response.status_code} {response.text[:200]}"
        self.registered = len(entries) - failed
        self.failures += failed
        if failed:
            log.warning("registry refresh: %d of %d failed; last: %s", failed, len(entries), self.last_error)
        return failed

    def forget(self, identity: str) -> None:
        """Stop refreshing one node: the controller drops it when its TTL runs out."""
        with self._lock:
            self._entries.pop(identity, None)

    def add(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._entries[str(entry["identity"])] = dict(entry)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="registrar")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            failed = self.register_all()
            self._stop.wait(self.retry if failed else self.interval)
