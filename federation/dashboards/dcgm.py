"""DCGM 3.x or 4.x names in dashboard queries: one expression that reads either.

DCGM 4.6.0 (and `gpufed-exporter --dcgm-names 4`) renames some fields and changes units
(clocks MHz -> Hz, energy mJ -> J; GPU_UTIL_RATIO stays 0-100, as DCGM 4.6.0 fills it).
`--dcgm-names 4-draft` names are not read here.
Panels query `metric()` (counters `rate()`) instead of a bare name, so a
node on 3.x names, on 4.x names, or on both (a migration window: the two series carry
the same labels, so `or` keeps one) draws the same line in the 3.x unit. Selectors that
only need "a GPU exists" use `any_name()`, a `__name__` regex, valid where Grafana wants
a plain series selector (template variables). The table mirrors exporter/naming.py
(tests/dashboards check they agree); the dashboards do not import the exporter.
"""

from __future__ import annotations

from fractions import Fraction

ONE = Fraction(1)

# 3.x name -> (4.x name, exact factor from the 4.x unit back to the 3.x unit)
DCGM4: dict[str, tuple[str, Fraction]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("DCGM_FI_DEV_SM_CLOCK_HERTZ", Fraction(1, 1000000)),
    "DCGM_FI_DEV_MEM_CLOCK": ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", Fraction(1, 1000000)),
    "DCGM_FI_DEV_MEMORY_TEMP": ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", ONE),
    "DCGM_FI_DEV_GPU_TEMP": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", ONE),
    "DCGM_FI_DEV_POWER_USAGE": ("DCGM_FI_DEV_BOARD_POWER_WATTS", ONE),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", Fraction(1000)),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", ONE),
    "DCGM_FI_DEV_GPU_UTIL": ("DCGM_FI_DEV_GPU_UTIL_RATIO", ONE),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", ONE),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", ONE),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("DCGM_FI_DEV_ROW_REMAP_FAILED", ONE),
    "DCGM_FI_DEV_XID_ERRORS": ("DCGM_FI_DEV_XID_ERROR", ONE),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", ONE),
    "DCGM_FI_PROF_SM_ACTIVE": ("DCGM_FI_PROF_SM_UTIL_RATIO", ONE),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", ONE),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("DCGM_FI_PROF_DRAM_UTIL_RATIO", ONE),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", ONE),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", ONE),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL", ONE),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL", ONE),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL", ONE),
}


def _scaled(series: str, factor: Fraction) -> str:
    """``series`` times ``factor``, written as PromQL that stays exact (`/ 1048576`, `* 100`)."""
    if factor == 1:
        return series
    if factor.denominator == 1:
        return f"{series} * {factor.numerator}"
    return f"{series} / {factor.denominator}" if factor.numerator == 1 else f"{series} * {float(factor)!r}"


def metric(name: str, selector: str = "") -> str:
    """`name{selector}`, or `(name{selector} or new{selector} * factor)` for a renamed field."""
    old = f"{name}{{{selector}}}"
    if name not in DCGM4:
        return old
    new_name, factor = DCGM4[name]
    new = _scaled(f"{new_name}{{{selector}}}", factor)
    return f"({old} or {new})"


def rate(name: str, selector: str, window: str = "$__rate_interval") -> str:
    """``rate()`` of a counter under either name, in the 3.x unit per second (a range
    selector cannot hold ``or``, so the two rates are joined instead)."""
    old = f"rate({name}{{{selector}}}[{window}])"
    if name not in DCGM4:
        return old
    new_name, factor = DCGM4[name]
    return f"({old} or {_scaled(f'rate({new_name}{{{selector}}}[{window}])', factor)})"


def any_name(name: str, selector: str = "") -> str:
    """A series selector matching the field under either name: `{__name__=~"old|new", ...}`."""
    names = f"{name}|{DCGM4[name][0]}" if name in DCGM4 else name
    rest = f", {selector}" if selector else ""
    return f'{{__name__=~"{names}"{rest}}}'
