"""GPM (GPU Performance Monitoring, Hopper and later) through nvidia-ml-py, for the NVML backend.

Where it sits: `exporter.nvml_backend` asks it for a GPU's profiling values once per
collection, and `exporter.nvml_mig` for each MIG GPU instance's. It reads the way DCGM
4.6.0 fills its profiling fields on Hopper and later (`dcgmlib/src/DcgmGpmManager.cpp`,
`DcgmFieldIdToNvmlGpmMetricId` in `dcgm_fields.cpp`, `DcgmCacheManager.cpp`; NVIDIA/DCGM
tag v4.6.0): one sample per GPU (`nvmlGpmSampleGet`) or per GPU instance
(`nvmlGpmMigSampleGet(parent, gpuInstanceId, sample)`), then `nvmlGpmMetricsGet` between
the previous collection's sample and this one. NVML's percentages are divided by 100 (DCGM's
`isPercentageField`), and the PCIe rates in MiB/s are multiplied by 2^20 and truncated, as
DCGM stores `DCGM_FI_PROF_PCIE_{TX,RX}_BYTES` (its `DCGM_FIELD_ID_IS_GPM_MIB_BANDWIDTH` case).

Why PCIe comes from here by default: a GPM sample is a copy of counters the GPU keeps
anyway, so the two samples per collection cost nothing on the scrape path, where NVML's
`nvmlDeviceGetPcieThroughput` blocks 20 ms per direction (the opt-in `pcie` family).

Per instance, only the fields DCGM answers for a GPU instance are asked: its entity levels
put the four ratios at GPU-I/GPU-CI and PCIe at the GPU, so a MIG instance has no PCIe
series. Support is asked once per GPU (`nvmlGpmQueryDeviceSupport`); a GPU without GPM has
none of these series, never zeros.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)
MIB = 1024 * 1024

# pynvml metric id name -> (3.x reading, factor to the DCGM unit, integer as DCGM stores it)
GPU_METRICS: dict[str, tuple[str, float, bool]] = {
    "NVML_GPM_METRIC_GRAPHICS_UTIL": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.01, False),
    "NVML_GPM_METRIC_SM_UTIL": ("DCGM_FI_PROF_SM_ACTIVE", 0.01, False),
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.01, False),
    "NVML_GPM_METRIC_DRAM_BW_UTIL": ("DCGM_FI_PROF_DRAM_ACTIVE", 0.01, False),
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": ("DCGM_FI_PROF_PCIE_TX_BYTES", float(MIB), True),
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": ("DCGM_FI_PROF_PCIE_RX_BYTES", float(MIB), True),
}
INSTANCE_METRICS = {name: spec for name, spec in GPU_METRICS.items() if "PCIE" not in name}

Key = tuple[int, int | None]  # (GPU index, GPU instance id or None for the whole GPU)


class GpmReader:
    """Samples per GPU and per GPU instance, each kept until the next collection's sample."""

    def __init__(self, nvml: Any, *, optional: Callable[[Callable[[], Any]], Any]) -> None:
        self._nvml = nvml
        self._optional = optional
        self._supported: dict[int, bool] = {}
        self._prev: dict[Key, Any] = {}

    def supported(self, index: int, handle: Any) -> bool:
        """Whether the GPU has GPM; asked once (a GPU does not gain or lose it).

        The family is default, so a driver older than GPM (pynvml raises FunctionNotFound
        for the missing symbol) must cost the GPU only these series: any error counts as
        "no GPM", remembered unless it may pass (a lost GPU fails its other calls anyway)."""
        found = self._supported.get(index)
        if found is None:
            nvml = self._nvml
            try:
                support = self._optional(lambda: nvml.nvmlGpmQueryDeviceSupport(handle))
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
                    log.debug("gpm support query failed gpu=%d error=%r", index, str(exc))
                    return False
                log.info("gpm not in this driver gpu=%d", index)
                support = None
            found = self._supported[index] = bool(support is not None and support.isSupportedDevice)
        return found

    def gpu(self, index: int, handle: Any) -> dict[str, float]:
        """The whole GPU's values since the previous call; empty on the first call and after
        an NVML error. GPM is default, so its failure (not verified on a MIG-enabled parent
        GPU) leaves only its series out; a lost GPU still fails its reading through the
        other calls."""
        if not self.supported(index, handle):
            return {}
        nvml = self._nvml
        try:
            return self._read((index, None), GPU_METRICS,
                              lambda sample: nvml.nvmlGpmSampleGet(handle, sample))
        except nvml.NVMLError as exc:
            log.debug("gpm sample failed gpu=%d error=%r", index, str(exc))
            return {}

    def instance(self, index: int, handle: Any, gpu_instance_id: int) -> dict[str, float]:
        """One GPU instance's values (`handle` is the parent GPU's, as NVML asks). An NVML
        error leaves this instance's values out for this collection: DCGM answers no data for
        a GPU instance without compute instances, and the GPU's own reading stays good."""
        if not self.supported(index, handle):
            return {}
        nvml = self._nvml
        try:
            return self._read((index, gpu_instance_id), INSTANCE_METRICS,
                              lambda sample: nvml.nvmlGpmMigSampleGet(handle, gpu_instance_id, sample))
        except nvml.NVMLError as exc:
            log.debug("gpm instance sample failed gpu=%d gpu_instance=%d error=%r",
                      index, gpu_instance_id, str(exc))
            return {}

    def _read(self, key: Key, metrics: Mapping[str, tuple[str, float, bool]],
              take: Callable[[Any], Any]) -> dict[str, float]:
        nvml = self._nvml
        sample = nvml.nvmlGpmSampleAlloc()
        try:
            take(sample)
        except nvml.NVMLError:
            nvml.nvmlGpmSampleFree(sample)
            raise
        prev, self._prev[key] = self._prev.get(key), sample
        if prev is None:
            return {}
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metrics)
        request.sample1, request.sample2 = prev, sample
        names = list(metrics)
        for slot, name in enumerate(names):
            request.metrics[slot].metricId = getattr(nvml, name)
        try:
            nvml.nvmlGpmMetricsGet(request)
        finally:
            nvml.nvmlGpmSampleFree(prev)
        out = {}
        for slot, name in enumerate(names):
            metric = request.metrics[slot]
            if metric.nvmlReturn != nvml.NVML_SUCCESS or metric.value != metric.value:  # NaN: DCGM's blank
                continue
            reading, factor, integer = metrics[name]
            value = metric.value * factor
            out[reading] = float(int(value)) if integer else round(value, 6)
        return out

    def close(self) -> None:
        """Free the samples kept for the next collection."""
        for sample in self._prev.values():
            self._nvml.nvmlGpmSampleFree(sample)
        self._prev.clear()
