"""The metric catalogue: every per-GPU metric we emit, its family, unit and help text.

Names, types and units come from `exporter/dcgm_names.csv` (through `exporter.naming`):
dcgm-exporter's `etc/default-counters.csv` names, so Grafana dashboard 12239 and
existing alert rules keep working. Families group metrics by collection cost;
the keep/deny lists in settings pick families, and backends read only what is picked.
Pure data and one pure function; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from exporter import naming
from exporter.errors import ConfigError

Kind = Literal["gauge", "counter"]

# family -> (collected by default, why it exists / what it costs)
FAMILIES: dict[str, tuple[bool, str]] = {
    "core": (True, "utilisation, memory, temperature, power, energy, clocks, PCIe replays"),
    "ecc": (True, "volatile and aggregate ECC error counters"),
    "xid": (True, "XID errors: DCGM's last-XID gauge and gpufed's counter + last-seen time"),
    "health": (True, "gpufed_gpu_health: 0 after a critical XID or a failed read"),
    "hami": (True, "HAMi vGPU monitor's host series (hami_host_*, v2.10 names, labels) from core readings"),
    "pcie": (False, "PCIe TX/RX bytes per second from NVML's blocking call (20 ms per direction); "
                    "only for a GPU without GPM, where the gpm family fills them"),
    "nvlink_gpu": (True, "per-GPU NVLink totals: bandwidth counter, TX/RX bytes per second, error totals"),
    "gpm": (True, "GPM (Hopper+): profiling ratios and PCIe bytes per second between two samples, "
                  "per MIG instance where NVML has them; no series on a GPU without GPM"),
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
    families: frozenset[str] = frozenset()  # every family that emits it (the table's column)


# Readings that are not a plain per-GPU series of their own: the XID family renders the
# last XID, the driver version is a label, the framebuffer total feeds a 4-draft name.
_NOT_SERIES = frozenset({"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DRIVER_VERSION", "DCGM_FI_DEV_FB_TOTAL"})


def _from_table() -> tuple[MetricSpec, ...]:
    """One spec per reading of exporter/dcgm_names.csv, in table order, typed by its 3.x row."""
    out: dict[str, MetricSpec] = {}
    for row in naming.table():
        if row.reading in out or row.reading in _NOT_SERIES or row.reading.startswith(naming.LINK_PREFIX):
            continue
        kind: Kind = "counter" if row.rename.kind == "counter" else "gauge"
        families = frozenset(row.family.split())
        out[row.reading] = MetricSpec(row.reading, kind, row.family.split()[0], row.rename.help, families)
    return tuple(out.values())


METRICS: tuple[MetricSpec, ...] = _from_table()

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
    return tuple(spec for spec in METRICS if spec.families & wanted)
