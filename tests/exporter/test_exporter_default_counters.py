"""Golden comparison of /metrics with dcgm-exporter's own default set.

`exporter/upstream/dcgm-exporter-default-counters.csv` is dcgm-exporter's
`etc/default-counters.csv` at its newest tag (4.5.3-4.8.2), unchanged. Every active row
(not a comment) must be on a default `gpufed-exporter serve`'s /metrics (NVML backend,
`--dcgm-names 3`, an H100 with GPM) with the same Prometheus type (`label` rows: a label on
every DCGM series). A GPU without GPM is covered by test_exporter_gpm_mig.py.
"""

from __future__ import annotations

import contextlib
import re
import urllib.request
from pathlib import Path

from conftest import wait_for
from fake_nvml import FakeGpu, FakeNvml

from exporter.app import ExporterApp
from exporter.nvml_backend import NvmlBackend
from exporter.settings import ExporterSettings

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "exporter" / "upstream" / "dcgm-exporter-default-counters.csv"
UUID = "GPU-6f1a5c2e-8b3d-4e7f-9a10-2c4b6d8e0f12"


def active_rows() -> list[tuple[str, str]]:
    """(field, type) of every row dcgm-exporter collects by default."""
    rows = []
    for line in CSV.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            field, kind, _ = (part.strip() for part in line.split(",", 2))
            rows.append((field, kind))
    return rows


def metrics(families: list[str] | None = None) -> str:
    backend = NvmlBackend(FakeNvml([FakeGpu(uuid=UUID, nvlinks=18)], driver="580.95.05"), event_timeout_ms=20)
    settings = ExporterSettings(backend="nvml", listen="127.0.0.1:0", node_name="n1", collect_interval=0.05,
                                families_include=families or [])
    app = ExporterApp(settings, backend=backend)
    app.start()
    try:
        # two collections: the NVLink rate needs a previous sample
        with contextlib.suppress(AssertionError):
            wait_for(lambda: app.collection.stats.collections >= 2, timeout=10, interval=0.02)
        with urllib.request.urlopen(f"http://127.0.0.1:{app.http.port}/metrics", timeout=10) as response:
            return str(response.read().decode())
    finally:
        app.stop()


def types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def test_the_csv_is_the_default_set_we_compare_with() -> None:
    rows = dict(active_rows())
    assert len(rows) == 26
    assert rows["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert rows["DCGM_FI_DRIVER_VERSION"] == "label"


def test_every_active_row_is_on_metrics_with_its_type() -> None:
    text = metrics()
    typed = types(text)
    missing = []
    for field, kind in active_rows():
        if kind == "label":
            series = [line for line in text.splitlines() if line.startswith("DCGM_FI_")]
            assert series and all(f'{field}="580.95.05"' in line for line in series), field
        elif field in typed:
            assert typed[field] == kind, f"{field}: {typed[field]} here, {kind} in dcgm-exporter"
            assert re.search(rf"^{field}\{{", text, re.M), f"{field} has no sample"
        else:
            missing.append(field)
    assert not missing, f"not on a default /metrics: {missing}"
