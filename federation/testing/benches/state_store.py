"""What the state store's integrity checks and space reclaim cost, as one JSON line.

``gpufed bench state-store [--targets 200000] --json`` (or ``python -m
federation.testing.benches.state_store [TARGETS]``, which prints the line itself): saves
TARGETS registry rows, opens a copy of the files as a ``kill -9`` leaves them (WAL not
checkpointed: the WAL scan with its checksums and ``quick_check`` run), then deletes
every row (the incremental vacuum and the truncating checkpoint run) and a hundred rows
(no reclaim).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from federation.controller.stores import integrity
from federation.controller.stores.sqlite_store import SqliteStore
from federation.testing.benches.controller import _targets


def run_state_store_bench(*, count: int = 200_000) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpufed-bench-store-"))
    try:
        live, crashed, small = root / "live", root / "crashed", root / "small"
        crashed.mkdir()
        targets = _targets(count)
        store = SqliteStore(live / "state.db")
        store.save_sets({"registry": targets})
        wal_bytes = (live / "state.db-wal").stat().st_size
        for name in ("state.db", "state.db-wal"):
            shutil.copy2(live / name, crashed / name)
        started = time.perf_counter()
        scan = integrity.scan_wal(crashed / "state.db")
        scanned = time.perf_counter()
        SqliteStore(crashed / "state.db").close()
        opened = time.perf_counter()
        store.save_set_changes({"registry": {t.identity: None for t in targets}})
        deleted = time.perf_counter()
        few = SqliteStore(small / "state.db")
        few.save_set_changes({"registry": {t.identity: t for t in targets[:100]}})
        before_few = time.perf_counter()
        few.save_set_changes({"registry": {t.identity: None for t in targets[:100]}})
        after_few = time.perf_counter()
        result = {
            "targets": count,
            "wal_bytes": wal_bytes,
            "wal_frames": scan.frames if scan else 0,
            "scan_wal_s": round(scanned - started, 3),
            "open_with_checks_s": round(opened - scanned, 3),
            "delete_all_with_reclaim_s": round(deleted - opened, 3),
            "db_bytes_after_delete_all": (live / "state.db").stat().st_size,
            "delete_100_s": round(after_few - before_few, 4),
        }
        store.close()
        few.close()
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    print(json.dumps(run_state_store_bench(count=count)))


if __name__ == "__main__":
    main()
