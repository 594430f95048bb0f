"""The metric catalogue: every per-GPU metric we emit, its family, unit and help text.

Names and units are dcgm-exporter's (`etc/default-counters.csv`), so Grafana dashboard
12239 and existing alert rules keep working. Families group metrics by collection cost;
the keep/deny lists in settings pick families, and backends read only what is picked.
Pure data and one pure function; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from exporter.errors import ConfigError

Kind = Literal["gauge", "counter"]

# family -> (collected by default, why it exists / what it costs)
FAMILIES: dict[str, tuple[bool, str]] = {
    "core": (True, "utilisation, memory, temperature, power, energy, clocks, PCIe replays"),
    "ecc": (True, "volatile and aggregate ECC error counters"),
    "xid": (True, "XID errors: DCGM's last-XID gauge and gpufed's counter + last-seen time"),
    "health": (True, "gpufed_gpu_health: 0 after a critical XID or a failed read"),
    "hami": (True, "HAMi host metric names derived from the core readings"),
    "pcie": (False, "PCIe TX/RX throughput; NVML samples each direction for 20 ms"),
    "gpm": (False, "GPM profiling metrics (Hopper+), two samples per collection"),
    "process": (False, "per-process GPU memory; one NVML call per GPU, many series"),
    "nvlink": (False, "per-link NVLink state, throughput and error counters; ~3 NVML calls per link"),
}


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One per-GPU metric: exposed name, semantic kind, owning family and help text."""

    name: str
    kind: Kind
    family: str
    help: str


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("DCGM_FI_DEV_SM_CLOCK", "gauge", "core", "SM clock frequency (in MHz)."),
    MetricSpec("DCGM_FI_DEV_MEM_CLOCK", "gauge", "core", "Memory clock frequency (in MHz)."),
    MetricSpec("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "core", "Memory temperature (in C)."),
    MetricSpec("DCGM_FI_DEV_GPU_TEMP", "gauge", "core", "GPU temperature (in C)."),
    MetricSpec("DCGM_FI_DEV_POWER_USAGE", "gauge", "core", "Power draw (in W)."),
    MetricSpec(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "core",
        "Total energy consumption since boot (in mJ).",
    ),
    MetricSpec("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "core", "Total number of PCIe retries."),
    MetricSpec("DCGM_FI_DEV_GPU_UTIL", "gauge", "core", "GPU utilization (in %)."),
    MetricSpec("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "core", "Memory utilization (in %)."),
    MetricSpec("DCGM_FI_DEV_ENC_UTIL", "gauge", "core", "Encoder utilization (in %)."),
    MetricSpec("DCGM_FI_DEV_DEC_UTIL", "gauge", "core", "Decoder utilization (in %)."),
    MetricSpec("DCGM_FI_DEV_FB_FREE", "gauge", "core", "Framebuffer memory free (in MiB)."),
    MetricSpec("DCGM_FI_DEV_FB_USED", "gauge", "core", "Framebuffer memory used (in MiB)."),
    MetricSpec(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "ecc", "Total number of single-bit volatile ECC errors."
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "ecc", "Total number of double-bit volatile ECC errors."
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "ecc",
        "Total number of single-bit persistent ECC errors.",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "ecc",
        "Total number of double-bit persistent ECC errors.",
    ),
    MetricSpec(
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "counter", "pcie",
        "Total number of bytes transmitted through PCIe TX (in KB) via NVML.",
    ),
    MetricSpec(
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "counter", "pcie",
        "Total number of bytes received through PCIe RX (in KB) via NVML.",
    ),
    MetricSpec(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "gpm", "Ratio of time the graphics engine is active."
    ),
    MetricSpec(
        "DCGM_FI_PROF_SM_ACTIVE", "gauge", "gpm",
        "The ratio of cycles an SM has at least 1 warp assigned.",
    ),
    MetricSpec(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "gpm",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    MetricSpec(
        "DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "gpm",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
)

METRICS_BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in METRICS}

# XIDs after which a GPU needs attention (reset, drain or RMA); see NVIDIA's XID catalogue.
CRITICAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})


def select_families(*, include: Iterable[str] = (), exclude: Iterable[str] = ()) -> frozenset[str]:
    """Defaults plus the keep-list minus the deny-list; unknown names fail loudly."""
    include, exclude = list(include), list(exclude)
    unknown = sorted(name for name in set(include) | set(exclude) if name not in FAMILIES)
    if unknown:
        raise ConfigError(f"unknown metric families {unknown}; known: {sorted(FAMILIES)}")
    chosen = {name for name, (default, _) in FAMILIES.items() if default}
    return frozenset((chosen | set(include)) - set(exclude))


def metrics_for(families: Iterable[str]) -> tuple[MetricSpec, ...]:
    """Per-GPU metric specs of the chosen families, in catalogue order."""
    wanted = set(families)
    return tuple(spec for spec in METRICS if spec.family in wanted)
