"""Per-robot send limiter with an injected clock.

DingTalk mutes a robot for 10 minutes once it sends more than 20 messages in a minute,
so the guarantee we need is "never more than N sends in ANY 60 s window". A classic
token bucket of rate N/min and burst N allows up to 2N in a window; a sliding log of the
last N send times gives the exact guarantee with the same O(N) memory, so that is used.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

Clock = Callable[[], float]


class RateLimiter:
    """At most ``per_minute`` sends in any ``window`` seconds, by ``clock`` (monotonic secs)."""

    def __init__(self, per_minute: int, *, clock: Clock = time.monotonic, window: float = 60.0) -> None:
        self.per_minute = per_minute
        self.window = window
        self._clock = clock
        self._sent: deque[float] = deque()

    def _expire(self, now: float) -> None:
        while self._sent and self._sent[0] <= now - self.window:
            self._sent.popleft()

    def wait_time(self) -> float:
        """Seconds until a send is allowed (0 when one is allowed now)."""
        now = self._clock()
        self._expire(now)
        if len(self._sent) < self.per_minute:
            return 0.0
        return self._sent[len(self._sent) - self.per_minute] + self.window - now

    def try_acquire(self) -> bool:
        """Take a slot if one is free now; the caller then sends exactly one message."""
        if self.wait_time() > 0:
            return False
        self._sent.append(self._clock())
        return True

    def resize(self, per_minute: int) -> None:
        """Change the limit on reload while keeping the send history."""
        self.per_minute = per_minute
