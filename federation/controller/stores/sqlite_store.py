"""The embedded state store: one SQLite file in the data directory (WAL, one transaction per change).

Each ``save`` is a single ``BEGIN IMMEDIATE`` transaction that checks the revision,
writes the state row and the audit entry, and commits; SQLite's journal makes a
``kill -9`` at any point leave either the old or the new state.

Writes are in proportion to the change, not the fleet: the state row holds the state
without its assignment; ``shardset`` holds the assignment without its placements (every
shard: 12,501 at 300,000 targets of the shipped spec), written only when it differs from
what was last written (a registration keeps the shard set, so it writes no shard); and
``placements`` holds one row per target (identity -> shard, weight); ``save`` writes only
the rows that differ from the last saved assignment (kept in memory). The discovery sets
are rows per (source, target) the same way. A file written by an older gpufed (the whole
state in one row, the assignment inside the state row, sets as one blob per source) loads
as before and is rewritten in rows by the next save. The file and its WAL are
created with mode 0600 (the state names targets and tokens' names, never secrets, but
operators expect private files). Connections are per thread: FastAPI's worker threads
and the reconcile loop each get their own.

Integrity (``integrity``): the file is checked on open (``PRAGMA quick_check``), a
marker beside it (``.initialised``) records the last committed revision, so a missing,
emptied or rolled-back file (a damaged WAL drops its later frames silently) is refused
unless the operator starts afresh with ``--init``; a corrupt row is a ``StoreError``
naming its table and key. Space freed by large deletions is given back
(``auto_vacuum=INCREMENTAL`` plus a truncating WAL checkpoint).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, TypeVar

from pydantic import BaseModel

from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.stores import integrity, sqlite_members
from federation.controller.stores.store import (
    Changed,
    Commit,
    FencedOut,
    StateDocuments,
    StoreConflict,
    StoreError,
)
from sharder.engine.assignment import Assignment
from sharder.engine.step import SetChanges
from sharder.model.inventory import Target

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS state (id INTEGER PRIMARY KEY CHECK (id = 1), revision INTEGER NOT NULL,
                                  fence INTEGER, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS audit (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sets (source TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS placements (identity TEXT PRIMARY KEY, shard TEXT NOT NULL,
                                       weight INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS members (source TEXT NOT NULL, identity TEXT NOT NULL, body TEXT NOT NULL,
                                    PRIMARY KEY (source, identity));
CREATE TABLE IF NOT EXISTS layout (id INTEGER PRIMARY KEY CHECK (id = 1), rows INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS shardset (id INTEGER PRIMARY KEY CHECK (id = 1), body TEXT NOT NULL);
"""


class Placed(NamedTuple):
    """What ``placements`` holds: identity -> shard and identity -> weight (the saved
    assignment's own dicts, never changed in place: an assignment is frozen)."""

    shards: Mapping[str, str]
    weights: Mapping[str, int]


Row = TypeVar("Row", bound=BaseModel)


class SqliteStore:
    def __init__(self, path: str | Path, *, init: bool = False, marker: Path | None = None) -> None:
        """``marker``: where the last committed revision is kept (default ``.initialised``
        beside the file); ``init``: start empty even where the marker says state existed."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.marker = integrity.Marker(marker or self.path.parent / integrity.MARKER_NAME)
        existed = self.path.exists() and self.path.stat().st_size > 0
        if not self.path.exists():
            self.path.touch(mode=0o600)
        os.chmod(self.path, 0o600)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        self._write = threading.Lock()  # one writer at a time keeps the caches equal to the rows
        self._placed: Placed | None = None
        """What ``placements`` holds (None: not read yet)."""
        self._documents = StateDocuments()
        self._shardset: str | None = None
        """The ``shardset`` body written last (None: not known, written by the next save)."""
        self._members: dict[str, dict[str, Target]] | None = None
        self._deleted = 0
        """Rows deleted since the last reclaim (``integrity.RECLAIM_AFTER`` triggers one)."""
        try:
            try:
                self._open(existed=existed, init=init)
            except StoreError as exc:
                if not init or not existed:
                    raise
                self.close()  # --init: a file SQLite cannot open is kept aside, not deleted
                aside = integrity.move_aside(self.path)
                log.warning(
                    "state store %s cannot be opened (%s); --init moved it to %s", self.path, exc, aside
                )
                self.path.touch(mode=0o600)
                self._open(existed=False, init=True)
        except BaseException:
            self.close()  # a refused file is not held open
            raise

    def _open(self, *, existed: bool, init: bool) -> None:
        expected = self.marker.read()  # before the file: a commit made meanwhile moves the marker on
        db = self._connect()
        try:
            if not init:  # first: any write would overwrite the frames SQLite dropped
                integrity.check_wal(db, self.path)
            if not existed:
                db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # before the first table
            db.executescript(SCHEMA)
            integrity.quick_check(db, self.path)
            row = db.execute("SELECT revision FROM state WHERE id = 1").fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"state store {self.path} cannot be read: {exc}") from exc
        integrity.check_revision(
            self.marker, self.path, None if row is None else row[0], expected=expected, init=init
        )

    def _connect(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            try:
                db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open state store {self.path}: {exc}") from exc
            self._local.db = db
            with self._guard:
                self._connections.append(db)
        return db

    def load(self) -> ControllerState | None:
        try:
            return self._load()
        except sqlite3.Error as exc:
            raise StoreError(f"state store {self.path} cannot be read: {exc}") from exc

    def _load(self) -> ControllerState | None:
        db = self._connect()
        row = db.execute("SELECT body FROM state WHERE id = 1").fetchone()
        if row is None:
            return None
        state = self._validated("state", ControllerState, row[0])
        part = db.execute("SELECT body FROM shardset WHERE id = 1").fetchone()
        if part is not None and state.assignment is None:
            state = state.model_copy(update={"assignment": self._validated("shardset", Assignment, part[0])})
        if state.assignment is None or not self._in_rows(db):
            return state
        with self._write:
            placed = self._read_placements(db)
            self._placed = placed
        assignment = state.assignment
        unknown = set(placed.shards.values()) - assignment.shards.keys()
        if unknown:
            raise StoreError(f"state in {self.path}: targets are placed on unknown shard {min(unknown)!r}")
        full = assignment.model_copy(update={"targets": placed.shards, "weights": placed.weights})
        return state.model_copy(update={"assignment": full})

    def apply(self, commit: Commit, *, fence: int | None) -> ControllerState | None:
        """State, audit entry and set rows in one transaction (a journal commit: its set rows)."""
        if commit.state is None:
            self.save_set_changes(commit.sets, fence=fence)
            return None
        return self.save(commit.state, expected_revision=commit.expected_revision, audit=commit.audit,
                         fence=fence, changed=commit.changed, sets=commit.sets)  # fmt: skip

    def save(
        self,
        state: ControllerState,
        *,
        expected_revision: int | None,
        audit: AuditEntry | None = None,
        fence: int | None = None,
        changed: Changed | None = None,
        sets: SetChanges | None = None,
    ) -> ControllerState:
        db = self._connect()
        with self._write:
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    row = db.execute("SELECT revision, fence FROM state WHERE id = 1").fetchone()
                    found = row[0] if row is not None else None
                    if found != expected_revision:
                        raise StoreConflict(expected=expected_revision, found=-1 if found is None else found)
                    if fence is not None and row is not None and row[1] is not None and fence < row[1]:
                        raise FencedOut(f"write fenced out: token {fence} is older than {row[1]}")
                    stored = state.model_copy(update={"revision": (found or 0) + 1})
                    placed = self._write_placements(db, stored.assignment, changed)
                    if sets:
                        self._deleted += sqlite_members.write(db, sets)
                        self._members = None  # the whole-set cache no longer matches
                    shardset = self._write_shardset(db, stored.assignment)
                    body = stored.model_copy(update={"assignment": None}).model_dump_json()
                    db.execute(
                        "INSERT INTO state (id, revision, fence, body) VALUES (1, ?, ?, ?) "
                        "ON CONFLICT (id) DO UPDATE SET revision = excluded.revision, "
                        "fence = COALESCE(excluded.fence, state.fence), body = excluded.body",
                        (stored.revision, fence, body),
                    )
                    if audit is not None:
                        db.execute(
                            "INSERT INTO audit (body) VALUES (?)", (audit.model_dump_json(exclude={"id"}),)
                        )
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    self._placed = None  # the rows may differ from the cache now: read them again
                    self._shardset = None
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"state store {self.path}: {exc}") from exc
            self._placed, self._shardset = placed, shardset
            self.marker.write(stored.revision)
            self._reclaim_if_due(db)
        return stored

    def _write_shardset(self, db: sqlite3.Connection, assignment: Assignment | None) -> str | None:
        """The ``shardset`` row (transaction open), written only when it differs from the
        last one written: a change that keeps the shard set writes no shard. Its body."""
        if assignment is None:
            if self._shardset is not None or db.execute("SELECT 1 FROM shardset").fetchone() is not None:
                db.execute("DELETE FROM shardset")
            return None
        body = self._documents.assignment_json(assignment)
        if body is not self._shardset and body != self._shardset:
            db.execute(
                "INSERT INTO shardset (id, body) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET body = excluded.body",
                (body,),
            )
        return body

    def _validated(self, table: str, model: type[Row], body: str | bytes) -> Row:
        """``body`` of ``table``'s row as ``model``, or a StoreError naming the table."""
        try:
            return model.model_validate_json(body)
        except ValueError as exc:
            raise StoreError(
                f"state store {self.path}: table {table}, key 1: the row does not validate: "
                f"{' '.join(str(exc).split())[:300]}"
            ) from exc

    def _in_rows(self, db: sqlite3.Connection) -> bool:
        row = db.execute("SELECT rows FROM layout WHERE id = 1").fetchone()
        return row is not None and bool(row[0])

    def _write_some(
        self, db: sqlite3.Connection, before: Placed, after: Placed, touched: Collection[str]
    ) -> Placed:
        shards, weights = after
        gone = [(i,) for i in touched if i in before.shards and i not in shards]
        rows = [
            (i, shards[i], weights.get(i, 1))
            for i in touched
            if i in shards
            and (before.shards.get(i) != shards[i] or before.weights.get(i, 1) != weights.get(i, 1))
        ]
        self._apply_rows(db, gone, rows)
        return after

    def _apply_rows(
        self, db: sqlite3.Connection, gone: list[tuple[str]], rows: list[tuple[str, str, int]]
    ) -> None:
        if gone:
            db.executemany("DELETE FROM placements WHERE identity = ?", gone)
            self._deleted += len(gone)
        if rows:
            db.executemany(
                "INSERT INTO placements (identity, shard, weight) VALUES (?, ?, ?) ON CONFLICT (identity) "
                "DO UPDATE SET shard = excluded.shard, weight = excluded.weight",
                rows,
            )
        db.execute("INSERT INTO layout (id, rows) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET rows = 1")

    def _read_placements(self, db: sqlite3.Connection) -> Placed:
        shards: dict[str, str] = {}
        weights: dict[str, int] = {}
        if self._in_rows(db):
            # interned: a million rows name a few hundred shards, and the identities are the
            # same strings the targets' (``Target.identity``) keys are, so they are held once
            for identity, shard, weight in db.execute("SELECT identity, shard, weight FROM placements"):
                if not (type(identity) is type(shard) is str and type(weight) is int and weight >= 1):
                    raise integrity.bad_placement(self.path, identity=identity, shard=shard, weight=weight)
                key = sys.intern(identity)
                shards[key] = sys.intern(shard)
                weights[key] = weight
        return Placed(shards, weights)

    def _write_placements(
        self, db: sqlite3.Connection, assignment: Assignment | None, changed: Changed | None
    ) -> Placed:
        """Write the rows that differ from what is stored (transaction open); the new rows.
        With ``changed`` whose base is what the rows hold, only its identities are compared."""
        before = self._placed if self._placed is not None else self._read_placements(db)
        if assignment is not None and changed is not None and changed[0].targets is before.shards:
            return self._write_some(db, before, Placed(assignment.targets, assignment.weights), changed[1])
        after = Placed({}, {}) if assignment is None else Placed(assignment.targets, assignment.weights)
        old_shards, old_weights = before.shards, before.weights
        new_shards, new_weights = after.shards, after.weights
        gone = [(i,) for i in old_shards.keys() - new_shards.keys()]
        rows = [
            (i, shard, new_weights.get(i, 1))
            for i, shard in new_shards.items()
            if old_shards.get(i) != shard or old_weights.get(i, 1) != new_weights.get(i, 1)
        ]
        self._apply_rows(db, gone, rows)
        return after

    def audit_log(self, *, limit: int = 100, before_id: int | None = None) -> list[AuditEntry]:
        query = "SELECT id, body FROM audit"
        args: tuple[int, ...] = (limit,)
        if before_id is not None:
            query += " WHERE id < ?"
            args = (before_id, limit)
        rows = self._connect().execute(query + " ORDER BY id DESC LIMIT ?", args).fetchall()
        return [integrity.audit_entry(rid, body) for rid, body in rows]

    def save_sets(self, sets: Mapping[str, Sequence[Target]]) -> None:
        """Write the (source, target) rows that changed since the last save."""
        db = self._connect()
        with self._write:
            before = self._members if self._members is not None else sqlite_members.read(db, self.path)
            after = {name: {t.identity: t for t in targets} for name, targets in sets.items()}
            gone, changed = sqlite_members.diff(before, after)
            try:
                db.execute("BEGIN IMMEDIATE")
                self._deleted += db.execute("DELETE FROM sets").rowcount  # an older gpufed's blobs
                db.executemany("DELETE FROM members WHERE source = ? AND identity = ?", gone)
                db.executemany(
                    "INSERT INTO members (source, identity, body) VALUES (?, ?, ?) "
                    "ON CONFLICT (source, identity) DO UPDATE SET body = excluded.body",
                    changed,
                )
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                self._members = None
                raise StoreError(f"state store {self.path}: {exc}") from exc
            self._members = after
            self._deleted += len(gone)
            self._reclaim_if_due(db)

    def save_set_changes(
        self, changes: Mapping[str, Mapping[str, Target | None]], *, fence: int | None = None
    ) -> None:
        """Write the rows of what changed (identity -> target, None: gone): the cost of the change.
        Fenced like the state: a token older than the state's newest writes nothing."""
        db = self._connect()
        with self._write:
            try:
                db.execute("BEGIN IMMEDIATE")
                if fence is not None:
                    row = db.execute("SELECT fence FROM state WHERE id = 1").fetchone()
                    if row is not None and row[0] is not None and fence < row[0]:
                        raise FencedOut(f"write fenced out: token {fence} is older than {row[0]}")
                self._deleted += sqlite_members.write(db, changes)
                db.execute("COMMIT")
            except FencedOut:
                db.execute("ROLLBACK")
                raise
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise StoreError(f"state store {self.path}: {exc}") from exc
            finally:
                self._members = None  # the whole-set cache no longer matches: re-read if needed
            self._reclaim_if_due(db)

    def reclaim(self) -> None:
        """Give the pages of deleted rows back to the file system, and empty the WAL."""
        db = self._connect()
        with self._write:
            self._deleted = 0
            try:
                integrity.reclaim(db)
            except sqlite3.Error as exc:
                raise StoreError(f"state store {self.path}: reclaiming space: {exc}") from exc

    def _reclaim_if_due(self, db: sqlite3.Connection) -> None:
        """After many deletions (write lock held); a failure only postpones it."""
        if self._deleted < integrity.RECLAIM_AFTER:
            return
        self._deleted = 0
        try:
            integrity.reclaim(db)
        except sqlite3.Error as exc:
            log.warning("state store %s: reclaiming space failed (tried again later): %s", self.path, exc)

    def load_sets(self) -> dict[str, list[Target]]:
        with self._write:
            try:
                members = sqlite_members.read(self._connect(), self.path)
            except sqlite3.Error as exc:
                raise StoreError(f"state store {self.path} cannot be read: {exc}") from exc
            self._members = members
        return {name: list(found.values()) for name, found in members.items()}

    def close(self) -> None:
        with self._guard:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()
