"""Leader election on bare metal: a Consul session holding a lock on one KV key.

Consul's documented pattern: every replica keeps a session (``LockDelay``, ``Behavior:
release``) and tries ``PUT <prefix>/leader?acquire=<session>`` with its advertised URL as
the value; the one that gets ``true`` leads until its session ends. Followers read the
key (blocking queries, so they wake when it is released) to learn the leader's address,
and try again when it is free.

**Bound to a TTL check, not only to the session TTL.** Consul's servers reap a TTL
session only ``SessionTTLMultiplier`` (2) times its TTL after the last renewal ("up to
double", the docs say), so a session TTL of 15 s alone means a dead leader keeps the
lock for up to 30 s. Each replica therefore registers itself as a service
(``gpufed-controller``, its advertised address) with a TTL health check of ``--lock-ttl``
seconds and creates its session bound to that check (and ``serfHealth``): an agent turns
a TTL check critical as soon as its TTL passes without an update, which invalidates the
session at once. So a ``kill -9``-ed leader loses the lock within one TTL, and a
follower takes over a lock-delay later. The session keeps a TTL too, as a backstop.

**Timing.** Every TTL/3 a replica marks its check passing and renews its session. The
leader counts its lease from the start of the last round in which both succeeded
(:class:`~federation.controller.ha.leader.LocalLease`): neither can run out earlier, so a
leader that was paused or cut off from Consul stops acting as leader before Consul can
hand the lock to anyone. ``resign`` on a clean shutdown releases the lock at once (a
release, unlike an invalidation, starts no lock-delay), destroys the session and
deregisters the service. The Consul token needs ``key:write`` on the prefix,
``session:write`` and ``service:write`` for ``gpufed-controller``.

**Lock-delay** (default 1 s, Consul's own default is 15 s) is Chubby's guard for clients
that cannot tell a stale leader's requests apart. Ours can: the fencing token below goes
with every store write and the store refuses older ones, so a long delay would only
lengthen every failover. A follower that finds the key free but its acquire refused
(lock-delay running) retries every ``retry_s`` rather than waiting on the key.

**Fencing token**: the key's ``ModifyIndex`` read right after a successful acquire (the
raft index of the acquisition). Raft indexes only grow, so every later term's token is
larger, even if an operator deletes the key (its ``LockIndex`` would start again at 1).

**Why 503 and not a proxy.** A follower answers a mutating call with 503 and the
leader's URL (``Controller.check_writable``) instead of forwarding it. Plans live in the
leader's memory, so plan and rebalance must reach the same process; a proxy that
forwarded them across a leader change would turn into a confusing 404. A forwarded
request whose leader dies mid-call has an unknown outcome, where a direct one fails
visibly and is retried by the operator or the client. Forwarding would also relay the
caller's bearer token between replicas, and during an election a follower could forward
to a stale address that is itself a follower. Clients that want one address put a load
balancer in front that routes writes by the ``leader`` field of ``/v1/status``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import consul
import requests

from federation.controller.ha.leader import LocalLease

log = logging.getLogger(__name__)
MAX_BLOCK_S = 2.0
Errors = (consul.ConsulException, requests.RequestException, KeyError, TypeError, ValueError)


class ConsulLock:
    """A :class:`~federation.controller.ha.leader.LeaderElector` over a Consul session lock."""

    def __init__(
        self,
        client: consul.Consul,
        *,
        key: str,
        address: str,
        ttl_s: int = 15,
        lock_delay_s: int = 1,
        retry_s: float = 0.5,
        name: str = "gpufed-leader",
        service: str = "gpufed-controller",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 10 <= ttl_s <= 86400:
            raise ValueError(f"lock TTL must be between 10 and 86400 seconds (Consul's range), got {ttl_s}")
        if not 0 <= lock_delay_s <= 60:
            raise ValueError(
                f"lock-delay must be between 0 and 60 seconds (Consul's range), got {lock_delay_s}"
            )
        self.client = client
        self.key = key
        self.address = address
        self.ttl_s = ttl_s
        self.lock_delay_s = lock_delay_s
        self.retry_s = retry_s
        self.name = name
        self.service = service
        self.service_id = f"{service}-{hashlib.sha256(address.encode()).hexdigest()[:12]}"
        self.check_id = f"{self.service_id}-heartbeat"
        self._registered = False
        self._clock = clock
        self.lease = LocalLease(ttl_s=ttl_s, clock=clock)
        self._session: str | None = None
        self._renewed_at = 0.0
        self._token: int | None = None
        self._leader: str | None = None
        self._index = 0
        self._lock = threading.Lock()

    # ---- LeaderElector -------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self._token is not None and self.lease.valid()

    def fence(self) -> int | None:
        return self._token if self.is_leader() else None

    def leader_address(self) -> str | None:
        if self.is_leader():
            return self.address
        # our own lease ran out (a pause past the TTL) before any call told us who holds it
        # now: we know it is not us, not yet who
        return None if self._leader == self.address else self._leader

    def run(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                self._step(stop)
                failures = 0
            except Errors as exc:  # leadership lasts as long as the local lease, not longer
                failures += 1
                log.warning("leader election: %s (retrying)", str(exc)[:300])
                stop.wait(min(self.ttl_s / 4, self.retry_s * 2**failures))
        self.resign()

    def resign(self) -> None:
        """Release the lock (if held) and destroy the session; a successor need not wait."""
        with self._lock:
            session, leading = self._session, self._token is not None
            self._session, self._token = None, None
            self.lease.lost()
        try:
            if session is not None and leading:
                self.client.kv.put(self.key, "", release=session)
            if session is not None:
                self.client.session.destroy(session)
            if self._registered:
                self.client.agent.service.deregister(self.service_id)
                self._registered = False
            log.info("resigned (session %s)", session)
        except Errors as exc:
            log.warning("resigning failed (the lock frees when its check's TTL runs out): %s", exc)

    # ---- one round ---------------------------------------------------------------------------
    def _step(self, stop: threading.Event) -> None:
        session = self._ensure_session()
        if self._token is not None:
            self._hold(session, stop)
        else:
            self._campaign(session, stop)

    def _heartbeat(self) -> None:
        """Mark our TTL check passing (registering the service first when needed)."""
        if self._registered:
            try:
                self.client.agent.check.ttl_pass(self.check_id, notes=f"leader election for {self.key}")
                return
            except consul.NotFound:  # the agent forgot it (restarted without its data)
                log.warning("check %s is gone from the agent; registering again", self.check_id)
        split = urlsplit(self.address)
        check = {
            "CheckID": self.check_id,
            "Name": f"gpufed leader election ({self.key})",
            "TTL": f"{self.ttl_s}s",
            "Status": "passing",
            "DeregisterCriticalServiceAfter": "10m",
        }
        self.client.agent.service.register(
            self.service, service_id=self.service_id, address=split.hostname, port=split.port, check=check
        )
        self._registered = True

    def _ensure_session(self) -> str:
        """A live session of ours, bound to our check; both refreshed every TTL/3."""
        now = self._clock()
        if self._session is not None and now - self._renewed_at < self.ttl_s / 3:
            return self._session
        self._heartbeat()
        if self._session is not None:
            try:
                self.client.session.renew(self._session)
            except consul.NotFound:
                log.warning("session %s is gone (expired or destroyed)", self._session)
                self._step_down()
                self._session = None
            else:
                self._renewed_at = now
                if self._token is not None:
                    self.lease.renewed(now)
                return self._session
        session_id = self.client.session.create(
            name=self.name,
            ttl=self.ttl_s,
            lock_delay=self.lock_delay_s,
            behavior="release",
            checks=["serfHealth", self.check_id],
        )
        self._session, self._renewed_at = str(session_id), now
        return self._session

    def _campaign(self, session: str, stop: threading.Event) -> None:
        try:
            acquired = self.client.kv.put(self.key, self.address, acquire=session)
        except consul.ConsulException as exc:
            if "invalid session" not in str(exc):
                raise
            log.warning("session %s is gone (destroyed or expired); creating another", session)
            self._session = None
            return
        if acquired:
            _, entry = self.client.kv.get(self.key)
            if entry is not None and entry.get("Session") == session:
                with self._lock:
                    self._token = int(entry["ModifyIndex"])
                    self.lease.renewed(self._renewed_at)
                self._leader = self.address
                log.info("acquired the leader lock %s (fence %d)", self.key, self._token)
                return
        index, entry = self.client.kv.get(self.key)
        holder = entry.get("Session") if entry else None
        value = (entry.get("Value") or b"").decode(errors="replace") if entry else ""
        self._leader = value or None if holder else None
        if not holder:  # free but refused: another replica was faster, or lock-delay runs
            stop.wait(self.retry_s)
            return
        # held: sleep on the key until it changes (a blocking query), short enough to renew our
        # own session in time and to notice a shutdown soon
        wait = max(1.0, min(MAX_BLOCK_S, self.ttl_s / 3 - (self._clock() - self._renewed_at)))
        self._index, _ = self.client.kv.get(self.key, index=index, wait=f"{wait:.0f}s")

    def _hold(self, session: str, stop: threading.Event) -> None:
        _, entry = self.client.kv.get(self.key)
        if entry is None or entry.get("Session") != session:
            log.warning("the leader lock %s is no longer ours", self.key)
            self._step_down()
            return
        stop.wait(max(0.2, min(1.0, self.ttl_s / 3 - (self._clock() - self._renewed_at))))

    def _step_down(self) -> None:
        with self._lock:
            was = self._token is not None
            self._token = None
            self.lease.lost()
        if was:
            log.warning("stepped down as leader of %s", self.key)
        self._leader = None

    def describe(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "session": self._session,
            "ttl_s": self.ttl_s,
            "lock_delay_s": self.lock_delay_s,
        }
