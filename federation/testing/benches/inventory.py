"""The inventory-scale benchmark behind ``gpufed bench inventory``: load, assign, plan.

It writes a seeded inventory of N GPU nodes (three regions, ``gpu`` + ``node`` exporters,
4 or 8 GPUs each; about 100 bytes of YAML per node) to a temp dir, then times what
``gpufed plan`` does with it, each step once, in this process:

* ``assign_seconds``: a first assignment (no previous), saved as ``assignment.json``
  (as a first render leaves it).
* Then, in a fresh process, exactly what ``gpufed plan --previous`` does:
  ``load_seconds`` (read, parse with ``sharder.kernel.documents``, validate every target) and
  ``plan_seconds`` (read ``assignment.json`` back, a sticky re-assignment, the diff).
* ``plan_command_seconds``: load + plan; the issue's budget is 60 s and 2.5 GB.
  ``peak_rss_mb`` is that fresh process's peak resident set; ``setup_peak_rss_mb`` the
  bench's own (it also held the first assignment while writing it).

Anchor in the same run: the old loader (PyYAML's pure-Python ``safe_load``) and the
new one on the first ``anchor_nodes`` nodes, as ``load_speedup_vs_safe_load``.
"""

from __future__ import annotations

import multiprocessing
import random
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from sharder.children.previous_state import load_previous
from sharder.engine import planning
from sharder.engine.assigning import assign
from sharder.kernel import documents, output
from sharder.model.loading import StaticFileSource
from sharder.model.spec import FederationSpec, JobSpec, RegionSpec, ShardingSpec

REGIONS = ("bench-a", "bench-b", "bench-c")
MAX_NODES = 3 * (1 << 16) * 64
PLAN_BUDGET_SECONDS = 60.0
RSS_BUDGET_MB = 2560.0


def bench_spec(*, nodes_per_shard: int) -> FederationSpec:
    return FederationSpec(
        cluster="bench",
        regions=[RegionSpec(name=r) for r in REGIONS],
        sharding=ShardingSpec(targets_per_shard=nodes_per_shard),
        jobs=[JobSpec(name="gpu"), JobSpec(name="node", scrape_interval="30s")],
    )


def write_inventory(path: Path, *, nodes: int, seed: int) -> int:
    """A seeded inventory of ``nodes`` nodes written line by line; returns its size in bytes."""
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"nodes must be between 1 and {MAX_NODES}, got {nodes}")
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        out.write("defaults:\n  exporters: {gpu: 9400, node: 9100}\nnodes:\n")
        for i in range(nodes):
            region = i % len(REGIONS)
            n = i // len(REGIONS)
            rack = f"r{n // 16 % 4096:04d}"
            out.write(
                f"  - {{name: {REGIONS[region]}-{rack}-n{n:06d}, address: 10.{64 * region + (n >> 16)}."
                f"{(n >> 8) & 255}.{n & 255}, region: {REGIONS[region]}, rack: {rack},"
                f" team: t{rng.randrange(8)}, gpus: {rng.choice((4, 8, 8, 8))}}}\n"
            )
    return path.stat().st_size


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _anchor(path: Path, *, anchor_nodes: int) -> dict[str, float]:
    """The old and new loader on the first ``anchor_nodes`` nodes of the same file."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)[: 3 + anchor_nodes]
    sample = "".join(lines)
    old, old_s = _timed(lambda: yaml.safe_load(sample))
    new, new_s = _timed(lambda: documents.parse_yaml(sample))
    assert old == new, "the bounded loader must read what PyYAML reads"
    return {"anchor_safe_load_seconds": round(old_s, 3), "anchor_parse_yaml_seconds": round(new_s, 3)}


def _plan_process(inventory: str, out: str, nodes_per_shard: int) -> dict[str, Any]:
    """What ``gpufed plan --previous OUT`` does, in a fresh process so its peak RSS is its own."""
    spec = bench_spec(nodes_per_shard=nodes_per_shard)
    jobs = {job.name: job for job in spec.jobs}
    targets, load_s = _timed(StaticFileSource(inventory, jobs=jobs).list_targets)

    def plan_step() -> planning.Plan:
        before = load_previous(out, cluster=spec.cluster)
        return planning.diff(before, assign(spec, targets, previous=before))

    result, plan_s = _timed(plan_step)
    return {
        "load_seconds": load_s,
        "plan_seconds": plan_s,
        "targets": len(targets),
        "moved": result.counts.moved,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_inventory_bench(
    *, nodes: int, nodes_per_shard: int = 100, seed: int = 0, anchor_nodes: int = 20_000
) -> dict[str, Any]:
    """Setup (write the inventory, a first render's ``assignment.json``) here; the plan in a child."""
    spec = bench_spec(nodes_per_shard=nodes_per_shard)
    jobs = {job.name: job for job in spec.jobs}
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-inventory-") as tmp:
        inventory, out = Path(tmp) / "inventory.yaml", Path(tmp) / "out"
        size = write_inventory(inventory, nodes=nodes, seed=seed)
        anchor = _anchor(inventory, anchor_nodes=min(anchor_nodes, nodes))
        first, assign_s = _timed(partial(assign, spec, StaticFileSource(inventory, jobs=jobs).list_targets()))
        out.mkdir()
        (out / output.ASSIGNMENT_FILE).write_bytes(output.dump_json(first.model_dump(mode="json")))
        shards = len(first.shards)
        del first
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            child = pool.submit(_plan_process, str(inventory), str(out), nodes_per_shard).result()
    command_s = child["load_seconds"] + child["plan_seconds"]
    peak_mb = child["peak_rss_mb"]
    speedup = anchor["anchor_safe_load_seconds"] / max(anchor["anchor_parse_yaml_seconds"], 1e-9)
    return {
        "nodes": nodes,
        "targets": child["targets"],
        "shards": shards,
        "inventory_mb": round(size / 1e6, 1),
        "yaml_loader": documents.Loader.__name__,
        "load_seconds": round(child["load_seconds"], 2),
        "assign_seconds": round(assign_s, 2),
        "plan_seconds": round(child["plan_seconds"], 2),
        "plan_command_seconds": round(command_s, 2),
        "moved_on_replan": child["moved"],
        "peak_rss_mb": round(peak_mb, 1),
        "setup_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "plan_budget_seconds": PLAN_BUDGET_SECONDS,
        "rss_budget_mb": RSS_BUDGET_MB,
        "plan_over_budget": round(command_s / PLAN_BUDGET_SECONDS, 3),
        "rss_over_budget": round(peak_mb / RSS_BUDGET_MB, 3),
        "anchor_nodes": min(anchor_nodes, nodes),
        **anchor,
        "load_speedup_vs_safe_load": round(speedup, 1),
    }
