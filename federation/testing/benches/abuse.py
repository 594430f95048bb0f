"""``gpufed bench sd --abuse N``: HTTP SD while N clients without a token loop on list reads.

The controller serves ``targets`` registrations (all through the built-in registry, so its
listing is as long as the fleet) on ``shards`` shards. The load generator (this process)
runs the SD load of ``gpufed bench sd`` (pollers once a second, clients back to back) and,
at the same time, N hostile clients that ignore ``Retry-After`` and loop without a token:

* ``readyz``: the N clients loop on ``/readyz``, the floor (any request costs this much);
* ``lists``: the N clients loop over every list read an attacker would pick: the biggest
  page, the last row (``offset=<end>``), a query that matches nothing, the registry
  listing (first and last page), the audit, the shards and the hand-overs.

``--abuse-route`` picks another hostile load instead of ``lists`` (issue 38):

* ``status``: ``/v1/status`` back to back (it counts every source's targets);
* ``target-list``: the largest published file_sd target list (``/v1/configs/<path>``);
* ``xff``: ``/v1/targets`` with a new ``X-Forwarded-For`` on every request (a client
  that would get a fresh budget per request if the header were believed).

The two take turns, ``rounds`` times each, so a neighbour's burst lands on both. The figure
is the SD p99 under ``lists`` over the SD p99 under ``readyz`` (the goal: at most 2).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from federation.localrun.loopback import listening_socket
from federation.testing.benches.controller import _build, _summary, _targets, answering, serve

BATCH = 20_000


async def _get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, *, forwarded: str | None
) -> int:
    """One GET on a kept-alive connection; ``forwarded``: an ``X-Forwarded-For`` to claim."""
    extra = f"X-Forwarded-For: {forwarded}\r\n" if forwarded else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n{extra}\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status


ROUTES = ("lists", "status", "target-list", "xff")


def _serve(
    directory: str, targets: int, shards: int, ready: Any, read_rate: float | None, route: str = "lists"
) -> None:
    from sharder.sources.lastknown import target_document

    sock = listening_socket()
    port = sock.getsockname()[1]
    registered = route == "lists"  # the registry listing is one of the list reads; else a plain source
    service = _build(
        Path(directory),
        targets=0 if registered else targets,
        shards=shards,
        port=port,
        read_rate=read_rate,
        target_discovery="file_sd" if route == "target-list" else "http_sd",  # lists are published
    )
    controller = service.controller
    listed = _targets(targets if registered else 0)
    documents = [{**target_document(t), "identity": t.identity} for t in listed]
    for start in range(0, len(documents), BATCH):
        registry = controller.registry
        registry.apply_batch(registry.check_batch(documents[start : start + BATCH], []))
    with controller._lock:
        controller.reconciler.tick()
    controller.publication.publish_configs()  # the bundle and its file_sd lists, as the config loop would
    files = controller.publisher.files if controller.publisher is not None else {}
    lists = sorted((len(body), path) for path, body in files.items() if "/targets/" in path)
    largest = lists[-1][1] if lists else None
    placed = len(controller.state.assignment.targets) if controller.state.assignment else 0
    ready.put((port, placed, largest))
    serve(service.app, sock)


def list_paths(targets: int) -> list[str]:
    end = max(0, targets - 1)
    return [
        "/v1/targets?limit=1000",
        f"/v1/targets?limit=1&offset={end}",
        "/v1/targets?q=nomatch&limit=1000",
        "/v1/registry/targets",
        f"/v1/registry/targets?offset={end}&limit=1",
        "/v1/audit?limit=1000",
        "/v1/shards",
        "/v1/handovers",
    ]


async def _phase(
    port: int,
    children: list[str],
    *,
    abusers: int,
    abuse_paths: list[str],
    pollers: int,
    clients: int,
    duration_s: float,
    rotate_xff: bool = False,
) -> dict[str, Any]:
    latencies: list[float] = []
    codes: dict[str, int] = {}
    errors = 0
    end = time.perf_counter() + duration_s

    async def loop(index: int, *, paths: list[str] | None, polling: bool) -> None:
        nonlocal errors
        rng = random.Random(index)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent = 0
        forwarded: str | None = None
        try:
            while time.perf_counter() < end:
                if paths is not None:
                    path = paths[index % len(paths)] if len(paths) == 1 else rng.choice(paths)
                    if rotate_xff:
                        sent += 1
                        forwarded = f"10.{index % 256}.{sent // 256 % 256}.{sent % 256}"
                else:
                    child = children[index % len(children)] if polling else rng.choice(children)
                    path = f"/v1/sd/{child}"
                started = time.perf_counter()
                try:
                    status = await _get(reader, writer, path, forwarded=forwarded)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    errors += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    continue
                if paths is not None:
                    codes[str(status)] = codes.get(str(status), 0) + 1
                    continue
                latencies.append(time.perf_counter() - started)
                errors += status != 200
                if polling:
                    await asyncio.sleep(1.0)
        finally:
            writer.close()

    await asyncio.gather(
        *(loop(i, paths=None, polling=True) for i in range(pollers)),
        *(loop(pollers + i, paths=None, polling=False) for i in range(clients)),
        *(loop(10_000 + i, paths=abuse_paths, polling=False) for i in range(abusers)),
    )
    return {"latencies": latencies, "errors": errors, "abuse_codes": codes}


def run_abuse_bench(
    *,
    targets: int,
    shards: int,
    abusers: int,
    pollers: int = 100,
    clients: int = 20,
    duration_s: float = 10.0,
    rounds: int = 4,
    read_rate: float | None = None,
    route: str = "lists",
) -> dict[str, Any]:
    """``read_rate``: the controller's ``--read-rate`` (None: its default; 0: no budget, so
    only the paging index stands between the abusers and HTTP SD); ``route``: one of
    :data:`ROUTES`, what the hostile clients loop on (the ``/readyz`` anchor runs in the
    same rounds either way)."""
    if route not in ROUTES:
        raise ValueError(f"route: one of {', '.join(ROUTES)}, got {route!r}")
    ctx = multiprocessing.get_context("spawn")
    children = [f"r1-{i}" for i in range(shards)]
    modes: dict[str, list[str]] = {"readyz": ["/readyz"], "lists": []}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-abuse-") as tmp:
        ready: Any = ctx.Queue()
        server = ctx.Process(target=_serve, args=(tmp, targets, shards, ready, read_rate, route), daemon=True)
        server.start()
        try:
            port, placed, largest = ready.get(timeout=600)
            answering(port, "/healthz")
            modes["lists"] = {
                "lists": list_paths(targets),
                "status": ["/v1/status"],
                "target-list": [f"/v1/configs/{largest}"],
                "xff": ["/v1/targets?limit=1000"],
            }[route]
            for _ in range(rounds):
                for name, paths in modes.items():
                    runs[name].append(
                        asyncio.run(
                            _phase(
                                port,
                                children,
                                abusers=abusers,
                                abuse_paths=paths,
                                pollers=pollers,
                                clients=clients,
                                duration_s=duration_s / rounds,
                                rotate_xff=route == "xff" and name == "lists",
                            )
                        )
                    )
        finally:
            server.kill()
            server.join()
    out: dict[str, Any] = {
        "targets": targets,
        "placed": placed,
        "shards": shards,
        "abusers": abusers,
        "pollers": pollers,
        "clients": clients,
        "duration_s": duration_s,
        "rounds": rounds,
        "read_rate": read_rate,
        "route": route,
        "abuse_paths": modes["lists"],
        "cpus": os.cpu_count(),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    for name in modes:
        summary = _summary(runs[name], duration_s=duration_s)
        codes: dict[str, int] = {}
        for run in runs[name]:
            for code, n in run["abuse_codes"].items():
                codes[code] = codes.get(code, 0) + n
        out[name] = {**summary, "abuse_responses": dict(sorted(codes.items()))}
    floor = out["readyz"]["p99_ms"]
    out["sd_p99_over_readyz"] = round(out["lists"]["p99_ms"] / floor, 3) if floor else None
    return out
