"""Discovery health as Prometheus metrics: staleness, errors and targets per source.

Nothing registers at import time: :class:`DiscoveryMetrics` takes the registry it
registers into (the controller's, or a fresh one in tests). It implements the
``DiscoveryObserver`` protocol of ``sharder.live.intake``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class DiscoveryMetrics:
    def __init__(self, *, registry: CollectorRegistry, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall_clock = wall_clock
        self.last_success = Gauge(
            "gpufed_discovery_last_success_timestamp_seconds",
            "Unix time of the last answer a discovery source could use.",
            ["source"],
            registry=registry,
        )
        self.errors = Counter(
            "gpufed_discovery_errors",
            "Discovery failures and skipped registry entries, by reason.",
            ["source", "reason"],
            registry=registry,
        )
        self.targets = Gauge(
            "gpufed_discovery_targets",
            "Targets in the last set a discovery source delivered.",
            ["source"],
            registry=registry,
        )

    def success(self, source: str, *, targets: int) -> None:
        self.last_success.labels(source=source).set(self._wall_clock())
        self.targets.labels(source=source).set(targets)

    def heartbeat(self, source: str) -> None:
        """A push source was fed (a registration refreshed, unchanged): it is healthy.

        ``last_success`` means "the source works", not "its set changed"; a push registry
        whose members re-register without changing moves it here.
        """
        self.last_success.labels(source=source).set(self._wall_clock())

    def error(self, source: str, *, reason: str, count: int = 1) -> None:
        self.errors.labels(source=source, reason=reason).inc(count)

    def staleness(self, source: str) -> float | None:
        """Seconds since the source last succeeded; None if it never did."""
        for metric in self.last_success.collect():
            for sample in metric.samples:
                if sample.labels.get("source") == source:
                    return self._wall_clock() - sample.value
        return None
