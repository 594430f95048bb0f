"""The last known target set of every source, persisted so a restart survives an outage.

Written after every applied change with stage-then-rename (``os.replace``), so a crash
mid-write leaves the previous file intact. Read at start-up through the same inventory
validation as every other input (``sharder.model.loading.parse_inventory``); an entry that no
longer validates is skipped with a warning rather than losing the rest.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sharder.kernel.errors import InventoryError
from sharder.model.inventory import Target
from sharder.model.loading import TargetIndex, parse_target
from sharder.model.spec import JobSpec

log = logging.getLogger(__name__)
FORMAT_VERSION = 1


def target_document(target: Target) -> dict[str, Any]:
    """A target as an inventory ``targets`` entry (the form ``parse_inventory`` reads)."""
    return target.model_dump(mode="json", by_alias=True, exclude_defaults=True)


Parsed = dict[str, Target]


def parse_entries(
    entries: Sequence[Any],
    *,
    source: str,
    jobs: Mapping[str, JobSpec] | None = None,
    cache: Parsed | None = None,
) -> tuple[list[Target], list[str]]:
    """Validate registry entries one by one through ``sharder.model.loading`` (the one validation
    layer): (good targets, one message per refused entry). A bad entry, or a duplicate of
    an earlier one, is skipped; the rest of the answer is kept.

    With ``cache`` (filled and pruned here; pass the same dict on every call) an entry
    already validated in the previous call is not validated again, so a source that
    re-reads its whole registry pays only for what changed.
    """
    index = TargetIndex(source=source, jobs=jobs)
    bad: list[str] = []
    seen: Parsed = {}
    for i, entry in enumerate(entries):
        where = f"[{i}]"
        key = json.dumps(entry, sort_keys=True, default=str) if cache is not None else ""
        try:
            parsed = cache.get(key) if cache is not None else None
            if parsed is None:  # refused entries are not cached: their message names their place
                parsed = parse_target(entry, where=where, source=source, jobs=jobs)
            seen[key] = parsed
            index.add(parsed, where=where)
        except InventoryError as exc:
            bad.append(str(exc))
    if cache is not None:
        cache.clear()
        cache.update(seen)
    return index.targets, bad


class LastKnownFile:
    """``save``/``load`` of ``{source: [targets]}`` as one JSON file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def save(self, sets: Mapping[str, Sequence[Target]]) -> None:
        doc = {
            "version": FORMAT_VERSION,
            "sources": {
                name: [target_document(t) for t in targets] for name, targets in sorted(sets.items())
            },
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(doc, sort_keys=True, separators=(",", ":")))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self) -> dict[str, list[Target]]:
        """The saved sets; empty when there is no file, or it is unreadable (logged)."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("last known targets unreadable, starting empty path=%s error=%s", self.path, exc)
            return {}
        sources = doc.get("sources") if isinstance(doc, dict) else None
        if not isinstance(sources, dict):
            log.warning("last known targets malformed, starting empty path=%s", self.path)
            return {}
        out: dict[str, list[Target]] = {}
        for name, entries in sources.items():
            listed = entries if isinstance(entries, list) else []
            good, bad = parse_entries(listed, source=f"{self.path}:{name}")
            for message in bad:
                log.warning("skipping persisted target: %s", message)
            out[str(name)] = good
        return out
