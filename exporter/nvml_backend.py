"""GPU readings from NVML through nvidia-ml-py (module `pynvml`), behind `GpuBackend`.

Why it is shaped like this: dcgm-exporter's pains came from doing work per scrape. Here
NVML is initialised once, device handles are cached, the cheap scalar fields are read in
one `nvmlDeviceGetFieldValues` call per GPU, and XIDs arrive on an event thread
(`nvmlEventSetWait`) instead of being polled into a sticky gauge. An answer of "not
supported" leaves that series out; any other NVML error marks that GPU's reading failed
(health 0) without failing the others, except in the opt-in `nvlink` family, where an
error leaves only that link's series out (`exporter.nvml_nvlink`). GPM values (and, on a GPU
with GPM, the PCIe rates) come from `exporter.nvml_gpm`; MIG instances from
`exporter.nvml_mig`, each with its own values. The nvml module is a constructor argument
(default `import pynvml`), so tests hand in `tests/exporter/fake_nvml.py`. Measured on an
H100 in docs/measured-h100.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from exporter import nvml_gpm, nvml_mig
from exporter.errors import BackendError
from exporter.models import GpuDevice, MigSlice, ProcessUsage, Reading, XidEvent
from exporter.nvml_nvlink import VALUE_MEMBERS, NvLinkReader

log = logging.getLogger(__name__)
MIB = 1024 * 1024

# NVML field id (pynvml constant name) -> (metric, multiplier to the DCGM unit).
# On an H100 the energy field costs ~3 ms of driver CPU, the other seven ~0.15 ms together.
FIELDS: dict[str, dict[str, tuple[str, float]]] = {
    "core": {
        "NVML_FI_DEV_MEMORY_TEMP": ("DCGM_FI_DEV_MEMORY_TEMP", 1.0),
        "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1.0),
        "NVML_FI_DEV_PCIE_REPLAY_COUNTER": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0),
        "NVML_FI_DEV_POWER_INSTANT": ("DCGM_FI_DEV_POWER_USAGE", 0.001),
    },
    "ecc": {
        "NVML_FI_DEV_ECC_SBE_VOL_TOTAL": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 1.0),
        "NVML_FI_DEV_ECC_DBE_VOL_TOTAL": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0),
        "NVML_FI_DEV_ECC_SBE_AGG_TOTAL": ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 1.0),
        "NVML_FI_DEV_ECC_DBE_AGG_TOTAL": ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1.0),
    },
}
KIB = 1024.0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlBackend:
    """Real GPUs. Construct once per process; `close()` stops the event thread."""

    def __init__(
        self,
        nvml: Any = None,
        *,
        event_timeout_ms: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if nvml is None:
            import pynvml  # nvidia-ml-py's official binding

            nvml = pynvml
        self._nvml: Any = nvml
        self._clock = clock
        try:
            nvml.nvmlInit()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            self._devices = tuple(self._describe(i, h) for i, h in enumerate(self._handles))
            self._driver = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as exc:
            raise BackendError(
                f"NVML initialisation failed: {exc} (no NVIDIA driver here? try --backend simulated)"
            ) from exc
        self._events: list[XidEvent] = []
        self._events_lock = threading.Lock()
        self._gpm = nvml_gpm.GpmReader(nvml, optional=self._optional)
        try:
            self._migs = nvml_mig.find(nvml, self._devices, self._handles, optional=self._optional)
        except nvml.NVMLError as exc:  # MIG series are lost, the GPUs' own are not
            log.warning("nvml mig devices not read error=%r", str(exc))
            self._migs = ()
        self._nvlink = NvLinkReader(nvml, clock=clock, unsupported=self._unsupported)
        self._stop = threading.Event()
        self._event_timeout_ms = event_timeout_ms
        self._thread = threading.Thread(target=self._watch_xids, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def _describe(self, index: int, handle: Any) -> GpuDevice:
        nvml = self._nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return GpuDevice(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            model=_text(nvml.nvmlDeviceGetName(handle)),
            pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            memory_total_mib=memory.total / MIB,
            minor=self._minor(handle),
        )

    def _minor(self, handle: Any) -> int:
        """/dev/nvidia<minor>: NVIDIA's DRA driver names its devices `gpu-<minor>`."""
        call: Callable[[Any], Any] | None = getattr(self._nvml, "nvmlDeviceGetMinorNumber", None)
        minor = None if call is None else self._optional(partial(call, handle))
        return -1 if minor is None else int(minor)

    def mig_slices(self) -> tuple[MigSlice, ...]:
        """The MIG devices of every MIG-enabled GPU, found at start (`exporter.nvml_mig`)."""
        return tuple(mig.slice for mig in self._migs)

    def devices(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def driver_version(self) -> str:
        return self._driver

    def _unsupported(self, exc: Exception) -> bool:
        nvml = self._nvml
        return getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED

    def _optional(self, call: Callable[[], Any]) -> Any:
        """The call's answer, or None when the GPU says "not supported"."""
        try:
            return call()
        except self._nvml.NVMLError as exc:
            if self._unsupported(exc):
                return None
            raise

    def read(self, families: Iterable[str]) -> dict[int, Reading]:
        wanted = set(families)
        readings = {}
        for index, handle in enumerate(self._handles):
            try:
                readings[index] = self._read_one(index, handle, wanted)
            except self._nvml.NVMLError as exc:
                log.warning("nvml read failed gpu=%d error=%r", index, str(exc))
                readings[index] = Reading(index, {}, ok=False)
        if readings and not any(r.ok for r in readings.values()):
            raise BackendError("NVML read failed on every GPU")
        return readings

    def _read_one(self, index: int, handle: Any, wanted: set[str]) -> Reading:
        nvml, opt = self._nvml, self._optional
        values: dict[str, float] = {}
        fields = {k: v for fam in ("core", "ecc") if fam in wanted for k, v in FIELDS[fam].items()}
        if fields:
            ids = [getattr(nvml, name) for name in fields]
            for name, fv in zip(fields, nvml.nvmlDeviceGetFieldValues(handle, ids), strict=True):
                if fv.nvmlReturn == nvml.NVML_SUCCESS:
                    metric, scale = fields[name]
                    values[metric] = float(getattr(fv.value, VALUE_MEMBERS[fv.valueType])) * scale
        if "core" in wanted or "hami" in wanted:
            self._read_core(handle, values)
        if "gpm" in wanted:
            values.update(self._gpm.gpu(index, handle))
        if "pcie" in wanted and not ("gpm" in wanted and self._gpm.supported(index, handle)):
            # NVML's blocking call only where GPM does not fill them (a GPU without GPM)
            for direction in ("TX", "RX"):
                counter = getattr(nvml, f"NVML_PCIE_UTIL_{direction}_BYTES")
                kb_per_s = opt(partial(nvml.nvmlDeviceGetPcieThroughput, handle, counter))
                if kb_per_s is not None:
                    # NVML gives a 20 ms rate in KB/s (1024 bytes, as nvml.h counts KB):
                    # dcgm-exporter's DCGM_FI_PROF_PCIE_*_BYTES is that rate in B/s. DCGM's
                    # fields 200/201 (DCGM_FI_DEV_PCIE_{TX,RX}_THROUGHPUT) are not written:
                    # DCGM's cache manager answers NOT_SUPPORTED for them (2.1.4 to 4.6.0),
                    # so no DCGM user has ever seen a value there (issue 42).
                    values[f"DCGM_FI_PROF_PCIE_{direction}_BYTES"] = float(kb_per_s) * KIB
        if "ecc" in wanted:
            values.update(self._read_row_remap(handle))
        if "nvlink_gpu" in wanted:
            values.update(self._nvlink.gpu_totals(index, handle))
        links = self._nvlink.links(index, handle) if "nvlink" in wanted else ()
        processes: tuple[ProcessUsage, ...] = ()
        if "process" in wanted:
            procs = opt(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []
            processes = tuple(
                ProcessUsage(int(p.pid), (p.usedGpuMemory or 0) / MIB) for p in procs
            )
        instances = tuple(
            nvml_mig.read(nvml, mig, handle, gpm=self._gpm if "gpm" in wanted else None,
                          memory=self._memory if "core" in wanted else None, optional=opt)
            for mig in self._migs if mig.gpu == index
        ) if "core" in wanted or "gpm" in wanted else ()
        return Reading(index, values, processes, links=links, instances=instances)

    def _read_row_remap(self, handle: Any) -> dict[str, float]:
        """Row remapping (Ampere+): nvmlDeviceGetRemappedRows -> (correctable rows,
        uncorrectable rows, remap pending, remap failed), DCGM fields 393-396."""
        rows = self._optional(lambda: self._nvml.nvmlDeviceGetRemappedRows(handle))
        if rows is None:
            return {}
        correctable, uncorrectable, pending, failed = rows
        return {
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": float(correctable),
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": float(uncorrectable),
            "DCGM_FI_DEV_ROW_REMAP_PENDING": 1.0 if pending else 0.0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1.0 if failed else 0.0,
        }

    def _read_core(self, handle: Any, values: dict[str, float]) -> None:
        nvml, opt = self._nvml, self._optional
        temp = opt(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        util = opt(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        enc = opt(lambda: nvml.nvmlDeviceGetEncoderUtilization(handle))
        dec = opt(lambda: nvml.nvmlDeviceGetDecoderUtilization(handle))
        mem = opt(lambda: self._memory(handle))
        sm = opt(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        memclk = opt(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))
        pairs: list[tuple[str, Any]] = [
            ("DCGM_FI_DEV_GPU_TEMP", temp),
            ("DCGM_FI_DEV_GPU_UTIL", util and util.gpu),
            ("DCGM_FI_DEV_MEM_COPY_UTIL", util and util.memory),
            ("DCGM_FI_DEV_ENC_UTIL", enc and enc[0]),
            ("DCGM_FI_DEV_DEC_UTIL", dec and dec[0]),
            ("DCGM_FI_DEV_FB_USED", mem and mem.used // MIB),
            ("DCGM_FI_DEV_FB_FREE", mem and mem.free // MIB),
            ("DCGM_FI_DEV_FB_RESERVED", mem.reserved // MIB if mem and hasattr(mem, "reserved") else None),
            ("DCGM_FI_DEV_SM_CLOCK", sm),
            ("DCGM_FI_DEV_MEM_CLOCK", memclk),
        ]
        values.update({name: float(v) for name, v in pairs if v is not None})
        licence = self._vgpu_licence(handle)
        if licence is not None:
            values["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] = licence
        if "DCGM_FI_DEV_POWER_USAGE" not in values:
            milliwatts = opt(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
            if milliwatts is not None:
                values["DCGM_FI_DEV_POWER_USAGE"] = milliwatts / 1000.0

    def _vgpu_licence(self, handle: Any) -> float | None:
        """DCGM field 526 as DCGM 4.6.0 reads it: nvmlDeviceGetGridLicensableFeatures; 0 when
        licensing is not supported, else 1 if the vGPU feature's state is set. A driver that
        answers "not supported" leaves the series out, as DCGM does. The H100 in a
        pass-through VM (driver 580.159.04, docs/measured-h100.md 2026-11-26) answered, and the
        series read 0."""
        nvml = self._nvml
        call = getattr(nvml, "nvmlDeviceGetGridLicensableFeatures", None)
        features = None if call is None else self._optional(partial(call, handle))
        if features is None:
            return None
        if not features.isGridLicenseSupported:
            return 0.0
        vgpu = getattr(nvml, "NVML_GRID_LICENSE_FEATURE_CODE_VGPU", 1)
        for slot in range(features.licensableFeaturesCount):
            feature = features.gridLicensableFeatures[slot]
            if feature.featureCode == vgpu:
                return 1.0 if feature.featureState > 0 else 0.0
        return None

    def _memory(self, handle: Any) -> Any:
        """Memory info v2 where the binding has it (it adds `reserved`, DCGM field 253)."""
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is None:
            return nvml.nvmlDeviceGetMemoryInfo(handle)
        return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)

    def _watch_xids(self) -> None:
        """Event thread: XID critical events into a list the loop drains."""
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("nvml events unavailable error=%r", str(exc))
            return
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
            except nvml.NVMLError as exc:
                log.warning("xid events not registered gpu=%d error=%r", index, str(exc))
        try:
            while not self._stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait(event_set, self._event_timeout_ms)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                        log.warning("nvml event wait failed error=%r", str(exc))
                        self._stop.wait(self._event_timeout_ms / 1000)
                    continue
                if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                    event = XidEvent(self._index_of(data.device), int(data.eventData), self._clock())
                    with self._events_lock:
                        self._events.append(event)
        finally:
            nvml.nvmlEventSetFree(event_set)

    def _index_of(self, handle: Any) -> int:
        # ctypes handles compare by identity, so fall back to the UUID.
        for index, known in enumerate(self._handles):
            if known is handle:
                return index
        uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
        return next((d.index for d in self._devices if d.uuid == uuid), -1)

    def drain_xid_events(self) -> list[XidEvent]:
        with self._events_lock:
            events, self._events = self._events, []
        return events

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._event_timeout_ms / 1000 + 1)
        self._gpm.close()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.warning("nvml shutdown failed error=%r", str(exc))
