"""Client module for ``promtool check config``: the only sharder module that runs processes.

Pipeline position: after ``sharder.kernel.output`` has written a bundle into its staging dir and
before the swap, every child config is checked here, so a config Prometheus would refuse
never replaces a good one. ``ConfigChecker`` is the seam: tests and the controller may pass
any object with ``check``; the real one is ``Promtool``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, runtime_checkable

from sharder.kernel.errors import ConfigCheckError
from sharder.kernel.prometheus_versions import Release, binary_release


class ConfigChecker(Protocol):
    def check(self, root: Path, config: str, *, agent: bool = False) -> None:
        """Raise ``ConfigCheckError`` when ``root/config`` is not a valid Prometheus config."""
        ...


@runtime_checkable
class WebConfigChecker(Protocol):
    def check_web_config(self, root: Path, config: str) -> None:
        """Raise ``ConfigCheckError`` when ``root/config`` is not a valid web-config file."""
        ...


BATCH = 100
"""Configs per ``promtool check config`` process: one process checks a hundred in about the
time it starts (a thousand children cost seconds, not a minute of processes)."""


class Promtool:
    """Runs the real ``promtool``: a short-lived process (about 30 ms) per check or per batch."""

    def __init__(self, binary: str = "promtool", *, timeout: float = 60.0) -> None:
        self.binary = binary
        self.timeout = timeout

    @classmethod
    def find(cls) -> Promtool | None:
        """The promtool on PATH, or None so callers can decide whether that is fatal."""
        path = shutil.which("promtool")
        return cls(path) if path else None

    def release(self) -> Release | None:
        """The release ``promtool --version`` names; None when it does not run or names none."""
        try:
            done = subprocess.run([self.binary, "--version"], capture_output=True, text=True,
                                  timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return binary_release(done.stdout + done.stderr)

    def check(self, root: Path, config: str, *, agent: bool = False) -> None:
        # Run in root with a relative path so promtool's messages name the path the user
        # will see after the swap, not the staging dir.
        done = self._run(root, config, ["check", "config", *(["--agent"] if agent else []), config])
        if done.returncode != 0:
            raise ConfigCheckError(_failure_message(done.stdout, done.stderr), path=config)

    def check_web_config(self, root: Path, config: str) -> None:
        """``promtool check web-config``: exporter-toolkit's parser, which also reads the
        certificate and key files the document names."""
        done = self._run(root, config, ["check", "web-config", config])
        if done.returncode != 0:
            message = _failure_message(done.stdout, done.stderr).replace("check config", "check web-config")
            raise ConfigCheckError(message, path=config)

    def _run(self, root: Path, config: str, args: list[str]) -> subprocess.CompletedProcess[str]:
        """promtool with ``args`` in ``root``; a missing binary or a timeout is a ConfigCheckError."""
        try:
            return subprocess.run(
                [self.binary, *args], cwd=root, capture_output=True, text=True, timeout=self.timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            raise ConfigCheckError(f"promtool not found at {self.binary!r}", path=config) from exc
        except subprocess.TimeoutExpired as exc:
            raise ConfigCheckError(f"promtool timed out after {self.timeout:g}s", path=config) from exc

    def check_many(self, root: Path, configs: list[str], *, agent: bool = False) -> list[str]:
        """One process for all of ``configs``; all of them when it did not pass (promtool's
        combined output is not split per file: :meth:`check` names the failures)."""
        args = [self.binary, "check", "config", *(["--agent"] if agent else []), *configs]
        try:
            done = subprocess.run(
                args, cwd=root, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return list(configs)
        return [] if done.returncode == 0 else list(configs)


def _failure_message(stdout: str, stderr: str) -> str:
    """promtool's FAILED lines, one line; its 'Checking <file>' banner is noise."""
    lines = [line.strip() for line in (stderr + "\n" + stdout).splitlines()]
    useful = [line.removeprefix("FAILED: ") for line in lines if line and not line.startswith("Checking ")]
    return "promtool check config failed: " + ("; ".join(useful) or "no message")


def check_all(
    checker: ConfigChecker, root: Path, configs: Iterable[str], *, agent: bool = False, workers: int = 8
) -> int:
    """Check every config concurrently; raise the first failure in path order. Returns the count."""
    paths = sorted(configs)
    if not paths:
        return 0
    failures: list[ConfigCheckError] = []

    def one(config: str) -> None:
        try:
            checker.check(root, config, agent=agent)
        except ConfigCheckError as exc:
            failures.append(exc)

    suspects = paths
    if isinstance(checker, Promtool) and len(paths) > 1:
        batches = [paths[i : i + BATCH] for i in range(0, len(paths), BATCH)]
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(batches)))) as pool:
            suspects = [p for failed in pool.map(lambda b: checker.check_many(root, b, agent=agent), batches)
                        for p in failed]  # fmt: skip
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(suspects) or 1))) as pool:
        list(pool.map(one, suspects))
    if failures:
        first = min(failures, key=lambda exc: exc.path)
        more = f" (and {len(failures) - 1} more configs failed)" if len(failures) > 1 else ""
        raise ConfigCheckError(first.reason + more, path=first.path)
    return len(paths)
