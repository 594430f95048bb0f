"""DCGM 3.x or 4.x metric names on the wire (`--dcgm-names 3|4|both`).

Backends and the catalogue speak DCGM 3.x names in 3.x units; this pure table says what
dcgm-exporter 4.9 (DCGM 4.7's field-naming standard) calls the same reading and how its
unit changes, and `exposed()` turns one catalogue metric into the series to write.
`both` writes each renamed reading twice (old name and unit, new name and unit) for a
migration window: the rule pack reads `old or new`, so such a node is counted once.

Sources (exporter/README.md has the table): the alias block "renamed per DCGM Field Naming
Standard" in DCGM's `dcgm_fields` (temperatures, power, PCIe replays, utilisation, XID and
the profiling ratios); go-dcgm's field constants for DCGM 4.6.1/4.7 (the hertz clocks
1603/1604 and joules 1611, each marked as the replacement of the 3.x field); and NVIDIA's
field identifiers for DCGM 4.7 (the copy/encoder/decoder ratios 1614-1616 and the
framebuffer bytes 1625-1627). dcgm-exporter 4.9.0's release note counts eleven unit
changes: clocks MHz -> Hz, energy mJ -> J, utilisation % -> 0-1, memory MiB -> bytes and
NVLink throughput; all but NVLink throughput (which gpufed does not export under a DCGM
name) are here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

DcgmNames = Literal["3", "4", "both"]
NAMINGS: tuple[str, ...] = ("3", "4", "both")

MIB = 1 << 20
CAPACITY = "DCGM_FI_DEV_FB_CAPACITY_BYTES"
"""Total framebuffer in bytes: dcgm-exporter 4.9 collects it by default; no 3.x series."""
CAPACITY_HELP = "Total framebuffer memory (in bytes)."


@dataclass(frozen=True, slots=True)
class Rename:
    """The DCGM 4.x name of a 3.x field, the exact factor from the 3.x unit, and its help.

    ``scale`` is a fraction, so 70 % is exactly 0.7 (70 * Fraction(1, 100)) and 1335 MHz
    exactly 1335000000 Hz. ``integer``: the 4.x field is an integer count (joules), so the
    converted value is floored as DCGM does."""

    name: str
    scale: Fraction
    help: str
    integer: bool = False

    def convert(self, value: float) -> float:
        """``value`` (3.x unit) in this name's unit."""
        if self.scale == 1:
            return value
        exact = Fraction(value) * self.scale
        return float(math.floor(exact)) if self.integer else float(exact)


ONE = Fraction(1)
PERCENT = Fraction(1, 100)

DCGM4: dict[str, Rename] = {
    "DCGM_FI_DEV_SM_CLOCK": Rename(
        "DCGM_FI_DEV_SM_CLOCK_HERTZ", Fraction(10**6),
        "SM clock frequency (in Hz).",
    ),
    "DCGM_FI_DEV_MEM_CLOCK": Rename(
        "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", Fraction(10**6),
        "Memory clock frequency (in Hz).",
    ),
    "DCGM_FI_DEV_MEMORY_TEMP": Rename(
        "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", ONE,
        "Memory temperature (in C).",
    ),
    "DCGM_FI_DEV_GPU_TEMP": Rename(
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS", ONE,
        "GPU temperature (in C).",
    ),
    "DCGM_FI_DEV_POWER_USAGE": Rename(
        "DCGM_FI_DEV_BOARD_POWER_WATTS", ONE,
        "Board power draw (in W).",
    ),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": Rename(
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", Fraction(1, 1000),
        "Total energy consumption since the driver was loaded (in J).", integer=True,
    ),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": Rename(
        "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", ONE,
        "Total number of PCIe retries.",
    ),
    "DCGM_FI_DEV_GPU_UTIL": Rename(
        "DCGM_FI_DEV_GPU_UTIL_RATIO", PERCENT,
        "GPU utilization (ratio 0-1).",
    ),
    "DCGM_FI_DEV_MEM_COPY_UTIL": Rename(
        "DCGM_FI_DEV_MEMORY_UTIL_RATIO", PERCENT,
        "Memory utilization (ratio 0-1).",
    ),
    "DCGM_FI_DEV_ENC_UTIL": Rename(
        "DCGM_FI_DEV_ENC_UTIL_RATIO", PERCENT,
        "Encoder utilization (ratio 0-1).",
    ),
    "DCGM_FI_DEV_DEC_UTIL": Rename(
        "DCGM_FI_DEV_DEC_UTIL_RATIO", PERCENT,
        "Decoder utilization (ratio 0-1).",
    ),
    "DCGM_FI_DEV_FB_FREE": Rename(
        "DCGM_FI_DEV_FB_FREE_BYTES", Fraction(MIB),
        "Framebuffer memory free (in bytes).",
    ),
    "DCGM_FI_DEV_FB_USED": Rename(
        "DCGM_FI_DEV_FB_USED_BYTES", Fraction(MIB),
        "Framebuffer memory used (in bytes).",
    ),
    "DCGM_FI_DEV_XID_ERRORS": Rename(
        "DCGM_FI_DEV_XID_ERROR", ONE,
        "Value of the last XID error encountered.",
    ),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": Rename(
        "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", ONE,
        "Ratio of time the graphics engine is active.",
    ),
    "DCGM_FI_PROF_SM_ACTIVE": Rename(
        "DCGM_FI_PROF_SM_UTIL_RATIO", ONE,
        "The ratio of cycles an SM has at least 1 warp assigned.",
    ),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": Rename(
        "DCGM_FI_PROF_TENSOR_UTIL_RATIO", ONE,
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    "DCGM_FI_PROF_DRAM_ACTIVE": Rename(
        "DCGM_FI_PROF_DRAM_UTIL_RATIO", ONE,
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
}


def exposed(name: str, help_text: str, names: DcgmNames) -> tuple[Rename, ...]:
    """The series one 3.x-named reading becomes: (name, scale, help) per series, in order."""
    old = Rename(name, ONE, help_text)
    new = DCGM4.get(name)
    if new is None or names == "3":
        return (old,)
    if names == "4":
        return (new,)
    return (old, new)


def capacity_bytes(total_mib: float) -> float | None:
    """``DCGM_FI_DEV_FB_CAPACITY_BYTES`` from a device's total in MiB; None when unknown (0)."""
    return float(round(Fraction(total_mib) * MIB)) if total_mib > 0 else None
