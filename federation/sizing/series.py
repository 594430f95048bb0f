"""What one GPU node costs in series: counted from the exporter itself, never a constant.

A simulated node with ``gpus`` GPUs (``exporter.simulated``) is rendered exactly as
``gpufed-exporter fleet`` serves it (``exporter.textformat``), optionally with ``pods_per_gpu``
pods holding each GPU (every per-GPU series is then written once per pod, as dcgm-exporter
does), and the spec's ``keep_metrics``/``drop_metrics`` of the ``gpu`` job are applied to the
metric names as the children's ``metric_relabel_configs`` do (fully anchored RE2; Python's
``re`` agrees on these simple patterns). Prometheus adds its five per-target synthetic
series (``up``, ``scrape_duration_seconds``, ``scrape_samples_scraped``,
``scrape_samples_post_metric_relabeling``, ``scrape_series_added``) that no relabelling drops.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from prometheus_client import CollectorRegistry

from exporter import textformat
from exporter.catalogue import select_families
from exporter.collection import Collection
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.models import AttributionStatus, PodLabels
from exporter.simulated import SimulatedBackend

#: Series Prometheus itself adds to every scrape target (not subject to metric relabelling).
SYNTHETIC_PER_TARGET = 5
NODE = "gpu-sizing-0000"


class _SharedPods:
    """``pods`` pods on every GPU (time-slicing or HAMi vGPU), as kubelet would name them."""

    def __init__(self, uuids: Sequence[str], pods: int) -> None:
        self._labels: PodLabels = {
            uuid: tuple(
                {"namespace": "team-a", "pod": f"job-{g}-{p}", "container": "main"} for p in range(pods)
            )
            for g, uuid in enumerate(uuids)
        }

    def labels(self) -> PodLabels:
        return self._labels

    def status(self) -> AttributionStatus | None:
        return None

    def close(self) -> None:
        """Nothing to stop."""


@dataclass(frozen=True)
class NodeSeries:
    exposed: int
    """Samples in one scrape of the node as the exporter serves it."""
    kept: int
    """After the job's keep/drop lists, plus Prometheus' per-target synthetic series."""
    body_bytes: int


def _names(body: bytes) -> list[str]:
    out = []
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            out.append(re.split(r"[{ ]", line, maxsplit=1)[0])
    return out


@lru_cache(maxsize=64)
def _exposition(gpus: int, pods_per_gpu: int, hami: bool) -> bytes:
    backend = SimulatedBackend(gpus, node=NODE, xid_probability=0.0)
    pods = _SharedPods([d.uuid for d in backend.devices()], pods_per_gpu) if pods_per_gpu > 0 else None
    families = select_families(exclude=() if hami else ("hami",))
    collection = Collection(backend, families, attribution=pods, timeout=None)
    collection.collect_once()
    placement: Mapping[str, str] = {"region": "region-0", "rack": "region-0-rack-00", "team": "training"}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(collection, LabelPolicy(NODE, "Hostname", placement)))
    body = textformat.render(registry.collect())
    return body or b""


def node_series(
    *, gpus: int, pods_per_gpu: int = 0, hami: bool = True, keep: Sequence[str] = (), drop: Sequence[str] = ()
) -> NodeSeries:
    """One node's series, exposed and kept (see the module docstring)."""
    body = _exposition(gpus, pods_per_gpu, hami)
    names = _names(body)
    keep_re = [re.compile(f"(?:{pattern})") for pattern in keep]
    drop_re = [re.compile(f"(?:{pattern})") for pattern in drop]
    kept = [
        n
        for n in names
        if (not keep_re or any(r.fullmatch(n) for r in keep_re)) and not any(r.fullmatch(n) for r in drop_re)
    ]
    return NodeSeries(exposed=len(names), kept=len(kept) + SYNTHETIC_PER_TARGET, body_bytes=len(body))
