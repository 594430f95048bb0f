"""``gpufed bench live``: a real ``gpufed serve`` process, timed from a registration to its SD answer.

What an operator sees, measured from outside: the controller runs as its own process on
127.0.0.1 (fresh data dir, a token), following ``targets`` targets from a file inventory
(or pre-registered through the built-in registry with ``via="registry"``), three regions
with shards of about 1,000 targets. ``changes`` registrations then arrive at ``rate`` per
second (``PUT /v1/registry/targets/{identity}``, an open loop: change i is due at i/rate).
For each, the time runs from just before the PUT until the target is in
``/v1/sd/<child>`` of the child it was assigned to (found through ``/v1/targets/{id}``;
both polled every 20 ms). ``ready_s`` runs from the process start until ``/readyz`` says
200 in a poll after which every child's SD answer holds every target (the bench's own
count of a million targets is not in it). ``change_to_served_s`` lists each change's time
in order (a stall shows where it was). CPU share is the serve process's CPU seconds (``/proc``) over
the wall seconds of the change phase. Then one ``POST /v1/registry/batch`` of ``batch``
entries gives ``registry_batch_per_s`` (null, with ``registry_batch_error``, when the
controller has no batch route or refuses it). After the process is stopped, the anchors
run in this process on the same targets: one change through
``sharder.incremental.IncrementalAssigner`` and one full ``sharder.assign.assign``.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from federation.demo import procstat
from federation.loopback import free_port, wait_until
from federation.testing.live_anchors import engine_anchors
from federation.testing.replicas import write_fleet

TOKEN = "live-bench-token-0123456789abcdef0123"
REGIONS = ("region-a", "region-b", "region-c")
TARGETS_PER_SHARD = 1000
POLL_S = 0.02
BATCH_ROUTE = "/v1/registry/batch"
BATCH_CHUNK = 5000  # about 0.55 MB of JSON: under the API's 1 MiB body limit
MAX_TARGETS = 1_000_000
PUT_WORKERS = 8


class LiveBenchError(RuntimeError):
    """The serve process did not start or become ready; the message carries its log's tail."""


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def registration(i: int, *, prefix: str, node: str) -> tuple[str, dict[str, Any]]:
    """Entry ``i`` of a synthetic range (``prefix`` is the address's first two octets)."""
    if i >= 62_500:
        raise ValueError(f"registration index {i} is past the {prefix}.0.0/16 range")
    address = f"{prefix}.{i // 250}.{i % 250 + 1}"
    body = {"address": address, "port": 9400, "job": "gpu", "node": f"{node}-{i:05d}",
            "region": REGIONS[i % len(REGIONS)], "gpus": 8}  # fmt: skip
    return f"{address}:9400", body


class ServeProcess:
    """``gpufed serve`` in its own process; ``stop`` ends it (terminate, then kill)."""

    def __init__(self, workdir: Path, *, spec: Path, inventory: Path | None, debounce_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "serve.log"
        args = [sys.executable, "-m", "federation.cli", "serve", "--spec", str(spec),
                "--data-dir", str(workdir / "data"), "--listen", f"127.0.0.1:{self.port}",
                "--debounce", str(debounce_s), "--registry-ttl", "86400",
                "--log-level", "warning"]  # fmt: skip
        if inventory is not None:
            args += ["--inventory", str(inventory)]
        self.started = time.monotonic()
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "GPUFED_TOKEN": TOKEN})  # fmt: skip

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise LiveBenchError(f"gpufed serve exited with {self.proc.returncode}:\n{self.tail()}")

    def stat(self) -> procstat.ProcStat:
        found = procstat.read(self.proc.pid)
        if found is None:
            raise LiveBenchError(f"gpufed serve is gone:\n{self.tail()}")
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


def served_count(http: httpx.Client) -> int:
    """Distinct targets over every child's SD answer (one GET per child)."""
    rows = http.get("/v1/shards").json()["shards"]
    seen: set[str] = set()
    for row in rows:
        for child in row["children"]:
            answer = http.get(f"/v1/sd/{child['child']}")
            if answer.status_code == 200:
                seen.update(t for group in answer.json() for t in group["targets"])
    return len(seen)


def wait_served(http: httpx.Client, serve: ServeProcess, *, expected: int, timeout: float) -> float:
    """When (monotonic) ``/readyz`` first said 200 in a poll whose SD answers then held all
    ``expected`` targets: the count itself (one GET per child, a million targets at 1M) is
    the bench's proof, not the controller's start-up, so its seconds are not counted."""
    said_ready: list[float] = []

    def complete() -> bool:
        serve.check_alive()
        asked = time.monotonic()
        if http.get("/readyz").status_code != 200 or served_count(http) < expected:
            return False
        said_ready.append(asked)
        return True

    wait_until(complete, timeout=timeout, what=f"/readyz and {expected} targets in SD", interval=0.5)
    return said_ready[0]


def post_batch(
    http: httpx.Client, entries: list[tuple[str, dict[str, Any]]], *, chunk: int = BATCH_CHUNK
) -> tuple[float | None, str | None]:
    """(seconds to register ``entries`` in POSTs of ``chunk``, None), or (None, why the batch
    route was not usable). Chunks keep each body under the API's 1 MiB request limit."""
    started = time.perf_counter()
    for first in range(0, len(entries), chunk):
        part = entries[first : first + chunk]
        body = {"put": [{"identity": identity, **fields} for identity, fields in part], "delete": []}
        try:
            answer = http.post(BATCH_ROUTE, json=body, timeout=600)
        except httpx.HTTPError as exc:
            return None, f"POST {BATCH_ROUTE}: {type(exc).__name__}: {exc}"
        if answer.status_code != 200:
            why = "no batch route (an older controller)" if answer.status_code in (404, 405) else "refused"
            return None, f"POST {BATCH_ROUTE} answered {answer.status_code} ({why}): {answer.text[:300]}"
    return time.perf_counter() - started, None


def preregister(http: httpx.Client, entries: list[tuple[str, dict[str, Any]]]) -> str:
    """Register ``entries`` through the batch route, or one PUT each where it is not usable."""
    _, error = post_batch(http, entries)
    if error is None:
        return "batch"

    def put(entry: tuple[str, dict[str, Any]]) -> None:
        identity, fields = entry
        answer = http.put(f"/v1/registry/targets/{quote(identity, safe='')}", json=fields)
        if answer.status_code not in (200, 201):
            raise LiveBenchError(f"PUT {identity} answered {answer.status_code}: {answer.text[:300]}")

    with ThreadPoolExecutor(PUT_WORKERS) as pool:  # as the exporter's fleet registers: 8 connections
        for _ in pool.map(put, entries):
            pass
    return "put"


def time_change(http: httpx.Client, identity: str, fields: dict[str, Any], *, timeout: float) -> float | None:
    """Seconds from the PUT until ``identity`` is in its child's SD answer; None past ``timeout``."""
    started = time.perf_counter()
    answer = http.put(f"/v1/registry/targets/{quote(identity, safe='')}", json=fields)
    if answer.status_code not in (200, 201):
        raise LiveBenchError(f"PUT {identity} answered {answer.status_code}: {answer.text[:300]}")
    deadline = started + timeout
    child: str | None = None
    needle = f'"{identity}"'.encode()
    while time.perf_counter() < deadline:
        if child is None:
            row = http.get(f"/v1/targets/{quote(identity, safe='')}")
            if row.status_code == 200 and row.json().get("children"):
                child = str(row.json()["children"][0])
        if child is not None:
            sd = http.get(f"/v1/sd/{child}")
            if sd.status_code == 200 and needle in sd.content:
                return time.perf_counter() - started
        time.sleep(POLL_S)
    return None


def run_changes(http: httpx.Client, *, changes: int, rate: float, timeout: float) -> list[float | None]:
    """Change i is due at i/rate (open loop); each is timed in its own thread."""
    results: list[float | None] = [None] * changes
    errors: list[BaseException] = []

    def one(i: int) -> None:
        identity, fields = registration(i, prefix="10.250", node="live")
        try:
            results[i] = time_change(http, identity, fields, timeout=timeout)
        except (httpx.HTTPError, LiveBenchError) as exc:
            errors.append(exc)

    threads: list[threading.Thread] = []
    began = time.monotonic()
    for i in range(changes):
        time.sleep(max(0.0, began + i / rate - time.monotonic()))
        thread = threading.Thread(target=one, args=(i,), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout + 30)
    if errors:
        raise LiveBenchError(f"{len(errors)} of {changes} changes failed; first: {errors[0]}")
    return results


def run_live_bench(
    *, targets: int, changes: int, rate: float, via: str = "file", debounce_s: float = 1.0,
    batch: int = 20_000, change_timeout_s: float = 60.0, ready_timeout_s: float = 900.0,
    inventory_format: str = "yaml",
) -> dict[str, Any]:  # fmt: skip
    if via not in ("file", "registry"):
        raise ValueError(f"via: expected 'file' or 'registry', got {via!r}")
    if not 2 <= targets <= MAX_TARGETS:
        raise ValueError(f"targets: expected 2..{MAX_TARGETS}, got {targets}")
    nodes = math.ceil(targets / 2)  # each node runs a gpu and a node exporter
    shards = max(1, round(targets / len(REGIONS) / TARGETS_PER_SHARD))
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-live-") as tmp:
        workdir = Path(tmp)
        spec, inventory = write_fleet(workdir, nodes=nodes, regions=dict.fromkeys(REGIONS, shards),
                                      inventory_format=inventory_format)  # fmt: skip
        expected = 2 * nodes
        entries: list[tuple[str, dict[str, Any]]] = []
        if via == "registry":
            entries = [_node_entry(i, job) for i in range(nodes) for job in ("gpu", "node")]
        followed = inventory if via == "file" else None
        serve = ServeProcess(workdir, spec=spec, inventory=followed, debounce_s=debounce_s)
        http = httpx.Client(base_url=serve.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"},
                            limits=httpx.Limits(max_connections=64))  # fmt: skip
        result: dict[str, Any] = {
            "targets": expected, "shards": shards * len(REGIONS), "via": via,
            "changes": changes, "rate_per_s": rate, "debounce_s": debounce_s,
            "inventory_format": inventory_format if via == "file" else None,
        }  # fmt: skip
        try:
            if via == "registry":
                wait_until(lambda: _up(http, serve), timeout=ready_timeout_s, what="/healthz", interval=0.2)
                result["preregistered_with"] = preregister(http, entries)
            result["ready_s"] = round(
                wait_served(http, serve, expected=expected, timeout=ready_timeout_s) - serve.started, 3
            )
            before, wall_started = serve.stat(), time.monotonic()
            timed = run_changes(http, changes=changes, rate=rate, timeout=change_timeout_s)
            after, wall = serve.stat(), time.monotonic() - wall_started
            served = [t for t in timed if t is not None]
            counted = [change_timeout_s if t is None else t for t in timed]  # a miss counts as the timeout
            result.update(
                change_to_served_p50_s=round(percentile(counted, 50), 4),
                change_to_served_p99_s=round(percentile(counted, 99), 4),
                change_to_served_max_s=round(max(counted), 4),
                change_to_served_mean_s=round(statistics.fmean(served), 4) if served else None,
                changes_missed=len(timed) - len(served),
                change_to_served_s=[None if t is None else round(t, 3) for t in timed],
                controller_cpu_share=round((after.cpu_s - before.cpu_s) / wall, 4),
                rss_mib=round(after.rss_mib, 1),
            )
            batch_entries = [registration(i, prefix="10.240", node="batch") for i in range(batch)]
            seconds, error = post_batch(http, batch_entries) if batch else (None, "skipped (--batch 0)")
            result.update(registry_batch_entries=batch, registry_batch_chunk=BATCH_CHUNK)
            result["registry_batch_per_s"] = round(batch / seconds, 1) if seconds else None
            if error is not None:
                result["registry_batch_error"] = error
        finally:
            http.close()
            serve.stop()
        result.update(engine_anchors(spec, inventory))
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return result


def _up(http: httpx.Client, serve: ServeProcess) -> bool:
    """Serving HTTP (with no target yet there is no assignment, so /readyz says 503)."""
    serve.check_alive()
    return http.get("/healthz").status_code == 200


def _node_entry(i: int, job: str) -> tuple[str, dict[str, Any]]:
    """Target ``job`` of node ``i`` exactly as ``write_fleet``'s inventory describes it."""
    address = f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}"
    port = 9400 if job == "gpu" else 9100
    body = {"address": address, "port": port, "job": job, "node": f"gpu-{i:05d}",
            "region": REGIONS[i % len(REGIONS)], "gpus": 8 if i % 4 else 4}  # fmt: skip
    return f"{address}:{port}", body
