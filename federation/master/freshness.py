"""The rule pack's freshness records (``master/rules/freshness.yml``), rendered from the spec.

Why: the children remote-write into the master. A child that dies sends no staleness
markers, so for the 5-minute lookback every instant query at the master still reads its
targets' last ``up`` (1) and their last GPU readings. These records say, per target,
whether its newest sample at the master is fresh; node, GPU and exporter alerts, the
region totals, ``FederationShardMissing``, the blackout alert and the dashboards read
them instead of raw ``up``.

The bound, per job: ``3 x scrape_interval + remote_write slack`` where the slack is the
largest ``queue_config.batch_send_deadline`` of the spec's remote_write (Prometheus'
default 5s where unset). Three missed scrapes is Prometheus' own staleness heuristic for
scraped series; the slack covers a batch that waits for its deadline before it is sent.
Jobs the spec does not name (the master's meta-monitoring, jobs added by hand) share one
bound over the largest interval anywhere in the spec.

Records (``copy`` = one child's series of a target: ``shard``/``replica`` tell copies apart):

* ``gpufed:up_copy:last_seen_seconds``: the timestamp of a copy's newest ``up`` sample.
  While ``up`` is in the 5-minute lookback it is ``timestamp(up)``; after that the record
  carries its own previous value (an instant selector, no range scan) for a copy that was
  already silent, for at most an hour after its last sample. A target removed on purpose
  gets a staleness marker from its child while it is still fresh, and is dropped.
* ``gpufed:up_copy:silent``: 1 for a copy whose newest sample is older than its job's
  bound (its child died, its remote_write stopped), 0 when fresh.
* ``gpufed:target_unknown:bool``: 1 for a target none of whose copies is fresh.
* ``gpufed:target_up:fresh``: a target's ``up`` over its fresh copies, 0 when unknown.
* ``gpufed:shard_silent:bool``: a shard whose newest sample of any target is older than
  ``shard_bound`` (the shortest job bound, at least the longest interval + slack): its
  child or its remote_write is gone. ``FederationShardMissing`` fires on it.
* ``gpufed:region_targets_down:ratio``: per (cluster, region), the share of the spec's
  targets down or unknown. ``FederationScrapeBlackout`` fires on it.

Scraped jobs only: the shard and region records name the spec's jobs (``job=~"gpu|node"``),
never "everything but gpufed-child". The master's own meta-monitoring scrapes (``gpufed-child``
has ``region`` and ``shard`` from service discovery, the others neither) carry no ``cluster``,
since the master's TSDB does not store its external labels; counted with the children's
series they made a second ``{region}`` series per region, which Alertmanager, after adding
the external ``cluster``, took for the same alert as the ``{cluster, region}`` one, so the two
alternated (13 flips in 100 s in issue 36), and a single child's failed meta scrape read as a
whole region down.

Left-open selectors (Prometheus 3): none of these records reads a range. A bound is a
comparison of a sample's own timestamp (``timestamp(up)``) with ``time() - bound``, so it
means the same on 2.x (closed ranges) and 3.x (left-open ranges and lookback). The one place
the lookback shows is when ``timestamp(up)`` leaves it, 5 minutes after the last sample, and
there the record's own previous value (an instant selector one evaluation back) has carried
the copy since its bound passed; a sample exactly 5 minutes old (2.x keeps it, 3.x drops it)
changes nothing. The bounds themselves (3 missed scrapes + the send deadline) count scrapes,
not samples in a window.

Cost: instant selectors and ``timestamp(up)`` only, a few operations per ``up`` series
and evaluation; nothing scans a range. A master down for more than the 5-minute lookback
forgets the silent copies (they come back as unknown only while their ``up`` is in the
lookback).

Pure: a typed spec in, bytes out. ``federation/rules/freshness.yml`` is this rendering of
``examples/federation.yaml`` (the static pack the Helm chart's PrometheusRule ships); the
master bundle replaces it with the rendering of the spec it runs.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from federation.spec import GpufedSpec
from sharder.kernel.models import parse_duration

FILE_NAME = "freshness.yml"
#: Missed scrapes before a target counts as silent.
MISSED_SCRAPES = 3
#: Prometheus' remote_write ``batch_send_deadline`` when the spec leaves it unset.
DEFAULT_SEND_DEADLINE_S = 5.0
#: How long a silent copy stays visible after its last sample.
MEMORY_S = 3600.0
LAST_SEEN = "gpufed:up_copy:last_seen_seconds"
HEADER = (
    b"# Rendered by federation/master/freshness.py from the spec; do not edit. The copy in\n"
    b"# federation/rules/ (and helm/gpufed/rules/) is the rendering of examples/federation.yaml.\n"
    b"# Bound per job: 3 x scrape_interval + the largest remote_write batch_send_deadline.\n"
    b"# Bounds compare sample timestamps with time(), no range selector: the same on 2.x\n"
    b"# (closed ranges) and 3.x (left-open). Shard and region records read the spec's jobs\n"
    b"# only, never the master's own meta-monitoring scrapes (no cluster label there).\n"
)


def send_slack_s(spec: GpufedSpec) -> float:
    deadlines = [
        parse_duration(w.queue_config.batch_send_deadline)
        for w in spec.remote_write
        if w.queue_config.batch_send_deadline
    ]
    return max(deadlines, default=DEFAULT_SEND_DEADLINE_S)


def _seconds(value: float) -> str:
    return f"{math.ceil(value)}s"


def bounds(spec: GpufedSpec) -> tuple[dict[str, str], str]:
    """(job -> bound, the bound of every other job), as Prometheus durations."""
    slack = send_slack_s(spec)
    per_job = {
        job.name: _seconds(MISSED_SCRAPES * parse_duration(job.scrape_interval) + slack)
        for job in sorted(spec.jobs, key=lambda j: j.name)
    }
    intervals = [parse_duration(job.scrape_interval) for job in spec.jobs]
    if spec.master is not None:
        intervals.append(parse_duration(spec.master.scrape_interval))
        if spec.master.monitoring.scrape_interval:
            intervals.append(parse_duration(spec.master.monitoring.scrape_interval))
    return per_job, _seconds(MISSED_SCRAPES * max(intervals) + slack)


def shard_bound(spec: GpufedSpec) -> str:
    """How long a live child can go without sending a sample of any of its targets.

    The shortest job bound (a shard with a target of the fastest job hears from it that
    often), but never under the longest interval plus the slack (a shard holding only
    targets of the slowest job still sends a sample per interval).
    """
    per_job, _ = bounds(spec)
    shortest = min(parse_duration(bound) for bound in per_job.values())
    longest = max(parse_duration(job.scrape_interval) for job in spec.jobs) + send_slack_s(spec)
    return _seconds(max(shortest, longest))


def scraped_jobs(spec: GpufedSpec) -> str:
    """A regex of the spec's jobs: the targets the children scrape and remote-write.

    Job names are lower-case letters, digits and '-' (``JobSpec``), so none needs escaping.
    """
    return "|".join(sorted(job.name for job in spec.jobs))


def _silent(per_job: dict[str, str], other: str) -> str:
    """1 for a copy whose newest sample is older than its job's bound, else 0."""
    names = "|".join(per_job)
    parts = [f'{LAST_SEEN}{{job="{name}"}} < bool time() - {_plain(b)}' for name, b in per_job.items()]
    parts.append(f'{LAST_SEEN}{{job!~"{names}"}} < bool time() - {_plain(other)}')
    return "\n  or ".join(parts) + "\n"


def _plain(duration: str) -> str:
    return duration.removesuffix("s")


def render_rules(spec: GpufedSpec) -> dict[str, Any]:
    per_job, other = bounds(spec)
    memory = _plain(_seconds(MEMORY_S))
    jobs = scraped_jobs(spec)
    shard_targets = f'shard!="", job=~"{jobs}"'
    scraped = f'gpufed:target_up:fresh{{job=~"{jobs}"}}'
    rules = [
        # Its own last value (an instant selector: the previous evaluation) carries a
        # silent copy past the lookback; a copy that was fresh at the previous evaluation
        # and has no `up` now got a staleness marker (removed on purpose) and is dropped.
        {
            "record": LAST_SEEN,
            "expr": (
                "timestamp(up)\n"
                f"  or ({LAST_SEEN} > time() - {memory} and gpufed:up_copy:silent == 1)\n"
            ),
        },
        {"record": "gpufed:up_copy:silent", "expr": _silent(per_job, other)},
        {
            "record": "gpufed:target_unknown:bool",
            "expr": "min without (shard, replica) (gpufed:up_copy:silent) == 1\n",
        },
        {
            "record": "gpufed:shard_silent:bool",
            "expr": (
                f"group by (cluster, region, shard) (\n"
                f"  max by (cluster, region, shard) ({LAST_SEEN}{{{shard_targets}}})"
                f" < time() - {_plain(shard_bound(spec))}\n"
                ")\n"
            ),
        },
        {
            "record": "gpufed:target_up:fresh",
            "expr": (
                "max without (shard, replica) (up and gpufed:up_copy:silent == 0)\n"
                "  or gpufed:target_unknown:bool * 0\n"
            ),
        },
        # After target_up:fresh: a rule reads the rules above it at the same evaluation.
        # A region with none down reads 0 (not absent), so dashboards can plot it.
        {
            "record": "gpufed:region_targets_down:ratio",
            "expr": (
                "(\n"
                f"  count by (cluster, region) ({scraped} == 0)\n"
                f"    or count by (cluster, region) ({scraped}) * 0\n"
                ")\n"
                f"  / count by (cluster, region) ({scraped})\n"
            ),
        },
    ]
    return {"groups": [{"name": "gpufed-freshness", "rules": rules}]}


class _BlockDumper(yaml.SafeDumper):
    """Multi-line PromQL as ``|`` blocks, as the hand-written rule files have it."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def render_file(spec: GpufedSpec) -> bytes:
    text = yaml.dump(render_rules(spec), Dumper=_BlockDumper, sort_keys=False, width=4096, allow_unicode=True)
    return HEADER + text.encode("utf-8")
