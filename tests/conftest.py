"""Shared test helpers: free loopback ports and the real Prometheus/Alertmanager tools."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
