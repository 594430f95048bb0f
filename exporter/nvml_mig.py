"""MIG GPU instances through nvidia-ml-py: which there are, and what NVML measures for each.

Where it sits: `exporter.nvml_backend` finds the MIG devices once at start (a MIG
reconfiguration needs a restart, as before) and, every collection, asks `read` for each
instance's values; pod attribution gets the same devices as `MigSlice`s.

What is read per instance, following what DCGM 4.6.0 answers for a GPU-instance entity
(entity levels in `dcgm_fields.cpp`, tag v4.6.0): the framebuffer through the MIG device's
own handle (`nvmlDeviceGetMemoryInfo`, v2 where the binding has it, as
`DcgmCacheManager.cpp` reads `DCGM_FI_DEV_FB_{FREE,USED,RESERVED}` for a GPU instance), and
the GPM ratios through `nvmlGpmMigSampleGet` (`exporter.nvml_gpm`). Everything else
(clocks, temperatures, power, energy, ECC, PCIe, NVLink, XIDs) is a property of the whole
GPU: it stays on the GPU's series, which carry no MIG labels, so a MIG pod's series are
only the instance's own values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from exporter.models import GpuDevice, InstanceReading, MigSlice
from exporter.nvml_gpm import GpmReader

MIB = 1024 * 1024


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device: its identity, its parent GPU's index and NVML's handle for it."""

    slice: MigSlice
    gpu: int
    handle: Any


def find(nvml: Any, devices: Sequence[GpuDevice], handles: Sequence[Any], *,
         optional: Callable[[Callable[[], Any]], Any]) -> tuple[MigDevice, ...]:
    """The MIG devices of every MIG-enabled GPU. The profile is the part of the MIG device's
    NVML name after "MIG " ("1g.10gb"), as dcgm-exporter's `GPU_I_PROFILE` reads."""
    if not hasattr(nvml, "nvmlDeviceGetMigMode"):
        return ()
    out = []
    for device, handle in zip(devices, handles, strict=True):
        mode = optional(partial(nvml.nvmlDeviceGetMigMode, handle))
        if not mode or mode[0] != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            continue
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:
                continue  # an empty slot answers NotFound
            name = _text(nvml.nvmlDeviceGetName(mig))
            found = MigSlice(uuid=_text(nvml.nvmlDeviceGetUUID(mig)), parent_uuid=device.uuid,
                             gpu_instance_id=int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
                             profile=name.split("MIG ", 1)[-1])
            out.append(MigDevice(found, device.index, mig))
    return tuple(out)


def read(nvml: Any, mig: MigDevice, parent: Any, *, gpm: GpmReader | None,
         memory: Callable[[Any], Any] | None,
         optional: Callable[[Callable[[], Any]], Any]) -> InstanceReading:
    """One instance's values; what NVML does not answer for it is left out. `gpm` is None
    when the gpm family is off; `memory` reads one handle's memory info (v2 where it can),
    None when the core family is off."""
    values: dict[str, float] = {}
    mem = None
    if memory is not None:
        try:
            mem = optional(partial(memory, mig.handle))
        except nvml.NVMLError:
            mem = None  # the instance was destroyed under us: no values this collection
    if mem is not None:
        values["DCGM_FI_DEV_FB_USED"] = float(mem.used // MIB)
        values["DCGM_FI_DEV_FB_FREE"] = float(mem.free // MIB)
        if hasattr(mem, "reserved"):
            values["DCGM_FI_DEV_FB_RESERVED"] = float(mem.reserved // MIB)
    if gpm is not None:
        values.update(gpm.instance(mig.gpu, parent, mig.slice.gpu_instance_id))
    return InstanceReading(mig.slice.gpu_instance_id, mig.slice.profile, values, uuid=mig.slice.uuid)
