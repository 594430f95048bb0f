"""The doors every change goes through, in order: commit, then publish.

A reconcile step (``place.state_after``), an applied plan, finished hand-overs, a new
leader's first audit entry: each is a state to commit and then serve. :class:`Pipeline`
holds the committed state, the one lock that orders changes, and the two doors: commit (one
fenced ``StateStore.apply``: state, audit, set deltas; a registry deletion's journal goes
through the same call, without a state) and publish (``publish.Publication``:
SD first, metrics, then file_sd lists or the config bundle). A state read from the store
(restore, take-over, a follower's refresh) enters at the second door only
(:meth:`Pipeline.serve_stored`): it is committed already.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from federation.controller.base.metrics import ControllerMetrics
from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.live.publish import Publication
from federation.controller.stores.store import Changed, Commit, StateStore, StoreError
from sharder.engine.step import NO_SETS, SetChanges
from sharder.model.inventory import Target


class Pipeline:
    def __init__(
        self,
        *,
        store: StateStore,
        publication: Publication,
        metrics: ControllerMetrics,
        fence: Callable[[], int | None],
        state: ControllerState,
    ) -> None:
        self.store, self.publication, self.metrics, self._fence = store, publication, metrics, fence
        self.state = state
        """The state the store accepted last (or a stored one this replica serves)."""
        self.lock = threading.RLock()
        """Orders every change to the served state; reads never take it."""

    def busy(self) -> bool:
        """Another thread holds the lock now: a change is being placed, committed or
        published (a start-up placement of a million targets holds it for a minute)."""
        if not self.lock.acquire(blocking=False):
            return True
        self.lock.release()
        return False

    def commit(
        self,
        state: ControllerState,
        *,
        audit: AuditEntry | None = None,
        changed: Changed | None = None,
        sets: SetChanges = NO_SETS,
    ) -> ControllerState:
        """One fenced call writes the state, its audit entry and the step's set changes;
        nothing is served that the store refused (``StoreError`` and its kin propagate)."""
        expected = self.state.revision if self.state.revision else None
        commit = Commit(state=state, expected_revision=expected, audit=audit, changed=changed, sets=sets)
        saved = self._apply(commit)
        if saved is None:  # a store that took a state must name its revision
            raise StoreError("the store accepted the state but returned none")
        self.state = saved
        return saved

    def journal(self, sets: SetChanges) -> None:
        """Set changes that carry no state (a registry deletion), durable before they are
        acknowledged, through the same fenced call: a deposed leader writes none of it."""
        if sets:
            self._apply(Commit.journal(sets))

    def _apply(self, commit: Commit) -> ControllerState | None:
        try:
            return self.store.apply(commit, fence=self._fence())
        except StoreError:
            self.metrics.store_errors.inc()
            raise

    def publish(self, targets: Mapping[str, Target], *, changed: Changed | None = None) -> None:
        """Serve the committed state: ``changed`` is what may differ from what is served now."""
        self.publication.publish(self.state, targets, changed=changed)

    def keep_stored(self, state: ControllerState) -> None:
        """A stored state whose answers are the ones served now (a follower's refresh that
        keeps the assignment): it becomes current, nothing is published."""
        self.state = state

    def serve_stored(self, state: ControllerState, targets: Mapping[str, Target]) -> None:
        """A state from the store: SD first (never "ready" without answers), then it is current."""
        if state.assignment is not None:
            self.publication.publish(state, targets)
        self.state = state
