"""Replicas: one leader writes the shared state, followers serve it (a mixin of ``Controller``).

Several ``gpufed serve`` processes share one store (Consul KV); the elector
(``federation.controller.leader``) says which one may write. This part of the controller is
what changes hands between them:

* :meth:`Replication.take_over` runs once when a replica becomes the leader, before its
  first write: it re-reads the stored state and last-known sets (``Controller.restore``),
  so the reconcile loop builds on the stored assignment and nothing moves because of a
  failover, hand-overs in flight carry on from their stored deadlines, and the new
  fencing token is recorded in the store with an audit entry (``lead``). From then on the
  store refuses writes of the deposed leader, even one already in flight.
* :meth:`Replication.refresh_from_store` runs every ``refresh_interval_s`` on a follower:
  it adopts the leader's newest state and, when the assignment or the hand-overs changed,
  publishes the SD snapshot built from it (targets from the stored sets, else from this
  replica's own sources), so followers answer HTTP SD and reads within that bound
  (``state_age_s`` in ``/v1/status``).
* After a lost check-and-set, :meth:`Replication._resync` makes the stored state this
  replica's again (served at once), and the next tick places what it knows on top.
* :meth:`Replication.share_fetches`: children poll any replica, but only the leader ends
  hand-overs, a window after the new shard's child first fetched its list; so every
  replica records in the store when it served each shard, and the leader reads them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from federation.controller.children import Children
from federation.controller.metrics import ControllerMetrics
from federation.controller.options import ControllerOptions
from federation.controller.state import AuditEntry, ControllerState, overrides_of
from federation.controller.store import StateStore, StoreError
from sharder.assignment import Assignment
from sharder.inventory import Target
from sharder.reconcile import Reconciler
from sharder.sources.registry import BuiltinRegistry
from sharder.targetsets import merge_sets

log = logging.getLogger(__name__)
WITHHOLD_REFRESHES = 3
"""Refreshes a follower keeps its previous SD answers while the new assignment names
targets it cannot find, before it serves what it has."""


@runtime_checkable
class FetchLog(Protocol):
    """A shared store that also carries each replica's SD fetch times (``ConsulStore``)."""

    def note_fetches(self, replica: str, fetched: Mapping[str, float]) -> None: ...

    def fetches(self) -> dict[str, float]: ...


FETCH_STEP_S = 5.0
"""A replica writes its fetch times when one moved on by this much: children fetch every
few seconds, a hand-over window is tens of seconds, one write per replica per step."""


def replica_id() -> str:
    """A name for this controller instance's key (host, process, and a random part)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Replication:
    """What ``Controller`` does as a leader or a follower; attributes below are Controller's."""

    store: StateStore
    state: ControllerState
    options: ControllerOptions
    metrics: ControllerMetrics
    reconciler: Reconciler
    registry: BuiltinRegistry
    _lock: threading.RLock
    _wall: Callable[[], float]
    _can_write: Callable[[], bool]
    _fence: Callable[[], int | None]
    _leader: Callable[[], str | None]
    _refreshed_at: float | None
    _sd_incomplete: bool
    _withheld: int
    children: Children
    _fetches_shared: dict[str, float]
    replica_id: str

    def restore(self) -> None:
        raise NotImplementedError

    def _publish(self, *, targets: Mapping[str, Target], state: ControllerState | None = None) -> None:
        raise NotImplementedError

    def _commit(self, state: ControllerState, *, audit: AuditEntry | None) -> None:
        raise NotImplementedError

    def _adopt(self, state: ControllerState) -> None:
        """Make a stored state this replica's: the loop builds on it, SD serves it (lock held)."""
        targets = self._targets_of(state.assignment, self.reconciler.source_sets())
        self.reconciler.set_overrides(**overrides_of(state.desired))
        self.reconciler.reset(previous=state.assignment, targets=targets, dirty=True)
        self._refreshed_at = time.monotonic()
        if state.assignment is not None:
            self._publish(targets=targets, state=state)  # SD first: never "ready" without answers
        self.state = state

    def _targets_of(
        self, assignment: Assignment | None, sets: Mapping[str, Sequence[Target]]
    ) -> dict[str, Target]:
        """identity -> target for the identities ``assignment`` places, from ``sets`` (merged
        by precedence), else from what this replica's own sources last pushed."""
        if assignment is None:
            return {}
        merged = merge_sets(
            {n: {t.identity: t for t in ts} for n, ts in sets.items()}, self.options.precedence
        )
        live = self.reconciler.target_map
        out = {}
        for identity in assignment.targets:
            target = merged.get(identity) or live.get(identity)
            if target is not None:
                out[identity] = target
        return out

    def take_over(self) -> None:
        """This replica just became the leader: start from the stored state, then record the
        new fencing token in the store before anything else is written (from then on a write
        of the deposed leader, even one already in flight, is refused)."""
        with self._lock:
            self.restore()
            fence = self._fence()
            if fence is not None:
                detail = {"fence": fence, "replica": self._leader()}
                self._commit(
                    self.state,
                    audit=AuditEntry(at=self._wall(), actor="leader-election", action="lead", detail=detail),
                )
            log.info("leading from revision %d (fence %s)", self.state.revision, fence)

    def refresh_from_store(self) -> bool:
        """Follower: adopt the leader's newest state; True when the SD snapshot changed."""
        try:
            state = self.store.load()
        except StoreError as exc:
            self.metrics.store_errors.inc()
            log.warning("follower cannot read the shared state (serving what it has): %s", exc)
            return False
        self._refreshed_at = time.monotonic()
        with self._lock:
            before, new = self.state, state or ControllerState()
            if (
                not self._sd_incomplete
                and before.assignment_version == new.assignment_version
                and before.handovers == new.handovers
            ):
                self.state = new
                return False
            targets = self._targets_of(new.assignment, self.store.load_sets())
            missing = new.assignment is not None and len(targets) < len(new.assignment.targets)
            if missing and self._withheld < WITHHOLD_REFRESHES:
                # a target placed but not in the stored sets yet (a race, or one in its grace
                # period that this replica never saw): keep the previous answers a little
                self._withheld += 1
                return False
            self._withheld, self._sd_incomplete = 0, missing
            self.reconciler.set_overrides(**overrides_of(new.desired))
            self.reconciler.reset(previous=new.assignment, targets=targets)
            self._publish(targets=targets, state=new)  # SD first: never "ready" without its answers
            self.state = new
            return True

    def replica_status(self) -> dict[str, Any]:
        leading = self._can_write()
        age = None if self._refreshed_at is None else time.monotonic() - self._refreshed_at
        return {
            "role": "leader" if leading else "follower",
            "leader": self._leader(),
            "fence": self._fence() if leading else None,
            "state_revision": self.state.revision,
            "state_age_s": 0.0 if leading else (None if age is None else round(age, 1)),
        }

    def _resync(self) -> None:
        """After a lost check-and-set: the stored state wins, is served, and the loop places
        what this replica knows on top of it at the next tick."""
        try:
            state = self.store.load() or ControllerState()
        except StoreError as exc:
            log.warning("re-reading the state after a lost write failed: %s", exc)
            return
        with self._lock:
            self._adopt(state)

    def share_fetches(self) -> None:
        """Children poll whichever replica their load balancer picks, and a hand-over ends a
        window after the new shard's child fetched its list: every replica records what it
        served in the shared store, and the leader reads them all."""
        if not isinstance(self.store, FetchLog):
            return
        try:
            mine = dict(self.children.sd_fetched)
            shared = self._fetches_shared
            if any(at >= shared.get(shard, float("-inf")) + FETCH_STEP_S for shard, at in mine.items()):
                self.store.note_fetches(self.replica_id, mine)
                self._fetches_shared = mine
            if self._can_write():
                self.children.remote_fetched = self.store.fetches()
        except StoreError as exc:
            log.warning("sharing SD fetch times failed: %s", exc)
