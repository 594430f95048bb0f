"""Client module for the real ``amtool``: the only alertmanager module that runs processes.

Two uses: ``check_config`` before a rendered ``alertmanager.yml`` replaces a good one, and
``routes_test`` so users and tests can ask "which receivers get this alert?" of a routing
tree before deploying it. ``ConfigTool`` is the seam for callers that want to swap it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from alertmanager.errors import AmtoolError


class ConfigTool(Protocol):
    def check_config(self, path: str | Path) -> None: ...

    def routes_test(self, config_path: str | Path, labels: Mapping[str, str]) -> list[str]: ...


class Amtool:
    """Runs the real ``amtool`` (Alertmanager 0.25); each call is a short process (~30 ms)."""

    def __init__(self, binary: str = "amtool", *, timeout: float = 30.0) -> None:
        self.binary = binary
        self.timeout = timeout

    @classmethod
    def find(cls) -> Amtool | None:
        path = shutil.which("amtool")
        return cls(path) if path else None

    def _run(self, args: list[str], *, path: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [self.binary, *args], capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except FileNotFoundError as exc:
            raise AmtoolError(f"amtool not found at {self.binary!r}", path=path) from exc
        except subprocess.TimeoutExpired as exc:
            raise AmtoolError(f"amtool timed out after {self.timeout:g}s", path=path) from exc

    def check_config(self, path: str | Path) -> None:
        """Raise ``AmtoolError`` with amtool's reason when Alertmanager would refuse the file."""
        done = self._run(["check-config", str(path)], path=str(path))
        if done.returncode != 0:
            raise AmtoolError(_failure(done), path=str(path))

    def routes_test(self, config_path: str | Path, labels: Mapping[str, str]) -> list[str]:
        """Receivers an alert with ``labels`` reaches, in routing-tree order."""
        args = ["config", "routes", "test", f"--config.file={config_path}"]
        args += [f"{name}={value}" for name, value in sorted(labels.items())]
        done = self._run(args, path=str(config_path))
        if done.returncode != 0:
            raise AmtoolError(_failure(done), path=str(config_path))
        text = done.stdout.strip()
        return [name.strip() for name in text.split(",")] if text else []


def _failure(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines()]
    keep = [line for line in lines if line and not line.startswith(("Found:", "- ", "Warning:"))]
    return "amtool failed: " + ("; ".join(keep) or f"exit status {done.returncode}")


def check_config(path: str | Path, *, amtool: str = "amtool") -> None:
    Amtool(amtool).check_config(path)


def routes_test(config_path: str | Path, labels: Mapping[str, str], *, amtool: str = "amtool") -> list[str]:
    return Amtool(amtool).routes_test(config_path, labels)
