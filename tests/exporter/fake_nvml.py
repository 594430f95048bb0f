"""A stand-in for the `pynvml` module (nvidia-ml-py) with scriptable GPUs.

Mirrors the calls `exporter.nvml_backend` makes, with pynvml's constant values and error
shape (`NVMLError.value`), and counts calls so tests can assert that NVML is initialised
once, handles are cached and field values are batched. A GPU can mark any call or field
"not supported", be "lost", and receive XID events.
"""

from __future__ import annotations

import ctypes
import queue
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml  # the real binding's GPM structures; importing it loads no library

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_FUNCTION_NOT_FOUND = 13  # pynvml: a symbol the driver's libnvidia-ml lacks
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_FOUND = 6
NVML_GRID_LICENSE_FEATURE_CODE_VGPU = 1
NVML_DEVICE_MIG_ENABLE = 1
NVML_ERROR_UNKNOWN = 999
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY = 161
NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY = 162
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3
NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4
NVML_FI_DEV_ECC_SBE_AGG_TOTAL = 5
NVML_FI_DEV_ECC_DBE_AGG_TOTAL = 6
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94
NVML_FI_DEV_POWER_INSTANT = 186
nvmlEventTypeXidCriticalError = 0x8
NVML_GPM_METRIC_GRAPHICS_UTIL = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
NVML_GPM_METRIC_SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL
NVML_GPM_METRIC_ANY_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
NVML_GPM_METRIC_DRAM_BW_UTIL = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
NVML_GPM_METRIC_PCIE_TX_PER_SEC = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
NVML_GPM_METRIC_PCIE_RX_PER_SEC = pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC
NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
NVML_GPM_SUPPORT_VERSION = pynvml.NVML_GPM_SUPPORT_VERSION
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
MIB = 1024 * 1024


class NVMLError(Exception):
    value = 999

    def __init__(self, value: int | None = None) -> None:
        if value is not None:
            self.value = value
        super().__init__(f"NVML error {self.value}")


class NVMLError_NotSupported(NVMLError):
    value = NVML_ERROR_NOT_SUPPORTED


class NVMLError_Timeout(NVMLError):
    value = NVML_ERROR_TIMEOUT


class NVMLError_GpuIsLost(NVMLError):
    value = NVML_ERROR_GPU_IS_LOST


class NVMLError_DriverNotLoaded(NVMLError):
    value = NVML_ERROR_DRIVER_NOT_LOADED


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: str = "00000000:18:00.0"
    memory_total: int = 81559 * MIB
    memory_used: int = 40000 * MIB
    memory_reserved: int = 0
    vgpu_licensed: int = 1  # a vGPU guest whose licence is active
    grid_licensing: bool = True  # False: the driver answers, but licensing is not supported
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failed
    util: int = 70
    mem_util: int = 40
    temp: int = 55
    memory_temp: int = 60
    power_mw: int = 450_000
    energy_mj: int = 123_456_789
    sm_clock: int = 1980
    mem_clock: int = 2619
    pcie_kb_s: int = 1000
    gpm: bool = True  # nvmlGpmQueryDeviceSupport's isSupportedDevice (Hopper and later)
    gpm_pcie_mib_s: tuple[float, float] = (1500.5, 2500.25)  # GPM's PCIe TX, RX in MiB/s
    nvlinks: int = 0  # links that answer nvmlDeviceGetNvLinkState; 0: every link NotSupported
    nvlinks_down: set[int] = field(default_factory=set)
    nvlink_tx_kib: int = 5_000_000
    unsupported: set[str] = field(default_factory=set)  # method names or NVML_FI_* names
    failing: dict[str, int] = field(default_factory=dict)  # method name -> NVML error value it raises
    lost: bool = False
    minor: int = -1  # /dev/nvidia<minor>; -1: the binding has no nvmlDeviceGetMinorNumber answer
    migs: list[FakeMig] = field(default_factory=list)  # MIG mode is on when there are any


@dataclass
class FakeMig:
    """A MIG device handle: NVML answers its UUID, name, GPU instance id and its own memory;
    GPM answers for its GPU instance (nvmlGpmMigSampleGet on the parent with the id)."""

    uuid: str
    gpu_instance_id: int
    profile: str = "1g.10gb"
    parent: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 9856 * MIB
    memory_used: int = 1234 * MIB
    memory_reserved: int = 0
    util: int = 12  # GPM graphics activity of the instance, percent
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.parent} MIG {self.profile}"


@dataclass
class _GpmSample:
    """What NVML copied into one sample: the device (and GPU instance) it was taken on."""

    uuid: str = ""
    gpu_instance_id: int | None = None
    taken: int = 0  # order of sampling, so a metric between two samples needs sample1 first


# What an H100 (driver 580.159.04) answered per field (docs/measured/h100/probe-run2.json):
# temperature, power and the replay counter come as unsigned int, ECC and energy as ull.
_FIELD_TYPES = {82: NVML_VALUE_TYPE_UNSIGNED_INT, 94: NVML_VALUE_TYPE_UNSIGNED_INT,
                186: NVML_VALUE_TYPE_UNSIGNED_INT}
_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

_FIELD_NAMES = {
    3: "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", 4: "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    5: "NVML_FI_DEV_ECC_SBE_AGG_TOTAL", 6: "NVML_FI_DEV_ECC_DBE_AGG_TOTAL", 82: "NVML_FI_DEV_MEMORY_TEMP",
    83: "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 94: "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    186: "NVML_FI_DEV_POWER_INSTANT", 138: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    38: "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 45: "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    52: "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 59: "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    139: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 161: "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
    162: "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
}


ALL_LINKS = 0xFFFFFFFF
nvmlMemory_v2 = 33554472  # pynvml's value: (sizeof(c_nvmlMemory_v2_t) | 2 << 24)


class FakeNvml:
    """Pass an instance where the backend expects the `pynvml` module."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    # pynvml's own ctypes structures, so the backend fills them as it must fill the real ones
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    nvmlMemory_v2 = nvmlMemory_v2

    def __init__(self, gpus: list[FakeGpu], *, driver: str = "550.54.15", init_error: bool = False) -> None:
        self.gpus = gpus
        self.driver = driver
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self.events: queue.Queue[Any] = queue.Queue()
        self.registered: list[tuple[str, int]] = []
        self.freed_samples = 0
        self._samples: dict[int, tuple[Any, _GpmSample]] = {}  # address -> (buffer, what it holds)
        self._sampled = 0
        globals_ = {k: v for k, v in globals().items() if k.startswith(("NVML_", "nvmlEventType"))}
        self.__dict__.update(globals_)

    def _gpu(self, handle: Any, call: str) -> Any:
        self.calls[call] += 1
        if handle.lost:
            raise NVMLError_GpuIsLost()
        if call in handle.unsupported:
            raise NVMLError_NotSupported()
        if call in handle.failing:
            raise NVMLError(handle.failing[call])
        return handle

    # library
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error:
            raise NVMLError_DriverNotLoaded()

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        return self.gpus[index]

    # identity
    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:
        return handle.uuid.encode()  # older bindings return bytes

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(busId=handle.bus_id.encode())

    # readings
    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, ids: list[int]) -> list[SimpleNamespace]:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = {3: 2, 4: 0, 5: 7, 6: 1, 82: gpu.memory_temp, 83: gpu.energy_mj, 94: 3, 186: gpu.power_mw}
        out = []
        for requested in ids:
            # pynvml takes a field id, or (field id, scopeId) for per-link NVLink fields.
            field_id, link = requested if isinstance(requested, tuple) else (requested, None)
            ret = NVML_ERROR_NOT_SUPPORTED if _FIELD_NAMES[field_id] in gpu.unsupported else NVML_SUCCESS
            nvlink_field = field_id in (38, 45, 52, 59, 138, 139, 161, 162)
            if nvlink_field and not gpu.nvlinks:
                # a GPU without NVLink. Measured on an H100 alone in a pass-through VM
                # (docs/measured-h100.md, 2026-11-26): the call succeeds and every per-link
                # slot (138/139/161/162, links 0-17) answers NotSupported (3). The all-links
                # slots (scopeId UINT_MAX, 38-59) were not probed raw; the exporter wrote no
                # series and logged nothing, which this answer reproduces
                ret = NVML_ERROR_NOT_SUPPORTED
            kind = _FIELD_TYPES.get(field_id, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
            # A union: only the member of this value type holds the answer.
            value = SimpleNamespace(**{member: 0 for member in _MEMBERS})
            if link == ALL_LINKS or (link is not None and field_id in (38, 45, 52, 59)):
                # scopeId UINT_MAX: the sum over the GPU's links, as DCGM reads field 449
                links = range(gpu.nvlinks)
                totals = {138: sum(gpu.nvlink_tx_kib * (i + 1) for i in links),
                          139: sum(gpu.nvlink_tx_kib * (i + 1) // 2 for i in links),
                          38: sum(10 + i for i in links), 45: sum(links), 52: sum(links), 59: 0}
                setattr(value, _MEMBERS[kind], totals[field_id])
            elif link is not None:
                per_link = {138: gpu.nvlink_tx_kib * (link + 1), 139: gpu.nvlink_tx_kib * (link + 1) // 2,
                            161: link, 162: 0}
                setattr(value, _MEMBERS[kind], per_link[field_id])
            else:
                setattr(value, _MEMBERS[kind], values[field_id])
            out.append(SimpleNamespace(fieldId=field_id, nvmlReturn=ret, valueType=kind, value=value))
        return out

    @staticmethod
    def _no_such_link(gpu: FakeGpu, link: int) -> None:
        """A GPU without NVLink answers NotSupported for every link, as the H100 of the
        2026-11-26 run did for links 0-35 (state, error counters, version, capability, remote
        PCI); past the links of a GPU that has some, NVML answers InvalidArgument
        (NVIDIA/TensorRT-LLM#17060, GB200)."""
        if not gpu.nvlinks:
            raise NVMLError_NotSupported()
        if link >= gpu.nvlinks:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetNvLinkState(self, handle: FakeGpu, link: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNvLinkState")
        self._no_such_link(gpu, link)
        return 0 if link in gpu.nvlinks_down else NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: FakeGpu, link: int, counter: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNvLinkErrorCounter")
        self._no_such_link(gpu, link)
        return {NVML_NVLINK_ERROR_DL_CRC_FLIT: 10 + link, NVML_NVLINK_ERROR_DL_CRC_DATA: link}[counter]

    def nvmlDeviceGetMinorNumber(self, handle: FakeGpu) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMinorNumber")
        if gpu.minor < 0:
            raise NVMLError_NotSupported()
        return gpu.minor

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> tuple[int, int]:
        mode = 1 if self._gpu(handle, "nvmlDeviceGetMigMode").migs else 0
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, index: int) -> FakeMig:
        migs = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex").migs
        if index >= len(migs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return migs[index]

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeMig) -> int:
        return handle.gpu_instance_id

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTemperature").temp

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=gpu.util, memory=gpu.mem_util)

    def nvmlDeviceGetEncoderUtilization(self, handle: FakeGpu) -> list[int]:
        self._gpu(handle, "nvmlDeviceGetEncoderUtilization")
        return [0, 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: FakeGpu) -> list[int]:
        self._gpu(handle, "nvmlDeviceGetDecoderUtilization")
        return [5, 167000]

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu | FakeMig,
                                version: int | None = None) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        if version == nvmlMemory_v2:  # v2 adds `reserved` (and `used` leaves it out)
            return SimpleNamespace(total=gpu.memory_total, used=gpu.memory_used, reserved=gpu.memory_reserved,
                                   free=gpu.memory_total - gpu.memory_used - gpu.memory_reserved)
        return SimpleNamespace(total=gpu.memory_total, used=gpu.memory_used,
                               free=gpu.memory_total - gpu.memory_used)

    def nvmlDeviceGetGridLicensableFeatures(self, handle: FakeGpu) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetGridLicensableFeatures")
        feature = SimpleNamespace(featureCode=NVML_GRID_LICENSE_FEATURE_CODE_VGPU,
                                  featureState=gpu.vgpu_licensed)
        return SimpleNamespace(isGridLicenseSupported=int(gpu.grid_licensing), licensableFeaturesCount=1,
                               gridLicensableFeatures=[feature])

    def nvmlDeviceGetRemappedRows(self, handle: FakeGpu) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRemappedRows")
        return gpu.remapped_rows

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, clock: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        return gpu.sm_clock if clock == NVML_CLOCK_SM else gpu.mem_clock

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetPcieThroughput(self, handle: FakeGpu, counter: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieThroughput").pcie_kb_s

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=4242, usedGpuMemory=2048 * MIB),
                SimpleNamespace(pid=4243, usedGpuMemory=None)]

    # GPM, as pynvml exposes it (nvidia-ml-py 13.615.71): a support structure, samples that are
    # ctypes pointers to an opaque buffer, nvmlGpmSampleGet / nvmlGpmMigSampleGet returning the
    # sample, and nvmlGpmMetricsGet filling the caller's c_nvmlGpmMetricsGet_t in place
    def nvmlGpmQueryDeviceSupport(self, handle: FakeGpu) -> Any:
        gpu = self._gpu(handle, "nvmlGpmQueryDeviceSupport")
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self.calls["nvmlGpmSampleAlloc"] += 1
        buffer = pynvml.struct_c_nvmlGpmSample_t()
        sample = pynvml.c_nvmlGpmSample_t(buffer)
        self._samples[ctypes.addressof(buffer)] = (buffer, _GpmSample())
        return sample

    def _sample(self, sample: Any) -> _GpmSample:
        if not isinstance(sample, pynvml.c_nvmlGpmSample_t) or not sample:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        found = self._samples.get(ctypes.addressof(sample.contents))
        if found is None:  # freed, or never allocated here
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return found[1]

    def _take(self, sample: Any, uuid: str, gpu_instance_id: int | None) -> Any:
        held = self._sample(sample)
        self._sampled += 1
        held.uuid, held.gpu_instance_id, held.taken = uuid, gpu_instance_id, self._sampled
        return sample

    def nvmlGpmSampleGet(self, handle: FakeGpu, sample: Any) -> Any:
        gpu = self._gpu(handle, "nvmlGpmSampleGet")
        if not gpu.gpm:
            raise NVMLError_NotSupported()
        return self._take(sample, gpu.uuid, None)

    def nvmlGpmMigSampleGet(self, handle: FakeGpu, gpuInstanceId: int, sample: Any) -> Any:
        gpu = self._gpu(handle, "nvmlGpmMigSampleGet")
        if not gpu.gpm:
            raise NVMLError_NotSupported()
        if not any(mig.gpu_instance_id == gpuInstanceId for mig in gpu.migs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._take(sample, gpu.uuid, gpuInstanceId)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._sample(sample)
        del self._samples[ctypes.addressof(sample.contents)]
        self.freed_samples += 1

    @property
    def live_samples(self) -> int:
        """Samples allocated and not freed (the backend keeps one per GPU and instance)."""
        return len(self._samples)

    def _gpm_answers(self, held: _GpmSample) -> dict[int, float]:
        gpu = next(g for g in self.gpus if g.uuid == held.uuid)
        if held.gpu_instance_id is None:
            return {NVML_GPM_METRIC_GRAPHICS_UTIL: float(gpu.util), NVML_GPM_METRIC_SM_UTIL: 63.0,
                    NVML_GPM_METRIC_ANY_TENSOR_UTIL: 40.0, NVML_GPM_METRIC_DRAM_BW_UTIL: 30.0,
                    NVML_GPM_METRIC_PCIE_TX_PER_SEC: gpu.gpm_pcie_mib_s[0],
                    NVML_GPM_METRIC_PCIE_RX_PER_SEC: gpu.gpm_pcie_mib_s[1]}
        mig = next(m for m in gpu.migs if m.gpu_instance_id == held.gpu_instance_id)
        return {NVML_GPM_METRIC_GRAPHICS_UTIL: float(mig.util), NVML_GPM_METRIC_SM_UTIL: mig.util * 0.75,
                NVML_GPM_METRIC_ANY_TENSOR_UTIL: mig.util * 0.5,
                NVML_GPM_METRIC_DRAM_BW_UTIL: mig.util * 0.25}

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self.calls["nvmlGpmMetricsGet"] += 1
        if not isinstance(request, pynvml.c_nvmlGpmMetricsGet_t):
            raise TypeError("nvmlGpmMetricsGet takes a c_nvmlGpmMetricsGet_t")
        if request.version != NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first, second = self._sample(request.sample1), self._sample(request.sample2)
        same = (first.uuid, first.gpu_instance_id) == (second.uuid, second.gpu_instance_id)
        if not same or not 0 < first.taken < second.taken or request.numMetrics > len(request.metrics):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        answers = self._gpm_answers(second)
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            found = answers.get(metric.metricId)
            metric.nvmlReturn = NVML_SUCCESS if found is not None else NVML_ERROR_NOT_SUPPORTED
            metric.value = found if found is not None else 0.0
        return request

    # events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, types: int, event_set: str) -> None:
        self._gpu(handle, "nvmlDeviceRegisterEvents")
        self.registered.append((handle.uuid, types))

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout() from None

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.calls["nvmlEventSetFree"] += 1

    def inject_xid(self, index: int, code: int) -> None:
        """An XID on GPU `index`; the handle is a fresh object, as ctypes gives."""
        device = SimpleNamespace(uuid=self.gpus[index].uuid)
        event = SimpleNamespace(device=device, eventType=nvmlEventTypeXidCriticalError, eventData=code)
        self.events.put(event)
