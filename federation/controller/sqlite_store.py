"""The embedded state store: one SQLite file in the data directory (WAL, one transaction per change).

Each ``save`` is a single ``BEGIN IMMEDIATE`` transaction that checks the revision,
writes the state row and the audit entry, and commits; SQLite's journal makes a
``kill -9`` at any point leave either the old or the new state. The file and its WAL are
created with mode 0600 (the state names targets and tokens' names, never secrets, but
operators expect private files). Connections are per thread: FastAPI's worker threads
and the reconcile loop each get their own.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from federation.controller.state import AuditEntry, ControllerState
from federation.controller.store import FencedOut, StoreConflict, StoreError
from sharder.inventory import Target
from sharder.lastknown import parse_entries, target_document

SCHEMA = """
CREATE TABLE IF NOT EXISTS state (id INTEGER PRIMARY KEY CHECK (id = 1), revision INTEGER NOT NULL,
                                  fence INTEGER, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS audit (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sets (source TEXT PRIMARY KEY, body TEXT NOT NULL);
"""


class SqliteStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            self.path.touch(mode=0o600)
        os.chmod(self.path, 0o600)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        with self._connect() as db:
            db.executescript(SCHEMA)

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
        row = self._connect().execute("SELECT body FROM state WHERE id = 1").fetchone()
        if row is None:
            return None
        try:
            return ControllerState.model_validate_json(row[0])
        except ValueError as exc:
            raise StoreError(f"state in {self.path} does not validate: {str(exc)[:300]}") from exc

    def save(
        self,
        state: ControllerState,
        *,
        expected_revision: int | None,
        audit: AuditEntry | None = None,
        fence: int | None = None,
    ) -> ControllerState:
        db = self._connect()
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
                db.execute(
                    "INSERT INTO state (id, revision, fence, body) VALUES (1, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET revision = excluded.revision, "
                    "fence = COALESCE(excluded.fence, state.fence), body = excluded.body",
                    (stored.revision, fence, stored.model_dump_json()),
                )
                if audit is not None:
                    db.execute(
                        "INSERT INTO audit (body) VALUES (?)", (audit.model_dump_json(exclude={"id"}),)
                    )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StoreError(f"state store {self.path}: {exc}") from exc
        return stored

    def audit_log(self, *, limit: int = 100, before_id: int | None = None) -> list[AuditEntry]:
        query = "SELECT id, body FROM audit"
        args: tuple[int, ...] = (limit,)
        if before_id is not None:
            query += " WHERE id < ?"
            args = (before_id, limit)
        rows = self._connect().execute(query + " ORDER BY id DESC LIMIT ?", args).fetchall()
        return [AuditEntry.model_validate({**json.loads(body), "id": rid}) for rid, body in rows]

    def save_sets(self, sets: Mapping[str, Sequence[Target]]) -> None:
        db = self._connect()
        rows = [
            (name, json.dumps([target_document(t) for t in targets], separators=(",", ":")))
            for name, targets in sorted(sets.items())
        ]
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM sets")
            db.executemany("INSERT INTO sets (source, body) VALUES (?, ?)", rows)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise StoreError(f"state store {self.path}: {exc}") from exc

    def load_sets(self) -> dict[str, list[Target]]:
        out: dict[str, list[Target]] = {}
        for name, body in self._connect().execute("SELECT source, body FROM sets").fetchall():
            good, _bad = parse_entries(json.loads(body), source=f"{self.path}:{name}")
            out[name] = good
        return out

    def close(self) -> None:
        with self._guard:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()
