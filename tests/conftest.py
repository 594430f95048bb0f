"""Shared test helpers: free loopback ports and the real Prometheus/Alertmanager tools."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from federation.localrun.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None], *, timeout: float, interval: float = 0.05, what: str = "condition"
) -> T:
    """``federation.localrun.waiting.wait_until`` for tests: at the deadline an AssertionError
    names ``what`` and the last value seen. Tests poll; they never sleep blind."""
    return wait_until(check, timeout=timeout, interval=interval, what=what, fail=AssertionError)


def stop_process(proc: subprocess.Popen[bytes], *, timeout: float = 10) -> None:
    """Terminate a process the test started (by its own handle, never by name), then kill."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def require_tool(name: str) -> str:
    """Path of a Debian-packaged tool; the test command installs them, so absence fails."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not on PATH: run scripts/test.sh, which installs it")
    return path


def stack_tool(line: int, name: str) -> str:
    """Path of ``name`` (promtool, amtool, ...) from one pinned stack line (2 or 3).

    ``scripts/stack_path.sh`` exports ``GPUFED_STACK2_BIN``/``GPUFED_STACK3_BIN``; a test that
    must run a specific line reads them here, and fails (never skips) when they are absent.
    """
    variable = f"GPUFED_STACK{line}_BIN"
    folder = os.environ.get(variable)
    if not folder:
        pytest.fail(f"{variable} is not set: run scripts/test.sh, or source scripts/stack_path.sh first")
    path = Path(folder) / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} ({variable}) is not an executable: run scripts/fetch_stack.sh")
    return str(path)


@pytest.fixture
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture
def amtool() -> str:
    return require_tool("amtool")


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Undo what a command under test did to the root logger.

    ``gpufed serve`` and the relay call ``logging.basicConfig``; inside ``CliRunner`` that
    binds a handler to the runner's captured stream, which is closed after the test. Left in
    place, every later log record in that worker fails to write and prints a "Logging error"
    report into the next test's captured output.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
