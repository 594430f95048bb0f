"""The relay's ordering and dedup memory in one small file, so a restart remembers both.

Why: without it a restarted relay forgets which state of each alert it last sent, and the
first notification of a group after the restart is sent whatever it says: a late copy of
an episode that DingTalk already showed resolved would be shown firing again, and an HA
copy arriving while the relay restarts would be shown twice.

Where it sits: ``app`` loads the file once when it builds the relay (``load``) and writes
it after every notification it finished (``save``, in a worker thread so the event loop
keeps serving; one save at a time, each with the memory as it is when it starts). The file
is ``<data-dir>/relay-memory.json``::

    {"version": 1, "order": [[robot, group, fingerprint, firing, startsAt, endsAt,
                              resolved_until, at, announced_until], ...],
     "dedup": [[key, at], ...],
     "digest": {robot: {"opened": at, "due": at, "dropped": n, "alerts": [[fingerprint,
                alertname, where, summary, firing, startsAt, endsAt, episodes], ...]}}}

with times in microseconds since the epoch (exact, unlike a float of seconds) and ``at`` in
the relay clock's seconds. Cost (``python -m federation.testing.benches.relay_memory``, a
shared 2-core machine): 10,000 remembered alerts (an entry lives a day) are a 1 MB file,
14 ms of snapshot on the event loop, 17 ms of save in the thread and 77 ms to load at
start; 100,000 are 10 MB, 112 ms, 93 ms and 0.9 s.

Written atomically (a temporary file in the same directory, flushed to disk, then renamed
over the old one), so a crash leaves the old file or the new one, never half of one. A
file that cannot be read or parsed is reported (``MemoryFileError``) and the relay starts
with an empty memory rather than not at all: Alertmanager's next notifications
re-establish the order.

``digest`` (the open batches of ``digest``, times in seconds) is optional, so a file
written before the digest existed loads, and a relay of that age ignores the key.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alertmanager.dingtalk.errors import RelayError
from alertmanager.dingtalk.ordering import Row

FILE_NAME = "relay-memory.json"
ROW_ITEMS = 9
VERSION = 1


class MemoryFileError(RelayError):
    """The memory file exists but is unreadable or malformed; ``field`` names the part."""


@dataclass(frozen=True)
class Snapshot:
    order: list[Row]
    dedup: list[tuple[str, float]]
    digest: dict[str, Any] = field(default_factory=dict)


def memory_path(data_dir: Path) -> Path:
    return data_dir / FILE_NAME


def load(data_dir: Path) -> Snapshot:
    """The saved memory, empty when there is no file yet; ``MemoryFileError`` when bad."""
    path = memory_path(data_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Snapshot(order=[], dedup=[])
    except (OSError, UnicodeDecodeError) as exc:
        raise MemoryFileError(f"cannot read {path}: {exc}", field="data_dir") from exc
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MemoryFileError(f"{path}: not JSON ({exc})", field="body") from exc
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise MemoryFileError(f"{path}: expected an object with version {VERSION}", field="version")
    order, dedup = data.get("order"), data.get("dedup")
    if not isinstance(order, list) or not all(isinstance(r, list) and len(r) == ROW_ITEMS for r in order):
        raise MemoryFileError(f"{path}: order must be a list of {ROW_ITEMS}-item rows", field="order")
    if not isinstance(dedup, list) or not all(isinstance(r, list) and len(r) == 2 for r in dedup):
        raise MemoryFileError(f"{path}: dedup must be a list of [key, at] rows", field="dedup")
    digest = data.get("digest", {})
    if not isinstance(digest, dict):
        raise MemoryFileError(f"{path}: digest must be an object of robot -> batch", field="digest")
    return Snapshot(order=[tuple(r) for r in order],  # type: ignore[misc]
                    dedup=[(str(k), float(at)) for k, at in dedup], digest=digest)


def save(data_dir: Path, snapshot: Snapshot) -> None:
    """Replace the memory file atomically: temp file, fsync, rename."""
    data_dir.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"version": VERSION, "order": snapshot.order, "dedup": snapshot.dedup,
                       "digest": snapshot.digest}, separators=(",", ":"), ensure_ascii=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=data_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, memory_path(data_dir))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
