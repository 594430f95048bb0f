"""One service's process as Docker runs a container: its restart policy and its healthcheck.

``restart``: ``no``, ``always``, ``unless-stopped`` and ``on-failure[:N]`` as Docker applies
them to an exit: the runner never stops a service except at ``down()``, so ``always`` and
``unless-stopped`` both restart after any exit, with Docker's delay (100 ms, doubled after
each quick exit, back to 100 ms after 10 s of running, at most a minute).

Healthcheck: Docker's schedule (the first probe ``start_interval`` after the start while in
``start_period``, else ``interval``; failures inside ``start_period`` do not count; ``retries``
failures in a row make it unhealthy; ``timeout`` kills a probe), the test run inside the
service's namespaces and root (``nsenter``) with the service's environment. A restart puts
the health back to ``starting``, as a container restart does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from federation.testing.harnesses.composerun.model import Healthcheck
from federation.testing.harnesses.composerun.sandbox import in_service

QUICK_EXIT_S = 10.0
MAX_DELAY_S = 60.0


@dataclass
class Exit:
    pid: int
    code: int
    at: float


@dataclass
class State:
    pids: list[int] = field(default_factory=list)
    started_at: list[float] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    health: str | None = None  # starting | healthy | unhealthy; None without a healthcheck
    probes: int = 0
    running: bool = False
    done: bool = False  # exited and will not be restarted


def restarts_after(policy: str, code: int, restarts: int) -> bool:
    """Whether Docker's ``policy`` restarts a container that exited with ``code``."""
    if policy in ("always", "unless-stopped"):
        return True
    if policy.startswith("on-failure"):
        _, _, limit = policy.partition(":")
        return code != 0 and (not limit or restarts < int(limit))
    return False


class ServiceProcess:
    def __init__(
        self,
        *,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log: Path,
        restart: str,
        healthcheck: Healthcheck | None,
        say: Callable[[str], None],
    ) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.restart, self.healthcheck, self.say = restart, healthcheck, say
        self.state = State(health="starting" if healthcheck else None)
        self.changed = threading.Condition()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self) -> None:
        self._spawn()
        self._thread(self._watch, "watch")
        if self.healthcheck is not None:
            self._thread(self._probe_loop, "health")

    def _thread(self, target: Callable[[], None], what: str) -> None:
        thread = threading.Thread(target=target, name=f"{self.name}-{what}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _spawn(self) -> None:
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with self.changed:
            self.state.pids.append(self._proc.pid)
            self.state.started_at.append(time.time())
            self.state.running = True
            if self.healthcheck is not None:
                self.state.health = "starting"
            self.changed.notify_all()

    def _watch(self) -> None:
        delay = 0.1
        while True:
            assert self._proc is not None
            code = self._proc.wait()
            now = time.time()
            with self.changed:
                self.state.exits.append(Exit(self._proc.pid, code, now))
                self.state.running = False
                ran = now - self.state.started_at[-1]
                again = not self._stopping.is_set() and restarts_after(
                    self.restart, code, len(self.state.pids) - 1
                )
                self.state.done = not again
                self.changed.notify_all()
            if not again:
                return
            delay = 0.1 if ran >= QUICK_EXIT_S else min(delay * 2, MAX_DELAY_S)
            self.say(
                f"{self.name}: exited {code} after {ran:.1f} s; restart ({self.restart}) in {delay:.1f} s"
            )
            if self._stopping.wait(delay):
                with self.changed:
                    self.state.done = True
                    self.changed.notify_all()
                return
            self._spawn()

    def _probe_loop(self) -> None:
        check = self.healthcheck
        assert check is not None
        failures = 0
        while not self._stopping.is_set():
            with self.changed:
                started = self.state.started_at[-1]
                generation = len(self.state.pids)
            in_start = time.time() - started < check.start_period
            if self._stopping.wait(check.start_interval if in_start else check.interval):
                return
            pid = self.pid
            with self.changed:
                if generation != len(self.state.pids):  # restarted meanwhile: health begins again
                    failures = 0
                    continue
            if pid is None:
                continue
            ok = self._probe(pid, check)
            with self.changed:
                self.state.probes += 1
                if ok:
                    failures, self.state.health = 0, "healthy"
                elif time.time() - started >= check.start_period or self.state.health == "healthy":
                    failures += 1
                    if failures >= check.retries:
                        self.state.health = "unhealthy"
                self.changed.notify_all()

    def _probe(self, pid: int, check: Healthcheck) -> bool:
        try:
            done = subprocess.run(
                in_service(pid, list(check.test)),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=check.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def wait_for(self, predicate: Callable[[State], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate(self.state):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
            return True

    def stop(self, timeout: float = 10.0, stop_signal: str = "SIGTERM") -> None:
        """The stop signal, then SIGKILL after ``timeout`` (``docker compose down``'s order); no restart."""
        self._stopping.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            _signal_group(
                proc.pid,
                signal.Signals[stop_signal if stop_signal.startswith("SIG") else f"SIG{stop_signal}"],
            )
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if proc is not None:
            _signal_group(proc.pid, signal.SIGKILL)  # anything the service left in its session
        for thread in self._threads:
            thread.join(timeout=timeout + 5)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
