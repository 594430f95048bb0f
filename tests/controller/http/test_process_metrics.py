"""The controller's /metrics shows its own CPU and memory (what ``gpufed bench live`` reads)."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, generate_latest

from federation.controller.base.metrics import SubprocessCollector, register_process


def test_subprocess_cpu_is_the_waited_for_childrens_user_plus_system_seconds() -> None:
    registry = CollectorRegistry()
    times = os.times_result((1.0, 2.0, 3.5, 0.25, 0.0))
    registry.register(SubprocessCollector(times=lambda: times))
    assert generate_latest(registry) == (
        b"# HELP gpufed_controller_subprocess_cpu_seconds_total CPU seconds of finished child processes"
        b" (promtool, amtool) this controller ran.\n"
        b"# TYPE gpufed_controller_subprocess_cpu_seconds_total counter\n"
        b"gpufed_controller_subprocess_cpu_seconds_total 3.75\n"
    )


def test_register_process_adds_cpu_and_rss_of_this_process() -> None:
    registry = CollectorRegistry()
    register_process(registry)
    text = generate_latest(registry).decode()
    assert "\nprocess_cpu_seconds_total " in text and "\nprocess_resident_memory_bytes " in text
    assert registry.get_sample_value("process_resident_memory_bytes") > 1_000_000
