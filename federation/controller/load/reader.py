"""Reads what the children really scrape, per target, from a Prometheus query API.

The one module of the load-aware path that does HTTP, with an injected ``httpx.Client``.
Where to read:

* **the master Prometheus** (the usual case: children run in agent mode and have no
  query API). Children remote-write their own ``scrape_samples_post_metric_relabeling``
  and ``scrape_duration_seconds`` there: Prometheus appends these report series after
  metric relabelling, and the example spec keeps ``scrape_.*`` in every job besides.
  Each series carries the target's ``job``, ``instance`` and ``node`` labels, plus the
  child's external labels (``shard``, ``replica``), which are aggregated away: ``max by
  (job, instance, node)`` counts an HA pair, and a target in hand-over between two
  shards, once.
* **each child**, when children are full Prometheus servers: the same query, one child
  at a time, merged the same way (max).

A server that does not answer is skipped; when none answers the reading is ``None``
(unknown), never an error: the smoothed values from earlier readings stay in force.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import httpx

from federation.controller.load.weighing import Observation, TargetKey

log = logging.getLogger(__name__)

SAMPLES = "scrape_samples_post_metric_relabeling"
DURATION = "scrape_duration_seconds"


def _matcher(jobs: Sequence[str]) -> str:
    if not jobs:
        return ""
    alternatives = "|".join(sorted(jobs))  # job names are [a-z0-9-]: nothing to escape
    return f'{{job=~"{alternatives}"}}'


class PrometheusLoadReader:
    """A :class:`~federation.controller.load.weighing.LoadReader`: instant queries on
    ``/api/v1/query`` of each URL (the master, or full-Prometheus children)."""

    def __init__(self, client: httpx.Client, *, jobs: Sequence[str] = ()) -> None:
        self._client = client
        matcher = _matcher(jobs)
        self._samples = f"max by (job, instance, node) ({SAMPLES}{matcher})"
        self._duration = f"max by (job, instance, node) ({DURATION}{matcher})"

    def read(self, urls: Sequence[str]) -> dict[TargetKey, Observation] | None:
        merged: dict[TargetKey, Observation] = {}
        answered = False
        for url in urls:
            samples = self.query(url, self._samples)
            if samples is None:
                continue
            answered = True
            durations = self.query(url, self._duration) or {}
            for key, value in samples.items():
                before = merged.get(key)
                if before is None or value > before.samples:
                    merged[key] = Observation(samples=value, duration_s=durations.get(key))
        return merged if answered else None

    def query(self, url: str, promql: str) -> dict[TargetKey, float] | None:
        """One instant vector keyed by (job, instance, node); None when the server failed."""
        try:
            response = self._client.get(f"{url.rstrip('/')}/api/v1/query", params={"query": promql})
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("load reading failed url=%s error=%s", url, exc)
            return None
        if not isinstance(body, dict) or body.get("status") != "success":
            log.warning("load reading refused url=%s answer=%.200s", url, body)
            return None
        data = body.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            log.warning("load reading: not an instant vector url=%s", url)
            return None
        out: dict[TargetKey, float] = {}
        for item in data.get("result") or []:
            parsed = _sample(item)
            if parsed is not None:
                key, value = parsed
                out[key] = max(value, out.get(key, value))
        return out


def _sample(item: Any) -> tuple[TargetKey, float] | None:
    """``{"metric": {...}, "value": [ts, "v"]}`` -> ((job, instance, node), v), or None."""
    if not isinstance(item, dict):
        return None
    metric, pair = item.get("metric"), item.get("value")
    if not isinstance(metric, dict) or not isinstance(pair, list) or len(pair) != 2:
        return None
    try:
        value = float(pair[1])
    except (TypeError, ValueError):
        return None
    if not math.isfinite(value):
        return None
    key = (str(metric.get("job", "")), str(metric.get("instance", "")), str(metric.get("node", "")))
    return key, value
