"""Benchmarks over a live demo stack: ``gpufed bench gap`` and ``gpufed bench first-sample``.

``gap``: the rebalance scenario of :mod:`federation.demo.rebalance` twice in one run on
one stack: a shard added to the first region with make-before-break, then ``gpufed
serve`` restarted with ``--no-handover`` (which must move nothing by itself) and a shard
added to the second region, targets moving at once as Prometheus Operator and the
OpenTelemetry allocator move them. Anchor: the scrape interval (target: make-before-break
max gap <= 1 interval; the immediate move is expected at >= 1 interval plus staleness).

``first-sample``: nodes registered one by one with ``PUT /v1/registry/targets/{identity}``
while the fleet runs; for each, the time to its first sample at the master, both as the
sample's own timestamp (when the child scraped it) and as the moment the master answered
with it (after remote_write); ``assigned`` is when the controller first listed it (its
child's HTTP SD serves it from then on), which splits the control plane's share from
Prometheus' (SD refresh, its 5 s discovery throttle, the scrape offset). Anchor: scrape
interval + HTTP SD refresh interval + 2 s.
The late nodes are served by the fleet's existing endpoints under new names, so no new
process starts and the timing is the control plane's alone.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from federation.demo import gaps, plan, rebalance
from federation.demo.stack import DemoOptions, DemoStack
from sharder.kernel.models import parse_duration

Say = Callable[[str], None]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _mode_detail(run: rebalance.RebalanceRun) -> dict[str, Any]:
    per_node = {node: max(g["max_gap_s"] for g in per.values()) for node, per in run.gaps.items()}
    values = sorted(per_node.values())
    return {
        "region": run.region,
        "added_shards": run.added_shards,
        "moved": len(run.moved),
        "max_gap_s": run.max_gap_s,
        "p50_gap_s": round(statistics.median(values), 3) if values else 0.0,
        "gap_by_node_s": dict(sorted(per_node.items())),
        "copies_seen": sorted({g["copies"] for per in run.gaps.values() for g in per.values()}),
        "overlap_by_node_s": dict(sorted(run.overlap_s.items())),
        "min_overlap_s": min(run.overlap_s.values(), default=None),
        "in_handover_after_rebalance": run.in_handover,
        "handovers_done_s": run.handovers_done_s,
        "settled_s": run.settled_s,
        "scraped_by_new_children_only": run.scraped_by == run.expected_children,
        "window_s": round(run.window[1] - run.window[0], 1),
    }


def run_gap_bench(*, layout: plan.Layout, data_dir: Path, say: Say) -> dict[str, Any]:
    regions = layout.region_names()
    second = regions[1] if len(regions) > 1 else regions[0]
    stack = DemoStack(DemoOptions(layout=layout, data_dir=data_dir), say=say, show_messages=False)
    result: dict[str, Any] = {"nodes": layout.nodes, "regions": layout.regions,
                              "replication_factor": layout.replication_factor, "load_at_start": _load()}
    try:
        stack.start()
        result["scrape_interval_s"] = rebalance.scrape_interval_s(stack)
        say("make-before-break: adding a shard to " + regions[0])
        handover = rebalance.add_shard(stack, region=regions[0], mode="make-before-break")
        say(f"  moved {len(handover.moved)}, max gap {handover.max_gap_s} s")
        say("restarting the controller with --no-handover")
        result["controller_restart"] = rebalance.restart_controller(stack, handover=False)
        say("immediate: adding a shard to " + second)
        immediate = rebalance.add_shard(stack, region=second, mode="immediate")
        say(f"  moved {len(immediate.moved)}, max gap {immediate.max_gap_s} s")
        result |= {
            "handover_max_gap_s": handover.max_gap_s,
            "immediate_max_gap_s": immediate.max_gap_s,
            "moved": len(handover.moved) + len(immediate.moved),
            "handover": _mode_detail(handover),
            "immediate": _mode_detail(immediate),
        }
        interval = result["scrape_interval_s"]
        result["handover_gap_over_interval"] = round(handover.max_gap_s / interval, 3)
        result["immediate_gap_over_interval"] = round(immediate.max_gap_s / interval, 3)
    finally:
        result["load_at_end"] = _load()
        summary = stack.finish(duration=None)
        result["leftover_processes"] = summary["leftover_processes"]
    return result


def late_entry(template: dict[str, Any], *, name: str) -> dict[str, Any]:
    """A registry entry for a new node ``name``, scraped at an existing fleet node's endpoint."""
    return {**template, "node": name, "identity": f"{name}:{plan.JOB}"}


def run_first_sample_bench(*, layout: plan.Layout, late: int, spacing_s: float, data_dir: Path,
                           say: Say) -> dict[str, Any]:
    stack = DemoStack(DemoOptions(layout=layout, data_dir=data_dir), say=say, show_messages=False)
    result: dict[str, Any] = {"nodes": layout.nodes, "late_nodes": late, "load_at_start": _load()}
    try:
        stack.start()
        assert stack.spec is not None
        interval = rebalance.scrape_interval_s(stack)
        refresh = parse_duration(stack.spec.children.http_sd_refresh_interval)
        bound = interval + refresh + 2.0
        templates = plan.fleet_entries(layout, port=stack.ports.fleet)
        names = [f"late-{i:03d}" for i in range(late)]
        registered: dict[str, float] = {}
        seen: dict[str, float] = {}
        assigned: dict[str, float] = {}
        first: dict[str, float] = {}
        selector = f'up{{job="{plan.JOB}", node=~"late-.*"}}'
        headers = rebalance.auth(stack)
        say(f"registering {late} nodes, one every {spacing_s} s")
        next_put = time.time()
        deadline = time.time() + late * spacing_s + 20 * bound
        while len(first) < late and time.time() < deadline:
            if len(registered) < late and time.time() >= next_put:
                name = names[len(registered)]
                entry = late_entry(templates[len(registered) % len(templates)], name=name)
                response = stack.http.put(
                    f"{stack.controller_url}/v1/registry/targets/{quote(entry['identity'], safe='')}",
                    json=entry, headers=headers)
                response.raise_for_status()
                registered[name] = time.time()
                next_put += spacing_s
            if registered:
                rows = stack.http.get(f"{stack.controller_url}/v1/targets", params={"q": "late-"}).json()
                for row in rows["targets"]:
                    assigned.setdefault(row["node"], time.time())  # in its child's HTTP SD from now on
                start, now = min(registered.values()) - 1.0, time.time()
                matrix = gaps.raw_matrix(stack.http, stack.master_url, selector, start=start, end=now)
                for row in matrix:
                    node = row["metric"].get("node", "")
                    if node in registered and row["values"] and node not in seen:
                        seen[node] = now
                        # The sample's own timestamp: when the child scraped it.
                        first[node] = min(float(t) for t, _ in row["values"])
            time.sleep(0.2)
        scraped = sorted(round(first[n] - registered[n], 2) for n in first)
        visible = sorted(round(seen[n] - registered[n], 2) for n in seen)
        in_sd = sorted(round(assigned[n] - registered[n], 2) for n in assigned if n in registered)
        result |= {
            "scrape_interval_s": interval,
            "sd_refresh_interval_s": refresh,
            "target_bound_s": bound,
            "registered": len(registered),
            "arrived": len(seen),
            "first_sample_p50_s": round(statistics.median(scraped), 2) if scraped else None,
            "first_sample_max_s": max(scraped) if scraped else None,
            "visible_at_master_p50_s": round(statistics.median(visible), 2) if visible else None,
            "visible_at_master_max_s": max(visible) if visible else None,
            "assigned_p50_s": round(statistics.median(in_sd), 2) if in_sd else None,
            "assigned_max_s": max(in_sd) if in_sd else None,
            "first_sample_within_bound": sum(1 for s in scraped if s <= bound),
            "visible_within_bound": sum(1 for s in visible if s <= bound),
            "per_node": {n: {"assigned_s": round(assigned[n] - registered[n], 2) if n in assigned else None,
                             "first_sample_s": round(first[n] - registered[n], 2) if n in first else None,
                             "visible_s": round(seen[n] - registered[n], 2) if n in seen else None}
                         for n in names if n in registered},
        }
    finally:
        result["load_at_end"] = _load()
        summary = stack.finish(duration=None)
        result["leftover_processes"] = summary["leftover_processes"]
    return result
