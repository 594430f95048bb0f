"""The supervisor with real (tiny) processes: groups, stop/kill/restart, leftovers, reaping a killed run."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import wait_for

from federation.demo.supervisor import ComponentFailed, ProcessSpec, Supervisor, reap_previous
from federation.localrun import procstat

SLEEPER = (sys.executable, "-c", "import time; time.sleep(120)")
# A leader that leaves a grandchild in its group, as `gpufed serve` does with promtool.
FAMILY = ("/bin/sh", "-c", "sleep 120 & exec sleep 121")


def supervisor(tmp_path: Path) -> Supervisor:
    return Supervisor(log_dir=tmp_path / "logs", pid_file=tmp_path / "pids.json")


def alive(pid: int) -> bool:
    return procstat.read(pid) is not None


def started(pids: list[int], count: int) -> bool:
    """``count`` processes, each asleep in its sleep call. Before that a process may be read
    mid-``exec`` or before its loader ran, holding a few KiB (``rss_mib`` 0.0): FAMILY's
    leader execs ``sleep`` just after its child appears."""
    stats = [procstat.read(pid) for pid in pids]
    return len(pids) >= count and all(s is not None and s.state == psutil.STATUS_SLEEPING for s in stats)


def test_procstat_reads_this_process() -> None:
    stat = procstat.read(os.getpid())
    assert stat is not None
    assert stat.pgrp == os.getpgrp() and stat.rss_mib > 0 and stat.cpu_s >= 0 and stat.age_s > 0
    assert 0 <= stat.cpu_pct <= 100 * os.cpu_count()  # type: ignore[operator]
    assert procstat.read(2**22 + 1) is None  # above pid_max: never a process


def test_stop_all_ends_every_group_member(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    try:
        family = sup.start(ProcessSpec(name="family", argv=FAMILY))
        sup.start(ProcessSpec(name="sleeper", argv=SLEEPER))
        wait_for(lambda: started(sup.leftovers(), 3), timeout=10, what="three processes in two groups")
        members = sup.leftovers()
        assert family.pid in members
        stats = sup.stats()
        assert set(stats) == {"family", "sleeper"} and all(s.rss_mib > 0 for s in stats.values())
    finally:
        sup.stop_all()
    assert sup.leftovers() == []
    assert not any(alive(pid) for pid in members)
    with pytest.raises(ComponentFailed, match="shutting down"):
        sup.start(ProcessSpec(name="late", argv=SLEEPER))


def test_kill_is_reported_and_restart_reuses_the_command_line(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    try:
        first = sup.start(ProcessSpec(name="child/a", argv=SLEEPER))
        sup.kill("child/a")
        wait_for(lambda: sup.exited().get("child/a") == -signal.SIGKILL, timeout=10, what="the kill seen")
        assert not sup.alive("child/a")
        second = sup.restart("child/a")
        assert second.pid != first.pid and sup.alive("child/a")
        assert second.spec.argv == first.spec.argv
        assert (tmp_path / "logs" / "child_a.log").is_file()
    finally:
        sup.stop_all()
    assert sup.leftovers() == []


def test_exits_are_recorded_once_with_status_and_time_but_not_the_stops_we_asked(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    try:
        sup.start(ProcessSpec(name="child/a", argv=SLEEPER))
        sup.start(ProcessSpec(name="quits", argv=(sys.executable, "-c", "raise SystemExit(3)")))
        sup.start(ProcessSpec(name="asked", argv=SLEEPER))
        before = time.time()
        sup.kill("child/a")
        wait_for(lambda: len(sup.exited()) == 2, timeout=10, what="the kill and the exit seen")
        sup.restart("child/a")  # noted already: not twice
        sup.stop("asked")  # stopped by us: not an exit
        exits = sorted(sup.exits(), key=lambda e: e.name)
        assert [(e.name, e.status) for e in exits] == [("child/a", -signal.SIGKILL), ("quits", 3)]
        assert all(before - 1 <= e.at <= time.time() and e.after_s >= 0 for e in exits)
        assert exits[0].document()["at"].endswith("Z")
    finally:
        sup.stop_all()
    assert len(sup.exits()) == 2  # the shutdown's own stops are not exits


def test_restart_with_a_new_command_line_keeps_it_for_later_restarts(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    other = (*SLEEPER[:-1], "import time; time.sleep(119)")
    try:
        sup.start(ProcessSpec(name="controller", argv=SLEEPER))
        sup.stop("controller")  # stopped a while (the controller-down fault), then back with new flags
        assert sup.restart("controller", argv=other).spec.argv == other
        assert sup.restart("controller").spec.argv == other
        assert procstat.read(sup.get("controller").pid) is not None
    finally:
        sup.stop_all()
    assert sup.leftovers() == []


def test_a_process_that_exits_fails_its_readiness_with_the_log_tail(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    argv = (sys.executable, "-c", "import sys; print('bad flag --x'); sys.exit(3)")
    try:
        sup.start(ProcessSpec(name="broken", argv=argv, ready=lambda: False))
        with pytest.raises(ComponentFailed, match=r"(?s)broken exited with status 3.*bad flag --x"):
            sup.wait_ready("broken", timeout=10)
    finally:
        sup.stop_all()


def test_a_never_ready_process_times_out(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    try:
        sup.start(ProcessSpec(name="slow", argv=SLEEPER, ready=lambda: False))
        with pytest.raises(ComponentFailed, match="slow was not ready after 1 s"):
            sup.wait_ready("slow", timeout=1)
    finally:
        sup.stop_all()
    assert sup.leftovers() == []


def test_a_stubborn_process_is_killed_after_its_stop_timeout(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    stubborn = (sys.executable, "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True);"
                " time.sleep(120)")
    try:
        sup.start(ProcessSpec(name="stubborn", argv=stubborn, stop_timeout=0.5))
        wait_for(lambda: "up" in (tmp_path / "logs" / "stubborn.log").read_text(), timeout=10,
                 what="the handler installed")
        started = time.monotonic()
        assert sup.stop("stubborn") == -signal.SIGKILL
        assert time.monotonic() - started < 5
    finally:
        sup.stop_all()


def test_the_next_run_reaps_what_a_killed_run_left(tmp_path: Path) -> None:
    crashed = supervisor(tmp_path)
    running = crashed.start(ProcessSpec(name="fleet", argv=FAMILY))
    wait_for(lambda: len(crashed.leftovers()) >= 2, timeout=10, what="the family")
    members = crashed.leftovers()
    # The demo is SIGKILLed here: nothing of `crashed` runs again; only its PID file is left.
    assert (tmp_path / "pids.json").is_file()
    assert reap_previous(tmp_path / "pids.json") == ["fleet"]
    wait_for(lambda: not any(alive(pid) for pid in members), timeout=10, what="the group gone")
    running.proc.wait(timeout=5)
    assert not (tmp_path / "pids.json").exists()
    assert reap_previous(tmp_path / "pids.json") == []


def test_a_recycled_pid_is_not_reaped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids.json"
    stat = procstat.read(os.getpid())
    assert stat is not None
    # Our own PID with another start time: a different process; it must be left alone.
    pid_file.write_text(f'{{"master": {{"pid": {os.getpid()}, "start_ticks": {stat.start_ticks + 1}}}}}')
    assert reap_previous(pid_file) == []
