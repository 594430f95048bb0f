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

    def __init__(self, *, caller: str, retry_after_s: int, rate: float) -> None:
        self.caller, self.retry_after_s = caller, retry_after_s
        super().__init__(
            f"token {caller!r} sends registrations faster than {rate:g}/s "
            f"(--registry-rate); retry in {retry_after_s} s"
        )


@dataclass
class _Bucket:
    level: float
    at: float


class RateLimiter:
    def __init__(self, *, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0 or burst < 1:
            raise ValueError(f"rate must be >= 0 and burst >= 1, got rate={rate}, burst={burst}")
        self.rate, self.burst = rate, float(burst)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, caller: str, cost: int = 1) -> None:
        """Spend ``cost`` from ``caller``'s bucket, or raise :class:`RateLimited`."""
        if self.rate == 0:
            return
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(caller)
            if bucket is None:
                bucket = self._buckets[caller] = _Bucket(level=self.burst, at=now)
            bucket.level = min(self.burst, bucket.level + (now - bucket.at) * self.rate)
            bucket.at = now
            need = min(float(cost), self.burst)
            if bucket.level < need:
                wait = math.ceil((need - bucket.level) / self.rate)
                raise RateLimited(caller=caller, retry_after_s=max(1, wait), rate=self.rate)
            bucket.level -= cost  # may go below zero: the debt of a batch larger than the bucket
