"""Issue 21 item 5: state that cannot vanish, roll back or rot silently (and item 3's reclaim).

Each test damages a real SQLite state the way the probe did (deleted, emptied, a WAL with
garbage, a broken row) and expects one clear refusal, or an explicit ``--init``.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from federation.commands.cli import _register, app
from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.stores import integrity
from federation.controller.stores.integrity import MARKER_NAME
from federation.controller.stores.sqlite_store import SqliteStore
from federation.controller.stores.store import StoreError
from tests.controller.harness import TOKEN, build, fleet, write_spec


def committed(data: Path, revisions: int = 3) -> SqliteStore:
    """A store with ``revisions`` commits, left open (its WAL not checkpointed)."""
    store = SqliteStore(data / "state.db")
    state = ControllerState()
    expected = None
    for i in range(revisions):
        state = store.save(
            state.model_copy(update={"assignment_version": i + 1}),
            expected_revision=expected,
            audit=AuditEntry(at=float(i), actor="test", action="save"),
        )
        expected = state.revision
    return store


def test_a_deleted_state_is_refused_unless_init(tmp_path: Path) -> None:
    committed(tmp_path).close()
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    with pytest.raises(StoreError, match=r"holds no state, but a previous run committed revision 3") as exc:
        SqliteStore(tmp_path / "state.db")
    assert "--init" in str(exc.value) and str(tmp_path / "state.db") in str(exc.value)
    fresh = SqliteStore(tmp_path / "state.db", init=True)
    assert fresh.load() is None
    fresh.save(ControllerState(), expected_revision=None)
    fresh.close()
    assert SqliteStore(tmp_path / "state.db").load() is not None  # the marker follows the new file


def test_an_emptied_file_or_table_is_refused(tmp_path: Path) -> None:
    committed(tmp_path).close()
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("DELETE FROM state")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="holds no state"):
        SqliteStore(tmp_path / "state.db")
    (tmp_path / "state.db").write_bytes(b"")
    for name in ("state.db-wal", "state.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    with pytest.raises(StoreError, match="holds no state"):
        SqliteStore(tmp_path / "state.db")


def crashed_copy(tmp_path: Path, *, sets: int = 0) -> Path:
    """The files of a store with 40 commits (and ``sets`` targets saved after them) as a
    ``kill -9`` leaves them: the commits still in the WAL, not checkpointed."""
    live = tmp_path / "live"
    store = committed(live, revisions=40)
    if sets:
        store.save_sets({"file": fleet(sets)})
    assert (live / "state.db-wal").stat().st_size > 64 * 1024
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for name in ("state.db", "state.db-wal", MARKER_NAME):
        shutil.copy2(live / name, crashed / name)
    store.close()
    return crashed


def overwrite(path: Path, at: int, size: int = 4096) -> None:
    raw = bytearray(path.read_bytes())
    raw[at : at + size] = bytes((i * 37 + 11) % 256 for i in range(size))
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("sets", [0, 20_000])
def test_garbage_in_the_wal_is_detected_not_rolled_back(tmp_path: Path, sets: int) -> None:
    crashed = crashed_copy(tmp_path, sets=sets)
    wal = crashed / "state.db-wal"
    overwrite(wal, wal.stat().st_size // 2)
    with pytest.raises(StoreError, match=r"the WAL \(state.db-wal\) is damaged at frame \d+") as exc:
        SqliteStore(crashed / "state.db")
    assert str(crashed / "state.db") in str(exc.value) and "--init" in str(exc.value)
    assert SqliteStore(crashed / "state.db", init=True).load() is not None  # the operator's way out


def frame_headers(wal: Path) -> list[tuple[int, int, int, int]]:
    """(page, commit size, salt-1, salt-2) of every whole frame in ``wal``, read raw."""
    raw = wal.read_bytes()
    page_size = struct.unpack(">I", raw[8:12])[0]
    step = 24 + page_size
    return [struct.unpack(">4I", raw[at : at + 16]) for at in range(32, len(raw) - step + 1, step)]


def test_a_wal_started_again_after_a_checkpoint_is_not_damage(tmp_path: Path) -> None:
    """After a checkpoint the next commit starts the WAL again from its first frame with new
    salts; the older generation's commit frames stay in the file past it, and SQLite stops
    reading at the first of them. They are not commits SQLite drops."""
    live = tmp_path / "live"
    writer = committed(live, revisions=20)
    db = sqlite3.connect(live / "state.db")
    assert db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0] == 0
    current = writer.load()
    assert current is not None
    writer.save(current, expected_revision=current.revision)  # one commit of the new generation
    wal = live / "state.db-wal"
    salts = struct.unpack(">2I", wal.read_bytes()[16:24])
    headers = frame_headers(wal)
    older = [
        i for i, (_, commit, *frame_salts) in enumerate(headers, 1) if commit and tuple(frame_salts) != salts
    ]
    assert len(older) >= 10  # the previous generation's commits are still in the file
    scan = integrity.scan_wal(live / "state.db")
    assert scan is not None and scan.header_ok and scan.lost == ()
    assert scan.stop is not None and scan.kept < scan.stop <= older[0]
    integrity.check_wal(db, live / "state.db")
    assert SqliteStore(live / "state.db").load() == writer.load()
    db.close()
    writer.close()


def sqlite_keeps(data: Path) -> int:
    """The frames SQLite's own recovery keeps of a crashed copy's WAL (``wal_checkpoint``'s log column)."""
    db = sqlite3.connect(data / "state.db")
    try:
        return int(db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1])
    finally:
        db.close()


@pytest.mark.parametrize("field", ["page", "salt", "checksum", "data"])
@pytest.mark.parametrize("where", [0.2, 0.5, 0.8])
def test_one_damaged_byte_is_found_where_sqlite_stops(tmp_path: Path, field: str, where: float) -> None:
    """One byte changed in a frame's page number, salts, checksum or page: the scan stops at
    that frame, keeps what SQLite's own recovery keeps, and the store is refused."""
    crashed = crashed_copy(tmp_path)
    wal = crashed / "state.db-wal"
    headers = frame_headers(wal)
    frame = max(1, int(len(headers) * where))
    page_size = struct.unpack(">I", wal.read_bytes()[8:12])[0]
    at = (
        32 + (frame - 1) * (24 + page_size) + {"page": 3, "salt": 9, "checksum": 21, "data": 24 + 1000}[field]
    )
    raw = bytearray(wal.read_bytes())
    raw[at] ^= 0x5A
    wal.write_bytes(bytes(raw))
    scan = integrity.scan_wal(crashed / "state.db")
    assert scan is not None and scan.stop == frame and scan.lost
    copy = tmp_path / "copy"
    shutil.copytree(crashed, copy)
    assert scan.kept == sqlite_keeps(copy)
    with pytest.raises(
        StoreError, match=rf"the WAL \(state.db-wal\) is damaged at frame {frame}: SQLite would drop"
    ):
        SqliteStore(crashed / "state.db")


def test_damage_in_the_last_commit_is_refused_by_the_marker(tmp_path: Path) -> None:
    """A changed byte in the last transaction drops no later commit frame (there is none),
    so the WAL alone looks like a torn tail; the marker still knows that revision committed."""
    crashed = crashed_copy(tmp_path)
    wal = crashed / "state.db-wal"
    raw = bytearray(wal.read_bytes())
    raw[-100] ^= 0x5A
    wal.write_bytes(bytes(raw))
    scan = integrity.scan_wal(crashed / "state.db")
    assert scan is not None and scan.lost == () and scan.stop == scan.frames
    with pytest.raises(StoreError, match="holds revision 39, but a previous run committed revision 40"):
        SqliteStore(crashed / "state.db")


def test_a_wal_with_a_damaged_header_is_refused(tmp_path: Path) -> None:
    crashed = crashed_copy(tmp_path)
    overwrite(crashed / "state.db-wal", 8, 8)
    with pytest.raises(StoreError, match="damaged header"):
        SqliteStore(crashed / "state.db")


def test_an_uncommitted_tail_is_what_a_crash_leaves_and_starts(tmp_path: Path) -> None:
    crashed = crashed_copy(tmp_path)
    with (crashed / "state.db-wal").open("ab") as wal:
        wal.write(bytes((i * 13) % 256 for i in range(3 * (4096 + 24))))
    state = SqliteStore(crashed / "state.db").load()
    assert state is not None and state.revision == 40


def test_a_damaged_page_is_one_error_naming_the_file(tmp_path: Path) -> None:
    store = committed(tmp_path)
    store.save_sets({"file": fleet(2000)})
    store.close()
    raw = bytearray((tmp_path / "state.db").read_bytes())
    raw[8192 : 8192 + 4096] = b"\xff" * 4096
    (tmp_path / "state.db").write_bytes(bytes(raw))
    with pytest.raises(StoreError, match=str(tmp_path / "state.db")):
        SqliteStore(tmp_path / "state.db").load_sets()


def test_a_broken_sets_row_names_its_table_and_key(tmp_path: Path) -> None:
    store = committed(tmp_path)
    store.save_sets({"file": fleet(3)})
    store._connect().execute("INSERT INTO members VALUES ('file', 'bad:1', '{not json')")
    store.close()
    with pytest.raises(StoreError, match=r"table members, key 'file/bad:1': the row is not JSON"):
        SqliteStore(tmp_path / "state.db").load_sets()


def test_serve_on_a_corrupt_state_row_exits_2_with_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    write_spec(spec)
    data = tmp_path / "data"
    data.mkdir()
    committed(data).close()
    db = sqlite3.connect(data / "state.db")
    db.execute("UPDATE state SET body = '{\"assignment\": 5' WHERE id = 1")
    db.commit()
    db.close()
    _register()
    result = CliRunner().invoke(
        app, ["serve", "--spec", str(spec), "--data-dir", str(data)], env={"GPUFED_TOKEN": TOKEN}
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "table state, key 1" in lines[0] and lines[0].startswith("error:")


def test_serve_help_names_init() -> None:
    _register()
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--init" in result.output
    assert "start afresh" in " ".join(result.output.split())


def test_a_bad_audit_row_is_shown_as_unreadable_not_a_500(tmp_path: Path) -> None:
    harness = build(tmp_path)
    harness.feed(fleet(3))
    harness.service.store._connect().execute("INSERT INTO audit (body) VALUES ('[1, 2')")  # type: ignore[attr-defined]

    async def audit() -> tuple[int, list[dict[str, object]]]:
        async with harness.client() as client:
            response = await client.get("/v1/audit")
            return response.status_code, response.json()["entries"]

    status, entries = asyncio.run(audit())
    assert status == 200
    assert entries[0]["action"] == "unreadable" and "does not parse" in str(entries[0]["detail"])


def test_a_deregistration_is_stored_before_it_is_acknowledged(tmp_path: Path) -> None:
    harness = build(tmp_path)
    document = {"address": "10.6.0.1", "port": 9400, "job": "gpu", "node": "n1", "region": "r1"}

    async def call(method: str) -> int:
        async with harness.client() as client:
            response = await client.request(
                method,
                "/v1/registry/targets/10.6.0.1:9400",
                json=document if method == "PUT" else None,
                headers=harness.auth(),
            )
            return response.status_code

    assert asyncio.run(call("PUT")) == 201
    harness.tick()
    assert [t.identity for t in SqliteStore(tmp_path / "data" / "state.db").load_sets()["registry"]] == [
        "10.6.0.1:9400"
    ]
    assert asyncio.run(call("DELETE")) == 204
    # A kill -9 now: no tick, no persist. What the next start reads:
    assert SqliteStore(tmp_path / "data" / "state.db").load_sets().get("registry", []) == []
    again = build(tmp_path)
    assert again.controller.registry.targets() == []


def test_deleting_in_bulk_gives_the_space_back(tmp_path: Path) -> None:
    store = committed(tmp_path)
    targets = fleet(30_000)
    store.save_sets({"registry": targets})
    store.reclaim()  # start from a checkpointed file
    full = (tmp_path / "state.db").stat().st_size
    store.save_set_changes({"registry": {t.identity: None for t in targets}})
    emptied = (tmp_path / "state.db").stat().st_size
    wal = tmp_path / "state.db-wal"
    assert emptied < full / 4, (full, emptied)
    assert not wal.exists() or wal.stat().st_size == 0
    assert store.load_sets().get("registry", []) == []
