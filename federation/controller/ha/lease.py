"""Leader election on a Kubernetes ``coordination.k8s.io/v1`` Lease, for ``gpufed serve`` in a cluster.

The one module of ``federation`` that imports ``kubernetes`` (``.importlinter`` holds it
to that). :class:`LeaseElector` is a ``LeaderElector`` (``federation.controller.ha.leader``):
``is_leader``, ``fence``, ``leader_address``, ``run``, ``resign``. The algorithm is
client-go's ``leaderelection`` (what kube-controller-manager runs), in one round,
:meth:`LeaseElector.try_acquire_or_renew`:

1. GET the Lease. 404: create it, holding it (a 409 there: another replica created it
   first, it leads).
2. Another holder whose record has not changed for ``leaseDurationSeconds`` -> the lease
   expired: take it. The time is measured on this replica's monotonic clock from when it
   first saw that version of the record, never by comparing ``renewTime`` with the local
   wall clock, so skew between nodes cannot make a replica take a live lease. A cleared
   holder (a leader that resigned) is taken at once.
3. Otherwise, a holder that is not us: follow.
4. Take or renew: PUT the Lease with ourselves as holder and the ``resourceVersion`` we
   read. A 409 means someone wrote between our GET and our PUT: they won, we follow.

**Timing.** A leader renews every ``renew_interval_s`` (default duration / 5) and
believes it leads only until ``renew_deadline_s`` (default 2/3 of the duration) after
the *start* of its last successful round. A follower can take over no earlier than a
full duration after it saw that round's write, so the two never overlap, and a leader
paused past its deadline (``SIGSTOP``, a long GC) wakes up already deposed in its own
eyes: :meth:`is_leader` is false before it tries anything.

**Fencing token.** :meth:`fence` is ``spec.leaseTransitions``, not the resourceVersion.
Every acquisition increments it under the optimistic lock (so no two leaders ever hold
the same value and a later leader always holds a larger one), and it does not change
while one leader renews. The resourceVersion changes on every renewal and is opaque by
the API conventions (clients must not compare two for order), so a store could not tell
an older leader's token from a newer one by it. A replica that takes a lease still
naming itself (restarted with the same pod name) counts as a new acquisition too, so
writes still in flight from its previous life are fenced out. Deleting the Lease resets
the count; the replica that recreates it starts above the highest count it has seen.

**Resign** writes the holder out (and ``leaseDurationSeconds: 1``), so a follower takes
over at its next round instead of waiting out the lease.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kubernetes
from kubernetes.client import CoordinationV1Api, V1Lease, V1LeaseSpec, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)
ADDRESS_ANNOTATION = "gpufed.io/leader-address"


@dataclass(frozen=True)
class LeaseConfig:
    identity: str
    """Unique per replica: the pod name (``metadata.name`` through the downward API)."""
    address: str | None = None
    """How the others reach this replica (``http://pod-ip:8080``), shown to callers of followers."""
    name: str = "gpufed-controller"
    namespace: str = "monitoring"
    lease_duration_s: int = 15
    renew_interval_s: float | None = None
    """Default: duration / 5 (3 s of 15 s)."""
    retry_interval_s: float | None = None
    """How often a follower looks; default duration / 10, so a takeover lands within about duration + 2 s."""
    renew_deadline_s: float | None = None
    """Default: 2/3 of the duration (10 s of 15 s), as client-go."""

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("identity is empty: give each replica its own (the pod name)")
        if self.lease_duration_s < 2:
            raise ValueError(f"lease_duration_s must be at least 2 seconds (value {self.lease_duration_s!r})")
        if not 0 < self.deadline_s < self.lease_duration_s:
            raise ValueError(
                f"renew_deadline_s must be below lease_duration_s {self.lease_duration_s} "
                f"(value {self.renew_deadline_s!r})"
            )
        if not 0 < self.renew_s < self.deadline_s:
            raise ValueError(
                f"renew_interval_s must be below the renew deadline {self.deadline_s:g} s "
                f"(value {self.renew_interval_s!r})"
            )

    @property
    def renew_s(self) -> float:
        return self.renew_interval_s if self.renew_interval_s is not None else self.lease_duration_s / 5

    @property
    def retry_s(self) -> float:
        return self.retry_interval_s if self.retry_interval_s is not None else self.lease_duration_s / 10

    @property
    def deadline_s(self) -> float:
        return self.renew_deadline_s if self.renew_deadline_s is not None else self.lease_duration_s * 2 / 3


def micro_now() -> datetime:
    """UTC now for ``renewTime``/``acquireTime`` (MicroTime: RFC 3339 with exactly six digits).

    The client prints datetimes with ``isoformat()``, which drops the fraction when the
    microseconds are 0, and the API server then refuses the MicroTime; never send that.
    """
    now = datetime.now(UTC)
    return now if now.microsecond else now.replace(microsecond=1)


class LeaseElector:
    def __init__(
        self,
        config: LeaseConfig,
        *,
        api: CoordinationV1Api,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = micro_now,
    ) -> None:
        self.config = config
        self._api = api
        self._monotonic = monotonic
        self._wall = wall
        self._lock = threading.Lock()
        self._held = False
        self._valid_until = 0.0
        self._transitions: int | None = None
        self._highest_seen = -1
        self._seen: V1Lease | None = None
        self._seen_version: str | None = None
        self._seen_at = 0.0

    @classmethod
    def from_cluster(cls, config: LeaseConfig, *, kubeconfig: str | None = None) -> LeaseElector:
        """The pod's service account (no ``kubeconfig``), or a kubeconfig file."""
        if kubeconfig is None:
            kubernetes.config.load_incluster_config()
            api_client = kubernetes.client.ApiClient()
        else:
            api_client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        return cls(config, api=CoordinationV1Api(api_client))

    # ---- the LeaderElector protocol ---------------------------------------------------------
    def is_leader(self) -> bool:
        with self._lock:
            return self._held and self._monotonic() < self._valid_until

    def fence(self) -> int | None:
        with self._lock:
            held = self._held and self._monotonic() < self._valid_until
            return self._transitions if held else None

    def leader_address(self) -> str | None:
        if self.is_leader():
            return self.config.address
        with self._lock:
            seen = self._seen
            if seen is None or seen.spec is None or not seen.spec.holder_identity:
                return None
            if self._expired(self._monotonic()):
                return None
            annotations = (seen.metadata.annotations if seen.metadata else None) or {}
            return annotations.get(ADDRESS_ANNOTATION)

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set, then resign."""
        while not stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception:  # the elector must outlive one bad round; leadership lapses by itself
                log.exception("lease round failed")
            stop.wait(self.config.renew_s if self.is_leader() else self.config.retry_s)
        self.resign()

    def resign(self) -> None:
        """Give the lease up now (a follower takes it at its next round)."""
        with self._lock:
            held, seen = self._held, self._seen
            self._held = False
        if not held or seen is None or seen.spec is None or seen.metadata is None:
            return
        spec = V1LeaseSpec(
            lease_duration_seconds=1,
            lease_transitions=seen.spec.lease_transitions,
            acquire_time=seen.spec.acquire_time,
            renew_time=self._wall(),
        )
        try:
            self._replace(_lease(seen.metadata, spec))
        except ApiException as exc:  # 409: someone else holds it already; nothing to give up
            log.info("lease not released: %s %s", exc.status, exc.reason)
        else:
            log.info("lease %s released by %s", self.config.name, self.config.identity)

    # ---- one round ---------------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """One round; True when this replica holds the lease after it."""
        started = self._monotonic()
        try:
            current = self._api.read_namespaced_lease(self.config.name, self.config.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return self._create(started)
            log.warning("lease read failed: %s %s", exc.status, exc.reason)
            return self.is_leader()
        spec = current.spec or V1LeaseSpec()
        with self._lock:
            self._observe(current, started)
            holder = spec.holder_identity or ""
            mine = holder == self.config.identity
            if holder and not mine and not self._expired(started):
                self._held = False
                return False
            renewing = mine and self._held
        transitions = spec.lease_transitions or 0
        now = self._wall()
        meta = current.metadata or V1ObjectMeta(name=self.config.name, namespace=self.config.namespace)
        new_spec = V1LeaseSpec(
            holder_identity=self.config.identity,
            lease_duration_seconds=self.config.lease_duration_s,
            acquire_time=spec.acquire_time if renewing else now,
            renew_time=now,
            lease_transitions=transitions if renewing else transitions + 1,
        )
        try:
            written = self._replace(_lease(meta, new_spec, address=self.config.address))
        except ApiException as exc:
            if exc.status == 409:
                log.info("lease %s: another replica wrote first; following", self.config.name)
                with self._lock:
                    self._held = False
                return False
            log.warning("lease write failed: %s %s", exc.status, exc.reason)
            return self.is_leader()
        self._won(written, started, taken=not renewing, was=holder)
        return True

    def _create(self, started: float) -> bool:
        now = self._wall()
        meta = V1ObjectMeta(name=self.config.name, namespace=self.config.namespace)
        spec = V1LeaseSpec(
            holder_identity=self.config.identity,
            lease_duration_seconds=self.config.lease_duration_s,
            acquire_time=now,
            renew_time=now,
            lease_transitions=self._highest_seen + 1 if self._highest_seen >= 0 else 0,
        )
        try:
            created = self._api.create_namespaced_lease(
                self.config.namespace, _lease(meta, spec, address=self.config.address)
            )
        except ApiException as exc:
            if exc.status != 409:
                log.warning("lease create failed: %s %s", exc.status, exc.reason)
            return False
        self._won(created, started, taken=True, was="")
        return True

    def _replace(self, lease: V1Lease) -> V1Lease:
        result: V1Lease = self._api.replace_namespaced_lease(self.config.name, self.config.namespace, lease)
        return result

    def _won(self, lease: V1Lease, started: float, *, taken: bool, was: str) -> None:
        with self._lock:
            self._observe(lease, started)
            self._held = True
            self._valid_until = started + self.config.deadline_s
            self._transitions = lease.spec.lease_transitions if lease.spec else None
        if taken:
            log.info(
                "lease %s acquired by %s (from %s, transitions %s)",
                self.config.name,
                self.config.identity,
                was or "nobody",
                self._transitions,
            )

    def _observe(self, lease: V1Lease, at: float) -> None:
        """Remember the record and when this replica first saw this version of it (lock held)."""
        version = lease.metadata.resource_version if lease.metadata else None
        if version != self._seen_version or self._seen is None:
            self._seen_version, self._seen_at = version, at
        self._seen = lease
        transitions = lease.spec.lease_transitions if lease.spec else None
        if transitions is not None:
            self._highest_seen = max(self._highest_seen, transitions)

    def _expired(self, now: float) -> bool:
        seen = self._seen
        duration = (
            seen.spec.lease_duration_seconds if seen and seen.spec else None
        ) or self.config.lease_duration_s
        return now >= self._seen_at + duration


def _lease(meta: V1ObjectMeta, spec: V1LeaseSpec, *, address: str | None = None) -> V1Lease:
    """A Lease to write: ``meta``'s name, namespace and resourceVersion (the optimistic lock)."""
    annotations: dict[str, Any] = dict(meta.annotations or {})
    if address:
        annotations[ADDRESS_ANNOTATION] = address
    else:
        annotations.pop(ADDRESS_ANNOTATION, None)
    return V1Lease(
        api_version="coordination.k8s.io/v1",
        kind="Lease",
        metadata=V1ObjectMeta(
            name=meta.name,
            namespace=meta.namespace,
            resource_version=meta.resource_version,
            labels=meta.labels,
            annotations=annotations or None,
        ),
        spec=spec,
    )
