"""The leader-election seam: which ``gpufed serve`` replica may write, and with which token.

Several replicas share one state store (Consul KV); exactly one of them, the leader,
runs the reconcile loop's writes, applies plans and settles hand-overs. The others
(followers) serve HTTP SD and reads from the shared state and answer mutating calls with
503 and the leader's address. The :class:`~federation.controller.controller.Controller` only
sees two callables taken from an elector: ``can_write`` (:meth:`LeaderElector.is_leader`)
and ``fence`` (:meth:`LeaderElector.fence`).

Electors: :class:`AlwaysLeader` (one replica, the default), ``consul_lock.ConsulLock``
(a Consul session lock, bare metal) and a Kubernetes ``coordination.k8s.io/v1`` Lease
(``lease.py``). What every implementation promises:

* ``run(stop)`` campaigns and renews until ``stop`` is set, in the calling thread; it
  never raises (an error costs leadership, then it campaigns again), and it resigns
  before returning.
* ``is_leader()`` is True only while the lease is held **and** still valid by the local
  monotonic clock: the lease counts from the *start* of the last successful renewal, so
  a process paused past its TTL (SIGSTOP, a long GC, a frozen VM) answers False the
  moment it wakes, before any network call tells it so. :class:`LocalLease` does this.
* ``fence()`` is the token of the current term, strictly greater than every earlier
  term's (Consul: the raft index at which the lock was acquired; a Lease: its
  resourceVersion at acquisition); None when not leading. Every store write carries it
  and the store refuses a token older than the newest it has recorded, which covers the
  writes already in flight when a pause began.
* ``leader_address()`` is the advertised URL of the current leader (this replica's own
  when leading), None when nobody holds the lease or it is unknown.
* ``resign()`` gives the lease up at once (shutdown), so a successor need not wait for
  the TTL to run out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class LeaderElector(Protocol):
    def is_leader(self) -> bool: ...

    def fence(self) -> int | None: ...

    def leader_address(self) -> str | None: ...

    def run(self, stop: threading.Event) -> None: ...

    def resign(self) -> None: ...


class AlwaysLeader:
    """One replica, no election: always the leader, no fencing token."""

    def __init__(self, *, address: str | None = None) -> None:
        self.address = address

    def is_leader(self) -> bool:
        return True

    def fence(self) -> int | None:
        return None

    def leader_address(self) -> str | None:
        return self.address

    def run(self, stop: threading.Event) -> None:
        stop.wait()

    def resign(self) -> None:
        pass


class LocalLease:
    """How long this process may still act as leader, by its own monotonic clock.

    ``renewed(started_at)`` after every successful acquire/renew, with the monotonic time
    the request was *sent*: the server counts its TTL from when it received it, later,
    so ``started_at + ttl_s`` never outlives the server's lease. ``CLOCK_MONOTONIC``
    keeps running while a process is stopped, so a paused leader finds its lease gone.
    """

    def __init__(self, *, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._valid_until: float | None = None
        self._lock = threading.Lock()

    def renewed(self, started_at: float) -> None:
        with self._lock:
            self._valid_until = started_at + self.ttl_s

    def lost(self) -> None:
        with self._lock:
            self._valid_until = None

    def valid(self) -> bool:
        with self._lock:
            return self._valid_until is not None and self._clock() < self._valid_until

    def remaining_s(self) -> float:
        with self._lock:
            return 0.0 if self._valid_until is None else max(0.0, self._valid_until - self._clock())
