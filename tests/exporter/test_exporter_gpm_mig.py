"""GPM by default and MIG per instance (issue 42, item 6).

- Default flags on a GPM GPU (simulated H100, and the fake NVML's H100 read through the NVML
  backend) serve every active row of dcgm-exporter's default set, compared by name with the
  vendored upstream CSV, and no field DCGM never fills (200/201).
- PCIe bytes come from GPM there; NVML's blocking `nvmlDeviceGetPcieThroughput` is called
  only with the opt-in `pcie` family on a GPU without GPM.
- On a GPU without GPM the rows GPM fills are absent (no series, not zero), as docs/exporter.md
  lists them.
- MIG: each GPU instance has its own framebuffer and GPM values under dcgm-exporter's
  `GPU_I_PROFILE`/`GPU_I_ID`; the whole GPU's series carry no MIG label and no MIG pod.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from fake_nvml import FakeGpu, FakeMig, FakeNvml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter import naming, textformat
from exporter.app import ExporterApp
from exporter.catalogue import select_families
from exporter.collection import Collection
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.models import AttributionStatus, PodLabels
from exporter.nvml_backend import NvmlBackend
from exporter.settings import ExporterSettings

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "exporter" / "upstream" / "dcgm-exporter-default-counters.csv"
DOC = ROOT / "docs" / "exporter.md"
UUID = "GPU-6f1a5c2e-8b3d-4e7f-9a10-2c4b6d8e0f12"
MIG_A = "MIG-5e2f8c1a-9b3d-5f7e-a1c4-6d8e0f2a4b6c"
MIG_B = "MIG-7a9c1e3f-5b7d-5e9f-b2d4-8f0a2c4e6a8b"
MIB = 1024 * 1024
NEVER_FILLED = {200, 201}  # DCGM_FI_DEV_PCIE_{TX,RX}_THROUGHPUT: NOT_SUPPORTED in DCGM 2.1.4-4.6.0
MIG_LABELS = {"GPU_I_PROFILE", "GPU_I_ID"}
_DOC_ROW = re.compile(r"^\| `(DCGM_FI_\w+)` \| ([^|]+) \| ([^|]+) \|$")


def upstream_rows() -> dict[str, str]:
    """Field -> Prometheus type of every active (uncommented) row of the upstream CSV."""
    rows = {}
    for line in CSV.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            field, kind, _ = (part.strip() for part in line.split(",", 2))
            rows[field] = kind
    return rows


def doc_rows_without_gpm() -> dict[str, str]:
    """Field -> why, from docs/exporter.md's table of rows a GPU without GPM does not have."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## GPM and MIG", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(3) for line in section.splitlines() if (m := _DOC_ROW.match(line))}


def serve(settings: ExporterSettings, backend: object | None = None) -> str:
    """A default `serve` (settings as flags would give them): /metrics after two collections."""
    app = ExporterApp(settings, backend=backend)
    app.start()
    try:
        wait_for(lambda: app.collection.stats.collections >= 2, timeout=10, interval=0.02)
        with urllib.request.urlopen(f"http://127.0.0.1:{app.http.port}/metrics", timeout=10) as response:
            return str(response.read().decode())
    finally:
        app.stop()


def types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def sampled(text: str) -> set[str]:
    return set(re.findall(r"^(DCGM_FI_\w+)\{", text, re.M))


def assert_every_default_row(text: str, driver: str) -> None:
    rows = upstream_rows()
    assert len([kind for kind in rows.values() if kind != "label"]) == 25  # the set issue 42 counts
    typed, found = types(text), sampled(text)
    missing = sorted(field for field, kind in rows.items() if kind != "label" and field not in found)
    assert not missing, f"dcgm-exporter default rows not served with default flags: {missing}"
    for field, kind in rows.items():
        if kind == "label":
            series = [line for line in text.splitlines() if line.startswith("DCGM_FI_")]
            assert all(f'{field}="{driver}"' in line for line in series), field
        else:
            assert typed[field] == kind, f"{field}: {typed[field]} here, {kind} in dcgm-exporter"
    ids = {row.rename.name: row.rename.field_id for row in naming.table()}
    assert not {ids.get(name) for name in found} & NEVER_FILLED
    assert not {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"} & found


def test_default_flags_on_a_simulated_h100_serve_all_25_default_rows() -> None:
    settings = ExporterSettings(backend="simulated", gpus=2, gpu_model="NVIDIA H100 80GB HBM3",
                                listen="127.0.0.1:0", node_name="n1", collect_interval=0.05)
    assert_every_default_row(serve(settings), driver="550.54.15")


def test_default_flags_on_an_nvml_h100_take_pcie_from_gpm_without_the_blocking_call() -> None:
    nvml = FakeNvml([FakeGpu(uuid=UUID, nvlinks=18)], driver="580.95.05")
    settings = ExporterSettings(backend="nvml", listen="127.0.0.1:0", node_name="n1", collect_interval=0.05)
    text = serve(settings, NvmlBackend(nvml, event_timeout_ms=20))
    assert_every_default_row(text, driver="580.95.05")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # GPM's MiB/s times 2^20, truncated, as DCGM 4.6.0 stores the fields
    assert families["DCGM_FI_PROF_PCIE_TX_BYTES"].samples[0].value == int(1500.5 * MIB)
    assert families["DCGM_FI_PROF_PCIE_RX_BYTES"].samples[0].value == int(2500.25 * MIB)
    assert families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples[0].value == 0.7
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert nvml.live_samples == 0, "every GPM sample is freed on close"


@pytest.mark.parametrize("families", [[], ["pcie"]])
def test_a_gpu_without_gpm_lacks_exactly_the_rows_the_doc_lists(families: list[str]) -> None:
    a100 = FakeGpu(uuid=UUID, name="NVIDIA A100-SXM4-80GB", gpm=False, nvlinks=12)
    nvml = FakeNvml([a100], driver="580.95.05")
    settings = ExporterSettings(backend="nvml", listen="127.0.0.1:0", node_name="n1", collect_interval=0.05,
                                families_include=families)
    text = serve(settings, NvmlBackend(nvml, event_timeout_ms=20))
    found, typed = sampled(text), types(text)
    listed = doc_rows_without_gpm()
    assert listed and all(why.strip() for why in listed.values())
    absent = {field for field, kind in upstream_rows().items() if kind != "label" and field not in found}
    pcie = {"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"}
    if families:  # the opt-in family reads PCIe through NVML's blocking call instead
        assert absent == set(listed) - pcie
        assert nvml.calls["nvmlDeviceGetPcieThroughput"] >= 2
        assert re.search(r"^DCGM_FI_PROF_PCIE_TX_BYTES\{.*\} 1\.024e\+06$", text, re.M)  # 1000 KB/s in B/s
    else:
        assert absent == set(listed)
        assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert not absent & set(typed), "absent means no family at all, not a zero"


def test_a_driver_without_gpm_costs_only_the_gpm_series() -> None:
    # pynvml raises FunctionNotFound (13) for a symbol an older libnvidia-ml lacks
    nvml = FakeNvml([FakeGpu(uuid=UUID, failing={"nvmlGpmQueryDeviceSupport": 13})])
    backend = NvmlBackend(nvml, event_timeout_ms=20)
    try:
        readings = [backend.read(select_families())[0] for _ in range(3)]
    finally:
        backend.close()
    assert all(r.ok for r in readings)
    assert "DCGM_FI_DEV_GPU_TEMP" in readings[-1].values
    assert not {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES"} & readings[-1].values.keys()
    assert nvml.calls["nvmlGpmQueryDeviceSupport"] == 1  # asked once
    assert nvml.calls["nvmlGpmSampleAlloc"] == 0


def test_a_failing_gpm_sample_leaves_only_the_gpm_series_out() -> None:
    nvml = FakeNvml([FakeGpu(uuid=UUID, failing={"nvmlGpmSampleGet": 999})])
    backend = NvmlBackend(nvml, event_timeout_ms=20)
    try:
        readings = [backend.read(select_families())[0] for _ in range(2)]
    finally:
        backend.close()
    assert all(r.ok and "DCGM_FI_DEV_FB_USED" in r.values for r in readings)
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in readings[-1].values
    assert nvml.live_samples == 0  # the failed samples were freed


# -- MIG ----------------------------------------------------------------------------------


class MigPods:
    """Pod attribution as kubelet answers for a MIG device (exporter.podmap's label sets)."""

    def labels(self) -> PodLabels:
        return {UUID: ({"namespace": "research", "pod": "mig-big", "container": "app",
                        "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "8"},)}

    def status(self) -> AttributionStatus | None:
        return None

    def close(self) -> None:
        """Nothing to stop."""


def mig_nvml() -> FakeNvml:
    gpu = FakeGpu(uuid=UUID, nvlinks=18, util=70, memory_used=40000 * MIB, migs=[
        FakeMig(MIG_A, 7, "1g.10gb", memory_used=1234 * MIB, util=12),
        FakeMig(MIG_B, 8, "3g.40gb", memory_total=40192 * MIB, memory_used=20000 * MIB, util=55),
    ])
    return FakeNvml([gpu], driver="580.95.05")


def mig_families() -> dict[str, list]:
    nvml = mig_nvml()
    backend = NvmlBackend(nvml, event_timeout_ms=20)
    try:
        collection = Collection(backend, select_families(), attribution=MigPods(), timeout=None)
        for _ in range(2):  # GPM: the second collection has a previous sample
            assert collection.collect_once()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(collection, LabelPolicy("n1")))
        text = textformat.fallback(registry).decode()
    finally:
        backend.close()
    assert nvml.live_samples == 0
    assert nvml.calls["nvmlGpmMigSampleGet"] == 4  # two instances, two collections
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def by_instance(samples: list) -> dict[str | None, float]:
    return {s.labels.get("GPU_I_ID"): s.value for s in samples}


def gpu_series(families: dict[str, list]) -> Iterator[tuple[str, dict[str, str]]]:
    for name, samples in families.items():
        for sample in samples:
            if "UUID" in sample.labels:
                yield name, sample.labels


def test_mig_instances_have_their_own_values_under_dcgm_exporters_labels() -> None:
    families = mig_families()
    assert by_instance(families["DCGM_FI_DEV_FB_USED"]) == {None: 40000.0, "7": 1234.0, "8": 20000.0}
    assert by_instance(families["DCGM_FI_DEV_FB_FREE"]) == {None: 81559.0 - 40000, "7": 9856.0 - 1234,
                                                            "8": 40192.0 - 20000}
    assert by_instance(families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) == {None: 0.7, "7": 0.12, "8": 0.55}
    assert by_instance(families["DCGM_FI_PROF_DRAM_ACTIVE"]) == {None: 0.3, "7": 0.03, "8": 0.1375}
    profiles = {s.labels["GPU_I_ID"]: s.labels["GPU_I_PROFILE"] for s in families["DCGM_FI_DEV_FB_USED"]
                if "GPU_I_ID" in s.labels}
    assert profiles == {"7": "1g.10gb", "8": "3g.40gb"}
    # an instance's series names its parent GPU as dcgm-exporter's do (gpu, UUID, device)
    mig = next(s.labels for s in families["DCGM_FI_DEV_FB_USED"] if s.labels.get("GPU_I_ID") == "7")
    assert (mig["gpu"], mig["UUID"], mig["device"]) == ("0", UUID, "nvidia0")


def test_whole_gpu_series_carry_no_mig_label_and_no_mig_pod() -> None:
    families = mig_families()
    per_instance = {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED",
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"}
    with_mig = {name for name, labels in gpu_series(families) if MIG_LABELS & labels.keys()}
    assert with_mig == per_instance  # PCIe, clocks, power, XIDs...: the whole GPU's only
    for name, labels in gpu_series(families):
        if MIG_LABELS & labels.keys():
            assert labels.keys() >= MIG_LABELS
            # the pod is on its own instance's series only
            assert ("pod" in labels) == (labels["GPU_I_ID"] == "8"), (name, labels)
        else:
            assert "pod" not in labels, f"{name}: a MIG pod on the whole GPU's series"
    assert families["DCGM_FI_DEV_GPU_TEMP"] and all(not MIG_LABELS & s.labels.keys()
                                                    for s in families["DCGM_FI_DEV_GPU_TEMP"])
