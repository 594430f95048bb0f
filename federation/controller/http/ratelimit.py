"""Per-token rate limit on the built-in registry: a token bucket per caller, 429 when empty.

Registrations cost what they make the controller do, so a batch costs one per entry
(put or delete), a PUT or DELETE one. A bucket holds ``burst`` and refills at ``rate``
per second. A request larger than ``burst`` (a fleet batch bigger than the bucket) is
let through when the bucket is full and leaves it in debt, so it is never refused
forever; the debt is what ``Retry-After`` counts down for the next request.

The table of buckets is bounded: at most ``max_callers`` keys, each at most
:data:`MAX_KEY` characters (a longer one is cut and suffixed with its digest), the least
recently used evicted first; a client that rotates keys cannot grow memory without bound.
``Retry-After`` is never more than :data:`MAX_RETRY_S`, and a rate below :data:`MIN_RATE`
is refused at construction, so the header is a short number.

Time is injected (``clock``) so tests need no sleeps.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MIN_RATE = 0.001
"""The smallest rate (per second) other than 0 (off): one unit in about 17 minutes."""
MAX_RETRY_S = 3600
"""``Retry-After`` is capped here: the client asks again at least once an hour."""
MAX_KEY = 64
MAX_CALLERS = 100_000


def bucket_key(caller: str) -> str:
    """``caller`` as stored: short keys as they are, long ones cut and made unique by a digest."""
    if len(caller) <= MAX_KEY:
        return caller
    return caller[: MAX_KEY - 17] + "~" + hashlib.blake2b(caller.encode(), digest_size=8).hexdigest()


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
        max_callers: int = MAX_CALLERS,
    ) -> None:
        if not (rate == 0 or MIN_RATE <= rate < math.inf) or burst < 1 or max_callers < 1:
            raise ValueError(
                f"rate must be 0 or from {MIN_RATE:g} up, and burst >= 1, got rate={rate}, burst={burst}"
            )
        self.rate, self.burst = rate, float(burst)
        self._clock = clock
        self._what = what
        self._max_callers = max_callers
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
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
                wait = min(MAX_RETRY_S, math.ceil((need - bucket.level) / self.rate))
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

    def __len__(self) -> int:
        return len(self._buckets)

    def _bucket(self, caller: str, now: float) -> _Bucket:
        key = bucket_key(caller)
        bucket = self._buckets.get(key)
        if bucket is None:
            while len(self._buckets) >= self._max_callers:  # least recently used first
                self._buckets.popitem(last=False)
            bucket = self._buckets[key] = _Bucket(level=self.burst, at=now)
        else:
            self._buckets.move_to_end(key)
        bucket.level = min(self.burst, bucket.level + (now - bucket.at) * self.rate)
        bucket.at = now
        return bucket
