"""GPU -> pod label sets from kubelet's pod-resources answer: pure, no gRPC, no Kubernetes.

Where it sits: `exporter.kubelet_podresources` fetches `List` from kubelet and hands the
pods here with what the node knows of its devices (NVML identity: index, minor, UUID and
MIG slices) and, with `--dra-resource-slices`, the node's ResourceSlices as indexed by
`slice_devices`. The answer is one tuple of label sets per GPU UUID; the exporter writes
every per-GPU series once per label set, so a GPU shared by several pods (time-slicing,
a shared ResourceClaim) yields one series per pod, as dcgm-exporter does.

How a container's device is found, following kubelet and NVIDIA's drivers:
- device plugin (`devices[]` of `nvidia.com/gpu`, `nvidia.com/gpu.shared` or
  `nvidia.com/mig-*`): a GPU UUID, `UUID::N` under time-slicing (`vgpu="N"` added), a MIG UUID (mapped to
  its parent GPU with `GPU_I_PROFILE`/`GPU_I_ID`, dcgm-exporter's MIG labels, which route
  the pod to that instance's series only), or an NVML
  index (`--device-id-strategy=index`), resolved through NVML's index;
- DRA (`dynamic_resources[].claim_resources[]` of driver `gpu.nvidia.com`): the
  (driver_name, pool_name, device_name) triplet, which kubelet's proto says identifies the
  device, resolved through the node's ResourceSlices (attributes `type`, `uuid`,
  `parentUUID`, `profile`, as NVIDIA's DRA kubelet plugin publishes them). The CDI device
  names (`k8s.gpu.nvidia.com/claim=<claim UID>-gpu-<minor>`) carry no UUID and are not
  read. Without a slice, the driver's canonical device name is the fallback: `gpu-<minor>`
  and `gpu-<minor>-mig-<profile>-<id>-<start>` name the GPU by its NVML minor number.
Labels follow dcgm-exporter (`namespace`, `pod`, `container`, `dra_claim_name`,
`dra_claim_namespace`, `dra_driver_name`, `dra_pool_name`, `dra_device_name`,
`dra_mig_profile`, `dra_mig_device_uuid`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.models import GpuDevice, MigSlice

DRA_GPU_DRIVER = "gpu.nvidia.com"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_UUID = r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
_GPU_UUID = re.compile(rf"^(GPU-{_UUID})(?:::(\d+))?$")
_MIG_UUID = re.compile(rf"^(MIG-{_UUID})(?:::(\d+))?$")
_INDEX = re.compile(r"^(\d+)(?:::(\d+))?$")
_DRA_GPU = re.compile(r"^gpu-(\d+)$")
_DRA_MIG = re.compile(r"^gpu-(\d+)-mig-")

Labels = dict[str, str]
SliceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """NVML identity of the node's GPUs: index -> UUID, minor -> UUID, MIG UUID -> slice."""

    by_index: Mapping[int, str] = field(default_factory=dict)
    by_minor: Mapping[int, str] = field(default_factory=dict)
    migs: Mapping[str, MigSlice] = field(default_factory=dict)


def node_gpus(devices: Iterable[GpuDevice], migs: Iterable[MigSlice] = ()) -> NodeGpus:
    """The NodeGpus of a backend's devices and MIG slices."""
    devices = tuple(devices)
    return NodeGpus(by_index={d.index: d.uuid for d in devices},
                    by_minor={(d.index if d.minor < 0 else d.minor): d.uuid for d in devices},
                    migs={m.uuid: m for m in migs})


@dataclass(frozen=True, slots=True)
class DraDevice:
    """What a ResourceSlice says of one device: the GPU it is (the parent, for MIG)."""

    gpu_uuid: str
    mig_uuid: str = ""
    profile: str = ""


def _attr(attributes: Mapping[str, Any], name: str) -> str:
    """A string attribute, unqualified or qualified with the driver's domain."""
    for key in (name, f"{DRA_GPU_DRIVER}/{name}"):
        value = attributes.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str):
            return str(value["string"])
    return ""


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> dict[SliceKey, DraDevice]:
    """(driver, pool, device) -> DraDevice from ResourceSlice objects (resource.k8s.io v1,
    where attributes sit on the device, or v1beta1, where they sit under `basic`)."""
    out: dict[SliceKey, DraDevice] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or (device.get("basic") or {}).get("attributes") or {}
            kind = _attr(attributes, "type")
            if kind == "gpu" and _attr(attributes, "uuid"):
                found = DraDevice(_attr(attributes, "uuid"))
            elif kind == "mig" and _attr(attributes, "parentUUID"):
                found = DraDevice(_attr(attributes, "parentUUID"), _attr(attributes, "uuid"),
                                  _attr(attributes, "profile"))
            else:
                continue
            out[(driver, pool, str(device.get("name", "")))] = found
    return out


def _plugin_device(device_id: str, gpus: NodeGpus) -> tuple[str, Labels] | None:
    """GPU UUID and MIG labels of one device-plugin id; None when it names no GPU here.

    A time-sliced replica (`UUID::N`) adds `vgpu="N"`, the label dcgm-exporter's sharing
    mapper (`--kubernetes-virtual-gpus`, tag 4.5.3-4.8.2) puts on each pod's copy."""
    if found := _GPU_UUID.match(device_id):
        return found.group(1), _vgpu(found)
    if found := _MIG_UUID.match(device_id):
        mig = gpus.migs.get(found.group(1))
        if mig is None:
            return None
        return mig.parent_uuid, {"GPU_I_PROFILE": mig.profile, "GPU_I_ID": str(mig.gpu_instance_id),
                                 **_vgpu(found)}
    if (found := _INDEX.match(device_id)) and int(found.group(1)) in gpus.by_index:
        return gpus.by_index[int(found.group(1))], _vgpu(found)
    return None


def _instance(mig: MigSlice | None, parent: str) -> Labels:
    """dcgm-exporter's MIG labels of a DRA MIG device NVML knows: the exporter writes the
    pod on that instance's series only (not on the whole GPU's)."""
    if mig is None or mig.parent_uuid != parent:
        return {}
    return {"GPU_I_PROFILE": mig.profile, "GPU_I_ID": str(mig.gpu_instance_id)}


def _vgpu(found: re.Match[str]) -> Labels:
    return {"vgpu": found.group(2)} if found.group(2) is not None else {}


def _dra_device(key: SliceKey, gpus: NodeGpus, slices: Mapping[SliceKey, DraDevice]) -> DraDevice | None:
    if key in slices:
        return slices[key]
    name = key[2]
    if found := (_DRA_GPU.match(name) or _DRA_MIG.match(name)):
        uuid = gpus.by_minor.get(int(found.group(1)))
        return DraDevice(uuid) if uuid else None
    return None


def gpu_labels(pods: Iterable[Any], *, gpus: NodeGpus,
               slices: Mapping[SliceKey, DraDevice] | None = None) -> dict[str, tuple[Labels, ...]]:
    """GPU UUID -> one label set per container holding it, sorted, without duplicates."""
    found: dict[str, dict[tuple[tuple[str, str], ...], Labels]] = {}
    slices = slices or {}

    def add(uuid: str, labels: Labels) -> None:
        found.setdefault(uuid, {})[tuple(sorted(labels.items()))] = labels

    for pod in pods:
        for container in pod.containers:
            base = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
            for devices in container.devices:
                name = devices.resource_name
                if name not in GPU_RESOURCES and not name.startswith(MIG_RESOURCE_PREFIX):
                    continue
                for device_id in devices.device_ids:
                    if (hit := _plugin_device(device_id, gpus)) is not None:
                        add(hit[0], {**base, **hit[1]})
            for claim in container.dynamic_resources:
                for resource in claim.claim_resources:
                    if resource.driver_name != DRA_GPU_DRIVER:
                        continue
                    key = (resource.driver_name, resource.pool_name, resource.device_name)
                    device = _dra_device(key, gpus, slices)
                    if device is None:
                        continue
                    labels = {**base, "dra_claim_name": claim.claim_name,
                              "dra_claim_namespace": claim.claim_namespace or pod.namespace,
                              "dra_driver_name": key[0], "dra_pool_name": key[1], "dra_device_name": key[2]}
                    if device.mig_uuid or device.profile:
                        labels |= {"dra_mig_profile": device.profile, "dra_mig_device_uuid": device.mig_uuid}
                        labels |= _instance(gpus.migs.get(device.mig_uuid), device.gpu_uuid)
                    add(device.gpu_uuid, labels)
    return {uuid: tuple(sets[k] for k in sorted(sets)) for uuid, sets in sorted(found.items())}


def allocatable_gpus(response: Any) -> dict[str, int]:
    """Resource name -> devices kubelet can allocate (GetAllocatableResources), GPU resources only."""
    out: dict[str, int] = {}
    for devices in response.devices:
        name = devices.resource_name
        if name in GPU_RESOURCES or name.startswith(MIG_RESOURCE_PREFIX):
            out[name] = out.get(name, 0) + len(devices.device_ids)
    return dict(sorted(out.items()))
