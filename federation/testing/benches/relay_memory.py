"""The DingTalk relay's memory file (``--data-dir``): cost by number of remembered alerts.

    python -m federation.testing.benches.relay_memory [--alerts 1000 10000 100000]

Per size: the snapshot taken on the event loop, the save (JSON, fsync, rename) done in a
worker thread, the load and restore at start, and the file's size, as JSON. Every alert is
remembered as resolved, in groups of 100; times are wall-clock medians of 5 saves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from alertmanager.dingtalk import memory
from alertmanager.dingtalk.ordering import GroupStates
from alertmanager.dingtalk.payload import Alert


def measure(alerts: int) -> dict[str, float]:
    states = GroupStates(clock=lambda: 1.0)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    end = start + timedelta(minutes=5)
    batch = [Alert(status="resolved", labels={"i": str(i)}, startsAt=start, endsAt=end,
                   fingerprint=f"{i:016x}") for i in range(alerts)]
    for i in range(0, alerts, 100):
        states.record("cn-bj", f"group-{i}", batch[i:i + 100])
    snaps, saves = [], []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        for _ in range(5):
            began = time.perf_counter()
            snapshot = memory.Snapshot(order=states.snapshot(), dedup=[])
            taken = time.perf_counter()
            memory.save(data_dir, snapshot)
            snaps.append(taken - began)
            saves.append(time.perf_counter() - taken)
        began = time.perf_counter()
        GroupStates().restore(memory.load(data_dir).order)
        load = time.perf_counter() - began
        size = memory.memory_path(data_dir).stat().st_size
    return {"alerts": alerts, "snapshot_ms": round(statistics.median(snaps) * 1000, 1),
            "save_ms": round(statistics.median(saves) * 1000, 1), "load_ms": round(load * 1000, 1),
            "file_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    args = parser.parse_args()
    print(json.dumps([measure(n) for n in args.alerts]))


if __name__ == "__main__":
    main()
