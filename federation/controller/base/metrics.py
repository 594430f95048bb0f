"""The controller's own metrics, in an app-owned registry (nothing registers at import).

``register_process`` adds what ``gpufed bench live`` reads (where ``/proc`` cannot be read): client_python's
``ProcessCollector`` (the controller's own CPU seconds and RSS) and
:class:`SubprocessCollector` (the CPU seconds of the promtool/amtool runs it waited for,
which a process's own counters leave out).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from federation.controller.base.shard_gauges import ShardGauges

SUBPROCESS_CPU = "gpufed_controller_subprocess_cpu_seconds"


class SubprocessCollector(Collector):
    """User + system CPU seconds of the child processes this process has waited for."""

    def __init__(self, *, times: Callable[[], os.times_result] = os.times) -> None:
        self._times = times

    def collect(self) -> Iterator[CounterMetricFamily]:
        now = self._times()
        yield CounterMetricFamily(
            SUBPROCESS_CPU,
            "CPU seconds of finished child processes (promtool, amtool) this controller ran.",
            value=now.children_user + now.children_system,
        )


def register_process(registry: CollectorRegistry) -> None:
    """The controller's own CPU and memory on its ``/metrics`` (``process_*``)."""
    ProcessCollector(registry=registry)
    registry.register(SubprocessCollector())


class ControllerMetrics:
    def __init__(self, *, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.shards = ShardGauges()  # gpufed_controller_targets, gpufed_controller_shard_load
        registry.register(self.shards)
        self.assignment_version = Gauge(
            "gpufed_controller_assignment_version",
            "Version of the assignment being served.",
            registry=registry,
        )
        self.moves = Counter(
            "gpufed_controller_moves", "Targets moved between shards.", ["cause"], registry=registry
        )
        self.handovers_in_flight = Gauge(
            "gpufed_controller_handovers_in_flight",
            "Moved targets both children still scrape.",
            registry=registry,
        )
        self.handovers = Counter(
            "gpufed_controller_handovers",
            "Finished hand-overs, by how they ended.",
            ["result"],
            registry=registry,
        )
        self.sd_requests = Counter(
            "gpufed_controller_sd_requests", "HTTP SD requests by status code.", ["code"], registry=registry
        )
        self.sd_latency = Histogram(
            "gpufed_controller_sd_request_duration_seconds",
            "Time to answer an HTTP SD request.",
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
        )
        self.plans = Counter("gpufed_controller_plans", "Plans computed.", registry=registry)
        self.rebalances = Counter(
            "gpufed_controller_rebalances", "Rebalance requests by result.", ["result"], registry=registry
        )
        self.config_checks = Counter(
            "gpufed_controller_config_checks",
            "Config bundle checks by result.",
            ["result"],
            registry=registry,
        )
        self.config_ok = Gauge(
            "gpufed_controller_config_render_ok",
            "1 while the newest config bundle rendered and passed its checks; 0: an older one is served.",
            registry=registry,
        )
        self.config_published_at = Gauge(
            "gpufed_controller_config_last_success_timestamp_seconds",
            "When a config bundle was last published (Unix time; 0: never).",
            registry=registry,
        )
        self.config_left_out = Gauge(
            "gpufed_controller_config_targets_left_out",
            "Targets the newest config bundle could not hold (undefined job), each named in /v1/status.",
            registry=registry,
        )
        self.config_ok.set(1)  # nothing failed yet; 0 only after a failed render or check
        self.reloads = Counter(
            "gpufed_controller_child_reloads",
            "POST /-/reload sent to children whose config changed.",
            ["result"],
            registry=registry,
        )
        self.store_errors = Counter(
            "gpufed_controller_store_errors", "Failed state store writes.", registry=registry
        )
        self.ready = Gauge(
            "gpufed_controller_ready", "1 once a first assignment is served.", registry=registry
        )

    def update_shards(self, rows: list[tuple[str, str, int, int]]) -> None:
        """(region, shard, targets, load) of the shards a change touched; the others keep theirs."""
        self.shards.update(rows)

    def publish_shards(self, rows: list[tuple[str, str, int, int]]) -> None:
        """(region, shard, targets, load) of the assignment now served."""
        self.shards.publish(rows)

    def exposition(self) -> bytes:
        """What ``/metrics`` serves: ``generate_latest(self.registry)``, byte for byte, with
        the per-shard gauges cut from their kept lines (``shard_gauges``)."""
        return self.shards.exposition(self.registry)
