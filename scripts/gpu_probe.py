"""Probe the NVML calls `exporter.nvml_backend` makes, on a real GPU, and print JSON.

For each call: what it answered on GPU 0 (or the NVML error), and its median latency over
`--repeat` calls. Also: field-value return codes and value types, GPM support and one
metrics read, XID event support and the CPU an idle `nvmlEventSetWait` costs. Run where the
driver is (`python3 scripts/gpu_probe.py > probe.json`); `--fake` runs it against
tests/exporter/fake_nvml.py to check the script itself on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIELD_NAMES = (
    "NVML_FI_DEV_MEMORY_TEMP", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    "NVML_FI_DEV_POWER_INSTANT", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_SBE_AGG_TOTAL", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
)
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
GPM_NAMES = ("NVML_GPM_METRIC_GRAPHICS_UTIL", "NVML_GPM_METRIC_SM_UTIL", "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
             "NVML_GPM_METRIC_DRAM_BW_UTIL")


def plain(value: Any) -> Any:
    """JSON-able view of an NVML answer (ctypes structs become dicts of their fields)."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple) or hasattr(value, "_length_"):  # ctypes arrays too
        return [plain(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields:
        return {name: plain(getattr(value, name)) for name, *_ in fields}
    if hasattr(value, "__dict__"):
        return {k: plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


def timed(fn: Callable[[], Any], repeat: int) -> dict[str, Any]:
    """Answer (or error) of `fn`, and its median/max latency in microseconds."""
    times, answer, error = [], None, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            answer = fn()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc} (value={getattr(exc, 'value', None)})"
        times.append((time.perf_counter() - t0) * 1e6)
    out: dict[str, Any] = {"median_us": round(statistics.median(times), 2), "max_us": round(max(times), 2)}
    if error is not None:
        out["error"] = error
    else:
        out["answer"] = plain(answer)
    return out


def probe(nvml: Any, repeat: int) -> dict[str, Any]:
    report: dict[str, Any] = {}
    t0 = time.perf_counter()
    nvml.nvmlInit()
    report["init_ms"] = round((time.perf_counter() - t0) * 1000, 2)
    report["module"] = getattr(nvml, "__file__", type(nvml).__name__)
    for name in ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion",
                 "nvmlDeviceGetCount"):
        report[name] = timed(lambda n=name: getattr(nvml, n)(), 1)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    calls: dict[str, Callable[[], Any]] = {
        "nvmlDeviceGetHandleByIndex": lambda: str(nvml.nvmlDeviceGetHandleByIndex(0)),
        "nvmlDeviceGetUUID": lambda: nvml.nvmlDeviceGetUUID(handle),
        "nvmlDeviceGetName": lambda: nvml.nvmlDeviceGetName(handle),
        "nvmlDeviceGetPciInfo.busId": lambda: nvml.nvmlDeviceGetPciInfo(handle).busId,
        "nvmlDeviceGetTemperature": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetUtilizationRates": lambda: nvml.nvmlDeviceGetUtilizationRates(handle),
        "nvmlDeviceGetEncoderUtilization": lambda: nvml.nvmlDeviceGetEncoderUtilization(handle),
        "nvmlDeviceGetDecoderUtilization": lambda: nvml.nvmlDeviceGetDecoderUtilization(handle),
        "nvmlDeviceGetMemoryInfo": lambda: nvml.nvmlDeviceGetMemoryInfo(handle),
        "nvmlDeviceGetClockInfo.SM": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
        "nvmlDeviceGetClockInfo.MEM": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
        "nvmlDeviceGetPowerUsage": lambda: nvml.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetTotalEnergyConsumption": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle),
        "nvmlDeviceGetComputeRunningProcesses": lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle),
        "nvmlGpmQueryDeviceSupport": lambda: nvml.nvmlGpmQueryDeviceSupport(handle),
        "nvmlDeviceGetSupportedEventTypes": lambda: nvml.nvmlDeviceGetSupportedEventTypes(handle),
    }
    report["calls"] = {name: timed(fn, repeat) for name, fn in calls.items()}
    report["calls"]["nvmlDeviceGetPcieThroughput.TX"] = timed(
        lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES), min(repeat, 10))
    report["fields"] = probe_fields(nvml, handle, repeat)
    report["gpm"] = probe_gpm(nvml, handle)
    report["events"] = probe_events(nvml, handle)
    report["nvlink"] = probe_nvlink(nvml, handle, min(repeat, 20))
    try:
        report["default_set"] = probe_default_set(nvml, handle, min(repeat, 20))
    except Exception as exc:  # a new section must not cost the rest of the report
        report["default_set"] = {"error": error_text(exc)}
    nvml.nvmlShutdown()
    return report


def probe_fields(nvml: Any, handle: Any, repeat: int) -> dict[str, Any]:
    ids = [getattr(nvml, name) for name in FIELD_NAMES]
    batch = timed(lambda: nvml.nvmlDeviceGetFieldValues(handle, ids), repeat)
    out: dict[str, Any] = {"batched_median_us": batch["median_us"], "batch_error": batch.get("error")}
    rest = [i for name, i in zip(FIELD_NAMES, ids, strict=True) if "ENERGY" not in name]
    out["batched_without_energy_median_us"] = timed(
        lambda: nvml.nvmlDeviceGetFieldValues(handle, rest), repeat)["median_us"]
    for name, field_id in zip(FIELD_NAMES, ids, strict=True):
        alone = timed(lambda f=field_id: nvml.nvmlDeviceGetFieldValues(handle, [f]), min(repeat, 20))
        out[f"alone_median_us.{name}"] = alone["median_us"]
    values = nvml.nvmlDeviceGetFieldValues(handle, ids)
    for name, fv in zip(FIELD_NAMES, values, strict=True):
        member = VALUE_MEMBERS[fv.valueType] if 0 <= fv.valueType < len(VALUE_MEMBERS) else None
        out[name] = {"id": getattr(nvml, name), "nvmlReturn": fv.nvmlReturn, "valueType": fv.valueType,
                     "value": plain(getattr(fv.value, member)) if member else None}
    return out


def probe_gpm(nvml: Any, handle: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        support = nvml.nvmlGpmQueryDeviceSupport(handle)
        out["isSupportedDevice"] = int(support.isSupportedDevice)
        first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(handle, first)
        time.sleep(0.2)
        nvml.nvmlGpmSampleGet(handle, second)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_NAMES)
        request.sample1, request.sample2 = first, second
        for slot, name in enumerate(GPM_NAMES):
            request.metrics[slot].metricId = getattr(nvml, name)
        t0 = time.perf_counter()
        nvml.nvmlGpmMetricsGet(request)
        out["metrics_get_us"] = round((time.perf_counter() - t0) * 1e6, 2)
        gets, sample_gets = [], []
        for _ in range(10):
            t0 = time.perf_counter()
            nvml.nvmlGpmSampleGet(handle, second)
            sample_gets.append((time.perf_counter() - t0) * 1e6)
            t0 = time.perf_counter()
            nvml.nvmlGpmMetricsGet(request)
            gets.append((time.perf_counter() - t0) * 1e6)
        out["sample_get_median_us"] = round(statistics.median(sample_gets), 2)
        out["metrics_get_median_us"] = round(statistics.median(gets), 2)
        out["metrics"] = {name: {"nvmlReturn": request.metrics[slot].nvmlReturn,
                                 "value": request.metrics[slot].value} for slot, name in enumerate(GPM_NAMES)}
        nvml.nvmlGpmSampleFree(first)
        nvml.nvmlGpmSampleFree(second)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc} (value={getattr(exc, 'value', None)})"
    return out


def error_text(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc} (value={getattr(exc, 'value', None)})"


def probe_nvlink(nvml: Any, handle: Any, repeat: int) -> dict[str, Any]:
    """What the `nvlink` family asks: state per link, the per-link fields, the CRC counters.

    Every link up to NVML_NVLINK_MAX_LINKS is asked, so a VM that hides its links shows
    which answer it gives (NotSupported, InvalidArgument, or a disabled state).
    """
    out: dict[str, Any] = {"max_links": nvml.NVML_NVLINK_MAX_LINKS}
    states: dict[str, Any] = {}
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            states[str(link)] = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception as exc:
            states[str(link)] = error_text(exc)
    out["state_per_link"] = states
    out["state_link0"] = timed(lambda: nvml.nvmlDeviceGetNvLinkState(handle, 0), repeat)
    for name, fn in {
        "version_link0": lambda: nvml.nvmlDeviceGetNvLinkVersion(handle, 0),
        "capability_p2p_link0": lambda: nvml.nvmlDeviceGetNvLinkCapability(
            handle, 0, nvml.NVML_NVLINK_CAP_P2P_SUPPORTED),
        "remote_pci_link0": lambda: nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, 0).busId,
    }.items():
        out[name] = timed(fn, 1)
    out["error_counters_link0"] = {
        counter: timed(lambda c=counter: nvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, getattr(nvml, c)),
                       repeat)
        for counter in ("NVML_NVLINK_ERROR_DL_REPLAY", "NVML_NVLINK_ERROR_DL_RECOVERY",
                        "NVML_NVLINK_ERROR_DL_CRC_FLIT", "NVML_NVLINK_ERROR_DL_CRC_DATA")
    }
    link_count = getattr(nvml, "NVML_FI_DEV_NVLINK_LINK_COUNT", 91)
    out["link_count_field"] = field_answers(nvml, handle, [link_count])
    per_link = ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
                "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY", "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY")
    for links in (1, 18):
        ids = [(getattr(nvml, name), link) for link in range(links) for name in per_link]
        batch = timed(lambda i=ids: nvml.nvmlDeviceGetFieldValues(handle, i), repeat)
        out[f"fields_{links}_links"] = {"median_us": batch["median_us"], "max_us": batch["max_us"],
                                        "error": batch.get("error")}
        if "error" not in batch:
            out[f"fields_{links}_links"]["answers"] = field_answers(nvml, handle, ids)
    return out


def probe_default_set(nvml: Any, handle: Any, repeat: int) -> dict[str, Any]:
    """The calls behind dcgm-exporter's default rows that issue #28 added: memory info v2
    (FB_RESERVED), row remapping, vGPU licensing, and the `nvlink_gpu` family's one batch
    (throughput with scopeId UINT_MAX, the four error totals), each answer and its latency."""
    from exporter.nvml_nvlink import NVLINK_GPU_FIELDS

    out: dict[str, Any] = {}
    version = getattr(nvml, "nvmlMemory_v2", None)
    calls: dict[str, Callable[[], Any]] = {
        "nvmlDeviceGetMemoryInfo.v1": lambda: nvml.nvmlDeviceGetMemoryInfo(handle),
        "nvmlDeviceGetMemoryInfo.v2": lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=version),
        "nvmlDeviceGetRemappedRows": lambda: nvml.nvmlDeviceGetRemappedRows(handle),
        "nvmlDeviceGetGridLicensableFeatures": lambda: nvml.nvmlDeviceGetGridLicensableFeatures(handle),
    }
    for name, fn in calls.items():
        out[name] = timed(fn, repeat)
    ids = [(getattr(nvml, name), scope) for name, scope in NVLINK_GPU_FIELDS.values()]
    batch = timed(lambda: nvml.nvmlDeviceGetFieldValues(handle, ids), repeat)
    out["nvlink_gpu_fields"] = {"median_us": batch["median_us"], "max_us": batch["max_us"],
                                "error": batch.get("error"), "answers": field_answers(nvml, handle, ids)}
    return out


def field_answers(nvml: Any, handle: Any, ids: list[Any]) -> Any:
    """Return code, value type and value of each requested field (id or (id, scopeId))."""
    try:
        values = nvml.nvmlDeviceGetFieldValues(handle, ids)
    except Exception as exc:
        return error_text(exc)
    answers = []
    for requested, fv in zip(ids, values, strict=True):
        member = VALUE_MEMBERS[fv.valueType] if 0 <= fv.valueType < len(VALUE_MEMBERS) else None
        answers.append({"field": plain(requested), "nvmlReturn": fv.nvmlReturn, "valueType": fv.valueType,
                        "value": plain(getattr(fv.value, member)) if member else None})
    return answers


def probe_backend_nvlink(nvml: Any, repeat: int) -> dict[str, Any]:
    """The exporter's own `nvlink` read on this GPU: links returned and cost per collection."""
    from exporter.nvml_backend import NvmlBackend

    backend = NvmlBackend(nvml)
    try:
        first = timed(lambda: backend.read(["nvlink"]), 1)
        again = timed(lambda: backend.read(["nvlink"]), repeat)
        cpu0 = time.process_time()
        for _ in range(repeat):
            backend.read(["nvlink"])
        cpu_ms = (time.process_time() - cpu0) / repeat * 1000
        readings = backend.read(["nvlink"])
        return {"first_read": first, "read_median_us": again["median_us"], "read_max_us": again["max_us"],
                "read_cpu_ms": round(cpu_ms, 4), "error": again.get("error"),
                "readings": {str(i): {"ok": r.ok, "links": [dataclasses.asdict(link) for link in r.links]}
                             for i, r in readings.items()}}
    except Exception as exc:
        return {"error": error_text(exc)}
    finally:
        backend.close()


def probe_events(nvml: Any, handle: Any) -> dict[str, Any]:
    """Register XID events and time three idle 1 s waits: wall, thread CPU, error value."""
    out: dict[str, Any] = {}
    try:
        event_set = nvml.nvmlEventSetCreate()
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        out["registered"] = True
        waits = []
        for _ in range(3):
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                data = nvml.nvmlEventSetWait(event_set, 1000)
                result = f"event type={data.eventType} data={data.eventData}"
            except nvml.NVMLError as exc:
                result = f"NVMLError value={getattr(exc, 'value', None)}"
            waits.append({"wall_ms": round((time.perf_counter() - w0) * 1000, 2),
                          "cpu_ms": round((time.thread_time() - c0) * 1000, 3), "result": result})
        out["waits"] = waits
        nvml.nvmlEventSetFree(event_set)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc} (value={getattr(exc, 'value', None)})"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--fake", action="store_true", help="tests/exporter/fake_nvml.py instead of pynvml")
    args = parser.parse_args()
    if args.fake:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "exporter"))
        from fake_nvml import FakeGpu, FakeNvml

        nvml: Any = FakeNvml([FakeGpu(uuid="GPU-fake")])
    else:
        import pynvml

        nvml = pynvml
    report = probe(nvml, args.repeat)
    report["backend_nvlink"] = probe_backend_nvlink(nvml, min(args.repeat, 50))
    print(json.dumps(report, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
