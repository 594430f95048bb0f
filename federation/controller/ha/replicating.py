"""Replication: which replica may write, with which fencing token, and what a follower adopts.

Several ``gpufed serve`` processes share one store (Consul KV); the elector
(``federation.controller.ha.leader``) says which one may write. :class:`Replication` is the
collaborator the controller's commit step asks; it holds no controller state and never
calls back into the controller (data flows one way: it answers, the controller acts):

* :meth:`Replication.may_write` / :meth:`Replication.fencing_token`: asked before every
  write; the token goes with the write, so the store refuses a deposed leader's write even
  one already in flight.
* :attr:`Replication.leading` / :meth:`Replication.note_role`: the role the worker saw last
  and this pass; a replica that just became the leader first re-reads the stored state
  (``Adoption.take_over``, run by ``loop``) and records :meth:`Replication.lead_audit` (its
  new token) before anything else.
* :meth:`Replication.read_state` and :meth:`Replication.should_adopt`: a follower reads the
  leader's newest state every ``refresh_interval_s`` and adopts it when the assignment or
  the hand-overs changed; while the new assignment names targets this replica cannot find,
  it keeps its previous answers for a few refreshes (:meth:`Replication.withhold`).
* :meth:`Replication.share_fetches`: children poll any replica, but only the leader ends
  hand-overs, a window after the new shard's child first fetched its list; so every
  replica records in the store when it served each shard, and the leader reads them.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from federation.controller.base.metrics import ControllerMetrics
from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.live.children import Children
from federation.controller.stores.store import StateStore, StoreError
from sharder.engine.assignment import Assignment
from sharder.engine.targetsets import merge_sets
from sharder.model.inventory import Target

log = logging.getLogger(__name__)
WITHHOLD_REFRESHES = 3
"""Refreshes a follower keeps its previous SD answers while the new assignment names
targets it cannot find, before it serves what it has."""

FETCH_STEP_S = 5.0
"""A replica writes its fetch times when one moved on by this much: children fetch every
few seconds, a hand-over window is tens of seconds, one write per replica per step."""


@runtime_checkable
class FetchLog(Protocol):
    """A shared store that also carries each replica's SD fetch times (``ConsulStore``)."""

    def note_fetches(self, replica: str, fetched: Mapping[str, float]) -> None: ...

    def fetches(self) -> dict[str, float]: ...


def replica_id() -> str:
    """A name for this controller instance's key (host, process, and a random part)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def targets_of(
    assignment: Assignment | None,
    sets: Mapping[str, Sequence[Target]],
    *,
    live: Mapping[str, Target],
    precedence: Sequence[str],
) -> dict[str, Target]:
    """identity -> target for the identities ``assignment`` places, from the stored ``sets``
    (merged by precedence), else from what this replica's own sources last pushed (``live``)."""
    if assignment is None:
        return {}
    merged = merge_sets({n: {t.identity: t for t in ts} for n, ts in sets.items()}, precedence)
    out = {}
    for identity in assignment.targets:
        target = merged.get(identity) or live.get(identity)
        if target is not None:
            out[identity] = target
    return out


class Replication:
    """The commit step's collaborator for leadership, fencing and following the leader."""

    def __init__(
        self,
        *,
        store: StateStore,
        metrics: ControllerMetrics,
        can_write: Callable[[], bool] = lambda: True,
        fence: Callable[[], int | None] = lambda: None,
        leader: Callable[[], str | None] = lambda: None,
        name: str | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self._can_write = can_write
        self._fence = fence
        self._leader = leader
        self.replica_id = name or replica_id()
        self._leading = False
        self._refreshed_at: float | None = None
        self._sd_incomplete = False
        self._withheld = 0
        self._fetches_shared: dict[str, float] = {}

    # ---- what the commit step asks ----------------------------------------------------------
    def may_write(self) -> bool:
        return self._can_write()

    def fencing_token(self) -> int | None:
        return self._fence()

    def leader(self) -> str | None:
        return self._leader()

    @property
    def leading(self) -> bool:
        """The role the last pass saw (``note_role``)."""
        return self._leading

    def note_role(self, leading: bool) -> None:
        """The role the loop saw this pass, noted once a new leader has taken over (a
        take-over that raised leaves this replica a follower: it tries again next pass)."""
        if not leading and self._leading:
            log.warning("no longer the leader; following %s", self._leader())
        self._leading = leading

    def lead_audit(self, *, at: float) -> AuditEntry | None:
        """The audit entry a new leader writes first (its fencing token), None unfenced."""
        fence = self._fence()
        if fence is None:
            return None
        detail = {"fence": fence, "replica": self._leader()}
        return AuditEntry(at=at, actor="leader-election", action="lead", detail=detail)

    # ---- following the leader ----------------------------------------------------------------
    def adopted(self) -> None:
        """The controller now serves a stored state: its age counts from here."""
        self._refreshed_at = time.monotonic()

    def read_state(self) -> ControllerState | None:
        """The leader's newest state (empty when none is stored); None when the store failed."""
        try:
            state = self.store.load()
        except StoreError as exc:
            self.metrics.store_errors.inc()
            log.warning("follower cannot read the shared state (serving what it has): %s", exc)
            return None
        self._refreshed_at = time.monotonic()
        return state or ControllerState()

    def should_adopt(self, current: ControllerState, new: ControllerState) -> bool:
        """Whether ``new`` changes what is served (assignment, hand-overs, or answers left
        incomplete by the last adoption)."""
        return (
            self._sd_incomplete
            or current.assignment_version != new.assignment_version
            or current.handovers != new.handovers
        )

    def withhold(self, *, missing: bool) -> bool:
        """True: keep the previous answers this time (the new assignment names targets not
        in the stored sets yet: a race, or one in its grace period this replica never saw)."""
        if missing and self._withheld < WITHHOLD_REFRESHES:
            self._withheld += 1
            return True
        self._withheld, self._sd_incomplete = 0, missing
        return False

    def status(self, *, revision: int) -> dict[str, Any]:
        leading = self._can_write()
        age = None if self._refreshed_at is None else time.monotonic() - self._refreshed_at
        return {
            "role": "leader" if leading else "follower",
            "leader": self._leader(),
            "fence": self._fence() if leading else None,
            "state_revision": revision,
            "state_age_s": 0.0 if leading else (None if age is None else round(age, 1)),
        }

    def share_fetches(self, children: Children) -> None:
        """Children poll whichever replica their load balancer picks, and a hand-over ends a
        window after the new shard's child fetched its list: every replica records what it
        served in the shared store, and the leader reads them all."""
        if not isinstance(self.store, FetchLog):
            return
        try:
            mine = dict(children.sd_fetched)
            shared = self._fetches_shared
            if any(at >= shared.get(shard, float("-inf")) + FETCH_STEP_S for shard, at in mine.items()):
                self.store.note_fetches(self.replica_id, mine)
                self._fetches_shared = mine
            if self._can_write():
                children.remote_fetched = self.store.fetches()
        except StoreError as exc:
            log.warning("sharing SD fetch times failed: %s", exc)
