"""The NVML backend against a fake pynvml: batching, unsupported fields, errors, XID events."""

from __future__ import annotations

import time

import pytest
from fake_nvml import FakeGpu, FakeNvml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.catalogue import select_families
from exporter.collection import Collection
from exporter.errors import BackendError
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.nvml_backend import NvmlBackend

ALL = select_families(include=["pcie", "gpm", "process"])
REMAP_ROWS = ("CORRECTABLE_REMAPPED_ROWS", "UNCORRECTABLE_REMAPPED_ROWS", "ROW_REMAP_PENDING",
              "ROW_REMAP_FAILURE")


def _gpus(n: int = 2) -> list[FakeGpu]:
    return [FakeGpu(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", bus_id=f"00000000:{0x18 + i:02X}:00.0")
            for i in range(n)]


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml(_gpus())


@pytest.fixture
def backend(nvml: FakeNvml):
    b = NvmlBackend(nvml, event_timeout_ms=20)
    yield b
    b.close()


def _scrape(collection: Collection) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(collection, LabelPolicy("node-a")))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_devices_and_units(backend: NvmlBackend, nvml: FakeNvml) -> None:
    assert [d.uuid for d in backend.devices()] == [g.uuid for g in nvml.gpus]
    assert backend.devices()[1].pci_bus_id == "00000000:19:00.0"
    assert backend.driver_version() == "550.54.15"
    values = backend.read(select_families())[0].values
    assert values["DCGM_FI_DEV_POWER_USAGE"] == 450.0  # mW (unsigned int on an H100) -> W
    assert values["DCGM_FI_DEV_MEMORY_TEMP"] == 60.0  # unsigned int member of the union
    assert values["DCGM_FI_DEV_FB_USED"] == 40000.0  # bytes -> MiB
    assert values["DCGM_FI_DEV_FB_FREE"] == 81559.0 - 40000.0
    assert values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 123_456_789.0  # mJ, as DCGM
    assert values["DCGM_FI_DEV_GPU_UTIL"] == 70.0
    assert values["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"] == 7.0


def test_default_set_fields_as_the_h100_answered() -> None:
    """Issue #28's rows as the run-4 H100 answered them (docs/measured/h100/run4,
    `nvidia-smi -q`: FB Total 81559, Reserved 480, Used 0, Free 81079 MiB; no remapped rows;
    pass-through, so no vGPU licence): memory info v2 keeps the reservation out of `used`."""
    gpu = FakeGpu(uuid="GPU-2964922d-326e-a665-7aa7-9810a75d4c83", memory_used=0, memory_reserved=480 * 2**20,
                  grid_licensing=False)
    backend = NvmlBackend(FakeNvml([gpu]), event_timeout_ms=20)
    try:
        values = backend.read(select_families())[0].values
    finally:
        backend.close()
    assert [values[f"DCGM_FI_DEV_FB_{k}"] for k in ("FREE", "USED", "RESERVED")] == [81079.0, 0.0, 480.0]
    assert values["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] == 0.0
    rows = REMAP_ROWS
    assert [values[f"DCGM_FI_DEV_{k}"] for k in rows] == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(("changes", "licence"), [
    ({}, 1.0),  # a vGPU guest with an active licence
    ({"vgpu_licensed": 0}, 0.0),  # a vGPU guest without one
    ({"grid_licensing": False}, 0.0),  # the driver answers, licensing not supported
    ({"unsupported": {"nvmlDeviceGetGridLicensableFeatures"}}, None),  # NotSupported: no series
])  # fmt: skip
def test_vgpu_licence_status_branches(changes: dict, licence: float | None) -> None:
    backend = NvmlBackend(FakeNvml([FakeGpu(uuid="GPU-1", **changes)]), event_timeout_ms=20)
    try:
        values = backend.read(select_families())[0].values
    finally:
        backend.close()
    assert values.get("DCGM_FI_DEV_VGPU_LICENSE_STATUS") == licence


def test_row_remapping_pending_and_failed() -> None:
    gpu = FakeGpu(uuid="GPU-1", remapped_rows=(3, 1, 1, 0))
    backend = NvmlBackend(FakeNvml([gpu]), event_timeout_ms=20)
    try:
        values = backend.read(select_families())[0].values
        gpu.remapped_rows = (3, 2, 0, 1)
        later = backend.read(select_families())[0].values
    finally:
        backend.close()
    rows = REMAP_ROWS
    assert [values[f"DCGM_FI_DEV_{k}"] for k in rows] == [3.0, 1.0, 1.0, 0.0]
    assert [later[f"DCGM_FI_DEV_{k}"] for k in rows] == [3.0, 2.0, 0.0, 1.0]


def test_init_once_handles_cached_fields_batched(backend: NvmlBackend, nvml: FakeNvml) -> None:
    for _ in range(3):
        backend.read(select_families())
    assert nvml.calls["nvmlInit"] == 1
    assert nvml.calls["nvmlDeviceGetHandleByIndex"] == 2
    # per GPU per read: one batched call for the scalar fields, one for the NVLink totals
    assert nvml.calls["nvmlDeviceGetFieldValues"] == 3 * 2 * 2


def test_unsupported_leaves_series_out(nvml: FakeNvml) -> None:
    nvml.gpus[0].unsupported |= {"NVML_FI_DEV_MEMORY_TEMP", "nvmlDeviceGetEncoderUtilization",
                                 "nvmlDeviceGetClockInfo", "nvmlGpmQueryDeviceSupport"}
    backend = NvmlBackend(nvml, event_timeout_ms=20)
    try:
        collection = Collection(backend, ALL, timeout=None)
        assert collection.collect_once()
        families = _scrape(collection)
    finally:
        backend.close()
    gpus_with = {name: {s.labels["gpu"] for s in samples} for name, samples in families.items()
                 if samples and "gpu" in samples[0].labels}
    assert gpus_with["DCGM_FI_DEV_MEMORY_TEMP"] == {"1"}
    assert gpus_with["DCGM_FI_DEV_ENC_UTIL"] == {"1"}
    assert gpus_with["DCGM_FI_DEV_SM_CLOCK"] == {"1"}
    assert gpus_with["DCGM_FI_DEV_GPU_TEMP"] == {"0", "1"}
    assert collection.stats.errors == 0
    assert {s.value for s in families["gpufed_gpu_health"]} == {1.0}


def test_gpu_lost_marks_only_that_gpu(nvml: FakeNvml) -> None:
    backend = NvmlBackend(nvml, event_timeout_ms=20)
    try:
        collection = Collection(backend, select_families(), timeout=None)
        nvml.gpus[1].lost = True
        assert collection.collect_once()
        families = _scrape(collection)
    finally:
        backend.close()
    health = {s.labels["gpu"]: s.value for s in families["gpufed_gpu_health"]}
    assert health == {"0": 1.0, "1": 0.0}
    assert {s.labels["gpu"] for s in families["DCGM_FI_DEV_GPU_TEMP"]} == {"0"}
    assert collection.stats.errors == 1  # partial collection counted


def test_every_gpu_failing_is_a_collection_error(nvml: FakeNvml) -> None:
    backend = NvmlBackend(nvml, event_timeout_ms=20)
    try:
        for gpu in nvml.gpus:
            gpu.lost = True
        with pytest.raises(BackendError):
            backend.read(select_families())
        collection = Collection(backend, select_families(), timeout=None)
        assert not collection.collect_once()
        assert collection.snapshot is None
        assert not collection.ready(60)
        assert collection.stats.errors == 1
    finally:
        backend.close()


def test_init_failure_is_backend_error() -> None:
    with pytest.raises(BackendError, match="initialisation"):
        NvmlBackend(FakeNvml(_gpus(), init_error=True))


def test_xid_events_become_counter_and_health(backend: NvmlBackend, nvml: FakeNvml) -> None:
    assert {uuid for uuid, _ in nvml.registered} == {g.uuid for g in nvml.gpus}
    collection = Collection(backend, select_families(), timeout=None)
    nvml.inject_xid(1, 79)
    nvml.inject_xid(1, 79)
    nvml.inject_xid(0, 13)
    deadline = time.monotonic() + 2
    while nvml.events.qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    collection.collect_once()
    families = _scrape(collection)
    totals = {(s.labels["gpu"], s.labels["err_code"]): s.value
              for s in families["gpufed_gpu_xid_errors"] if s.name.endswith("_total")}
    assert totals == {("0", "13"): 1.0, ("1", "79"): 2.0}
    health = {s.labels["gpu"]: s.value for s in families["gpufed_gpu_health"]}
    assert health == {"0": 1.0, "1": 0.0}  # 79 (fell off the bus) is critical, 13 is not
    last = {s.labels["gpu"]: (s.labels["err_code"], s.value) for s in families["DCGM_FI_DEV_XID_ERRORS"]}
    assert last == {"0": ("13", 13.0), "1": ("79", 79.0)}


def test_gpm_needs_two_samples_and_pcie_integrates(nvml: FakeNvml) -> None:
    now = [1000.0]
    backend = NvmlBackend(nvml, event_timeout_ms=20, clock=lambda: now[0])
    try:
        first = backend.read(ALL)[0]
        assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in first.values
        now[0] += 5
        second = backend.read(ALL)[0]
        assert second.values["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == 0.4
        assert second.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0.7
        # a GPM GPU: PCIe from GPM (MiB/s x 2^20, truncated, as DCGM), never the blocking call
        assert "DCGM_FI_PROF_PCIE_TX_BYTES" not in first.values
        assert second.values["DCGM_FI_PROF_PCIE_TX_BYTES"] == int(1500.5 * 1024 * 1024)
        assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0
        # fields 200/201: DCGM never fills them, so neither does the exporter (issue 42)
        assert not {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"} & second.values.keys()
        assert [p.pid for p in second.processes] == [4242, 4243]
        assert nvml.freed_samples == 2  # the previous samples of both GPUs
    finally:
        backend.close()
    assert nvml.calls["nvmlShutdown"] == 1
    assert nvml.calls["nvmlEventSetFree"] == 1
