"""`gpufed-exporter bench fleet`: a Prometheus-like scrape load on a fleet process.

What is measured, honestly: `gpufed-exporter fleet` runs as its own process (the real
CLI, so the server's GIL is not shared with the client), and `concurrency` scrapers in
this process each keep one HTTP/1.1 connection and scrape a random node, back to back,
until `scrapes` responses have arrived (a closed loop: the server's queue is at most
`concurrency` deep, as with a Prometheus fleet whose scrapes overlap). Latency is the
client's wall time from sending a request (connecting first, with `keep_alive` off) to
holding the whole body; a request unanswered after 30 s counts with its 30 s (and as an
error). With `cache` on (the shipped default) a node's exposition is
rendered at most once per collection; at this load each node is scraped several times
per collection interval, so most scrapes reuse it. `cache` off renders every scrape,
the worst case (in production each node is scraped once per interval, so it renders
about once per scrape, but at a rate far below this closed loop's). Server CPU is read
by client_python's ProcessCollector for the child.
Both processes share this machine's cores, so the client's own CPU is reported too.
With `rate` the load is an open loop instead: scrape i is due at i / rate seconds (as
Prometheus scrapes on a schedule) and its latency counts from when it was due.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip as gzip_module
import http.client
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

from exporter.errors import ConfigError
from exporter.settings import parse_listen
from exporter.testing.process import process_figures

TARGET_P99_MS = 100.0
READY_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 30.0
_SERVING = re.compile(rb"fleet serving nodes=\d+ port=(\d+)")


def _proc_cpu_seconds(pid: int) -> float | None:
    figures = process_figures(pid)
    return None if figures is None else figures.cpu_s


def _proc_rss_mib(pid: int) -> float | None:
    figures = process_figures(pid)
    return None if figures is None else figures.rss_mib


def _get(host: str, port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class _Fleet:
    """``gpufed-exporter fleet --listen 127.0.0.1:0`` as a child: its port is the one its
    ``fleet serving ... port=N`` log line names (after the first collection, so it is ready);
    no port is chosen before the child binds it. Killed if it does not serve within
    ``READY_TIMEOUT_S``; its stderr is drained in a thread, the tail kept for errors."""

    def __init__(self, *, nodes: int, gpus: int, cache: bool) -> None:
        env = {**os.environ, "GPUFED_EXPORTER_RENDER_CACHE": "true" if cache else "false",
               "GPUFED_EXPORTER_LOG_LEVEL": "INFO"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "fleet", "--nodes", str(nodes), "--gpus", str(gpus),
             "--listen", "127.0.0.1:0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.tail: deque[bytes] = deque(maxlen=20)
        assert self.proc.stderr is not None
        stderr = self.proc.stderr
        watchdog = threading.Timer(READY_TIMEOUT_S, self.proc.kill)
        watchdog.start()
        try:
            port = next((int(found[1]) for line in stderr if (found := _SERVING.search(self._keep(line)))),
                        None)
        finally:
            watchdog.cancel()
        self._drain = threading.Thread(target=lambda: self.tail.extend(stderr), daemon=True)
        self._drain.start()
        if port is None:
            self.stop()
            err = b"".join(self.tail).decode(errors="replace").strip()
            raise ConfigError(f"fleet process exited with {self.proc.returncode} before serving "
                              f"(or took over {READY_TIMEOUT_S:g}s): {err[-300:]}")
        self.port: int = port

    def _keep(self, line: bytes) -> bytes:
        self.tail.append(line)
        return line

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._drain.join(timeout=10)  # EOF once the child is gone
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def _check_ready(host: str, port: int) -> None:
    try:
        status = _get(host, port, "/readyz")[0]
    except OSError as exc:
        raise ConfigError(f"--target {host}:{port}: cannot reach it ({exc})") from exc
    if status != 200:
        raise ConfigError(f"--target {host}:{port}: /readyz answered {status}; start the fleet first")


class _Load:
    """Shared state of the scrapers: what to scrape next, and what came back."""

    def __init__(self, paths: list[str], *, total: int, warmup: int, gzip: bool, host: str, port: int,
                 keep_alive: bool, rate: float | None = None) -> None:
        self.paths, self.total, self.warmup, self.keep_alive = paths, total, warmup, keep_alive
        self.rate = rate
        self.start = 0.0
        self.host, self.port = host, port
        self.started = 0
        self.latencies: list[float] = []
        self.wire_bytes = 0
        self.errors: dict[str, int] = {}
        self.statuses: dict[int, int] = {}
        self.encoding = b"Accept-Encoding: gzip\r\n" if gzip else b""

    def next_path(self) -> tuple[int, str] | None:
        if self.started >= self.total + self.warmup:
            return None
        index = self.started
        self.started += 1
        return index, self.paths[index % len(self.paths)]

    def request(self, path: str) -> bytes:
        close = b"" if self.keep_alive else b"Connection: close\r\n"
        return (f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nUser-Agent: gpufed-bench\r\n"
                "Accept: text/plain;version=0.0.4\r\n").encode() + self.encoding + close + b"\r\n"


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, int]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = next((int(line.split(b":", 1)[1]) for line in lines[1:]
                   if line.lower().startswith(b"content-length:")), 0)
    await reader.readexactly(length)
    return status, length


async def _scraper(load: _Load) -> None:
    writer: asyncio.StreamWriter | None = None
    try:
        while (job := load.next_path()) is not None:
            index, path = job
            if load.rate:
                # Open loop: scrape i is due at start + i / rate, and its latency counts from
                # then, so a server that falls behind cannot hide its queue (no coordinated omission).
                due = load.start + index / load.rate
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            try:
                t0 = time.perf_counter()  # a new connection's set-up counts, as it does for Prometheus
                if load.rate:
                    t0 = min(t0, load.start + index / load.rate)
                if writer is None:
                    reader, writer = await asyncio.open_connection(load.host, load.port)
                writer.write(load.request(path))
                status, length = await asyncio.wait_for(_read_response(reader), REQUEST_TIMEOUT_S)
                elapsed = time.perf_counter() - t0
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
                load.errors[type(exc).__name__] = load.errors.get(type(exc).__name__, 0) + 1
                if isinstance(exc, TimeoutError) and index >= load.warmup:
                    # A scrape that never came back counts at least as its timeout, so a
                    # server that starves some connections cannot look fast.
                    load.latencies.append(time.perf_counter() - t0)
                if writer is not None:
                    writer.close()
                writer = None
                continue
            if not load.keep_alive:
                writer.close()
                writer = None
            if index >= load.warmup:
                load.latencies.append(elapsed)
                load.wire_bytes += length
                load.statuses[status] = load.statuses.get(status, 0) + 1
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _check_gzip(host: str, port: int, path: str) -> bool:
    """The server answers `Accept-Encoding: gzip` with a gzip body that is the exposition."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path, headers={"Accept-Encoding": "gzip"})
        response = conn.getresponse()
        body = response.read()
        if response.getheader("Content-Encoding") != "gzip":
            return False
        return b"DCGM_FI_DEV_GPU_UTIL" in gzip_module.decompress(body)
    finally:
        conn.close()


def run_fleet_load(*, nodes: int = 2000, concurrency: int = 64, scrapes: int = 20000, gpus: int = 8,
                   gzip: bool = True, cache: bool = True, keep_alive: bool = True, target: str | None = None,
                   rate: float | None = None, seed: int = 0) -> dict[str, Any]:
    """Start (or use `target`) a fleet, load it, stop it; the figures as a JSON-ready dict."""
    fleet: _Fleet | None = None
    if target is None:
        fleet = _Fleet(nodes=nodes, gpus=gpus, cache=cache)
        host, port = "127.0.0.1", fleet.port
        child = fleet.proc
    else:
        try:
            host, port = parse_listen(target)
        except ValueError as exc:
            raise ConfigError(f"--target: {exc}") from exc
        host = "127.0.0.1" if host == "0.0.0.0" else host
        child = None
    try:
        if fleet is None:
            _check_ready(host, port)
        names = _get(host, port, "/nodes")[1].decode().split()
        if not names:
            raise ConfigError(f"{host}:{port}/nodes lists no nodes")
        rng = random.Random(seed)
        warmup = min(scrapes, 2 * concurrency)
        paths = [f"/nodes/{rng.choice(names)}/metrics" for _ in range(scrapes + warmup)]
        gzip_ok = _check_gzip(host, port, paths[0]) if gzip else None
        load = _Load(paths, total=scrapes, warmup=warmup, gzip=gzip, host=host, port=port,
                     keep_alive=keep_alive, rate=rate)
        cpu0 = _proc_cpu_seconds(child.pid) if child else None
        client0, wall0, load0 = time.process_time(), time.perf_counter(), os.getloadavg()[0]

        async def run() -> None:
            load.start = time.perf_counter()
            await asyncio.gather(*(_scraper(load) for _ in range(concurrency)))

        asyncio.run(run())
        wall = time.perf_counter() - wall0
        client_cpu = time.process_time() - client0
        cpu1 = _proc_cpu_seconds(child.pid) if child else None
        rss = _proc_rss_mib(child.pid) if child else None
    finally:
        if fleet is not None:
            fleet.stop()
    done = len(load.latencies)
    if not done:
        raise ConfigError(f"no scrape succeeded; errors: {load.errors}")
    p99 = _percentile(load.latencies, 0.99) * 1000
    server_cpu = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / done * 1000
    return {
        "nodes": len(names), "gpus_per_node": gpus, "concurrency": concurrency, "scrapes": done,
        "errors": load.errors, "statuses": {str(k): v for k, v in sorted(load.statuses.items())},
        "gzip": gzip, "gzip_verified": gzip_ok, "render_cache": None if target else cache,
        "keep_alive": keep_alive, "rate_per_s": rate,
        "p50_ms": round(statistics.median(load.latencies) * 1000, 2),
        "p90_ms": round(_percentile(load.latencies, 0.90) * 1000, 2),
        "p99_ms": round(p99, 2), "max_ms": round(max(load.latencies) * 1000, 2),
        "scrapes_per_s": round(done / wall, 1), "wall_s": round(wall, 2),
        "mean_body_bytes": round(load.wire_bytes / done),
        "server_cpu_ms_per_scrape": None if server_cpu is None else round(server_cpu, 3),
        "client_cpu_ms_per_scrape": round(client_cpu / done * 1000, 3),
        "server_rss_mib": None if rss is None else round(rss, 1),
        "target_p99_ms": TARGET_P99_MS, "p99_over_target": round(p99 / TARGET_P99_MS, 3),
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_at_start": round(load0, 2)},
        "server": "external " + target if target else "gpufed-exporter fleet (child process)",
    }
