"""Serving a stored state: at start, when this replica takes over as leader, and as a
follower adopting the leader's newest state.

The controller façade owns the state and the one lock; these functions are its start-up
and adoption steps, ordered so SD answers in full before anything is placed: the stored
sets seed discovery, the stored assignment and the targets it was made from seed the
reconcile loop (nothing moves), and the SD snapshot is published before the state is
taken as current. Like ``loop``, the module imports nothing of the façade (``AdoptionHost``).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from federation.controller.ha import replica as replicating
from federation.controller.ha.replica import Replication
from federation.controller.options import ControllerOptions
from federation.controller.state import AuditEntry, ControllerState, overrides_of
from federation.controller.stores.store import StateStore
from sharder.assignment import Assignment
from sharder.documents import gc_paused
from sharder.inventory import Target
from sharder.reconcile import Reconciler
from sharder.sources.registry import BuiltinRegistry

log = logging.getLogger(__name__)


class AdoptionHost(Protocol):
    """What adopting a state reads and sets; ``Controller`` is one."""

    state: ControllerState
    store: StateStore
    registry: BuiltinRegistry
    reconciler: Reconciler
    replication: Replication
    options: ControllerOptions
    restored_fresh: bool

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    def now(self) -> float: ...

    def commit(self, state: ControllerState, *, audit: AuditEntry | None) -> None: ...

    def publish(self, *, targets: Mapping[str, Target], state: ControllerState) -> None: ...


def restore(host: AdoptionHost) -> None:
    """Seed discovery from the persisted sets and serve the stored assignment at once.

    Run at start and again by :func:`take_over`: the state is read afresh, a source the
    reconcile loop has not heard from yet starts from its stored set. Like a long tick
    (``loop.tick``), it runs with the cyclic GC paused and freezes what it read: up to a
    million stored targets."""
    with host.lock, gc_paused():
        state = host.store.load() or ControllerState()
        sets = host.store.load_sets()
        host.registry.seed(sets.pop("registry", []))
        live = host.reconciler.source_sets()
        host.reconciler.seed({name: targets for name, targets in sets.items() if name not in live})
        registered = host.registry.targets()
        if registered:
            host.reconciler.on_change("registry", registered, version="persisted")
        adopt(host, state)
        host.restored_fresh = True
    gc.freeze()


def take_over(host: AdoptionHost) -> None:
    """This replica just became the leader: start from the stored state, then record the
    new fencing token in the store before anything else is written."""
    with host.lock:
        # One replica without election (no fencing token) restored a moment ago at start,
        # and nobody else writes its store: reading a million rows again is only waiting.
        if not (host.restored_fresh and host.replication.fencing_token() is None):
            restore(host)
        host.restored_fresh = False
        audit = host.replication.lead_audit(at=host.now())
        if audit is not None:
            host.commit(host.state, audit=audit)
        fence = host.replication.fencing_token()
        log.info("leading from revision %d (fence %s)", host.state.revision, fence)


def refresh_from_store(host: AdoptionHost) -> bool:
    """Follower: adopt the leader's newest state; True when the SD snapshot changed."""
    new = host.replication.read_state()
    if new is None:
        return False
    with host.lock:
        if not host.replication.should_adopt(host.state, new):
            host.state = new
            return False
        targets = targets_of(host, new.assignment, host.store.load_sets())
        missing = new.assignment is not None and len(targets) < len(new.assignment.targets)
        if host.replication.withhold(missing=missing):
            return False
        serve_stored(host, new, targets)
        return True


def resync(host: AdoptionHost) -> None:
    """After a lost check-and-set: the stored state wins, is served, and the loop places
    what this replica knows on top of it at the next tick."""
    new = host.replication.read_state()
    if new is not None:
        with host.lock:
            adopt(host, new)


def adopt(host: AdoptionHost, state: ControllerState) -> None:
    """Make a stored state this replica's: the loop builds on it, SD serves it (lock held)."""
    targets = targets_of(host, state.assignment, host.reconciler.source_sets())
    serve_stored(host, state, targets, dirty=True)


def serve_stored(
    host: AdoptionHost, state: ControllerState, targets: dict[str, Target], *, dirty: bool = False
) -> None:
    host.reconciler.set_overrides(**overrides_of(state.desired))
    host.reconciler.reset(previous=state.assignment, targets=targets, dirty=dirty)
    host.replication.adopted()
    if state.assignment is not None:
        host.publish(targets=targets, state=state)  # SD first: never "ready" without answers
    host.state = state


def targets_of(
    host: AdoptionHost, assignment: Assignment | None, sets: Mapping[str, Sequence[Target]]
) -> dict[str, Target]:
    return replicating.targets_of(
        assignment, sets, live=host.reconciler.target_map, precedence=host.options.precedence
    )
