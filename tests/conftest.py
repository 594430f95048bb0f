"""Shared test helpers: free loopback ports and the real Prometheus/Alertmanager tools."""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None], *, timeout: float, interval: float = 0.05, what: str = "condition"
) -> T:
    """Call ``check`` until it returns something other than None/False, and return that.

    ``httpx.HTTPError`` counts as "not yet" (a server still starting). At the deadline an
    AssertionError names ``what`` and the last value seen. Tests poll; they never sleep blind.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except httpx.HTTPError as exc:
            last = exc
        else:
            if last is not None and last is not False:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


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
