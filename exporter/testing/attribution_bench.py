"""Pod attribution benchmark: what a kubelet refresh costs, and what shared GPUs cost a scrape.

`gpufed-exporter bench attribution` serves a node's pod-resources answer from the kubelet
stand-in (`exporter.testing.kubelet`, kubelet's own proto) on a unix socket: `containers`
containers, of which `gpus x shared` hold a GPU (half through the device plugin with
time-slicing ids `UUID::N`, half through DRA claims on `gpu-<minor>`, resolved by NVML
minor) and the rest hold none (most pods on a GPU node do not). It times `refresh()`
(List + GetAllocatableResources over the socket, then the mapping), off the scrape path,
and then renders a simulated node's `/metrics` with and without the pod labels: every
per-GPU series is written once per pod holding the GPU, so `shared` pods per GPU multiply
the series count by about `shared`.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from exporter import podmap, textformat
from exporter.catalogue import select_families
from exporter.collection import Collection
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.kubelet_podresources import KubeletPodAttribution, PodResourcesClient
from exporter.podresources_messages import message
from exporter.simulated import SimulatedBackend
from exporter.testing.kubelet import FakeKubelet

NODE = "bench-node"


def node_answer(uuids: list[str], *, containers: int, shared: int) -> Any:
    """List as kubelet answers it for that node."""
    resp = message("ListPodResourcesResponse")()
    holders = len(uuids) * shared
    for n in range(containers):
        pod = resp.pod_resources.add(name=f"pod-{n}", namespace=f"ns-{n % 40}")
        container = pod.containers.add(name="main")
        if n >= holders:
            container.devices.add(resource_name="example.com/nic", device_ids=[f"nic-{n}"])
            continue
        gpu = n % len(uuids)
        if n % 2:
            container.devices.add(resource_name="nvidia.com/gpu", device_ids=[f"{uuids[gpu]}::{n}"])
        else:
            claim = container.dynamic_resources.add(claim_name=f"claim-{n}", claim_namespace=f"ns-{n % 40}")
            claim.claim_resources.add(driver_name=podmap.DRA_GPU_DRIVER, pool_name=NODE,
                                      device_name=f"gpu-{gpu}")
    return resp


def _series(body: bytes) -> int:
    return sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#"))


def _render(collection: Collection, renders: int) -> dict[str, Any]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(collection, LabelPolicy(NODE)))
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(renders):
        body = textformat.render(registry.collect())  # a fresh label cache: every render cold
    assert body is not None
    return {"series": _series(body), "body_bytes": len(body),
            "render_ms": round((time.perf_counter() - started) * 1000 / renders, 3),
            "render_cpu_ms": round((time.process_time() - cpu) * 1000 / renders, 3)}


def bench_attribution(*, containers: int = 10_000, gpus: int = 8, shared: int = 4, rounds: int = 10,
                      renders: int = 50) -> dict[str, Any]:
    backend = SimulatedBackend(gpus, node=NODE, xid_probability=0.0)
    devices = backend.devices()
    with tempfile.TemporaryDirectory() as tmp, FakeKubelet(str(Path(tmp) / "kubelet.sock")) as kubelet:
        kubelet.answer = node_answer([d.uuid for d in devices], containers=containers, shared=shared)
        kubelet.allocatable.devices.add(resource_name="nvidia.com/gpu",
                                        device_ids=[f"{d.uuid}::{k}" for d in devices for k in range(shared)])
        client = PodResourcesClient(kubelet.path, timeout=30.0)
        attribution = KubeletPodAttribution(client, gpus=podmap.node_gpus(devices), interval=3600,
                                            start=False)
        try:
            wall, cpu = [], []
            for _ in range(rounds):
                started, used = time.perf_counter(), time.process_time()
                assert attribution.refresh(), "the stand-in kubelet did not answer"
                wall.append((time.perf_counter() - started) * 1000)
                cpu.append((time.process_time() - used) * 1000)
            label_sets = sum(len(sets) for sets in attribution.labels().values())
            plain = Collection(backend, select_families(), timeout=None)
            attributed = Collection(backend, select_families(), attribution=attribution, timeout=None)
            plain.collect_once()
            attributed.collect_once()
            without = _render(plain, renders)
            with_pods = _render(attributed, max(1, renders * len(devices) // max(len(devices), label_sets)))
        finally:
            attribution.close()
    return {
        "containers": containers, "gpus": gpus, "pods_per_gpu": shared,
        "answer_bytes": kubelet.answer.ByteSize(),
        "label_sets": label_sets,
        "refresh_wall_ms_p50": round(statistics.median(wall), 1),
        "refresh_wall_ms_max": round(max(wall), 1),
        "refresh_cpu_ms_p50": round(statistics.median(cpu), 1),
        "without_pods": without, "with_pods": with_pods,
        "series_factor": round(with_pods["series"] / without["series"], 2),
    }
