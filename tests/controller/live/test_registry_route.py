"""A registration's route to the SD bytes: one thread hand-off, and a region cap that holds.

The registry has no thread: the request's thread offers the change to the loop
(``Reconciler.offer``, checked and applied under its lock), and the controller's one worker
places, commits and publishes it. Back-to-back single PUTs between two steps are counted
against ``--max-shards-per-region`` with the nodes offered, not only the nodes placed.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from conftest import wait_for

from federation.controller.base.options import ControllerOptions
from federation.spec import load_gpufed_spec
from sharder.engine.sizing import Hysteresis
from tests.controller.harness import ControllerHarness, build, spec_document

IDENTITY = "10.0.0.1:9400"
BODY = {"address": "10.0.0.1", "port": 9400, "job": "gpu", "node": "n1", "region": "r1", "gpus": 8}


def record(obj: Any, name: str, threads: dict[str, set[threading.Thread]]) -> None:
    """Replace ``obj.name`` by a wrapper that notes the thread each call runs on."""
    method: Callable[..., Any] = getattr(obj, name)
    threads[name] = set()

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        threads[name].add(threading.current_thread())
        return method(*args, **kwargs)

    setattr(obj, name, wrapper)


async def put(
    harness: ControllerHarness, client: httpx.AsyncClient, identity: str, body: dict[str, Any]
) -> int:
    answer = await client.put(f"/v1/registry/targets/{identity}", json=body, headers=harness.auth())
    return answer.status_code


async def served(harness: ControllerHarness) -> bytes | None:
    """The SD bytes of the child that scrapes the target, once it is listed."""
    async with harness.client() as client:
        listed = await client.get(f"/v1/targets/{IDENTITY}", headers=harness.auth())
        if listed.status_code != 200 or not listed.json()["children"]:
            return None
        sd = await client.get(f"/v1/sd/{listed.json()['children'][0]}", headers=harness.auth())
        return sd.content if IDENTITY.encode() in sd.content else None


def test_a_registration_reaches_the_sd_bytes_with_one_thread_hand_off(tmp_path: Path) -> None:
    harness = build(tmp_path)
    controller = harness.controller
    harness.service.start()  # as ``gpufed serve`` does: restore, election, the controller's threads
    try:
        threads: dict[str, set[threading.Thread]] = {}
        record(controller.registry, "put", threads)
        record(controller.reconciler, "offer", threads)
        record(controller.reconciler, "step", threads)
        record(controller.publication, "publish", threads)

        async def register() -> int:
            async with harness.client() as client:
                return await put(harness, client, IDENTITY, BODY)

        assert asyncio.run(register()) == 201
        wait_for(lambda: asyncio.run(served(harness)), timeout=30, what="the target in its child's SD bytes")
        running = [t.name for t in threading.enumerate()]
    finally:
        harness.service.stop()
    workers = [t for t in controller._threads if t.name == "Worker.run"]
    assert len(workers) == 1
    worker = workers[0]
    (request,) = threads["put"]
    assert request is not worker
    assert threads["offer"] == {request}  # the registry hands nothing to a thread of its own
    assert threads["step"] == {worker} and threads["publish"] == {worker}
    path = set().union(*threads.values())
    assert path == {request, worker}  # one hand-off: the request's thread -> the worker
    assert not [name for name in running if "registry" in name.lower()], running
    assert all(t.name != "BuiltinRegistry.run" for t in controller._threads)


def capped(tmp_path: Path) -> ControllerHarness:
    """Region r1 sized, 2 nodes per shard, at most 3 shards: 6 nodes fit."""
    document = spec_document()
    document["regions"] = [{"name": "r1"}, {"name": "r2", "shards": 1}]
    document["sharding"]["targets_per_shard"] = 2
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(document))
    options = ControllerOptions(debounce_s=0.0, grace_s=0.0, hysteresis=Hysteresis(max_shards=3))
    return build(tmp_path, spec=load_gpufed_spec(tmp_path / "spec.yaml"), options=options)


def node_body(i: int) -> tuple[str, dict[str, Any]]:
    address = f"10.7.0.{i + 1}"
    return f"{address}:9400", {**BODY, "address": address, "node": f"cap-n{i}"}


def test_back_to_back_single_puts_never_overshoot_the_region_cap(tmp_path: Path) -> None:
    """Twenty new nodes, one PUT each, no step between them (no worker runs here; in
    ``gpufed serve`` placed nodes lag the registry by a debounce): six are taken, the rest
    get 429; a refresh of a taken one still answers 200."""
    harness = capped(tmp_path)

    async def run() -> list[int]:
        async with harness.client() as client:
            codes = [await put(harness, client, *node_body(i)) for i in range(20)]
            return [*codes, await put(harness, client, *node_body(0))]

    codes = asyncio.run(run())
    assert codes[:6] == [201] * 6 and codes[6:20] == [429] * 14 and codes[20] == 200, codes
    assert len(harness.controller.registry.targets()) == 6
    assert harness.controller.reconciler.source_counts()["registry"] == 6
    harness.tick()  # what was taken is placed
    shards = [s for s, i in harness.controller.state.assignment.shards.items() if i.region == "r1"]  # type: ignore[union-attr]
    assert len(shards) == 3


def test_a_node_offered_then_withdrawn_before_a_step_frees_its_room(tmp_path: Path) -> None:
    """A registration deleted before any step placed it counts against the cap (it errs on
    the side of refusing) until the next step, which frees its room."""
    harness = capped(tmp_path)

    async def run() -> list[int]:
        async with harness.client() as client:
            codes = [await put(harness, client, *node_body(i)) for i in range(6)]
            gone = await client.delete(f"/v1/registry/targets/{node_body(5)[0]}", headers=harness.auth())
            codes += [gone.status_code, await put(harness, client, *node_body(6))]
            harness.tick()
            return [*codes, await put(harness, client, *node_body(6))]

    codes = asyncio.run(run())
    assert codes == [201] * 6 + [204, 429, 201], codes
