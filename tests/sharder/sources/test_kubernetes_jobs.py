"""More jobs from other Services (``gpufed serve --k8s-job``): node-exporter as job ``node``."""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes
import pytest
import typer

from alertmanager.models import DEFAULT_INHIBIT_RULES
from federation.commands import serve
from federation.spec import GpufedSpec
from sharder.model.loading import parse_model
from sharder.sources.kubernetes import KubernetesConfig, KubernetesSource
from tests.sharder.sources.helpers import RecordingSink
from tests.sharder.sources.k8s_objects import endpoint, endpoint_slice, node
from tests.sharder.sources.test_kubernetes_kmock import NODES, SLICES

SPEC = parse_model(GpufedSpec, {
    "cluster": "c", "regions": [{"name": "r1"}],
    "jobs": [{"name": "gpu"}, {"name": "node"}, {"name": "hami-device-plugin"}],
}, source="test")
BASE = KubernetesConfig(namespace="monitoring", service="gpufed-exporter")


def test_a_job_flag_names_its_service_port_and_namespace() -> None:
    config = serve._k8s_job("node=gpufed-node-exporter:metrics", base=BASE, jobs=SPEC)
    assert (config.job, config.service, config.port, config.namespace) == (
        "node", "gpufed-node-exporter", "metrics", "monitoring")
    hami = serve._k8s_job("hami-device-plugin=kube-system/hami-device-plugin-monitor:monitorport",
                          base=BASE, jobs=SPEC)
    assert (hami.namespace, hami.service, hami.port) == (
        "kube-system", "hami-device-plugin-monitor", "monitorport")
    assert serve._k8s_job("node=node-exporter:9100", base=BASE, jobs=SPEC).port == 9100
    selector = "node=kube-system/{app.kubernetes.io/name=node-exporter}:9100"
    by_label = serve._k8s_job(selector, base=BASE, jobs=SPEC)
    assert (by_label.service, by_label.pod_selector, by_label.namespace) == (
        None, "app.kubernetes.io/name=node-exporter", "kube-system")


@pytest.mark.parametrize(("value", "message"), [
    ("node", "expected JOB=[NAMESPACE/]SERVICE:PORT or JOB=[NAMESPACE/]{LABEL-SELECTOR}:PORT"),
    ("node={}:metrics", "got 'node={}:metrics'"),
    ("node=svc", "got 'node=svc'"),
    ("dcgm=svc:metrics", "job 'dcgm' is not in the spec's jobs (gpu, node, hami-device-plugin)"),
])
def test_a_bad_job_flag_names_the_value(value: str, message: str) -> None:
    with pytest.raises(typer.BadParameter) as caught:
        serve._k8s_job(value, base=BASE, jobs=SPEC)
    assert message in str(caught.value)


@pytest.mark.asyncio
async def test_node_exporter_endpoints_become_node_job_targets(kmock: Any) -> None:
    kmock.objects[NODES, None, "gpu-0"] = node("gpu-0", region="r1", zone="za", gpus="8")
    kmock.objects[SLICES, "monitoring", "ne-a"] = endpoint_slice(
        "ne-a", [endpoint("10.0.0.7", "gpu-0")])
    configuration = kubernetes.client.Configuration()
    configuration.host = str(kmock.url).rstrip("/")
    config = serve._k8s_job("node=gpufed-node-exporter:metrics", base=BASE, jobs=SPEC)
    sink = RecordingSink()
    source = KubernetesSource(config, sink=sink, name="kubernetes/node",  # type: ignore[arg-type]
                              api_client=kubernetes.client.ApiClient(configuration))
    assert await asyncio.to_thread(source.sync)
    name, targets = sink.changes[-1][0], sink.changes[-1][1]
    assert name == "kubernetes/node"
    # NodeDown and its inhibition key on `node`: the node-exporter target carries the node's name
    assert [(t.job, t.node, t.region) for t in targets] == [("node", "gpu-0", "r1")]


@pytest.mark.asyncio
async def test_node_down_inhibits_the_gpu_alerts_of_the_same_node(kmock: Any) -> None:
    """The shipped inhibition compares labels both jobs' targets get from the same Node."""
    kmock.objects[NODES, None, "gpu-0"] = node("gpu-0", region="r7", zone="za", gpus="8")
    kmock.objects[SLICES, "monitoring", "exp-a"] = endpoint_slice("exp-a", [endpoint("10.4.0.1", "gpu-0")])
    configuration = kubernetes.client.Configuration()
    configuration.host = str(kmock.url).rstrip("/")
    seen = {}
    for config in (BASE, serve._k8s_job("node=gpufed-node-exporter:metrics", base=BASE, jobs=SPEC)):
        sink = RecordingSink()
        source = KubernetesSource(config, sink=sink,  # type: ignore[arg-type]
                                  api_client=kubernetes.client.ApiClient(configuration))
        assert await asyncio.to_thread(source.sync)
        (target,) = sink.changes[-1][1]
        seen[target.job] = target
    (rule,) = [r for r in DEFAULT_INHIBIT_RULES if 'alertname="NodeDown"' in r.source_matchers]
    assert set(rule.equal) == {"cluster", "region", "node"}  # cluster: every child's external label
    for label in set(rule.equal) - {"cluster"}:
        assert getattr(seen["node"], label) == getattr(seen["gpu"], label) != ""
