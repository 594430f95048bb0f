"""Config bundles the controller publishes: validated first, then switched (never a bad one).

The same bundle ``gpufed render`` writes (``federation.master.pipeline.build_bundle``), staged
in ``<data-dir>/rendered`` through ``sharder.kernel.output.write_tree``: every Prometheus config
whose bytes changed since the last good bundle is checked by promtool, the Alertmanager
config by amtool (``federation.master.pipeline.check_bundle``, the check ``gpufed render``
runs), and only then is the tree swapped and the new bytes served by
``GET /v1/configs/...``. A failed check keeps the previous bundle served and on disk;
the error is kept for ``GET /v1/configs`` and counted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from alertmanager.amtool import ConfigTool
from federation.master import pipeline
from sharder.engine.cowmap import CowMap
from sharder.kernel import output
from sharder.kernel.promtool import ConfigChecker

log = logging.getLogger(__name__)


@dataclass
class PublishStatus:
    version: int = 0
    """Assignment version of the bundle now served (0: none yet)."""
    ok: bool = True
    error: str = ""
    failed_version: int = 0
    checked_configs: int = 0
    published_at: float = 0.0
    left_out: list[str] = field(default_factory=list)
    """Targets the render could not place (an undefined job, say), named, at most 20."""
    left_out_count: int = 0


@dataclass
class Publisher:
    out: Path
    checker: ConfigChecker | None
    alert_checker: ConfigTool | None
    agent: bool
    on_result: Callable[[str], None] = lambda result: None
    files: Mapping[str, bytes] = field(default_factory=dict)
    """The bundle served now, every file by path (a ``CowMap`` once published: replaced,
    never changed in place)."""
    status: PublishStatus = field(default_factory=PublishStatus)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def _evolvable(self) -> CowMap[bytes]:
        files = self.files
        return files if isinstance(files, CowMap) else CowMap(files)

    def fail(self, *, version: int, error: str) -> None:
        """A bundle that could not even be rendered: the previous one stays served."""
        with self._lock:
            self.status.ok, self.status.error, self.status.failed_version = False, error, version
        self.on_result("failed")

    def publish_lists(self, lists: output.Bundle, *, version: int) -> int:
        """Swap in file_sd target lists of a published bundle, each file atomically (written
        beside it, then renamed over it); lists need no promtool. Returns the files written;
        0 before a first bundle is served (the first full publish writes them all)."""
        with self._lock:
            if not self.files:
                return 0
            written = {path: content for path, content in lists.items() if self.files.get(path) != content}
            for path, content in sorted(written.items()):
                _replace_file(self.out / path, content)
            if written:  # a new map (readers may hold the old one) sharing all but these files
                self.files = self._evolvable().evolve(written)
            self.status.version = version
            return len(written)

    def publish(self, bundle: output.Bundle, *, version: int) -> bool:
        """Check what changed and switch to ``bundle``; False (old one kept) on a failed check."""
        with self._lock:
            if bundle == self.files:
                self.status.version, self.status.ok, self.status.error = version, True, ""
                return True
            checks: list[pipeline.BundleCheck] = []

            def validate(root: Path) -> None:
                previous = self.files
                checks.append(
                    pipeline.check_bundle(
                        root,
                        bundle,
                        checker=self.checker,
                        alert_checker=self.alert_checker,
                        agent=self.agent,
                        previous=previous,
                        workers=4,
                    )
                )

            try:
                output.write_tree(self.out, bundle, validate=validate)
            except Exception as exc:  # any failed write or check keeps the old bundle served
                self.status.ok, self.status.error, self.status.failed_version = False, str(exc), version
                log.error("config bundle for assignment %d refused, previous one stays: %s", version, exc)
                self.on_result("failed")
                return False
            self.files = CowMap(bundle)  # a list written later copies a bucket, not every file
            self.status = PublishStatus(
                version=version, ok=True, checked_configs=checks[0].configs, published_at=time.time()
            )
            self.on_result("ok")
            return True


def _replace_file(path: Path, content: bytes) -> None:
    """Write ``path`` so a reader sees the old bytes or the new ones, never a part."""
    try:
        fd, staged = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except FileNotFoundError:  # its folder is made once, not asked for per write
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, staged = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.chmod(staged, 0o644)
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        raise
