"""Polling until something holds, never a blind sleep: the one loop gpufed keeps for it.

The demo waits on its processes with it, and the benches and tests on theirs (through
``federation.testing.harnesses.polling`` and ``tests/conftest.wait_for``). No library in the
dependencies does this (tenacity and its kind would be a dependency for ten lines).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    retry_on: tuple[type[Exception], ...] = (httpx.HTTPError,),
    alive: Callable[[], object] | None = None,
    fail: Callable[[str], Exception] = TimeoutError,
) -> T:
    """Call ``check`` every ``interval`` seconds until it returns something other than None
    or False, and return that. ``retry_on`` errors count as "not yet" (a server still
    starting); ``alive`` is called first each round and raises when a process died. At the
    deadline, raises ``fail(message)``, the message naming ``what`` and the last answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        if alive is not None:
            alive()
        try:
            last = check()
        except retry_on as exc:
            last = exc
        else:
            if last is not None and last is not False:
                return last
        if time.monotonic() > deadline:
            raise fail(f"gave up waiting for {what} after {timeout:g} s; last: {last!r}")
        time.sleep(interval)
