"""The built-in registry: a burst of registrations reaches the loop as few deltas, together complete."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable

from conftest import wait_for

from sharder.model.inventory import Target
from sharder.model.spec import JobSpec
from sharder.sources.registry import BuiltinRegistry


class CountingSink:
    """Follows the registry's set from its deltas; ``pushes`` is its size after each push."""

    def __init__(self) -> None:
        self.pushes: list[int] = []
        self.members: set[str] = set()

    def on_change(self, source: str, targets: Iterable[Target], *, version: str | None = None) -> None:
        raise AssertionError("the registry pushes deltas, never its whole set")

    def on_delta(self, source: str, *, upserted: list[Target], removed: list[str]) -> None:
        self.members.difference_update(removed)
        self.members.update(t.identity for t in upserted)
        self.pushes.append(len(self.members))
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
    with contextlib.suppress(AssertionError):  # the asserts below say what arrived
        wait_for(lambda: bool(sink.pushes) and sink.pushes[-1] == 500, timeout=10, interval=0.01)
    stop.set()
    loop.join()
    assert sink.pushes[-1] == 500
    assert len(sink.pushes) < 500  # coalesced: not one push per PUT


def test_without_the_loop_a_put_pushes_at_once() -> None:
    sink = CountingSink()
    registry = BuiltinRegistry(sink=sink, jobs={"gpu": JobSpec(name="gpu")})
    registry.put("10.0.0.1:9400", entry(0))
    assert sink.pushes == [1]


class DeltaSink(CountingSink):
    def __init__(self) -> None:
        super().__init__()
        self.deltas: list[tuple[list[str], list[str]]] = []

    def on_delta(self, source: str, *, upserted: list[Target], removed: list[str]) -> None:
        self.deltas.append((sorted(t.identity for t in upserted), sorted(removed)))


def test_changes_are_pushed_as_deltas_and_an_unchanged_put_only_refreshes() -> None:
    now = [0.0]
    sink = DeltaSink()
    registry = BuiltinRegistry(sink=sink, jobs={"gpu": JobSpec(name="gpu")}, ttl_s=10, clock=lambda: now[0])
    registry.put("10.0.0.1:9400", entry(0))
    registry.put("10.0.0.2:9400", entry(1))
    now[0] = 8.0
    registry.put("10.0.0.1:9400", entry(0))  # the same entry: a refresh, no push
    assert sink.deltas == [(["10.0.0.1:9400"], []), (["10.0.0.2:9400"], [])]
    now[0] = 12.0
    assert registry.expire() == 1  # the refreshed one lives on
    assert sink.deltas[-1] == ([], ["10.0.0.2:9400"])
    registry.put("10.0.0.1:9400", {**entry(0), "gpus": 4})
    assert sink.deltas[-1] == (["10.0.0.1:9400"], [])
    assert registry.delete("10.0.0.1:9400")
    assert sink.deltas[-1] == ([], ["10.0.0.1:9400"])


def test_an_unchanged_refresh_keeps_the_registry_healthy() -> None:
    """Health is "being fed", not "changed": a stable fleet re-registers and stays fresh."""
    from functools import partial

    from prometheus_client import CollectorRegistry

    from sharder.sources.discovery_metrics import DiscoveryMetrics

    wall = [1000.0]
    metrics = DiscoveryMetrics(registry=CollectorRegistry(), wall_clock=lambda: wall[0])
    sink = DeltaSink()
    registry = BuiltinRegistry(sink=sink, jobs={"gpu": JobSpec(name="gpu")},
                               on_accepted=partial(metrics.heartbeat, "registry"))
    registry.put("10.0.0.1:9400", entry(0))
    wall[0] += 400.0  # longer than the page's 300 s "stale"
    assert metrics.staleness("registry") == 400.0
    registry.put("10.0.0.1:9400", entry(0))  # the exporter's 30 s refresh: nothing changed
    assert len(sink.deltas) == 1 and metrics.staleness("registry") == 0.0
    registry.batch([{**entry(0), "identity": "10.0.0.1:9400"}], [])
    wall[0] += 30.0
    assert metrics.staleness("registry") == 30.0
    wall[0] += 400.0  # registrations really stop: stale
    assert metrics.staleness("registry") == 430.0
