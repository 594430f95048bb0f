"""Loopback helpers shared by the benches, the demo and the multi-process tests: a free port,
and polling until a server answers (never a blind sleep)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


def wait_until(check: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy (HTTP errors count as "not yet")."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except httpx.HTTPError as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def wait_port(port: int, *, timeout: float = 60.0) -> None:
    """Until something accepts connections on 127.0.0.1:``port``."""

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, timeout=timeout, what=f"a server on 127.0.0.1:{port}")
