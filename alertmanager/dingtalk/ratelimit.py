"""Per-robot send limiter with an injected clock.

DingTalk mutes a robot for 10 minutes once it sends more than 20 messages in a minute,
so the guarantee we need is "never more than N sends in ANY 60 s window". A classic
token bucket of rate N/min and burst N allows up to 2N in a window; a sliding log of the
last N send times gives the exact guarantee with the same O(N) memory, so that is used.

When DingTalk answers 130101 anyway (another sender shares the robot, or clocks differ),
every further send only prolongs the mute: ``back_off`` blocks the robot for ``backoff``
(60 s), doubling on each consecutive 130101 up to ``backoff_max`` (DingTalk's 10-minute
mute); a send that gets through resets it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

Clock = Callable[[], float]
BACKOFF_FIRST = 60.0
BACKOFF_MAX = 600.0


class RateLimiter:
    """At most ``per_minute`` sends in any ``window`` seconds, by ``clock`` (monotonic secs)."""

    def __init__(self, per_minute: int, *, clock: Clock = time.monotonic, window: float = 60.0,
                 backoff: float = BACKOFF_FIRST, backoff_max: float = BACKOFF_MAX) -> None:
        self.per_minute = per_minute
        self.backoff, self.backoff_max = backoff, max(backoff, backoff_max)
        self.window = window
        self._clock = clock
        self._sent: deque[float] = deque()
        self._penalty = 0.0
        self._blocked_until = 0.0

    def _expire(self, now: float) -> None:
        while self._sent and self._sent[0] <= now - self.window:
            self._sent.popleft()

    def wait_time(self) -> float:
        """Seconds until a send is allowed (0 when one is allowed now)."""
        now = self._clock()
        self._expire(now)
        blocked = max(0.0, self._blocked_until - now)
        if len(self._sent) < self.per_minute:
            return blocked
        return max(blocked, self._sent[len(self._sent) - self.per_minute] + self.window - now)

    def try_acquire(self) -> bool:
        """Take a slot if one is free now; the caller then sends exactly one message."""
        if self.wait_time() > 0:
            return False
        self._sent.append(self._clock())
        return True

    def back_off(self) -> float:
        """DingTalk said "too fast": block sends for the next penalty; returns its length."""
        self._penalty = min(self.backoff_max, self._penalty * 2 if self._penalty else self.backoff)
        self._blocked_until = self._clock() + self._penalty
        return self._penalty

    def succeeded(self) -> None:
        """A send went through: the next 130101 starts the back-off afresh."""
        self._penalty = 0.0

    def resize(self, per_minute: int) -> None:
        """Change the limit on reload while keeping the send history."""
        self.per_minute = per_minute
