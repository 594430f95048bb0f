"""``/v1/status`` lists the endpoints discovery left out, and an empty first answer makes the
controller ready (issue #39 item 1): on a kubeadm cluster, before any Node is labelled,
"no targets yet" is visible and explained instead of a controller that never gets ready."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from federation.testing.standins.kube import FakeKubeAPI
from sharder.sources.kubernetes import KubernetesConfig, KubernetesSource
from tests.controller.harness import build


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as fake:
        yield fake


def kubeadm_cluster(api: FakeKubeAPI) -> None:
    api.apply("nodes", {"metadata": {"name": "gpu-0", "labels": {"kubernetes.io/hostname": "gpu-0"}},
                        "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    api.apply("endpointslices", {
        "metadata": {"name": "exp-1", "namespace": "monitoring",
                     "labels": {"kubernetes.io/service-name": "gpufed-exporter"}},
        "addressType": "IPv4", "ports": [{"name": "metrics", "port": 9400}],
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}, "nodeName": "gpu-0"}]})


@pytest.mark.asyncio
async def test_status_lists_skipped_endpoints_and_the_controller_is_ready(
    api: FakeKubeAPI, tmp_path: Path
) -> None:
    kubeadm_cluster(api)
    h = build(tmp_path)
    configuration = kubernetes.client.Configuration()
    configuration.host = api.url
    source = KubernetesSource(KubernetesConfig(watch_timeout_s=1), sink=h.controller.reconciler,
                              api_client=kubernetes.client.ApiClient(configuration),
                              regions=h.controller.spec.region_names())
    h.controller.sources.append(source)
    async with h.client() as client:
        assert (await client.get("/readyz")).status_code == 503
        assert source.sync()  # the one endpoint is skipped: an empty first answer
        h.tick()
        assert (await client.get("/readyz")).status_code == 200
        status = (await client.get("/v1/status")).json()
        assert status["targets"] == 0
        (row,) = [r for r in status["discovery"] if r["source"] == "kubernetes"]
        assert row["skipped_total"] == 1
        (skipped,) = row["skipped"]
        assert (skipped["node"], skipped["address"], skipped["reason"]) == ("gpu-0", "10.0.0.1", "no_region")
        assert "--k8s-default-region" in skipped["detail"]
        # every child serves an empty list, not a 404
        shard = next(iter(h.controller.state.assignment.shards))  # type: ignore[union-attr]
        assert (await client.get(f"/v1/sd/{shard}")).json() == []
