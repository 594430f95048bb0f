"""DCGM 3.x or 4.x metric names on the wire (`--dcgm-names 3|4|both`).

Backends and the catalogue speak DCGM 3.x names in 3.x units; this pure table says what
dcgm-exporter 4.9 (DCGM 4.7's field-naming standard) calls the same reading and how its
unit changes, and `exposed()` turns one catalogue metric into the series to write.
`both` writes each renamed reading twice (old name and unit, new name and unit) for a
migration window: the rule pack reads `old or new`, so such a node is counted once.

Only renames confirmed in DCGM's own `dcgmlib/dcgm_fields.h` (its "renamed per DCGM Field
Naming Standard" alias table) are listed. Fields whose 4.7 name we could not confirm
(clocks, energy, framebuffer, copy/encoder/decoder utilisation) keep their 3.x name and
unit in every mode; exporter/README.md lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DcgmNames = Literal["3", "4", "both"]
NAMINGS: tuple[str, ...] = ("3", "4", "both")


@dataclass(frozen=True, slots=True)
class Rename:
    """The DCGM 4.x name of a 3.x field, the divisor from the 3.x unit, and its help text.

    A divisor, not a factor: 70 / 100 is 0.7 exactly, 70 * 0.01 is 0.7000000000000001.
    """

    name: str
    divisor: float
    help: str


DCGM4: dict[str, Rename] = {
    "DCGM_FI_DEV_MEMORY_TEMP": Rename("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 1.0, "Memory temperature (in C)."),
    "DCGM_FI_DEV_GPU_TEMP": Rename("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1.0, "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": Rename("DCGM_FI_DEV_BOARD_POWER_WATTS", 1.0, "Board power draw (in W)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": Rename(
        "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 1.0, "Total number of PCIe retries."
    ),
    # The one default field whose unit changes among the confirmed renames: % -> 0-1.
    "DCGM_FI_DEV_GPU_UTIL": Rename("DCGM_FI_DEV_GPU_UTIL_RATIO", 100.0, "GPU utilization (ratio 0-1)."),
    "DCGM_FI_DEV_XID_ERRORS": Rename(
        "DCGM_FI_DEV_XID_ERROR", 1.0, "Value of the last XID error encountered."
    ),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": Rename(
        "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1.0, "Ratio of time the graphics engine is active."
    ),
    "DCGM_FI_PROF_SM_ACTIVE": Rename(
        "DCGM_FI_PROF_SM_UTIL_RATIO", 1.0, "The ratio of cycles an SM has at least 1 warp assigned."
    ),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": Rename(
        "DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1.0, "Ratio of cycles the tensor (HMMA) pipe is active."
    ),
    "DCGM_FI_PROF_DRAM_ACTIVE": Rename(
        "DCGM_FI_PROF_DRAM_UTIL_RATIO", 1.0,
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
}

#: 3.x fields dcgm-exporter 4.9 renames whose DCGM 4.7 name we could not confirm.
UNCONFIRMED: tuple[str, ...] = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
)


def exposed(name: str, help_text: str, names: DcgmNames) -> tuple[Rename, ...]:
    """The series one 3.x-named reading becomes: (name, divisor, help) per series, in order."""
    old = Rename(name, 1.0, help_text)
    new = DCGM4.get(name)
    if new is None or names == "3":
        return (old,)
    if names == "4":
        return (new,)
    return (old, new)
