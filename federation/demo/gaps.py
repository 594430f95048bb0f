"""Gaps in what reached the master, read the way a dashboard reads it.

A dashboard (or Thanos Query with ``shard`` and ``replica`` as replica labels) shows
``max without (shard, replica) (series)``: the copies an HA pair of children or the two
sides of a hand-over send are one line, present whenever any copy has a sample. So the
gap that matters for one target is the largest distance between consecutive timestamps
of the *union* of its copies' raw samples, counting the window's edges too (a target with
no sample at all has a gap as long as the window).

The raw samples come from the master's ``/api/v1/query`` with a range selector
(``up{...}[Ns]``): exactly what the children wrote, without the 5-minute lookback a
``query_range`` would paper over gaps with, and without staleness markers (Prometheus
leaves those out of range selections, as a dashboard does).

:func:`dedup_gaps` is pure; :func:`raw_matrix` is the one HTTP call.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

#: Labels that tell copies of one series apart (see federation/rules/federation.yml).
COPY_LABELS = ("shard", "replica")


@dataclass(frozen=True)
class Gap:
    """The deduplicated series of one target over a window."""

    series: str
    """The series without its copy labels, as PromQL prints it."""
    labels: dict[str, str]
    """Its labels without the copy labels (and without ``__name__``)."""
    samples: int
    max_gap_s: float
    gap_from: float
    """Unix time the largest gap began (the window's start when it is the first)."""
    last: float
    """The last sample's Unix time (0 when none)."""
    copies: int
    """Distinct (shard, replica) copies seen in the window."""


def series_key(labels: Mapping[str, str]) -> str:
    kept = sorted((k, v) for k, v in labels.items() if k != "__name__" and k not in COPY_LABELS)
    inner = ", ".join(f'{k}="{v}"' for k, v in kept)
    return f"{labels.get('__name__', '')}{{{inner}}}"


def dedup_gaps(matrix: Iterable[Mapping[str, Any]], *, start: float, end: float) -> dict[str, Gap]:
    """Per deduplicated series: the largest gap between ``start``, its samples and ``end``."""
    if end <= start:
        raise ValueError(f"the window must end after it starts: start={start}, end={end}")
    stamps: dict[str, set[float]] = {}
    copies: dict[str, set[tuple[str, str]]] = {}
    kept: dict[str, dict[str, str]] = {}
    for row in matrix:
        labels = row["metric"]
        key = series_key(labels)
        kept[key] = {k: v for k, v in labels.items() if k != "__name__" and k not in COPY_LABELS}
        stamps.setdefault(key, set()).update(
            float(t) for t, v in row["values"] if start <= float(t) <= end and not math.isnan(float(v))
        )
        copies.setdefault(key, set()).add(tuple(labels.get(k, "") for k in COPY_LABELS))  # type: ignore[arg-type]
    out = {}
    for key, times in sorted(stamps.items()):
        points = [start, *sorted(times), end]
        gap, at = max((b - a, a) for a, b in itertools.pairwise(points))
        out[key] = Gap(series=key, labels=kept[key], samples=len(times), max_gap_s=round(gap, 3), gap_from=at,
                       last=max(times, default=0.0), copies=len(copies[key]))
    return out


def shard_spans(
    matrix: Iterable[Mapping[str, Any]], *, start: float, end: float, by: str | None = None
) -> dict[str, dict[str, tuple[float, float]]]:
    """Per deduplicated series (or per value of label ``by``): shard -> (first, last) sample
    time of that shard's copies.

    Make-before-break shows as overlap: the old shard's last sample comes after the new
    shard's first. An immediate move shows the opposite, and the difference is the gap.
    """
    spans: dict[str, dict[str, tuple[float, float]]] = {}
    for row in matrix:
        times = [float(t) for t, v in row["values"] if start <= float(t) <= end and not math.isnan(float(v))]
        if not times:
            continue
        labels = row["metric"]
        per = spans.setdefault(series_key(labels) if by is None else labels.get(by, ""), {})
        shard = row["metric"].get("shard", "")
        first, last = per.get(shard, (min(times), max(times)))
        per[shard] = (min(first, *times), max(last, *times))
    return spans


def largest(gaps: Iterable[Gap]) -> Gap | None:
    return max(gaps, key=lambda g: g.max_gap_s, default=None)


def node_selector(metric: str, nodes: Sequence[str], **labels: str) -> str:
    """``metric{node=~"a|b", ...}`` for exact node names (regex-escaped)."""
    escaped = "|".join(_re_escape(n) for n in sorted(nodes))
    extra = "".join(f', {k}="{v}"' for k, v in sorted(labels.items()))
    return f'{metric}{{node=~"{escaped}"{extra}}}'


def _re_escape(text: str) -> str:
    # PromQL strings take backslashes doubled; node names are [A-Za-z0-9._-] in practice.
    return "".join(f"\\\\{c}" if c in r".^$*+?()[]{}|\\" else c for c in text)


def raw_matrix(
    client: httpx.Client, master: str, selector: str, *, start: float, end: float
) -> list[dict[str, Any]]:
    """Every raw sample of ``selector`` at the master in ``[start, end]`` (a range selection at ``end``)."""
    seconds = max(1, math.ceil(end - start) + 1)
    params = {"query": f"{selector}[{seconds}s]", "time": f"{end:.3f}"}
    response = client.get(f"{master}/api/v1/query", params=params)
    response.raise_for_status()
    body = response.json()
    if body.get("status") != "success":
        raise ValueError(f"master refused {selector!r}: {body.get('error')}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result
