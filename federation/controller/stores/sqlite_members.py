"""The SQLite store's last known sets: one row per (source, identity), so a change writes its
rows only, inside the state's transaction (``SqliteStore.save(..., sets=)``)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from pydantic import TypeAdapter

from federation.controller.stores import integrity
from federation.controller.stores.store import StoreError
from sharder.engine.step import SetChanges
from sharder.model.inventory import Target
from sharder.sources.lastknown import parse_entries, target_document

TARGETS = TypeAdapter(list[Target])


def write(db: sqlite3.Connection, changes: SetChanges) -> int:
    """The set rows of ``changes`` (inside the caller's transaction); the rows deleted."""
    gone = [(name, i) for name, found in changes.items() for i, t in found.items() if t is None]
    rows = [
        (name, i, json.dumps(target_document(t), separators=(",", ":")))
        for name, found in changes.items()
        for i, t in found.items()
        if t is not None
    ]
    db.executemany("DELETE FROM members WHERE source = ? AND identity = ?", gone)
    db.executemany(
        "INSERT INTO members (source, identity, body) VALUES (?, ?, ?) "
        "ON CONFLICT (source, identity) DO UPDATE SET body = excluded.body",
        rows,
    )
    return len(gone)


def diff(
    before: Mapping[str, Mapping[str, Target]], after: Mapping[str, Mapping[str, Target]]
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """(rows gone, rows new or changed) between two whole sets."""
    gone: list[tuple[str, str]] = []
    changed: list[tuple[str, str, str]] = []
    for name in before.keys() | after.keys():
        old, new = before.get(name, {}), after.get(name, {})
        gone.extend((name, i) for i in old.keys() - new.keys())
        changed.extend(
            (name, i, json.dumps(target_document(t), separators=(",", ":")))
            for i, t in new.items()
            if (was := old.get(i)) is not t and was != t
        )
    return gone, changed


def read(db: sqlite3.Connection, path: Path) -> dict[str, dict[str, Target]]:
    """The stored sets. Rows were validated targets when written: each source's rows are
    validated again in one pass of pydantic-core over their JSON (a million targets in
    seconds); a source with a row that does not validate goes entry by entry, and the first bad row
    is refused naming its table and key (``integrity.member_row``)."""
    bodies: dict[str, list[tuple[str, str]]] = {}
    query = "SELECT source, identity, body FROM members ORDER BY source, identity"
    for name, identity, body in db.execute(query):
        bodies.setdefault(name, []).append((identity, body))
    out: dict[str, dict[str, Target]] = {}
    for name, rows in bodies.items():
        try:
            found = TARGETS.validate_json("[" + ",".join(body for _, body in rows) + "]")
        except ValueError:
            found = [integrity.member_row(path, source=name, identity=i, body=b) for i, b in rows]
        for (identity, _), target in zip(rows, found, strict=True):
            if target.identity != identity:
                raise StoreError(
                    f"state store {path}: table members, key {name + '/' + identity!r}: "
                    f"the row holds target {target.identity!r}; start afresh with --init"
                )
        out[name] = {t.identity: t for t in found}
    for name, body in db.execute("SELECT source, body FROM sets"):  # an older gpufed's blobs
        blob = integrity.json_row(path, table="sets", key=name, body=body)
        if not isinstance(blob, list):
            raise StoreError(f"state store {path}: table sets, key {name!r}: not a list of targets")
        good, _bad = parse_entries(blob, source=f"{path}:{name}")
        out.setdefault(name, {}).update((t.identity, t) for t in good)
    return out
