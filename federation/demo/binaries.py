"""The Prometheus and Alertmanager binaries a demo runs, their tools, and the releases they are.

``gpufed demo --prometheus PATH --alertmanager PATH`` (default: from ``PATH``) picks them;
``promtool`` and ``amtool`` are taken from beside them, so every config the demo renders is
checked by the tool of the line it runs, and the controller it starts finds the same
promtool first on its ``PATH``. The releases come from the binaries' own ``--version``:
the demo writes them into its spec and refuses a spec that names another line
(``sharder.kernel.prometheus_versions.check_binary``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sharder.kernel.prometheus_versions import Release, binary_release

#: Debian installs Alertmanager as prometheus-alertmanager; upstream tarballs as alertmanager.
ALERTMANAGER_NAMES = ("prometheus-alertmanager", "alertmanager")


class BinaryError(RuntimeError):
    """A binary is missing, does not run, or does not say which release it is."""


@dataclass(frozen=True)
class StackBinaries:
    prometheus: str
    promtool: str
    alertmanager: str
    amtool: str
    prometheus_release: Release
    alertmanager_release: Release

    def tool_path(self) -> str:
        """``PATH`` for processes the demo starts: promtool and amtool of these lines first."""
        dirs = dict.fromkeys([str(Path(self.promtool).parent), str(Path(self.amtool).parent)])
        return os.pathsep.join([*dirs, os.environ.get("PATH", "")])


def _resolve(given: str | None, names: tuple[str, ...], *, option: str) -> str:
    if given is not None:
        path = Path(given)
        if path.is_file() and os.access(path, os.X_OK):
            return str(path.absolute())  # not resolved: a bin/ of links keeps its siblings
        raise BinaryError(f"--{option} {given!r} is not an executable file")
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    raise BinaryError(
        f"{' or '.join(names)} is not on PATH: give --{option} PATH, or install Debian's prometheus"
        " and prometheus-alertmanager packages (bash scripts/bootstrap.sh fetches both lines)"
    )


def _beside(binary: str, name: str) -> str:
    """The tool in the binary's own directory, else the one on PATH (which may be another line)."""
    sibling = Path(binary).parent / name
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    found = shutil.which(name)
    if found is None:
        raise BinaryError(f"{name} is neither beside {binary} nor on PATH")
    return found


def release_of(binary: str) -> Release:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BinaryError(f"{binary} --version did not run: {exc}") from exc
    said = (done.stdout + done.stderr).strip()
    release = binary_release(said)
    if release is None:
        raise BinaryError(f"{binary} --version names no release: {said[:200]!r}")
    return release


def find_binaries(*, prometheus: str | None = None, alertmanager: str | None = None) -> StackBinaries:
    prom = _resolve(prometheus, ("prometheus",), option="prometheus")
    am = _resolve(alertmanager, ALERTMANAGER_NAMES, option="alertmanager")
    promtool, amtool = _beside(prom, "promtool"), _beside(am, "amtool")
    prom_release, am_release = release_of(prom), release_of(am)
    # A promtool of another line would check the configs against the wrong release.
    tool_release = release_of(promtool)
    if tool_release.major != prom_release.major:
        raise BinaryError(f"{promtool} is {tool_release} but {prom} is {prom_release}: put the same line's"
                          " promtool beside it or first on PATH")
    return StackBinaries(prometheus=prom, promtool=promtool, alertmanager=am, amtool=amtool,
                         prometheus_release=prom_release, alertmanager_release=am_release)
