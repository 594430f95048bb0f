"""``gpufed bench discovery``: registry change -> new assignment, through Consul over HTTP.

The registry is the Consul stand-in :mod:`federation.testing.standins.consul.agent` (shipped in
the package, so this runs from an install), started as its own process with ``--services`` exporter
services, so this process's CPU and RSS are gpufed's alone (py-consul client, the Consul
source, the reconcile loop and the assignment). Each change is a real HTTP registration
at the agent (half new exporters, half re-registrations with a changed rack); its latency
runs from just before the PUT to the moment ``on_assignment`` delivers an assignment that
reflects it. Changes arrive at random (exponential gaps, mean ``interval_s``), so some
share a debounce window. With ``churn_minutes`` it then follows the fleet with
``churn`` of the targets replaced per minute (deregister one, register another) and
reports CPU and RSS of that steady state. Wall-clock figures; the stand-in is not Consul.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import resource
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

from prometheus_client import ProcessCollector

from federation.localrun.waiting import wait_until
from sharder.engine.assignment import Assignment
from sharder.engine.planning import Plan
from sharder.live.reconcile import Reconciler
from sharder.model.inventory import Target
from sharder.model.spec import FederationSpec
from sharder.sources.consul import ConsulConfig, ConsulSource

AGENT_MODULE = "federation.testing.standins.consul.agent"
CONSUL_SD_REFRESH_S = 30.0  # Prometheus' default refresh_interval for consul_sd_configs
HTTP_SD_REFRESH_S = 60.0  # ... and for http_sd_configs


def _rss_mib() -> float:
    """This process's resident memory now, as client_python's ``ProcessCollector`` reads it."""
    families = ProcessCollector(registry=None).collect()
    rss = next((s.value for f in families for s in f.samples
                if s.name == "process_resident_memory_bytes"), None)
    return rss / (1 << 20) if rss is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else float("nan")


def _service(i: int, *, rack: str) -> dict[str, Any]:
    return {
        "Name": "gpufed-exporter", "ID": f"gpufed-exporter-node-{i}-9400",
        "Address": f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}", "Port": 9400,
        "Tags": ["gpu", "prometheus"],
        "Meta": {"region": f"region-{i % 2}", "rack": rack, "team": "llm", "gpu_count": "8",
                 "metrics_path": "/metrics", "node": f"node-{i}"},
        "Check": {"TTL": "1h", "Status": "passing"},
    }


def _instance(i: int) -> str:
    return f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}:9400"


class _Agent:
    """The stand-in in its own process, spoken to over its HTTP API only."""

    def __init__(self, services: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", AGENT_MODULE, "--services", str(services), "--regions", "2"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.base = f"http://127.0.0.1:{self.port}"

    def put(self, path: str, body: dict[str, Any] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(self.base + path, data=data, method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class _Waiter:
    """Matches each change with the first assignment that reflects it."""

    def __init__(self) -> None:
        self.pending: dict[str, tuple[float, str]] = {}  # identity -> (t0, rack or "" for gone)
        self.latencies: list[float] = []
        self.assignments = 0
        self.first = threading.Event()
        self.lock = threading.Lock()
        self.rec: Reconciler | None = None

    def expect(self, identity: str, rack: str, t0: float) -> None:
        with self.lock:
            self.pending[identity] = (t0, rack)

    def __call__(self, assignment: Assignment, plan: Plan) -> None:
        now = time.perf_counter()
        assert self.rec is not None
        current: Mapping[str, Target] = self.rec.target_map
        with self.lock:
            self.assignments += 1
            for identity, (t0, rack) in list(self.pending.items()):
                target = current.get(identity)
                if (target is None and rack == "") or (target is not None and target.rack == rack):
                    self.latencies.append(now - t0)
                    del self.pending[identity]
        self.first.set()


def run_discovery_bench(
    *,
    targets: int = 10_000,
    changes: int = 200,
    debounce_s: float = 1.0,
    interval_s: float = 0.25,
    churn: float = 0.01,
    churn_minutes: float = 0.0,
    seed: int = 0,
) -> dict[str, Any]:
    spec = FederationSpec.model_validate({
        "cluster": "bench", "regions": [{"name": "region-0"}, {"name": "region-1"}],
        "sharding": {"targets_per_shard": 24}, "jobs": [{"name": "gpu"}],
    })
    rng = random.Random(seed)
    agent = _Agent(targets)
    stop = threading.Event()
    waiter = _Waiter()
    rec = Reconciler(spec=spec, debounce_s=debounce_s, on_assignment=waiter)
    waiter.rec = rec
    source = ConsulSource(ConsulConfig(address=f"127.0.0.1:{agent.port}", wait="30s"), sink=rec)
    threads = [threading.Thread(target=rec.run, args=(stop,), daemon=True),
               threading.Thread(target=source.run, args=(stop,), daemon=True)]
    try:
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        if not waiter.first.wait(timeout=300) or len(rec.target_map) != targets:
            raise RuntimeError(f"no initial assignment of {targets} targets (got {len(rec.target_map)})")
        startup_s = time.perf_counter() - start
        cpu0, wall0 = _cpu(), time.perf_counter()
        for k in range(changes):
            i, rack = (targets + k, "rack-new") if k % 2 == 0 else (rng.randrange(targets), f"rack-moved-{k}")
            t0 = time.perf_counter()
            waiter.expect(_instance(i), rack, t0)
            agent.put("/v1/agent/service/register", _service(i, rack=rack))
            time.sleep(rng.expovariate(1 / interval_s) if interval_s > 0 else 0)
        with contextlib.suppress(TimeoutError):  # what never arrived is reported as missed
            wait_until(lambda: not waiter.pending, timeout=30 + debounce_s, what="every change",
                       interval=0.05)
        change_wall = time.perf_counter() - wall0
        change_cpu = _cpu() - cpu0
        result: dict[str, Any] = {
            "targets": targets,
            "changes": changes,
            "debounce_s": debounce_s,
            "change_interval_mean_s": interval_s,
            "change_to_assignment_p50_s": round(_percentile(waiter.latencies, 0.50), 4),
            "change_to_assignment_p99_s": round(_percentile(waiter.latencies, 0.99), 4),
            "change_to_assignment_max_s": round(max(waiter.latencies, default=float("nan")), 4),
            "changes_unresolved": len(waiter.pending),
            "assignments": waiter.assignments,
            "startup_s": round(startup_s, 3),
            "cpu_seconds": round(change_cpu, 3),
            "wall_seconds": round(change_wall, 3),
            "rss_mib": round(_rss_mib(), 1),
            "anchor_consul_sd_refresh_interval_s": CONSUL_SD_REFRESH_S,
            "anchor_http_sd_refresh_interval_s": HTTP_SD_REFRESH_S,
        }
        p99 = result["change_to_assignment_p99_s"]
        result["p99_vs_consul_sd_refresh"] = round(p99 / CONSUL_SD_REFRESH_S, 4)
        if churn_minutes > 0:
            result.update(_churn(agent, targets=targets, churn=churn, minutes=churn_minutes, rng=rng,
                                 first=targets + changes))
        result["note"] = ("registry is federation.testing.standins.consul.agent in its own process "
                          "(a stand-in, not Consul); cpu/rss are this process only: py-consul, Consul "
                          "source, reconcile, assignment")
        return result
    finally:
        stop.set()
        agent.close()
        for thread in threads:
            thread.join(timeout=40)


def _churn(
    agent: _Agent, *, targets: int, churn: float, minutes: float, rng: random.Random, first: int
) -> dict[str, Any]:
    """Replace ``churn`` of the fleet per minute (one deregistration + one registration each)."""
    per_minute = max(1, round(targets * churn))
    gap = 60.0 / per_minute
    cpu0, wall0 = _cpu(), time.perf_counter()
    end = wall0 + minutes * 60
    k = 0
    next_at = wall0
    alive = list(range(targets))
    while next_at < end and alive:
        time.sleep(max(0.0, next_at - time.perf_counter()))
        gone = alive.pop(rng.randrange(len(alive)))
        agent.put(f"/v1/agent/service/deregister/gpufed-exporter-node-{gone}-9400")
        agent.put("/v1/agent/service/register", _service(first + k, rack="rack-churn"))
        k += 1
        next_at += gap
    time.sleep(max(0.0, end - time.perf_counter()))
    wall = time.perf_counter() - wall0
    cpu = _cpu() - cpu0
    return {
        "churn_per_minute": per_minute,
        "churn_minutes": round(wall / 60, 2),
        "churn_cpu_seconds": round(cpu, 3),
        "churn_cpu_fraction": round(cpu / wall, 4),
        "churn_rss_mib": round(_rss_mib(), 1),
    }
