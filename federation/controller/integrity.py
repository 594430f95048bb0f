"""State that cannot vanish, roll back or rot silently: the SQLite store's checks.

``sqlite_store`` calls these on open and after writes:

* ``Marker``: ``<data-dir>/.initialised`` holds the last revision the store committed.
  It lives outside the database, so a deleted or emptied ``state.db`` is noticed, and a
  file whose revision is older than the marker's (a WAL whose damaged frames SQLite
  skipped, or an old copy put back) is refused instead of served. ``--init`` is the
  operator's way to start afresh anyway. The marker is written after each commit, so
  it is never ahead of the file (a commit is fsynced first).
* ``quick_check`` on open: a damaged page is one error naming the file.
* ``audit_entry``: a row that does not parse is shown as ``unreadable``, never a 500.
* ``reclaim``: incremental vacuum plus a truncating WAL checkpoint after many deletions,
  so the file shrinks once a flood of registrations is gone.

Every failure is a ``StoreError`` (``gpufed serve`` prints its one line and exits 2).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path

from federation.controller.state import AuditEntry
from federation.controller.store import StoreError

log = logging.getLogger(__name__)

MARKER_NAME = ".initialised"
RECLAIM_AFTER = 10_000
"""Deleted rows after which the free pages are given back (``PRAGMA incremental_vacuum``)."""


class Marker:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: int | None = None

    def read(self) -> int | None:
        """The last committed revision a previous run recorded; None: no marker (a new store)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read the state marker {self.path}: {exc}") from exc
        try:
            revision = json.loads(text)["revision"]
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(
                f"state marker {self.path} is damaged ({text[:60]!r}); check the data directory, "
                "or start afresh with gpufed serve --init"
            ) from exc
        if type(revision) is not int or revision < 0:
            raise StoreError(f"state marker {self.path}: revision {revision!r} is not a revision")
        return revision

    def write(self, revision: int) -> None:
        """Record ``revision`` (after its commit). A failure is logged: a marker behind the
        file is harmless, only one ahead of it would refuse a good file."""
        if revision == self._written:
            return
        staged = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps({"revision": revision}) + "\n")
            os.replace(staged, self.path)
        except OSError as exc:
            log.warning("cannot write the state marker %s: %s", self.path, exc)
            return
        self._written = revision

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self._written = None


def check_revision(marker: Marker, path: Path, revision: int | None, *, init: bool) -> None:
    """Refuse a store that holds less than the marker says was committed (unless ``init``)."""
    expected = marker.read()
    if expected is None or (revision is not None and revision >= expected):
        return
    if init:
        log.warning(
            "--init: starting from %s at revision %s although revision %d was committed",
            path, revision, expected,
        )
        marker.remove()
        return
    found = "no state" if revision is None else f"revision {revision}"
    raise StoreError(
        f"state store {path} holds {found}, but a previous run committed revision {expected} "
        f"({marker.path}): the file was deleted, emptied, replaced by an older copy, or its WAL "
        f"({path.name}-wal) was damaged. Restore it, or start afresh with gpufed serve --init"
    )


def quick_check(db: sqlite3.Connection, path: Path) -> None:
    rows = [row[0] for row in db.execute("PRAGMA quick_check(5)")]
    if rows != ["ok"]:
        raise StoreError(f"state store {path} is damaged (PRAGMA quick_check: {'; '.join(rows)[:300]})")


def reclaim(db: sqlite3.Connection) -> None:
    """Free pages back to the file system; a file made without auto_vacuum is converted once."""
    mode = db.execute("PRAGMA auto_vacuum").fetchone()[0]
    if mode != 2:  # 2: incremental; switching needs one full VACUUM
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        db.execute("VACUUM")
    else:
        db.executescript("PRAGMA incremental_vacuum;")  # runs to the end (execute frees one page)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def audit_entry(row_id: int, body: str) -> AuditEntry:
    """One audit row; a row that does not parse is shown as such (the log stays readable)."""
    try:
        return AuditEntry.model_validate({**json.loads(body), "id": row_id})
    except (ValueError, TypeError) as exc:
        return AuditEntry(
            id=row_id,
            at=0.0,
            actor="?",
            action="unreadable",
            detail={"error": f"audit row {row_id} does not parse: {str(exc)[:200]}"},
        )


def json_row(path: Path, *, table: str, key: str, body: str) -> object:
    """A stored JSON body, or one ``StoreError`` naming the table and key."""
    try:
        return json.loads(body)
    except ValueError as exc:
        raise StoreError(
            f"state store {path}: table {table}, key {key!r}: the row is not JSON ({exc}); "
            "delete the row or restore the file"
        ) from exc
