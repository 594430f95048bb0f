"""Pod attribution as kubelet and NVIDIA's DRA driver really speak it.

A stand-in kubelet (exporter/testing/kubelet.py) serves `List`, `Get` and
`GetAllocatableResources` from kubelet's own `api.proto` (vendored unchanged). The node's
answer is shaped like NVIDIA's drivers make it: device-plugin ids are GPU UUIDs (`::N`
under time-slicing) or MIG UUIDs; DRA claim resources carry driver `gpu.nvidia.com`, the
node's pool and the DRA driver's canonical device names (`gpu-<minor>`,
`gpu-<minor>-mig-<profile>-<id>-<start>`), and CDI names
`k8s.gpu.nvidia.com/claim=<claim UID>-<device>` with no UUID in them
(k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/cdi.go, GetClaimDeviceName). The node's
ResourceSlices (resource.k8s.io/v1, attributes `type`, `uuid`, `parentUUID`, `profile` as
the driver's deviceinfo.go and mig.go publish them) come from the in-process Kubernetes
API (federation/testing/standins/kube.py) through the `kubernetes` client.
"""

from __future__ import annotations

import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for as shared_wait_for

grpc = pytest.importorskip("grpc")  # the `podresources` extra

from fake_nvml import FakeGpu, FakeMig, FakeNvml  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from exporter import podmap  # noqa: E402
from exporter.app import ExporterApp  # noqa: E402
from exporter.attribution import pod_attribution  # noqa: E402
from exporter.errors import ConfigError  # noqa: E402
from exporter.kubelet_podresources import KubeletPodAttribution, PodResourcesClient  # noqa: E402
from exporter.nvml_backend import NvmlBackend  # noqa: E402
from exporter.podresources_messages import PROTO, RPCS, SERVICE, file_descriptor, message  # noqa: E402
from exporter.settings import ExporterSettings  # noqa: E402
from exporter.testing.kubelet import FakeKubelet  # noqa: E402
from federation.testing.standins.kube import FakeKubeAPI  # noqa: E402

NODE = "gpu-node-1"
GPU = ["GPU-6f1a5c2e-8b3d-4e7f-9a10-2c4b6d8e0f12", "GPU-0b7e9d41-3c2a-4f58-8e61-7d9c0a1b2e34",
       "GPU-a3c5e7f9-1b2d-4c6e-8f0a-1c3e5a7b9d0f", "GPU-d4e5f6a7-b8c9-4d0e-9f1a-2b3c4d5e6f70",
       "GPU-19283746-5a6b-4c7d-8e9f-0a1b2c3d4e5f"]
MIG_DRA = "MIG-5e2f8c1a-9b3d-5f7e-a1c4-6d8e0f2a4b6c"
MIG_PLUGIN = "MIG-7a9c1e3f-5b7d-5e9f-b2d4-8f0a2c4e6a8b"
CLAIM_UID = {"infer": "dab5ab50-d59a-42a6-af16-cfd4628c0f7a", "nb": "4c1f7e2a-6b8d-4e0f-a2c4-6e8a0c2e4f6a"}


def nvml() -> FakeNvml:
    """Five H100s, minors 0-4; GPU 3 in MIG mode with two 1g.10gb slices."""
    gpus = [FakeGpu(uuid=uuid, minor=i, bus_id=f"00000000:{0x18 + i:02X}:00.0") for i, uuid in enumerate(GPU)]
    gpus[3].migs = [FakeMig(MIG_DRA, 7), FakeMig(MIG_PLUGIN, 8)]
    return FakeNvml(gpus, driver="580.95.05")


def kubelet_answer() -> Any:
    """List as kubelet answers on that node."""
    resp = message("ListPodResourcesResponse")()
    # 1. device plugin, whole GPU 0 (resource nvidia.com/gpu, id = UUID); an RDMA device too
    train = resp.pod_resources.add(name="train-0", namespace="ml").containers.add(name="worker")
    train.devices.add(resource_name="nvidia.com/gpu", device_ids=[GPU[0]])
    train.devices.add(resource_name="rdma/hca_shared_devices_a", device_ids=["mlx5_0"])
    # 2. DRA, whole GPU 1 through a ResourceClaim
    server = resp.pod_resources.add(name="infer-7", namespace="serving").containers.add(name="server")
    claim = server.dynamic_resources.add(claim_name="infer-gpu", claim_namespace="serving")
    dra = claim.claim_resources.add(driver_name="gpu.nvidia.com", pool_name=NODE, device_name="gpu-1")
    dra.cdi_devices.add(name=f"k8s.gpu.nvidia.com/claim={CLAIM_UID['infer']}-gpu-1")
    # 3. time-sliced GPU 2, two pods (device plugin replicas: UUID::N)
    for name, replica in (("job-a", 0), ("job-b", 3)):
        pod = resp.pod_resources.add(name=name, namespace="batch").containers.add(name="main")
        pod.devices.add(resource_name="nvidia.com/gpu", device_ids=[f"{GPU[2]}::{replica}"])
    # 4. MIG on GPU 3: a DRA MIG device, and a device-plugin MIG slice (mixed strategy)
    nb = resp.pod_resources.add(name="notebook", namespace="research").containers.add(name="jupyter")
    mig_claim = nb.dynamic_resources.add(claim_name="nb-mig", claim_namespace="research")
    mig = mig_claim.claim_resources.add(driver_name="gpu.nvidia.com", pool_name=NODE,
                                        device_name="gpu-3-mig-1g10gb-19-0")
    mig.cdi_devices.add(name=f"k8s.gpu.nvidia.com/claim={CLAIM_UID['nb']}-gpu-3-mig-1g10gb-19-0")
    small = resp.pod_resources.add(name="mig-small", namespace="research").containers.add(name="app")
    small.devices.add(resource_name="nvidia.com/mig-1g.10gb", device_ids=[MIG_PLUGIN])
    # not GPUs: another vendor's DRA claim, a CPU-only pod
    other = resp.pod_resources.add(name="fpga", namespace="hw").containers.add(name="c")
    other.dynamic_resources.add(claim_name="f", claim_namespace="hw").claim_resources.add(
        driver_name="fpga.example.com", pool_name=NODE, device_name="gpu-4")
    resp.pod_resources.add(name="web", namespace="default").containers.add(name="nginx")
    return resp  # 5. GPU 4 is idle


def resource_slice(node: str, devices: list[dict[str, Any]], suffix: str = "x7k2p") -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-gpu.nvidia.com-{suffix}"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def gpu_device(minor: int, uuid: str) -> dict[str, Any]:
    return {"name": f"gpu-{minor}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": uuid},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "architecture": {"string": "Hopper"}, "driverVersion": {"version": "580.95.5"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + minor:02x}:00.0"}},
        "capacity": {"memory": {"value": "81559Mi"}}}


def mig_device(name: str, parent: str, uuid: str) -> dict[str, Any]:
    return {"name": name, "attributes": {
        "type": {"string": "mig"}, "parentUUID": {"string": parent}, "uuid": {"string": uuid},
        "profile": {"string": "1g.10gb"}, "productName": {"string": "NVIDIA H100 80GB HBM3"}}}


def node_slices() -> list[dict[str, Any]]:
    devices = [gpu_device(i, GPU[i]) for i in (0, 1, 2, 4)]
    devices.append(mig_device("gpu-3-mig-1g10gb-19-0", GPU[3], MIG_DRA))
    other = resource_slice("gpu-node-2", [gpu_device(1, "GPU-ffffffff-ffff-4fff-bfff-ffffffffffff")], "q9")
    return [resource_slice(NODE, devices), other]


BASE = {"train": {"namespace": "ml", "pod": "train-0", "container": "worker"},
        "infer": {"namespace": "serving", "pod": "infer-7", "container": "server",
                  "dra_claim_name": "infer-gpu", "dra_claim_namespace": "serving",
                  "dra_driver_name": "gpu.nvidia.com", "dra_pool_name": NODE, "dra_device_name": "gpu-1"},
        "job-a": {"namespace": "batch", "pod": "job-a", "container": "main"},
        "job-b": {"namespace": "batch", "pod": "job-b", "container": "main"},
        "nb": {"namespace": "research", "pod": "notebook", "container": "jupyter",
               "dra_claim_name": "nb-mig", "dra_claim_namespace": "research",
               "dra_driver_name": "gpu.nvidia.com",
               "dra_pool_name": NODE, "dra_device_name": "gpu-3-mig-1g10gb-19-0",
               "dra_mig_profile": "1g.10gb", "dra_mig_device_uuid": MIG_DRA},
        "small": {"namespace": "research", "pod": "mig-small", "container": "app",
                  "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "8"}}
POD_KEYS = {key for labels in BASE.values() for key in labels}


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    shared_wait_for(check, timeout=timeout, interval=0.02, what="the condition")


@pytest.fixture
def socket_path() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        yield str(Path(tmp) / "kubelet.sock")


@pytest.fixture
def kubelet(socket_path: str) -> Iterator[FakeKubelet]:
    with FakeKubelet(socket_path) as fake:
        fake.answer = kubelet_answer()
        alloc = fake.allocatable
        alloc.devices.add(resource_name="nvidia.com/gpu",
                          device_ids=[GPU[0], GPU[2] + "::0", GPU[2] + "::3", GPU[4]])
        alloc.devices.add(resource_name="nvidia.com/mig-1g.10gb", device_ids=[MIG_PLUGIN])
        alloc.devices.add(resource_name="rdma/hca_shared_devices_a", device_ids=["mlx5_0"])
        yield fake


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as api:
        for obj in node_slices():
            api.apply("resourceslices", obj)
        config = tmp_path / "kubeconfig"
        config.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
            f"clusters: [{{name: t, cluster: {{server: '{api.url}'}}}}]\n"
            "contexts: [{name: t, context: {cluster: t, user: t}}]\nusers: [{name: t, user: {token: x}}]\n")
        monkeypatch.setenv("KUBECONFIG", str(config))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield api


def scrape(app: ExporterApp) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{app.http.port}/metrics", timeout=10) as response:
        return {f.name: f for f in text_string_to_metric_families(response.read().decode())}


def pods_by_gpu(families: dict[str, Any], name: str = "DCGM_FI_DEV_GPU_TEMP") -> dict[str, list[Any]]:
    out: dict[str, list[dict[str, str]]] = {}
    for sample in families[name].samples:
        pod = {k: v for k, v in sample.labels.items() if k in POD_KEYS}
        out.setdefault(sample.labels["UUID"], []).append(pod)
    return {uuid: sorted(pods, key=lambda p: sorted(p.items())) for uuid, pods in out.items()}


def test_proto_is_kubelets_whole_v1_api() -> None:
    fdp = file_descriptor(PROTO.read_text(encoding="utf-8"))
    fields = {(m.name, f.name): f.number for m in fdp.message_type for f in m.field}
    assert fields[("ClaimResource", "driver_name")] == 2
    assert fields[("ClaimResource", "pool_name")] == 3
    assert fields[("ClaimResource", "device_name")] == 4
    assert fields[("ClaimResource", "share_id")] == 5
    assert ("DynamicResource", "class_name") not in fields  # removed in 1.31 (a tombstone comment)
    assert fields[("AllocatableResourcesResponse", "devices")] == 1
    assert SERVICE == "/v1.PodResourcesLister/"
    assert set(RPCS) == {"List", "Get", "GetAllocatableResources"}
    claim = message("ClaimResource")(device_name="gpu-0")
    assert not claim.HasField("share_id")  # proto3 optional: presence is tracked


def test_every_kind_of_gpu_carries_exactly_its_pods(kubelet: FakeKubelet, kube: FakeKubeAPI,
                                                    socket_path: str) -> None:
    backend = NvmlBackend(nvml(), event_timeout_ms=20)
    app = ExporterApp(ExporterSettings(
        backend="nvml", listen="127.0.0.1:0", node_name=NODE, collect_interval=0.05,
        pod_attribution="kubelet", pod_resources_socket=socket_path, pod_resources_interval=0.05,
        dra_resource_slices=True), backend=backend)
    app.start()
    try:
        expected = {
            GPU[0]: [BASE["train"]],
            GPU[1]: [BASE["infer"]],
            GPU[2]: [BASE["job-a"], BASE["job-b"]],  # one series per pod on a shared GPU
            GPU[3]: [{}],  # MIG: the whole GPU's series carry no MIG pod (issue 42)
            GPU[4]: [{}],  # idle: one series, no pod labels
        }
        # each MIG pod is on its own instance's series, with dcgm-exporter's MIG labels
        on_instances = {**expected, GPU[3]: sorted(
            [{}, BASE["small"], {**BASE["nb"], "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "7"}],
            key=lambda p: sorted(p.items()))}
        # (until the ResourceSlices are listed, the MIG device resolves by NVML minor alone)
        wait_for(lambda: pods_by_gpu(scrape(app), "DCGM_FI_DEV_FB_USED") == on_instances)
        families = scrape(app)
        assert pods_by_gpu(families) == expected
        assert pods_by_gpu(families, "DCGM_FI_DEV_FB_USED") == on_instances
        temps = families["DCGM_FI_DEV_GPU_TEMP"].samples
        assert all(s.labels["DCGM_FI_DRIVER_VERSION"] == "580.95.05" for s in temps)
        alloc = {s.labels["resource"]: s.value for s in families["gpufed_kubelet_allocatable_gpus"].samples}
        assert alloc == {"nvidia.com/gpu": 4.0, "nvidia.com/mig-1g.10gb": 1.0}
        last = families["gpufed_exporter_pod_attribution_last_success_timestamp_seconds"].samples[0].value
        assert abs(last - time.time()) < 10
        assert {"List", "GetAllocatableResources"} <= set(kubelet.calls)
    finally:
        app.stop()


def test_nvml_identity_is_the_fallback_without_resource_slices(kubelet: FakeKubelet) -> None:
    backend = NvmlBackend(nvml(), event_timeout_ms=20)
    try:
        gpus = podmap.node_gpus(backend.devices(), backend.mig_slices())
    finally:
        backend.close()
    found = podmap.gpu_labels(kubelet.answer.pod_resources, gpus=gpus)
    assert found[GPU[1]] == (BASE["infer"],)  # gpu-1 is minor 1
    mig = {k: v for k, v in BASE["nb"].items() if not k.startswith("dra_mig")}
    assert found[GPU[3]] == (BASE["small"], mig)  # the parent, from the canonical name; no slice, no profile
    assert GPU[4] not in found


def test_index_device_ids_resolve_through_nvml_index() -> None:
    gpus = podmap.node_gpus(NvmlBackend(nvml(), event_timeout_ms=20).devices())
    resp = message("ListPodResourcesResponse")()
    pod = resp.pod_resources.add(name="p", namespace="n").containers.add(name="c")
    pod.devices.add(resource_name="nvidia.com/gpu", device_ids=["4", "2::1", "9"])  # 9: no such GPU
    found = podmap.gpu_labels(resp.pod_resources, gpus=gpus)
    assert set(found) == {GPU[4], GPU[2]}
    # a time-sliced replica carries dcgm-exporter's `vgpu` label (issue 42); a whole GPU none
    assert [labels.get("vgpu") for labels in found[GPU[2]]] == ["1"]
    assert [labels.get("vgpu") for labels in found[GPU[4]]] == [None]


def test_time_sliced_replicas_of_one_gpu_are_told_apart_by_vgpu() -> None:
    gpus = podmap.node_gpus(NvmlBackend(nvml(), event_timeout_ms=20).devices())
    resp = message("ListPodResourcesResponse")()
    for replica, name in ((0, "a"), (3, "b")):
        pod = resp.pod_resources.add(name=name, namespace="n").containers.add(name="c")
        pod.devices.add(resource_name="nvidia.com/gpu.shared", device_ids=[f"{GPU[2]}::{replica}"])
    found = podmap.gpu_labels(resp.pod_resources, gpus=gpus)
    assert [(labels["pod"], labels["vgpu"]) for labels in found[GPU[2]]] == [("a", "0"), ("b", "3")]


def test_labels_go_after_max_age_and_come_back(kubelet: FakeKubelet, socket_path: str) -> None:
    now = [1000.0]
    gpus = podmap.node_gpus(NvmlBackend(nvml(), event_timeout_ms=20).devices())
    client = PodResourcesClient(socket_path, timeout=1.0, backoff_cap=0.2)
    attribution = KubeletPodAttribution(client, gpus=gpus, interval=0.05, max_age=30.0, clock=lambda: now[0])
    try:
        wait_for(lambda: GPU[0] in attribution.labels())
        kubelet.stop()  # kubelet goes away
        calls = len(kubelet.calls)
        wait_for(lambda: attribution.status().errors.get("UNAVAILABLE", 0) >= 2)
        assert len(kubelet.calls) == calls
        assert GPU[0] in attribution.labels(), "within max age the last map stays"
        now[0] += 31
        assert attribution.labels() == {} and attribution.status().stale
        assert attribution.status().last_success == 1000.0
        kubelet.start()  # kubelet is back: labels return within an interval plus the backoff cap
        started = time.monotonic()
        wait_for(lambda: GPU[0] in attribution.labels(), timeout=5)
        assert time.monotonic() - started < 3
        assert not attribution.status().stale and attribution.status().last_success == 1031.0
    finally:
        attribution.close()


def test_start_up_never_waits_on_kubelet(socket_path: str) -> None:
    started = time.monotonic()
    attribution = pod_attribution("kubelet", socket_path=socket_path + ".absent", interval=60, timeout=30)
    try:
        assert time.monotonic() - started < 1.0
        assert attribution.labels() == {}
    finally:
        attribution.close()


def test_a_slow_kubelet_within_the_timeout_still_refreshes(kubelet: FakeKubelet, socket_path: str) -> None:
    """A timeout is a flag now: a kubelet that needs longer than gRPC's usual 5 s is served."""
    client = PodResourcesClient(socket_path, timeout=0.01)
    try:
        assert len(client.list()) == len(kubelet.answer.pod_resources)  # fast enough here
    finally:
        client.close()
    kubelet.fail = grpc.StatusCode.DEADLINE_EXCEEDED
    attribution = KubeletPodAttribution(PodResourcesClient(socket_path), interval=60, start=False)
    assert not attribution.refresh()
    assert attribution.status().errors == {"DEADLINE_EXCEEDED": 1}
    attribution.close()


def test_default_timeout_leaves_a_5_s_list_room_and_a_cycle_within_max_age() -> None:
    """Issue 42: a List that takes 5 s always hit the former 5 s default and never landed.

    dcgm-exporter allows 10 s; a refresh cycle (List and GetAllocatableResources, each up to
    the timeout, then the interval) must still end before the labels' max age drops them.
    """
    settings = ExporterSettings()
    assert settings.pod_resources_timeout > 5.0
    cycle = 2 * settings.pod_resources_timeout + settings.pod_resources_interval
    assert cycle < settings.pod_resources_max_age


def test_get_one_pod(kubelet: FakeKubelet, socket_path: str) -> None:
    client = PodResourcesClient(socket_path)
    try:
        pod = client.get(namespace="serving", pod="infer-7")
        assert pod.containers[0].dynamic_resources[0].claim_resources[0].device_name == "gpu-1"
    finally:
        client.close()


def test_unknown_attribution_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown pod attribution 'cri'"):
        pod_attribution("cri")


def test_resource_slices_are_watched(kube: FakeKubeAPI) -> None:
    """The node's slices are listed once, then followed: a changed slice and a deleted one
    show up without a relist; other nodes' slices never do (fieldSelector)."""
    from exporter import resourceslices

    watch = resourceslices.ResourceSliceWatch(resourceslices.api_client(), node=NODE, watch_timeout_s=5)
    try:
        wait_for(lambda: len(watch.devices()) == 5)
        assert watch.devices()[("gpu.nvidia.com", NODE, "gpu-1")] == podmap.DraDevice(GPU[1])
        assert watch.devices()[("gpu.nvidia.com", NODE, "gpu-3-mig-1g10gb-19-0")] == podmap.DraDevice(
            GPU[3], MIG_DRA, "1g.10gb")
        assert all(key[1] == NODE for key in watch.devices())
        changed = resource_slice(NODE, [gpu_device(0, GPU[0])])
        kube.apply("resourceslices", changed)
        wait_for(lambda: len(watch.devices()) == 1)
        kube.delete("resourceslices", changed["metadata"]["name"])
        wait_for(lambda: watch.devices() == {})
        lists = [r for r in kube.requests if "resourceslices" in r and "watch=" not in r]
        assert len(lists) == 1 and "fieldSelector=spec.nodeName%3Dgpu-node-1" in lists[0]
    finally:
        watch.close()


def test_slice_devices_reads_v1beta1_too() -> None:
    """resource.k8s.io/v1beta1 (what dcgm-exporter's informer reads) nests attributes under `basic`."""
    old = {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": NODE}, "devices": [
        {"name": "gpu-0", "basic": {"attributes": {"type": {"string": "gpu"}, "uuid": {"string": GPU[0]}}}},
        {"name": "weird", "basic": {"attributes": {"type": {"string": "vfio"}}}},
    ]}}
    assert podmap.slice_devices([old]) == {("gpu.nvidia.com", NODE, "gpu-0"): podmap.DraDevice(GPU[0])}


def test_stale_attribution_on_metrics(kubelet: FakeKubelet, socket_path: str) -> None:
    """Stopping kubelet: the error counter moves by gRPC code, and after the max age the
    pod labels go and the stale gauge says so; the timestamp stays at the last answer."""
    backend = NvmlBackend(nvml(), event_timeout_ms=20)
    app = ExporterApp(ExporterSettings(
        backend="nvml", listen="127.0.0.1:0", node_name=NODE, collect_interval=0.05,
        pod_attribution="kubelet", pod_resources_socket=socket_path, pod_resources_interval=0.05,
        pod_resources_max_age=1.0, pod_resources_backoff_cap=0.2), backend=backend)
    app.start()
    try:
        wait_for(lambda: pods_by_gpu(scrape(app)).get(GPU[0]) == [BASE["train"]])
        stamp = "gpufed_exporter_pod_attribution_last_success_timestamp_seconds"
        before = scrape(app)[stamp].samples[0].value
        kubelet.stop()
        wait_for(lambda: pods_by_gpu(scrape(app)).get(GPU[0]) == [{}])
        families = scrape(app)
        assert families["gpufed_exporter_pod_attribution_stale"].samples[0].value == 1.0
        errors = {s.labels["code"]: s.value
                  for s in families["gpufed_exporter_pod_attribution_errors"].samples}
        assert errors.get("UNAVAILABLE", 0) >= 1
        last = families[stamp].samples[0].value
        assert before <= last < time.time() - 0.5
    finally:
        app.stop()


def test_answers_over_grpcs_default_4_mib_are_read(kubelet: FakeKubelet, socket_path: str) -> None:
    """gRPC refuses answers over 4 MiB by default; the client takes 16 MiB (as dcgm-exporter's
    does), and past its limit the refresh fails as RESOURCE_EXHAUSTED, counted, never raised."""
    big = kubelet.answer.pod_resources.add(name="many-nics", namespace="net").containers.add(name="c")
    ids = [f"vf-{n:07d}-" + "x" * 40 for n in range(110_000)]
    big.devices.add(resource_name="example.com/vf", device_ids=ids)
    assert kubelet.answer.ByteSize() > 5 * 1024 * 1024
    attribution = KubeletPodAttribution(PodResourcesClient(socket_path), gpus=podmap.node_gpus(
        NvmlBackend(nvml(), event_timeout_ms=20).devices()), interval=60, start=False)
    try:
        assert attribution.refresh() and GPU[0] in attribution.labels()
    finally:
        attribution.close()
    small = KubeletPodAttribution(PodResourcesClient(socket_path, max_message_bytes=4 * 1024 * 1024),
                                  interval=60, start=False)
    try:
        assert not small.refresh()
        assert small.status().errors == {"RESOURCE_EXHAUSTED": 1}
    finally:
        small.close()
