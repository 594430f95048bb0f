"""The worker's pass (``inbox.paused``): the collector is paused during a pass, and a long one
freezes what it built."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest

from federation.controller.live.inbox import FREEZE_AFTER_S, paused


class Host:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.gc_during: list[bool] = []
        self.built: list[object] = []

    def tick(self, *, idle: bool) -> None:
        self.gc_during.append(gc.isenabled())
        self.built = [[i] for i in range(1000)]
        time.sleep(self.seconds)


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_short_tick_pauses_the_collector_and_freezes_nothing() -> None:
    host = Host(0.0)
    paused(lambda: host.tick(idle=False))
    assert host.gc_during == [False] and gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_long_tick_freezes_what_it_built() -> None:
    host = Host(FREEZE_AFTER_S)
    paused(lambda: host.tick(idle=False))
    assert gc.isenabled() and gc.get_freeze_count() > 0
    walked = {id(x) for generation in range(3) for x in gc.get_objects(generation=generation)}
    assert gc.is_tracked(host.built[0]) and id(host.built[0]) not in walked  # frozen: no pass walks it
