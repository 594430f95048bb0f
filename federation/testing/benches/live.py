"""``gpufed bench live``: a real ``gpufed serve`` process, timed from a registration to what
its child reads.

What an operator sees, measured from outside: the controller runs as its own process on
127.0.0.1 (fresh data dir, a token) in one of the shapes users deploy
(``federation.testing.benches.live_shapes``): a spec file (default ``examples/federation.yaml`` as
shipped; ``builtin``: the bench's own, shards of about 1,000 targets over HTTP SD), a store
(SQLite, or the Consul or Kubernetes stand-in in its own process) and a discovery mode
(``file_sd`` or ``http_sd``). It follows ``targets`` targets from a file inventory over the
spec's regions (or pre-registered through the built-in registry with ``via="registry"``).
``changes`` registrations then arrive at ``rate`` per second
(``PUT /v1/registry/targets/{identity}``, an open loop: change i is due at i/rate). For each,
three times run from just before the PUT (all polled every 20 ms):

* ``listed``: ``/v1/targets/{id}`` names its children;
* ``change_to_served``: the target is in ``/v1/sd/<child>`` of the first of them;
* ``served``: the target is in what that child actually reads: ``/v1/sd/<child>`` with
  HTTP SD, ``<data-dir>/rendered/children/<child>/targets/gpu.json`` with file_sd.

``ready_s`` runs from the process start until ``/readyz`` says 200 in a poll after which
every child's SD answer holds every target (the bench's own count is not in it; it runs
after the settle below, so its thousands of GETs are not taken for start-up work); with
file_sd also the first config bundle must be on disk (``/v1/configs``).
``settle_s`` runs from the process start until the start-up work has ended, as seen from
outside: after ``ready_s``, the first of ``QUIET_WINDOWS`` consecutive ``QUIET_WINDOW_S``
windows in which the controller used under ``QUIET_CPU_SHARE`` of a core (its own
``/metrics``; the bench sends nothing then). A controller whose ``/readyz`` means settled has
``settle_s`` close to ``ready_s``.
``change_to_served_s`` lists each change's time in order (a stall shows where it was). CPU
share over the wall seconds of the change phase and ``cpu_ms_per_change`` (that CPU divided
by the changes) come from ``/proc/<pid>/stat`` (the controller's CPU and its waited-for
promtool runs; ``cpu_from: "proc"``), read after the ``/metrics`` request that opens the
phase and before the one that closes it, so the bench's own readings (a pass over every
shard's gauges) are not counted; where ``/proc`` cannot be read, from ``/metrics``
(``process_cpu_seconds_total`` plus ``gpufed_controller_subprocess_cpu_seconds_total``). RSS
is ``/metrics``' ``process_resident_memory_bytes``. ``rss_mib_after_changes`` is the RSS once
``rss_after_changes`` registrations have been placed (the timed ones, then untimed ones at
the same rate until the count is reached). Then one
``POST /v1/registry/batch`` of ``batch`` entries gives ``registry_batch_per_s`` (null, with
``registry_batch_error``, when the controller has no batch route or refuses it). After the
process is stopped, the anchors run in this process on the same targets: one change through
``sharder.engine.incremental.IncrementalAssigner`` and one full ``sharder.engine.assigning.assign``.
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from prometheus_client.parser import text_string_to_metric_families

from federation.controller.base.metrics import SUBPROCESS_CPU
from federation.localrun.waiting import wait_until
from federation.testing.benches.live_anchors import engine_anchors
from federation.testing.benches.live_shapes import BUILTIN, ShapeError, StoreStandin, shape_spec, start_store
from federation.testing.harnesses.polling import serve_port
from federation.testing.harnesses.replicas import write_fleet
from sharder.engine.sizing import MAX_SHARDS_BOUND

TOKEN = "live-bench-token-0123456789abcdef0123"
REGIONS = ("region-a", "region-b", "region-c")
TARGETS_PER_SHARD = 1000
POLL_S = 0.02
BATCH_ROUTE = "/v1/registry/batch"
BATCH_CHUNK = 5000  # about 0.55 MB of JSON: under the API's 1 MiB body limit
MAX_TARGETS = 1_000_000
PUT_WORKERS = 8
QUIET_WINDOW_S = 1.0
QUIET_WINDOWS = 2
QUIET_CPU_SHARE = 0.2
"""Settled: this many windows in a row under this share of a core (promtool runs included)."""
SHIPPED_MAX_SHARDS = MAX_SHARDS_BOUND
"""``gpufed serve --max-shards-per-region`` at most (its option's bound)."""


class LiveBenchError(RuntimeError):
    """The serve process did not start or become ready; the message carries its log's tail."""


@dataclass(frozen=True)
class ProcessFigures:
    cpu_s: float
    """The controller's CPU seconds and those of the promtool/amtool runs it waited for."""
    rss_mib: float


def proc_cpu_s(pid: int) -> float | None:
    """CPU seconds of process ``pid`` and of the children it waited for (its promtool and
    amtool runs): ``/proc/<pid>/stat`` utime + stime + cutime + cstime. None off Linux."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def phase_cpu_s(http: httpx.Client, serve: ServeProcess, *, ending: bool) -> tuple[float, ProcessFigures]:
    """The controller's CPU at the start (``ending`` False) or end of a timed phase, and its
    figures. Read from ``/proc`` where it can be, outside the ``/metrics`` request: rendering
    ``/metrics`` costs a pass over every shard's gauges (0.15 s of CPU at 300,000 targets),
    which is the bench's reading, not the phase's work. Else ``/metrics``' own figure."""
    if ending:
        cpu = proc_cpu_s(serve.proc.pid)
        figures = process_figures(http)
    else:
        figures = process_figures(http)
        cpu = proc_cpu_s(serve.proc.pid)
    return (figures.cpu_s if cpu is None else cpu), figures


def process_figures(http: httpx.Client) -> ProcessFigures:
    """CPU and RSS as the controller's own ``/metrics`` says (``ProcessCollector``)."""
    answer = http.get("/metrics")
    answer.raise_for_status()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            values[sample.name] = sample.value
    missing = [n for n in ("process_cpu_seconds_total", "process_resident_memory_bytes") if n not in values]
    if missing:
        raise LiveBenchError(f"the controller's /metrics has no {', '.join(missing)}")
    cpu = values["process_cpu_seconds_total"] + values.get(f"{SUBPROCESS_CPU}_total", 0.0)
    return ProcessFigures(cpu_s=cpu, rss_mib=values["process_resident_memory_bytes"] / 2**20)


@dataclass(frozen=True)
class Timed:
    """One change's seconds from its PUT; None: not seen within the timeout."""

    listed: float | None
    sd: float | None
    served: float | None


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def registration(
    i: int, *, prefix: str, node: str, regions: tuple[str, ...] = REGIONS
) -> tuple[str, dict[str, Any]]:
    """Entry ``i`` of a synthetic range (``prefix`` is the address's first two octets)."""
    if i >= 62_500:
        raise ValueError(f"registration index {i} is past the {prefix}.0.0/16 range")
    address = f"{prefix}.{i // 250}.{i % 250 + 1}"
    body = {"address": address, "port": 9400, "job": "gpu", "node": f"{node}-{i:05d}",
            "region": regions[i % len(regions)], "gpus": 8}  # fmt: skip
    return f"{address}:9400", body


class ServeProcess:
    """``gpufed serve`` in its own process; ``stop`` ends it (terminate, then kill)."""

    def __init__(
        self, workdir: Path, *, spec: Path, inventory: Path | None, debounce_s: float,
        store: StoreStandin | None = None, extra_args: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        self.log = workdir / "serve.log"
        args = [sys.executable, "-m", "federation.commands.cli", "serve", "--spec", str(spec),
                "--data-dir", str(workdir / "data"), "--listen", "127.0.0.1:0",
                "--debounce", str(debounce_s), "--registry-ttl", "86400",
                "--log-level", "warning"]  # fmt: skip
        if inventory is not None:
            args += ["--inventory", str(inventory)]
        args += list(extra_args)
        extra_env = {}
        if store is not None:
            args += list(store.args)
            extra_env = store.env
        self.data = workdir / "data"
        self.started = time.monotonic()
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, **extra_env, "GPUFED_TOKEN": TOKEN})  # fmt: skip
        self.port = serve_port(self.log, self.proc, fail=LiveBenchError)  # serve binds it: no race
        self.url = f"http://127.0.0.1:{self.port}"

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise LiveBenchError(f"gpufed serve exited with {self.proc.returncode}:\n{self.tail()}")

    def child_file(self, child: str, job: str) -> Path:
        """The file_sd target list ``child`` reads for ``job`` (published by the controller)."""
        return self.data / "rendered" / "children" / child / "targets" / f"{job}.json"

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


def wait_served(
    http: httpx.Client, serve: ServeProcess, *, expected: int, timeout: float, files: bool = False
) -> float:
    """When (monotonic) ``/readyz`` first said 200 in a poll whose SD answers then held all
    ``expected`` targets (and, with ``files``, a first config bundle was on disk: a file_sd
    child reads nothing before it): the count itself (one GET per child, a million targets
    at 1M) is the bench's proof, not the controller's start-up, so its seconds are not counted."""
    said_ready: list[float] = []

    def complete() -> bool:
        serve.check_alive()
        asked = time.monotonic()
        if http.get("/readyz").status_code != 200 or (files and not bundle_published(http)):
            return False
        if served_count(http) < expected:
            return False
        said_ready.append(asked)
        return True

    wait_until(complete, timeout=timeout, what=f"/readyz and {expected} targets in SD", interval=0.5)
    return said_ready[0]


def wait_said_ready(http: httpx.Client, serve: ServeProcess, *, timeout: float, files: bool) -> float:
    """When (monotonic) ``/readyz`` first said 200 (with ``files``, and a bundle was out)."""
    said: list[float] = []

    def ready() -> bool:
        serve.check_alive()
        if http.get("/readyz").status_code != 200 or (files and not bundle_published(http)):
            return False
        # when the answer came: a request sent while the process was still placing waits in
        # the listen backlog (a 1M start answered a poll sent at 4.5 s minutes later)
        said.append(time.monotonic())
        return True

    wait_until(ready, timeout=timeout, what="/readyz", interval=0.2)
    return said[0]


def wait_settled(http: httpx.Client, serve: ServeProcess, *, timeout: float) -> float:
    """When (monotonic) the controller's CPU fell quiet: the start of the first of
    ``QUIET_WINDOWS`` windows in a row in which it used under ``QUIET_CPU_SHARE`` of a core."""
    deadline = time.monotonic() + timeout
    quiet: list[float] = []
    last, at = process_figures(http).cpu_s, time.monotonic()
    while time.monotonic() < deadline:
        serve.check_alive()
        time.sleep(QUIET_WINDOW_S)
        cpu, now = process_figures(http).cpu_s, time.monotonic()
        quiet = [*quiet, at] if (cpu - last) / (now - at) < QUIET_CPU_SHARE else []
        if len(quiet) >= QUIET_WINDOWS:
            return quiet[0]
        last, at = cpu, now
    raise LiveBenchError(f"the controller did not fall quiet within {timeout:.0f} s:\n{serve.tail()}")


def place_more(http: httpx.Client, *, first: int, count: int, rate: float, regions: tuple[str, ...],
               timeout: float) -> None:  # fmt: skip
    """``count`` more registrations (untimed, at ``rate``), then wait until the last is listed."""
    began = time.monotonic()
    identity = ""
    for k in range(count):
        time.sleep(max(0.0, began + k / rate - time.monotonic()))
        identity, fields = registration(first + k, prefix="10.250", node="live", regions=regions)
        answer = http.put(f"/v1/registry/targets/{quote(identity, safe='')}", json=fields)
        if answer.status_code not in (200, 201):
            raise LiveBenchError(f"PUT {identity} answered {answer.status_code}: {answer.text[:300]}")
    if identity:
        path = f"/v1/targets/{quote(identity, safe='')}"
        wait_until(lambda: http.get(path).status_code == 200 and bool(http.get(path).json().get("children")),
                   timeout=timeout, what=f"{identity} listed", interval=POLL_S)  # fmt: skip


def shard_cap(targets: int, regions: int, per_shard: int) -> int:
    """A ``--max-shards-per-region`` that fits ``targets`` (two per node) spread over
    ``regions`` regions, ``per_shard`` nodes a shard, with room to grow, within serve's bound."""
    nodes_per_region = math.ceil(targets / 2 / max(1, regions))
    return min(SHIPPED_MAX_SHARDS, max(2000, math.ceil(nodes_per_region / max(1, per_shard) * 1.25)))


def bundle_published(http: httpx.Client) -> bool:
    answer = http.get("/v1/configs")
    if answer.status_code != 200:  # a controller still starting may answer 5xx: not yet
        return False
    status = answer.json().get("status") or {}
    return bool(status.get("version")) and bool(status.get("ok"))


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


def time_change(
    http: httpx.Client, identity: str, fields: dict[str, Any], *, timeout: float,
    child_file: Callable[[str], Path] | None = None,
) -> Timed:  # fmt: skip
    """Seconds from the PUT until ``identity`` is listed, in its child's SD answer, and in what
    that child reads (``child_file(child)`` with file_sd; None: the SD answer is what it reads)."""
    started = time.perf_counter()
    answer = http.put(f"/v1/registry/targets/{quote(identity, safe='')}", json=fields)
    if answer.status_code not in (200, 201):
        raise LiveBenchError(f"PUT {identity} answered {answer.status_code}: {answer.text[:300]}")
    deadline = started + timeout
    child: str | None = None
    listed = sd = read = None
    needle = f'"{identity}"'.encode()
    while time.perf_counter() < deadline and (sd is None or read is None):
        if child is None:
            row = http.get(f"/v1/targets/{quote(identity, safe='')}")
            if row.status_code == 200 and row.json().get("children"):
                child = str(row.json()["children"][0])
                listed = time.perf_counter() - started
        if child is not None and sd is None:
            answer = http.get(f"/v1/sd/{child}")
            if answer.status_code == 200 and needle in answer.content:
                sd = time.perf_counter() - started
        if child is not None and read is None and child_file is not None:
            try:
                found = needle in child_file(child).read_bytes()
            except FileNotFoundError:
                found = False
            if found:
                read = time.perf_counter() - started
        if child_file is None:
            read = sd
        if sd is None or read is None:
            time.sleep(POLL_S)
    return Timed(listed=listed, sd=sd, served=read)


def run_changes(
    http: httpx.Client, *, changes: int, rate: float, timeout: float, regions: tuple[str, ...] = REGIONS,
    child_file: Callable[[str], Path] | None = None,
) -> list[Timed]:  # fmt: skip
    """Change i is due at i/rate (open loop); each is timed in its own thread."""
    results: list[Timed] = [Timed(None, None, None)] * changes
    errors: list[BaseException] = []

    def one(i: int) -> None:
        identity, fields = registration(i, prefix="10.250", node="live", regions=regions)
        try:
            results[i] = time_change(http, identity, fields, timeout=timeout, child_file=child_file)
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


def summarize(timed: list[Timed], *, timeout: float) -> dict[str, Any]:
    """Percentiles of each measured time; a miss counts as the timeout."""
    out: dict[str, Any] = {}
    for name, key in (("change_to_served", "sd"), ("served", "served"), ("listed", "listed")):
        values = [getattr(t, key) for t in timed]
        counted = [timeout if v is None else v for v in values]
        out[f"{name}_p50_s"] = round(percentile(counted, 50), 4)
        out[f"{name}_p99_s"] = round(percentile(counted, 99), 4)
        out[f"{name}_max_s"] = round(max(counted), 4)
    sd = [t.sd for t in timed if t.sd is not None]
    out["change_to_served_mean_s"] = round(statistics.fmean(sd), 4) if sd else None
    out["changes_missed"] = len(timed) - len(sd)
    out["served_missed"] = sum(1 for t in timed if t.served is None)
    out["change_to_served_s"] = [None if t.sd is None else round(t.sd, 3) for t in timed]
    out["served_s"] = [None if t.served is None else round(t.served, 3) for t in timed]
    return out


def run_live_bench(
    *, targets: int, changes: int, rate: float, via: str = "file", debounce_s: float = 1.0,
    batch: int = 20_000, change_timeout_s: float = 60.0, ready_timeout_s: float = 900.0,
    inventory_format: str = "yaml", spec: Path | str | None = None, store: str = "sqlite",
    discovery: str | None = None, targets_per_shard: int | None = None, rss_after_changes: int | None = None,
    max_shards_per_region: int | None = None, anchors: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """One size: the figures the module docstring names. ``rss_after_changes`` (at least
    ``changes``; None: ``changes``); ``max_shards_per_region`` (None: one that fits)."""
    rss_after = changes if rss_after_changes is None else rss_after_changes
    if rss_after < changes:
        raise ValueError(f"rss_after_changes: expected at least changes ({changes}), got {rss_after}")
    if via not in ("file", "registry"):
        raise ValueError(f"via: expected 'file' or 'registry', got {via!r}")
    if not 2 <= targets <= MAX_TARGETS:
        raise ValueError(f"targets: expected 2..{MAX_TARGETS}, got {targets}")
    nodes = math.ceil(targets / 2)  # each node runs a gpu and a node exporter
    shards = max(1, round(targets / len(REGIONS) / TARGETS_PER_SHARD))
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-live-") as tmp:
        workdir = Path(tmp)
        try:
            shape = shape_spec(workdir, spec=spec, discovery=discovery, targets_per_shard=targets_per_shard,
                               builtin_regions=dict.fromkeys(REGIONS, shards))  # fmt: skip
        except ShapeError as exc:
            raise LiveBenchError(str(exc)) from exc
        regions = shape.regions
        _, inventory = write_fleet(workdir, nodes=nodes, regions=dict.fromkeys(regions, 1),
                                   inventory_format=inventory_format)  # fmt: skip
        expected = 2 * nodes
        entries: list[tuple[str, dict[str, Any]]] = []
        if via == "registry":
            entries = [_node_entry(i, job, regions) for i in range(nodes) for job in ("gpu", "node")]
        followed = inventory if via == "file" else None
        # the fleet is spread over every region (write_fleet), fixed ones included
        cap = max_shards_per_region or shard_cap(expected, len(regions), shape.targets_per_shard)
        wanted = math.ceil(expected / 2 / len(regions) / shape.targets_per_shard)
        if max_shards_per_region is None and wanted > cap:
            # a sized region past serve's cap refuses every new node: the changes would fail
            raise LiveBenchError(
                f"{expected} targets need about {wanted} shards per sized region of "
                f"{shape.targets_per_shard} nodes, past gpufed serve's --max-shards-per-region "
                f"bound ({SHIPPED_MAX_SHARDS}): pass --targets-per-shard "
                f"{math.ceil(shape.targets_per_shard * wanted * 1.25 / SHIPPED_MAX_SHARDS)} or more"
            )
        standin = start_store(store, workdir)
        serve = ServeProcess(workdir, spec=shape.spec, inventory=followed, debounce_s=debounce_s,
                             store=standin, extra_args=("--max-shards-per-region", str(cap)))  # fmt: skip
        http = httpx.Client(base_url=serve.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"},
                            limits=httpx.Limits(max_connections=64))  # fmt: skip
        result: dict[str, Any] = {
            "targets": expected, "via": via, "changes": changes, "rate_per_s": rate, "debounce_s": debounce_s,
            "inventory_format": inventory_format if via == "file" else None,
            "spec": "builtin" if spec == BUILTIN else str(spec or "examples/federation.yaml"),
            "store": store, "discovery": shape.discovery, "max_shards_per_region": cap,
            "rss_after_changes": rss_after,
        }  # fmt: skip
        child_file = (lambda child: serve.child_file(child, "gpu")) if shape.discovery == "file_sd" else None
        try:
            if via == "registry":
                wait_until(lambda: _up(http, serve), timeout=ready_timeout_s, what="/healthz", interval=0.2)
                result["preregistered_with"] = preregister(http, entries)
            # settle first, with nothing but /readyz and /metrics asked (counting every
            # child's SD answer is the bench's own load: thousands of GETs at 300k)
            said = wait_said_ready(http, serve, timeout=ready_timeout_s, files=child_file is not None)
            settled = wait_settled(http, serve, timeout=ready_timeout_s)
            result["rss_mib_settled"] = round(process_figures(http).rss_mib, 1)
            ready = said if served_count(http) >= expected else wait_served(
                http, serve, expected=expected, timeout=ready_timeout_s, files=child_file is not None)
            result["ready_s"] = round(ready - serve.started, 3)
            result["settle_s"] = round(max(settled, ready) - serve.started, 3)
            rows = http.get("/v1/shards").json()["shards"]
            result["shards"] = len(rows)
            result["children"] = sum(len(row["children"]) for row in rows)
            before_cpu, _ = phase_cpu_s(http, serve, ending=False)
            wall_started = time.monotonic()
            timed = run_changes(http, changes=changes, rate=rate, timeout=change_timeout_s, regions=regions,
                                child_file=child_file)  # fmt: skip
            wall = time.monotonic() - wall_started
            after_cpu, after = phase_cpu_s(http, serve, ending=True)
            result.update(summarize(timed, timeout=change_timeout_s))
            result.update(
                controller_cpu_share=round((after_cpu - before_cpu) / wall, 4),
                cpu_ms_per_change=round((after_cpu - before_cpu) * 1000 / changes, 2),
                cpu_from="proc" if proc_cpu_s(serve.proc.pid) is not None else "metrics",
                rss_mib=round(after.rss_mib, 1),
                load_average_changes=[round(x, 2) for x in os.getloadavg()],
            )
            place_more(http, first=changes, count=rss_after - changes, rate=rate, regions=regions,
                       timeout=change_timeout_s)  # fmt: skip
            result["rss_mib_after_changes"] = round(process_figures(http).rss_mib, 1)
            batch_entries = [registration(i, prefix="10.240", node="batch", regions=regions)
                             for i in range(batch)]  # fmt: skip
            seconds, error = post_batch(http, batch_entries) if batch else (None, "skipped (--batch 0)")
            result.update(registry_batch_entries=batch, registry_batch_chunk=BATCH_CHUNK)
            result["registry_batch_per_s"] = round(batch / seconds, 1) if seconds else None
            if error is not None:
                result["registry_batch_error"] = error
        finally:
            http.close()
            serve.stop()
            standin.stop()
        if anchors:
            result.update(engine_anchors(shape.spec, inventory))
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return result


def _up(http: httpx.Client, serve: ServeProcess) -> bool:
    """Serving HTTP (with no target yet there is no assignment, so /readyz says 503)."""
    serve.check_alive()
    return http.get("/healthz").status_code == 200


def _node_entry(i: int, job: str, regions: tuple[str, ...] = REGIONS) -> tuple[str, dict[str, Any]]:
    """Target ``job`` of node ``i`` exactly as ``write_fleet``'s inventory describes it."""
    address = f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}"
    port = 9400 if job == "gpu" else 9100
    body = {"address": address, "port": port, "job": job, "node": f"gpu-{i:05d}",
            "region": regions[i % len(regions)], "gpus": 8 if i % 4 else 4}  # fmt: skip
    return f"{address}:{port}", body


def run_live_sweep(
    *, sizes: list[int], emit: Callable[[dict[str, Any]], None], **options: Any
) -> dict[str, Any]:
    """:func:`run_live_bench` at each of ``sizes`` (targets) in turn, ``emit`` called with each
    row as it is done; the answer compares each size's per-change figures with the smallest's."""
    rows = []
    for size in sizes:
        row = {"size": size, **run_live_bench(targets=size, **options)}
        emit(row)
        rows.append(row)
    base = rows[0]

    def ratio(row: dict[str, Any], key: str) -> float | None:
        a, b = row.get(key), base.get(key)
        return round(a / b, 3) if isinstance(a, int | float) and isinstance(b, int | float) and b else None

    keys = ("cpu_ms_per_change", "change_to_served_p99_s", "served_p99_s", "rss_mib_after_changes",
            "ready_s", "settle_s", "shards")  # fmt: skip
    return {
        "sizes": sizes,
        **{key: {str(r["size"]): r.get(key) for r in rows} for key in keys},
        "cpu_ms_per_change_ratio": {str(r["size"]): ratio(r, "cpu_ms_per_change") for r in rows},
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
