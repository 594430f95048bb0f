"""Benchmark: assign, render, write and promtool-check N child configs (target: 100 in < 30 s).

Synthesises a fleet of ``targets_per_shard`` GPU nodes (two exporters each) per child,
spread over three regions, and times each phase of the same path ``gpufed render``
takes. Meant to be registered as ``gpufed bench render``; returns plain figures.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from sharder.children import tree
from sharder.engine.assigning import assign
from sharder.kernel import output
from sharder.kernel.promtool import Promtool, check_all
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec

REGIONS = ("cn-beijing", "cn-shanghai", "cn-hangzhou")


def bench_spec(*, children: int, targets_per_shard: int = 12) -> FederationSpec:
    per_region = [children // len(REGIONS) + (1 if i < children % len(REGIONS) else 0) for i in range(3)]
    return FederationSpec.model_validate(
        {
            "cluster": "bench",
            "regions": [{"name": r, "shards": n} for r, n in zip(REGIONS, per_region, strict=True) if n],
            "sharding": {"targets_per_shard": targets_per_shard},
            "jobs": [
                {"name": "gpu", "scrape_interval": "15s", "keep_metrics": ["DCGM_FI_.*", "up"]},
                {"name": "node", "drop_labels": ["pci_bus_id"]},
            ],
            "remote_write": [{"name": "master", "url": "http://master:9090/api/v1/write"}],
        }
    )


def bench_targets(spec: FederationSpec) -> list[Target]:
    targets: list[Target] = []
    for octet, region in enumerate(spec.regions):
        nodes = (region.shards or 1) * spec.sharding.targets_per_shard
        for i in range(nodes):
            address, node = f"10.{octet}.{i // 250}.{i % 250 + 1}", f"n{octet}-{i}"
            for job, port in (("gpu", 9400), ("node", 9100)):
                targets.append(
                    Target(address=address, port=port, job=job, node=node, region=region.name, gpus=8)
                )
    return targets


def run_render_bench(
    *, children: int = 100, workers: int = 8, promtool: str | None = None, check: bool = True
) -> dict[str, Any]:
    """Seconds per phase for ``children`` children; ``checked`` is 0 when promtool is absent."""
    spec = bench_spec(children=children)
    targets = bench_targets(spec)
    checker = Promtool(promtool) if promtool else Promtool.find()
    timings: dict[str, float] = {}
    started = time.perf_counter()
    assignment = assign(spec, targets)
    timings["assign_s"] = time.perf_counter() - started
    mark = time.perf_counter()
    bundle = tree.build_bundle(spec, targets, assignment)
    timings["render_s"] = time.perf_counter() - mark
    configs = tree.prometheus_configs(bundle)
    checked = 0
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-") as tmp:
        mark = time.perf_counter()
        root = output.write_tree(Path(tmp) / "out", bundle)
        timings["write_s"] = time.perf_counter() - mark
        mark = time.perf_counter()
        if check and checker is not None:
            checked = check_all(checker, root, configs, workers=workers)
        timings["check_s"] = time.perf_counter() - mark
    timings["total_s"] = time.perf_counter() - started
    return {
        "children": len(configs),
        "targets": len(targets),
        "files": len(bundle),
        "bytes": sum(len(content) for content in bundle.values()),
        "checked": checked,
        "workers": workers,
        **{name: round(value, 3) for name, value in timings.items()},
    }
