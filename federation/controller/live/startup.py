"""Start-up: when a started controller has settled, so that ``/readyz`` can mean it.

A controller serves HTTP SD as soon as its first assignment is published, but the work
its start began goes on after that: the sources it follows give their first sets (a
million-target inventory takes seconds to read, while an empty Kubernetes listing is
placed and published at once), those sets are placed, the first config bundle is rendered
and checked by promtool (file_sd children read nothing before it), and after a restart the
stored assignment is indexed for the incremental engine, or the first change pays for it.
Until all of it has ended the process runs at a full core and a change waits behind it; an
orchestrator that routes traffic by ``/readyz`` should know. :class:`StartUp` answers
``starting`` (nothing published yet), ``settling`` (SD is served, start-up work is in
flight) or ``ready``; it latches: a later re-render does not make the replica unready.
A controller whose loops were never started (tests that drive it by hand) has no
start-up work, so it is ready once SD is published, as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

Readiness = Literal["starting", "settling", "ready"]


class StartUp:
    def __init__(
        self,
        *,
        published: Callable[[], bool],
        work_done: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``published``: SD answers exist; ``work_done``: the start-up work has ended (the
        sources' first sets placed, the first bundle, the engine's index; asked only while
        armed and not yet settled, one call at a time)."""
        self._published, self._work_done, self._clock = published, work_done, clock
        self._lock = threading.Lock()
        self._armed_at: float | None = None
        self.settled_after_s: float | None = None
        """Seconds from :meth:`arm` until the work was first seen done (None: not yet)."""

    def arm(self) -> None:
        """The loops start now: readiness waits for their start-up work."""
        with self._lock:
            self._armed_at, self.settled_after_s = self._clock(), None

    def state(self) -> Readiness:
        if not self._published():
            return "starting"
        with self._lock:
            if self._armed_at is None or self.settled_after_s is not None:
                return "ready"
            if not self._work_done():
                return "settling"
            self.settled_after_s = round(self._clock() - self._armed_at, 3)
            return "ready"
