"""CPU seconds and resident memory of a process, read by client_python's ``ProcessCollector``
(``/proc`` on Linux): the exporter's benches measure themselves and the fleet process they
start with it, so no bench parses ``/proc`` by hand."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import ProcessCollector


@dataclass(frozen=True)
class ProcessFigures:
    cpu_s: float
    """User + system seconds (``process_cpu_seconds_total``)."""
    rss_mib: float
    """Resident memory now (``process_resident_memory_bytes``), MiB."""


def process_figures(pid: int | str = "self") -> ProcessFigures | None:
    """The figures of ``pid`` (default: this process), or None once it is gone."""
    collector = ProcessCollector(pid=lambda: pid, registry=None)
    samples = {s.name: s.value for family in collector.collect() for s in family.samples}
    if "process_cpu_seconds_total" not in samples:
        return None
    return ProcessFigures(cpu_s=samples["process_cpu_seconds_total"],
                          rss_mib=samples["process_resident_memory_bytes"] / (1 << 20))
