"""The SQLite store: check-and-set and fencing as before, and writes in proportion to the change."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.stores.sqlite_store import SqliteStore
from federation.controller.stores.store import FencedOut, StoreConflict, StoreError
from sharder.engine.assigning import assign
from sharder.model.spec import FederationSpec
from tests.controller.harness import fleet

SPEC = FederationSpec.model_validate(
    {"cluster": "t", "regions": [{"name": "r1", "shards": 4}], "jobs": [{"name": "gpu"}]}
)


def rows_written(store: SqliteStore) -> int:
    return store._connect().total_changes


def test_placements_round_trip_and_a_change_writes_only_its_rows(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    targets = fleet(500)
    first = assign(SPEC, targets)
    saved = store.save(ControllerState(assignment=first, assignment_version=1), expected_revision=None)
    assert saved.revision == 1
    before = rows_written(store)
    grown = assign(SPEC, [*targets, *fleet(1, start=900)], previous=first)
    moved = sum(1 for i, s in grown.targets.items() if first.targets.get(i) != s)
    store.save(saved.model_copy(update={"assignment": grown}), expected_revision=1)
    # the new target's row, any moved rows, the state row and the layout row: not 501 rows
    assert rows_written(store) - before <= moved + 2
    store.close()
    again = SqliteStore(tmp_path / "state.db").load()
    assert again is not None and again.assignment == grown and again.revision == 2


def test_check_and_set_and_fencing_hold(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    one = assign(SPEC, fleet(10))
    state = store.save(ControllerState(assignment=one), expected_revision=None, fence=5)
    with pytest.raises(StoreConflict):
        store.save(state, expected_revision=None)
    with pytest.raises(FencedOut):
        store.save(state.model_copy(update={"assignment": None}), expected_revision=1, fence=4)
    loaded = store.load()
    assert loaded is not None and loaded.assignment == one  # the refused writes left the rows alone
    audit = AuditEntry(at=1.0, actor="op", action="rebalance")
    store.save(state.model_copy(update={"assignment": None}), expected_revision=1, audit=audit, fence=5)
    emptied = store.load()
    assert emptied is not None and emptied.assignment is None
    assert [e.action for e in store.audit_log()] == ["rebalance"]


def test_a_file_of_an_older_gpufed_loads_and_is_rewritten_in_rows(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    old = assign(SPEC, fleet(20))
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE state (id INTEGER PRIMARY KEY CHECK (id = 1), revision INTEGER NOT NULL,"
        " fence INTEGER, body TEXT NOT NULL);"
        "CREATE TABLE audit (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);"
        "CREATE TABLE sets (source TEXT PRIMARY KEY, body TEXT NOT NULL);"
    )
    state = ControllerState(revision=3, assignment=old, assignment_version=7)
    db.execute("INSERT INTO state VALUES (1, 3, NULL, ?)", (state.model_dump_json(),))
    docs = [
        {"address": t.address, "port": t.port, "job": t.job, "region": t.region, "node": t.node}
        for t in fleet(3)
    ]
    db.execute("INSERT INTO sets VALUES ('file', ?)", (json.dumps(docs),))
    db.commit()
    db.close()
    store = SqliteStore(path)
    loaded = store.load()
    assert loaded is not None and loaded.assignment == old and loaded.assignment_version == 7
    assert [t.identity for t in store.load_sets()["file"]] == [t.identity for t in fleet(3)]
    store.save(loaded, expected_revision=3)
    store.save_sets(store.load_sets())
    store.close()
    fresh = SqliteStore(path)
    assert fresh.load() == loaded.model_copy(update={"revision": 4})
    body = fresh._connect().execute("SELECT body FROM state").fetchone()[0]
    assert '"assignment":null' in body  # the assignment moved into its own row
    part = fresh._connect().execute("SELECT body FROM shardset").fetchone()[0]
    assert '"targets":{}' in part  # and the placements into theirs
    assert fresh._connect().execute("SELECT COUNT(*) FROM sets").fetchone()[0] == 0


def test_sets_are_rows_and_a_save_writes_what_changed(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    targets = fleet(300)
    store.save_sets({"file": targets, "registry": fleet(2, start=700)})
    before = rows_written(store)
    changed = targets[5].model_copy(update={"gpus": 4})
    store.save_sets({"file": [*targets[:5], changed, *targets[6:]], "registry": fleet(1, start=700)})
    assert rows_written(store) - before == 2  # one update, one delete
    store.close()
    back = SqliteStore(tmp_path / "state.db").load_sets()
    assert sorted(back) == ["file", "registry"]
    assert {t.identity: t.gpus for t in back["file"]}[changed.identity] == 4
    assert len(back["file"]) == 300 and len(back["registry"]) == 1


def test_a_change_hint_from_the_stored_base_writes_only_its_identities(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    targets = fleet(200)
    first = assign(SPEC, targets)
    saved = store.save(ControllerState(assignment=first), expected_revision=None)
    grown = assign(SPEC, [*targets, *fleet(1, start=900)], previous=first)
    touched = {i for i in grown.targets if first.targets.get(i) != grown.targets[i]}
    stale_base = assign(SPEC, targets)  # equal, but not the object the rows were written from
    hint = (stale_base, set[str]())
    store.save(saved.model_copy(update={"assignment": grown}), expected_revision=1, changed=hint)
    assert SqliteStore(tmp_path / "state.db").load().assignment == grown  # type: ignore[union-attr]
    again = assign(SPEC, [*targets, *fleet(2, start=900)], previous=grown)
    more = {i for i in again.targets if grown.targets.get(i) != again.targets[i]}
    store.save(saved.model_copy(update={"assignment": again, "revision": 2}), expected_revision=2,
               changed=(grown, more))
    assert touched and SqliteStore(tmp_path / "state.db").load().assignment == again  # type: ignore[union-attr]


def test_a_stored_row_that_does_not_validate_is_refused_naming_table_and_key(tmp_path: Path) -> None:
    """Issue 29: a row that is JSON but not a valid target was skipped silently; now it is
    one StoreError naming the table and key (``gpufed serve`` prints it as one error line)."""
    store = SqliteStore(tmp_path / "state.db")
    store.save_sets({"file": fleet(3)})
    store._connect().execute("INSERT INTO members VALUES ('file', 'bad', '{\"port\": 70000}')")
    store.close()
    with pytest.raises(StoreError, match="table members, key 'file/bad': not a valid target"):
        SqliteStore(tmp_path / "state.db").load_sets()


def test_set_changes_are_written_as_rows(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.save_sets({"file": fleet(5)})
    gone, kept = fleet(5)[0], fleet(5)[1:]
    new = fleet(1, start=50)[0]
    store.save_set_changes({"file": {gone.identity: None}, "registry": {new.identity: new}})
    store.close()
    back = SqliteStore(tmp_path / "state.db").load_sets()
    assert sorted(t.identity for t in back["file"]) == sorted(t.identity for t in kept)
    assert [t.identity for t in back["registry"]] == [fleet(1, start=50)[0].identity]


def _statements(store: SqliteStore) -> list[str]:
    """Every statement the store's connection (this thread's) runs from now on."""
    seen: list[str] = []
    store._connect().set_trace_callback(seen.append)
    return seen


def test_a_change_that_keeps_the_shard_set_writes_no_shard(tmp_path: Path) -> None:
    """The assignment's shards (every one of them) are written when they change, not with
    each registration: the state row and ``shardset`` are apart."""
    store = SqliteStore(tmp_path / "state.db")
    targets = fleet(40)
    first = assign(SPEC, targets)
    saved = store.save(ControllerState(assignment=first, assignment_version=1), expected_revision=None)
    grown = assign(SPEC, [*targets, *fleet(1, start=900)], previous=first)
    assert grown.shards == first.shards and grown.shards is not first.shards  # equal, built anew
    seen = _statements(store)
    saved = store.save(saved.model_copy(update={"assignment": grown, "assignment_version": 2}),
                       expected_revision=1)  # fmt: skip
    assert seen and not [q for q in seen if "shardset" in q], seen
    assert all("shards" not in q for q in seen if q.startswith("INSERT INTO state"))
    wider = FederationSpec.model_validate(
        {"cluster": "t", "regions": [{"name": "r1", "shards": 5}], "jobs": [{"name": "gpu"}]}
    )
    five = assign(wider, [*targets, *fleet(1, start=900)], previous=grown)
    seen.clear()
    saved = store.save(saved.model_copy(update={"assignment": five}), expected_revision=2)
    assert len([q for q in seen if q.startswith("INSERT INTO shardset")]) == 1  # a new shard set: written
    store.close()
    again = SqliteStore(tmp_path / "state.db")
    loaded = again.load()
    assert loaded is not None and loaded.assignment == five and loaded.revision == 3
    seen = _statements(again)  # a store that did not write it yet writes it once, then not again
    saved = again.save(loaded, expected_revision=3)
    saved = again.save(saved, expected_revision=4)
    assert len([q for q in seen if q.startswith("INSERT INTO shardset")]) == 1, seen
    again.save(saved.model_copy(update={"assignment": None}), expected_revision=5)
    emptied = again.load()
    assert emptied is not None and emptied.assignment is None
    assert again._connect().execute("SELECT COUNT(*) FROM shardset").fetchone()[0] == 0


def test_a_shardset_row_that_does_not_validate_names_its_table(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    store.save(ControllerState(assignment=assign(SPEC, fleet(8))), expected_revision=None)
    store.close()
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("UPDATE shardset SET body = '{\"algorithm\": 3}'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="table shardset, key 1"):
        SqliteStore(tmp_path / "state.db").load()
