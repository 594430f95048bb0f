"""The port a ``gpufed serve --listen 127.0.0.1:0`` bound, read from its log (polled with
``federation.localrun.waiting.wait_until``, never a blind sleep): the replica-set harness and
the tests' serve processes start serve this way, so no port is chosen before it is bound."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from federation.localrun.waiting import wait_until

LISTENING = re.compile(rb"gpufed serve: listening on http://[^\s]*:(?P<port>\d+)")
"""The line ``gpufed serve --listen HOST:0`` prints on stderr once it has bound a port."""


def serve_port(log: Path, proc: subprocess.Popen[bytes], *, since: int = 0, timeout: float = 60.0,
               fail: Callable[[str], Exception] = RuntimeError) -> int:
    """The port a ``gpufed serve --listen 127.0.0.1:0`` writing to ``log`` (from byte ``since``) bound;
    ``fail(message)`` is raised when serve exits first or ``timeout`` passes."""

    def bound() -> int | None:
        if proc.poll() is not None:
            tail = log.read_bytes()[-2000:].decode(errors="replace") if log.exists() else ""
            raise fail(f"gpufed serve exited ({proc.returncode}) before it listened: {tail}")
        with log.open("rb") as out:
            out.seek(since)
            found = LISTENING.search(out.read())
        return int(found["port"]) if found else None

    return wait_until(bound, timeout=timeout, what=f"gpufed serve's port in {log}", fail=fail)
