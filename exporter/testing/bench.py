"""Scrape benchmark: latency over loopback HTTP, server CPU per scrape, RSS, fleet capacity.

What is measured, honestly: the server runs on threads in this process and a keep-alive
`http.client` connection in the main thread scrapes it. Latency is client-observed wall
time per scrape (it includes the client's parsing and GIL hand-offs, so it overstates
the server). Server CPU per scrape is the process CPU delta minus the client thread's
own CPU delta, divided by scrapes; it includes the HTTP accept thread and the
collection loop if it ticked. Collection CPU is measured separately: process CPU of
`collect_once` while nothing else runs, since the read itself happens on a worker
thread. Cold runs render every scrape (production: each 15 s scrape follows a fresh 5 s
collection); the warm run hits the per-collection render cache.
Collection wall time per cycle (p50/p99/max of `collect_once`) is reported too: for the
NVML backend that is driver time, which thread CPU does not show.
Idle overhead = scrape CPU / scrape interval + collection CPU / collection interval.
Fleet capacity = budget / (per-node scrape CPU + per-node collection CPU x collections
per scrape interval), with budget = `core_fraction` x scrape interval.
"""

from __future__ import annotations

import http.client
import random
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any, Literal

from exporter.app import ExporterApp
from exporter.collection import Collection
from exporter.fleet import FleetApp, fleet_nodes
from exporter.settings import ExporterSettings
from exporter.testing.process import process_figures


def rss_mib() -> float:
    """Current resident set size (peak where ``ProcessCollector`` cannot read it)."""
    figures = process_figures()
    return figures.rss_mib if figures else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def scrape_times(port: int, paths: Callable[[int], str], scrapes: int, *,
                 connect: Callable[[int], http.client.HTTPConnection] | None = None,
                 reconnect: bool = False, warmup: int = 50) -> tuple[list[float], float, int]:
    """Scrape latencies (s), server CPU seconds in all, and the last body's size.

    ``connect`` makes the connection (plain HTTP by default; the TLS bench passes HTTPS);
    ``reconnect`` opens a new one per scrape, so every scrape pays a handshake."""
    make = connect or (lambda p: http.client.HTTPConnection("127.0.0.1", p, timeout=10))
    conn = make(port)
    latencies, size = [], 0
    try:
        for i in range(min(warmup, scrapes)):  # warm up connection and caches
            conn.request("GET", paths(i))
            conn.getresponse().read()
        cpu0, client0 = time.process_time(), time.thread_time()
        for i in range(scrapes):
            t0 = time.perf_counter()
            if reconnect:
                conn.close()
                conn = make(port)
            conn.request("GET", paths(i))
            response = conn.getresponse()
            body = response.read()
            latencies.append(time.perf_counter() - t0)
            if response.status != 200:
                raise RuntimeError(f"scrape {paths(i)} answered {response.status}")
            size = len(body)
        server_cpu = (time.process_time() - cpu0) - (time.thread_time() - client0)
    finally:
        conn.close()
    return latencies, server_cpu, size


def latency_figures(latencies: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(latencies) * 1000, 3),
            "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
            "max_ms": round(max(latencies) * 1000, 3)}


def _scrape_run(port: int, paths: Callable[[int], str], scrapes: int) -> dict[str, Any]:
    latencies, server_cpu, size = scrape_times(port, paths, scrapes)
    return {
        "scrapes": scrapes,
        **latency_figures(latencies),
        "server_cpu_ms_per_scrape": round(server_cpu / scrapes * 1000, 4),
        "body_bytes": size,
    }


def _collect_cpu(collections: list[Collection], rounds: int = 5) -> float:
    """Process CPU seconds of one `collect_once` per collection, averaged.

    Process, not thread, CPU: with a collect timeout the read runs on a worker thread,
    which the calling thread's clock never sees. Nothing else is busy meanwhile (no
    scrapes; the loop ticks once per interval at most).
    """
    t0 = time.process_time()
    for _ in range(rounds):
        for collection in collections:
            collection.collect_once()
    return (time.process_time() - t0) / (rounds * len(collections))


def _collect_wall(collection: Collection, rounds: int) -> dict[str, float]:
    """Wall time of `collect_once` (what the loop waits on), in ms."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        collection.collect_once()
        times.append((time.perf_counter() - t0) * 1000)
    return {"collect_wall_p50_ms": round(statistics.median(times), 4),
            "collect_wall_p99_ms": round(_percentile(times, 0.99), 4),
            "collect_wall_max_ms": round(max(times), 4), "collect_rounds": rounds}


def bench_serve(*, gpus: int = 8, scrapes: int = 2000, scrape_interval: float = 15.0,
                collect_interval: float = 5.0, backend: Literal["nvml", "simulated"] = "simulated",
                families: tuple[str, ...] = (), collect_rounds: int = 20,
                dcgm_names: Literal["3", "4", "both", "4-draft"] = "3") -> dict[str, Any]:
    settings = ExporterSettings(backend=backend, gpus=gpus, listen="127.0.0.1:0", node_name="bench-node",
                                collect_interval=collect_interval, families_include=list(families),
                                dcgm_names=dcgm_names)
    app = ExporterApp(settings)
    app.start()
    try:
        # Cold: render every scrape, as in production where each 15 s scrape follows a new
        # 5 s collection. Warm: the per-collection render cache (HA pairs, retries).
        app.routes.cache = False
        run = _scrape_run(app.http.port, lambda _: "/metrics", scrapes)
        app.routes.cache = True
        warm = _scrape_run(app.http.port, lambda _: "/metrics", scrapes)
        collect_s = _collect_cpu([app.collection])
        wall = _collect_wall(app.collection, collect_rounds)
        rss = rss_mib()
        devices = len(app.collection.devices)
    finally:
        app.stop()
    overhead = run["server_cpu_ms_per_scrape"] / 1000 / scrape_interval + collect_s / collect_interval
    return {**run, "warm_cache": warm, "gpus": devices, "backend": backend,
            "families": sorted(app.collection.families), "dcgm_names": dcgm_names,
            "collect_cpu_ms": round(collect_s * 1000, 4),
            **wall, "core_percent_at_interval": round(overhead * 100, 4),
            "scrape_interval_s": scrape_interval, "collect_interval_s": collect_interval,
            "rss_mib": round(rss, 1)}


def bench_fleet(*, nodes: int = 200, gpus: int = 8, scrapes: int = 2000, scrape_interval: float = 15.0,
                collect_interval: float = 5.0, core_fraction: float = 0.5) -> dict[str, Any]:
    settings = ExporterSettings(backend="simulated", gpus=gpus, listen="127.0.0.1:0",
                                collect_interval=collect_interval)
    app = FleetApp(settings, fleet_nodes(nodes))
    app.start()
    names = list(app.nodes)
    rng = random.Random(0)
    order = [rng.choice(names) for _ in range(scrapes + 50)]
    for routes in app.routes.values():
        routes.cache = False  # each node is scraped once per interval in production: always cold
    try:
        run = _scrape_run(app.http.port, lambda i: f"/nodes/{order[i]}/metrics", scrapes)
        collect_s = _collect_cpu(list(app.collections.values()), rounds=2)
        rss = rss_mib()
    finally:
        app.stop()
    per_node = run["server_cpu_ms_per_scrape"] / 1000 + collect_s * (scrape_interval / collect_interval)
    capacity = int(core_fraction * scrape_interval / per_node)
    return {**run, "nodes_served": nodes, "gpus_per_node": gpus,
            "collect_cpu_ms_per_node": round(collect_s * 1000, 4),
            "cpu_ms_per_node_per_interval": round(per_node * 1000, 4),
            "capacity_nodes": capacity, "core_fraction": core_fraction, "rss_mib": round(rss, 1),
            "derivation": f"capacity = {core_fraction} core x {scrape_interval}s / (scrape CPU + "
                          f"collect CPU x {scrape_interval / collect_interval:g}) per node"}
