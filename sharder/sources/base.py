"""The seam between discovery sources and the reconcile loop, and shared retry pacing."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from sharder.model.inventory import Target


class DiscoverySink(Protocol):
    """Where sources push; ``sharder.live.reconcile.Reconciler`` implements it."""

    def on_change(self, source: str, targets: Iterable[Target], *, version: str | None = None) -> None: ...

    def on_error(self, source: str, reason: str) -> None: ...


class Source(Protocol):
    """A followed registry. ``poll_once`` does one round (one blocking query, one watch
    stream, one file check) and returns; ``run`` repeats it until ``stop`` is set."""

    name: str

    @property
    def answered(self) -> bool:
        """The first round since ``run`` started has ended: its set went to the sink, or it
        failed and the source keeps its last known set. A started controller is not ready
        before every source it follows has answered (``/readyz``: ``settling``): until then
        it serves what it had, maybe another source's set only."""
        ...

    def poll_once(self) -> object: ...

    def run(self, stop: threading.Event) -> None: ...


class Backoff:
    """Exponential delay with jitter, so many gpufed replicas do not retry in lock-step.

    ``next()`` returns the delay to wait now: ``initial * factor**k`` capped at ``maximum``,
    scaled by a random factor in ``[1 - jitter, 1]``; ``reset()`` after a success.
    """

    def __init__(
        self,
        *,
        initial: float = 0.5,
        maximum: float = 30.0,
        factor: float = 2.0,
        jitter: float = 0.5,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.initial, self.maximum, self.factor, self.jitter = initial, maximum, factor, jitter
        self._rand = rand
        self._delay = initial
        self.failures = 0

    def next(self) -> float:
        delay = min(self._delay, self.maximum)
        self._delay = min(self._delay * self.factor, self.maximum)
        self.failures += 1
        return delay * (1 - self.jitter * self._rand())

    def reset(self) -> None:
        self._delay = self.initial
        self.failures = 0
