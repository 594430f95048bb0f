"""Reuse what the cluster runs (issue #39 item 4): ``exporter.existing`` follows GPU
Operator's dcgm-exporter instead of deploying gpufed's exporter, and ``extraJobs`` adds
scrape jobs (kube-state-metrics, training-operator, ...) that are spec jobs discovered like
any other. Each ``--k8s-job`` goes through ``gpufed serve``'s own parser and check, and the
gpu job's source is followed against the Kubernetes stand-in with the rendered settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes
import pytest
from deploy_tools import serve_params
from test_helm import CHART, RELEASE, find, render

from federation.commands import serve
from federation.spec import load_gpufed_spec
from federation.testing.standins.kube import FakeKubeAPI
from sharder.sources.kubernetes import KubernetesConfig, KubernetesSource

TOKEN = {"controller": {"token": {"value": "a-token-0123456789abcdef"}}}
DCGM = {"enabled": False, "existing": {"namespace": "gpu-operator", "service": "nvidia-dcgm-exporter"}}
KSM = {"name": "kube-state-metrics", "namespace": "monitoring", "service": "kps-kube-state-metrics",
       "port": "http", "interval": "30s", "keepMetrics": ["kube_pod_.*", "up"]}


def serve_setup(
    objects: list[dict[str, Any]], tmp_path: Path
) -> tuple[dict[str, Any], list[KubernetesConfig]]:
    """The controller's parsed flags and the job sources serve builds from them."""
    (container,) = find(objects, "Deployment", "-controller")["spec"]["template"]["spec"]["containers"]
    params = serve_params(["gpufed", *container["args"]])
    spec_file = tmp_path / "federation.yaml"
    spec_file.write_text(find(objects, "ConfigMap", "-spec")["data"]["federation.yaml"])
    spec = load_gpufed_spec(spec_file)
    base = KubernetesConfig(namespace=str(params["namespace"]))
    jobs = [serve._k8s_job(flag, base=base, jobs=spec) for flag in params["k8s_job"] or []]
    return params, jobs


def test_existing_dcgm_exporter_replaces_ours(tmp_path: Path) -> None:
    objects = render(helm.Chart.load(CHART), {**TOKEN, "exporter": DCGM})
    assert not [o for o in objects if o["metadata"]["name"] == "gpufed-exporter"]
    params, jobs = serve_setup(objects, tmp_path)
    assert params["k8s_service"] == ""  # no Service of our own to follow
    (gpu,) = [j for j in jobs if j.job == "gpu"]
    assert (gpu.namespace, gpu.service, gpu.port) == ("gpu-operator", "nvidia-dcgm-exporter", "gpu-metrics")


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as fake:
        yield fake


class Sink:
    def __init__(self) -> None:
        self.targets: list[Any] = []

    def on_change(self, source: str, targets: Any, *, version: str | None = None) -> None:
        self.targets = list(targets)

    def on_error(self, source: str, reason: str) -> None:
        pass


def test_the_rendered_gpu_job_discovers_a_dcgm_exporter_service(api: FakeKubeAPI, tmp_path: Path) -> None:
    values = {**TOKEN, "exporter": DCGM, "discovery": {"defaultRegion": "cn-beijing"}}
    params, jobs = serve_setup(render(helm.Chart.load(CHART), values), tmp_path)
    (gpu,) = [j for j in jobs if j.job == "gpu"]
    gpu = dataclasses.replace(gpu, default_region=str(params["k8s_default_region"]), watch_timeout_s=1)
    # GPU Operator's objects: a kubeadm Node (no region label) and the dcgm-exporter
    # Service's EndpointSlice (port gpu-metrics, 9400)
    api.apply("nodes", {"metadata": {"name": "gpu-a", "labels": {"kubernetes.io/hostname": "gpu-a"}},
                        "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    api.apply("endpointslices", {
        "metadata": {"name": "nvidia-dcgm-exporter-x1", "namespace": "gpu-operator",
                     "labels": {"kubernetes.io/service-name": "nvidia-dcgm-exporter"}},
        "addressType": "IPv4", "ports": [{"name": "gpu-metrics", "port": 9400, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.8.0.11"], "conditions": {"ready": True}, "nodeName": "gpu-a",
                       "targetRef": {"kind": "Pod", "namespace": "gpu-operator",
                                     "name": "nvidia-dcgm-exporter-abc"}}]})
    configuration = kubernetes.client.Configuration()
    configuration.host = api.url
    sink = Sink()
    source = KubernetesSource(gpu, sink=sink, api_client=kubernetes.client.ApiClient(configuration),
                              regions=("cn-beijing",))
    assert source.sync()
    assert [(t.job, t.address, t.port, t.node, t.region, t.gpus) for t in sink.targets] == [
        ("gpu", "10.8.0.11", 9400, "gpu-a", "cn-beijing", 8)]


def test_no_exporter_at_all_is_refused() -> None:
    with pytest.raises(Exception, match=r"exporter\.existing\.service or \.podSelector"):
        helm.Chart.load(CHART).render({**TOKEN, "exporter": {"enabled": False}}, **RELEASE)


def test_extra_jobs_are_spec_jobs_the_controller_discovers(tmp_path: Path) -> None:
    training = {"name": "training-operator", "namespace": "kubeflow",
                "podSelector": "control-plane=kubeflow-training-operator", "port": 8080}
    objects = render(helm.Chart.load(CHART), {**TOKEN, "extraJobs": [KSM, training]})
    _params, jobs = serve_setup(objects, tmp_path)
    by_job = {j.job: j for j in jobs}
    assert (by_job["kube-state-metrics"].namespace, by_job["kube-state-metrics"].service) == (
        "monitoring", "kps-kube-state-metrics")
    assert by_job["training-operator"].service is None
    assert by_job["training-operator"].pod_selector == "control-plane=kubeflow-training-operator"
    spec_file = tmp_path / "federation.yaml"
    spec = load_gpufed_spec(spec_file)
    ksm = next(j for j in spec.jobs if j.name == "kube-state-metrics")
    assert (ksm.scrape_interval, ksm.keep_metrics) == ("30s", ["kube_pod_.*", "up"])


@pytest.mark.parametrize(("job", "message"), [
    ({"name": "gpu", "service": "x", "port": 1}, "/extraJobs/0/name"),
    ({"name": "ksm", "port": "http"}, "/extraJobs/0"),
])
def test_schema_refuses_bad_extra_jobs(job: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=message):
        helm.Chart.load(CHART).render({**TOKEN, "extraJobs": [job]}, **RELEASE)
