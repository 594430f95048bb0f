"""Plain data the exporter passes between layers: devices, readings, XID events, snapshots.

Backends produce `GpuDevice` and `Reading` values; the collection loop folds them into an
immutable `Snapshot`; the exposition collector renders the latest snapshot on each scrape.
Nothing here does I/O, so every other layer can depend on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """Static identity of one GPU; read once at start, these become series labels."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str
    memory_total_mib: float = 0.0
    minor: int = -1  # /dev/nvidia<minor>; -1: unknown, taken as the index
    @property
    def device(self) -> str:
        """DCGM's `device` label: the /dev node name."""
        return f"nvidia{self.index}"


@dataclass(frozen=True, slots=True)
class MigSlice:
    """One MIG device as NVML sees it: its UUID, its parent GPU, GPU instance and profile."""

    uuid: str
    parent_uuid: str
    gpu_instance_id: int
    profile: str


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID reported by the driver; counted, never kept as a sticky gauge."""

    gpu: int
    code: int
    timestamp: float


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """GPU memory held by one process (the opt-in `process` family)."""

    pid: int
    used_memory_mib: float


@dataclass(frozen=True, slots=True)
class NvLinkReading:
    """One NVLink of one GPU (the opt-in `nvlink` family); None: the GPU does not say."""

    link: int
    up: bool
    tx_bytes: float | None = None
    rx_bytes: float | None = None
    crc_flit_errors: float | None = None
    crc_data_errors: float | None = None
    replay_errors: float | None = None
    recovery_errors: float | None = None


@dataclass(frozen=True, slots=True)
class InstanceReading:
    """Values of one MIG GPU instance of a GPU, for the readings NVML answers per instance.

    Only what NVML measures for the instance itself is here (memory through the MIG device
    handle, GPM through nvmlGpmMigSampleGet); the whole GPU's readings stay on the GPU's
    `Reading`, whose series carry no MIG labels. `profile` and `gpu_instance_id` become
    dcgm-exporter's `GPU_I_PROFILE` and `GPU_I_ID` labels."""

    gpu_instance_id: int
    profile: str
    values: Mapping[str, float]
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class Reading:
    """Values read for one GPU in one collection.

    `values` maps a metric name from `exporter.catalogue` to its value in the exposed
    unit; a metric the device does not support is simply absent, so its series is left
    out instead of failing the scrape.
    """

    gpu: int
    values: Mapping[str, float]
    processes: tuple[ProcessUsage, ...] = ()
    ok: bool = True
    links: tuple[NvLinkReading, ...] = ()
    instances: tuple[InstanceReading, ...] = ()


@dataclass(frozen=True, slots=True)
class XidTally:
    """Running XID count for one (gpu, code) with the time it was last seen."""

    count: int
    last_seen: float


@dataclass(frozen=True, slots=True)
class AttributionStatus:
    """How fresh the GPU -> pod map is (kubelet attribution), read into self-metrics.

    `stale`: the last good answer is older than the configured age, so pod labels are
    dropped instead of naming pods that may have left. `errors`: failed refreshes by gRPC
    status code name. `allocatable`: GPU resource name -> devices kubelet can allocate."""

    last_success: float | None = None
    stale: bool = False
    errors: Mapping[str, int] = field(default_factory=dict)
    allocatable: Mapping[str, int] = field(default_factory=dict)


PodLabels = Mapping[str, tuple[Mapping[str, str], ...]]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scrape serves; replaced whole, so scrapes never see a half update."""

    taken_at: float
    devices: tuple[GpuDevice, ...]
    readings: Mapping[int, Reading]
    xids: Mapping[tuple[int, int], XidTally] = field(default_factory=dict)
    last_xid: Mapping[int, int] = field(default_factory=dict)
    health: Mapping[int, bool] = field(default_factory=dict)
    pod_labels: PodLabels = field(default_factory=dict)
    driver_version: str = ""
    attribution: AttributionStatus | None = None


@dataclass(frozen=True, slots=True)
class CollectionStats:
    """Self-metrics of the collection loop, read by the collector at scrape time."""

    last_success: float | None = None
    last_duration: float = 0.0
    collections: int = 0
    errors: int = 0
    timeouts: int = 0
