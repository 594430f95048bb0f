"""The controller's one worker thread: each pass, forward.

What wakes it is the inbox's (``live.inbox``); what a pass runs is ordered here, each
component handed what it needs and nothing called back: as the leader, one reconcile step
along the route (``live.route``: place -> commit -> publish) and, when due, settled
hand-overs; as a follower, the leader's newest stored state (``ha.adoption``). In either
role, once a second, the built-in registry's expired entries go (``BuiltinRegistry.expire``:
the registry has no thread; what expires is offered to the loop like a DELETE). A change of
role takes over first (``Adoption.take_over``); a lost check-and-set or fence adopts the
stored state (``Adoption.resync``), and the loop places on top of it at the next pass.
"""

from __future__ import annotations

import logging
import threading

from federation.controller.ha.adoption import Adoption
from federation.controller.ha.replicating import Replication
from federation.controller.live.children import Children
from federation.controller.live.inbox import Inbox, paused
from federation.controller.live.route import Route
from federation.controller.stores.store import FencedOut, StoreConflict
from sharder.engine.step import Step
from sharder.sources.registry import BuiltinRegistry

log = logging.getLogger(__name__)


class Worker:
    def __init__(
        self,
        *,
        inbox: Inbox,
        route: Route,
        adoption: Adoption,
        replication: Replication,
        children: Children,
        registry: BuiltinRegistry,
    ) -> None:
        self.inbox, self.route, self.adoption = inbox, route, adoption
        self.replication, self.children, self.registry = replication, children, registry

    def run(self, stop: threading.Event) -> None:
        while (wake := self.inbox.wait(stop)) is not None:
            try:
                self.one_pass(idle=wake.idle)
            except Exception:  # the loop must outlive any one bad pass
                log.exception("controller loop iteration failed")

    def one_pass(self, *, idle: bool) -> None:
        if self.inbox.expiry_due():
            self.registry.expire()
        leading = self.replication.may_write()
        if leading and not self.replication.leading:
            self.adoption.take_over()  # raises: still a follower here, tried again next pass
        self.replication.note_role(leading)
        if not leading:  # a follower: serve what the leader stored
            if self.inbox.refresh_due():
                self.adoption.refresh_from_store()
                self.replication.share_fetches(self.children)
            return
        paused(lambda: self.step(idle=idle))
        if self.inbox.settle_due(leading=True):
            self.replication.share_fetches(self.children)
            self.settle()

    def step(self, *, idle: bool) -> Step | None:
        """One reconcile step as the leader (``Route.tick``); a lost check-and-set or fence:
        the stored state wins, and is served."""
        try:
            return self.route.tick(idle=idle)
        except (StoreConflict, FencedOut):
            self.adoption.resync()
            raise

    def settle(self) -> int:
        try:
            return self.route.settle()
        except (StoreConflict, FencedOut):
            self.adoption.resync()
            raise
