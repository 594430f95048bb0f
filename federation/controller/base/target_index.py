"""The target list's index: identities sorted once per assignment, so a page costs its rows.

``GET /v1/targets`` used to sort and build a row for every target before it sliced the
page, so a loop of ``?limit=1&offset=<end>`` cost the whole fleet per request. The index is
built once per assignment object (the committed state replaces it on every change, so
the object is the version): one sorted tuple of identities, with the region and shard
selections cut from it on first use. A text filter (``q``) is a ``str.find`` over one
lower-case text of every identity and node (made on the first query), and each answer is
kept (a few per version), so a client looping on the same query pays for it once.
Rows are built by the caller for the page only.

An index's selections never change once made, and a newer assignment simply gets a newer
index (a racing second build is wasted work, not a wrong answer); only the small query
cache takes a lock.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sharder.engine.assignment import Assignment
from sharder.model.inventory import Target

CACHED_QUERIES = 32
"""Filtered selections kept per index (region/shard/q combinations)."""


@dataclass
class TargetIndex:
    assignment: Assignment
    targets: Mapping[str, Target]
    order: tuple[str, ...]
    _text: tuple[str, list[int]] | None = None
    _selections: OrderedDict[tuple[str, str, str], tuple[str, ...]] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, assignment: Assignment, targets: Mapping[str, Target]) -> TargetIndex:
        placed = assignment.targets
        order = tuple(sorted(i for i in targets if i in placed))
        return cls(assignment=assignment, targets=targets, order=order)

    def select(self, *, region: str | None, shard: str | None, q: str | None) -> Sequence[str]:
        """The identities a filter keeps, in order (cached per filter, oldest dropped first)."""
        key = (region or "", shard or "", (q or "").lower())
        if key == ("", "", ""):
            return self.order
        with self._lock:
            found = self._selections.get(key)
            if found is not None:
                self._selections.move_to_end(key)
                return found
        region_, shard_, needle = key
        candidates = self._matching(needle) if needle else self.order
        if region_ or shard_:
            placed, shards = self.assignment.targets, self.assignment.shards
            candidates = tuple(
                i
                for i in candidates
                if (not shard_ or placed[i] == shard_)
                and (not region_ or shards[placed[i]].region == region_)
            )
        found = tuple(candidates)
        with self._lock:
            self._selections[key] = found
            while len(self._selections) > CACHED_QUERIES:
                self._selections.popitem(last=False)
        return found

    def _matching(self, needle: str) -> tuple[str, ...]:
        """Identities whose identity or node holds ``needle`` (lower case): ``str.find`` over one
        text of every ``identity<TAB>node`` line, so a query scans bytes, not Python objects."""
        if any(c in needle for c in "\t\n"):
            return ()  # neither an identity nor a node holds a tab or a newline
        text, starts = self._haystack()
        found: list[str] = []
        at = text.find(needle)
        while at >= 0:
            line = bisect.bisect_right(starts, at) - 1
            found.append(self.order[line])
            nxt = starts[line + 1] if line + 1 < len(starts) else len(text)
            at = text.find(needle, nxt)
        return tuple(found)

    def _haystack(self) -> tuple[str, list[int]]:
        with self._lock:
            if self._text is None:
                lines = [f"{i}\t{self.targets[i].node}".lower() for i in self.order]
                starts, at = [], 0
                for line in lines:
                    starts.append(at)
                    at += len(line) + 1
                self._text = ("\n".join(lines), starts)
            return self._text


class IndexCache:
    """The index of the newest assignment seen; rebuilt when the assignment object changes."""

    def __init__(self) -> None:
        self._index: TargetIndex | None = None

    def get(self, assignment: Assignment, targets: Mapping[str, Target]) -> TargetIndex:
        index = self._index
        if index is None or index.assignment is not assignment:
            index = self._index = TargetIndex.build(assignment, targets)
        return index
