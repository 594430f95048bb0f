"""Issue 29 item 6 (the store and the flags): every corrupt row is one ``error:`` line naming
its table and key with exit 2, ``--init`` moves aside a file SQLite cannot open, and a
non-finite or absurd numeric flag is refused before anything starts."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from federation.commands.cli import _register, app
from federation.controller.base.state import ControllerState
from federation.controller.stores.sqlite_store import SqliteStore
from federation.controller.stores.store import StoreError
from sharder.engine.assigning import assign
from sharder.model.spec import FederationSpec
from tests.controller.harness import TOKEN, fleet, write_spec


def _placed(data: Path) -> None:
    """A state with 6 placements and a discovery set of 6 members."""
    spec = FederationSpec.model_validate(
        {"cluster": "c", "regions": [{"name": "r1", "shards": 2}], "jobs": [{"name": "gpu"}]}
    )
    targets = fleet(6)
    store = SqliteStore(data / "state.db")
    store.save(ControllerState(assignment=assign(spec, targets)), expected_revision=None)
    store.save_sets({"file": targets})
    store.close()


def _serve(spec: Path, data: Path, *extra: str) -> tuple[int, list[str]]:
    _register()
    result = CliRunner().invoke(
        app, ["serve", "--spec", str(spec), "--data-dir", str(data), *extra], env={"GPUFED_TOKEN": TOKEN}
    )
    assert "Traceback" not in result.output
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("update", "table_key"),
    [
        ("UPDATE placements SET weight = 'abc' WHERE rowid = 1", "table placements, key '10.0.0."),
        ("UPDATE placements SET weight = 0 WHERE rowid = 1", "table placements, key '10.0.0."),
        ("UPDATE placements SET weight = 2.5 WHERE rowid = 1", "table placements, key '10.0.0."),
        ("UPDATE members SET body = '{\"port\": 70000}' WHERE rowid = 2", "table members, key 'file/10.0.0."),
        ("UPDATE members SET body = '[1' WHERE rowid = 3", "table members, key 'file/10.0.0."),
    ],
)
def test_a_corrupt_row_is_one_error_line_naming_table_and_key(
    tmp_path: Path, update: str, table_key: str
) -> None:
    spec = tmp_path / "spec.yaml"
    write_spec(spec)
    data = tmp_path / "data"
    data.mkdir()
    _placed(data)
    db = sqlite3.connect(data / "state.db")
    db.execute(update)
    db.commit()
    db.close()
    code, lines = _serve(spec, data)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error:") and table_key in lines[0], lines


def test_init_moves_aside_a_file_sqlite_cannot_open(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    garbage = bytes(range(256)) * 32
    (data / "state.db").write_bytes(garbage)
    with pytest.raises(StoreError, match="not a database"):
        SqliteStore(data / "state.db")
    assert (data / "state.db").read_bytes() == garbage  # refused without --init, untouched
    fresh = SqliteStore(data / "state.db", init=True)
    assert fresh.load() is None
    fresh.save(ControllerState(), expected_revision=None)
    fresh.close()
    assert (data / "state.db.broken-1").read_bytes() == garbage  # kept, not deleted
    assert SqliteStore(data / "state.db").load() is not None


@pytest.mark.parametrize(
    "flag",
    [
        ["--registry-ttl", "inf"],
        ["--registry-ttl", "nan"],
        ["--registry-ttl", "1e300"],
        ["--debounce", "inf"],
        ["--grace", "1e308"],
        ["--read-rate", "nan"],
        ["--registry-rate", "inf"],
        ["--load-interval", "inf"],
    ],
)
def test_a_non_finite_or_absurd_number_is_refused_at_start(tmp_path: Path, flag: list[str]) -> None:
    spec = tmp_path / "spec.yaml"
    write_spec(spec)
    code, lines = _serve(spec, tmp_path / "data", *flag)
    assert code == 2, lines
    assert flag[0] in " ".join(lines), lines
    assert not (tmp_path / "data" / "state.db").exists()  # refused before any state was made
