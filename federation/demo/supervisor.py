"""Start, watch, stop and restart the demo's processes; leave none behind.

Each process runs in its own session (``start_new_session``), so it is the leader of a
process group that holds everything it spawns (``gpufed serve`` runs promtool, for
example), and the terminal's Ctrl-C reaches only the demo, which then stops them in
order. Stopping is SIGTERM to the group, a wait, then SIGKILL to the group.

Every start is written to a PID file (name -> pid and start time) so that a run that
was killed outright (SIGKILL, OOM) is cleaned up by the next one: ``reap_previous`` kills
the groups of the recorded processes that are still the same processes.

Built for tests as much as for the demo: ``stop``/``kill``/``restart`` act on one named
component and ``restart`` reuses its command line, so it comes back on the same ports.
Nothing restarts by itself; a process that exits is reported by ``exited`` and recorded,
with its status and when it was noticed, in ``exits`` (the demo's JSON lists them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from federation.localrun import procstat
from federation.localrun.waiting import wait_until

KILLED_EXIT_S = 5.0
"""How long ``stop_all`` waits for SIGKILLed processes to be gone (one in uninterruptible
sleep may take longer; ``leftovers`` then still names it)."""

Check = Callable[[], bool]


class ComponentFailed(RuntimeError):
    """A component exited or never became ready; the message ends with its log tail."""


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to the demo's own environment."""
    ready: Check | None = None
    """True once the process serves; None: running is ready."""
    ready_timeout: float = 90.0
    stop_timeout: float = 10.0


@dataclass(frozen=True)
class Exit:
    """A component that ended without the supervisor stopping it (crashed, killed, exited)."""

    name: str
    status: int
    at: float
    """Wall-clock time (Unix seconds) the supervisor noticed it."""
    after_s: float
    """Seconds it had run."""

    def document(self) -> dict[str, object]:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))
        return {"name": self.name, "status": self.status, "at": when, "after_s": round(self.after_s, 1)}


@dataclass
class Running:
    spec: ProcessSpec
    proc: subprocess.Popen[bytes]
    start_ticks: int
    started_at: float
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


class Supervisor:
    def __init__(self, *, log_dir: Path, pid_file: Path) -> None:
        self.log_dir = log_dir
        self.pid_file = pid_file
        self._lock = threading.RLock()
        self._running: dict[str, Running] = {}
        self._specs: dict[str, ProcessSpec] = {}
        self._pgids: set[int] = set()
        self._since = 0
        self._exits: list[Exit] = []
        self._noted: set[int] = set()  # pids whose exit is in _exits
        self.closed = False

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self, spec: ProcessSpec) -> Running:
        with self._lock:
            if self.closed:
                raise ComponentFailed(f"{spec.name}: not started, the demo is shutting down")
            if spec.name in self._running and self._running[spec.name].proc.poll() is None:
                raise ComponentFailed(f"{spec.name} is already running (pid {self._running[spec.name].pid})")
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = self.log_dir / f"{spec.name.replace('/', '_')}.log"
            with log.open("ab") as out:  # the child keeps its own descriptor
                proc = subprocess.Popen(
                    list(spec.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **spec.env},
                    start_new_session=True,
                )
            stat = procstat.read(proc.pid)
            ticks = stat.start_ticks if stat is not None else 0
            if not self._since or (ticks and ticks < self._since):
                self._since = ticks
            running = Running(spec=spec, proc=proc, start_ticks=ticks, started_at=time.monotonic(), log=log)
            self._running[spec.name] = running
            self._specs[spec.name] = spec
            self._pgids.add(proc.pid)
            self._write_pids()
            return running

    def wait_ready(self, name: str, *, timeout: float | None = None) -> float:
        """Seconds until ``name`` was ready; ComponentFailed if it exits or the time runs out."""
        running = self.get(name)
        limit = running.spec.ready_timeout if timeout is None else timeout

        def not_ready(message: str) -> ComponentFailed:
            return ComponentFailed(f"{name} was not ready after {limit:.0f} s\n{self.log_tail(name)}")

        wait_until(lambda: self.is_ready(name), timeout=limit, what=name, interval=0.2, retry_on=(),
                   fail=not_ready)
        return time.monotonic() - running.started_at

    def is_ready(self, name: str) -> bool:
        running = self.get(name)
        code = running.proc.poll()
        if code is not None:
            raise ComponentFailed(f"{name} exited with status {code}\n{self.log_tail(name)}")
        check = running.spec.ready
        try:
            return True if check is None else bool(check())
        except Exception:  # a server still starting refuses connections
            return False

    def stop(self, name: str) -> int | None:
        """SIGTERM the group, wait ``stop_timeout``, then SIGKILL; the exit status."""
        with self._lock:
            running = self._running.pop(name, None)
            if running is not None:
                self._note_exit(name, running)  # it may have died before we came to stop it
            self._write_pids()
        if running is None:
            return None
        return _stop(running.proc, timeout=running.spec.stop_timeout)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the component's group and forget nothing: ``exited`` reports it."""
        running = self.get(name)
        _signal_group(running.pid, sig)

    def restart(self, name: str, *, wait: bool = True, argv: Sequence[str] | None = None) -> Running:
        """Stop (if running) and start again with the same command line (the same ports).

        ``argv`` replaces the command line from then on (a controller restarted with
        ``--no-handover``, say); keep its ports the same or the others lose it.
        """
        spec = self._specs.get(name)
        if spec is None:
            raise KeyError(f"no component {name!r}")
        if argv is not None:
            spec = replace(spec, argv=tuple(argv))
        self.stop(name)
        running = self.start(spec)
        if wait:
            self.wait_ready(name)
        return running

    def stop_many(self, names: Sequence[str]) -> None:
        """SIGTERM every named group at once, then wait for each (SIGKILL past its timeout)."""
        with self._lock:
            batch = [self._running.pop(n) for n in names if n in self._running]
            for running in batch:
                self._note_exit(running.spec.name, running)
            self._write_pids()
        for running in batch:
            if running.proc.poll() is None:
                _signal_group(running.pid, signal.SIGTERM)
        for running in batch:
            _stop(running.proc, timeout=running.spec.stop_timeout)

    def stop_all(self, batches: Sequence[Sequence[str]] = ()) -> None:
        """Stop everything; later starts are refused.

        ``batches`` are stopped first, in order, each batch at once; whatever is left goes
        one at a time, last started first.
        """
        with self._lock:
            self.closed = True
        for batch in batches:
            with contextlib.suppress(Exception):  # keep stopping the others whatever one batch does
                self.stop_many(batch)
        for name in reversed(self.names()):
            try:
                self.stop(name)
            except Exception:
                running = self._running.pop(name, None)
                if running is not None:
                    _signal_group(running.pid, signal.SIGKILL)
        for pid in self.leftovers():
            _signal_pid(pid, signal.SIGKILL)
        # A killed process lives on until it is scheduled to exit (under load, a while): a
        # count right after this (the demo's summary) would name processes already dying.
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not self.leftovers(), timeout=KILLED_EXIT_S, interval=0.02,
                       what="the killed processes to exit", retry_on=())  # fmt: skip
        self._write_pids()

    # ---- what runs ----------------------------------------------------------------------------
    def get(self, name: str) -> Running:
        with self._lock:
            running = self._running.get(name)
        if running is None:
            raise KeyError(f"no running component {name!r}")
        return running

    def names(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def alive(self, name: str) -> bool:
        with self._lock:
            running = self._running.get(name)
        return running is not None and running.proc.poll() is None

    def exited(self) -> dict[str, int]:
        """Components that stopped by themselves (or were killed): name -> exit status."""
        with self._lock:
            items = list(self._running.items())
            for name, running in items:
                self._note_exit(name, running)
        return {name: code for name, r in items if (code := r.proc.poll()) is not None}

    def exits(self) -> list[Exit]:
        """Every exit noticed so far (``exited``, or a ``stop``/``restart`` of a dead one), in order."""
        with self._lock:
            for name, running in list(self._running.items()):
                self._note_exit(name, running)
            return list(self._exits)

    def _note_exit(self, name: str, running: Running) -> None:
        """Record ``running``'s exit once, if it has ended (lock held)."""
        code = running.proc.poll()
        if code is None or running.pid in self._noted:
            return
        self._noted.add(running.pid)
        self._exits.append(Exit(name=name, status=int(code), at=time.time(),
                                after_s=time.monotonic() - running.started_at))

    def stats(self) -> dict[str, procstat.ProcStat]:
        with self._lock:
            items = list(self._running.items())
        out = {}
        for name, running in items:
            stat = procstat.read(running.pid)
            if stat is not None and stat.start_ticks == running.start_ticks:
                out[name] = stat
        return out

    def leftovers(self) -> list[int]:
        """PIDs still alive in any process group this supervisor started."""
        with self._lock:
            pgids = set(self._pgids)
        return procstat.group_members(pgids, since_ticks=self._since)

    def log_tail(self, name: str, lines: int = 25) -> str:
        path = self.log_dir / f"{name.replace('/', '_')}.log"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return f"(no log at {path})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- last lines of {path} ---\n{tail}"

    def _write_pids(self) -> None:
        if not self._pgids:
            return  # nothing started: leave the directory as it is (it may not be ours)
        with self._lock:
            doc = {n: {"pid": r.pid, "start_ticks": r.start_ticks} for n, r in self._running.items()}
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.pid_file)


def reap_previous(pid_file: Path) -> list[str]:
    """Stop what a previous run recorded and left running (it was killed outright); the names."""
    try:
        doc = json.loads(pid_file.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return []
    reaped = []
    for name, entry in sorted(doc.items() if isinstance(doc, dict) else []):
        try:
            pid, ticks = int(entry["pid"]), int(entry["start_ticks"])
        except (KeyError, TypeError, ValueError):
            continue
        if procstat.same_process(pid, ticks):
            _signal_group(pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                wait_until(partial(_gone, pid, ticks), timeout=10, interval=0.1,
                           what=f"{name} (pid {pid}) to exit", retry_on=())
            _signal_group(pid, signal.SIGKILL)
            reaped.append(name)
    pid_file.unlink(missing_ok=True)
    return reaped


def _stop(proc: subprocess.Popen[bytes], *, timeout: float) -> int:
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    # The leader is gone; anything it left in its group goes too.
    for pid in procstat.group_members([proc.pid]):
        _signal_pid(pid, signal.SIGKILL)
    return int(proc.returncode)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _gone(pid: int, ticks: int) -> bool:
    return not procstat.same_process(pid, ticks)
