"""The inbox: when the controller's one worker thread wakes, as a value.

The first stage of the live route (**inbox** -> place -> commit -> publish). The worker
(``loop``) sleeps here until a source pushes a change, the reconciler has work due
(debounce, grace, hysteresis) or a periodic pass is due (settle hand-overs as the leader,
follow the stored state as a follower, expire the built-in registry's entries); never a
fixed polling rate. :meth:`Inbox.wait`
answers with a :class:`Wake`; what the pass then runs is the worker's. This module only
keeps the clock of those passes: it holds no component and calls none back.
:func:`paused` runs a pass with the cyclic GC paused.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from federation.controller.base import heap
from federation.controller.base.options import ControllerOptions
from sharder.kernel.documents import gc_paused
from sharder.live.reconcile import Reconciler

FREEZE_AFTER_S = 0.5
"""A pass this long built a lot (a first placement, a full one): what it built stays."""
EXPIRE_EVERY_S = 1.0
"""How often the registry's expired entries go (a TTL is 90 s by default)."""


@dataclass(frozen=True)
class Wake:
    idle: bool
    """Nothing was due in the reconciler: a leader's pass may index for the first change."""


class Inbox:
    def __init__(
        self,
        reconciler: Reconciler,
        options: ControllerOptions,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reconciler, self._options, self._clock = reconciler, options, clock
        self._settle_at = self._refresh_at = self._expire_at = 0.0

    def wait(self, stop: threading.Event) -> Wake | None:
        """Sleep until something is due; None once ``stop`` is set."""
        seen = self._reconciler.generation
        due = self._reconciler.next_due()
        if due is None or due > 0:
            periodic = min(self._settle_at, self._refresh_at, self._expire_at) - self._clock()
            self._reconciler.wait_for_change(seen, periodic if due is None else min(due, periodic))
        return None if stop.is_set() else Wake(idle=due is None)

    def refresh_due(self) -> bool:
        """A follower's pass: is it time to read the stored state again (then counted)?"""
        if self._clock() < self._refresh_at:
            return False
        self._refresh_at = self._clock() + self._options.refresh_interval_s
        return True

    def expiry_due(self) -> bool:
        """Any pass: is it time to expire the registry's entries (then counted)?"""
        now = self._clock()
        if now < self._expire_at:
            return False
        self._expire_at = now + EXPIRE_EVERY_S
        return True

    def settle_due(self, *, leading: bool) -> bool:
        """A leader's pass: is it time to settle hand-overs (then counted)? Leading also puts
        off the follower's refresh (it starts one interval after the leadership ends)."""
        now = self._clock()
        if leading:
            self._refresh_at = now + self._options.refresh_interval_s
        if now < self._settle_at:
            return False
        self._settle_at = now + self._options.settle_interval_s
        return True


def paused(work: Callable[[], object]) -> object:
    """One pass with the cyclic GC paused; after a long one, what exists is frozen.

    A first placement of a million targets builds tens of millions of objects. With the
    collector running, each full pass walks all of them (seconds, over and over); paused,
    the first passes after it walk them once more. Frozen (``gc.freeze``), no pass walks
    them again: they live as long as the assignment, and they hold no reference cycles
    (plain models and containers), so refcounting frees them when they go."""
    started = time.monotonic()
    with gc_paused():
        result = work()
    if time.monotonic() - started >= FREEZE_AFTER_S:
        gc.freeze()
        heap.trim()  # what the long pass built and dropped goes back to the OS
    return result
