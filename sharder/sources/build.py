"""The CLI's and the server's discovery choices turned into source adapters.

``gpufed watch`` and ``gpufed serve`` both start the same sources pushing into one
``sharder.live.reconcile.Reconciler``; this is the one place that maps the options to the
adapters (file, Consul, Kubernetes), so the server need not import the watch TUI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sharder.engine.sizing import Hysteresis
from sharder.live.reconcile import Reconciler
from sharder.model.spec import FederationSpec
from sharder.sources.base import Source
from sharder.sources.consul import ConsulConfig, ConsulSource
from sharder.sources.file import FileSource
from sharder.sources.kubernetes import KubernetesConfig, KubernetesSource


@dataclass(frozen=True)
class WatchOptions:
    """Which registries to follow, and the reconcile loop's timing (shared by watch and serve)."""

    consul: ConsulConfig | None = None
    kubernetes: KubernetesConfig | None = None
    kubernetes_jobs: tuple[KubernetesConfig, ...] = ()
    """One more source per job Service; named ``kubernetes/<job>`` (ranks as ``kubernetes``)."""
    file: Path | None = None
    state: Path | None = None
    debounce_s: float = 1.0
    grace_s: float = 120.0
    hysteresis: Hysteresis = field(default_factory=Hysteresis)
    precedence: tuple[str, ...] = ("file", "consul", "kubernetes")


def build_sources(options: WatchOptions, *, sink: Reconciler, spec: FederationSpec) -> list[Source]:
    """One adapter per configured registry, each pushing into ``sink``."""
    jobs = {job.name: job for job in spec.jobs}  # job weights apply to discovered targets too
    sources: list[Source] = []
    if options.file is not None:
        sources.append(FileSource(options.file, sink=sink, jobs=jobs))
    if options.consul is not None:
        sources.append(ConsulSource(options.consul, sink=sink, jobs=jobs))
    regions = spec.region_names()
    if options.kubernetes is not None:
        sources.append(KubernetesSource(options.kubernetes, sink=sink, jobs=jobs, regions=regions))
    for config in options.kubernetes_jobs:
        sources.append(KubernetesSource(config, sink=sink, name=f"kubernetes/{config.job}", jobs=jobs,
                                        regions=regions))
    return sources
