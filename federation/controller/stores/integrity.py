"""State that cannot vanish, roll back or rot silently: the SQLite store's checks.

``sqlite_store`` calls these on open and after writes:

* ``Marker``: ``<data-dir>/.initialised`` holds the last revision the store committed.
  It lives outside the database, so a deleted or emptied ``state.db`` is noticed, and a
  file whose revision is older than the marker's (a WAL whose damaged frames SQLite
  skipped, or an old copy put back) is refused instead of served. ``--init`` is the
  operator's way to start afresh anyway. The marker is written after each commit, so
  it is never ahead of the file (a commit is fsynced first).
* ``check_wal`` on open: a WAL whose damaged frame would make SQLite drop the commits
  after it (SQLite stops reading there, silently) is refused. The WAL is read as SQLite's
  recovery reads it (salts and running checksums), under SQLite's write lock, so a store
  opened while another process writes never reads a commit half-way.
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
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from federation.controller.base.state import AuditEntry
from federation.controller.stores.store import StoreError
from sharder.kernel.errors import InventoryError
from sharder.model import loading
from sharder.model.inventory import Target

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


def check_revision(
    marker: Marker, path: Path, revision: int | None, *, expected: int | None, init: bool
) -> None:
    """Refuse a store that holds less than the marker says was committed (unless ``init``).

    ``expected`` is the marker as read *before* ``revision`` was: the marker follows each
    commit, so one read after the file could name a commit another connection made since
    (a store opened while another writes), which is no rollback."""
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


WAL_MAGIC = (0x377F0682, 0x377F0683)
"""The WAL header's magic; its low bit set: the checksums read the words big-endian."""
_MASK = 0xFFFFFFFF
_FRAME_HEADER = struct.Struct(">6I")


@dataclass(frozen=True)
class WalScan:
    """What ``<db>-wal`` holds by the WAL format alone (SQLite's file format, "WAL file
    format"): a frame is valid when its salts equal the header's and the checksum running
    from the header through it holds; SQLite reads valid frames from the first and stops at
    the first invalid one; a transaction is committed by its commit frame (non-zero
    database size)."""

    header_ok: bool
    frames: int
    """Whole frames in the file (every generation)."""
    kept: int
    """The last valid commit frame (1-based; 0: none): what SQLite keeps."""
    stop: int | None
    """The first frame SQLite does not read (a broken checksum, or another generation's
    salts); None: it reads to the end of the file."""
    lost: tuple[int, ...]
    """Commit frames of this generation (the header's salts) after ``stop``: commits SQLite
    would drop. A damaged last commit frame is not among them (the WAL alone cannot tell it
    from a torn write the crash interrupted; the marker can)."""


def scan_wal(path: Path) -> WalScan | None:
    """Read ``<db>-wal`` as SQLite's recovery does; None when there is none (or no header).

    The file must hold still while it is read (``check_wal`` holds SQLite's write lock): a
    writer appending a commit, or starting the WAL again after a checkpoint, changes it."""
    wal = path.with_name(path.name + "-wal")
    try:
        with wal.open("rb") as raw:
            return _scan(raw, size=os.fstat(raw.fileno()).st_size)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read {wal}: {exc}") from exc


def _scan(raw: BinaryIO, *, size: int) -> WalScan | None:
    header = raw.read(32)
    if len(header) < 32:
        return None
    magic, _version, page_size, _seq, salt1, salt2, sum1, sum2 = struct.unpack(">8I", header)
    big = magic & 1 == 1
    if (
        magic not in WAL_MAGIC
        or _wal_checksum(header[:24], big=big) != (sum1, sum2)
        or not 512 <= page_size <= 65536
        or page_size & (page_size - 1)
    ):
        return WalScan(
            header_ok=False, frames=1 if size > 32 else 0, kept=0, stop=1 if size > 32 else None, lost=()
        )
    frames = (size - 32) // (24 + page_size)
    running = (sum1, sum2)
    kept, stop, lost = 0, None, []
    for index in range(1, frames + 1):
        if stop is not None:  # past the stop only frame headers matter
            raw.seek(32 + (index - 1) * (24 + page_size))
        frame = raw.read(24 + page_size if stop is None else 24)
        if len(frame) < (24 + page_size if stop is None else 24):  # the file was cut short while read
            frames = index - 1
            break
        page, commit, s1, s2, c1, c2 = _FRAME_HEADER.unpack_from(frame)
        ours = (s1, s2) == (salt1, salt2)
        if stop is None:
            if ours and page and _wal_checksum(frame[:8] + frame[24:], big=big, seed=running) == (c1, c2):
                running = (c1, c2)
                kept = index if commit else kept
                continue
            stop = index  # frames after the last commit frame before here: a transaction never committed
            continue  # and an invalid frame's own header is not to be trusted
        if ours and commit:
            lost.append(index)
    return WalScan(header_ok=True, frames=frames, kept=kept, stop=stop, lost=tuple(lost))


def check_wal(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a WAL whose damaged frames would make SQLite drop commits written after them.

    SQLite stops reading a WAL at its first invalid frame and silently serves the state
    before it; commits after that point are lost. So a commit frame of the current
    generation past that point is damage; frames after the last commit are a transaction
    that never committed (what a crash leaves), and frames with other salts belong to a
    generation the WAL was started again over (after a checkpoint), neither is damage.

    The WAL is read under SQLite's write lock (``BEGIN IMMEDIATE``, nothing written): another
    connection may be writing the file, and a commit in flight (its frames and commit frame
    written, the write not yet finished) or a WAL being started again would otherwise be
    read half-way. SQLite's own count of kept frames is not asked: a checkpoint cannot run
    inside the transaction, and outside it the count lags a commit in flight."""
    if not path.with_name(path.name + "-wal").exists():
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        scan = scan_wal(path)
    finally:
        db.execute("ROLLBACK")
    if scan is None or scan.frames == 0:
        return
    wal = f"{path.name}-wal"
    if not scan.header_ok:
        raise StoreError(
            f"state store {path}: the WAL ({wal}, {scan.frames} frame(s)) has a damaged header, so SQLite "
            "would ignore every commit in it; restore the files, or start afresh with gpufed serve --init"
        )
    if scan.lost:
        raise StoreError(
            f"state store {path}: the WAL ({wal}) is damaged at frame {scan.stop}: SQLite would drop "
            f"{len(scan.lost)} later commit(s) and serve an older state; restore the files, or start afresh "
            "with gpufed serve --init"
        )


def _wal_checksum(data: bytes, *, big: bool, seed: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """SQLite's WAL checksum over ``data`` (whole 8-byte pairs), running on from ``seed``."""
    words = struct.unpack((">" if big else "<") + f"{len(data) // 4}I", data)
    s0, s1 = seed
    for x0, x1 in zip(words[::2], words[1::2], strict=True):
        s0 = (s0 + x0 + s1) & _MASK
        s1 = (s1 + x1 + s0) & _MASK
    return s0, s1


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


def member_row(path: Path, *, source: str, identity: str, body: str) -> Target:
    """One stored target of a discovery set, or one ``StoreError`` naming the table and key
    (a row that is JSON but not a valid target is refused, not skipped)."""
    key = f"{source}/{identity}"
    raw = json_row(path, table="members", key=key, body=body)
    try:
        return loading.parse_target(raw, source=f"{path}:members")
    except InventoryError as exc:
        raise StoreError(
            f"state store {path}: table members, key {key!r}: not a valid target "
            f"({exc.field or 'row'}: {exc.reason}); start afresh with --init"
        ) from exc


def bad_placement(path: Path, *, identity: object, shard: object, weight: object) -> StoreError:
    """A ``placements`` row whose columns are not (text, text, positive integer)."""
    key = identity if isinstance(identity, str) else repr(identity)
    what = (
        "the weight is not a positive integer"
        if isinstance(identity, str) and isinstance(shard, str)
        else "the identity or shard is not text"
    )
    return StoreError(
        f"state store {path}: table placements, key {key!r}: {what} "
        f"(a {type(weight).__name__} weight); start afresh with --init"
    )


def move_aside(path: Path) -> Path:
    """Rename a damaged database (and its WAL and shared-memory files) to ``<name>.broken-<n>``
    beside it, the first free ``n``; the new name of the database."""
    n = 1
    while any(path.with_name(f"{path.name}.broken-{n}{s}").exists() for s in ("", "-wal", "-shm")):
        n += 1
    target = path.with_name(f"{path.name}.broken-{n}")
    for suffix in ("-wal", "-shm", ""):
        source = path.with_name(path.name + suffix)
        if source.exists():
            source.rename(target.with_name(target.name + suffix))
    return target
