"""A static inventory file, followed: edits by hand or by a CMDB export apply without a restart.

Polls ``stat`` every ``interval`` seconds; when mtime, size or inode moved it reads the
file and compares a SHA-256 of the bytes, so a touch without an edit changes nothing.
The whole file goes through ``sharder.model.loading.parse_inventory`` (the same validation as
``gpufed render``): a file that does not validate is refused as a whole, the error is
logged with its field and value, and the last good set stays in force (a half-edited
file must not drop half the fleet).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping
from pathlib import Path

from sharder.kernel.errors import InventoryError
from sharder.model.loading import parse_inventory, read_document
from sharder.model.spec import JobSpec
from sharder.sources.base import DiscoverySink

log = logging.getLogger(__name__)


class FileSource:
    def __init__(
        self,
        path: str | Path,
        *,
        sink: DiscoverySink,
        name: str = "file",
        interval: float = 1.0,
        jobs: Mapping[str, JobSpec] | None = None,
    ) -> None:
        self.path = Path(path)
        self.jobs = jobs
        self.name = name
        self.interval = interval
        self._sink = sink
        self._stat: tuple[int, int, int] | None = None
        self._digest = ""
        self.last_error = ""
        self.answered = False
        """A check has ended, the set pushed or the error told (``Source.answered``)."""

    def poll_once(self) -> bool:
        """Check the file; True when a new set was pushed."""
        try:
            return self._check()
        finally:
            self.answered = True  # after the sink took the set (or the error)

    def _check(self) -> bool:
        try:
            st = self.path.stat()
        except OSError as exc:
            return self._fail("unreadable", f"{self.path}: {exc.strerror}")
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stat:
            return False
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            return self._fail("unreadable", f"{self.path}: {exc.strerror}")
        self._stat = stamp
        digest = hashlib.sha256(raw).hexdigest()
        if digest == self._digest:
            return False
        try:
            document = read_document(self.path, error_cls=InventoryError)
            targets = parse_inventory(document, source=str(self.path), jobs=self.jobs)
        except InventoryError as exc:
            self._digest = digest  # do not re-report the same broken bytes every poll
            return self._fail("invalid", str(exc))
        self._digest = digest
        self.last_error = ""
        self._sink.on_change(self.name, targets, version=digest[:12])
        return True

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.poll_once()
            stop.wait(self.interval)

    def _fail(self, reason: str, message: str) -> bool:
        if message != self.last_error:
            log.warning("file source keeps its last good set reason=%s error=%s", reason, message)
        self.last_error = message
        self._sink.on_error(self.name, reason)
        return False
