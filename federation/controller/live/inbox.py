"""The controller's one worker thread: when it wakes and what it runs.

It sleeps until a source pushes a change, the reconciler has work due (debounce, grace,
hysteresis) or a periodic pass is due (settle hand-overs as the leader, follow the stored
state as a follower); never a fixed polling rate. Each pass runs with the cyclic GC paused
(:func:`tick`). What each pass does is the host's (the
controller façade); this module only orders it, so it imports nothing of the façade.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from federation.controller.options import ControllerOptions
from sharder.documents import gc_paused
from sharder.reconcile import Reconciler

log = logging.getLogger(__name__)


class Leadership(Protocol):
    """Whether this replica writes (``ha.replica.Replication`` is one)."""

    def may_write(self) -> bool: ...

    def on_leadership_change(self, leading: bool, *, take_over: Callable[[], None]) -> None: ...


class LoopHost(Protocol):
    """What a pass runs; ``Controller`` is one."""

    reconciler: Reconciler
    options: ControllerOptions

    @property
    def replication(self) -> Leadership: ...

    def take_over(self) -> None: ...

    def refresh_from_store(self) -> bool: ...

    def share_fetches(self) -> None: ...

    def tick(self, *, idle: bool) -> object: ...

    def settle(self) -> int: ...


FREEZE_AFTER_S = 0.5
"""A tick this long built a lot (a first placement, a full one): what it built stays."""


def tick(host: LoopHost, *, idle: bool) -> None:
    """One pass with the cyclic GC paused; after a long one, what exists is frozen.

    A first placement of a million targets builds tens of millions of objects. With the
    collector running, each full pass walks all of them (seconds, over and over); paused,
    the first passes after it walk them once more. Frozen (``gc.freeze``), no pass walks
    them again: they live as long as the assignment, and they hold no reference cycles
    (plain models and containers), so refcounting frees them when they go."""
    started = time.monotonic()
    with gc_paused():
        host.tick(idle=idle)
    if time.monotonic() - started >= FREEZE_AFTER_S:
        gc.freeze()


def run(host: LoopHost, stop: threading.Event) -> None:
    reconciler, replication, options = host.reconciler, host.replication, host.options
    settle_at = refresh_at = 0.0
    while not stop.is_set():
        seen = reconciler.generation
        due = reconciler.next_due()
        if due is None or due > 0:
            periodic = min(settle_at, refresh_at) - time.monotonic()
            reconciler.wait_for_change(seen, periodic if due is None else min(due, periodic))
        if stop.is_set():
            break
        try:
            leading = replication.may_write()
            replication.on_leadership_change(leading, take_over=host.take_over)
            if not leading:  # a follower: serve what the leader stored
                if time.monotonic() >= refresh_at:
                    refresh_at = time.monotonic() + options.refresh_interval_s
                    host.refresh_from_store()
                    host.share_fetches()
                continue
            refresh_at = time.monotonic() + options.refresh_interval_s
            tick(host, idle=due is None)
            if time.monotonic() >= settle_at:
                settle_at = time.monotonic() + options.settle_interval_s
                host.share_fetches()
                host.settle()
        except Exception:  # the loop must outlive any one bad tick
            log.exception("controller loop iteration failed")
