"""Exposition: golden bytes for a seeded snapshot, DCGM dashboard 12239 compatibility, labels."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter import textformat
from exporter.catalogue import select_families
from exporter.collection import Collection
from exporter.errors import ConfigError
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.simulated import SimulatedBackend

GOLDEN = Path(__file__).parent / "golden"
T0 = 1_700_000_000.0
UPDATE = os.environ.get("GPUFED_REGEN_GOLDEN") == "1"


def render(*, gpus: int = 2, families=None, policy: LabelPolicy | None = None, steps=(0.0, 3600.0),
           xid_probability: float = 0.5) -> bytes:
    now = [T0]
    backend = SimulatedBackend(gpus, seed=7, node="node-a", xid_probability=xid_probability,
                               clock=lambda: now[0])
    collection = Collection(backend, families or select_families(include=["pcie", "gpm", "process"]),
                            timeout=None, clock=lambda: now[0], timer=lambda: 0.0)
    for step in steps:
        now[0] = T0 + step
        assert collection.collect_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(collection, policy or LabelPolicy(
        "node-a", placement={"region": "eu-1", "rack": "r07", "team": "training", "cluster": "c1"})))
    return textformat.fallback(registry)


def _series(text: bytes) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text.decode())}


def test_golden_bytes_of_seeded_snapshot() -> None:
    body = render()
    path = GOLDEN / "simulated_2gpu.prom"
    if UPDATE:
        path.write_bytes(body)
    assert body == path.read_bytes(), "regenerate with GPUFED_REGEN_GOLDEN=1 and review the diff"


def test_golden_has_xids_and_self_metrics() -> None:
    series = _series(render())
    assert series["gpufed_gpu_xid_errors"], "seed 7 with p=0.5 must produce XIDs in an hour"
    assert series["gpufed_exporter_last_collection_success_timestamp_seconds"][0].value == T0 + 3600
    assert series["gpufed_exporter_collections"][0].value == 2


def test_counters_never_go_backwards() -> None:
    fams = select_families()
    backend_now = [T0]
    backend = SimulatedBackend(8, seed=1, clock=lambda: backend_now[0])
    previous: dict[tuple[int, str], float] = {}
    for step in range(0, 7200, 97):
        backend_now[0] = T0 + step
        for reading in backend.read(fams).values():
            for name in ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"):
                key = (reading.gpu, name)
                assert reading.values[name] >= previous.get(key, 0.0)
                previous[key] = reading.values[name]
            assert 0 <= reading.values["DCGM_FI_DEV_GPU_UTIL"] <= 100


# Every query of Grafana dashboard 12239 (NVIDIA/dcgm-exporter grafana/dcgm-exporter-dashboard.json):
# metric, then the labels its selectors and `by (...)` clauses use.
DASHBOARD_12239 = [
    ("DCGM_FI_DEV_GPU_TEMP", ("Hostname", "gpu")),
    ("DCGM_FI_DEV_POWER_USAGE", ("Hostname", "gpu")),
    ("DCGM_FI_DEV_SM_CLOCK", ("Hostname", "gpu", "UUID")),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", ("Hostname", "gpu")),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", ("Hostname", "gpu")),
    ("DCGM_FI_DEV_FB_USED", ("Hostname", "gpu")),
    ("DCGM_FI_DEV_FB_FREE", ("Hostname", "gpu")),  # label_values(DCGM_FI_DEV_FB_FREE, Hostname)
]


@pytest.mark.parametrize(("metric", "labels"), DASHBOARD_12239)
def test_dashboard_12239_queries_find_eight_gpus(metric: str, labels: tuple[str, ...]) -> None:
    body = render(gpus=8, steps=(0.0, 5.0), families=select_families(include=["gpm"]),
                  policy=LabelPolicy("gpu-node-17"))
    samples = _series(body)[metric]
    # {Hostname=~"$Hostname", gpu=~"$gpu"} with both variables at one value
    assert len([s for s in samples if s.labels["Hostname"] == "gpu-node-17"]) == 8
    assert sorted(s.labels["gpu"] for s in samples) == [str(i) for i in range(8)]
    for sample in samples:
        assert all(sample.labels.get(label) for label in labels)
        assert {"device", "modelName", "pci_bus_id"} <= set(sample.labels)


def test_units_match_dcgm() -> None:
    series = _series(render(gpus=1, steps=(0.0,)))
    power = series["DCGM_FI_DEV_POWER_USAGE"][0].value
    used, free = series["DCGM_FI_DEV_FB_USED"][0].value, series["DCGM_FI_DEV_FB_FREE"][0].value
    assert 50 < power < 800  # watts
    assert used + free == 81559  # MiB of an H100 80GB HBM3
    assert 0 <= series["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][0].value <= 1  # ratio
    assert series["hami_host_gpu_memory_used_bytes"][0].value == used * 1024 * 1024
    # HAMi v2.10 writes percent under the _ratio name (NVML's utilisation rate as is)
    assert series["hami_host_gpu_utilization_ratio"][0].value == series["DCGM_FI_DEV_GPU_UTIL"][0].value


def test_one_hostname_label_never_both() -> None:
    for label, other in (("Hostname", "hostname"), ("hostname", "Hostname")):
        series = _series(render(gpus=1, steps=(0.0,), policy=LabelPolicy("n1", hostname_label=label)))
        gpu_samples = [s for samples in series.values() for s in samples if "gpu" in s.labels]
        assert gpu_samples
        assert all(s.labels[label] == "n1" and other not in s.labels for s in gpu_samples)


def test_hami_host_series_carry_hamis_own_labels_once_per_device() -> None:
    """HAMi v2.10's cmd/vGPUmonitor/metrics.go: node, device_index, device_uuid, device_type
    ("NVIDIA-" + the NVML name), one series per device, none of the DCGM series' labels."""
    policy = LabelPolicy("n1", placement={"region": "r1"})
    series = _series(render(gpus=2, steps=(0.0,), policy=policy))
    for name in ("hami_host_gpu_memory_used_bytes", "hami_host_gpu_utilization_ratio"):
        samples = series[name]
        assert [s.labels["device_index"] for s in samples] == ["0", "1"]
        assert all(set(s.labels) == {"node", "device_index", "device_uuid", "device_type"} for s in samples)
        assert all(s.labels["node"] == "n1" and s.labels["device_type"].startswith("NVIDIA-NVIDIA ")
                   for s in samples)


def test_hami_legacy_names_behind_flag() -> None:
    assert b"HostGPUMemoryUsage" not in render(gpus=1, steps=(0.0,))
    series = _series(render(gpus=1, steps=(0.0,), policy=LabelPolicy("n1", hami_legacy=True)))
    (sample,) = series["HostGPUMemoryUsage"]
    assert set(sample.labels) == {"nodeid", "deviceidx", "deviceuuid", "devicetype"}
    assert series["HostCoreUtilization"][0].value == series["DCGM_FI_DEV_GPU_UTIL"][0].value


def test_family_keep_and_deny_lists() -> None:
    assert "gpm" in select_families()  # default since issue 42: GPM costs nothing per scrape
    body = render(gpus=1, steps=(0.0,), families=select_families(exclude=["ecc", "hami", "gpm"]))
    assert b"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" not in body
    assert b"hami_host" not in body
    assert b"DCGM_FI_PROF_GR_ENGINE" not in body
    assert b"DCGM_FI_PROF_PCIE" not in body  # GPM's; the blocking pcie family stays opt-in
    assert b"DCGM_FI_DEV_GPU_UTIL" in body
    with pytest.raises(ConfigError, match="unknown metric families"):
        select_families(include=["infiniband"])


def test_pod_labels_from_attribution() -> None:
    class OnePod:
        def labels(self):
            return {backend.devices()[0].uuid: {"namespace": "ml", "pod": "train-0", "container": "main"}}

        def close(self) -> None:
            pass

    backend = SimulatedBackend(2, seed=7, clock=lambda: T0)
    collection = Collection(backend, select_families(), attribution=OnePod(), timeout=None, clock=lambda: T0)
    collection.collect_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(collection, LabelPolicy("n1")))
    series = _series(generate_latest(registry))
    pods = {s.labels["gpu"]: s.labels.get("pod") for s in series["DCGM_FI_DEV_GPU_UTIL"]}
    assert pods == {"0": "train-0", "1": None}


def test_golden_parses_in_promtool(promtool: str) -> None:
    import subprocess

    golden = (GOLDEN / "simulated_2gpu.prom").read_bytes()
    done = subprocess.run([promtool, "check", "metrics"], input=golden, capture_output=True, timeout=30)
    # 3 = lint findings only; DCGM's camelCase labels (UUID, modelName, Hostname) and its
    # counters without `_total` (dcgm-exporter's own names and types) are the point.
    assert done.returncode in (0, 3), done.stderr
    findings = (done.stdout + done.stderr).decode().splitlines()
    allowed = ("label names should be written in 'snake_case'", "metric name should not include type",
               'counter metrics should have "_total" suffix')
    assert all(any(a in line for a in allowed) for line in findings if line.strip()), findings
