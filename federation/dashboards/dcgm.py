"""DCGM 3.x or 4.x names in dashboard queries: one expression that reads either.

dcgm-exporter 4.9 (and `gpufed-exporter --dcgm-names 4`) renames some fields and turns
utilisation from % into a 0-1 ratio. Panels query `metric()` instead of a bare name, so a
node on 3.x names, on 4.x names, or on both (a migration window: the two series carry
the same labels, so `or` keeps one) draws the same line in the 3.x unit. Selectors that
only need "a GPU exists" use `any_name()`, a `__name__` regex, valid where Grafana wants
a plain series selector (template variables). The table mirrors exporter/naming.py
(tests/dashboards check they agree); the dashboards do not import the exporter.
"""

from __future__ import annotations

# 3.x name -> (4.x name, factor from the 4.x unit back to the 3.x unit)
DCGM4: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_MEMORY_TEMP": ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("DCGM_FI_DEV_BOARD_POWER_WATTS", 1.0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 1.0),
    "DCGM_FI_DEV_GPU_UTIL": ("DCGM_FI_DEV_GPU_UTIL_RATIO", 100.0),
    "DCGM_FI_DEV_XID_ERRORS": ("DCGM_FI_DEV_XID_ERROR", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("DCGM_FI_PROF_SM_UTIL_RATIO", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("DCGM_FI_PROF_DRAM_UTIL_RATIO", 1.0),
}


def metric(name: str, selector: str = "") -> str:
    """`name{selector}`, or `(name{selector} or new{selector} * factor)` for a renamed field."""
    old = f"{name}{{{selector}}}"
    if name not in DCGM4:
        return old
    new_name, factor = DCGM4[name]
    new = f"{new_name}{{{selector}}}" + ("" if factor == 1.0 else f" * {factor:g}")
    return f"({old} or {new})"


def any_name(name: str, selector: str = "") -> str:
    """A series selector matching the field under either name: `{__name__=~"old|new", ...}`."""
    names = f"{name}|{DCGM4[name][0]}" if name in DCGM4 else name
    rest = f", {selector}" if selector else ""
    return f'{{__name__=~"{names}"{rest}}}'
