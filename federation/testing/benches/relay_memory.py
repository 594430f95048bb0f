"""The DingTalk relay's memory file (``--data-dir``): cost by number of remembered alerts.

    python -m federation.testing.benches.relay_memory [--alerts 1000 10000 100000] [--digest-robots 10]

Per size: the snapshot taken on the event loop, the save (JSON, fsync, rename) done in a
worker thread, the load and restore at start, and the file's size, as JSON. Every alert is
remembered as resolved, in groups of 100; times are wall-clock medians of 5 saves. With
``--digest-robots N`` the memory also holds N full info-digest batches (``digest``'s
500 alerts each), the most the digest keeps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from alertmanager.dingtalk import digest, memory
from alertmanager.dingtalk.config import DigestConfig
from alertmanager.dingtalk.ordering import GroupStates
from alertmanager.dingtalk.payload import Alert


def full_digests(robots: int, *, start: datetime) -> digest.Digests:
    """``robots`` batches of ``digest.MAX_ENTRIES`` info alerts with a rule-pack-sized summary."""
    batches = digest.Digests(DigestConfig(), zone="Asia/Shanghai", clock=lambda: 1.8e9)
    alerts = [Alert(status="firing", labels={"alertname": f"GPUIdle{i % 20}", "severity": "info",
                                             "node": f"n{i:05d}", "gpu": str(i % 8), "region": "cn-beijing"},
                    annotations={"summary": "GPU allocated and idle for 30 minutes " * 3}, startsAt=start,
                    fingerprint=f"{i:016x}") for i in range(digest.MAX_ENTRIES)]
    for robot in range(robots):
        batches.add(f"robot-{robot}", alerts)
    return batches


def measure(alerts: int, *, digest_robots: int = 0) -> dict[str, float]:
    states = GroupStates(clock=lambda: 1.0)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    end = start + timedelta(minutes=5)
    batches = full_digests(digest_robots, start=start)
    batch = [Alert(status="resolved", labels={"i": str(i)}, startsAt=start, endsAt=end,
                   fingerprint=f"{i:016x}") for i in range(alerts)]
    for i in range(0, alerts, 100):
        states.record("cn-bj", f"group-{i}", batch[i:i + 100])
    snaps, saves = [], []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        for _ in range(5):
            began = time.perf_counter()
            snapshot = memory.Snapshot(order=states.snapshot(), dedup=[],
                                       digest=batches.snapshot())
            taken = time.perf_counter()
            memory.save(data_dir, snapshot)
            snaps.append(taken - began)
            saves.append(time.perf_counter() - taken)
        began = time.perf_counter()
        loaded = memory.load(data_dir)
        GroupStates().restore(loaded.order)
        batches.restore(loaded.digest)
        load = time.perf_counter() - began
        size = memory.memory_path(data_dir).stat().st_size
    return {"alerts": alerts, "digest_robots": digest_robots,
            "snapshot_ms": round(statistics.median(snaps) * 1000, 1),
            "save_ms": round(statistics.median(saves) * 1000, 1), "load_ms": round(load * 1000, 1),
            "file_bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--digest-robots", type=int, default=0,
                        help="also keep this many full info-digest batches (500 alerts each)")
    args = parser.parse_args()
    print(json.dumps([measure(n, digest_robots=args.digest_robots) for n in args.alerts]))


if __name__ == "__main__":
    main()
