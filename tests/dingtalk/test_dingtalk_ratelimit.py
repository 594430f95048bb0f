"""Rate limiting and dedup with an injected clock."""

from __future__ import annotations

from alertmanager.dingtalk.dedup import Deduplicator
from alertmanager.dingtalk.ratelimit import RateLimiter


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_never_more_than_n_in_any_minute() -> None:
    clock = FakeClock()
    limiter = RateLimiter(18, clock=clock)
    sent = []
    for _ in range(600):  # ten minutes in 1 s steps, trying 3 sends a second
        for _ in range(3):
            if limiter.try_acquire():
                sent.append(clock.now)
        clock.now += 1
    assert max(sum(1 for t in sent if start <= t < start + 60) for start in sent) == 18
    assert len(sent) == 18 * 10


def test_wait_time_until_oldest_send_leaves_the_window() -> None:
    clock = FakeClock()
    limiter = RateLimiter(2, clock=clock)
    assert limiter.try_acquire()
    clock.now += 10
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    assert limiter.wait_time() == 50
    clock.now += 50
    assert limiter.wait_time() == 0 and limiter.try_acquire()


def test_dedup_window_and_release() -> None:
    clock = FakeClock()
    dedup = Deduplicator(300, clock=clock)
    assert dedup.reserve("k")
    assert not dedup.reserve("k"), "in flight: a second replica's copy is a duplicate"
    dedup.release("k")  # transient failure: the retry must go through
    assert dedup.reserve("k")
    dedup.part_delivered("k", "p1")
    dedup.complete("k")
    assert not dedup.reserve("k")
    clock.now += 301
    assert dedup.reserve("k"), "window over"
