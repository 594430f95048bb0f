"""What the OS says about the demo's processes: CPU, memory, start time, process group.

Read through ``psutil``. The supervisor records each process's start time (clock ticks
since boot, as ``/proc/<pid>/stat`` field 22 has it) next to its PID, so a later run can
tell the process it started from an unrelated one that got the same PID, and so
``leftovers`` counts only what is really ours.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import dataclass

import psutil

TICKS = os.sysconf("SC_CLK_TCK")


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


def _start_ticks(create_time: float) -> int:
    """psutil's start time back in clock ticks since boot (it is boot time + ticks / TICKS)."""
    return round((create_time - psutil.boot_time()) * TICKS)


def read(pid: int) -> ProcStat | None:
    """The process's figures, or None when it is gone (or a zombie nobody reaped yet)."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            status = process.status()
            if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return None
            cpu = process.cpu_times()
            created = process.create_time()
            rss = process.memory_info().rss
            pgrp = os.getpgid(pid)
    except (psutil.Error, ProcessLookupError, PermissionError):
        return None
    return ProcStat(
        pid=pid,
        state=status,
        pgrp=pgrp,
        start_ticks=_start_ticks(created),
        cpu_s=round(cpu.user + cpu.system + cpu.children_user + cpu.children_system, 2),
        rss_mib=round(rss / (1 << 20), 1),
        age_s=round(max(0.0, time.time() - created), 1),
    )


def same_process(pid: int, start_ticks: int) -> bool:
    stat = read(pid)
    return stat is not None and stat.start_ticks == start_ticks


def group_members(pgids: Collection[int], *, since_ticks: int = 0) -> list[int]:
    """Live processes in any of ``pgids`` that started at or after ``since_ticks``."""
    wanted = set(pgids)
    if not wanted:
        return []
    found = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) not in wanted:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        stat = read(pid)
        if stat is not None and stat.start_ticks >= since_ticks:
            found.append(stat.pid)
    return sorted(found)
