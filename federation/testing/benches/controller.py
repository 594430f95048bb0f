"""``gpufed bench sd`` and ``gpufed bench rebalance``: the controller under load, with anchors.

**SD.** The controller serves 10,000 targets on 100 shards from its own process; the
load generator (this process) runs 100 "children" polling their own ``/v1/sd/{child}``
once a second plus 200 clients asking for random children back to back, all over
keep-alive HTTP/1.1 on raw asyncio streams (a light client, so the server is what is
measured). The anchor, in the same run, is the same uvicorn serving one constant bytes
object of the mean answer size under the same load: the *floor* of any Python server
here. The figure is p99 / floor p99. With ``tls`` a second controller, served as ``gpufed
serve --web.config.file`` serves it (TLS 1.3, client certificates required, a private CA made
for the run by ``webconfig.testing``), takes its turns beside the plain one, and the load
connects with a client certificate; each connection is kept alive, as Prometheus's HTTP SD
keeps it, so the handshake is paid once per connection.

**Rebalance.** One shard added to a region of 10,000 targets: time to plan, to apply,
and from the apply request to the first HTTP SD answer that lists the new shard's
targets (served by a live uvicorn), against the optimum of targets/(S+1) moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import random
import socket
import ssl
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from federation.localrun.loopback import listening_socket
from federation.localrun.waiting import wait_until
from federation.testing.harnesses.app_server import AppServer

MAX_TARGETS = 200_000


def _spec_file(directory: Path, *, shards: int, port: int, target_discovery: str = "http_sd") -> Path:
    path = directory / "spec.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "cluster": "bench",
                "regions": [{"name": "r1", "shards": shards}],
                "jobs": [{"name": "gpu", "scrape_interval": "15s"}],
                "children": {
                    "target_discovery": target_discovery,
                    "http_sd_url": f"http://127.0.0.1:{port}",
                    "http_sd_refresh_interval": "5s",
                },
            }
        )
    )
    return path


def _targets(count: int) -> list[Any]:
    from sharder.model.inventory import Target

    rng = random.Random(0)
    return [
        Target(
            address=f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}",
            port=9400,
            job="gpu",
            node=f"gpu-{i:06d}",
            region="r1",
            gpus=rng.choice((4, 8)),
            rack=f"rack-{i % 40:02d}",
        )
        for i in range(count)
    ]


def _build(
    directory: Path,
    *,
    targets: int,
    shards: int,
    port: int,
    read_rate: float | None = None,
    target_discovery: str = "http_sd",
) -> Any:
    from federation.controller.base.options import ControllerOptions
    from federation.controller.http.service import ServeSettings, build_service
    from federation.spec import load_gpufed_spec

    spec_file = _spec_file(directory, shards=shards, port=port, target_discovery=target_discovery)
    spec = load_gpufed_spec(spec_file)
    service = build_service(
        ServeSettings(
            spec=spec,
            data_dir=directory / "data",
            check_configs=False,
            dev=True,
            env={},
            options=ControllerOptions(
                debounce_s=0.0,
                grace_s=0.0,
                read_rate=ControllerOptions.read_rate if read_rate is None else read_rate,
            ),
        )
    )
    service.controller.restore()
    service.controller.reconciler.on_change("bench", _targets(targets))
    with service.controller._lock:
        service.controller.tick(idle=False)
    return service


def serve(app: Any, sock: socket.socket, *, web_config: Path | None = None) -> None:
    """uvicorn on a socket bound before the app was built (its port is in the app's spec);
    with ``web_config``, behind it as ``gpufed serve --web.config.file`` is."""
    import uvicorn

    from webconfig.serving import for_uvicorn, load_web_config

    served = load_web_config(web_config)
    config = uvicorn.Config(served.wrap(app), log_level="error", access_log=False,
                            proxy_headers=False)  # as `serve`
    for_uvicorn(config, served)
    uvicorn.Server(config).run(sockets=[sock])


def answering(port: int, path: str, *, timeout: float = 60.0, context: ssl.SSLContext | None = None) -> None:
    """Until the server on ``port`` answers ``path`` (bound is not yet serving)."""
    import httpx

    url = f"{'https' if context else 'http'}://127.0.0.1:{port}{path}"
    wait_until(lambda: httpx.get(url, timeout=5, verify=context or True).status_code == 200,
               timeout=timeout, what=url, interval=0.1)


def _serve_controller(directory: str, targets: int, shards: int, ready: Any,
                      web_config: str | None = None) -> None:
    sock = listening_socket()
    port = sock.getsockname()[1]
    service = _build(Path(directory), targets=targets, shards=shards, port=port)
    sd = service.controller.publication.sd
    sizes = [len(sd.answer(s) or b"") for s in service.controller.state.assignment.shards]
    ready.put((port, int(statistics.mean(sizes))))
    serve(service.app, sock, web_config=Path(web_config) if web_config else None)


def _serve_floor(size: int, ready: Any) -> None:
    from fastapi import FastAPI
    from fastapi.responses import Response

    sock = listening_socket()
    body = b"[" + b" " * max(0, size - 2) + b"]"
    app = FastAPI()

    @app.get("/v1/sd/{child}")
    async def constant(child: str) -> Response:
        return Response(body, media_type="application/json")

    ready.put((sock.getsockname()[1], size))
    serve(app, sock)


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> int:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status


async def _load(
    port: int, children: list[str], *, pollers: int, clients: int, duration_s: float, poll_interval_s: float,
    context: ssl.SSLContext | None = None, cpu: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Every worker connects first; the clock starts when all are connected (``connect_s``
    later), so a burst of TLS handshakes is not measured as SD latency. ``cpu`` reads the
    server's CPU seconds, at the start of the clock and at its end."""
    latencies: list[float] = []
    errors = opened = 0
    started_at = time.perf_counter()
    end = started_at + duration_s
    connect_s = cpu_at_start = 0.0
    go = asyncio.Event()

    async def worker(index: int, polling: bool) -> None:
        nonlocal errors, opened, end, connect_s, cpu_at_start
        rng = random.Random(index)
        tls: dict[str, Any] = {"ssl": context, "server_hostname": "localhost"} if context else {}
        reader, writer = await asyncio.open_connection("127.0.0.1", port, **tls)
        opened += 1
        if opened == pollers + clients:
            connect_s = time.perf_counter() - started_at
            cpu_at_start = cpu() if cpu else 0.0
            end = time.perf_counter() + duration_s
            go.set()
        await go.wait()
        try:
            while time.perf_counter() < end:
                child = children[index % len(children)] if polling else rng.choice(children)
                started = time.perf_counter()
                try:
                    status = await _get(reader, writer, f"/v1/sd/{child}")
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    errors += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", port, **tls)
                    continue
                latencies.append(time.perf_counter() - started)
                errors += status != 200
                if polling:
                    await asyncio.sleep(poll_interval_s)
        finally:
            writer.close()
            # A TLS transport closes after its close_notify exchange: wait for it, or the loop
            # ends with the socket still open (ResourceWarning).
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 5)

    await asyncio.gather(
        *(worker(i, True) for i in range(pollers)), *(worker(pollers + i, False) for i in range(clients))
    )
    served_cpu = cpu() - cpu_at_start if cpu else 0.0
    return {"latencies": latencies, "errors": errors, "connect_s": connect_s, "server_cpu_s": served_cpu}


def _summary(runs: list[dict[str, Any]], *, duration_s: float) -> dict[str, Any]:
    latencies = sorted(x for run in runs for x in run["latencies"])

    def q(p: float) -> float:
        return (
            round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2) if latencies else 0.0
        )

    out = {
        "requests": len(latencies),
        "errors": sum(run["errors"] for run in runs),
        "p50_ms": q(0.50),
        "p99_ms": q(0.99),
        "rps": round(len(latencies) / duration_s),
    }
    connects = [run["connect_s"] for run in runs if "connect_s" in run]
    if connects:  # the slowest round's time to open every connection (handshakes included)
        out["connect_s"] = round(max(connects), 3)
        cpu_s = sum(run["server_cpu_s"] for run in runs)
        out["server_cpu_ms_per_request"] = round(cpu_s / len(latencies) * 1000, 4) if latencies else None
    return out


def _cpu_seconds(pid: int) -> Callable[[], float]:
    """The server process's CPU seconds, as client_python's ``ProcessCollector`` reads them."""
    from prometheus_client import ProcessCollector

    collector = ProcessCollector(pid=lambda: pid, registry=None)

    def read() -> float:
        return next((s.value for family in collector.collect() for s in family.samples
                     if s.name == "process_cpu_seconds_total"), 0.0)

    return read


def _tls_files(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A private CA, the controller's web config (client certificates required) and the
    load's client context."""
    from webconfig.testing import Pki

    pki = Pki(folder)
    client = pki.client()
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    context.load_cert_chain(str(client.cert), str(client.key))
    return pki.web_config(folder / "web.yml", server=pki.server()), context


def run_sd_bench(
    *,
    targets: int,
    shards: int,
    pollers: int = 100,
    clients: int = 200,
    duration_s: float = 10.0,
    rounds: int = 4,
    tls: bool = False,
) -> dict[str, Any]:
    """The servers run at once and take turns under the same load, ``rounds`` times each, so a
    neighbour's burst on this machine lands on all rather than on whichever ran last."""
    ctx = multiprocessing.get_context("spawn")
    children = [f"r1-{i}" for i in range(shards)]
    names = ("controller", "tls", "floor") if tls else ("controller", "floor")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-sd-") as tmp:
        web, context = _tls_files(Path(tmp)) if tls else (None, None)
        ready: Any = ctx.Queue()
        processes: list[Any] = []
        ports: dict[str, int] = {}
        cpus: dict[str, Callable[[], float]] = {}
        size = 0
        try:
            for name in names:
                if name == "floor":
                    process = ctx.Process(target=_serve_floor, args=(size, ready), daemon=True)
                else:
                    folder = Path(tmp) / name
                    folder.mkdir()
                    process = ctx.Process(target=_serve_controller, daemon=True, args=(
                        str(folder), targets, shards, ready, str(web) if name == "tls" else None))
                process.start()
                processes.append(process)
                cpus[name] = _cpu_seconds(process.pid or 0)  # started: it has a pid
                ports[name], size = ready.get(timeout=300)
                answering(ports[name], f"/v1/sd/{children[0]}", context=context if name == "tls" else None)
            for _ in range(rounds):
                for name in names:
                    runs[name].append(
                        asyncio.run(
                            _load(
                                ports[name],
                                children,
                                pollers=pollers,
                                clients=clients,
                                duration_s=duration_s / rounds,
                                poll_interval_s=1.0,
                                context=context if name == "tls" else None,
                                cpu=cpus[name],
                            )
                        )
                    )
        finally:
            for process in processes:
                process.kill()
                process.join()
    ours = _summary(runs["controller"], duration_s=duration_s)
    base = _summary(runs["floor"], duration_s=duration_s)
    out = {
        "targets": targets,
        "shards": shards,
        "pollers": pollers,
        "clients": clients,
        "duration_s": duration_s,
        "rounds": rounds,
        "answer_bytes_mean": size,
        "p50_ms": ours["p50_ms"],
        "p99_ms": ours["p99_ms"],
        "requests": ours["requests"],
        "errors": ours["errors"],
        "rps": ours["rps"],
        "connect_s": ours["connect_s"],
        "server_cpu_ms_per_request": ours["server_cpu_ms_per_request"],
        "floor_p50_ms": base["p50_ms"],
        "floor_p99_ms": base["p99_ms"],
        "floor_requests": base["requests"],
        "floor_errors": base["errors"],
        "floor_rps": base["rps"],
        "p99_over_floor": round(ours["p99_ms"] / base["p99_ms"], 3) if base["p99_ms"] else None,
        "p50_over_floor": round(ours["p50_ms"] / base["p50_ms"], 3) if base["p50_ms"] else None,
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    if tls:
        secure = _summary(runs["tls"], duration_s=duration_s)
        out |= {f"tls_{key}": value for key, value in secure.items()}
        out["tls_p99_over_plain"] = round(secure["p99_ms"] / ours["p99_ms"], 3) if ours["p99_ms"] else None
        out["tls_p50_over_plain"] = round(secure["p50_ms"] / ours["p50_ms"], 3) if ours["p50_ms"] else None
        out["tls_client_auth"] = "RequireAndVerifyClientCert"
        plain_cpu, tls_cpu = ours["server_cpu_ms_per_request"], secure["server_cpu_ms_per_request"]
        out["tls_cpu_ratio"] = round(tls_cpu / plain_cpu, 3) if plain_cpu and tls_cpu else None
    return out


def run_rebalance_bench(*, targets: int, shards: int) -> dict[str, Any]:
    import httpx

    from federation.controller.base.changing import ChangeRequest

    with tempfile.TemporaryDirectory(prefix="gpufed-bench-rebalance-") as tmp:
        sock = listening_socket()
        port = sock.getsockname()[1]
        service = _build(Path(tmp), targets=targets, shards=shards, port=port)
        controller = service.controller
        server = AppServer(service.app, sock=sock, log_level="error").start()
        try:
            answering(port, "/v1/sd/r1-0")
            new_child = f"r1-{shards}"
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                started = time.perf_counter()
                planned = controller.plan(ChangeRequest(add_shard=["r1"]))
                plan_s = time.perf_counter() - started
                applied_at = time.perf_counter()
                done = threading.Event()
                first_serve: list[float] = []

                def poll() -> None:
                    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as poller:
                        while not done.is_set():
                            response = poller.get(f"/v1/sd/{new_child}")
                            if response.status_code == 200 and response.content != b"[]":
                                first_serve.append(time.perf_counter() - applied_at)
                                return

                watcher = threading.Thread(target=poll)
                watcher.start()
                response = client.post("/v1/rebalance", json={"version": planned.version})
                apply_s = time.perf_counter() - applied_at
                watcher.join(timeout=30)
                done.set()
                body = response.json()
        finally:
            server.stop()
            service.stop()
    moved = body["counts"]["moved"]
    optimal = targets / (shards + 1)
    return {
        "targets": targets,
        "shards": shards,
        "plan_s": round(plan_s, 4),
        "apply_s": round(apply_s, 4),
        "first_serve_s": round(first_serve[0], 4) if first_serve else None,
        "end_to_end_s": round(plan_s + (first_serve[0] if first_serve else apply_s), 4),
        "moved": moved,
        "optimal_moved": round(optimal, 1),
        "moved_over_optimal": round(moved / optimal, 3),
        "planned_moved": planned.plan.counts.moved,
    }
