"""What reached the master, read back from its API: the figures the demo prints and reports.

"Up at the master" counts targets the way a dashboard reads them: the ``up`` series the
children remote-wrote, deduplicated over the labels that tell copies apart (replica,
shard during a hand-over) with ``max by (region, node)``, and a target counts when that
is 1. ``series`` is the master's head series count, ``samples_per_s`` its append rate
over the last 30 s (the master scrapes itself every 5 s).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from federation.demo.plan import JOB

#: Targets up by the rule pack's freshness record: a dead child's targets stop counting
#: within 3 intervals instead of reading "up" for the 5-minute lookback.
UP_BY_REGION = f'count by (region) (max by (region, node) (gpufed:target_up:fresh{{job="{JOB}"}}) == 1)'
SAMPLES_RATE = 'sum(rate(prometheus_tsdb_head_samples_appended_total{job="gpufed-master"}[30s]))'
FIRING = 'count by (alertname) (ALERTS{alertstate="firing"})'
#: Every job's series of ``up`` at the master (remote-written by the children, or scraped by
#: the master's own meta-monitoring jobs) and how many of them are 1.
COUNT_BY_JOB = "count by (job) (up)"
UP_BY_JOB = "sum by (job) (up)"


@dataclass(frozen=True)
class MasterFigures:
    up_by_region: dict[str, int] = field(default_factory=dict)
    series: int = 0
    samples_per_s: float = 0.0
    firing: dict[str, int] = field(default_factory=dict)
    count_by_job: dict[str, int] = field(default_factory=dict)
    up_by_job: dict[str, int] = field(default_factory=dict)
    error: str = ""

    @property
    def targets_up(self) -> int:
        return sum(self.up_by_region.values())


def query(client: httpx.Client, base: str, promql: str) -> list[dict[str, Any]]:
    response = client.get(f"{base}/api/v1/query", params={"query": promql})
    response.raise_for_status()
    body = response.json()
    if body.get("status") != "success":
        raise ValueError(f"master refused {promql!r}: {body.get('error')}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _by(rows: list[dict[str, Any]], label: str) -> dict[str, int]:
    return {str(r["metric"].get(label, "")): int(float(r["value"][1])) for r in rows}


def master_figures(client: httpx.Client, base: str) -> MasterFigures:
    """The master's view now; a master that does not answer gives zeros and the error."""
    try:
        up = _by(query(client, base, UP_BY_REGION), "region")
        rate = query(client, base, SAMPLES_RATE)
        firing = _by(query(client, base, FIRING), "alertname")
        count_by_job = _by(query(client, base, COUNT_BY_JOB), "job")
        up_by_job = _by(query(client, base, UP_BY_JOB), "job")
        response = client.get(f"{base}/api/v1/status/tsdb")
        response.raise_for_status()
        series = int(response.json()["data"]["headStats"]["numSeries"])
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return MasterFigures(error=f"{type(exc).__name__}: {exc}")
    samples = round(float(rate[0]["value"][1]), 1) if rate else 0.0
    return MasterFigures(
        up_by_region=dict(sorted(up.items())), series=series, samples_per_s=samples, firing=firing,
        count_by_job=dict(sorted(count_by_job.items())), up_by_job=dict(sorted(up_by_job.items())),
    )


def status_line(figures: MasterFigures, *, expected: int, children: int, messages: int, beats: int) -> str:
    return (
        f"{figures.targets_up}/{expected} targets up at the master, {figures.series:,} series,"
        f" {figures.samples_per_s:,.0f} samples/s; {children} children;"
        f" {messages} DingTalk messages, {beats} heartbeats"
    )
