"""Splicing a JSON list of target groups: the next list from the last one's bytes.

HTTP SD answers (``sdcache``) and file_sd lists (``filesd``) are JSON arrays of one group a
target, sorted by identity, with each group's offset kept beside the bytes. A change that
touches a few identities makes the next array out of the last one's runs of unchanged
groups (a slice a run) and the touched groups encoded afresh, so a list of 80,000 targets
gaining one costs a few slices, not 80,000 encodings. The two differ only in framing.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Framing:
    """How the array is written around and between its groups."""

    open: bytes
    sep: bytes
    close: bytes


HTTP_SD = Framing(b"[", b",", b"]")
FILE_SD = Framing(b"[\n", b",\n", b"\n]\n")


def splice(
    ids: list[str], starts: array[int], content: bytes, touched: Iterable[str],
    group: Callable[[str], bytes | None], framing: Framing,
) -> tuple[list[str], array[int], bytes] | None:
    """The list after ``touched`` (sorted identities): each taken out of ``ids`` and put back
    where ``group`` encodes it (None: it is no longer listed). ``starts`` holds each group's
    offset in ``content`` and one past the last group's separator; the answer's the same.
    None when nothing is left (the caller writes its own empty list). When no identity of
    ``touched`` is listed before or after, the answer is ``ids``, ``starts`` and ``content``
    themselves (a job the change did not touch costs no copy of its list)."""
    view = memoryview(content)
    sep = len(framing.sep)
    segments: list[tuple[list[str], bytes | memoryview, int]] = []  # (ids, bytes, first index or -1)
    k = 0
    for identity in touched:
        now = group(identity)
        at = bisect_left(ids, identity, k)
        held = at < len(ids) and ids[at] == identity
        if now is None and not held:
            continue
        if at > k:
            segments.append((ids[k:at], view[starts[k] : starts[at] - sep], k))
        k = at + 1 if held else at
        if now is not None:
            segments.append(([identity], now, -1))
    if not segments and k == 0 and ids:  # nothing taken out or put in
        return ids, starts, content
    if k < len(ids):
        segments.append((ids[k:], view[starts[k] : starts[len(ids)] - sep], k))
    if not segments:
        return None
    new_ids: list[str] = []
    new_starts, at = array("I"), len(framing.open)
    pieces: list[bytes | memoryview] = [framing.open]
    for run, data, first in segments:
        new_ids += run
        if first < 0:
            new_starts.append(at)
        elif at == starts[first]:  # a run that did not move keeps its offsets
            new_starts.extend(starts[first : first + len(run)])
        else:  # the run's offsets, moved to where the run now starts
            shift = at - starts[first]
            new_starts.extend(array("I", [start + shift for start in starts[first : first + len(run)]]))
        at += len(data) + sep
        pieces += (data, framing.sep)
    new_starts.append(at)
    pieces[-1] = framing.close
    return new_ids, new_starts, b"".join(pieces)
