"""What ``/proc`` says about the demo's processes: CPU, memory, start time, process group.

Linux only, like the demo. The supervisor records each process's start time (clock ticks
since boot) next to its PID, so a later run can tell the process it started from an
unrelated one that got the same PID, and so ``leftovers`` counts only what is really ours.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    pgrp: int
    start_ticks: int
    cpu_s: float
    """User + system time of the process and of the children it has reaped (promtool runs)."""
    rss_mib: float
    age_s: float
    """Seconds since the process started."""

    @property
    def cpu_pct(self) -> float:
        """Average share of one core over its life, in percent."""
        return round(100 * self.cpu_s / self.age_s, 1) if self.age_s > 0 else 0.0


def _uptime(proc: Path) -> float:
    return float((proc / "uptime").read_text().split()[0])


def read(pid: int, *, proc: Path = PROC) -> ProcStat | None:
    """The process's figures, or None when it is gone (or a zombie nobody reaped yet)."""
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may hold spaces and ')'; everything after the last ')' is fixed fields.
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state) of proc(5): index = field number - 3.
    state = fields[0]
    if state in ("Z", "X"):
        return None
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    start_ticks = int(fields[19])
    return ProcStat(
        pid=pid,
        state=state,
        pgrp=int(fields[2]),
        start_ticks=start_ticks,
        cpu_s=round((utime + stime + cutime + cstime) / TICKS, 2),
        rss_mib=round(int(fields[21]) * PAGE / (1 << 20), 1),
        age_s=round(max(0.0, _uptime(proc) - start_ticks / TICKS), 1),
    )


def same_process(pid: int, start_ticks: int, *, proc: Path = PROC) -> bool:
    stat = read(pid, proc=proc)
    return stat is not None and stat.start_ticks == start_ticks


def group_members(pgids: Collection[int], *, since_ticks: int = 0, proc: Path = PROC) -> list[int]:
    """Live processes in any of ``pgids`` that started at or after ``since_ticks``."""
    wanted = set(pgids)
    if not wanted:
        return []
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        stat = read(int(entry.name), proc=proc)
        if stat is not None and stat.pgrp in wanted and stat.start_ticks >= since_ticks:
            found.append(stat.pid)
    return sorted(found)
