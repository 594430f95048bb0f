"""Pod attribution against an in-process kubelet stand-in: a gRPC server on a unix socket.

The stand-in serves `v1.PodResourcesLister` (`List` and `Get`) from the same committed
`exporter/podresources_v1.proto` the client uses, with kubelet's field names and numbers.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")  # the `podresources` extra

from exporter.attribution import pod_attribution  # noqa: E402
from exporter.errors import ConfigError  # noqa: E402
from exporter.kubelet_podresources import (  # noqa: E402
    KubeletPodAttribution,
    PodResourcesClient,
    gpu_id,
    gpu_labels,
)
from exporter.podresources_messages import PROTO, RPCS, SERVICE, file_descriptor, message  # noqa: E402

GPU0 = "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763"
GPU1 = "GPU-11111111-2222-3333-4444-555555555555"
GPU2 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def kubelet_answer() -> Any:
    """A node with a device-plugin pod (time-sliced id), a DRA pod and a CPU-only pod."""
    resp = message("ListPodResourcesResponse")()
    train = resp.pod_resources.add(name="train-0", namespace="ml")
    worker = train.containers.add(name="worker")
    worker.devices.add(resource_name="nvidia.com/gpu", device_ids=[f"{GPU0}::1"])
    worker.devices.add(resource_name="rdma/hca", device_ids=["mlx5_0"])
    infer = resp.pod_resources.add(name="infer-7", namespace="serving")
    server = infer.containers.add(name="server")
    claim = server.dynamic_resources.add(class_name="gpu.nvidia.com", claim_name="infer-gpu",
                                         claim_namespace="serving")
    claim.claim_resources.add().cdi_devices.add(name=f"k8s.gpu.nvidia.com/gpu={GPU1}")
    claim.claim_resources.add().cdi_devices.add(name="k8s.gpu.nvidia.com/claim=gpu-0")  # no UUID: skipped
    resp.pod_resources.add(name="web", namespace="default").containers.add(name="nginx")
    return resp


class Kubelet:
    """The stand-in: answers List with `answer`, Get by name, and can be made to fail."""

    def __init__(self) -> None:
        self.answer = kubelet_answer()
        self.fail = False
        self.calls: list[str] = []

    def handlers(self) -> Any:
        def list_(request: Any, context: Any) -> Any:
            self.calls.append("List")
            if self.fail:
                context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
            return self.answer

        def get(request: Any, context: Any) -> Any:
            self.calls.append("Get")
            for pod in self.answer.pod_resources:
                if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                    return message("GetPodResourcesResponse")(pod_resources=pod)
            context.abort(grpc.StatusCode.NOT_FOUND, "no such pod")

        methods = {"List": list_, "Get": get}
        return grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            name: grpc.unary_unary_rpc_method_handler(
                methods[name], request_deserializer=message(req).FromString,
                response_serializer=lambda m: m.SerializeToString())
            for name, (req, _) in RPCS.items()
        })


@pytest.fixture
def kubelet() -> Iterator[tuple[Kubelet, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "kubelet.sock")
        fake = Kubelet()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((fake.handlers(),))
        server.add_insecure_port(f"unix://{path}")
        server.start()
        yield fake, path
        server.stop(None).wait()


def test_proto_parse_keeps_kubelet_numbers() -> None:
    fdp = file_descriptor(PROTO.read_text(encoding="utf-8"))
    fields = {(m.name, f.name): f.number for m in fdp.message_type for f in m.field}
    assert fields[("ContainerResources", "dynamic_resources")] == 5
    assert fields[("DynamicResource", "claim_namespace")] == 3
    assert fields[("GetPodResourcesRequest", "pod_namespace")] == 2
    assert SERVICE == "/v1.PodResourcesLister/"
    assert set(RPCS) == {"List", "Get"}


def test_device_ids() -> None:
    assert gpu_id(f"{GPU0}::3") == GPU0
    assert gpu_id(GPU0) == GPU0
    assert gpu_id("mlx5_0") is None


def test_list_and_get_over_the_socket(kubelet: tuple[Kubelet, str]) -> None:
    fake, path = kubelet
    client = PodResourcesClient(path)
    try:
        labels = gpu_labels(client.list())
        assert labels == {
            GPU0: {"namespace": "ml", "pod": "train-0", "container": "worker"},
            GPU1: {"namespace": "serving", "pod": "infer-7", "container": "server",
                   "claim_name": "infer-gpu", "claim_namespace": "serving"},
        }
        pod = client.get(namespace="serving", pod="infer-7")
        assert pod.containers[0].dynamic_resources[0].claim_name == "infer-gpu"
        assert fake.calls == ["List", "Get"]
    finally:
        client.close()


def test_background_refresh_keeps_last_map_on_failure(kubelet: tuple[Kubelet, str]) -> None:
    fake, path = kubelet
    attribution = KubeletPodAttribution(PodResourcesClient(path), interval=0.05)
    try:
        assert set(attribution.labels()) == {GPU0, GPU1}
        fake.fail = True
        calls = len(fake.calls)
        deadline = time.monotonic() + 5
        while len(fake.calls) < calls + 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert set(attribution.labels()) == {GPU0, GPU1}, "a failed refresh must keep the last map"
        fake.fail = False
        moved = fake.answer.pod_resources[0].containers[0].devices[0]
        del moved.device_ids[:]
        moved.device_ids.append(GPU2)
        deadline = time.monotonic() + 5
        while GPU2 not in attribution.labels() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert attribution.labels()[GPU2]["pod"] == "train-0"
        assert GPU0 not in attribution.labels()
    finally:
        attribution.close()


def test_setting_builds_kubelet_attribution(kubelet: tuple[Kubelet, str]) -> None:
    _, path = kubelet
    attribution = pod_attribution("kubelet", socket_path=path, interval=60)
    try:
        assert attribution.labels()[GPU0]["container"] == "worker"
    finally:
        attribution.close()
    with pytest.raises(ConfigError, match="unknown pod attribution 'cri'"):
        pod_attribution("cri")
