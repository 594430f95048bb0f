"""The built-in registry: a burst of registrations reaches the loop as few whole sets, the last complete."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from federation.controller.registry import BuiltinRegistry
from sharder.inventory import Target
from sharder.spec import JobSpec


class CountingSink:
    def __init__(self) -> None:
        self.pushes: list[int] = []

    def on_change(self, source: str, targets: Iterable[Target], *, version: str | None = None) -> None:
        self.pushes.append(len(list(targets)))
        time.sleep(0.002)  # a sink that takes a moment, as the reconcile loop's merge does

    def on_error(self, source: str, reason: str) -> None:
        pass


def entry(i: int) -> dict[str, object]:
    return {
        "address": f"10.0.{i // 250}.{i % 250 + 1}",
        "port": 9400,
        "job": "gpu",
        "node": f"n{i}",
        "region": "r1",
        "gpus": 8,
    }


def test_a_burst_of_registrations_is_pushed_coalesced_and_complete() -> None:
    sink = CountingSink()
    registry = BuiltinRegistry(sink=sink, jobs={"gpu": JobSpec(name="gpu")})
    stop = threading.Event()
    loop = threading.Thread(target=registry.run, args=(stop,))
    loop.start()
    time.sleep(0.05)
    for i in range(500):
        registry.put(f"10.0.{i // 250}.{i % 250 + 1}:9400", entry(i))
    deadline = time.monotonic() + 10
    while (not sink.pushes or sink.pushes[-1] != 500) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    loop.join()
    assert sink.pushes[-1] == 500
    assert len(sink.pushes) < 500  # one push per PUT would be 500 whole-set pushes


def test_without_the_loop_a_put_pushes_at_once() -> None:
    sink = CountingSink()
    registry = BuiltinRegistry(sink=sink, jobs={"gpu": JobSpec(name="gpu")})
    registry.put("10.0.0.1:9400", entry(0))
    assert sink.pushes == [1]
