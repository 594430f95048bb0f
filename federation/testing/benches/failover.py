"""``gpufed bench failover``: kill -9 the leader of N replicas, time the take-over, count
what HTTP SD clients saw meanwhile and what moved.

The Consul stand-in and every ``gpufed serve`` replica run as their own processes on
127.0.0.1 (:mod:`federation.testing.harnesses.replicas`). Before the kill, every replica serves one
assignment version; pollers then ask every replica for every child's SD answer, back to
back, from one second before the kill until the new leader has taken over and written.
``takeover_s`` runs from the SIGKILL to the first replica reporting ``role: leader``;
``writes_resume_s`` to the first write (a plan) it accepts. An SD error is a refused
connection, a timeout or a non-200 answer from a surviving replica; an answer whose
bytes differ from the pre-kill answer counts in ``sd_answers_changed``. ``moved_by_failover``
compares every target's shard before the kill and after the take-over.
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from federation.localrun.waiting import wait_until
from federation.testing.harnesses.replicas import Replica, ReplicaSet, Standin, write_fleet


@dataclass
class SdPoller:
    """Polls ``/v1/sd/<child>`` on a set of replicas, comparing with the expected bytes."""

    replicas: list[Replica]
    expected: dict[str, bytes]
    timeout_s: float = 1.0
    requests: int = 0
    errors: int = 0
    changed: int = 0
    error_samples: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> SdPoller:
        self._thread = threading.Thread(target=self._run, daemon=True, name="sd-poller")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as http:
            while not self._stop.is_set():
                for replica in self.replicas:
                    for child, body in self.expected.items():
                        self.requests += 1
                        try:
                            response = http.get(f"{replica.url}/v1/sd/{child}")
                        except httpx.HTTPError as exc:
                            self._error(f"{replica.name} {child}: {type(exc).__name__}")
                            continue
                        if response.status_code != 200:
                            self._error(f"{replica.name} {child}: HTTP {response.status_code}")
                        elif response.content != body:
                            self.changed += 1
                self._stop.wait(0.01)

    def _error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what)


def _one_round(rs: ReplicaSet) -> dict[str, Any]:
    leader = rs.one_leader(timeout=120)
    version = rs.settled(timeout=120)
    before = rs.placement(leader)
    fence_before = rs.status(leader)["fence"]
    children = rs.children(leader)
    sample = children[:: max(1, len(children) // 4)][:4]
    expected = {child: rs.sd(leader, child) for child in sample}
    survivors = [r for r in rs.replicas if r.alive and r is not leader]
    watch = SdPoller(replicas=survivors, expected=expected).start()
    dead = SdPoller(replicas=[leader], expected=expected).start()
    time.sleep(1.0)
    os.kill(leader.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    leader.proc.wait(10)
    try:
        new = wait_until(
            lambda: next((r for r in rs.leaders() if r is not leader), None), timeout=120, what="a new leader"
        )
        takeover_s = time.monotonic() - killed_at
        wait_until(
            lambda: rs.write(new, "/v1/plan", {}).status_code == 200,
            timeout=60,
            what="the new leader writing",
        )
        writes_s = time.monotonic() - killed_at
        time.sleep(2.0)  # let the new leader tick and settle while the pollers keep asking
    finally:
        watch.stop()
        dead.stop()
    after = rs.placement(new)
    status = rs.status(new)
    moved = sum(1 for identity, shard in before.items() if after.get(identity) != shard)
    moved += sum(1 for identity in after if identity not in before)
    return {
        "takeover_s": round(takeover_s, 2),
        "writes_resume_s": round(writes_s, 2),
        "sd_requests_during_failover": watch.requests,
        "sd_errors_during_failover": watch.errors,
        "sd_error_samples": watch.error_samples,
        "sd_answers_changed": watch.changed,
        "sd_requests_to_killed_leader": dead.requests,
        "sd_errors_at_killed_leader": dead.errors,
        "moved_by_failover": moved,
        "targets": len(before),
        "assignment_version_before": version,
        "assignment_version_after": status["assignment_version"],
        "fence_before": fence_before,
        "fence_after": status["fence"],
        "killed": leader.name,
        "new_leader": new.name,
    }


def run_failover_bench(
    *, replicas: int = 3, nodes: int = 2000, ttl_s: int = 15, lock_delay_s: int = 1, rounds: int = 1
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpufed-failover-") as tmp:
        workdir = Path(tmp)
        spec, inventory = write_fleet(workdir, nodes=nodes, regions={"r1": 8, "r2": 4})
        standin = Standin.start()
        try:
            with ReplicaSet(
                workdir=workdir,
                spec=spec,
                inventory=inventory,
                consul=standin.address,
                ttl_s=ttl_s,
                lock_delay_s=lock_delay_s,
            ) as rs:
                rs.start(replicas)
                results = []
                for n in range(rounds):
                    results.append(_one_round(rs))
                    if n + 1 < rounds:
                        rs.add()  # the killed replica comes back as a new process
        finally:
            standin.stop()
    takeovers = [r["takeover_s"] for r in results]
    summary = {
        key: sum(r[key] for r in results)
        for key in ("sd_requests_during_failover", "sd_errors_during_failover", "sd_answers_changed",
                    "moved_by_failover", "sd_errors_at_killed_leader")
    }  # fmt: skip
    return {
        "replicas": replicas,
        "targets": results[0]["targets"],
        "ttl_s": ttl_s,
        "lock_delay_s": lock_delay_s,
        "rounds": rounds,
        "takeover_s": max(takeovers),
        "takeover_s_median": round(statistics.median(takeovers), 2),
        "target_takeover_s": ttl_s + 2,
        "within_target": max(takeovers) <= ttl_s + 2,
        "writes_resume_s": max(r["writes_resume_s"] for r in results),
        **summary,
        "per_round": results,
        "setup": (
            "Consul stand-in (federation.testing.standins.consul.agent, its own process; sessions "
            "reaped at 2x TTL as Consul's servers do, TTL checks critical at 1x) and N "
            "`gpufed serve --store consul://... --leader-election consul` processes on 127.0.0.1 "
            "following one inventory; the leader is killed with SIGKILL; SD errors count only surviving "
            "replicas (the killed one is counted apart)."
        ),
    }
