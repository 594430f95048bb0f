"""Issue 36 item 6: a healthy SQLite store opened while another process writes is never refused.

A writer process commits without pause (and checkpoints every 25 commits, so the WAL is
started again with new salts over the older generation's frames); this process opens the
same store 200 times (more under load, until it has met many revisions and a WAL
restart). Each open reads the WAL while the writer may be mid-commit (its frames and
commit frame written, the commit not yet finished) or just starting a new generation.
Before the fix, 24 of 200 opens were refused as "damaged at frame N" (the in-flight
commit frame, past what SQLite's index counted yet). One JSON line reports what the run
met.
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

from federation.controller.base.state import ControllerState
from federation.controller.stores.sqlite_store import SqliteStore
from federation.controller.stores.store import StoreError

OPENS = 200
#: Under load the writer may commit less often than the opens come: the opens go on (up to
#: this long) until the run has met what it is about, many revisions and a WAL restart.
PREMISE_DEADLINE_S = 90.0

WRITER = """
import sys
from pathlib import Path
from federation.controller.base.state import AuditEntry, ControllerState
from federation.controller.stores.sqlite_store import SqliteStore

path, stop = Path(sys.argv[1]), Path(sys.argv[2])
store = SqliteStore(path)
state = store.load()
commits = 0
while not stop.exists():
    state = store.save(
        state.model_copy(update={"assignment_version": commits}),
        expected_revision=state.revision,
        audit=AuditEntry(at=float(commits), actor="writer", action="save"),
    )
    commits += 1
    if commits == 1:
        (path.parent / "writing").touch()
    if commits % 25 == 0:
        store._connect().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
store.close()
print(commits)
"""


def wal_salt(path: Path) -> int | None:
    """Salt-1 of the WAL header (it grows by one each time the WAL is started again)."""
    try:
        with path.with_name(path.name + "-wal").open("rb") as wal:
            header = wal.read(32)
    except FileNotFoundError:
        return None
    return struct.unpack(">I", header[16:20])[0] if len(header) == 32 else None


def test_opening_beside_a_writer_is_never_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first = SqliteStore(path)
    first.save(ControllerState(), expected_revision=None)
    first.close()
    stop = tmp_path / "stop"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    refusals: list[str] = []
    revisions: set[int] = set()
    salts: set[int] = set()
    started = time.monotonic()
    try:
        while not (tmp_path / "writing").exists():
            assert writer.poll() is None, writer.communicate()
            time.sleep(0.01)
        pause = random.Random(36)
        opens = 0
        while opens < OPENS or not (len(revisions) > OPENS // 4 and len(salts) > 1):
            if time.monotonic() - started > PREMISE_DEADLINE_S:
                break
            opens += 1
            time.sleep(
                pause.uniform(0, 0.004)
            )  # lets the writer in between opens, at varied points of its commit
            salt = wal_salt(path)
            if salt is not None:
                salts.add(salt)
            try:
                store = SqliteStore(path)
            except StoreError as exc:
                refusals.append(str(exc))
                continue
            state = store.load()
            store.close()
            assert state is not None
            revisions.add(state.revision)
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    print(
        json.dumps(
            {
                "opens": opens,
                "refusals": len(refusals),
                "wal_damage_refusals": sum("damaged" in r for r in refusals),
                "marker_refusals": sum("previous run committed" in r for r in refusals),
                "writer_commits": int(out.strip()),
                "revisions_seen": len(revisions),
                "wal_generations_seen": len(salts),
                "seconds": round(time.monotonic() - started, 2),
            }
        )
    )
    assert refusals == [], refusals[:3]
    assert len(revisions) > OPENS // 4  # the writer was committing between the opens
    assert len(salts) > 1  # and the WAL was started again meanwhile
