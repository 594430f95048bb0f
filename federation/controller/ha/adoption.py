"""Serving a stored state: at start, when this replica takes over as leader, and as a
follower adopting the leader's newest state.

The controller façade owns the state and the one lock; these functions are its start-up
and adoption steps, ordered so SD answers in full before anything is placed: the stored
sets seed discovery, the stored assignment and the targets it was made from seed the
reconcile loop (nothing moves), and the SD snapshot is published before the state is
taken as current. :class:`Adoption` is given what it reads and the live pipeline it serves
through (``live.pipeline``: the committed state, the lock, commit and publish); it imports
nothing of the façade and calls nothing back.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from federation.controller.base.options import ControllerOptions
from federation.controller.base.state import ControllerState, overrides_of
from federation.controller.ha import replicating
from federation.controller.ha.replicating import Replication
from federation.controller.live.pipeline import Pipeline
from federation.controller.stores.store import StateStore
from sharder.engine.assignment import Assignment
from sharder.kernel.documents import gc_paused
from sharder.model.inventory import Target
from sharder.sources.registry import BuiltinRegistry

log = logging.getLogger(__name__)


class Reseedable(Protocol):
    """What adoption does to the live loop (``sharder.live.reconcile.Reconciler``): seed it
    from stored sets, hand it the overrides and the adopted assignment, and read its sets."""

    @property
    def target_map(self) -> Mapping[str, Target]: ...

    def source_sets(self) -> dict[str, list[Target]]: ...

    def seed(self, sets: Mapping[str, Sequence[Target]]) -> None: ...

    def on_change(self, source: str, targets: Iterable[Target], *, version: str | None = None) -> None: ...

    def set_overrides(
        self,
        *,
        shard_counts: Mapping[str, int] | None = None,
        pins: Mapping[str, str] | None = None,
        drained: Iterable[str] | None = None,
        weights: Mapping[str, int] | None = None,
    ) -> None: ...

    def reset(
        self, *, previous: Assignment | None, targets: Mapping[str, Target] | None = None, dirty: bool = False
    ) -> None: ...


class Adoption:
    """Start, take-over, a follower's refresh and resync: a stored state becomes the served one."""

    def __init__(
        self,
        *,
        pipeline: Pipeline,
        store: StateStore,
        registry: BuiltinRegistry,
        reconciler: Reseedable,
        replication: Replication,
        options: ControllerOptions,
        now: Callable[[], float],
    ) -> None:
        self.pipeline, self.store, self.registry = pipeline, store, registry
        self.reconciler, self.replication, self.options, self.now = reconciler, replication, options, now
        self.restored_fresh = False
        """``restore`` ran and no ``take_over`` since."""

    def restore(self) -> None:
        """Seed discovery from the persisted sets and serve the stored assignment at once.

        Run at start and again by :meth:`take_over`: the state is read afresh, a source the
        reconcile loop has not heard from yet starts from its stored set. Like a long tick
        (``inbox.paused``), it runs with the cyclic GC paused and freezes what it read: up to a
        million stored targets."""
        with self.pipeline.lock, gc_paused():
            state = self.store.load() or ControllerState()
            sets = self.store.load_sets()
            self.registry.seed(sets.pop("registry", []))
            live = self.reconciler.source_sets()
            self.reconciler.seed({name: targets for name, targets in sets.items() if name not in live})
            registered = self.registry.targets()
            if registered:
                self.reconciler.on_change("registry", registered, version="persisted")
            self.adopt(state)
            self.restored_fresh = True
        gc.freeze()

    def take_over(self) -> None:
        """This replica just became the leader: start from the stored state, then record the
        new fencing token in the store before anything else is written."""
        with self.pipeline.lock:
            # One replica without election (no fencing token) restored a moment ago at start,
            # and nobody else writes its store: reading a million rows again is only waiting.
            if not (self.restored_fresh and self.replication.fencing_token() is None):
                self.restore()
            self.restored_fresh = False
            audit = self.replication.lead_audit(at=self.now())
            if audit is not None:
                self.pipeline.commit(self.pipeline.state, audit=audit)
            fence = self.replication.fencing_token()
            log.info("leading from revision %d (fence %s)", self.pipeline.state.revision, fence)

    def refresh_from_store(self) -> bool:
        """Follower: adopt the leader's newest state; True when the SD snapshot changed."""
        new = self.replication.read_state()
        if new is None:
            return False
        with self.pipeline.lock:
            if not self.replication.should_adopt(self.pipeline.state, new):
                self.pipeline.keep_stored(new)
                return False
            targets = self.targets_of(new.assignment, self.store.load_sets())
            missing = new.assignment is not None and len(targets) < len(new.assignment.targets)
            if self.replication.withhold(missing=missing):
                return False
            self.serve_stored(new, targets)
            return True

    def resync(self) -> None:
        """After a lost check-and-set: the stored state wins, is served, and the loop places
        what this replica knows on top of it at the next tick."""
        new = self.replication.read_state()
        if new is not None:
            with self.pipeline.lock:
                self.adopt(new)

    def adopt(self, state: ControllerState) -> None:
        """Make a stored state this replica's: the loop builds on it, SD serves it (lock held)."""
        targets = self.targets_of(state.assignment, self.reconciler.source_sets())
        self.serve_stored(state, targets, dirty=True)

    def serve_stored(
        self, state: ControllerState, targets: dict[str, Target], *, dirty: bool = False
    ) -> None:
        self.reconciler.set_overrides(**overrides_of(state.desired))
        self.reconciler.reset(previous=state.assignment, targets=targets, dirty=dirty)
        self.replication.adopted()
        self.pipeline.serve_stored(state, targets)

    def targets_of(
        self, assignment: Assignment | None, sets: Mapping[str, Sequence[Target]]
    ) -> dict[str, Target]:
        return replicating.targets_of(
            assignment, sets, live=self.reconciler.target_map, precedence=self.options.precedence
        )
