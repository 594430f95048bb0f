"""Config bundles the controller publishes: validated first, then switched (never a bad one).

The same bundle ``gpufed render`` writes (``federation.pipeline.build_bundle``), staged
in ``<data-dir>/rendered`` through ``sharder.output.write_tree``: every Prometheus config
whose bytes changed since the last good bundle is checked by promtool, the Alertmanager
config by amtool, and only then is the tree swapped and the new bytes served by
``GET /v1/configs/...``. A failed check keeps the previous bundle served and on disk;
the error is kept for ``GET /v1/configs`` and counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from alertmanager.amtool import ConfigTool
from alertmanager.render import ALERTMANAGER_FILE
from federation import master as mastering
from sharder import output
from sharder.promtool import ConfigChecker, check_all

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


@dataclass
class Publisher:
    out: Path
    checker: ConfigChecker | None
    alert_checker: ConfigTool | None
    agent: bool
    on_result: Callable[[str], None] = lambda result: None
    files: output.Bundle = field(default_factory=dict)
    status: PublishStatus = field(default_factory=PublishStatus)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def publish(self, bundle: output.Bundle, *, version: int) -> bool:
        """Check what changed and switch to ``bundle``; False (old one kept) on a failed check."""
        with self._lock:
            if bundle == self.files:
                self.status.version = version
                return True
            changed = [p for p in output.prometheus_configs(bundle) if self.files.get(p) != bundle[p]]
            checked = 0

            def validate(root: Path) -> None:
                nonlocal checked
                if self.checker is not None:
                    checked = check_all(self.checker, root, changed, agent=self.agent, workers=4)
                    master = mastering.MASTER_FILE
                    if master in bundle and self.files.get(master) != bundle[master]:
                        self.checker.check(root, master)
                alert = ALERTMANAGER_FILE
                if (
                    self.alert_checker is not None
                    and alert in bundle
                    and self.files.get(alert) != bundle[alert]
                ):
                    self.alert_checker.check_config(root / alert)

            try:
                output.write_tree(self.out, bundle, validate=validate)
            except Exception as exc:  # any failed write or check keeps the old bundle served
                self.status.ok, self.status.error, self.status.failed_version = False, str(exc), version
                log.error("config bundle for assignment %d refused, previous one stays: %s", version, exc)
                self.on_result("failed")
                return False
            self.files = bundle
            self.status = PublishStatus(
                version=version, ok=True, checked_configs=checked, published_at=time.time()
            )
            self.on_result("ok")
            return True
