"""Per-token rate limit on the built-in registry: a token bucket per caller, 429 when empty.

Registrations cost what they make the controller do, so a batch costs one per entry
(put or delete), a PUT or DELETE one. A bucket holds ``burst`` and refills at ``rate``
per second. A request larger than ``burst`` (a fleet batch bigger than the bucket) is
let through when the bucket is full and leaves it in debt, so it is never refused
forever; the debt is what ``Retry-After`` counts down for the next request.

Time is injected (``clock``) so tests need no sleeps.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


class RateLimited(Exception):
    """The caller's bucket is empty; ``retry_after_s`` is when ``cost`` fits again."""

    def __init__(self, *, caller: str, retry_after_s: int, rate: float, what: str | None = None) -> None:
        self.caller, self.retry_after_s = caller, retry_after_s
        super().__init__(
            (what or f"token {caller!r} sends registrations faster than {rate:g}/s (--registry-rate)")
            + f"; retry in {retry_after_s} s"
        )


@dataclass
class _Bucket:
    level: float
    at: float


class RateLimiter:
    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        what: Callable[[str], str] | None = None,
        max_callers: int = 100_000,
    ) -> None:
        if rate < 0 or burst < 1:
            raise ValueError(f"rate must be >= 0 and burst >= 1, got rate={rate}, burst={burst}")
        self.rate, self.burst = rate, float(burst)
        self._clock = clock
        self._what = what
        self._max_callers = max_callers
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, caller: str, cost: int = 1) -> None:
        """Spend ``cost`` from ``caller``'s bucket, or raise :class:`RateLimited`."""
        if self.rate == 0:
            return
        now = self._clock()
        with self._lock:
            bucket = self._bucket(caller, now)
            need = min(float(cost), self.burst)
            if bucket.level < need:
                wait = math.ceil((need - bucket.level) / self.rate)
                what = None if self._what is None else self._what(caller)
                raise RateLimited(caller=caller, retry_after_s=max(1, wait), rate=self.rate, what=what)
            bucket.level -= cost  # may go below zero: the debt of a batch larger than the bucket

    def spend(self, caller: str, cost: float) -> None:
        """Charge ``cost`` after the fact (what a read turned out to return); never refuses,
        the debt delays the caller's next request."""
        if self.rate == 0 or cost <= 0:
            return
        with self._lock:
            self._bucket(caller, self._clock()).level -= cost

    def _bucket(self, caller: str, now: float) -> _Bucket:
        bucket = self._buckets.get(caller)
        if bucket is None:
            if len(self._buckets) >= self._max_callers:  # full buckets carry nothing: forget them
                self._buckets = {
                    k: b for k, b in self._buckets.items() if b.level + (now - b.at) * self.rate < self.burst
                }
            bucket = self._buckets[caller] = _Bucket(level=self.burst, at=now)
        bucket.level = min(self.burst, bucket.level + (now - bucket.at) * self.rate)
        bucket.at = now
        return bucket
