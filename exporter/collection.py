"""Collection off the scrape path: a background loop fills snapshots, scrapes only read them.

`Collection` owns one backend and turns one read into one immutable `Snapshot` (folding
XID events into counters and deriving health). `CollectionLoop` runs any number of them
on one thread at a fixed interval: one per process in `serve`, hundreds in `fleet`.
A read that overruns its timeout is abandoned (and not restarted while it still hangs),
so a wedged driver costs freshness, never a scrape.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from exporter.attribution import NoPodAttribution, PodAttribution
from exporter.backend import GpuBackend
from exporter.catalogue import CRITICAL_XIDS
from exporter.models import AttributionStatus, CollectionStats, PodLabels, Reading, Snapshot, XidTally

log = logging.getLogger(__name__)


class Collection:
    """One node's collection state: latest snapshot, XID tallies and self-metrics."""

    def __init__(
        self,
        backend: GpuBackend,
        families: Iterable[str],
        *,
        attribution: PodAttribution | None = None,
        timeout: float | None = 3.0,
        health_window: float = 600.0,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.backend = backend
        self._timer = timer
        self.families = frozenset(families)
        self._attribution = attribution or NoPodAttribution()
        self._timeout, self._health_window, self._clock = timeout, health_window, clock
        self._xids: dict[tuple[int, int], XidTally] = {}
        self._last_xid: dict[int, int] = {}
        self._snapshot: Snapshot | None = None
        self._stats = CollectionStats()
        self._hung: threading.Thread | None = None
        self.devices = backend.devices()
        self.driver = backend.driver_version()

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    @property
    def stats(self) -> CollectionStats:
        return self._stats

    def ready(self, max_age: float) -> bool:
        """A collection succeeded within `max_age` seconds."""
        last = self._stats.last_success
        return last is not None and self._clock() - last <= max_age

    def collect_once(self) -> bool:
        """Read, fold, publish. Failures are counted and logged, never raised."""
        started = self._timer()
        try:
            readings = self._call(lambda: self.backend.read(self.families))
            events = self.backend.drain_xid_events()
        except TimeoutError:
            stats = self._stats
            self._stats = replace(stats, errors=stats.errors + 1, timeouts=stats.timeouts + 1)
            log.warning("collection timed out timeout_s=%s", self._timeout)
            return False
        except Exception as exc:  # a backend bug must not kill the loop thread
            self._stats = replace(self._stats, errors=self._stats.errors + 1)
            log.warning("collection failed error=%r", str(exc))
            return False
        now = self._clock()
        for event in events:
            key = (event.gpu, event.code)
            old = self._xids.get(key, XidTally(0, event.timestamp))
            self._xids[key] = XidTally(old.count + 1, max(old.last_seen, event.timestamp))
            self._last_xid[event.gpu] = event.code
        self._snapshot = Snapshot(
            taken_at=now,
            devices=self.devices,
            readings=readings,
            xids=dict(self._xids),
            last_xid=dict(self._last_xid),
            health=self._health(readings, now),
            pod_labels=_label_sets(self._attribution.labels()),
            driver_version=self.driver,
            attribution=self._status(),
        )
        partial = not all(r.ok for r in readings.values())
        self._stats = replace(
            self._stats,
            last_success=now,
            last_duration=self._timer() - started,
            collections=self._stats.collections + 1,
            errors=self._stats.errors + int(partial),
        )
        return True

    def _status(self) -> AttributionStatus | None:
        status = getattr(self._attribution, "status", None)
        return status() if status is not None else None

    def _health(self, readings: dict[int, Reading], now: float) -> dict[int, bool]:
        """Unhealthy: the read failed, or a critical XID was seen within the window."""
        bad = {
            gpu for (gpu, code), tally in self._xids.items()
            if code in CRITICAL_XIDS and now - tally.last_seen <= self._health_window
        }
        return {d.index: readings.get(d.index, Reading(d.index, {}, ok=False)).ok and d.index not in bad
                for d in self.devices}

    def _call(self, fn: Callable[[], Any]) -> Any:
        if self._timeout is None:
            return fn()
        if self._hung is not None and self._hung.is_alive():
            raise TimeoutError("previous read still running")
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:
                box["error"] = exc
            finally:
                done.set()

        # Daemon, so a read wedged inside the driver never blocks process exit.
        worker = threading.Thread(target=work, name="gpu-read", daemon=True)
        worker.start()
        if not done.wait(self._timeout):
            self._hung = worker
            raise TimeoutError("read exceeded timeout")
        if "error" in box:
            raise box["error"]
        return box["value"]


class CollectionLoop:
    """One thread collecting every `Collection` each `interval` seconds, drift-free.

    Many collections (fleet mode) are spread over the interval in small batches instead
    of one burst: a burst of 2,000 collections holds the GIL for ~0.4 s, and every
    syscall of the HTTP thread then waits for a GIL hand-off, which is what put scrape
    tails at several hundred milliseconds. Each collection still runs once per interval.
    """

    #: Longest a batch should hold the GIL without a pause (seconds).
    BATCH_SPACING = 0.005
    #: Share of the interval the batches are spread over; the rest absorbs overruns.
    SPREAD = 0.8

    def __init__(self, collections: Sequence[Collection], *, interval: float = 5.0) -> None:
        self._collections = list(collections)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="collection-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def batches(self) -> list[list[Collection]]:
        """The collections in order, cut into at most interval x SPREAD / BATCH_SPACING batches."""
        count = max(1, min(len(self._collections), int(self._interval * self.SPREAD / self.BATCH_SPACING)))
        size = -(-len(self._collections) // count)
        return [self._collections[i:i + size] for i in range(0, len(self._collections), size)]

    def _run(self) -> None:
        # Callers collect once before start(), so the first tick is one interval away.
        next_at = time.monotonic() + self._interval
        if self._stop.wait(self._interval):
            return
        batches = self.batches()
        spacing = self._interval * self.SPREAD / len(batches)
        while not self._stop.is_set():
            tick = time.monotonic()
            for i, batch in enumerate(batches):
                delay = tick + i * spacing - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    return
                for collection in batch:
                    collection.collect_once()
                if self._stop.is_set():
                    return
            next_at += self._interval
            now = time.monotonic()
            if next_at < now:  # overran: skip missed ticks instead of bursting
                next_at = now + self._interval - (now - next_at) % self._interval
            self._stop.wait(next_at - now)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

def _label_sets(found: Mapping[str, Any]) -> PodLabels:
    """One tuple of label sets per GPU; an attribution may answer one mapping per GPU."""
    return {uuid: (value,) if isinstance(value, Mapping) else tuple(value) for uuid, value in found.items()}
