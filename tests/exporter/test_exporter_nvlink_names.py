"""`--dcgm-names 3|4|both` and the `nvlink` family: exact exposition bytes from the fake NVML."""

from __future__ import annotations

import logging
from fractions import Fraction

import pytest
from fake_nvml import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN, FakeGpu, FakeNvml
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from typer.testing import CliRunner

from exporter import naming, textformat
from exporter.catalogue import select_families
from exporter.collection import Collection
from exporter.commands import cli
from exporter.errors import BackendError
from exporter.exposition import LabelPolicy, SnapshotCollector
from exporter.naming import DCGM4, DCGM4_DRAFT, DcgmNames, exposed
from exporter.nvml_backend import NvmlBackend
from exporter.simulated import SimulatedBackend

UUID = "GPU-00000000-0000-0000-0000-000000000000"
LABELS = (f'DCGM_FI_DRIVER_VERSION="550.54.15",Hostname="node-a",UUID="{UUID}",device="nvidia0",gpu="0",'
          'modelName="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:18:00.0"')


def scrape(gpu: FakeGpu, families: frozenset[str], names: DcgmNames = "3") -> str:
    backend = NvmlBackend(FakeNvml([gpu]), event_timeout_ms=20)
    try:
        collection = Collection(backend, families, timeout=None, clock=lambda: 1.0, timer=lambda: 0.0)
        assert collection.collect_once()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(collection, LabelPolicy("node-a"), dcgm_names=names))
        return textformat.fallback(registry).decode()
    finally:
        backend.close()


def lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_dcgm4_names_and_units_exact() -> None:
    """`4`: DCGM 4.6.0's names, in the unit DCGM 4.6.0 fills them (GPU_UTIL_RATIO is 0-100)."""
    text = scrape(FakeGpu(uuid=UUID), select_families(), "4")
    assert lines(text, "DCGM_FI_DEV_GPU_UTIL") == [f"DCGM_FI_DEV_GPU_UTIL_RATIO{{{LABELS}}} 70.0"]
    assert lines(text, "DCGM_FI_DEV_GPU_TEMP") == [f"DCGM_FI_DEV_GPU_TEMP_CELSIUS{{{LABELS}}} 55.0"]
    power = lines(text, "DCGM_FI_DEV_BOARD_POWER_WATTS")
    assert power == [f"DCGM_FI_DEV_BOARD_POWER_WATTS{{{LABELS}}} 450.0"]
    assert lines(text, "DCGM_FI_DEV_PCIE_REPLAY") == [f"DCGM_FI_DEV_PCIE_REPLAY_TOTAL{{{LABELS}}} 3.0"]
    xid_labels = LABELS.replace('gpu="0"', 'err_code="0",err_msg="No Error",gpu="0"')
    assert lines(text, "DCGM_FI_DEV_XID_ERROR") == [f"DCGM_FI_DEV_XID_ERROR{{{xid_labels}}} 0.0"]
    for old in DCGM4:
        assert not lines(text, old + "{"), f"{old} must not appear with --dcgm-names 4"
    for draft in DCGM4_DRAFT.values():
        if draft.source == naming.DRAFT_SOURCE and draft.name not in {r.name for r in DCGM4.values()}:
            assert not lines(text, draft.name + "{"), f"{draft.name} is 4-draft only"
    expected = {
        "DCGM_FI_DEV_SM_CLOCK_HERTZ": "1.98e+09",  # 1980 MHz
        "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": "2.619e+09",
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": "123456.0",  # 123,456,789 mJ, floored
        "DCGM_FI_DEV_MEM_COPY_UTIL": "40.0",  # DCGM 4.6.0 keeps field 204's name
        "DCGM_FI_DEV_FB_USED": "40000.0",  # and 252's, in MiB
        "DCGM_FI_DEV_ROW_REMAP_FAILED": "0.0",
    }
    for name, value in expected.items():
        assert lines(text, name + "{") == [f"{name}{{{LABELS}}} {value}"]
    assert "# TYPE DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL counter\n" in text


def test_dcgm4_draft_adds_the_release_note_names_in_ratios_and_bytes() -> None:
    text = scrape(FakeGpu(uuid=UUID), select_families(), "4-draft")
    expected = {
        "DCGM_FI_DEV_GPU_UTIL_RATIO": "0.7",
        "DCGM_FI_DEV_MEMORY_UTIL_RATIO": "0.4",
        "DCGM_FI_DEV_FB_USED_BYTES": "4.194304e+10",  # 40,000 MiB
        "DCGM_FI_DEV_FB_CAPACITY_BYTES": "8.5520809984e+10",  # 81,559 MiB
        "DCGM_FI_DEV_SM_CLOCK_HERTZ": "1.98e+09",
    }
    for name, value in expected.items():
        assert lines(text, name + "{") == [f"{name}{{{LABELS}}} {value}"]
    assert not lines(text, "DCGM_FI_DEV_FB_USED{") and not lines(text, "DCGM_FI_DEV_MEM_COPY_UTIL{")


def test_dcgm3_is_unchanged_and_both_writes_each_renamed_reading_twice() -> None:
    three = scrape(FakeGpu(uuid=UUID), select_families(), "3")
    both = scrape(FakeGpu(uuid=UUID), select_families(), "both")
    assert lines(three, "DCGM_FI_DEV_GPU_UTIL") == [f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 70.0"]
    assert lines(both, "DCGM_FI_DEV_GPU_UTIL") == [
        f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 70.0", f"DCGM_FI_DEV_GPU_UTIL_RATIO{{{LABELS}}} 70.0",
    ]
    assert not lines(three, "DCGM_FI_DEV_FB_CAPACITY") and not lines(both, "DCGM_FI_DEV_FB_CAPACITY")
    # every 3.x line is still there in `both`, with the same labels
    samples = [line for line in three.splitlines() if line.startswith("DCGM_FI")]
    assert set(samples) <= set(both.splitlines())


def test_naming_table_is_consistent() -> None:
    assert exposed("DCGM_FI_DEV_FB_USED", "h", "4")[0].name == "DCGM_FI_DEV_FB_USED"
    assert exposed("DCGM_FI_DEV_FB_USED", "h", "4-draft")[0].name == "DCGM_FI_DEV_FB_USED_BYTES"
    assert exposed("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "h", "4")[0].name == "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
    # fields 200/201 (DCGM_FI_DEV_PCIE_{TX,RX}_THROUGHPUT): DCGM never fills them (issue 42)
    assert not {200, 201} & {row.rename.field_id for row in naming.table()}
    assert len({r.name for r in DCGM4.values()}) == len(DCGM4)  # no two 3.x fields share a 4.x name
    assert [r.name for r in exposed("DCGM_FI_DEV_GPU_TEMP", "h", "both")] == [
        "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"]


def test_nvlink_per_link_exact_bytes() -> None:
    gpu = FakeGpu(uuid=UUID, nvlinks=2, nvlinks_down={1})
    text = scrape(gpu, frozenset({"nvlink"}))
    nv = [line for line in text.splitlines() if "nvlink" in line]
    link = {i: LABELS.replace('modelName=', f'link="{i}",modelName=') for i in (0, 1)}
    assert nv == [
        "# HELP gpufed_nvlink_link_up 1 if the NVLink is active, else 0.",
        "# TYPE gpufed_nvlink_link_up gauge",
        f"gpufed_nvlink_link_up{{{link[0]}}} 1.0",
        f"gpufed_nvlink_link_up{{{link[1]}}} 0.0",
        "# HELP gpufed_nvlink_tx_bytes_total Bytes of data sent over the NVLink.",
        "# TYPE gpufed_nvlink_tx_bytes_total counter",
        f"gpufed_nvlink_tx_bytes_total{{{link[0]}}} 5.12e+09",
        f"gpufed_nvlink_tx_bytes_total{{{link[1]}}} 1.024e+10",
        "# HELP gpufed_nvlink_rx_bytes_total Bytes of data received over the NVLink.",
        "# TYPE gpufed_nvlink_rx_bytes_total counter",
        f"gpufed_nvlink_rx_bytes_total{{{link[0]}}} 2.56e+09",
        f"gpufed_nvlink_rx_bytes_total{{{link[1]}}} 5.12e+09",
        "# HELP gpufed_nvlink_replay_errors_total NVLink data-link replays (retransmissions).",
        "# TYPE gpufed_nvlink_replay_errors_total counter",
        f"gpufed_nvlink_replay_errors_total{{{link[0]}}} 0.0",
        f"gpufed_nvlink_replay_errors_total{{{link[1]}}} 1.0",
        "# HELP gpufed_nvlink_recovery_errors_total NVLink link recoveries (retraining).",
        "# TYPE gpufed_nvlink_recovery_errors_total counter",
        f"gpufed_nvlink_recovery_errors_total{{{link[0]}}} 0.0",
        f"gpufed_nvlink_recovery_errors_total{{{link[1]}}} 0.0",
        "# HELP gpufed_nvlink_crc_errors_total NVLink CRC errors, by type (flit, data).",
        "# TYPE gpufed_nvlink_crc_errors_total counter",
        f'gpufed_nvlink_crc_errors_total{{{link[0]},type="flit"}} 10.0',
        f'gpufed_nvlink_crc_errors_total{{{link[0]},type="data"}} 0.0',
        f'gpufed_nvlink_crc_errors_total{{{link[1]},type="flit"}} 11.0',
        f'gpufed_nvlink_crc_errors_total{{{link[1]},type="data"}} 1.0',
    ]


def test_nvlink_batched_and_absent_without_links() -> None:
    other = UUID.replace("0000-0000-0000-", "1111-0000-0000-")
    nvml = FakeNvml([FakeGpu(uuid=UUID, nvlinks=18), FakeGpu(uuid=other)])
    backend = NvmlBackend(nvml, event_timeout_ms=20)
    try:
        for _ in range(3):
            readings = backend.read({"nvlink"})
        assert [len(r.links) for r in readings.values()] == [18, 0]
        # one field-values call per GPU with links per read; links probed once
        assert nvml.calls["nvmlDeviceGetFieldValues"] == 3
        # links probed once (the refused link 18 included), then 18 state calls per read
        assert nvml.calls["nvmlDeviceGetNvLinkState"] == (18 + 1) + 1 + 3 * 18
    finally:
        backend.close()


def test_simulated_nvlink_counters_grow() -> None:
    now = [1_700_000_000.0]
    backend = SimulatedBackend(2, seed=3, node="n", clock=lambda: now[0])
    now[0] += 60
    first = backend.read({"nvlink"})[0].links
    now[0] += 60
    second = backend.read({"nvlink"})[0].links
    assert len(first) == 18
    assert all(b.tx_bytes > a.tx_bytes > 0 for a, b in zip(first, second, strict=True))  # type: ignore[operator]


@pytest.mark.parametrize(("value", "ok"), [("4", True), ("both", True), ("4-draft", True), ("5", False)])
def test_cli_flag_validates(value: str, ok: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def record(app) -> None:  # built, never started: release its socket and backend
        seen["names"] = app.settings.dcgm_names
        app.stop()

    monkeypatch.setattr(cli, "run_until_signal", record)
    result = CliRunner().invoke(cli.cli, ["serve", "--backend", "simulated", "--listen", "127.0.0.1:0",
                                          "--dcgm-names", value])
    if ok:
        assert result.exit_code == 0, result.output
        assert seen["names"] == value
    else:
        assert result.exit_code == 2
        assert "--dcgm-names" in result.output and "'5'" in result.output


def test_nvlink_error_leaves_that_value_out_not_the_gpu(caplog: pytest.LogCaptureFixture) -> None:
    gpu = FakeGpu(uuid=UUID, nvlinks=2, failing={"nvmlDeviceGetNvLinkErrorCounter": NVML_ERROR_UNKNOWN})
    with caplog.at_level(logging.WARNING, logger="exporter.nvml_nvlink"):
        text = scrape(gpu, select_families(include=["nvlink"]))
    assert lines(text, "gpufed_gpu_health{") == [f"gpufed_gpu_health{{{LABELS}}} 1.0"]
    assert lines(text, "DCGM_FI_DEV_GPU_TEMP{") == [f"DCGM_FI_DEV_GPU_TEMP{{{LABELS}}} 55.0"]
    assert len(lines(text, "gpufed_nvlink_link_up{")) == 2
    assert len(lines(text, "gpufed_nvlink_tx_bytes_total{")) == 2
    assert not lines(text, "gpufed_nvlink_crc_errors_total{")
    # one warning per GPU, call and error, however many links and reads
    warned = [r.getMessage() for r in caplog.records if "nvlink read failed" in r.getMessage()]
    assert warned == [
        "nvlink read failed gpu=0 call=crc_flit_errors error='NVML error 999' (series left out)",
        "nvlink read failed gpu=0 call=crc_data_errors error='NVML error 999' (series left out)",
    ]


def test_nvlink_state_error_drops_the_links_and_keeps_the_gpu() -> None:
    gpu = FakeGpu(uuid=UUID, nvlinks=18, failing={"nvmlDeviceGetNvLinkState": NVML_ERROR_UNKNOWN})
    text = scrape(gpu, select_families(include=["nvlink"]))
    assert lines(text, "gpufed_gpu_health{") == [f"gpufed_gpu_health{{{LABELS}}} 1.0"]
    assert not [line for line in text.splitlines() if line.startswith("gpufed_nvlink")]


def test_nvlink_lost_gpu_still_fails_the_reading() -> None:
    lost = {"nvmlDeviceGetNvLinkState": NVML_ERROR_GPU_IS_LOST}
    nvml = FakeNvml([FakeGpu(uuid=UUID, nvlinks=2, failing=lost)])
    backend = NvmlBackend(nvml, event_timeout_ms=20)
    try:
        with pytest.raises(BackendError, match="every GPU"):
            backend.read({"nvlink"})
    finally:
        backend.close()


def test_nvlink_all_links_inactive_is_one_down_series_per_link() -> None:
    """A GPU whose links exist but are down reports each link's state as disabled (public
    DCGM/NVSentinel reports: a PCIe A100 without its bridge); the exporter shows each as
    `gpufed_nvlink_link_up 0`, without failing anything. (One SXM H100 alone in a
    pass-through VM does not answer this way: see the next test.)"""
    gpu = FakeGpu(uuid=UUID, nvlinks=18, nvlinks_down=set(range(18)))
    text = scrape(gpu, select_families(include=["nvlink"]))
    up = lines(text, "gpufed_nvlink_link_up{")
    assert len(up) == 18 and all(line.endswith(" 0.0") for line in up)
    assert lines(text, "gpufed_gpu_health{") == [f"gpufed_gpu_health{{{LABELS}}} 1.0"]


@pytest.mark.parametrize("names", ["3", "4", "both"])
def test_nvlink_not_supported_as_the_h100_vm_answered(names: DcgmNames,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """What the H100 80GB HBM3 alone in a pass-through VM answered on 2026-11-26 (driver
    580.159.04, docs/measured/h100/run4/probe.json): NotSupported for the state of every
    link 0-35, for link 0's error counters, and in every slot of the per-link field batch
    (the all-links batch was not probed raw; the exporter wrote none of its series there).
    The exporter then writes no NVLink series at all (no `link_up 0` per link), logs
    nothing, keeps the GPU healthy, and asks for the link state once per process, not once
    per collection."""
    nvml = FakeNvml([FakeGpu(uuid=UUID)])
    backend = NvmlBackend(nvml, event_timeout_ms=20)
    families = select_families(include=["nvlink"])
    try:
        with caplog.at_level(logging.WARNING):
            text = _twice(backend, families, names, [1_700_000_000.0])
            backend.read(families)
    finally:
        backend.close()
    assert not [line for line in text.splitlines() if "NVLINK" in line.upper() and not line.startswith("#")]
    assert lines(text, "gpufed_gpu_health{") == [f"gpufed_gpu_health{{{LABELS}}} 1.0"]
    assert nvml.calls["nvmlDeviceGetNvLinkState"] == 1  # three collections, one probe
    assert nvml.calls["nvmlDeviceGetNvLinkErrorCounter"] == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


SEED_BUSY = 0


def _sample_values(text: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out.setdefault(name, []).append(float(line.rsplit(" ", 1)[1]))
    return out


def _twice(backend: NvmlBackend | SimulatedBackend, families: frozenset[str], names: DcgmNames,
           now: list[float]) -> str:
    """Exposition after a second collection (GPM needs two samples)."""
    collection = Collection(backend, families, timeout=None, clock=lambda: now[0], timer=lambda: 0.0)
    for _ in range(2):
        now[0] += 5
        assert collection.collect_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(collection, LabelPolicy("node-a"), dcgm_names=names))
    return generate_latest(registry).decode()


@pytest.mark.parametrize("names", ["3", "4", "both", "4-draft"])
def test_nvml_and_simulation_emit_the_same_names_in_range(names: DcgmNames) -> None:
    """What the GPU run compares on real hardware, here against the fake NVML: every name the
    simulation emits comes from NVML too, and the 4.x units are in range."""
    families = select_families(include=["pcie", "gpm", "process", "nvlink"])
    nvml = NvmlBackend(FakeNvml([FakeGpu(uuid=UUID, nvlinks=18)]), event_timeout_ms=20)
    try:
        real = _sample_values(_twice(nvml, families, names, [1_700_000_000.0]))
    finally:
        nvml.close()
    # At this seed and time the simulated GPU is busy, so it lists processes as the fake does.
    now = [1_700_000_000.0]
    busy = SimulatedBackend(1, seed=SEED_BUSY, node="node-a", xid_probability=0.0, clock=lambda: now[0])
    simulated = _sample_values(_twice(busy, families, names, now))
    assert set(real) == set(simulated)
    units = {row.rename.name: row.rename.unit for row in naming.table()
             if names in row.modes or (names == "both" and row.modes & {"3", "4"})}
    for name, values in real.items():
        if units.get(name) == "ratio":
            assert all(0.0 <= v <= 1.0 for v in values), name
        if units.get(name) == "percent":
            assert all(0.0 <= v <= 100.0 for v in values), name
        assert all(v >= 0 for v in values), name


@pytest.mark.parametrize(("old", "value", "expected"), [
    ("DCGM_FI_DEV_GPU_UTIL", 70.0, 70.0),
    ("DCGM_FI_DEV_SM_CLOCK", 1335.0, 1_335_000_000.0),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 123_456_789.0, 123_456.0),  # whole joules, floored
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 999.0, 0.0),
])  # fmt: skip
def test_each_unit_change_is_exact(old: str, value: float, expected: float) -> None:
    assert DCGM4[old].convert(value) == expected


@pytest.mark.parametrize(("old", "value", "expected"), [
    ("DCGM_FI_DEV_GPU_UTIL", 70.0, 0.7), ("DCGM_FI_DEV_ENC_UTIL", 3.0, 0.03),
    ("DCGM_FI_DEV_FB_FREE", 41559.0, 41559 * 2**20),
])  # fmt: skip
def test_each_draft_unit_change_is_exact(old: str, value: float, expected: float) -> None:
    assert DCGM4_DRAFT[old].convert(value) == expected


@given(st.integers(min_value=0, max_value=10**9))
def test_converted_readings_come_back_to_the_3x_value(value: int) -> None:
    """What the dashboards do (dashboards/dcgm.py multiplies the 4.x series back): exact for
    every unit but joules, which DCGM floors (back within one joule, i.e. 1000 mJ)."""
    for old, rename in {**DCGM4, **DCGM4_DRAFT}.items():
        back = Fraction(rename.convert(float(value))) / rename.scale
        if rename.integer:
            assert 0 <= value - back < 1000, old
        elif rename.scale.denominator == 1:
            assert back == value, old
        else:
            assert abs(back - value) <= Fraction(value, 10**12) + Fraction(1, 10**9), old


def test_capacity_needs_a_known_total() -> None:
    assert naming.capacity_bytes(0.0) is None
    assert naming.capacity_bytes(81559.0) == 81559 * 2**20


def test_nvlink_per_link_dcgm_series_with_dcgm_exporter_link_labels() -> None:
    """`--nvlink-series dcgm`: DCGM 4.6.0's per-link fields (1525-1531), labelled the way
    dcgm-exporter labels a GPU's NVLink entity; a link that is down is left out."""
    backend = NvmlBackend(FakeNvml([FakeGpu(uuid=UUID, nvlinks=2, nvlinks_down={1})]), event_timeout_ms=20)
    try:
        collection = Collection(backend, frozenset({"nvlink"}), timeout=None, clock=lambda: 1.0,
                                timer=lambda: 0.0)
        assert collection.collect_once()
        registry = CollectorRegistry(auto_describe=False)
        # the GPU series' default `Hostname`: dcgm-exporter's link template writes `hostname`
        policy = LabelPolicy("node-a")
        registry.register(SnapshotCollector(collection, policy, nvlink_series="dcgm"))
        text = textformat.fallback(registry).decode()
    finally:
        backend.close()
    link0 = ('DCGM_FI_DRIVER_VERSION="550.54.15",device="nvidia0",gpu="0",'
             f'gpu_uuid="{UUID}",hostname="node-a",model_name="NVIDIA H100 80GB HBM3",nvlink="0",'
             'pci_bus_id="00000000:18:00.0"')
    assert [line for line in text.splitlines() if "NVLINK" in line] == [
        "# HELP DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_PER_LINK_TOTAL NVLink flow-control CRC errors on this "
        "link.",
        "# TYPE DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_PER_LINK_TOTAL counter",
        f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_PER_LINK_TOTAL{{{link0}}} 10.0",
        "# HELP DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_PER_LINK_TOTAL NVLink data CRC errors on this link.",
        "# TYPE DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_PER_LINK_TOTAL counter",
        f"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_PER_LINK_TOTAL{{{link0}}} 0.0",
        "# HELP DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL NVLink replays on this link.",
        "# TYPE DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL counter",
        f"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL{{{link0}}} 0.0",
        "# HELP DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_PER_LINK_TOTAL NVLink recoveries on this link.",
        "# TYPE DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_PER_LINK_TOTAL counter",
        f"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_PER_LINK_TOTAL{{{link0}}} 0.0",
        "# HELP DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK NVLink data sent and received on this link (in KiB).",
        "# TYPE DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK counter",
        f"DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK{{{link0}}} 7.5e+06",  # 5,000,000 + 2,500,000 KiB
        "# HELP DCGM_FI_DEV_NVLINK_TX_THROUGHPUT_PER_LINK NVLink data sent on this link (in KiB).",
        "# TYPE DCGM_FI_DEV_NVLINK_TX_THROUGHPUT_PER_LINK counter",
        f"DCGM_FI_DEV_NVLINK_TX_THROUGHPUT_PER_LINK{{{link0}}} 5e+06",
        "# HELP DCGM_FI_DEV_NVLINK_RX_THROUGHPUT_PER_LINK NVLink data received on this link (in KiB).",
        "# TYPE DCGM_FI_DEV_NVLINK_RX_THROUGHPUT_PER_LINK counter",
        f"DCGM_FI_DEV_NVLINK_RX_THROUGHPUT_PER_LINK{{{link0}}} 2.5e+06",
    ]
    assert "gpufed_nvlink" not in text


def test_nvlink_gpu_totals_and_rate_from_nvml() -> None:
    """The default `nvlink_gpu` family: the all-links counters DCGM sums for field 449, and
    bytes per second from two collections 5 s apart."""
    gpu = FakeGpu(uuid=UUID, nvlinks=2)
    backend = NvmlBackend(FakeNvml([gpu]), event_timeout_ms=20, clock=lambda: now[0])
    now = [100.0]
    try:
        first = backend.read({"nvlink_gpu"})[0].values
        gpu.nvlink_tx_kib += 1000  # 1,000 KiB more on link 0, 2,000 on link 1 (fake: x (link + 1))
        now[0] += 5
        second = backend.read({"nvlink_gpu"})[0].values
    finally:
        backend.close()
    assert first["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == 5_000_000 * 3 + 2_500_000 * 3  # TX + RX KiB
    assert "DCGM_FI_PROF_NVLINK_TX_BYTES" not in first  # a rate needs a previous sample
    assert second["DCGM_FI_PROF_NVLINK_TX_BYTES"] == 3000 * 1024 / 5
    assert second["DCGM_FI_PROF_NVLINK_RX_BYTES"] == 1500 * 1024 / 5
    assert second["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == 10 + 11
    no_links = NvmlBackend(FakeNvml([FakeGpu(uuid=UUID)]), event_timeout_ms=20)
    try:
        assert not any("NVLINK" in name for name in no_links.read({"nvlink_gpu"})[0].values)
    finally:
        no_links.close()
