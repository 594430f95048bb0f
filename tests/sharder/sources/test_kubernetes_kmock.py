"""The Kubernetes source against kmock (an in-process API emulator, a stand-in).

kmock serves LIST and WATCH to the official client. What it lacks is scripted through
its handlers here (a watch stream ending in a 410 ERROR event); resourceVersion
bookkeeping, label selectors, bookmarks and watch timeouts are covered with
federation/testing/standins/kube.py instead (kmock lists with resourceVersion "..." and ignores
selectors, so only objects of the followed Service are stored here).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kmock as kmock_lib
import kubernetes
import pytest

from sharder.live.reconcile import Reconciler
from sharder.sources.kubernetes import KubernetesConfig, KubernetesSource
from tests.sharder.sources.helpers import FakeClock, RecordingSink, make_spec
from tests.sharder.sources.k8s_objects import endpoint, endpoint_slice, node

SLICES = kmock_lib.resource("discovery.k8s.io", "v1", "endpointslices")
NODES = kmock_lib.resource("", "v1", "nodes")
GONE = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Expired",
        "code": 410, "message": "too old resource version: 3 (9)"}


def source_for(kmock: Any, sink: object) -> KubernetesSource:
    configuration = kubernetes.client.Configuration()
    configuration.host = str(kmock.url).rstrip("/")
    return KubernetesSource(KubernetesConfig(), sink=sink,  # type: ignore[arg-type]
                            api_client=kubernetes.client.ApiClient(configuration))


@pytest.mark.asyncio
async def test_list_joins_endpoint_slices_with_nodes(kmock: Any) -> None:
    kmock.objects[NODES, None, "gpu-0"] = node("gpu-0", region="r2", zone="za", gpus="4")
    kmock.objects[NODES, None, "gpu-1"] = node("gpu-1", gpus=None)
    kmock.objects[SLICES, "monitoring", "exp-a"] = endpoint_slice(
        "exp-a", [endpoint("10.4.0.1", "gpu-0"), endpoint("10.4.0.2", "gpu-1"),
                  endpoint("10.4.0.3", "gpu-1", ready=False)])
    sink = RecordingSink()
    source = source_for(kmock, sink)
    assert await asyncio.to_thread(source.sync)
    targets = sink.changes[-1][1]
    assert [(t.address, t.region, t.rack, t.gpus) for t in targets] == [
        ("10.4.0.1", "r2", "za", 4), ("10.4.0.2", "r1", "z1", 0)]


@pytest.mark.asyncio
async def test_watch_ending_in_410_relists_and_loses_nothing(kmock: Any) -> None:
    kmock.objects[NODES, None, "gpu-0"] = node("gpu-0")
    kmock.objects[NODES, None, "gpu-1"] = node("gpu-1")
    kmock.objects[SLICES, "monitoring", "exp-a"] = endpoint_slice("exp-a", [endpoint("10.4.0.1", "gpu-0")])
    clock = FakeClock()
    rec = Reconciler(spec=make_spec(), clock=clock)
    source = source_for(kmock, rec)
    assert await asyncio.to_thread(source.sync)
    clock.advance(1)
    before = rec.tick()
    assert before is not None
    added = endpoint_slice("exp-b", [endpoint("10.4.0.2", "gpu-1")])
    kmock.objects[SLICES, "monitoring", "exp-b"] = added
    kmock["watch", SLICES] << ({"type": "ADDED", "object": added}, {"type": "ERROR", "object": GONE})
    relists = source.endpoints.relists
    assert await asyncio.to_thread(source.watch_once, source.endpoints)
    assert source.endpoints.relists == relists + 1
    clock.advance(1)
    after = rec.tick()
    assert after is not None and sorted(after.targets) == ["10.4.0.1:9400", "10.4.0.2:9400"]
    assert after.targets["10.4.0.1:9400"] == before.targets["10.4.0.1:9400"]
