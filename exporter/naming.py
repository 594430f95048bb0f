"""DCGM names on the wire (`--dcgm-names 3|4|both|4-draft`), read from one table.

`exporter/dcgm_names.csv` lists every DCGM name the exporter writes: the reading it comes
from (backends and the catalogue speak DCGM 3.x names in 3.x units), its DCGM field id,
Prometheus type, unit, the naming modes that emit it, the exact factor from the reading's
unit, and the upstream file that defines it (a key of `exporter/dcgm_sources.csv`:
repository, path and commit). Nothing else in the exporter spells a 4.x name.

Modes:
- ``3``: the names of dcgm-exporter's `default-counters.csv` (4.5.3-4.8.2), DCGM 3.x units.
- ``4``: the names DCGM 4.6.0's `dcgm_fields.h` (and go-dcgm 4.6.1's bindings, for the
  hertz clocks and joules) give the same fields, in the unit DCGM 4.6.0 fills them:
  `DCGM_FI_DEV_GPU_UTIL_RATIO` is field 203 and reads 0-100, as DCGM 4.6.0 fills it.
- ``both``: every reading under its 3.x row and its 4 row (a migration window).
- ``4-draft``: ``4`` with the names no upstream file in reach defines (the dcgm-exporter
  4.9.0 release note's framebuffer bytes and copy/encoder/decoder ratios) and its 0-1
  `GPU_UTIL_RATIO`. Emitted only when asked for by name.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Literal

DcgmNames = Literal["3", "4", "both", "4-draft"]
NAMINGS: tuple[str, ...] = ("3", "4", "both", "4-draft")
TABLE = Path(__file__).with_name("dcgm_names.csv")
SOURCES = Path(__file__).with_name("dcgm_sources.csv")
DRAFT_SOURCE = "release-note"
MIB = 1 << 20
ONE = Fraction(1)


@dataclass(frozen=True, slots=True)
class Rename:
    """One emitted name: its exact factor from the reading's unit, help, type and source.

    ``scale`` is a fraction, so 70 % is exactly 0.7 (70 * Fraction(1, 100)) and 1335 MHz
    exactly 1335000000 Hz. ``integer``: the field is an integer count (joules), so the
    converted value is floored as DCGM does."""

    name: str
    scale: Fraction
    help: str
    integer: bool = False
    kind: str = "gauge"
    field_id: int | None = None
    unit: str = ""
    source: str = ""

    def convert(self, value: float) -> float:
        """``value`` (the reading's unit) in this name's unit."""
        if self.scale == 1:
            return value
        exact = Fraction(value) * self.scale
        return float(math.floor(exact)) if self.integer else float(exact)


@dataclass(frozen=True, slots=True)
class Row:
    """One line of `dcgm_names.csv`."""

    reading: str
    rename: Rename
    modes: frozenset[str]
    family: str


def _rows_of(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


@cache
def sources() -> dict[str, dict[str, str]]:
    """Source key -> repository, path, commit and what it is."""
    out = {}
    for line in SOURCES.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, repo, path, commit, what = line.split(",", 4)
        out[key] = {"repository": repo, "path": path, "commit": commit, "what": what}
    return out


@cache
def table() -> tuple[Row, ...]:
    """Every row of the name table, in file order."""
    out = []
    for raw in _rows_of(TABLE):
        rename = Rename(
            name=raw["name"], scale=Fraction(raw["scale"]), help=raw["help"],
            integer=raw["integer"] == "1", kind=raw["type"],
            field_id=int(raw["field_id"]) if raw["field_id"] else None,
            unit=raw["unit"], source=raw["source"],
        )
        out.append(Row(raw["reading"], rename, frozenset(raw["modes"].split()), raw["family"]))
    return tuple(out)


def _mode_rows(reading: str, mode: str) -> list[Row]:
    return [row for row in table() if row.reading == reading and mode in row.modes]


def exposed(name: str, help_text: str, names: DcgmNames) -> tuple[Rename, ...]:
    """The series one reading becomes under ``names``, in order (3.x first under ``both``).

    A reading the table does not list (gpufed's own series) keeps its name and help."""
    if not any(row.reading == name for row in table()):
        return (Rename(name, ONE, help_text),)
    if names == "both":
        picked = _mode_rows(name, "3") + _mode_rows(name, "4")
    elif names == "4-draft":
        picked = _mode_rows(name, "4-draft") or _mode_rows(name, "4")
    else:
        picked = _mode_rows(name, names)
    seen: set[str] = set()
    out = []
    for row in picked:
        if row.rename.name not in seen:
            seen.add(row.rename.name)
            out.append(row.rename)
    return tuple(out)


def renames(mode: str) -> dict[str, Rename]:
    """Reading -> its ``mode`` name where that differs from the 3.x row (name or scale)."""
    out = {}
    for row in table():
        if mode not in row.modes or "3" in row.modes:
            continue
        old = _mode_rows(row.reading, "3")
        if old:
            out[row.reading] = row.rename
    return out


DCGM4: dict[str, Rename] = renames("4")
"""3.x reading -> its DCGM 4.6 name (proven); the dashboards' table mirrors this one."""
DCGM4_DRAFT: dict[str, Rename] = renames("4-draft")
"""3.x reading -> its draft name, emitted only with ``--dcgm-names 4-draft``."""
LINK_PREFIX = "link:"
"""Readings of one NVLink (`NvLinkReading` attributes), written per link under DCGM 4.6.0's
per-link field names with `--nvlink-series dcgm`."""
CAPACITY = "DCGM_FI_DEV_FB_CAPACITY_BYTES"
CAPACITY_READING = "DCGM_FI_DEV_FB_TOTAL"


def link_rows() -> tuple[Row, ...]:
    """The per-link rows, in table order (the same names in every mode)."""
    return tuple(row for row in table() if row.reading.startswith(LINK_PREFIX))


def label_name(reading: str, names: DcgmNames) -> str:
    """The label a `label`-typed row (the driver version) is written under."""
    rows = exposed(reading, "", names)
    return rows[0].name


def capacity_bytes(total_mib: float) -> float | None:
    """``DCGM_FI_DEV_FB_CAPACITY_BYTES`` from a device's total in MiB; None when unknown (0)."""
    return float(round(Fraction(total_mib) * MIB)) if total_mib > 0 else None
